"""The ``structgen`` command line (also ``python -m structgen``).

Subcommands:

* ``validate --schema S.json FILE... | -``: check JSON / JSON Lines instances against a schema
  (jsonschema with formats, plus the compiled grammar). Never imports torch.
* ``compile SCHEMA``: compile a JSON Schema (or a ``.lark`` grammar) and report time, sizes and
  unsupported keywords with their JSON pointers; ``--explain`` prints the IR grammar.
* ``demo``: the main job: compile the example schemas, validate their samples and (once
  ``structgen.generate`` exists) generate with the default model.
* ``generate``, ``bench``, ``models``: not implemented yet (exit 2).

Exit codes: 0 success / all valid, 1 some instance invalid (or a failed check), 2 usage error,
unreadable input or malformed schema (one-line message on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from . import __version__
from .errors import StructgenError

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
    from .errors import SchemaError

    if isinstance(e, SchemaError) and not e.pointer and not e.keyword:
        return e.message
    return str(e)


def _note(prog: str, message: str) -> None:
    print(f"{prog}: note: {message}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# validate
# ---------------------------------------------------------------------------------------------

def _cmd_validate(args: argparse.Namespace) -> int:
    from .validation import SchemaValidator, load_schema, validate_stream

    prog = "structgen validate"
    if args.files.count("-") > 1:
        raise _Usage("stdin ('-') can be given only once")
    try:
        schema = load_schema(args.schema)
    except StructgenError as e:
        raise _Usage(_text(e)) from None
    try:
        validator = SchemaValidator(schema, use_grammar=not args.no_grammar)
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
    if not args.quiet and not args.json:
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
    from .ir import Grammar

    value = getattr(cg, "source", None)
    return value if isinstance(value, Grammar) else None


def _compile_file(path: str, lenient: bool) -> Any:
    """Compile ``path`` (``.lark``: Lark grammar; anything else: JSON Schema)."""
    if path.endswith(".lark"):
        import structgen

        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise _Usage(f"cannot read {path}: {e}") from None
        return structgen.compile_lark(text)
    from .validation import load_schema

    try:
        schema = load_schema(path)
    except StructgenError as e:
        raise _Usage(_text(e)) from None
    from .config import JsonSchemaOptions
    from .json_schema import compile_json_schema

    if lenient:
        return compile_json_schema(schema, options=JsonSchemaOptions(lenient=True))
    return compile_json_schema(schema)


def _cmd_compile(args: argparse.Namespace) -> int:
    from .errors import UnsupportedFeatureError

    prog = "structgen compile"
    t0 = time.perf_counter()
    try:
        cg = _compile_file(args.input, args.lenient)
    except UnsupportedFeatureError as first:
        # List every unsupported keyword: the lenient compile records them all as warnings.
        kw = f" [{first.keyword}]" if first.keyword else ""
        found = [f"{first.pointer or '#'}: {first.message}{kw}"]
        try:
            found = _describe(_compile_file(args.input, True)).get("warnings") or found
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

    from .validation import SchemaValidator, iter_documents, load_schema

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
            schema = load_schema(str(schema_path))
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

    from .validation import Document

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
# entry point
# ---------------------------------------------------------------------------------------------

def _not_yet(args: argparse.Namespace) -> int:
    raise _Usage(f"'{args.command}' is not implemented yet")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="structgen", description="Grammar-constrained generation toolkit.")
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
    v.set_defaults(func=_cmd_validate)

    c = sub.add_parser("compile", help="compile a JSON Schema or .lark grammar and report its size")
    c.add_argument("input", metavar="SCHEMA.json|GRAMMAR.lark")
    c.add_argument("--explain", action="store_true", help="print the IR grammar")
    c.add_argument("--lenient", action="store_true",
                   help="compile unsupported keywords as documented over-approximations (warnings)")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(func=_cmd_compile)

    d = sub.add_parser("demo", help="the main job: compile, validate and generate for schemas/")
    d.add_argument("--schemas", metavar="DIR", help="folder of NAME.schema.json files (default: schemas/)")
    d.add_argument("--no-generate", action="store_true", help="skip generation")
    d.add_argument("--max-new-tokens", type=int, default=256)
    d.add_argument("--model", help="model alias or folder (default: structgen's default model)")
    d.set_defaults(func=_cmd_demo)

    for name, text in (("generate", "generate constrained output (not implemented yet)"),
                       ("bench", "run benchmarks (not implemented yet)"),
                       ("models", "list and fetch models (not implemented yet)")):
        s = sub.add_parser(name, help=text)
        s.add_argument("rest", nargs=argparse.REMAINDER)
        s.set_defaults(func=_not_yet)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
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
