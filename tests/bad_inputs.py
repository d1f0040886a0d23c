"""Bad-input battery: hand-written and generated bad inputs against the API and the CLI.

    python -m tests.bad_inputs            # full battery (a few minutes; builds a tiny model)
    python -m tests.bad_inputs --smoke    # a quick subset (no model), for CI
    python -m tests.bad_inputs --out FILE.json --no-table

(from the repository root).
Every input runs in a resource-limited worker (``tests/sandbox.py``, shared with the fuzz
suite) inside its own temporary folder, and each outcome is classified: a typed error or a
result (expected), or one of the failures the hardening issue (26) counts -- a crash (a
non-typed exception or traceback), a hang, a memory overrun, data loss (a file that existed
before the run changed, when the run failed; an input file changed at all), network access (a
counting HTTP server on 127.0.0.1, and one that accepts and never answers) and file access (a
canary file's secret appearing in the output, or its access time moving). ``wrong`` counts
cases that ran without a crash but not as they should (a result where a typed error is due, or
an error without the location it must name).

Writes ``benchmarks/results/bad-inputs.json`` (the shared envelope of ``benchmarks/common/envelope.py``,
the table and every case) and prints the table as markdown: categories as rows, outcome classes as columns.
Cases reproducing issue 26's items carry ``issue_item``.
Side effects: temporary folders (removed), a temporary asset cache, two local sockets.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import os
import random
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import envelope as envelope_lib
from tests.sandbox import Case, Outcome, Sandbox, known_cause

ROOT = Path(__file__).resolve().parent.parent
CATEGORIES = ("schema", "grammar", "regex", "config", "cli", "generation", "asset")
COLUMNS = ("inputs", "ok", "typed", "crash", "hang", "memory", "data_loss", "network", "file_access",
           "wrong")
SECRET = "CANARY-7f3a9c-SECRET"


@dataclass
class BadInput:
    """One battery input. ``files`` are created in the case folder first; ``inputs`` name those
    that must be unchanged whatever happens; ``expect`` is ``typed`` (a typed error is due),
    ``ok`` (a result is due) or ``any``; a typed error must contain ``message_has``."""

    category: str
    case: Case
    expect: str = "typed"
    issue_item: int | None = None
    files: dict[str, str | bytes] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    message_has: str | None = None
    post: Callable[[Path, Outcome], str | None] | None = None  # extra check: a data-loss reason
    needs_model: bool = False  # the tiny model folder (built once)
    needs_torch: bool = False  # runs in the worker sized for torch
    needs_assets: bool = False


# ---------------------------------------------------------------------------------------------
# worker-side helpers (run in the sandbox through Case("call", ...))
# ---------------------------------------------------------------------------------------------

def call(func: str, **kwargs: Any) -> dict[str, Any]:
    return {"func": f"tests.bad_inputs:{func}", "kwargs": kwargs}


def w_validate_instance(schema: Any, instance: Any) -> dict[str, Any]:
    """SchemaValidator (jsonschema + grammar) on one instance."""
    from structgen.validation import Document, SchemaValidator

    v = SchemaValidator(schema)
    res = v.validate(Document(1, instance), "<battery>")
    return {"valid": res.valid, "notes": v.notes}


def w_nested(kind: str, depth: int) -> dict[str, Any]:
    """A schema nested ``depth`` levels built here (too big to send), compiled or validated."""
    schema: Any = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    if kind == "compile":
        from structgen.json_schema import compile_json_schema

        compile_json_schema(schema)
    else:
        from structgen.validation import Document, SchemaValidator

        SchemaValidator(schema, use_grammar=False).validate(Document(1, {"a": 1}), "<battery>")
    return {}


def w_accepts_pattern(pattern: str, length: int) -> dict[str, Any]:
    """Compile a string schema with ``pattern`` and match a ``length``-byte instance."""
    from structgen.json_schema import compile_json_schema

    g = compile_json_schema({"type": "string", "pattern": pattern})
    rng = random.Random(0)
    text = "".join(rng.choice("ab") for _ in range(length))
    return {"accepts": g.accepts(json.dumps(text))}


def w_resolve_grammar(**kw: Any) -> dict[str, Any]:
    from structgen.generation.api import resolve_grammar

    g, _ = resolve_grammar(**kw)
    return {"states": getattr(g, "num_states", None)}


def w_make_tiny_model(folder: str) -> dict[str, Any]:
    """Save the tests' tiny random Llama over the cached GPT-2 tokenizer into ``folder``."""
    from structgen.assets.store import load_tokenizer
    from tests._tiny_lm import save_tiny_model

    save_tiny_model(Path(folder), load_tokenizer("gpt2"))
    return {}


def w_generate(model: str, **kw: Any) -> dict[str, Any]:
    import structgen

    out = structgen.generate(model, **kw)
    results = out if isinstance(out, list) else [out]
    return {"texts": [r.text[:200] for r in results]}


