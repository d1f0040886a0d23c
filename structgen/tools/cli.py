"""The ``structgen`` command line (also ``python -m structgen``).

Subcommands:

* ``validate --schema S.json FILE... | -``: check JSON / JSON Lines instances against a schema
  (jsonschema with formats, plus the compiled grammar). Never imports torch.
* ``compile SCHEMA``: compile a JSON Schema (or a ``.lark`` grammar) and report time, sizes and
  unsupported keywords with their JSON pointers; ``--explain`` prints the IR grammar.
* ``demo``: the main job: compile the example schemas, validate their samples and (once
  ``structgen.generate`` exists) generate with the default model.
* ``generate --model M (--schema S.json | --pydantic mod:Class | --grammar G.lark | --regex RE)
  (--prompt TEXT | --prompts FILE.jsonl) [--config spec.yaml] [--out OUT.jsonl]
  [--metrics-out FILE.json|.prom] [--metrics-port PORT]``: constrained (speculative) generation;
  one JSON line per result; exit 1 when any output is invalid or incomplete.
* ``models [list | pull [--force] ALIAS... | path ALIAS | verify [ALIAS...]]``: the model/tokenizer
  aliases and the cache (every converted file is hashed into its manifest and checked on load).
* ``bench ARGS...``: the benchmark suite (:func:`structgen.tools.bench.main`).
* ``config [--example | --check FILE]``: the documented YAML configuration.

Exit codes: 0 success / all valid, 1 some instance invalid (or a failed check), 2 usage error,
unreadable input or malformed schema (one-line message on stderr), 130 interrupted (Ctrl-C).

Files written (``generate --out/--values-out/--metrics-out``) go through
:mod:`structgen.tools._atomic`: an existing file is replaced only when the run succeeded; a failed or
interrupted run keeps what it finished in ``OUT.partial``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from structgen import __version__
from structgen.errors import StructgenError

__all__ = ["main"]

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


class _Usage(Exception):
    """A usage-level failure: printed on stderr (one line unless ``keep_lines``), exit code 2."""

    def __init__(self, message: str, *, keep_lines: bool = False) -> None:
        super().__init__(message)
        self.keep_lines = keep_lines


def _err(prog: str, message: str, keep_lines: bool = False) -> None:
    text = message.rstrip() if keep_lines else " ".join(message.split())
    print(f"{prog}: error: {text}", file=sys.stderr)


def _text(e: Exception) -> str:
    """An error's message, without the empty location a SchemaError adds when it has none."""
    from structgen.errors import SchemaError

    if isinstance(e, SchemaError) and not e.pointer and not e.keyword:
        return e.message
    return str(e)


