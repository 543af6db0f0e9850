#!/usr/bin/env python3
"""A small renderer for the Go-template subset that charts/lockstep uses (Helm is not installable
here).

    helm_render.py CHART [--values FILE]... [--release NAME] [--namespace NS] [--out FILE]
                         [--notes FILE]

prints (or writes to --out) the rendered objects as one JSON list, in the order Helm would list the
templates (file name order). CRDs under crds/ are not templates and are not rendered (Helm installs
them as they are); tests read them directly.

What it implements, with Helm's semantics:
  - text/template actions: {{ pipeline }}, {{- and -}} whitespace trimming, comments,
    if / else if / else / end, with / else, range (over a list or a map, optional else),
    define / template / include, variables ($x := ..., $x = ..., $ as the root),
    pipelines with |, parenthesised sub-pipelines, field chains on . / $ / variables / (..),
    string ("..." and raw `...`), number and boolean literals;
  - values as Helm sees them: YAML read into JSON types, so every number is a float64 and prints
    the way Go's %v prints a float64 (2, 0.6, 1e+06);
  - missing fields evaluate to nil and print as "" (Helm's "<no value>" replacement);
  - the functions in FUNCTIONS below (Helm's and sprig's, same argument order).
Anything else (an unknown function or keyword, a malformed action) is an error naming the
template and the action: the renderer refuses what it does not implement instead of guessing.
"""
import argparse
import json
import math
import os
import re
import sys
from decimal import Decimal

import yaml


class TemplateError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Values: Go's view of them.


def to_go_values(value):
    """YAML as Helm holds it after its JSON round trip: every number a float64."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, list):
        return [to_go_values(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_go_values(v) for k, v in value.items()}
    raise TemplateError("unsupported value type %r" % type(value))


def format_go_float(number):
    """strconv.FormatFloat(f, 'g', -1, 64), which is what %v prints for a float64: the shortest
    digits that round-trip, in %e form when the exponent is < -4 or >= 6."""
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    if math.isnan(number):
        return "NaN"
    if number == 0:
        return "0"
    sign, digit_tuple, exponent = Decimal(repr(abs(number))).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    exponent += len(digit_tuple) - len(digits)
    point = len(digits) + exponent  # position of the decimal point within digits
    prefix = "-" if number < 0 else ""
    exp = point - 1
    if exp < -4 or exp >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return "%s%se%s%02d" % (prefix, mantissa, "-" if exp < 0 else "+", abs(exp))
    if point <= 0:
        return prefix + "0." + "0" * (-point) + digits
    if point >= len(digits):
        return prefix + digits + "0" * (point - len(digits))
    return prefix + digits[:point] + "." + digits[point:]


def go_string(value):
    """What {{ value }} prints."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format_go_float(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "[" + " ".join(go_string(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join("%s:%s" % (k, go_string(value[k])) for k in sorted(value)) + "]"
    raise TemplateError("cannot print %r" % (value,))


def truthy(value):
    if value is None or value is False:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value != 0
    if isinstance(value, (str, list, dict)):
        return len(value) > 0
    return True


