"""docs/reference.md names every condition the operator can write on a TrainingJob (type, status
and reason) and every Event reason it can record, each in its own table, and names none the code
cannot write; and the check notices a missing entry, naming the file it comes from.

How the names are found, with no build: the operator writes a condition with
SetCondition(status, TYPE, STATUS, REASON, message, now) (operator/trainingjob/job_status.h) and
records an Event with EventRecorder::Record(object, EventType::kX, REASON, message)
(operator/controller/event_recorder.h). Every call of either in operator/, common/ and worker/ is
read with comments removed, and each argument is resolved to the strings it can hold:
  * a string literal; literals and names joined with + (every combination);
  * c ? a : b: both, unless c is a parameter bound to true or false at the call being followed;
  * a constant: constexpr char kX[] = "..."; a kube Resource constant's kind for X.kind;
    EventType::kNormal and kWarning; true and false;
  * a parameter of the enclosing function or named lambda: the same argument at each call of it
    in the same directory, with that call's other arguments bound too (so Finish(w, true, "A")
    gives Succeeded and a Normal Event, Finish(w, false, "B") Failed and a Warning one);
  * a local variable: what it is declared or assigned with in its scope, or the items of the
    braced list a range-for takes it from.
An argument that resolves to nothing known fails the test naming its file and line: a new way of
passing a reason has to be taught here rather than be missed.
"""
import itertools
import os
import re
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
PAGE = os.path.join("docs", "reference.md")
SCANNED = ("operator", "common", "worker")

# Found by the extraction but never written, each with why. The test fails if one is no longer
# found, so a stale exception cannot hide a change.
NEVER_WRITTEN = {
    ("Running", "False", "Running"):
        "ComputeStatus (operator/trainingjob/reconciler_status.cc) turns Running False with the "
        "phase as its reason only when the phase is not Running",
}

KEYWORDS = {"return", "else", "case", "throw", "co_return", "delete", "new", "not", "and", "or"}
CONTROL = {"if", "for", "while", "switch", "catch", "do", "else", "try", "return", "sizeof"}
ENUMS = {"kNormal": "Normal", "kWarning": "Warning", "true": "True", "false": "False"}


class Unresolved(Exception):
    pass


def strip_comments(text):
    """The text with // and /* */ comments blanked (newlines kept), string literals untouched."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out[i:j] = [ch if ch == "\n" else " " for ch in text[i:j]]
            i = j
        else:
            i += 1
    return "".join(out)


class Source:
    """One C++ file without its comments: `code`; `mask`, the same with the insides of string and
    character literals blanked, for finding structure; `pairs`, each bracket's partner."""

    def __init__(self, rel, text):
        self.rel = rel
        self.code = strip_comments(text)
        mask = list(self.code)
        i, n = 0, len(self.code)
        while i < n:
            c = self.code[i]
            if c == '"' or c == "'":
                j = i + 1
                while j < n and self.code[j] != c:
                    j += 2 if self.code[j] == "\\" else 1
                mask[i + 1:j] = "_" * (j - i - 1)
                i = j + 1
            else:
                i += 1
        self.mask = "".join(mask)
        self.pairs = {}
        stack = []
        for i, c in enumerate(self.mask):
            if c in "({[":
                stack.append(i)
            elif c in ")}]" and stack:
                o = stack.pop()
                self.pairs[o] = i
                self.pairs[i] = o
        self.blocks = sorted((o, c) for o, c in self.pairs.items()
                             if o < c and self.mask[o] == "{")

    def line(self, offset):
        return self.code.count("\n", 0, offset) + 1

    def where(self, offset):
        return f"{self.rel}:{self.line(offset)}"

    def prev(self, offset):
        """The offset of the last non-space character before `offset`, -1 when none."""
        i = offset - 1
        while i >= 0 and self.mask[i].isspace():
            i -= 1
        return i

    def next(self, offset):
        i = offset
        while i < len(self.mask) and self.mask[i].isspace():
            i += 1
        return i

    def word_before(self, end):
        """The identifier ending at `end` (inclusive) and its start."""
        start = end
        while start > 0 and (self.mask[start - 1].isalnum() or self.mask[start - 1] == "_"):
            start -= 1
        return self.mask[start:end + 1], start

    def split(self, start, end, sep):
        """Spans of code[start:end] split at `sep` outside brackets and literals."""
        spans, begin, i = [], start, start
        while i < end:
            c = self.mask[i]
            if c in "({[":
                i = self.pairs.get(i, i)
            elif self.mask.startswith(sep, i):
                if sep == "+" and (self.mask[i + 1] in "+=" or self.mask[i - 1] == "+"):
                    i += 1
                    continue
                spans.append((begin, i))
                begin = i + len(sep)
                i += len(sep)
                continue
            i += 1
        spans.append((begin, end))
        return spans

    def args(self, open_paren):
        close = self.pairs[open_paren]
        if self.mask[open_paren + 1:close].strip() == "":
            return []
        return self.split(open_paren + 1, close, ",")

    def trim(self, start, end):
        while start < end and self.mask[start].isspace():
            start += 1
        while end > start and self.mask[end - 1].isspace():
            end -= 1
        # Parentheses around the whole expression.
        while start < end and self.mask[start] == "(" and self.pairs.get(start) == end - 1:
            start, end = self.trim(start + 1, end - 1)
        return start, end

    def block_of(self, offset):
        """The innermost {} block holding `offset`, as (open, close); (-1, len) at file level."""
        best = (-1, len(self.mask))
        for o, c in self.blocks:
            if o < offset < c and o > best[0]:
                best = (o, c)
        return best