def w_matcher(action: str) -> dict[str, Any]:
    """Matcher misuse (issue 26 item 11) on a 4-token vocabulary."""
    import numpy as np

    from structgen import Matcher, Vocabulary, allocate_bitmask
    from structgen.frontends.regex import compile_regex_grammar

    vocab = Vocabulary([b"a", b"b", b"ab", None], eos_token_ids=[3])
    g = compile_regex_grammar("(ab)+")
    if action == "max_rollback":
        m = Matcher(g, vocab, max_rollback=-1)
        m.accept_token(0)
        m.rollback(1)
        return {}
    m = Matcher(g, vocab)
    if action == "int16":
        m.fill_bitmask(np.zeros((1, 1), dtype=np.int16))
    elif action == "uint8":
        m.fill_bitmask(np.zeros((1, 1), dtype=np.uint8))
    elif action == "row-1":
        m.fill_bitmask(allocate_bitmask(2, 4), row=-1)
    elif action == "wide":  # a wider buffer is allowed; its columns past the vocabulary are zeroed
        need = (vocab.vocab_size + 31) // 32
        buf = np.full((1, need + 2), -1, dtype=np.int32)
        m.fill_bitmask(buf)
        if (buf[0, need:] != 0).any():
            raise RuntimeError("columns past the vocabulary left stale")
    elif action == "token-out-of-range":
        m.accept_token(10**6)
    elif action == "negative-token":
        m.accept_token(-5)
    elif action == "rollback-too-far":
        m.rollback(10)
    return {}


def w_load_tokenizer(alias: str) -> dict[str, Any]:
    from structgen.assets.store import load_tokenizer, tokenizer_path

    tokenizer_path(alias)  # fetches nothing: a damaged entry must be reported
    tok = load_tokenizer(alias)
    return {"encode_hello": list(tok.encode("hello world"))}


# ---------------------------------------------------------------------------------------------
# the inputs
# ---------------------------------------------------------------------------------------------

def cli(argv: list[str], stdin: str = "") -> dict[str, Any]:
    return {"argv": argv, "stdin": stdin}


def schema_inputs() -> list[BadInput]:
    out: list[BadInput] = []

    def add(schema: Any, label: str, expect: str = "typed", item: int | None = None,
            instance: Any = None, validate: bool = True) -> None:
        payload = {"schema": schema, "validate": validate}
        if instance is not None:
            payload["instance"] = instance
        out.append(BadInput("schema", Case("schema", payload, label), expect, item))

    add({"type": "integer", "minimum": 10, "maximum": 1}, "contradictory bounds")
    add({"type": "strin"}, "unknown type name")
    add({"type": 7}, "type not a string")
    add({"properties": []}, "properties is a list")
    add({"required": "a"}, "required is a string")
    add({"maxLength": -1}, "negative maxLength")
    add({"maxLength": 1.5}, "fractional maxLength")
    add({"minimum": float("nan")}, "NaN minimum")
    add({"maximum": float("inf")}, "infinite maximum")
    add({"multipleOf": 0}, "multipleOf 0")
    add({"multipleOf": 1e-320}, "subnormal multipleOf", "any")
    add({"type": "integer", "minimum": 2**200, "maximum": 2**200 + 5}, "2**200 bounds", "ok")
    add({"enum": []}, "empty enum")
    add({"$ref": "#/$defs/missing"}, "dangling $ref")
    add({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}, "$ref cycle without progress")
    add({"$ref": "#"}, "root self reference")
    add({"$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"},
        "recursive array", "ok")
    add({"pattern": "a(b"}, "unbalanced pattern")
    add({"type": "string", "pattern": "^(a)\\1$"}, "backreference")
    add({"type": "string", "pattern": "\\p{Nonsense}"}, "unknown unicode class")
    add({"type": "string", "format": "no-such-format"}, "unknown format", "any")
    add({"$schema": 7}, "$schema not a string")
    add({"$schema": "http://example.com/nope"}, "unknown $schema", "any")
    add({"type": "string", "const": "\ud800"}, "lone surrogate const", "any")
    add({"type": "string", "enum": ["\x00", "\u202e", "e\u0301", "\ufdd0"]}, "odd unicode enum", "ok")
    add({"properties": {"\ud83d": {}}}, "lone surrogate property name", "any")
    add("not json {", "schema text not JSON")
    add('{"type":"number","minimum":1e400}', "1e400 in schema text", "any", validate=False)
    add('{"const":123456789012345678901234567890}', "huge int const text", "ok", validate=False)
    add({"anyOf": []}, "empty anyOf")
    add({"allOf": [{"type": "string"}, {"type": "integer"}]}, "unsatisfiable allOf", "any")
    # issue 26 item 1: remote / file references (network and file access)
    for where in ("schema-remote", "schema-file"):
        ref = "http://127.0.0.1:{PORT}/x.json" if where == "schema-remote" else "file://{CANARY}"
        add({"$ref": ref}, f"{where} $ref compiled", "typed", 1, validate=False)
        out.append(BadInput("schema", Case("call", call("w_validate_instance", schema={"$ref": ref},
                                                         instance="x"), f"{where} $ref validated"),
                            "typed", 1))
    out.append(BadInput("schema", Case("call", call("w_validate_instance",
                                                    schema={"$ref": "http://127.0.0.1:{HANG_PORT}/x"},
                                                    instance="x"), "$ref to a server that never answers",
                                       timeout_s=15), "typed", 1))
    # issue 26 item 3: recursion
    add({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1500)},
         "required": [f"p{i}" for i in range(1500)]}, "1500 required integer properties", "any", 3,
        validate=False)
    for kind in ("compile", "validate"):
        out.append(BadInput("schema", Case("call", call("w_nested", kind=kind, depth=10_000),
                                           f"10000-deep schema ({kind})"), "typed", 3))
    # issue 26 item 4: lazily built DFA without a memory budget
    out.append(BadInput("schema", Case("call", call("w_accepts_pattern", pattern="^(a|b)*a(a|b){20}$",
                                                    length=300_000), "(a|b)*a(a|b){20} on 300 kB",
                                       timeout_s=60), "any", 4))
    # issue 26 item 9: a path taken for JSON text
    out.append(BadInput("schema", Case("call", call("w_resolve_grammar", schema="tree.schema.json"),
                                       "schema path starting with t"), "ok", 9,
                        files={"tree.schema.json": '{"type": "string"}'}))
    # generated: nesting depth x keyword
    for depth in (50, 127, 129, 300):
        for via in ("properties", "items", "anyOf", "not"):
            schema: Any = {"type": "integer"}
            for _ in range(depth):
                schema = ({"type": "object", "properties": {"a": schema}} if via == "properties"
                          else {via: [schema]} if via == "anyOf" else {via: schema})
            add(schema, f"depth {depth} via {via}", "any")
    rng = random.Random(26)
    keywords = ["minimum", "maxLength", "items", "required", "enum", "pattern", "properties", "type"]
    junk: list[Any] = [None, True, -1, 1.5, "x", [], {}, [1, "a"], {"a": 1}, float("inf"), 2**70]
    for i in range(24):
        schema = {rng.choice(keywords): rng.choice(junk) for _ in range(rng.randint(1, 3))}
        add(schema, f"wrong keyword types #{i}", "any")
    return out


