"""The documentation's links and repository paths (check_links.py), on the repository and on a
page made to be broken."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "check_links.py")
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))


def run(repo):
    return subprocess.run([sys.executable, CHECK, repo], capture_output=True, text=True,
                          timeout=60)


class DocsTest(unittest.TestCase):
    def test_every_link_and_path_in_the_docs_exists(self):
        result = run(REPO)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        # The check found what it checks (a regex that matched nothing would pass too).
        import re
        links, paths = map(int, re.search(r"(\d+) links and (\d+) paths checked",
                                          result.stdout).groups())
        self.assertGreater(links, 50, result.stdout)
        self.assertGreater(paths, 100, result.stdout)

    def test_a_missing_page_heading_or_path_is_named_with_its_line(self):
        with tempfile.TemporaryDirectory() as repo:
            os.makedirs(os.path.join(repo, "docs"))
            os.makedirs(os.path.join(repo, "charts", "lockstep"))
            os.makedirs(os.path.join(repo, "worker"))
            open(os.path.join(repo, "worker", "real.cc"), "w").close()
            with open(os.path.join(repo, "docs", "a.md"), "w") as f:
                f.write("# A page\n\n## Its part ##\n\n## Its part\n")
            with open(os.path.join(repo, "charts", "lockstep", "README.md"), "w") as f:
                f.write("# Chart\n")
            with open(os.path.join(repo, "README.md"), "w") as f:
                f.write("# Readme\n"
                        "[fine](docs/a.md#its-part) [again](docs/a.md#its-part-1) and "
                        "`worker/real.cc:12`\n"
                        "[gone](docs/gone.md)\n"
                        "[no such part](docs/a.md#another-part)\n"
                        "see `worker/gone.cc:3`\n"
                        "```\n`worker/in-a-fence.cc` [x](in/a/fence.md)\n```\n")
            result = run(repo)
        self.assertEqual(result.returncode, 1)
        self.assertIn("README.md:3: link to docs/gone.md: no such file", result.stdout)
        self.assertIn("README.md:4: link to docs/a.md#another-part: no heading #another-part",
                      result.stdout)
        self.assertIn("README.md:5: `worker/gone.cc`: no such path", result.stdout)
        self.assertIn("3 broken links or paths", result.stdout)


if __name__ == "__main__":
    unittest.main()