class Callable:
    """A function or named lambda whose body holds some offset: its parameters, and where it is
    called."""

    def __init__(self, src, name, params, body, scope, lambda_):
        self.src, self.name, self.params, self.body = src, name, params, body
        self.scope = scope  # where its calls are looked for: a lambda's enclosing block
        self.is_lambda = lambda_


def enclosing_callables(src, offset):
    """Functions and named lambdas whose bodies hold `offset`, innermost first."""
    found = []
    for o, c in sorted(((o, c) for o, c in src.blocks if o < offset < c), reverse=True):
        i = src.prev(o)
        # What may stand between a parameter list and its body: const, override, noexcept,
        # mutable, a trailing return type.
        while i >= 0 and src.mask[i] != ")":
            word, start = src.word_before(i)
            arrow = src.mask.rfind("->", max(0, i - 60), i + 1)
            if word in ("const", "override", "noexcept", "mutable"):
                i = src.prev(start)
            elif arrow >= 0 and re.fullmatch(r"->[\w:<>,\s*&]*", src.mask[arrow:i + 1]):
                i = src.prev(arrow)
            else:
                break
        if i < 0 or src.mask[i] != ")":
            continue
        open_paren = src.pairs[i]
        before = src.prev(open_paren)
        params = []
        for s, e in src.args(open_paren):
            s, e = src.trim(s, e)
            names = re.findall(r"\w+", src.mask[s:e].split("=")[0])
            params.append(names[-1] if names else "")
        if src.mask[before] == "]":
            bracket = src.pairs[before]
            eq = src.prev(bracket)
            if src.mask[eq] != "=":
                continue
            name, _ = src.word_before(src.prev(eq))
            found.append(Callable(src, name, params, (o, c), src.block_of(bracket), True))
            continue
        name, _ = src.word_before(before)
        if not name or name in CONTROL:
            continue
        found.append(Callable(src, name, params, (o, c), (-1, len(src.mask)), False))
    return found


def is_declaration(src, name_start):
    """Whether the function name at name_start (maybe qualified) is declared or defined there
    rather than called: a type stands before it."""
    i = name_start
    while True:
        j = src.prev(i)
        if j >= 1 and src.mask[j - 1:j + 1] == "::":
            _, i = src.word_before(src.prev(j - 1))
            continue
        break
    j = src.prev(i)
    if j < 0:
        return True
    c = src.mask[j]
    if c == "." or src.mask[j - 1:j + 1] == "->":
        return False  # a member call
    if c.isalnum() or c == "_":
        return src.word_before(j)[0] not in KEYWORDS
    return c in ">*&"