def _note(prog: str, message: str) -> None:
    print(f"{prog}: note: {message}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# validate
# ---------------------------------------------------------------------------------------------

def _remotes(specs: list[str]) -> dict[str, Any]:
    """``--remote URI=FILE`` options -> {URI: the parsed FILE}: the only documents a ``$ref``
    outside the schema may reach (read here, once; nothing is fetched)."""
    from structgen.frontends.constraint import schema_from

    remotes: dict[str, Any] = {}
    for spec in specs:
        uri, sep, name = spec.partition("=")
        if not sep or not uri or not name:
            raise _Usage(f"--remote wants URI=FILE, not {spec!r}")
        try:
            remotes[uri] = schema_from(Path(name))
        except StructgenError as e:
            raise _Usage(f"--remote {uri}: {_text(e)}") from None
    return remotes


def _cmd_validate(args: argparse.Namespace) -> int:
    from structgen.frontends.json_schema.source import read_schema_file
    from structgen.tools.validation import SchemaValidator, validate_stream

    prog = "structgen validate"
    if args.files.count("-") > 1:
        raise _Usage("stdin ('-') can be given only once")
    try:
        schema = read_schema_file(args.schema)
    except StructgenError as e:
        raise _Usage(_text(e)) from None
    try:
        validator = SchemaValidator(schema, use_grammar=not args.no_grammar,
                                    remotes=_remotes(args.remote))
    except StructgenError as e:
        raise _Usage(f"{args.schema}: {_text(e)}") from None
    if not args.quiet:
        for note in validator.notes:
            _note(prog, note)

    counts = {"valid": 0, "invalid": 0}
    unreadable = 0
    out = sys.stdout
    for name in args.files:
        source = "<stdin>" if name == "-" else name
        if name == "-" and sys.stdin is None:
            raise _Usage("'-' given but there is no standard input")
        try:
            stream: IO[bytes] = sys.stdin.buffer if name == "-" else open(name, "rb")
        except OSError as e:
            _err(prog, f"cannot read {name}: {e.strerror or e}")
            unreadable += 1
            continue
        try:
            for result in validate_stream(validator, stream, source):
                counts["valid" if result.valid else "invalid"] += 1
                if args.quiet:
                    continue
                if args.json:
                    out.write(json.dumps(result.as_dict(), ensure_ascii=False) + "\n")
                else:
                    for e in result.errors:
                        where = "" if e.keyword == "json" else f"{e.path}: "
                        out.write(f"{source}:{e.line}: {where}{e.message}\n")
                    for n in result.notes:
                        _note(prog, f"{source}:{result.line}: {n}")
        except StructgenError as e:  # schema-level problem found while validating ($ref)
            raise _Usage(f"{args.schema}: {_text(e)}") from None
        except OSError as e:
            _err(prog, f"cannot read {name}: {e.strerror or e}")
            unreadable += 1
        finally:
            if name != "-":
                stream.close()
    out.flush()
    total = counts["valid"] + counts["invalid"]
    if not args.quiet and not args.json and not (unreadable and total == 0):  # else: the error line only
        grammar = "jsonschema + compiled grammar" if validator.grammar_available else "jsonschema only"
        print(f"{prog}: {total} instance(s): {counts['valid']} valid, {counts['invalid']} invalid "
              f"({grammar})", file=sys.stderr)
    if unreadable:
        return EXIT_USAGE
    return EXIT_INVALID if counts["invalid"] else EXIT_OK


# ---------------------------------------------------------------------------------------------
# compile
# ---------------------------------------------------------------------------------------------

def _describe(cg: Any) -> dict[str, Any]:
    """Sizes of a compiled grammar: IR rules, rules left after inlining, DFA states, warnings."""
    info: dict[str, Any] = {}
    ir_grammar = _ir_of(cg)
    if ir_grammar is not None:
        info["ir_rules"] = len(ir_grammar.rules)
    rules = getattr(cg, "rules", None)
    if isinstance(rules, (tuple, list)):
        info["compiled_rules"] = len(rules)
    states = getattr(cg, "num_states", None)
    if isinstance(states, int):
        info["states"] = states
    key = getattr(cg, "key", None)
    if isinstance(key, str):
        info["key"] = key[:16]
    metadata = getattr(cg, "metadata", None)
    warnings = (metadata.get("warnings") if isinstance(metadata, dict) else None) \
        or getattr(cg, "warnings", None)
    if warnings:
        info["warnings"] = [str(w) for w in warnings]
    return info


def _ir_of(cg: Any) -> Any:
    """The IR grammar a CompiledGrammar was compiled from, or None."""
    from structgen.grammar.ir import Grammar

    value = getattr(cg, "source", None)
    return value if isinstance(value, Grammar) else None


def _compile_file(path: str, lenient: bool, remotes: dict[str, Any] | None = None) -> Any:
    """Compile ``path`` (``.lark``: Lark grammar, whose relative ``%import`` reads beside it;
    anything else: JSON Schema, whose ``$ref`` may reach ``remotes`` and nothing else outside
    it) into the grammar validation uses (every JSON spelling accepted)."""
    from structgen.config import JsonSchemaOptions
    from structgen.frontends.constraint import compile_constraint, read_grammar_file, schema_from

    if path.endswith(".lark"):
        try:
            text = read_grammar_file(path)
        except StructgenError as e:
            raise _Usage(_text(e)) from None
        return compile_constraint("grammar", text, grammar_path=path)
    try:
        schema = schema_from(Path(path))  # a command-line argument is always a file name
    except StructgenError as e:
        raise _Usage(_text(e)) from None
    return compile_constraint("json", schema, json_options=JsonSchemaOptions(lenient=lenient),
                              remotes=remotes, for_generation=False)


def _cmd_compile(args: argparse.Namespace) -> int:
    from structgen.errors import UnsupportedFeatureError

    prog = "structgen compile"
    remotes = _remotes(args.remote)
    t0 = time.perf_counter()
    try:
        cg = _compile_file(args.input, args.lenient, remotes)
    except UnsupportedFeatureError as first:
        # List every unsupported keyword: the lenient compile records them all as warnings.
        kw = f" [{first.keyword}]" if first.keyword else ""
        found = [f"{first.pointer or '#'}: {first.message}{kw}"]
        try:
            found = _describe(_compile_file(args.input, True, remotes)).get("warnings") or found
        except Exception:  # the strict error above is the answer
            pass
        if args.json:
            print(json.dumps({"input": args.input, "ok": False, "unsupported": found}))
        else:
            for f in found:
                print(f"{args.input}: unsupported: {f}")
            print(f"{prog}: {len(found)} unsupported feature(s); --lenient compiles an "
                  "over-approximation instead", file=sys.stderr)
        return EXIT_INVALID
    except ImportError as e:
        raise _Usage(f"the compiler is not available yet ({e})") from None
    except StructgenError as e:  # keep a grammar error's caret excerpt on its own lines
        raise _Usage(f"{args.input}: {_text(e)}", keep_lines=True) from None
    elapsed = time.perf_counter() - t0
    info = {"input": args.input, "ok": True, "compile_ms": round(elapsed * 1000, 3), **_describe(cg)}
    if args.json:
        print(json.dumps(info, default=str))
    else:
        for key, value in info.items():
            if key == "warnings":
                for w in value:
                    print(f"warning: {w}")
            elif key not in ("input", "ok"):
                print(f"{key}: {value}")
    if args.explain:
        ir_grammar = _ir_of(cg)
        print(repr(ir_grammar) if ir_grammar is not None else
              f"{prog}: --explain: this CompiledGrammar does not expose its IR grammar yet")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------

def _default_schemas_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "schemas"


def _demo_sets(root: Path) -> list[tuple[str, Path, list[Path], list[Path]]]:
    """(name, schema, valid samples, invalid samples) for each example schema in ``root``.

    Two layouts are understood: ``NAME.schema.json`` with samples beside it named
    ``NAME.valid*.json[l]`` / ``NAME.invalid*.json[l]``; or a folder ``NAME/`` holding
    ``schema.json`` and samples named ``valid*.json[l]`` / ``invalid*.json[l]``.
    """
    def samples(folder: Path, prefix: str, kind: str) -> list[Path]:
        return [p for p in sorted(folder.glob(f"{prefix}{kind}*"))
                if p.suffix in (".json", ".jsonl") and p.is_file()]

    sets = []
    for schema in sorted(root.glob("*.schema.json")):
        name = schema.name[: -len(".schema.json")]
        sets.append((name, schema, samples(root, f"{name}.", "valid"), samples(root, f"{name}.", "invalid")))
    for schema in sorted(root.glob("*/schema.json")):
        folder = schema.parent
        sets.append((folder.name, schema, samples(folder, "", "valid"), samples(folder, "", "invalid")))
    return sorted(sets)


def _cmd_demo(args: argparse.Namespace) -> int:
    import structgen
    from structgen.frontends.json_schema.source import read_schema_file
    from structgen.tools.validation import SchemaValidator, iter_documents

    prog = "structgen demo"
    root = Path(args.schemas) if args.schemas else _default_schemas_dir()
    if not root.is_dir():
        raise _Usage(f"no schemas folder at {root} (run from a source checkout or pass --schemas DIR)")
    sets = _demo_sets(root)
    if not sets:
        raise _Usage(f"no example schemas (NAME.schema.json or NAME/schema.json) in {root}")
    failures = 0
    generation = _has_generate(structgen)
    print(f"structgen {__version__}: {len(sets)} example schema(s) in {root}")
    for name, schema_path, valid, invalid in sets:
        try:
            schema = read_schema_file(schema_path)
            t0 = time.perf_counter()
            validator = SchemaValidator(schema)
            ms = (time.perf_counter() - t0) * 1000
        except StructgenError as e:
            print(f"  {name}: FAILED: {e}")
            failures += 1
            continue
        status = f"compiled in {ms:.0f} ms" if validator.grammar_available else "not compiled (see note)"
        line = [f"  {name}: grammar {status}"]
        for expect_valid, files in ((True, valid), (False, invalid)):
            good = total = 0
            for f in files:
                with open(f, "rb") as stream:
                    for doc in iter_documents(stream):
                        total += 1
                        good += validator.validate(doc, str(f)).valid == expect_valid
            if total:
                line.append(f"{'valid' if expect_valid else 'invalid'} samples {good}/{total} as expected")
            failures += total - good
        print("; ".join(line))
        for note in validator.notes:
            print(f"    note: {note}")
        if generation and not args.no_generate:
            failures += _demo_generate(structgen, name, schema, validator, args)
    if not generation:
        print("generation: not available yet (structgen.generate is being built); "
              "the demo compiled and validated only")
    if failures:
        _err(prog, f"{failures} check(s) failed")
        return EXIT_INVALID
    print("demo: all checks passed")
    return EXIT_OK


def _has_generate(structgen: Any) -> bool:
    """Whether the generation API exists yet (its module may still be missing)."""
    try:
        return callable(structgen.generate)
    except (AttributeError, ImportError):
        return False


def _demo_generate(structgen: Any, name: str, schema: Any, validator: Any,
                   args: argparse.Namespace) -> int:
    """Generate one instance for ``schema`` with the default model; 1 on failure, else 0."""
    import os

    from structgen.tools.validation import Document

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    prompt = (f"Write one JSON value for the example '{name}' that matches this JSON Schema:\n"
              + json.dumps(schema))
    kwargs: dict[str, Any] = {"schema": schema, "messages": [{"role": "user", "content": prompt}],
                              "max_new_tokens": args.max_new_tokens, "seed": 0}
    if args.model:
        kwargs["model"] = args.model
    t0 = time.perf_counter()
    try:
        out = structgen.generate(**kwargs)
    except Exception as e:  # report it and count a failed check
        print(f"    generate: FAILED: {type(e).__name__}: {' '.join(str(e).split())}")
        return 1
    seconds = time.perf_counter() - t0
    text = out if isinstance(out, str) else str(getattr(out, "text", out))
    finish = getattr(out, "finish_reason", "?")
    shown = text if len(text) <= 200 else text[:197] + "..."
    if finish == "length":
        print(f"    generated {seconds:.1f} s: stopped at --max-new-tokens before the value was "
              f"complete (not a failure of the grammar): {shown}")
        return 0
    try:
        value = json.loads(text)
    except ValueError as e:
        print(f"    generate: FAILED: output is not JSON ({e}): {shown!r}")
        return 1
    result = validator.validate(Document(1, value), "<generated>")
    verdict = "valid" if result.valid else "INVALID: " + "; ".join(e.message for e in result.errors)
    print(f"    generated in {seconds:.1f} s ({verdict}): {shown}")
    return 0 if result.valid else 1


# ---------------------------------------------------------------------------------------------
# generate
# ---------------------------------------------------------------------------------------------

@dataclass
class _Constraint:
    """One output constraint of `generate`: the compiled grammar and how outputs are checked."""

    kind: str  # "schema" | "pydantic" | "grammar" | "regex"
    compiled: Any
    validator: Any = None  # SchemaValidator (jsonschema + formats) for JSON kinds
    pydantic: Any = None

    @property
    def is_json(self) -> bool:
        return self.kind in ("schema", "pydantic")


@dataclass
class _Request:
    index: int
    prompt: str | None
    messages: list[dict[str, Any]] | None
    constraint: _Constraint
    id: Any = None
    where: str = "--prompt"  # FILE:LINE of the request in --prompts, for error messages


def _grammar_error(path: str, e: StructgenError) -> str:
    from structgen.errors import GrammarError, RegexError

    if isinstance(e, GrammarError):
        where = f"{path}:{e.line}:{e.column}" if e.line is not None and e.column is not None else \
            f"{path}:{e.line}" if e.line is not None else path
        return f"{where}: {e.message}"
    if isinstance(e, RegexError):
        at = f" at offset {e.position}" if e.position is not None else ""
        return f"{path}: {e.message}{at}"
    return f"{path}: {_text(e)}"


def _schema_constraint(schema: Any, source: str, settings: Any, pydantic: Any = None) -> _Constraint:
    """The constraint of a schema value: its generation grammar (from the front door, with the
    settings' options) and a validator for the outputs."""
    from structgen.frontends.constraint import compile_constraint
    from structgen.tools.validation import SchemaValidator

    try:
        validator = SchemaValidator(schema, use_grammar=False)
        compiled = compile_constraint("json", schema, json_options=settings.json_schema,
                                      compile_options=settings.compile)
    except StructgenError as e:
        raise _Usage(f"{source}: {_text(e)}") from None
    return _Constraint("pydantic" if pydantic is not None else "schema", compiled, validator, pydantic)


def _import_pydantic(spec: str) -> Any:
    import importlib
    import os

    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise _Usage(f"--pydantic wants pkg.module:Class, not {spec!r}")
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:  # `structgen` (the console script) does not put the working folder on the path
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's module
        raise _Usage(f"--pydantic {spec}: cannot import {mod_name}: {type(e).__name__}: {e}") from None
    finally:
        if added:
            sys.path.remove(cwd)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise _Usage(f"--pydantic {spec}: {mod_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    from pydantic import BaseModel

    if not (isinstance(obj, type) and issubclass(obj, BaseModel)):
        raise _Usage(f"--pydantic {spec}: {attr} is not a pydantic BaseModel subclass")
    return obj


def _main_constraint(args: argparse.Namespace, settings: Any) -> _Constraint | None:
    """The constraint the command line gives (--schema, --pydantic, --grammar or --regex; None
    when the prompts file names one per line), compiled by the front door. File arguments go in
    as paths, never as text."""
    from structgen.frontends.constraint import compile_constraint, read_grammar_file, schema_from

    if args.schema:
        try:
            schema = schema_from(Path(args.schema))
        except StructgenError as e:
            raise _Usage(_text(e)) from None
        return _schema_constraint(schema, args.schema, settings)
    if args.pydantic:
        cls = _import_pydantic(args.pydantic)
        try:
            schema = schema_from(cls)
        except StructgenError as e:  # pydantic cannot describe the class
            raise _Usage(f"--pydantic {args.pydantic}: {_text(e)}") from None
        return _schema_constraint(schema, args.pydantic, settings, pydantic=cls)
    if args.grammar:
        try:
            text = read_grammar_file(args.grammar)
        except StructgenError as e:
            raise _Usage(_text(e)) from None
        start = args.start or settings.generation.start
        try:
            return _Constraint("grammar", compile_constraint("grammar", text, start=start,
                                                             compile_options=settings.compile,
                                                             grammar_path=args.grammar))
        except StructgenError as e:
            raise _Usage(_grammar_error(args.grammar, e)) from None
    if args.regex is not None:
        try:
            return _Constraint("regex", compile_constraint("regex", args.regex))
        except StructgenError as e:
            raise _Usage(_grammar_error("--regex", e)) from None
    return None


def _check_messages(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str) for m in value))


