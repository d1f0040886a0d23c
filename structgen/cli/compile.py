"""``structgen compile``: compile a JSON Schema (or a ``.lark`` grammar) and report time, sizes and
unsupported keywords with their JSON pointers; ``--explain`` prints the IR grammar."""

from __future__ import annotations

import argparse
import json
import sys
import time

from structgen.cli._common import EXIT_INVALID, EXIT_OK, _text, _Usage
from structgen.cli._constraints import _compile_file
from structgen.cli.validate import _remotes
from structgen.errors import StructgenError, UnsupportedFeatureError
from structgen.grammar.compiled import CompiledGrammar
from structgen.grammar.ir import Grammar
from structgen.json_types import JsonObject

__all__ = ["run"]


def _describe(cg: CompiledGrammar) -> JsonObject:
    """Sizes of a compiled grammar: IR rules, rules left after inlining, DFA states, warnings."""
    info: JsonObject = {}
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


def _ir_of(cg: CompiledGrammar) -> Grammar | None:
    """The IR grammar a CompiledGrammar was compiled from, or None."""
    value = getattr(cg, "source", None)
    return value if isinstance(value, Grammar) else None


def run(args: argparse.Namespace) -> int:
    """Compile ``args.input`` and report on it (see the module docstring)."""
    prog = "structgen compile"
    remotes = _remotes(args.remote)
    t0 = time.perf_counter()
    try:
        cg = _compile_file(args.input, args.lenient, remotes, for_generation=not args.validation)
    except UnsupportedFeatureError as first:
        # List every unsupported keyword: the lenient compile records them all as warnings.
        kw = f" [{first.keyword}]" if first.keyword else ""
        found = [f"{first.pointer or '#'}: {first.message}{kw}"]
        try:
            warnings = _describe(_compile_file(args.input, True, remotes,
                                               for_generation=not args.validation)).get("warnings")
            if isinstance(warnings, list) and warnings:
                found = [str(w) for w in warnings]
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
            if key == "warnings" and isinstance(value, list):
                for w in value:
                    print(f"warning: {w}")
            elif key not in ("input", "ok"):
                print(f"{key}: {value}")
    if args.explain:
        ir_grammar = _ir_of(cg)
        print(repr(ir_grammar) if ir_grammar is not None else
              f"{prog}: --explain: this CompiledGrammar does not expose its IR grammar yet")
    return EXIT_OK
