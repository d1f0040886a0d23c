"""``structgen demo``: compile the example schemas, validate their samples and generate one
instance for each with the default model."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from types import ModuleType

import structgen
from structgen import __version__
from structgen.cli._common import EXIT_INVALID, EXIT_OK, _err, _Usage
from structgen.errors import StructgenError
from structgen.frontends.json_schema.source import read_schema_file
from structgen.json_types import JsonValue
from structgen.validation import Document, SchemaValidator, iter_documents

__all__ = ["run"]


def _default_schemas_dir() -> Path:
    """``schemas/`` of the source checkout this module runs from (structgen/cli/ -> root)."""
    return Path(__file__).resolve().parents[2] / "schemas"


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


def run(args: argparse.Namespace) -> int:
    """Compile, validate and generate for each example schema (see the module docstring)."""
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


def _has_generate(structgen: ModuleType) -> bool:
    """Whether the generation API exists yet (its module may still be missing)."""
    try:
        return callable(structgen.generate)
    except (AttributeError, ImportError):
        return False


def _demo_generate(structgen: ModuleType, name: str, schema: JsonValue, validator: SchemaValidator,
                   args: argparse.Namespace) -> int:
    """Generate one instance for ``schema`` with the default model; 1 on failure, else 0."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    prompt = (f"Write one JSON value for the example '{name}' that matches this JSON Schema:\n"
              + json.dumps(schema))
    kwargs: dict[str, object] = {"schema": schema, "messages": [{"role": "user", "content": prompt}],
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
    stats = getattr(out, "stats", None)
    rates = (f"{stats.tokens_per_second:.1f} tokens/s, {stats.tokens_per_pass:.2f} tokens per target pass"
             if stats is not None else "no statistics")
    shown = text if len(text) <= 200 else text[:197] + "..."
    if finish == "length":  # only with on_budget="cut": the default closes within the budget
        print(f"    generate: FAILED: incomplete, stopped at --max-new-tokens ({seconds:.1f} s, {rates}): "
              f"{shown}")
        return 1
    try:
        value = json.loads(text)
    except ValueError as e:
        print(f"    generate: FAILED: output is not JSON ({e}): {shown!r}")
        return 1
    result = validator.validate(Document(1, value), "<generated>")
    verdict = "valid" if result.valid else "INVALID: " + "; ".join(e.message for e in result.errors)
    closed = ", closed within the token budget" if finish == "budget_close" else ""
    print(f"    generated in {seconds:.1f} s ({verdict}{closed}; {rates}): {shown}")
    return 0 if result.valid else 1
