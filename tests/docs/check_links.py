#!/usr/bin/python3
"""Every link and repository path the documentation names exists.

Reads README.md, docs/*.md and charts/lockstep/README.md, outside fenced code, and checks:
  * each inline relative Markdown link on one line, [text](target): the file or directory
    exists, and a #fragment names an ATX heading of the target page (GitHub's anchors: lower
    case, punctuation dropped, spaces as hyphens, -1, -2 on repeated headings). Links with a
    title, reference-style links and links wrapped over two lines are not read;
  * each repository path in backquotes (`worker/ps/ps_client.cc`, `scripts/test.sh:12`): a
    token under one of the repository's top directories, with a file extension or a trailing
    slash, exists (a `:line` suffix is dropped; paths with wildcards or placeholders are skipped).
Prints each broken one as page:line: what, and exits 1 if there is any.

  tests/docs/check_links.py [REPO]
"""
import os
import re
import sys

REPO = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PAGES = ["README.md", "charts/lockstep/README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(REPO, "docs"))
    if name.endswith(".md"))
TOP = ("bench", "charts", "cli", "common", "crds", "docs", "examples", "kernels", "operator",
       "proto", "python", "scripts", "tests", "worker", ".ci")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")
PATH = re.compile(r"^(?:%s)/[A-Za-z0-9_./+-]*(?:\.[A-Za-z0-9]+|/)$" % "|".join(
    re.escape(t) for t in TOP))


def anchors(page):
    """GitHub's heading anchors of a Markdown file: ATX headings ("## Text", closing #s dropped),
    lower case, punctuation but hyphens and underscores dropped, spaces as hyphens, and a
    repeated heading's anchor suffixed -1, -2..."""
    found = set()
    seen = {}
    in_fence = False
    with open(page, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_fence = not in_fence
            heading = re.match(r"^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$", line)
            if in_fence or not heading:
                continue
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


CHECKED = {"links": 0, "paths": 0}


def check(page):
    problems = []
    path = os.path.join(REPO, page)
    base = os.path.dirname(path)
    in_fence = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.startswith("```"):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            where = f"{page}:{number}"
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target) or target.startswith("mailto"):
                    continue
                CHECKED["links"] += 1
                file_part, _, fragment = target.partition("#")
                linked = os.path.normpath(os.path.join(base, file_part)) if file_part else path
                if not os.path.exists(linked):
                    problems.append(f"{where}: link to {target}: no such file")
                elif fragment and linked.endswith(".md") and fragment not in anchors(linked):
                    problems.append(f"{where}: link to {target}: no heading #{fragment} there")
            for token in CODE.findall(line):
                token = re.sub(r":\d+(?:-\d+)?(?:,\s*\d+)*$", "", token)
                if not PATH.match(token) or any(c in token for c in "*<>{}$"):
                    continue
                CHECKED["paths"] += 1
                if not os.path.exists(os.path.join(REPO, token)):
                    problems.append(f"{where}: `{token}`: no such path in the repository")
    return problems


def main():
    problems = [p for page in PAGES for p in check(page)]
    for problem in problems:
        print(problem)
    print(f"{len(PAGES)} pages, {CHECKED['links']} links and {CHECKED['paths']} paths checked: "
          f"{len(problems)} broken links or paths")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
