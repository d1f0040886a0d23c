"""Run the official JSON-Schema-Test-Suite (draft 2020-12) through structgen's grammars.

Every test instance is serialised with :func:`structgen.json_schema.canonical_json` and
matched against the compiled grammar of its schema. Each instance gets one status:

* ``pass``: a valid instance is accepted, or an invalid one rejected (this includes the
  schemas structgen rejects at compile time as unsatisfiable, which only have invalid
  instances);
* ``unsupported``: the schema raised a typed structgen error (UnsupportedFeatureError,
  SchemaError for remote refs, CompileLimitError, ...), so nothing is generated;
* ``false_negative``: a valid instance is rejected;
* ``false_positive``: an invalid instance is accepted (must never happen);
* ``error``: anything else (an untyped exception; a bug).

Three sections, reported separately: ``required`` (``tests/draft2020-12/*.json`` with
``formats="annotation"``, as the suite specifies), ``format`` (``optional/format/*.json`` with
``formats="enforce"``) and ``ecmascript-regex`` (``optional/ecmascript-regex.json``: ``pattern``
and ``patternProperties`` read as ECMA-262, the default ``regex_dialect``). The suite's
``remotes/`` folder is offered to ``$ref`` as ``http://localhost:1234/...``.

Usage::

    python -m benchmarks.json_schema_suite            # print counts, compare with the ratchet
    python -m benchmarks.json_schema_suite --update   # rewrite the ratchet file
    python -m benchmarks.json_schema_suite --smoke    # a few files of required and format (CI)
    python -m benchmarks.json_schema_suite --section ecmascript-regex   # one section
    python -m benchmarks.json_schema_suite --show false_negative   # list instances by status
    python -m benchmarks.json_schema_suite --out results.json       # counts with the envelope

The ratchet file (``tests/data/json_schema_suite_ratchet.json``) is the tests' oracle and holds
every instance's status; ``--out`` writes a results file instead: per section the counts, the
time and the regressions, with the shared envelope of ``benchmarks/common/envelope.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common import envelope as envelope_lib
from benchmarks.common.checkout import ROOT

SUITE = ROOT / "tests" / "data" / "json-schema-test-suite"
RATCHET = ROOT / "tests" / "data" / "json_schema_suite_ratchet.json"
STATUSES = ("pass", "unsupported", "false_negative", "false_positive", "error")
RANK = {"pass": 0, "unsupported": 1, "false_negative": 2, "error": 3, "false_positive": 4}
SMOKE_FILES = ("type.json", "properties.json", "ref.json", "anyOf.json")
SECTIONS = ("required", "format", "ecmascript-regex")
#: what --smoke runs when no --section is named (the ecmascript-regex file takes the required path)
SMOKE_SECTIONS = ("required", "format")


def load_remotes() -> dict[str, Any]:
    out: dict[str, Any] = {}
    base = SUITE / "remotes"
    for f in sorted(base.rglob("*.json")):
        out["http://localhost:1234/" + f.relative_to(base).as_posix()] = json.loads(f.read_text("utf-8"))
    return out


def suite_files(section: str, smoke: bool = False) -> list[Path]:
    d = SUITE / "tests" / "draft2020-12"
    if section == "required":
        files = sorted(d.glob("*.json"))
    elif section == "ecmascript-regex":
        files = [d / "optional" / "ecmascript-regex.json"]
    else:
        files = sorted((d / "optional" / "format").glob("*.json"))
    if smoke:
        files = [f for f in files if f.name in SMOKE_FILES] if section == "required" else files[:1]
    return files


def run(section: str, smoke: bool = False, verbose: bool = False) -> dict[str, str]:
    """Classify every instance of a section; returns {"file::group::test": status}."""
    from structgen.config import JsonSchemaOptions
    from structgen.errors import SchemaError, StructgenError
    from structgen.grammar.compiler import compile_grammar
    from structgen.json_schema import canonical_json, schema_to_grammar

    remotes = load_remotes()
    opts = JsonSchemaOptions(formats="enforce" if section == "format" else "annotation")
    results: dict[str, str] = {}
    for f in suite_files(section, smoke):
        name = {"required": f.stem, "format": "optional/format/" + f.stem}.get(section, "optional/" + f.stem)
        for group in json.loads(f.read_text("utf-8")):
            cg = None
            unsat = False
            err = None
            t0 = time.perf_counter()
            try:
                cg = compile_grammar(schema_to_grammar(group["schema"], opts, remotes=remotes))
            except SchemaError as e:
                if "unsatisfiable" in str(e):
                    unsat = True
                else:
                    err = ("unsupported", e)
            except StructgenError as e:
                if "accepts no string" in str(e):
                    unsat = True
                else:
                    err = ("unsupported", e)
            except RecursionError as e:
                err = ("error", e)
            except Exception as e:  # noqa: BLE001 - classify, never crash the run
                err = ("error", e)
            dt = time.perf_counter() - t0
            if verbose:
                print(f"{dt:6.2f}s {name} :: {group['description']}"
                      + (f"  [{err[0]}: {type(err[1]).__name__}: {err[1]}]" if err else ""))
            for test in group["tests"]:
                key = f"{name}::{group['description']}::{test['description']}"
                while key in results:
                    key += "#"
                valid = test["valid"]
                if err is not None:
                    status = err[0]
                elif unsat:
                    status = "false_negative" if valid else "pass"
                else:
                    try:
                        text = canonical_json(test["data"], group["schema"], remotes=remotes)
                        ok = cg.accepts(text)  # type: ignore[union-attr]
                    except Exception as e:  # noqa: BLE001
                        if verbose:
                            print(f"    error on {test['description']}: {e!r}")
                        status = "error"
                    else:
                        status = "pass" if ok == valid else ("false_positive" if ok else "false_negative")
                results[key] = status
    return results


def counts(results: dict[str, str]) -> dict[str, int]:
    c = Counter(results.values())
    return {s: c.get(s, 0) for s in STATUSES} | {"total": len(results)}


def load_ratchet() -> dict[str, Any]:
    if not RATCHET.exists():
        return {}
    return json.loads(RATCHET.read_text("utf-8"))


def regressions(section: str, results: dict[str, str], ratchet: dict[str, Any]) -> list[str]:
    """Instances whose status is worse than the ratchet's, plus false positives and errors.

    In the ``required`` and ``ecmascript-regex`` sections every false positive counts. In the
    ``format`` section a false positive already recorded in the ratchet is a known gap of a
    format grammar (reported, not hidden: it stays in the counts); a new one is a regression.
    """
    old = ratchet.get(section, {}).get("results", {})
    out = []
    for key, status in sorted(results.items()):
        known_fp = section == "format" and old.get(key) == "false_positive"
        if status == "error" or (status == "false_positive" and not known_fp):
            out.append(f"{key}: {status}")
        elif key in old and RANK[status] > RANK[old[key]]:
            out.append(f"{key}: {old[key]} -> {status}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--update", action="store_true", help="rewrite the ratchet file")
    ap.add_argument("--smoke", action="store_true", help="only a few files")
    ap.add_argument("--section", choices=(*SECTIONS, "both", "all"), default="all",
                    help="both: required and format; all (the default): every section "
                         "(with --smoke: required and format)")
    ap.add_argument("--show", choices=STATUSES, action="append", default=[],
                    help="list the instances with this status")
    ap.add_argument("-v", "--verbose", action="store_true", help="per-schema timing and errors")
    ap.add_argument("--out", type=Path, default=None, help="write the counts as a results file")
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    figures: dict[str, Any] = {"mode": "smoke" if args.smoke else "full", "sections": {}}
    if args.section == "all":
        sections = SMOKE_SECTIONS if args.smoke else SECTIONS
    else:
        sections = ("required", "format") if args.section == "both" else (args.section,)
    ratchet = load_ratchet()
    new = dict(ratchet)
    bad = False
    for section in sections:
        t0 = time.perf_counter()
        res = run(section, smoke=args.smoke, verbose=args.verbose)
        dt = time.perf_counter() - t0
        c = counts(res)
        print(f"[{section}] " + "  ".join(f"{k}={v}" for k, v in c.items()) + f"  ({dt:.1f} s)")
        old_counts = ratchet.get(section, {}).get("counts")
        if old_counts and not args.smoke:
            print(f"[{section}] ratchet: " + "  ".join(f"{k}={v}" for k, v in old_counts.items()))
        for s in args.show:
            for k, v in sorted(res.items()):
                if v == s:
                    print(f"  {s}: {k}")
        regs = regressions(section, res, ratchet)
        if regs:
            bad = True
            print(f"[{section}] {len(regs)} regressions / false positives:")
            for r in regs[:50]:
                print("  " + r)
        new[section] = {"counts": c, "results": dict(sorted(res.items()))}
        figures["sections"][section] = {"counts": c, "seconds": round(dt, 2), "regressions": regs}
    if args.out is not None:
        envelope_lib.write(args.out, envelope, figures, ensure_ascii=False)
    if args.update and not args.smoke:
        RATCHET.write_text(json.dumps(new, indent=1, sort_keys=True, ensure_ascii=False) + "\n", "utf-8")
        print(f"wrote {RATCHET.relative_to(ROOT)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