def _read_requests(args: argparse.Namespace, main: _Constraint | None, settings: Any,
                   schema_files: list[str] | None = None) -> list[_Request]:
    """The requests of ``--prompt`` or of the ``--prompts`` JSON Lines file (checked here, before
    any model is loaded: a bad line is a usage error naming FILE:LINE). The schema files the
    prompts file names are appended to ``schema_files``."""
    if args.prompt is not None:
        if main is None:
            raise _Usage("give one of --schema, --pydantic, --grammar or --regex")
        if not args.prompt:
            raise _Usage("--prompt is empty")
        return [_Request(0, args.prompt, None, main)]
    return _read_prompts_file(args.prompts, main, settings, [] if schema_files is None else schema_files)


def _read_prompts_file(name: str, main: _Constraint | None, settings: Any,
                       schema_files: list[str]) -> list[_Request]:
    """The requests of a JSON Lines prompts file; appends the schema files its lines name to
    ``schema_files`` (inputs an output must not overwrite)."""
    try:
        raw = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except OSError as e:
        raise _Usage(f"cannot read {name}: {e.strerror or e}") from None
    base = Path(name).resolve().parent if name != "-" else Path.cwd()
    cache: dict[str, _Constraint] = {}
    requests: list[_Request] = []
    for lineno, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            item = json.loads(line)
        except (ValueError, UnicodeDecodeError) as e:
            raise _Usage(f"{where}: not a JSON object: {e}") from None
        if not isinstance(item, dict):
            raise _Usage(f"{where}: each line must be a JSON object with a \"prompt\" or \"messages\"")
        prompt, messages = item.get("prompt"), item.get("messages")
        if (prompt is None) == (messages is None):
            raise _Usage(f"{where}: give exactly one of \"prompt\" and \"messages\"")
        if prompt is not None and not (isinstance(prompt, str) and prompt):
            raise _Usage(f"{where}: \"prompt\" must be a non-empty string")
        if messages is not None and not _check_messages(messages):
            raise _Usage(f"{where}: \"messages\" must be a non-empty list of "
                         "{\"role\": ..., \"content\": ...} objects")
        constraint = main
        if "schema" in item:
            spec = item["schema"]
            if isinstance(spec, str):  # a schema file, relative to the prompts file
                from structgen.frontends.constraint import schema_from

                path = Path(spec) if Path(spec).is_absolute() else base / spec
                key = "file:" + str(path)
                if key not in cache:
                    schema_files.append(str(path))
                    try:
                        schema = schema_from(path)
                    except StructgenError as e:
                        raise _Usage(f"{where}: {_text(e)}") from None
                    cache[key] = _schema_constraint(schema, f"{where}: {spec}", settings)
            elif isinstance(spec, (dict, bool)):
                key = "inline:" + json.dumps(spec, sort_keys=True)
                if key not in cache:
                    cache[key] = _schema_constraint(spec, f"{where}: schema", settings)
            else:
                raise _Usage(f"{where}: \"schema\" must be a JSON Schema object or a file name")
            constraint = cache[key]
        if constraint is None:
            raise _Usage(f"{where}: no constraint: give --schema, --pydantic, --grammar or --regex, "
                         "or a \"schema\" field on every line")
        requests.append(_Request(len(requests), prompt, messages, constraint, item.get("id"), where))
    if not requests:
        raise _Usage(f"no prompts in {name}")
    return requests