LARK_BASE = 'start: item+\nitem: WORD | NUMBER\n%import common.WORD\n%import common.NUMBER\n%ignore " "\n'


def grammar_inputs() -> list[BadInput]:
    out: list[BadInput] = []

    def add(text: str, label: str, expect: str = "typed", item: int | None = None, **extra: Any) -> None:
        out.append(BadInput("grammar", Case("lark", {"text": text, "samples": ["a", "1 2"]}, label),
                            expect, item, **extra))

    add('start: "a"', "minimal grammar", "ok")
    add("start: (\"a\"", "unbalanced parenthesis")
    add('start: "a" ]', "stray bracket")
    add("start: undefined_rule", "undefined rule")
    add('start: start "a" | "b"', "left recursion", "any")
    add('start: a\na: b\nb: a | "x"', "mutual recursion through unit rules", "any")
    add('start: "a"~1000000', "huge repetition")
    add('start: "a"~5..2', "reversed repetition range")
    add('start: ("a"~1000)~1000', "nested huge repetition", "any")
    add("start: /(/", "bad regex terminal")
    add("start: /a/x/", "bad regex flags")
    add('start: "a"\nstart: "b"', "duplicate rule")
    add("%import common.NOPE\nstart: NOPE", "import unknown terminal")
    add("%import nope.X\nstart: X", "import unknown grammar")
    add("%import ../../etc/passwd\nstart: X", "import a path")
    add('%declare X\nstart: X', "declared terminal without a definition", "any")
    add("%ignore\nstart: \"a\"", "empty ignore", "any")
    add("", "empty grammar")
    add("\x00", "NUL grammar")
    add('start: "\ud800"', "lone surrogate literal", "any")
    add("start: " + "(" * 2000 + '"a"' + ")" * 2000, "2000 nested parentheses")
    add("start: " + " | ".join(f'"{i}"' for i in range(20_000)), "20000 alternatives", "any")
    add("\n".join(f"r{i}: r{i + 1}" for i in range(5000)) + '\nr5000: "a"\nstart: r0', "5000-rule chain",
        "any")
    add('start: x\nx{a}: a\n', "template misuse")
    # issue 26 item 7: %import continued on the next line (backslash), resolved relative to the
    # working folder
    add("start: x\n%import \\\n.sub.inner (x)\n", "%import with a line break", "typed", 7,
        files={"sub/inner.lark": f'x: "{SECRET}"\n'})
    # the grammar file lives elsewhere: a relative import may not reach the working folder
    out.append(BadInput("grammar", Case("cli", cli(["compile", "--explain", "gram/g.lark"]),
                                        "%import bypass via the CLI --explain"), "typed", 7,
                        files={"gram/g.lark": "start: x\n%import \\\n.sub.inner (x)\n",
                               "sub/inner.lark": f'x: "{SECRET}"\n'}))
    rng = random.Random(7)
    chars = list('()[]{}"/|:~%\n\\*?+.') + ["->", "..", "\u00e9"]
    for i in range(40):
        text = LARK_BASE
        for _ in range(rng.randint(1, 4)):
            pos = rng.randint(0, len(text))
            text = text[:pos] + rng.choice(chars) + text[pos + rng.randint(0, 1):]
        add(text, f"mutated grammar #{i}", "any")
    return out


def regex_inputs() -> list[BadInput]:
    out: list[BadInput] = []
    patterns = ["a(b", "a)b", "[a-", "[z-a]", "a{3,2}", "a{99999}", "(?<n>a)\\k<n>", "(a)\\1", "(?=a)b",
                "(?<=a)b", "\\", "\\p{Nope}", "\\uD800", "[^\\x00-\\U0010FFFF]", "(?i)a", "a**", "a{,}",
                "(a|b)*a(a|b){22}", "((a*)*)*b", "(?P<x>a)(?P<x>b)", "\x00", "\ud800", "[[:alpha:]]",
                "a{1000}{1000}", "(" * 500 + ")" * 500, "x" * 100_000]
    for p in patterns:
        out.append(BadInput("regex", Case("regex", {"pattern": p, "samples": ["a", "ab"]},
                                          f"regex {p[:30]!r}"), "any"))
    rng = random.Random(3)
    tokens = ["a", "b", ".", "*", "+", "?", "|", "(", ")", "[", "]", "{2,3}", "{9}", "\\d", "\\w", "^", "$",
              "(?:", "\\b", "-", "\u00e9"]
    for i in range(34):
        p = "".join(rng.choice(tokens) for _ in range(rng.randint(1, 12)))
        out.append(BadInput("regex", Case("regex", {"pattern": p, "samples": ["ab", ""]},
                                          f"random regex #{i}"), "any"))
    return out