class Extractor:
    """The conditions and Events the sources under `repo` can write (see the module's doc)."""

    def __init__(self, repo, roots=SCANNED):
        self.repo = repo
        self.sources = {}
        for root in roots:
            for folder, _, names in os.walk(os.path.join(repo, root)):
                for name in sorted(names):
                    if name.endswith((".cc", ".h")):
                        path = os.path.join(folder, name)
                        rel = os.path.relpath(path, repo)
                        with open(path, encoding="utf-8", errors="replace") as f:
                            self.sources[rel] = f.read()
        self.parsed = {}
        self.constants = {}  # name -> [(rel, value)]
        self.kinds = {}      # kube Resource constant -> kind
        for rel, text in self.sources.items():
            for name, value in re.findall(r'constexpr\s+char\s+(\w+)\[\]\s*=\s*"([^"]*)"', text):
                self.constants.setdefault(name, []).append((rel, value))
            for name, kind in re.findall(
                    r'\bResource\s+(\w+)\{\s*"[^"]*",\s*"[^"]*",\s*"[^"]*",\s*"([^"]*)"', text):
                self.kinds[name] = kind

    def source(self, rel):
        if rel not in self.parsed:
            self.parsed[rel] = Source(rel, self.sources[rel])
        return self.parsed[rel]

    def calls(self, pattern, rels):
        """(src, name_start, open_paren) of each call matching `pattern` (a regex for the name)
        in files `rels`, declarations and definitions left out."""
        for rel in rels:
            if not re.search(pattern, self.sources[rel]):
                continue
            src = self.source(rel)
            for m in re.finditer(r"\b(%s)\s*\(" % pattern, src.mask):
                if not is_declaration(src, m.start(1)):
                    yield src, m.start(1), m.end() - 1

    def resolve(self, src, span, env, member=None, depth=0):
        """The strings the expression code[span] can hold, as (text, file:line) pairs. env: the
        arguments bound to parameters (call_sites); member: "kind" for X.kind."""
        if depth > 12:
            raise Unresolved(f"{src.where(span[0])}: resolution too deep")
        s, e = src.trim(*span)
        text = src.code[s:e]
        # c ? a : b
        q = self.find_top(src, s, e, "?")
        if q is not None:
            colon = self.find_colon(src, q + 1, e)
            cond = src.code[s:q].strip()
            choice = None
            entry = self.binding(src, s, cond, env)
            if entry is not None:
                bound = {v for v, _ in self.resolve(*entry, member=None, depth=depth + 1)}
                if bound == {"True"}:
                    choice = True
                elif bound == {"False"}:
                    choice = False
            out = []
            if choice in (None, True):
                out += self.resolve(src, (q + 1, colon), env, member, depth + 1)
            if choice in (None, False):
                out += self.resolve(src, (colon + 1, e), env, member, depth + 1)
            return out
        parts = src.split(s, e, "+")
        if len(parts) > 1:
            options = [self.resolve(src, p, env, member, depth + 1) for p in parts]
            return [("".join(v for v, _ in combo), combo[0][1])
                    for combo in itertools.product(*options)]
        if src.mask[s] == '"' and src.mask[e - 1] == '"' and e - s >= 2 and \
                '"' not in src.mask[s + 1:e - 1]:
            return [(re.sub(r"\\(.)", r"\1", text[1:-1]), src.where(s))]
        m = re.fullmatch(r"(?:std::)?string\s*\((.*)\)", text, re.S)
        if m:
            open_paren = src.mask.index("(", s)
            return self.resolve(src, (open_paren + 1, src.pairs[open_paren]), env, member,
                                depth + 1)
        m = re.fullmatch(r"((?:\w+::)*)(\w+)(?:\s*\.\s*(\w+))?", text)
        if not m:
            raise Unresolved(f"{src.where(s)}: cannot tell what `{text}` holds")
        name, field = m.group(2), m.group(3) or member
        if not m.group(1) or m.group(1).endswith("EventType::"):
            if name in ENUMS and field is None:
                return [(ENUMS[name], src.where(s))]
        if name in self.kinds and field == "kind":
            return [(self.kinds[name], src.where(s))]
        if name in self.constants and field is None:
            values = self.constants[name]
            folder = os.path.dirname(src.rel)
            near = [v for r, v in values if os.path.dirname(r) == folder] or [v for _, v in values]
            if len(set(near)) == 1:
                return [(near[0], src.where(s))]
            raise Unresolved(f"{src.where(s)}: constant {name} has several values {near}")
        if m.group(1):
            raise Unresolved(f"{src.where(s)}: cannot tell what `{text}` holds")
        # A parameter of an enclosing callable.
        for fn in enclosing_callables(src, s):
            if name in fn.params:
                key = (fn.src.rel, fn.body, name)
                if key in env:
                    return self.resolve(*env[key], member=field, depth=depth + 1)
                out = []
                for site_env in self.call_sites(fn):
                    bound = site_env[key]
                    out += self.resolve(*bound, member=field, depth=depth + 1)
                if not out:
                    raise Unresolved(f"{src.where(s)}: no call of {fn.name} gives `{name}`")
                return out
        # A local variable.
        return self.local(src, s, name, env, field, depth)

    def binding(self, src, offset, name, env):
        """What `env` binds `name` to, when it is a parameter of a callable around `offset`."""
        for fn in enclosing_callables(src, offset):
            if name in fn.params:
                return env.get((fn.src.rel, fn.body, name))
        return None

    def find_top(self, src, s, e, char):
        i = s
        while i < e:
            c = src.mask[i]
            if c in "({[":
                i = src.pairs.get(i, i) + 1
                continue
            if c == char:
                return i
            i += 1
        return None

    def find_colon(self, src, s, e):
        i, nested = s, 0
        while i < e:
            c = src.mask[i]
            if c in "({[":
                i = src.pairs.get(i, i) + 1
                continue
            if src.mask.startswith("::", i):
                i += 2
                continue
            if c == "?":
                nested += 1
            elif c == ":":
                if nested == 0:
                    return i
                nested -= 1
            i += 1
        raise Unresolved(f"{src.where(s)}: a ? without its :")

    def call_sites(self, fn):
        """For each call of `fn`: the binding of its parameters, keyed (file, body, name), to
        (src, span, env) of the argument; the env that of the caller (its own parameters open)."""
        if fn.is_lambda:
            rels = [fn.src.rel]
        else:
            folder = os.path.dirname(fn.src.rel)
            rels = [r for r in self.sources if os.path.dirname(r) == folder]
        envs = []
        for src, start, open_paren in self.calls(re.escape(fn.name), rels):
            if fn.is_lambda and not (fn.scope[0] < start < fn.scope[1] and
                                     not fn.body[0] <= start <= fn.body[1]):
                continue
            args = src.args(open_paren)
            if len(args) != len(fn.params):
                continue
            envs.append({(fn.src.rel, fn.body, p): (src, a, {}) for p, a in zip(fn.params, args)})
        return envs

    def local(self, src, use, name, env, field, depth):
        """What local variable `name`, seen at `use`, can hold."""
        decls, assigns = [], []
        fn = enclosing_callables(src, use)
        lo, hi = fn[0].body if fn else (0, len(src.mask))
        for m in re.finditer(r"\b%s\b" % re.escape(name), src.mask[lo:hi]):
            at = lo + m.start()
            before = src.prev(at)
            after = src.next(at + len(name))
            c = src.mask[before] if before >= 0 else ";"
            typed = (c.isalnum() or c == "_") and src.word_before(before)[0] not in KEYWORDS \
                or c in ">*&"
            if typed and src.mask[before - 1:before + 1] not in ("->",) and \
                    src.mask[before] != ".":
                decls.append((at, after))
            elif c in ";{}()," and src.mask[after] == "=" and src.mask[after + 1] != "=":
                assigns.append((at, after))

        def visible(offset, candidates):
            best = None
            for at, after in candidates:
                block = src.block_of(at)
                if at < offset and block[0] < offset < block[1]:
                    if best is None or block[0] >= src.block_of(best[0])[0]:
                        best = (at, after)
            return best

        decl = visible(use, decls)
        if decl is None:
            raise Unresolved(f"{src.where(use)}: cannot tell what `{name}` holds")
        exprs = []
        at, after = decl
        if src.mask[after] == "=" and src.mask[after + 1] != "=":
            exprs.append((after + 1, self.statement_end(src, after + 1)))
        elif src.mask[after] == ":" and src.mask[after + 1] != ":":
            start = src.next(after + 1)
            if src.mask[start] != "{":
                raise Unresolved(f"{src.where(at)}: `{name}` ranges over something not listed")
            exprs += src.split(start + 1, src.pairs[start], ",")
        for a_at, a_after in assigns:
            if visible(a_at + 1, decls) == decl:
                exprs.append((a_after + 1, self.statement_end(src, a_after + 1)))
        out = []
        for span in exprs:
            out += self.resolve(src, span, env, field, depth + 1)
        if not out:
            raise Unresolved(f"{src.where(use)}: `{name}` is never given a value")
        return out

    def statement_end(self, src, start):
        i = start
        while i < len(src.mask) and src.mask[i] != ";":
            if src.mask[i] in "({[":
                i = src.pairs[i]
            i += 1
        return i

    def tuples(self, src, open_paren, indices):
        """Every combination of the values of arguments `indices` of the call at open_paren,
        each with the place of the last argument's literal."""
        args = src.args(open_paren)
        if len(args) <= max(indices):
            raise Unresolved(f"{src.where(open_paren)}: fewer arguments than expected")
        spans = [args[i] for i in indices]
        # Parameters of the innermost enclosing callable that the arguments name: follow each of
        # its calls with all of them bound together.
        envs = [{}]
        fns = enclosing_callables(src, open_paren)
        if fns:
            fn = fns[0]
            named = set()
            for s, e in spans:
                named |= set(re.findall(r"\w+", src.mask[s:e]))
            if named & set(fn.params):
                envs = self.call_sites(fn)
                if not envs:
                    raise Unresolved(f"{src.where(open_paren)}: no call of {fn.name} found")
        out = set()
        for env in envs:
            values = [self.resolve(src, span, env) for span in spans]
            for combo in itertools.product(*values):
                out.add((tuple(v for v, _ in combo), combo[-1][1]))
        return out

    def conditions(self):
        """{(type, "True"|"False", reason): set of places}."""
        found = {}
        rels = [r for r in self.sources if "SetCondition" in self.sources[r]]
        for src, _, open_paren in self.calls("SetCondition", rels):
            for values, where in self.tuples(src, open_paren, (1, 2, 3)):
                found.setdefault(values, set()).add(where)
        return found

    def events(self):
        """{(reason, "Normal"|"Warning"): set of places}."""
        found = {}
        rels = [r for r in self.sources if "EventType::" in self.sources[r]]
        for src, _, open_paren in self.calls("Record", rels):
            args = src.args(open_paren)
            if len(args) != 4 or "EventType::" not in src.mask[args[1][0]:args[1][1]]:
                continue
            for (kind, reason), where in self.tuples(src, open_paren, (1, 2)):
                found.setdefault((reason, kind), set()).add(where)
        return found