def _check_output(req: _Request, res: Any) -> tuple[bool, Any, list[str]]:
    """(valid, parsed value, errors) of one result, by an oracle other than the grammar where
    there is one: jsonschema (with formats) and pydantic for JSON; the compiled grammar for
    Lark grammars and regexes."""
    if res.finish_reason != "stop":
        return False, None, [f"incomplete: finish_reason={res.finish_reason} (max_new_tokens reached)"]
    c = req.constraint
    if not c.is_json:
        ok = bool(c.compiled.accepts(res.text))
        return ok, None, [] if ok else ["the output is not a sentence of the grammar"]
    from structgen.tools.validation import Document

    try:
        value = json.loads(res.text)
    except ValueError as e:
        return False, None, [f"not JSON: {e}"]
    result = c.validator.validate(Document(1, value), "<output>")
    errors = [f"{e.path}: {e.message}" for e in result.errors]
    if c.pydantic is not None and not errors:
        try:
            c.pydantic.model_validate_json(res.text)
        except Exception as e:  # noqa: BLE001 - pydantic's ValidationError
            errors.append(f"pydantic: {' '.join(str(e).split())}")
    return not errors, value, errors


class _Progress:
    """A one-line progress bar on ``stream``, drawn only when it is a terminal."""

    def __init__(self, total: int, stream: Any, prog: str) -> None:
        self.total = total
        self.stream = stream
        self.prog = prog
        self.enabled = _isatty(stream)
        self.t0 = time.perf_counter()

    def update(self, done: int, tokens: int) -> None:
        if not self.enabled:
            return
        width = 30
        fill = round(width * done / self.total) if self.total else width
        rate = tokens / max(time.perf_counter() - self.t0, 1e-9)
        self.stream.write(f"\r{self.prog}: [{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} "
                          f"requests, {rate:.1f} tokens/s")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def _chunks(requests: list[_Request], size: int) -> list[list[_Request]]:
    """Micro-batches of at most ``size`` consecutive requests of one kind (prompt / messages)."""
    out: list[list[_Request]] = []
    for r in requests:
        if out and len(out[-1]) < size and (out[-1][0].prompt is None) == (r.prompt is None):
            out[-1].append(r)
        else:
            out.append([r])
    return out