def config_inputs() -> list[BadInput]:
    out: list[BadInput] = []

    def add(text: str, label: str, expect: str = "typed", item: int | None = None) -> None:
        out.append(BadInput("config", Case("config", {"text": text}, label), expect, item))

    for key, value in [("compile.timeout_s", ".nan"), ("compile.timeout_s", ".inf"),
                       ("speculative_decoding.temperature", ".nan"),
                       ("speculative_decoding.min_acceptance", ".nan"),
                       ("monitoring.min_acceptance", ".nan"), ("generation.max_new_tokens", "2.5"),
                       ("generation.seed", str(2**70)), ("compile.max_states", str(2**80)),
                       ("speculative_decoding.top_p", ".nan"), ("json_schema.max_depth", str(2**64))]:
        section, name = key.split(".")
        add(f"{section}:\n  {name}: {value}\n", f"{key} = {value}", "typed", 6)
    add("generation: [\n", "broken YAML")
    add("generation:\n\tseed: 1\n", "tab indentation")
    add("nope:\n  x: 1\n", "unknown section")
    add("generation:\n  sede: 1\n", "misspelt key")
    add("generation:\n  seed: 1\n  seed: 2\n", "duplicate key")
    add("generation:\n  seed: 'one'\n", "string for an int")
    add("generation: !!python/object/apply:builtins.exit [77]\n", "python tag (must never run)")
    add("generation:\n  model: !!python/object/apply:os.system ['echo PWNED']\n", "python tag in a value")
    add("generation:\n  model: !!python/name:os.system\n", "python name tag")
    add("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
        "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
        "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\nh: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]\n"
        "generation:\n  model: *h\n", "billion laughs")
    add("[" * 20_000 + "]" * 20_000, "20000 nested lists")
    add("- a\n- b\n", "a list at the top")
    add("\x00", "NUL")
    add("generation:\n  seed: *nope\n", "undefined alias")
    add("%YAML 9.9\n---\ngeneration: {}\n", "future YAML version", "any")
    from structgen.settings import example

    rng = random.Random(6)
    base = example()
    for i in range(24):
        text = base
        for _ in range(rng.randint(1, 3)):
            pos = rng.randint(0, len(text))
            text = text[:pos] + rng.choice([":", "\t", "[", "{", "-", "'", "\n  ", "&a", "*a", "!!"]) + \
                text[pos + rng.randint(0, 2):]
        add(text, f"mutated example #{i}", "any")
    return out


def _jsonl_intact(name: str) -> Callable[[Path, Outcome], str | None]:
    def check(folder: Path, outcome: Outcome) -> str | None:
        path = folder / name
        if not path.exists():
            return None
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            try:
                value = json.loads(line)
            except ValueError:
                return f"{name}:{n} is not JSON (two outputs interleaved?)"
            if not isinstance(value, dict) or "index" not in value:
                return f"{name}:{n} is not a result line (two outputs interleaved?)"
        return None
    return check


