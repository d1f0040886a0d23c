"""``structgen validate``: check JSON / JSON Lines instances against a JSON Schema (jsonschema with
formats, plus the compiled grammar). Never imports torch."""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path
from typing import IO

from structgen.cli._common import EXIT_INVALID, EXIT_OK, EXIT_USAGE, _err, _note, _text, _Usage
from structgen.errors import StructgenError
from structgen.frontends.json_schema.source import read_schema_file, schema_from
from structgen.grammar_cache import cached_grammar
from structgen.json_types import JsonValue
from structgen.validation import SchemaValidator, validate_stream

__all__ = ["PLAIN_KERNELS_MAX_BYTES", "choose_kernels", "run"]

#: When the schema's grammar comes from the disk cache, inputs up to this many bytes (regular
#: files only) are checked with the grammar kernels run as plain Python: loading numba and its
#: compiled kernels costs about half a second of CPU per process even from numba's disk cache,
#: more than plain Python spends on this much JSON.
PLAIN_KERNELS_MAX_BYTES = 256 << 10


def choose_kernels(files: list[str]) -> None:
    """Before anything imports the grammar kernels: run them as plain Python in this process
    (``STRUCTGEN_NATIVE=0``) when every input is a regular file and together they hold at most
    :data:`PLAIN_KERNELS_MAX_BYTES`. Same verdicts either way (the same kernel code runs); only
    start-up time changes. A ``STRUCTGEN_NATIVE`` the user set, stdin, or kernels already loaded
    leave everything as it is. Only for a grammar that needs no compiling (compiling keeps the
    compiled kernels, and with them its time limits), and only when the process is the
    ``structgen`` program: it decides for the whole process."""
    if "STRUCTGEN_NATIVE" in os.environ or "structgen.grammar._jit" in sys.modules:
        return
    total = 0
    for name in files:
        try:
            st = os.stat(name) if name != "-" else None
        except OSError:
            continue  # reported as unreadable later
        if st is None or not stat.S_ISREG(st.st_mode):
            return
        total += st.st_size
    if total <= PLAIN_KERNELS_MAX_BYTES:
        os.environ["STRUCTGEN_NATIVE"] = "0"


def _remotes(specs: list[str]) -> dict[str, JsonValue]:
    """``--remote URI=FILE`` options -> {URI: the parsed FILE}: the only documents a ``$ref``
    outside the schema may reach (read here, once; nothing is fetched)."""
    remotes: dict[str, JsonValue] = {}
    for spec in specs:
        uri, sep, name = spec.partition("=")
        if not sep or not uri or not name:
            raise _Usage(f"--remote wants URI=FILE, not {spec!r}")
        try:
            remotes[uri] = schema_from(Path(name))
        except StructgenError as e:
            raise _Usage(f"--remote {uri}: {_text(e)}") from None
    return remotes


def run(args: argparse.Namespace) -> int:
    """Validate the instance files of ``args`` (see the module docstring)."""
    prog = "structgen validate"
    if args.files.count("-") > 1:
        raise _Usage("stdin ('-') can be given only once")
    try:
        schema = read_schema_file(args.schema)
    except StructgenError as e:
        raise _Usage(_text(e)) from None
    remotes = _remotes(args.remote)
    if getattr(args, "process_wide", False) and not args.no_grammar:
        if cached_grammar(schema, remotes=remotes, for_generation=False) is not None:
            choose_kernels(args.files)
    try:
        validator = SchemaValidator(schema, use_grammar=not args.no_grammar, remotes=remotes,
                                    grammar_cache=True)
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
                    for err in result.errors:
                        where = "" if err.keyword == "json" else f"{err.path}: "
                        out.write(f"{source}:{err.line}: {where}{err.message}\n")
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