def _cmd_generate(args: argparse.Namespace) -> int:
    """Every check that needs no model runs first (options, constraints, prompts, output paths);
    the outputs are written through temporary files renamed into place at the end, so a run that
    fails never destroys an existing file (what was finished is kept as ``OUT.partial``)."""
    import os
    from dataclasses import replace

    from structgen.errors import ConfigError
    from structgen.tools._atomic import AtomicOutput, abort_all, check_distinct

    prog = "structgen generate"
    settings = _load_settings(args.config)
    gen = settings.generation
    cfg = settings.speculative_decoding
    try:
        if args.temperature is not None:
            cfg = replace(cfg, temperature=args.temperature)
        if args.batch_size is not None:
            cfg = replace(cfg, batch_size=args.batch_size)
        if args.max_new_tokens is not None:
            gen = replace(gen, max_new_tokens=args.max_new_tokens)
        if args.seed is not None:
            gen = replace(gen, seed=args.seed)
    except ConfigError as e:
        raise _Usage(f"--{(e.key or '').replace('_', '-')}: {e}") from None
    speculative = gen.speculative and not args.no_speculative
    if args.metrics_out and Path(args.metrics_out).suffix not in (".json", ".prom"):
        raise _Usage(f"--metrics-out {args.metrics_out}: the name must end in .json or .prom")

    main = _main_constraint(args, settings)
    schema_files: list[str] = []
    requests = _read_requests(args, main, settings, schema_files)
    outputs = [("--out", args.out), ("--values-out", args.values_out), ("--metrics-out", args.metrics_out)]
    try:
        check_distinct([("--prompts", args.prompts), ("--schema", args.schema),
                        ("--grammar", args.grammar), ("--config", args.config),
                        *(("a schema of --prompts", f) for f in schema_files)], outputs)
    except ConfigError as e:
        raise _Usage(str(e)) from None

    from structgen.errors import AssetError
    from structgen.generation.assets import resolve_model

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    model_name = args.model or gen.model or _default_model()
    try:
        model_path = resolve_model(model_name)
    except AssetError as e:
        raise _Usage(str(e)) from None

    opened: list[AtomicOutput] = []
    try:
        files: dict[str, AtomicOutput] = {}
        for flag, path in outputs:  # opened now: an unwritable folder fails before any work
            if path:
                try:
                    files[flag] = AtomicOutput(path)
                except OSError as e:
                    raise _Usage(f"{flag}: cannot write {path}: {e.strerror or e}") from None
                opened.append(files[flag])
        from structgen.generation.model import load_model

        if not _isatty(sys.stderr):  # transformers draws its own loading bars otherwise
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        try:
            lm = load_model(str(model_path), dtype=getattr(args, "dtype", "float32"))
        except Exception as e:  # noqa: BLE001 - transformers' many load errors
            raise _Usage(f"cannot load model {model_name}: {type(e).__name__}: {e}") from None
        _check_contexts(lm, requests, gen.max_new_tokens)
        rc = _generate_all(args, prog, lm, requests, cfg, gen.max_new_tokens, gen.seed, speculative,
                           settings, files)
        for o in opened:
            o.commit()
        return rc
    except BaseException:
        for note in abort_all(opened):
            _note(prog, note)
        raise