def cli_inputs() -> list[BadInput]:
    files = {"s.json": '{"type": "object", "properties": {"a": {"type": "integer"}}}',
             "i.jsonl": '{"a": 1}\n{"a": "x"}\n', "bad.json": '{"type": ', "g.lark": 'start: "a"\n',
             "c.yaml": "generation:\n  seed: 1\n", "p.jsonl": '{"prompt": "hi"}\n',
             "out.jsonl": '{"keep": "me"}\n'}
    vectors: list[tuple[list[str], str, str, int | None]] = [
        (["validate", "--schema", "bad.json", "i.jsonl"], "typed", "bad schema", None),
        (["validate", "--schema", "missing.json", "i.jsonl"], "typed", "missing schema", None),
        (["validate", "--schema", "s.json", "missing.jsonl"], "typed", "missing instance file", None),
        (["validate", "--schema", "s.json", "-", "-"], "typed", "stdin twice", None),
        (["validate", "--schema", "s.json", "."], "typed", "a folder as instances", None),
        (["validate", "--schema", ".", "i.jsonl"], "typed", "a folder as schema", None),
        (["validate"], "typed", "no arguments", None),
        (["compile", "bad.json"], "typed", "compile bad schema", None),
        (["compile", "missing.lark"], "typed", "compile missing grammar", None),
        (["compile", "."], "typed", "compile a folder", None),
        (["config", "--check", "missing.yaml"], "typed", "config missing file", None),
        (["config", "--check", "."], "typed", "config a folder", None),
        (["models", "path", "no-such-alias"], "typed", "unknown alias", None),
        (["models", "frobnicate"], "typed", "unknown action", None),
        (["nope"], "typed", "unknown command", None),
        ([], "typed", "no command", None),
        (["bench", "--no-such-flag"], "typed", "bench bad flag", None),
        (["bench", "--repeats", "x"], "typed", "bench bad value", None),
        (["generate", "--prompt", "x", "--model", "./none"], "typed", "no constraint", None),
        (["generate", "--regex", "(", "--prompt", "x", "--model", "./none"], "typed", "bad regex", None),
        (["generate", "--schema", "s.json", "--prompt", "", "--model", "./none"], "typed", "empty prompt",
         None),
        (["generate", "--schema", "s.json", "--prompts", "missing.jsonl", "--model", "./none"], "typed",
         "missing prompts", None),
        (["generate", "--schema", "s.json", "--prompt", "x", "--model", "./none", "--max-new-tokens", "2.5"],
         "typed", "fractional max tokens", None),
        (["generate", "--schema", "s.json", "--prompt", "x", "--model", "./none", "--temperature", "nan"],
         "typed", "NaN temperature", 6),
        (["generate", "--schema", "s.json", "--prompt", "x", "--model", "./none", "--seed", str(2**70)],
         "typed", "seed 2**70", 6),
        (["generate", "--schema", "s.json", "--prompt", "x", "--model", "./none", "--config", "missing.yaml"],
         "typed", "missing config", None),
        (["generate", "--pydantic", "nope_module:X", "--prompt", "x", "--model", "./none"], "typed",
         "pydantic module missing", None),
        (["generate", "--pydantic", "json:loads", "--prompt", "x", "--model", "./none"], "typed",
         "pydantic not a model", None),
        (["generate", "--grammar", "g.lark", "--start", "nope", "--prompt", "x", "--model", "./none"],
         "typed", "unknown start rule", None),
        (["generate", "--schema", "s.json", "--prompt", "x", "--model", "./none", "-o", "out.jsonl"],
         "typed", "unknown model with -o (existing file kept)", 2),
        (["generate", "--schema", "s.json", "--prompt", "x", "--model", "./none", "--metrics-out", "m.txt"],
         "typed", "metrics-out bad suffix", None),
    ]
    out = [BadInput("cli", Case("cli", cli(argv), label), expect, item, files=dict(files))
           for argv, expect, label, item in vectors]
    out.append(BadInput("cli", Case("cli", cli(["validate", "--schema", "s.json", "-"], stdin="\x00\xff{"),
                                    "binary stdin"), "any", files=dict(files)))
    # issue 26 item 1 through the CLI: network, file access, hang
    for label, ref, item in [("validate remote $ref", "http://127.0.0.1:{PORT}/x.json", 1),
                             ("validate file $ref (canary)", "file://{CANARY}", 1),
                             ("validate $ref to a silent server", "http://127.0.0.1:{HANG_PORT}/x", 1)]:
        out.append(BadInput("cli", Case("cli", cli(["validate", "--schema", "r.json", "i.json"]), label,
                                        timeout_s=15), "typed", item,
                            files={"r.json": json.dumps({"$ref": ref}), "i.json": '"x"'}))
    out.append(BadInput("cli", Case("cli", cli(["generate", "--schema", "r.json", "--prompt", "x", "--model",
                                                "./none"]), "generate remote $ref"), "typed", 1,
                        files={"r.json": json.dumps({"$ref": "http://127.0.0.1:{PORT}/y.json"})}))
    # issue 26 item 3 through the CLI: a schema nested 120 levels
    nested: Any = {"type": "integer"}
    for _ in range(120):
        nested = {"type": "object", "properties": {"a": nested}}
    out.append(BadInput("cli", Case("cli", cli(["validate", "--schema", "n.json", "i.json"]),
                                    "validate 120-level schema"), "typed", 3,
                        files={"n.json": json.dumps(nested), "i.json": '{"a": {"a": 1}}'}))
    # issue 26 item 4 through the CLI: a 1 MB instance under an exploding pattern
    out.append(BadInput("cli", Case("cli", cli(["validate", "--schema", "p.json", "i.json"]),
                                    "validate 1 MB instance, exploding pattern", timeout_s=60), "ok", 4,
                        files={"p.json": json.dumps({"type": "string", "pattern": "^(a|b)*a(a|b){20}$"}),
                               "i.json": json.dumps("".join(random.Random(1).choice("ab")
                                                            for _ in range(1_000_000)))}))
    return out


