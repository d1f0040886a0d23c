"""Hypothesis strategies for the fuzz suite: bad and odd inputs of every kind structgen reads.

Each strategy draws a :class:`sandbox.Case` (see ``tests/sandbox.py``): schema-shaped JSON
(deep, wide, self-referencing, huge numbers, odd unicode, wrong keyword types, mixed drafts),
Lark grammar text (a small generator plus text mutations), regex text, YAML configuration files
(wrong types, non-finite numbers, anchors, tags) and CLI argument vectors over a small pool of
files. The values are picked to hit edges, not to be realistic.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st
from sandbox import Case

# --------------------------------------------------------------------------------- scalars

ODD_STRINGS = ["", "\x00", "a\x00b", "\u202eRTL\u202c", "e\u0301\u0301\u0301", "\uffff", "\ufdd0",
               "\ud800", "\udfff", "\U0001f4a5", "\U0010ffff", "\r\n", "\t", "~1", "~0", "/", "%25",
               "$ref", "__proto__", "a" * 300, "\u0000\u0001\u007f", "\u00e9", "\ufeff"]
ODD_NUMBERS: list[Any] = [0, -0.0, 1, -1, 0.5, 1e308, -1e308, 5e-324, 1e-30, 2**53 + 1, 2**63,
                          -(2**63) - 1, 2**200, -(2**200), 10**400, 3, 0.1, 1e-7, 7]
NON_FINITE = [float("inf"), float("-inf"), float("nan")]

odd_text = st.one_of(st.sampled_from(ODD_STRINGS),
                     st.text(st.characters(blacklist_categories=()), max_size=12))
numbers = st.one_of(st.sampled_from(ODD_NUMBERS), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=False, allow_infinity=False))
scalars = st.one_of(st.none(), st.booleans(), numbers, odd_text)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(odd_text, inner, max_size=4)), max_leaves=12)

# --------------------------------------------------------------------------------- regexes

REGEX_TOKENS = ["a", "b", "z", ".", "*", "+", "?", "*?", "|", "(", ")", "[", "]", "[a-z]", "[^a]",
                "[z-a]", "{2}", "{2,3}", "{3,2}", "{,4}", "{1000}", "{99999}", "{0}", "\\d", "\\w",
                "\\s", "\\b", "\\B", "\\1", "^", "$", "(?:", "(?=", "(?!", "(?<=", "(?<n>", "(?P<n>",
                "\\p{L}", "\\P{Lu}", "\\u00e9", "\\x00", "\\uD800", "\\", "\\Q", "\\k<n>", "-", "\u00e9",
                "\U0001f4a5", "\x00", "\\n", "\\/", "(?i)", "[[:alpha:]]", "(a|b)*a(a|b){12}", "\\z"]
SAFE_PATTERNS = ["^[a-z]+$", "^\\d{3}-\\d{4}$", "a|b", "^(ab)*$", "^[^\"\\\\]{0,5}$", "x?y+z*"]

regex_text = st.one_of(
    st.sampled_from(SAFE_PATTERNS),
    st.lists(st.sampled_from(REGEX_TOKENS), min_size=1, max_size=14).map("".join),
    st.text(st.characters(blacklist_categories=()), max_size=10))
samples = st.lists(st.one_of(st.sampled_from(["", "a", "ab", "123-4567", "\x00", "\u00e9"]),
                             st.text(max_size=8)), max_size=3)


@st.composite
def regex_cases(draw: st.DrawFn) -> Case:
    return Case("regex", {"pattern": draw(regex_text), "samples": draw(samples)}, "regex")


# --------------------------------------------------------------------------------- JSON schemas

TYPES = ["null", "boolean", "integer", "number", "string", "array", "object"]
FORMATS = ["date", "date-time", "time", "email", "uri", "uuid", "ipv4", "ipv6", "hostname",
           "regex", "duration", "json-pointer", "iri", "no-such-format", "", "\u00e9"]
DRAFTS = ["https://json-schema.org/draft/2020-12/schema", "http://json-schema.org/draft-07/schema#",
          "http://json-schema.org/draft-04/schema#", "https://json-schema.org/draft/2019-09/schema",
          "http://json-schema.org/draft-06/schema#", "http://example.com/unknown", "", 7, None]
REFS = ["#", "#/$defs/a", "#/$defs/b", "#/definitions/a", "#/$defs/missing", "#/properties/x",
        "#a", "#/$defs/a~1b", "#/%24defs/a", "#/$defs/a/properties/b", "other.json",
        "urn:uuid:deadbeef", "#/items/0", "%", "", "#/$defs/a/", "#//"]
# no real network here: these are refused at once (issue 26 item 1 makes them a SchemaError)
REMOTE_REFS = ["http://127.0.0.1:1/x.json", "file:///nonexistent/structgen-fuzz.json"]
NUMERIC = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"]
COUNTS = ["minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
          "minContains", "maxContains"]
SUBSCHEMA = ["items", "additionalProperties", "not", "if", "then", "else", "contains",
             "propertyNames", "unevaluatedProperties", "unevaluatedItems", "additionalItems"]
SCHEMA_LISTS = ["anyOf", "oneOf", "allOf", "prefixItems"]
SCHEMA_MAPS = ["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"]


def _keyword_value(key: str, sub: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A well-typed value for ``key`` most of the time, any JSON value sometimes."""
    names = st.one_of(st.sampled_from(["a", "b", "x", "a/b"]), odd_text)
    typed: st.SearchStrategy[Any]
    if key == "type":
        typed = st.one_of(st.sampled_from(TYPES), st.lists(st.sampled_from(TYPES), max_size=4))
    elif key in NUMERIC:
        typed = st.one_of(numbers, st.sampled_from(NON_FINITE))
    elif key in COUNTS:
        typed = st.one_of(st.integers(0, 40), st.sampled_from([2**64, -1, 1.5, 10**6]))
    elif key in SUBSCHEMA:
        typed = sub
    elif key in SCHEMA_LISTS:
        typed = st.lists(sub, max_size=4)
    elif key in SCHEMA_MAPS:
        keys = regex_text if key == "patternProperties" else names
        typed = st.dictionaries(keys, sub, max_size=4)
    elif key == "required":
        typed = st.lists(names, max_size=5)
    elif key in ("enum", "examples"):
        typed = st.lists(json_values, max_size=5)
    elif key in ("const", "default"):
        typed = json_values
    elif key == "pattern":
        typed = regex_text
    elif key == "format":
        typed = st.sampled_from(FORMATS)
    elif key == "$ref":
        typed = st.sampled_from(REFS)
    elif key == "$schema":
        typed = st.sampled_from(DRAFTS)
    elif key == "uniqueItems":
        typed = st.booleans()
    elif key == "dependentRequired":
        typed = st.dictionaries(names, st.lists(names, max_size=3), max_size=3)
    else:
        typed = json_values
    return st.one_of(typed, typed, typed, json_values)