def _check_contexts(lm: Any, requests: list[_Request], max_new_tokens: int) -> None:
    """Every request's prompt plus ``max_new_tokens`` within the model's context, checked before
    anything is generated (an error names the request's FILE:LINE)."""
    from structgen.errors import StructgenError
    from structgen.generation.api import _prompt_ids
    from structgen.generation.model import check_context

    for req in requests:
        try:
            ids = _prompt_ids(lm, req.prompt, req.messages)
            check_context(lm, len(ids), max_new_tokens)
        except StructgenError as e:
            raise _Usage(f"{req.where}: {_text(e)}") from None


def _isatty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _default_model() -> str:
    from structgen.generation.api import DEFAULT_MODEL

    return DEFAULT_MODEL


def _generate_all(args: argparse.Namespace, prog: str, lm: Any, requests: list[_Request], cfg: Any,
                  max_new_tokens: int, seed: int | None, speculative: bool, settings: Any,
                  files: dict[str, Any]) -> int:
    """Generate every request, writing each micro-batch's result lines as soon as it is done
    to ``files["--out"]`` (an AtomicOutput; stdout without one) and ``files["--values-out"]``,
    and the run metrics to ``files["--metrics-out"]`` at the end (the caller commits them)."""
    import structgen
    from structgen.tools.metrics import Metrics, serve_metrics

    metrics = Metrics(thresholds=settings.monitoring)
    server = None
    if args.metrics_port is not None:
        try:
            server = serve_metrics(metrics, port=args.metrics_port)
        except OSError as e:
            raise _Usage(f"--metrics-port {args.metrics_port}: {e.strerror or e}") from None
        _note(prog, f"metrics at http://127.0.0.1:{server.port}/metrics")
    progress = _Progress(len(requests), sys.stderr, prog)
    failed = done = tokens = 0
    out: Any = files.get("--out", sys.stdout)
    values_out = files.get("--values-out")
    metrics.mark_start()
    try:
        for chunk in _chunks(requests, cfg.batch_size):
            kw: dict[str, Any] = {"grammar": [r.constraint.compiled for r in chunk],
                                  "max_new_tokens": max_new_tokens, "speculative": speculative,
                                  "config": cfg, "seed": None if seed is None else seed + chunk[0].index}
            if chunk[0].prompt is not None:
                kw["prompt"] = [r.prompt for r in chunk]
            else:
                kw["messages"] = [r.messages for r in chunk]
            try:
                results = structgen.generate(lm, **kw)
            except StructgenError as e:
                where = chunk[e.request_index].where if e.request_index is not None else None
                raise _Usage(f"{where}: {_text(e)}" if where else _text(e)) from None
            for req, res in zip(chunk, results):
                valid, value, errors = _check_output(req, res)
                metrics.observe(res, valid=valid)
                failed += not valid
                line: dict[str, Any] = {"index": req.index}
                if req.id is not None:
                    line["id"] = req.id
                line.update({"text": res.text, "value": value, "finish_reason": res.finish_reason,
                             "valid": valid, "errors": errors, "num_tokens": len(res.tokens),
                             "stats": res.stats.as_dict() if hasattr(res.stats, "as_dict") else None})
                out.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
                if values_out is not None:
                    # the output text itself (compact JSON is one line); a cut-short output is
                    # written as is, so that a validator reports it
                    values_out.write(res.text.replace("\n", " ") + "\n")
                tokens += len(res.tokens)
            out.flush()  # a crash keeps the finished micro-batches (in OUT.partial)
            if values_out is not None:
                values_out.flush()
            done += len(chunk)
            progress.update(done, tokens)
    finally:
        progress.close()
        if server is not None:
            server.close()
    d = metrics.as_dict()
    acc = d["draft"]["acceptance"]
    tpp = d["tokens_per_pass"]
    print(f"{prog}: {done} request(s): {d['requests']['valid']} valid, {d['requests']['invalid']} "
          f"invalid, {d['requests']['incomplete']} incomplete; "
          f"{'-' if tpp is None else f'{tpp:.2f}'} tokens/pass, draft acceptance "
          f"{'-' if acc is None else f'{acc:.1%}'}", file=sys.stderr)
    for a in d["alerts"]:
        print(f"{prog}: warning: {a['message']}", file=sys.stderr)
    if "--metrics-out" in files:
        files["--metrics-out"].write(metrics.render(args.metrics_out))
    return EXIT_INVALID if failed else EXIT_OK


def _load_settings(path: str | None) -> Any:
    from structgen.settings import Settings, load_settings

    if not path:
        return Settings()
    try:
        return load_settings(path)
    except StructgenError as e:
        raise _Usage(str(e)) from None


# ---------------------------------------------------------------------------------------------
# models, bench, config
# ---------------------------------------------------------------------------------------------