def generation_inputs(model: str) -> list[BadInput]:
    out: list[BadInput] = []
    s = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    base = {"max_new_tokens": 8}

    def api(label: str, expect: str, item: int | None = None, message_has: str | None = None,
            **kw: Any) -> None:
        case = Case("call", call("w_generate", model=model, **{**base, **kw}), label, timeout_s=60)
        out.append(BadInput("generation", case, expect, item, message_has=message_has, needs_model=True))

    api("baseline", "ok", schema=s, prompt="x")
    api("prompt longer than the context", "typed", 5, schema=s, prompt="word " * 3000)
    api("prompt + max_new_tokens past the context", "typed", 5, schema=s, prompt="word " * 1000,
        max_new_tokens=200)
    api("batch with a bad schema in the middle", "typed", 8, message_has="request 1",
        schema=[s, {"type": "nope"}, s], prompt=["a", "b", "c"])
    api("NaN temperature", "typed", 6, schema=s, prompt="x", temperature=float("nan"))
    api("fractional max_new_tokens", "typed", 6, schema=s, prompt="x", max_new_tokens=2.5)
    api("max_new_tokens below the shortest output", "typed", None, message_has="max_new_tokens", schema=s,
        prompt="x", max_new_tokens=2)
    api("unknown on_budget", "typed", None, schema=s, prompt="x", on_budget="stretch")
    api("seed 2**70", "typed", 6, schema=s, prompt="x", seed=2**70)
    api("negative top_p", "typed", None, schema=s, prompt="x", top_p=-1.0)
    api("no constraint", "typed", None, prompt="x")
    api("empty prompt list", "typed", None, schema=s, prompt=[])
    api("prompt not a string", "typed", None, schema=s, prompt=7)
    api("messages without content", "typed", None, schema=s, messages=[{"role": "user"}])
    for action, item in [("int16", 11), ("uint8", 11), ("row-1", 11), ("wide", 11), ("max_rollback", 11),
                         ("token-out-of-range", None), ("negative-token", None), ("rollback-too-far", None)]:
        out.append(BadInput("generation", Case("call", call("w_matcher", action=action), f"Matcher {action}"),
                            "ok" if action == "wide" else "typed", item, needs_torch=True))
    files = {"s.json": json.dumps(s), "out.jsonl": '{"keep": "me"}\n', "p.jsonl": '{"prompt": "hi"}\n'}
    g = ["generate", "--schema", "s.json", "--max-new-tokens", "4"]
    out.append(BadInput("generation", Case("cli", cli([*g, "--prompt", "x", "--model", "badmodel", "-o",
                                                      "out.jsonl"]), "model fails to load, -o existing",
                                           timeout_s=60), "typed", 2,
                        files={**files, "badmodel/config.json": "{not json"}, needs_model=True))
    out.append(BadInput("generation", Case("cli", cli([*g, "--prompts", "p.jsonl", "--model", model, "-o",
                                                      "p.jsonl"]), "--prompts X -o X", timeout_s=60),
                        "typed", 2, files=dict(files), inputs=("p.jsonl",), needs_model=True))
    out.append(BadInput("generation", Case("cli", cli([*g, "--prompt", "x", "--model", model, "-o", "o.jsonl",
                                                      "--values-out", "o.jsonl"]), "-o X --values-out X",
                                           timeout_s=60), "typed", 2, files=dict(files),
                        post=_jsonl_intact("o.jsonl"), needs_model=True))
    out.append(BadInput("generation", Case("cli", cli([*g, "--prompt", "x", "--model", model, "-o",
                                                      "out.jsonl", "--metrics-port", "{BUSY_PORT}"]),
                                           "--metrics-port taken, -o existing", timeout_s=60), "typed", 2,
                        files=dict(files), needs_model=True))
    out.append(BadInput("generation", Case("cli", cli([*g, "--prompt", "x", "--model", model,
                                                      "--metrics-port", "70000"]), "--metrics-port 70000",
                                           timeout_s=60), "typed", 6, files=dict(files), needs_model=True))
    return out


def asset_inputs() -> list[BadInput]:
    """Damaged copies of the cached GPT-2 tokenizer in a temporary cache ($STRUCTGEN_CACHE)."""
    out: list[BadInput] = []
    # garbage-manifest first: --smoke runs only the first one, and it loads no tokenizer
    for damage, expect, item in [("garbage-manifest", "typed", None), ("truncate-tokenizer", "typed", 10),
                                 ("swap-ids", "typed", 10), ("empty-tokenizer", "typed", 10),
                                 ("remove-tokenizer", "typed", None),
                                 ("manifest-wrong-version", "typed", None)]:
        out.append(BadInput("asset", Case("call", call("w_load_tokenizer", alias="gpt2"),
                                          f"gpt2 tokenizer: {damage}", timeout_s=60,
                                          env={"STRUCTGEN_CACHE": "{CWD}/cache"}), expect, item,
                            needs_assets=True, files={"damage": damage},
                            needs_torch="manifest" not in damage))
    out.append(BadInput("asset", Case("cli", cli(["models", "--json"]), "models lists a truncated entry",
                                      env={"STRUCTGEN_CACHE": "{CWD}/cache"}), "ok", 10,
                        post=_listed_as_cached_when_damaged, needs_assets=True,
                        files={"damage": "truncate-tokenizer"}))
    out.append(BadInput("asset", Case("cli", cli(["generate", "--schema", "s.json", "--prompt", "x",
                                                  "--model", "m"]), "model folder with truncated weights",
                                      timeout_s=60),
                        "typed", None, files={"s.json": "{}", "m/config.json": '{"model_type": "llama"}',
                                              "m/model.safetensors": b"\x00" * 10}, needs_model=True))
    return out


def _listed_as_cached_when_damaged(folder: Path, outcome: Outcome) -> str | None:
    text = outcome.detail.get("stdout", "")
    for line in text.splitlines():
        row = json.loads(line)
        if row.get("alias") == "gpt2" and row.get("cached"):
            return "wrong: a truncated tokenizer is listed as cached"
    return None