def to_plain(value):
    """Integral floats back to ints, for YAML/JSON output (Go marshals float64 2 as 2)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


def to_yaml(value):
    if value is None:
        return "null"
    text = yaml.safe_dump(to_plain(value), default_flow_style=False, sort_keys=True, width=1 << 30)
    if text.endswith("\n...\n"):
        text = text[: -len("...\n")]
    return text.rstrip("\n")


def to_json(value):
    return json.dumps(to_plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def go_quote(text):
    return json.dumps(text, ensure_ascii=False)


def go_printf(fmt, *args):
    out, index, i = [], 0, 0
    while i < len(fmt):
        c = fmt[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        verb = fmt[i + 1]
        i += 2
        if verb == "%":
            out.append("%")
            continue
        if index >= len(args):
            raise TemplateError("printf %r: missing argument" % fmt)
        arg = args[index]
        index += 1
        if verb in ("s", "v"):
            out.append(go_string(arg))
        elif verb == "d":
            out.append(str(int(arg)))
        elif verb == "q":
            out.append(go_quote(go_string(arg)))
        else:
            raise TemplateError("printf verb %%%s is not implemented" % verb)
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Lexing and parsing.

def scan_actions(source, name):
    """Yields (start, end, body, trim_left, trim_right) for each {{ ... }}; a "}}" inside a
    quoted or raw string or a comment does not end the action (as in Go's lexer)."""
    pos = 0
    while True:
        start = source.find("{{", pos)
        if start < 0:
            return
        i = start + 2
        trim_left = source.startswith("- ", i) or source.startswith("-\n", i)
        if trim_left:
            i += 1
        body_start = i
        while True:
            if i >= len(source):
                raise TemplateError("%s: unclosed action at offset %d" % (name, start))
            if source.startswith("/*", i):
                close = source.find("*/", i + 2)
                if close < 0:
                    raise TemplateError("%s: unclosed comment at offset %d" % (name, start))
                i = close + 2
            elif source[i] in "\"`":
                quote = source[i]
                i += 1
                while i < len(source) and source[i] != quote:
                    i += 2 if quote == '"' and source[i] == "\\" else 1
                i += 1
            elif source.startswith("}}", i):
                trim_right = i >= 2 and source[i - 2 : i] in (" -", "\n-")
                body_end = i - 1 if trim_right else i
                yield start, i + 2, source[body_start:body_end], trim_left, trim_right
                pos = i + 2
                break
            else:
                i += 1


class Node:
    def __init__(self, kind, **fields):
        self.kind = kind
        self.__dict__.update(fields)


TOKEN = re.compile(
    r"""\s*(?:
      (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<raw>`[^`]*`)
    | (?P<number>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
    | (?P<declare>:=)
    | (?P<assign>=)
    | (?P<punct>[()|,])
    | (?P<variable>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
    | (?P<field>(?:\.[A-Za-z0-9_]+)+|\.)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.X,
)


def tokenize(text, where):
    tokens, pos = [], 0
    text = text.strip()
    while pos < len(text):
        match = TOKEN.match(text, pos)
        if not match or match.end() == pos:
            raise TemplateError("%s: cannot parse %r" % (where, text[pos:]))
        kind = match.lastgroup
        value = match.group(kind)
        # A field chain written right after ')' (no space) continues that term: (x).y
        if kind == "field" and match.start(kind) == pos and tokens and tokens[-1] == ("punct", ")"):
            kind = "chain"
        pos = match.end()
        tokens.append((kind, value))
    return tokens


class PipelineParser:
    def __init__(self, tokens, where):
        self.tokens, self.pos, self.where = tokens, 0, where

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else (None, None)

    def take(self):
        token = self.peek()
        self.pos += 1
        return token

    def error(self, message):
        raise TemplateError("%s: %s" % (self.where, message))

    def pipeline(self, stop=None):
        commands = [self.command(stop)]
        while self.peek() == ("punct", "|"):
            self.take()
            commands.append(self.command(stop))
        return Node("pipeline", commands=commands)

    def command(self, stop):
        words = []
        while True:
            kind, value = self.peek()
            if kind is None or (kind == "punct" and value in ("|", ")")) or value == stop:
                break
            words.append(self.term())
        if not words:
            self.error("empty command")
        return words

    def term(self):
        kind, value = self.take()
        if kind == "string":
            node = Node("literal", value=json.loads(value))
        elif kind == "raw":
            node = Node("literal", value=value[1:-1])
        elif kind == "number":
            node = Node("literal", value=float(value) if "." in value or "e" in value.lower() else int(value))
        elif kind == "ident":
            if value in ("true", "false"):
                node = Node("literal", value=value == "true")
            elif value == "nil":
                node = Node("literal", value=None)
            else:
                node = Node("function", name=value)
        elif kind == "field":
            node = Node("field", base=None, path=[p for p in value.split(".") if p])
        elif kind == "variable":
            name, *path = value.split(".")
            node = Node("variable", name=name, path=path)
        elif kind == "punct" and value == "(":
            inner = self.pipeline()
            if self.take() != ("punct", ")"):
                self.error("missing )")
            node = Node("paren", pipeline=inner)
            next_kind, next_value = self.peek()
            if next_kind == "chain":
                self.take()
                node = Node("field", base=node, path=[p for p in next_value.split(".") if p])
        else:
            self.error("unexpected %r" % (value,))
        return node


KEYWORDS = ("if", "else", "end", "range", "with", "define", "template", "block")


def parse(source, name):
    """Parses a template into a tree; returns (body, {define name: body})."""
    pieces, pos = [], 0
    for start, end, body, trim_left, trim_right in scan_actions(source, name):
        text = source[pos:start]
        if trim_left:
            text = text.rstrip(" \t\r\n")
        pieces.append(("text", text))
        pieces.append(("action", body, trim_right))
        pos = end
        if trim_right:
            rest = source[pos:]
            pos += len(rest) - len(rest.lstrip(" \t\r\n"))
    pieces.append(("text", source[pos:]))

    defines = {}
    root = Node("list", items=[])
    stack = [(root, None)]  # (list being filled, block node)

    def add(node):
        stack[-1][0].items.append(node)

    for piece in pieces:
        if piece[0] == "text":
            if piece[1]:
                add(Node("text", text=piece[1]))
            continue
        body = piece[1].strip()
        where = "%s: {{ %s }}" % (name, body if len(body) < 80 else body[:77] + "...")
        if body.startswith("/*"):
            if not body.endswith("*/"):
                raise TemplateError("%s: unterminated comment" % where)
            continue
        first = body.split(None, 1)[0] if body else ""
        rest = body[len(first) :].strip()
        if first in ("if", "with", "range"):
            block = Node(first, pipeline=None, var=None, then=Node("list", items=[]), otherwise=None)
            tokens = tokenize(rest, where)
            if first == "range" and len(tokens) > 2 and tokens[1] == ("declare", ":="):
                block.var = tokens[0][1]
                tokens = tokens[2:]
            block.pipeline = PipelineParser(tokens, where).pipeline()
            add(block)
            stack.append((block.then, block))
        elif first == "else":
            list_, block = stack[-1]
            if block is None or block.kind not in ("if", "with", "range") or block.otherwise:
                raise TemplateError("%s: else without if/with/range" % where)
            block.otherwise = Node("list", items=[])
            stack[-1] = (block.otherwise, block)
            if rest.startswith("if "):
                nested = Node("if", pipeline=PipelineParser(tokenize(rest[3:], where), where).pipeline(),
                              var=None, then=Node("list", items=[]), otherwise=None, chained=True)
                block.otherwise.items.append(nested)
                stack.append((nested.then, nested))
            elif rest:
                raise TemplateError("%s: unsupported else clause" % where)
        elif first == "end":
            while True:
                if len(stack) == 1:
                    raise TemplateError("%s: end without a block" % where)
                _, block = stack.pop()
                if not getattr(block, "chained", False):
                    break
        elif first == "define":
            define_name = json.loads(rest)
            block = Node("define", name=define_name, then=Node("list", items=[]))
            defines[define_name] = block.then
            stack.append((block.then, block))
        elif first in ("template", "block"):
            if first == "block":
                raise TemplateError("%s: block is not implemented" % where)
            tokens = tokenize(rest, where)
            if not tokens or tokens[0][0] != "string":
                raise TemplateError("%s: template needs a name" % where)
            pipe = PipelineParser(tokens[1:], where).pipeline() if len(tokens) > 1 else None
            add(Node("template", name=json.loads(tokens[0][1]), pipeline=pipe, where=where))
        else:
            tokens = tokenize(body, where)
            if len(tokens) >= 2 and tokens[0][0] == "variable" and tokens[1][0] in ("declare", "assign"):
                add(Node("set", name=tokens[0][1], declare=tokens[1][0] == "declare",
                         pipeline=PipelineParser(tokens[2:], where).pipeline(), where=where))
            else:
                add(Node("print", pipeline=PipelineParser(tokens, where).pipeline(), where=where))
    if len(stack) != 1:
        raise TemplateError("%s: unclosed %s" % (name, stack[-1][1].kind))
    return root, defines


# ---------------------------------------------------------------------------------------------
# Evaluation.


class Files:
    def __init__(self, chart_dir):
        self.chart_dir = chart_dir

    def Get(self, path):  # noqa: N802 (Helm's name)
        full = os.path.join(self.chart_dir, path)
        if not os.path.isfile(full):
            return ""  # Helm's .Files.Get returns "" for a missing file
        with open(full, encoding="utf-8") as f:
            return f.read()


class Renderer:
    def __init__(self, chart_dir, values, release, namespace):
        self.chart_dir = chart_dir
        with open(os.path.join(chart_dir, "Chart.yaml"), encoding="utf-8") as f:
            chart = yaml.safe_load(f)
        self.root = {
            "Values": to_go_values(values),
            "Release": {"Name": release, "Namespace": namespace, "Service": "Helm",
                        "IsInstall": True, "IsUpgrade": False, "Revision": 1.0},
            "Chart": {"Name": chart["name"], "Version": chart["version"],
                      "AppVersion": chart.get("appVersion", "")},
            "Files": Files(chart_dir),
            "Template": {"BasePath": "lockstep/templates"},
        }
        self.defines = {}
        self.templates = []
        template_dir = os.path.join(chart_dir, "templates")
        for file_name in sorted(os.listdir(template_dir)):
            path = os.path.join(template_dir, file_name)
            with open(path, encoding="utf-8") as f:
                body, defines = parse(f.read(), "templates/" + file_name)
            self.defines.update(defines)
            self.templates.append((file_name, body))
        self.functions = {
            "include": self.fn_include,
            "tpl": self.fn_tpl,
            "toYaml": to_yaml,
            "toJson": to_json,
            "indent": lambda n, s: "\n".join(" " * int(n) + line for line in s.split("\n")),
            "nindent": lambda n, s: "\n" + "\n".join(" " * int(n) + line for line in s.split("\n")),
            "quote": lambda *xs: " ".join(go_quote(go_string(x)) for x in xs if x is not None),
            "squote": lambda *xs: " ".join("'%s'" % go_string(x) for x in xs if x is not None),
            "default": lambda d, *v: v[0] if v and truthy(v[0]) else d,
            "required": self.fn_required,
            "printf": go_printf,
            "trunc": lambda n, s: s[: int(n)] if n >= 0 else s[int(n):],
            "trimSuffix": lambda suffix, s: s[: -len(suffix)] if suffix and s.endswith(suffix) else s,
            "contains": lambda sub, s: sub in s,
            "dict": self.fn_dict,
            "eq": lambda a, *bs: any(a == b for b in bs),
            "ne": lambda a, b: a != b,
            "not": lambda a: not truthy(a),
            "and": lambda *xs: next((x for x in xs if not truthy(x)), xs[-1]),
            "or": lambda *xs: next((x for x in xs if truthy(x)), xs[-1]),
            "empty": lambda x: not truthy(x),
            "lower": lambda s: s.lower(),
        }

    # -- functions needing the renderer
    def fn_include(self, name, data):
        if name not in self.defines:
            raise TemplateError("include: no template %r" % name)
        return self.execute(self.defines[name], data, {"$": data})

    def fn_tpl(self, text, data):
        body, defines = parse(text, "tpl")
        saved = dict(self.defines)
        self.defines.update(defines)
        try:
            return self.execute(body, data, {"$": data})
        finally:
            self.defines = saved

    @staticmethod
    def fn_required(message, value):
        if not truthy(value) and value is not False:
            raise TemplateError("required: " + message)
        return value

    @staticmethod
    def fn_dict(*pairs):
        if len(pairs) % 2:
            raise TemplateError("dict needs key/value pairs")
        return {go_string(pairs[i]): pairs[i + 1] for i in range(0, len(pairs), 2)}

    # -- evaluation
    def field(self, base, path, where):
        value = base
        for part in path:
            if isinstance(value, dict):
                value = value.get(part)
            elif value is None:
                return None
            elif hasattr(value, part):
                value = getattr(value, part)
            else:
                raise TemplateError("%s: cannot read .%s of %r" % (where, part, value))
        return value

    def term(self, node, dot, variables, where):
        if node.kind == "literal":
            return node.value
        if node.kind == "field":
            base = dot if node.base is None else self.term(node.base, dot, variables, where)
            return self.field(base, node.path, where)
        if node.kind == "variable":
            if node.name not in variables:
                raise TemplateError("%s: undefined variable %s" % (where, node.name))
            return self.field(variables[node.name], node.path, where)
        if node.kind == "paren":
            return self.pipeline(node.pipeline, dot, variables, where)
        if node.kind == "function":
            return self.call(node.name, [], where)
        raise TemplateError("%s: unexpected %s" % (where, node.kind))

    def call(self, name, args, where):
        if name not in self.functions:
            raise TemplateError("%s: function %r is not implemented" % (where, name))
        try:
            return self.functions[name](*args)
        except TemplateError:
            raise
        except Exception as e:  # wrong arity or types: name the action
            raise TemplateError("%s: %s(%s): %s" % (where, name, args, e)) from e

    def command(self, words, dot, variables, where, piped):
        head = words[0]
        args = [self.term(w, dot, variables, where) for w in words[1:]]
        if piped is not _NOTHING:
            args.append(piped)
        if head.kind == "function":
            return self.call(head.name, args, where)
        value = self.term(head, dot, variables, where)
        if callable(value):
            return value(*args)
        if args:
            raise TemplateError("%s: %r is not a function" % (where, value))
        return value

    def pipeline(self, pipe, dot, variables, where):
        value = _NOTHING
        for words in pipe.commands:
            value = self.command(words, dot, variables, where, value)
        return value

    def execute(self, node, dot, variables):
        out = []
        self.run(node, dot, dict(variables), out)
        return "".join(out)

    def run(self, node, dot, variables, out):
        for item in node.items:
            kind = item.kind
            if kind == "text":
                out.append(item.text)
            elif kind == "print":
                out.append(go_string(self.pipeline(item.pipeline, dot, variables, item.where)))
            elif kind == "set":
                value = self.pipeline(item.pipeline, dot, variables, item.where)
                if not item.declare and item.name not in variables:
                    raise TemplateError("%s: assignment to undeclared %s" % (item.where, item.name))
                variables[item.name] = value
            elif kind in ("if", "with"):
                value = self.pipeline(item.pipeline, dot, variables, "%s condition" % kind)
                if truthy(value):
                    self.run(item.then, value if kind == "with" else dot, dict(variables), out)
                elif item.otherwise is not None:
                    self.run(item.otherwise, dot, dict(variables), out)
            elif kind == "range":
                value = self.pipeline(item.pipeline, dot, variables, "range")
                if isinstance(value, dict):
                    elements = [value[k] for k in sorted(value)]
                elif isinstance(value, list) or value is None:
                    elements = value or []
                else:
                    raise TemplateError("range over %r" % (value,))
                if not elements and item.otherwise is not None:
                    self.run(item.otherwise, dot, dict(variables), out)
                for element in elements:
                    scope = dict(variables)
                    if item.var:
                        scope[item.var] = element
                    self.run(item.then, element, scope, out)
            elif kind == "template":
                data = self.pipeline(item.pipeline, dot, variables, item.where) if item.pipeline else None
                out.append(self.fn_include(item.name, data))
            elif kind == "define":
                pass
            else:
                raise TemplateError("unknown node %s" % kind)

    def render(self):
        """{template file name: rendered text} for every template (files starting with _ are
        helpers, as in Helm)."""
        rendered = {}
        for file_name, body in self.templates:
            if file_name.startswith("_"):
                continue
            rendered[file_name] = self.execute(body, self.root, {"$": self.root})
        return rendered


_NOTHING = object()


def deep_merge(base, override):
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def render_chart(chart_dir, value_files=(), release="lockstep", namespace="lockstep-system"):
    """Returns (objects, notes): the rendered manifests parsed into dicts, and NOTES.txt."""
    with open(os.path.join(chart_dir, "values.yaml"), encoding="utf-8") as f:
        values = yaml.safe_load(f) or {}
    for path in value_files:
        with open(path, encoding="utf-8") as f:
            values = deep_merge(values, yaml.safe_load(f) or {})
    renderer = Renderer(chart_dir, values, release, namespace)
    rendered = renderer.render()
    objects, notes = [], ""
    for file_name, text in rendered.items():
        if file_name == "NOTES.txt":
            notes = text
            continue
        for document in re.split(r"(?m)^---\s*$", text):
            if not document.strip():
                continue
            try:
                obj = yaml.safe_load(document)
            except yaml.YAMLError as e:
                raise TemplateError("templates/%s renders invalid YAML: %s\n%s" % (file_name, e, document))
            if obj is None:
                continue
            if not isinstance(obj, dict) or "kind" not in obj:
                raise TemplateError("templates/%s renders a document that is no object:\n%s" % (file_name, document))
            objects.append({"source": "templates/" + file_name, "object": obj})
    return objects, notes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("chart")
    parser.add_argument("--values", action="append", default=[])
    parser.add_argument("--release", default="lockstep")
    parser.add_argument("--namespace", default="lockstep-system")
    parser.add_argument("--out")
    parser.add_argument("--notes")
    args = parser.parse_args()
    try:
        objects, notes = render_chart(args.chart, args.values, args.release, args.namespace)
    except TemplateError as e:
        print("helm_render: %s" % e, file=sys.stderr)
        return 1
    text = json.dumps(objects, indent=1, sort_keys=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text)
    if args.notes:
        with open(args.notes, "w", encoding="utf-8") as f:
            f.write(notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