def _cmd_models(args: argparse.Namespace) -> int:
    from structgen.errors import AssetError
    from structgen.generation import assets

    action = args.action or "list"
    known = set(assets.TOKENIZERS) | set(assets.MODELS)
    if action == "list":
        rows = assets.list_aliases()
        if args.json:
            for r in rows:
                # "cached": usable as it is; a damaged entry is not (its "state" says why)
                print(json.dumps({"alias": r.alias, "kind": r.kind,
                                  "cached": bool(r.cached) and r.extra.get("state") != "damaged",
                                  "state": r.extra.get("state"), "problems": r.extra.get("problems", []),
                                  "path": str(r.path), "download_mb": r.download_mb,
                                  "licence": r.licence, "distribution": r.distribution,
                                  "description": r.description,
                                  **{k: v for k, v in r.extra.items() if k not in ("state", "problems")}},
                                 default=str))
            return EXIT_OK
        print(f"cache: {assets.cache_dir()}")
        for r in rows:
            mark = " (default)" if r.extra.get("default") else ""
            state = {"ok": "cached", "damaged": "damaged"}.get(r.extra.get("state", ""), "not cached")
            licence = r.licence.split(" (")[0]
            print(f"{r.kind:9} {r.alias + mark:24} {state:10} {r.download_mb:8.1f} MB  {licence:26} "
                  f"{r.path if r.cached else '-'}")
            for problem in r.extra.get("problems", []):
                print(f"{'':9} {'':24} damaged: {problem}  (`structgen models pull {r.alias}` rebuilds it)")
        return EXIT_OK
    if action == "verify":
        return _models_verify(args.aliases, known)
    aliases = args.aliases
    if not aliases:
        raise _Usage(f"models {action}: give an alias (see `structgen models`)")
    for a in aliases:
        if a not in known:
            raise _Usage(f"unknown alias {a!r}; known aliases: {', '.join(sorted(known))}")
    status = EXIT_OK
    for a in aliases:
        try:
            if action == "pull":
                t0 = time.perf_counter()
                path = assets.pull(a, force=args.force)
                print(f"{a}: {path} ({time.perf_counter() - t0:.1f} s)")
            else:
                fn = assets.tokenizer_path if a in assets.TOKENIZERS else assets.model_path
                print(fn(a, fetch=False))
        except AssetError as e:
            _err(f"structgen models {action}", str(e))
            status = EXIT_INVALID
    return status


def _models_verify(aliases: list[str], known: set[str]) -> int:
    """``models verify [ALIAS...]``: hash every file of each entry (all cached entries by
    default) against its manifest; one line per entry, exit 1 when any is damaged or missing."""
    from structgen.generation import assets

    for a in aliases:
        if a not in known:
            raise _Usage(f"unknown alias {a!r}; known aliases: {', '.join(sorted(known))}")
    if not aliases:
        aliases = assets.cached_aliases()
        if not aliases:
            print(f"structgen models verify: nothing cached in {assets.cache_dir()}", file=sys.stderr)
            return EXIT_OK
    status = EXIT_OK
    for a in aliases:
        problems = assets.verify(a)
        if problems is None:
            print(f"{a}: not cached")
            status = EXIT_INVALID
        elif problems:
            for problem in problems:
                print(f"{a}: damaged: {problem}")
            status = EXIT_INVALID
        else:
            print(f"{a}: ok")
    if status != EXIT_OK:
        print("structgen models verify: `structgen models pull ALIAS` rebuilds a damaged entry",
              file=sys.stderr)
    return status


def _cmd_bench(argv: Sequence[str]) -> int:
    try:
        from structgen.tools import bench
    except ModuleNotFoundError as e:
        if e.name in ("structgen.tools.bench", f"{__package__}.bench"):
            _err("structgen bench", "the benchmark suite (structgen.tools.bench) is not available in this "
                 "installation")
            return EXIT_USAGE
        raise
    return int(bench.main(list(argv)))


def _cmd_config(args: argparse.Namespace) -> int:
    from structgen.settings import dump, example

    if args.check:
        settings = _load_settings(args.check)
        sys.stdout.write(dump(settings, comments=False))
        return EXIT_OK
    sys.stdout.write(example())
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 2), like every other usage error here."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())} "
                              f"(see `{self.prog} --help`)\n")