def _damage_cache(folder: Path, damage: str) -> None:
    """Copy the real gpt2 tokenizer entry into ``folder/cache`` and damage it as named."""
    from structgen.assets.store import cache_dir

    src = cache_dir() / "tokenizers" / "gpt2"
    dst = folder / "cache" / "tokenizers" / "gpt2"
    shutil.copytree(src, dst)
    tok = dst / "tokenizer.json"
    if damage == "truncate-tokenizer":
        data = tok.read_bytes()
        tok.write_bytes(data[: len(data) // 2])
    elif damage == "swap-ids":
        data = json.loads(tok.read_text(encoding="utf-8"))
        vocab = data["model"]["vocab"]
        a, b = "hello", "\u0120world"
        vocab[a], vocab[b] = vocab[b], vocab[a]
        tok.write_text(json.dumps(data), encoding="utf-8")
    elif damage == "garbage-manifest":
        (dst / "manifest.json").write_text("{not json")
    elif damage == "empty-tokenizer":
        tok.write_bytes(b"")
    elif damage == "remove-tokenizer":
        tok.unlink()
    elif damage == "manifest-wrong-version":
        man = json.loads((dst / "manifest.json").read_text())
        man["format_version"] = -1
        (dst / "manifest.json").write_text(json.dumps(man))


# ---------------------------------------------------------------------------------------------
# the watchers: a counting HTTP server, a silent server, a busy port, a canary file
# ---------------------------------------------------------------------------------------------

class Watchers:
    """Local listeners and a canary; :meth:`snapshot` / :meth:`changes` tell what a case touched."""

    def __init__(self, base: Path) -> None:
        self.requests = 0
        watchers = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                watchers.requests += 1
                body = json.dumps({"type": "string", "description": "served by the local server"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.silent = socket.socket()
        self.silent.bind(("127.0.0.1", 0))
        self.silent.listen(64)  # connections queue in the kernel; nothing ever answers
        self.busy = socket.socket()
        self.busy.bind(("127.0.0.1", 0))
        self.busy.listen(1)
        self.canary = base / "canary" / "secret.json"
        self.canary.parent.mkdir(parents=True)
        self.canary.write_text(json.dumps({"type": "string", "description": SECRET}))
        self.rearm_canary()

    def placeholders(self, cwd: Path) -> dict[str, str]:
        return {"{PORT}": str(self.http.server_address[1]), "{HANG_PORT}": str(self.silent.getsockname()[1]),
                "{BUSY_PORT}": str(self.busy.getsockname()[1]), "{CANARY}": str(self.canary),
                "{CWD}": str(cwd)}

    def silent_connections(self) -> int:
        """Connections queued on the silent listener since the last call (accepted and dropped)."""
        self.silent.setblocking(False)
        n = 0
        while True:
            try:
                conn, _ = self.silent.accept()
            except BlockingIOError:
                return n
            conn.close()
            n += 1

    def snapshot(self) -> tuple[int, float]:
        return self.requests, self.canary.stat().st_atime

    def rearm_canary(self) -> None:
        """Set the canary's atime below its mtime again, so that relatime records the next read."""
        mtime = self.canary.stat().st_mtime
        os.utime(self.canary, (mtime - 3600, mtime))

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.silent.close()
        self.busy.close()


# ---------------------------------------------------------------------------------------------
# running and classifying
# ---------------------------------------------------------------------------------------------

def _fill(value: Any, table: dict[str, str]) -> Any:
    text = json.dumps(value)
    for k, v in table.items():
        text = text.replace(k, v)
    return json.loads(text)


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file() and "cache" not in p.relative_to(folder).parts}


def run_one(box: Sandbox, bad: BadInput, watchers: Watchers, folder: Path) -> dict[str, Any]:
    """Run one input in ``folder`` and classify it; returns the JSON record of the case."""
    folder.mkdir(parents=True)
    table = watchers.placeholders(folder)
    for name, content in bad.files.items():
        if name == "damage":
            _damage_cache(folder, str(content))
            continue
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content if isinstance(content, bytes) else \
            _fill(content, table).encode("utf-8", "surrogatepass")
        path.write_bytes(data)
    case = Case(bad.case.kind, _fill(bad.case.payload, table), bad.case.label, bad.case.timeout_s,
                str(folder), _fill(bad.case.env, table))
    before_files = _digest(folder)
    watchers.silent_connections()
    watchers.rearm_canary()
    requests, atime = watchers.snapshot()
    outcome = box.run(case)
    after_files = _digest(folder)
    requests_after, atime_after = watchers.snapshot()
    flags: list[str] = []
    cls = {"died": "crash"}.get(outcome.outcome, outcome.outcome)
    flags.append(cls)
    changed = [n for n, h in before_files.items() if after_files.get(n) != h]
    lost = [n for n in changed if n in bad.inputs or cls != "ok"]
    problems: list[str] = []
    if lost:
        problems.append(f"changed or removed: {', '.join(lost)}")
    if bad.post is not None:
        reason = bad.post(folder, outcome)
        if reason and reason.startswith("wrong:"):
            flags.append("wrong")
            problems.append(reason)
        elif reason:
            problems.append(reason)
            lost.append(reason)
    if lost:
        flags.append("data_loss")
    silent = watchers.silent_connections()
    if requests_after > requests or silent:
        flags.append("network")
        problems.append(f"{requests_after - requests} HTTP request(s) to the local server, {silent} "
                        "connection(s) to the silent one")
    text = json.dumps([outcome.message, outcome.detail], ensure_ascii=False)
    if SECRET in text or atime_after != atime:
        flags.append("file_access")
        problems.append("the canary secret appeared in the output" if SECRET in text
                        else "the canary file was read (atime moved)")
    if cls == "ok" and bad.expect == "typed":
        flags.append("wrong")
        problems.append("a result where a typed error is due")
    elif cls == "typed" and bad.expect == "ok":
        flags.append("wrong")
        problems.append("a typed error where a result is due")
    elif cls == "typed" and bad.message_has and bad.message_has not in outcome.message:
        flags.append("wrong")
        problems.append(f"the error does not name {bad.message_has!r}")
    known = known_cause(case, outcome)
    return {"category": bad.category, "label": bad.case.label, "kind": bad.case.kind,
            "issue_item": bad.issue_item, "known_cause": None if known is None else known.item,
            "expect": bad.expect, "outcome": outcome.outcome,
            "flags": flags, "problems": problems, "error": outcome.error,
            "message": outcome.message[:300], "where": outcome.where, "seconds": round(outcome.seconds, 3)}


def table_of(records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    rows = {c: dict.fromkeys(COLUMNS, 0) for c in CATEGORIES}
    for r in records:
        row = rows[r["category"]]
        row["inputs"] += 1
        for f in set(r["flags"]):
            row[f] += 1
    rows["total"] = {k: sum(rows[c][k] for c in CATEGORIES) for k in COLUMNS}
    return rows


def markdown(rows: dict[str, dict[str, int]]) -> str:
    lines = ["| category | " + " | ".join(c.replace("_", " ") for c in COLUMNS) + " |",
             "|---|" + "---:|" * len(COLUMNS)]
    for name, row in rows.items():
        lines.append(f"| {name} | " + " | ".join(str(row[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)


def _smoke(inputs: list[BadInput], per_category: int = 2) -> list[BadInput]:
    """A few fast inputs per category (no model, no issue reproduction that may take long;
    one asset input: each loads a tokenizer)."""
    slow = {3, 4}
    picked: list[BadInput] = []
    for cat in CATEGORIES:
        mine = [b for b in inputs if b.category == cat and not (b.needs_model or b.needs_torch)
                and b.issue_item not in slow]
        picked += mine[:1 if cat == "asset" else per_category]
    return picked


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a quick subset (no model), for CI")
    ap.add_argument("--out", type=Path, default=None,
                    help="results JSON (default benchmarks/results/bad-inputs.json; --smoke: not written)")
    ap.add_argument("--memory-mb", type=int, default=1536, help="address-space limit of the worker")
    ap.add_argument("--model-memory-mb", type=int, default=8192, help="the same, for model cases")
    ap.add_argument("--timeout-s", type=float, default=20.0, help="default per-input time limit")
    ap.add_argument("--only", default=None, help="comma-separated categories")
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)

    inputs = (schema_inputs() + grammar_inputs() + regex_inputs() + config_inputs() + cli_inputs()
              + asset_inputs())
    from structgen.assets.store import cache_dir

    have_assets = (cache_dir() / "tokenizers" / "gpt2" / "manifest.json").is_file()
    records: list[dict[str, Any]] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="structgen-bad-") as tmp:
        base = Path(tmp)
        watchers = Watchers(base)
        model = str(base / "tiny-model")
        if not args.smoke:
            inputs += generation_inputs(model)
        if args.smoke:
            inputs = _smoke(inputs)
        if args.only:
            keep = set(args.only.split(","))
            inputs = [b for b in inputs if b.category in keep]
        runnable = []
        for b in inputs:
            if (b.needs_assets or b.needs_model) and not have_assets:
                skipped.append(f"{b.category}: {b.case.label} (no cached gpt2 tokenizer)")
            else:
                runnable.append(b)
        empty_cache = base / "empty-cache"
        empty_cache.mkdir()
        try:
            # --smoke: small inputs only, so the kernels run as plain Python (no JIT to load)
            light_env = {"STRUCTGEN_CACHE": str(empty_cache)}
            if args.smoke:
                light_env["STRUCTGEN_NATIVE"] = "0"
            with Sandbox(memory_mb=args.memory_mb, timeout_s=args.timeout_s, warm_up=not args.smoke,
                         env=light_env) as light, \
                    Sandbox(memory_mb=args.model_memory_mb, timeout_s=args.timeout_s,
                            imports=("structgen.cli", "torch")) as heavy:
                if any(b.needs_model for b in runnable):
                    made = heavy.run(Case("call", call("w_make_tiny_model", folder=model), "tiny model",
                                          timeout_s=300))
                    if made.outcome != "ok":
                        raise SystemExit(f"cannot build the tiny model: {made.error}: {made.message}")
                for i, bad in enumerate(runnable):
                    box = heavy if bad.needs_model or bad.needs_torch else light
                    rec = run_one(box, bad, watchers, base / f"case-{i:04d}")
                    records.append(rec)
                    bad_flags = [f for f in rec["flags"] if f not in ("ok", "typed")]
                    if bad_flags:
                        print(f"[{rec['category']}] {rec['label']}: {', '.join(bad_flags)} "
                              f"({rec['error']}: {rec['message'][:120]}) {'; '.join(rec['problems'])}",
                              file=sys.stderr)
        finally:
            watchers.close()
    rows = table_of(records)
    report = {
        "mode": "smoke" if args.smoke else "full", "table": rows, "skipped": skipped,
        "issue_items": {str(i): [r["label"] + ": " + ",".join(r["flags"]) for r in records
                                 if r["issue_item"] == i] for i in range(1, 12)},
        "cases": records,
    }
    print(markdown(rows))
    if skipped:
        print(f"skipped {len(skipped)} input(s): " + "; ".join(skipped), file=sys.stderr)
    out = args.out or (None if args.smoke else ROOT / "benchmarks" / "results" / "bad-inputs.json")
    if out is not None:
        envelope_lib.write(out, envelope, report)
        out.with_suffix(".md").write_text(markdown(rows) + "\n", encoding="utf-8")
    failures = sum(rows["total"][k] for k in ("crash", "hang", "memory", "data_loss", "network",
                                               "file_access"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