KEYWORDS = (["type"] * 4 + NUMERIC + COUNTS + SUBSCHEMA + SCHEMA_LISTS + SCHEMA_MAPS
            + ["required", "enum", "const", "pattern", "format", "$ref", "uniqueItems", "$schema",
               "dependentRequired", "$id", "$anchor", "$dynamicRef", "contentEncoding", "title",
               "default", "examples", "x-unknown", "$comment", "nullable", "$recursiveRef"])


def schemas(max_leaves: int = 10) -> st.SearchStrategy[Any]:
    """Schema-shaped JSON: objects of (mostly) real keywords whose values are (mostly) well
    typed, nested through the subschema keywords; booleans as schemas too."""
    def extend(sub: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        values = {k: _keyword_value(k, sub) for k in set(KEYWORDS)}  # built once, not per draw

        @st.composite
        def node(draw: st.DrawFn) -> dict[str, Any]:
            keys = draw(st.lists(st.sampled_from(KEYWORDS), min_size=1, max_size=5))
            return {k: draw(values[k]) for k in keys}

        return node()

    leaf = st.one_of(st.booleans(), st.just({}), st.sampled_from(TYPES).map(lambda t: {"type": t}))
    return st.recursive(leaf, extend, max_leaves=max_leaves)


@st.composite
def deep_schemas(draw: st.DrawFn) -> Any:
    """One keyword chain nested 1..400 levels (depth limits and recursion)."""
    depth = draw(st.sampled_from([1, 5, 50, 127, 129, 200, 400]))
    via = draw(st.sampled_from(["properties", "items", "anyOf", "not", "allOf", "$defs"]))
    schema: Any = draw(st.sampled_from([{"type": "integer"}, True, {}]))
    for _ in range(depth):
        if via == "properties":
            schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
        elif via in ("anyOf", "allOf"):
            schema = {via: [schema]}
        elif via == "$defs":
            schema = {"$defs": {"d": schema}, "$ref": "#/$defs/d"}
        else:
            schema = {via: schema}
    return schema


@st.composite
def wide_schemas(draw: st.DrawFn) -> Any:
    """Many properties / required names / enum values / anyOf branches."""
    shape = draw(st.sampled_from(["required", "enum", "anyOf", "properties"]))
    # 1500 only where it is the point (issue 26 item 3); elsewhere wide is slow, not interesting
    n = draw(st.sampled_from([10, 100, 300, 1500] if shape == "required" else [10, 60, 200]))
    names = [f"p{i}" for i in range(n)]
    if shape == "required":
        return {"type": "object", "properties": {k: {"type": "integer"} for k in names},
                "required": names}
    if shape == "enum":
        return {"enum": names + [i for i in range(n)]}
    if shape == "anyOf":
        return {"anyOf": [{"const": k} for k in names]}
    return {"type": "object", "properties": {k: {"type": "string", "maxLength": 3} for k in names}}


@st.composite
def self_referencing_schemas(draw: st.DrawFn) -> Any:
    """$ref cycles through $defs (with and without progress), $ref to the root, dangling ones."""
    body = draw(st.sampled_from([
        {"$ref": "#/$defs/b"},
        {"type": "array", "items": {"$ref": "#/$defs/a"}},
        {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/a"}]},
        {"type": "object", "properties": {"next": {"$ref": "#/$defs/a"}}, "required": ["next"]},
        {"allOf": [{"$ref": "#/$defs/a"}]},
        {"not": {"$ref": "#/$defs/a"}},
        {"$ref": "#"},
    ]))
    other = draw(st.sampled_from([{"$ref": "#/$defs/a"}, {"type": "integer"}, {"$ref": "#/$defs/b"}]))
    root = draw(st.sampled_from(["#/$defs/a", "#/$defs/b", "#"]))
    schema = {"$defs": {"a": body, "b": other}, "$ref": root}
    if draw(st.booleans()):
        schema["$schema"] = draw(st.sampled_from(DRAFTS))
    if draw(st.integers(0, 9)) == 0:  # rare: a remote reference (refused, never fetched)
        schema["$defs"]["c"] = {"$ref": draw(st.sampled_from(REMOTE_REFS))}
        schema["$ref"] = "#/$defs/c"
    return schema


instances = st.one_of(json_values, st.just({"a": 1}), st.just([1, "a", None]))
# built once: building these strategies costs far more than drawing from them
_SCHEMA_SHAPES = st.one_of(schemas(), schemas(), schemas(), deep_schemas(), wide_schemas(),
                           self_referencing_schemas())


@st.composite
def schema_cases(draw: st.DrawFn) -> Case:
    schema = draw(_SCHEMA_SHAPES)
    instance = draw(instances)
    sample = json.dumps(instance, allow_nan=True)
    return Case("schema", {"schema": schema, "instance": instance,
                           "samples": [sample, sample[: len(sample) // 2]]}, "schema")


# schema JSON text: numbers JSON's grammar allows but floats cannot hold, odd escapes, duplicates
SCHEMA_TEXT_PIECES = ['{"type":"number","minimum":1e400}', '{"type":"integer","maximum":-1e400}',
                      '{"multipleOf":1e-400}', '{"const":12345678901234567890123456789}',
                      '{"enum":[-0.0,0]}', '{"type":"string","maxLength":1e2}', '{"minimum":NaN}',
                      '{"maximum":Infinity}', '{"a":1,"a":2}', '{"pattern":"\\ud800"}',
                      '{"const":"\\u0000"}', '{"type":"string"', '[', '"', '{}garbage', '\ufeff{}',
                      '{"type":"integer","multipleOf":1e-320}', '{"minLength":18446744073709551616}',
                      '{"properties":{"\\ud83d":{}}}', "{'type':'string'}", '{"type":"object",}']


@st.composite
def schema_text_cases(draw: st.DrawFn) -> Case:
    text = draw(st.one_of(st.sampled_from(SCHEMA_TEXT_PIECES),
                          st.lists(st.sampled_from(SCHEMA_TEXT_PIECES), min_size=2, max_size=3)
                          .map(lambda parts: '{"anyOf":[' + ",".join(parts) + "]}")))
    return Case("schema", {"schema": text, "validate": False, "samples": ["0", '"a"', "1e400"]},
                "schema-text")


# --------------------------------------------------------------------------------- Lark grammars

TERMINAL_EXPRS = ['"a"', '"b"', '"\\n"', '"\\""', '""', '/[a-z]+/', '/\\d+/', "/a|/", '/(a|b)*a(a|b){10}/',
                  '"a".."z"', '"\u00e9"', '/[^\\x00]/', "NUMBER", "WORD", "WS", "X"]
DIRECTIVES = ["%ignore WS", "%ignore \" \"", "%import common.WS", "%import common (NUMBER, WORD)",
              "%import common.NUMBER -> X", "%declare X", "%ignore", "%import", "%import nope.X",
              "%override start: \"o\"", "%extend start: \"e\""]


@st.composite
def lark_expr(draw: st.DrawFn, rules: list[str], depth: int = 0) -> str:
    atom = st.one_of(st.sampled_from(TERMINAL_EXPRS), st.sampled_from(rules),
                     st.sampled_from(TERMINAL_EXPRS), st.just("undefined_rule"))
    if depth >= 3:
        return draw(atom)
    choice = draw(st.integers(0, 7))
    if choice <= 2:
        return draw(atom)
    inner = draw(lark_expr(rules, depth + 1))
    if choice == 3:
        return f"{inner} {draw(lark_expr(rules, depth + 1))}"
    if choice == 4:
        return f"({inner} | {draw(lark_expr(rules, depth + 1))})"
    if choice == 5:
        return f"({inner}){draw(st.sampled_from(['*', '+', '?']))}"
    if choice == 6:
        reps = draw(st.sampled_from(["~3", "~2..5", "~0", "~5..2", "~1000", "~100000", "~1..65536"]))
        return f"({inner}){reps}"
    return f"[{inner}]"


@st.composite
def lark_grammars(draw: st.DrawFn) -> str:
    names = ["start"] + [f"r{i}" for i in range(draw(st.integers(0, 3)))]
    lines = []
    for name in names:
        alts = draw(st.lists(lark_expr(names), min_size=1, max_size=3))
        lines.append(f"{name}: " + " | ".join(alts))
    if draw(st.booleans()):
        lines.append(f"X: {draw(st.sampled_from(TERMINAL_EXPRS[:10]))}")
    lines += draw(st.lists(st.sampled_from(DIRECTIVES), max_size=2))
    if draw(st.integers(0, 5)) == 0:
        lines.append('start: start "a" | "b"')  # left recursion (and a duplicate rule)
    return "\n".join(draw(st.permutations(lines)))


MUTATION_CHARS = ["(", ")", "[", "]", "{", "}", '"', "/", "|", ":", "\n", "%", "~", "\\", "\x00",
                  "\u00e9", "->", "..", "*", "?", "#", " "]


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[str]) -> str:
    """``base`` text with a few single-character edits (insert, delete, duplicate a line)."""
    text = draw(base)
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.integers(0, 2))
        pos = draw(st.integers(0, len(text)))
        if op == 0:
            text = text[:pos] + draw(st.sampled_from(MUTATION_CHARS)) + text[pos:]
        elif op == 1 and text:
            text = text[:pos] + text[pos + 1:]
        else:
            lines = text.splitlines()
            if lines:
                i = draw(st.integers(0, len(lines) - 1))
                lines.insert(i, lines[i])
            text = "\n".join(lines)
    return text


_LARK_TEXTS = st.one_of(lark_grammars(), mutated(lark_grammars()))


@st.composite
def lark_cases(draw: st.DrawFn) -> Case:
    text = draw(_LARK_TEXTS)
    start = draw(st.sampled_from(["start", "start", "r0", "missing", ""]))
    return Case("lark", {"text": text, "start": start, "samples": draw(samples)}, "lark")


# --------------------------------------------------------------------------------- YAML configs

CONFIG_KEYS = {
    "speculative_decoding": ["draft_num", "max_draft_tokens", "min_draft_tokens", "temperature",
                             "top_p", "verify_threshold", "batch_size", "grammar_drafts",
                             "prompt_lookup", "ngram_max", "ngram_min", "draft_model", "adaptive",
                             "min_acceptance", "warmup_proposals", "backend", "overlap_masks"],
    "generation": ["max_new_tokens", "on_budget", "seed", "model", "speculative", "start"],
    "json_schema": ["whitespace", "max_whitespace", "property_order", "formats", "lenient",
                    "max_string_length", "max_depth", "max_enum"],
    "compile": ["max_states", "timeout_s", "max_rules"],
    "monitoring": ["min_acceptance"],
}
YAML_SCALARS = [".nan", ".NaN", ".inf", "-.inf", "1e400", "-1e400", "1e-3", "0x10", "0o17", "1_000",
                "1180591620717411303424", "-9223372036854775809", "~", "null", "yes", "no", "on",
                "true", "'text'", '"2"', "0", "-1", "2.5", "1e9", "[1, 2]", "{a: 1}", "''", "12:30",
                "2001-12-14", "!!binary aGVsbG8=", "!!timestamp 2001-12-14", "!!float nan",
                "!!int 0b101", "!!str 3", "*undefined", "&x 3", "compact", "flexible", "\u00e9\u202e",
                "!!python/object/apply:builtins.exit [77]", "!!python/name:os.system",
                "!!python/object/apply:time.sleep [100]", "!custom 1", "|\n    block", ">-\n    folded"]
BILLION_LAUGHS = ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                  "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                  "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
                  "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\nh: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]\n"
                  "speculative_decoding:\n  draft_num: *h\n")
LAUGH_IN_SECTION = BILLION_LAUGHS.replace("speculative_decoding:\n  draft_num: *h\n",
                                          "generation:\n  model: *h\n")


@st.composite
def config_texts(draw: st.DrawFn) -> str:
    lines = []
    sections = draw(st.lists(st.sampled_from([*CONFIG_KEYS, "unknown_section", "Generation"]),
                             max_size=3))
    for section in sections:
        lines.append(f"{section}:")
        for key in draw(st.lists(st.sampled_from(CONFIG_KEYS.get(section, ["x"]) + ["nope"]),
                                 max_size=4)):
            value = draw(st.one_of(st.sampled_from(YAML_SCALARS), st.integers(-(2**80), 2**80).map(str)))
            lines.append(f"  {key}: {value}")
    return "\n".join(lines) + "\n"


def _config_texts() -> st.SearchStrategy[str]:
    from structgen.settings import example

    return st.one_of(config_texts(), config_texts(), mutated(st.just(example())),
                     st.sampled_from([BILLION_LAUGHS, LAUGH_IN_SECTION, "- a\n- b\n", "\t x: 1",
                                      "generation: !!python/object/apply:builtins.exit [77]\n",
                                      "!!python/object/apply:builtins.exit [77]\n", "%YAML 9.9\n---\n",
                                      "a: b: c\n", "---\n...\n---\n", "{" * 200 + "}" * 200,
                                      "[" * 5000 + "]" * 5000, "\x00", "\ufeffgeneration: {}\n"]))


_CONFIG_TEXTS = _config_texts()


@st.composite
def config_cases(draw: st.DrawFn) -> Case:
    return Case("config", {"text": draw(_CONFIG_TEXTS)}, "config")


# --------------------------------------------------------------------------------- CLI argv

CLI_FILES: dict[str, Any] = {
    "s.json": json.dumps({"type": "object", "properties": {"a": {"type": "integer"}},
                          "required": ["a"]}),
    "deep.json": '{"items":' * 150 + "{}" + "}" * 150,
    "bad.json": '{"type": "object",',
    "nul.json": '{"type": "str\x00ing"}',
    "notutf8.json": {"b64": "//79"},
    "i.jsonl": '{"a": 1}\n{"a": "x"}\nnot json\n\n[1,2]\n',
    "g.lark": 'start: "a" B\nB: /[0-9]+/\n',
    "bad.lark": 'start: ("a"\n',
    "c.yaml": "generation:\n  max_new_tokens: 8\n",
    "nan.yaml": "compile:\n  timeout_s: .nan\n",
    "bad.yaml": "generation: [\n",
    "p.jsonl": '{"prompt": "hi"}\n{"messages": [{"role": "user", "content": "x"}]}\n',
    "badp.jsonl": '{"prompt": ""}\n7\n',
    "sp.jsonl": '{"prompt": "hi", "schema": "s.json"}\n{"prompt": "x", "schema": "missing.json"}\n',
    "empty": "",
    "dir/inner.json": "{}",
}
PATHS = [*CLI_FILES, "missing.json", "dir", ".", "-", "", "dir/", "../nope", "\u00e9.json", "out.jsonl"]
VALUES = ["0", "-1", "2.5", "abc", "nan", "inf", "-inf", "1e309", "99999999999999999999", "70000",
          "", "--", "-", "'", "\u00e9", "1"]
FLAGS = {
    "validate": ["--schema", "-s", "--json", "--quiet", "-q", "--no-grammar"],
    "compile": ["--explain", "--lenient", "--json", "--validation"],
    "config": ["--example", "--check"],
    "models": ["list", "path", "--json", "gpt2", "no-such-alias", "llama3"],
    "generate": ["--schema", "--grammar", "--regex", "--pydantic", "--prompt", "--prompts", "--config",
                 "--out", "-o", "--values-out", "--max-new-tokens", "--temperature", "--seed",
                 "--batch-size", "--start", "--no-speculative", "--metrics-out", "--metrics-port",
                 "--dtype"],
    "bench": ["--no-such-flag", "--tasks-per-type", "--repeats", "--device", "--dtype"],
}
PYDANTIC_SPECS = ["nope_module:X", "json:loads", "structgen:__version__", ":", "x",
                  "structgen.errors:SchemaError"]


@st.composite
def cli_cases(draw: st.DrawFn) -> Case:
    command = draw(st.sampled_from(["validate", "validate", "compile", "compile", "config", "models",
                                    "generate", "generate", "generate", "bench", "nope", "--version"]))
    argv = [command]
    if command == "bench":  # a valid bench command line runs the benchmark suite
        argv.append("--no-such-flag")
    if command == "compile":
        argv.append(draw(st.sampled_from(PATHS)))
    for _ in range(draw(st.integers(0, 6))):
        # mostly real flags (so that parsing succeeds and the checks behind it run)
        pick = draw(st.integers(0, 19))
        if pick < 15:
            token = draw(st.sampled_from(FLAGS.get(command, ["--x"])))
        elif pick < 18:
            token = draw(st.sampled_from(PATHS))
        else:
            token = draw(st.sampled_from([*VALUES, "--help", "--no-such", "-"]))
        argv.append(token)
        if token in ("--schema", "-s", "--grammar", "--prompts", "--config", "--out", "-o",
                     "--values-out", "--metrics-out", "--check"):
            argv.append(draw(st.sampled_from(PATHS)))
        elif token == "--pydantic":
            argv.append(draw(st.sampled_from(PYDANTIC_SPECS)))
        elif token in ("--regex", "--prompt", "--start"):
            argv.append(draw(st.one_of(regex_text, st.sampled_from(VALUES))))
        elif token.startswith("--") and token not in ("--json", "--quiet", "--no-grammar", "--explain",
                                                        "--lenient", "--example", "--help",
                                                        "--no-speculative", "--no-such"):
            argv.append(draw(st.sampled_from(VALUES)))
    if command == "generate":
        # never a real model: no download, no multi-second load (the default model is cached)
        argv += ["--model", draw(st.sampled_from(["./no-such-model", "dir", "."]))]
    return Case("cli", {"argv": argv, "files": CLI_FILES,
                        "stdin": draw(st.sampled_from(["", '{"a": 1}\n', "\x00\xff", '{"prompt": "p"}\n']))},
                "cli " + command)