def _port(text: str) -> int:
    """argparse type: a TCP port number, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: give a number from 0 to 65535") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {value}: give a number from 0 to 65535")
    return value


def _positive_int(text: str) -> int:
    """argparse type: an integer from 1 to structgen.config.MAX_COUNT."""
    from structgen.config import positive_int_arg

    return positive_int_arg(text)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="structgen", description="Grammar-constrained generation toolkit.")
    p.add_argument("--version", action="version", version=f"structgen {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    v = sub.add_parser("validate", help="validate JSON / JSON Lines instances against a JSON Schema",
                       description="Validate instances with jsonschema (formats checked) and the "
                       "compiled grammar. A file that parses as one JSON document is one instance; "
                       "otherwise each non-blank line is one (JSON Lines). '-' reads stdin. "
                       "Exit: 0 all valid, 1 some invalid, 2 usage error / unreadable file / "
                       "malformed schema.")
    v.add_argument("--schema", "-s", required=True, metavar="S.json", help="the JSON Schema")
    v.add_argument("files", nargs="+", metavar="FILE", help="instance files; '-' for stdin")
    v.add_argument("--json", action="store_true", help="one JSON object per instance on stdout")
    v.add_argument("--quiet", "-q", action="store_true", help="print nothing; exit code only")
    v.add_argument("--no-grammar", action="store_true",
                   help="skip the compiled-grammar check (jsonschema only)")
    v.add_argument("--remote", action="append", default=[], metavar="URI=FILE",
                   help="let $ref use FILE as the document at URI (repeatable); no other reference "
                   "outside the schema is ever fetched or read")
    v.set_defaults(func=_cmd_validate)

    c = sub.add_parser("compile", help="compile a JSON Schema or .lark grammar and report its size")
    c.add_argument("input", metavar="SCHEMA.json|GRAMMAR.lark")
    c.add_argument("--explain", action="store_true", help="print the IR grammar")
    c.add_argument("--lenient", action="store_true",
                   help="compile unsupported keywords as documented over-approximations (warnings)")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.add_argument("--remote", action="append", default=[], metavar="URI=FILE",
                   help="let $ref use FILE as the document at URI (repeatable)")
    c.set_defaults(func=_cmd_compile)

    d = sub.add_parser("demo", help="the main job: compile, validate and generate for schemas/")
    d.add_argument("--schemas", metavar="DIR", help="folder of NAME.schema.json files (default: schemas/)")
    d.add_argument("--no-generate", action="store_true", help="skip generation")
    d.add_argument("--max-new-tokens", type=_positive_int, default=256)
    d.add_argument("--model", help="model alias or folder (default: structgen's default model)")
    d.set_defaults(func=_cmd_demo)

    g = sub.add_parser(
        "generate", help="generate constrained output (JSON Lines, one result per line)",
        description="Generate output that matches a JSON Schema, a Pydantic model, a Lark grammar or "
        "a regex, with speculative decoding. One JSON line per result (text, value, finish_reason, "
        "valid, errors, stats) on stdout or --out; a summary and alerts on stderr; a progress bar on "
        "stderr when it is a terminal. Exit: 0 all outputs valid, 1 some output invalid or "
        "incomplete, 2 usage error (missing file, bad schema, bad configuration key, unknown model).")
    g.add_argument("--model", "-m", metavar="M",
                   help="model alias (see `structgen models`) or Hugging Face folder "
                   "(default: generation.model of --config, else smollm2-135m)")
    g.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "auto"),
                   help="weights of a model loaded by alias or folder (auto: bfloat16 where the "
                   "hardware computes it natively). In bfloat16 on the CPU the forward is made "
                   "row-invariant, so speculative output still equals plain decoding bit for bit")
    what = g.add_mutually_exclusive_group()
    what.add_argument("--schema", "-s", metavar="S.json", help="JSON Schema file")
    what.add_argument("--pydantic", metavar="pkg.module:Class", help="a Pydantic model class")
    what.add_argument("--grammar", "-g", metavar="G.lark", help="Lark grammar file")
    what.add_argument("--regex", metavar="PATTERN", help="a regular expression")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", "-p", metavar="TEXT", help="one prompt")
    src.add_argument("--prompts", metavar="FILE.jsonl",
                     help="JSON Lines: {\"prompt\": ...} or {\"messages\": [...]}, optionally "
                     "\"schema\" (an object, or a file relative to FILE) and \"id\"; '-' for stdin")
    g.add_argument("--config", "-c", metavar="spec.yaml", help="YAML configuration "
                   "(see `structgen config --example`)")
    g.add_argument("--out", "-o", metavar="OUT.jsonl", help="write the result lines here (default stdout)")
    g.add_argument("--values-out", metavar="VALUES.jsonl",
                   help="also write each output alone, one per line (JSON Lines for JSON schemas: "
                   "feed it to `structgen validate`)")
    g.add_argument("--max-new-tokens", type=int, metavar="N")
    g.add_argument("--temperature", type=float, metavar="T", help="0 = greedy")
    g.add_argument("--seed", type=int, metavar="S", help="request i uses seed S + i")
    g.add_argument("--batch-size", type=int, metavar="B", help="requests per micro-batch")
    g.add_argument("--start", metavar="RULE", help="start rule of the Lark grammar")
    g.add_argument("--no-speculative", action="store_true",
                   help="plain grammar-constrained decoding (the baseline)")
    g.add_argument("--metrics-out", metavar="FILE", help="write the run metrics: .json or .prom "
                   "(Prometheus text format)")
    g.add_argument("--metrics-port", type=_port, metavar="PORT",
                   help="serve /metrics (Prometheus) and /metrics.json on 127.0.0.1:PORT while running "
                   "(0: a free port, printed on stderr)")
    g.set_defaults(func=_cmd_generate)

    m = sub.add_parser("models", help="list model and tokenizer aliases; fetch one; show where it is",
                       description="`structgen models` lists the aliases and whether they are cached "
                       "(or damaged); `models pull ALIAS...` fetches into the cache and rebuilds a damaged "
                       "entry; `models path ALIAS` prints the cached folder; `models verify [ALIAS...]` "
                       "hashes every cached file against its manifest. Exit: 0 ok, 1 fetch failed / not "
                       "cached / damaged, 2 unknown alias.")
    m.add_argument("action", nargs="?", choices=("list", "pull", "path", "verify"), help="default: list")
    m.add_argument("aliases", nargs="*", metavar="ALIAS")
    m.add_argument("--json", action="store_true", help="list: one JSON object per alias")
    m.add_argument("--force", action="store_true", help="pull: convert again even when cached and intact")
    m.set_defaults(func=_cmd_models)

    b = sub.add_parser("bench", help="run the benchmark suite (arguments go to structgen.tools.bench)")
    b.add_argument("rest", nargs=argparse.REMAINDER)

    k = sub.add_parser("config", help="print the documented default YAML configuration, or check a file",
                       description="Without options: print the documented default configuration. "
                       "--check FILE: load FILE (exit 2 with FILE:LINE on a bad key or value) and print "
                       "the effective settings.")
    k.add_argument("--example", action="store_true", help="print the documented defaults (the default)")
    k.add_argument("--check", metavar="FILE", help="validate a configuration file")
    k.set_defaults(func=_cmd_config)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        return _cmd_bench(argv[1:])  # every further argument belongs to the benchmark suite
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help/--version (0) or a usage error (2)
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    try:
        return int(args.func(args))
    except _Usage as e:
        _err(f"structgen {args.command}", str(e), e.keep_lines)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `structgen validate ... | head`: stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_INVALID


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