def tables(page_text):
    """[(heading, rows)] of a Markdown page: each table (a run of lines starting with |, its
    separator left out) with the heading it stands under, each row a list of cells."""
    out, heading, rows = [], None, None
    for line in page_text.splitlines() + [""]:
        if line.startswith("|"):
            if rows is None:
                rows = []
                out.append((heading, rows))
            if not re.match(r"^\|[-| :]+\|$", line.strip()):
                rows.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        rows = None
        m = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if m:
            heading = m.group(1)
    return out


def table(page_text, heading_word, columns):
    """The rows of the first table under a heading that holds `heading_word` and has the named
    columns, each a dict column -> (the cell's backquoted names, its words)."""
    for heading, rows in tables(page_text):
        if heading is None or heading_word.lower() not in heading.lower() or not rows:
            continue
        header = [c.lower() for c in rows[0]]
        if not all(col in header for col in columns):
            continue
        result = []
        for row in rows[1:]:
            cells = {}
            for col in columns:
                cell = row[header.index(col)] if header.index(col) < len(row) else ""
                cells[col] = (set(re.findall(r"`([^`]+)`", cell)), set(re.findall(r"\w+", cell)))
            result.append(cells)
        return heading, result
    return None, []


def problems(conditions, events, page_text):
    """What the page lacks, and what it names that the code cannot write: one line each."""
    out = []
    heading, rows = table(page_text, "conditions", ("type", "status", "reason"))
    if heading is None:
        out.append(f"{PAGE}: no conditions table (a heading with 'Conditions' and columns type, "
                   "status, reason)")
    documented = set()
    for row in rows:
        for t in row["type"][0]:
            for s in row["status"][1] & {"True", "False"}:
                for r in row["reason"][0]:
                    documented.add((t, s, r))
    for (t, s, r), where in sorted(conditions.items()):
        if (t, s, r) in NEVER_WRITTEN:
            continue
        if (t, s, r) not in documented:
            out.append(f"{PAGE}, \"{heading}\": no row for condition {t}={s} reason `{r}` "
                       f"(written at {', '.join(sorted(where))})")
    for t, s, r in sorted(documented - set(conditions)):
        out.append(f"{PAGE}, \"{heading}\": condition {t}={s} reason `{r}` is documented but no "
                   "code writes it")
    heading, rows = table(page_text, "events", ("reason", "type"))
    if heading is None:
        out.append(f"{PAGE}: no Events table (a heading with 'Events' and columns reason, type)")
    documented = set()
    for row in rows:
        for r in row["reason"][0]:
            for k in row["type"][1] & {"Normal", "Warning"}:
                documented.add((r, k))
    for (r, k), where in sorted(events.items()):
        if (r, k) not in documented:
            out.append(f"{PAGE}, \"{heading}\": no row for {k} Event `{r}` "
                       f"(recorded at {', '.join(sorted(where))})")
    for r, k in sorted(documented - set(events)):
        out.append(f"{PAGE}, \"{heading}\": {k} Event `{r}` is documented but no code records it")
    return out


def describe(conditions, events):
    types = sorted({t for t, _, _ in conditions})
    reasons = sorted({r for _, _, r in conditions})
    return (f"{len(types)} condition types ({', '.join(types)}), {len(reasons)} condition "
            f"reasons ({', '.join(reasons)}), {len(conditions)} type/status/reason triples; "
            f"{len({r for r, _ in events})} Event reasons "
            f"({', '.join(sorted(f'{r}/{k}' for r, k in events))})")


class ReferenceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        extractor = Extractor(REPO)
        cls.conditions = extractor.conditions()
        cls.events = extractor.events()
        with open(os.path.join(REPO, PAGE), encoding="utf-8") as f:
            cls.page = f.read()

    def test_the_page_names_every_condition_and_event_the_operator_writes(self):
        found = describe(self.conditions, self.events)
        print("\n" + found)
        # The extraction found what there is (a pattern that matched nothing would pass too).
        self.assertGreaterEqual(len({t for t, _, _ in self.conditions}), 9, found)
        self.assertGreaterEqual(len({r for _, _, r in self.conditions}), 25, found)
        self.assertGreaterEqual(len({r for r, _ in self.events}), 20, found)
        for name in ("Created", "Failed", "Straggler", "Queued"):
            self.assertIn(name, {t for t, _, _ in self.conditions}, found)
        for reason in ("BackoffLimitExceeded", "FailedCreateSecret", "WorkersSucceeded"):
            self.assertIn(reason, {r for r, _ in self.events}, found)
        # Reasons passed through a parameter are followed to each call, with the others bound.
        self.assertIn(("Failed", "True", "InvalidSpec"), self.conditions)
        self.assertNotIn(("Succeeded", "True", "InvalidSpec"), self.conditions)
        self.assertIn(("WorkersSucceeded", "Normal"), self.events)
        self.assertNotIn(("WorkersSucceeded", "Warning"), self.events)
        for stale in NEVER_WRITTEN:
            self.assertIn(stale, self.conditions, f"{stale} is no longer found: remove it from "
                          "NEVER_WRITTEN")
        missing = problems(self.conditions, self.events, self.page)
        self.assertEqual(missing, [], "\n".join(missing))

    def test_a_reason_missing_from_the_page_is_named_with_its_source(self):
        # One condition reason and one Event reason taken out of the page.
        page = self.page.replace("`ParameterServerLost`", "").replace("`ReplacingStraggler`", "")
        missing = "\n".join(problems(self.conditions, self.events, page))
        self.assertRegex(missing, r"condition Failed=True reason `ParameterServerLost` \(written "
                                  r"at operator/trainingjob/reconciler_ps\.cc:\d+")
        self.assertRegex(missing, r"Normal Event `ReplacingStraggler` \(recorded at "
                                  r"operator/trainingjob/reconciler_stragglers\.cc:\d+")
        # And a name the code cannot write.
        page = self.page.replace("`WorkersSucceeded`", "`WorkersSucceeded`, `NoSuchReason`", 1)
        self.assertIn("reason `NoSuchReason` is documented but no code writes it",
                      "\n".join(problems(self.conditions, self.events, page)))

    def test_reasons_passed_through_parameters_and_unknown_ones_are_found(self):
        with tempfile.TemporaryDirectory() as repo:
            os.makedirs(os.path.join(repo, "operator", "job"))
            with open(os.path.join(repo, "operator", "job", "a.cc"), "w") as f:
                f.write('inline constexpr char kDone[] = "Done";\n'
                        "Status R::End(Work& w, bool ok, const std::string& why) {\n"
                        "  SetCondition(&w.status, ok ? kDone : kBroken, true, why, \"\", w.now);\n"
                        "  events->Record(o, ok ? EventType::kNormal : EventType::kWarning, why,\n"
                        "                 \"m\");\n"
                        "}\n"
                        'inline constexpr char kBroken[] = "Broken";\n'
                        "Status R::Run(Work& w) {\n"
                        "  std::string phase = \"Waiting\";\n"
                        "  if (x) phase = \"Going\";\n"
                        "  for (int i = 0; i < 2; ++i) {\n"
                        "    const std::string phase = Compute(i);  // not the one used below\n"
                        "  }\n"
                        "  SetCondition(&w.status, kDone, false, phase, \"\", w.now);\n"
                        "  if (y) return End(w, /*ok=*/true, \"AllDone\");\n"
                        '  return End(w, false, std::string("Gave") + "Up");\n'
                        "}\n")
            extractor = Extractor(repo)
            self.assertEqual(set(extractor.conditions()),
                             {("Done", "True", "AllDone"), ("Broken", "True", "GaveUp"),
                              ("Done", "False", "Waiting"), ("Done", "False", "Going")})
            self.assertEqual(set(extractor.events()),
                             {("AllDone", "Normal"), ("GaveUp", "Warning")})
            with open(os.path.join(repo, "operator", "job", "b.cc"), "w") as f:
                f.write("void F(Work& w) {\n"
                        "  SetCondition(&w.status, kDone, true, ReasonOf(pod), \"\", w.now);\n"
                        "}\n")
            with self.assertRaisesRegex(Unresolved, r"operator/job/b\.cc:2: cannot tell what "
                                                    r"`ReasonOf\(pod\)` holds"):
                Extractor(repo).conditions()


if __name__ == "__main__":
    unittest.main()
