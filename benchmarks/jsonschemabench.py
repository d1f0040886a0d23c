"""JSONSchemaBench: compile rate, soundness of random mask walks, and false rejections.

For every schema of the benchmark (``--data``, default ``../shared/data/jsonschemabench``):

1. compile it (typed error or success; the error class and keyword are recorded);
2. soundness: ``--walks`` random walks through the token masks with the Llama-3 vocabulary;
   each walk takes random allowed tokens for a random number of steps, then finishes along a
   shortest completion (tokenized greedily with allowed tokens) so it ends in an accepting
   state; every produced document must validate with ``jsonschema`` (formats checked);
3. completeness: valid instances (``hypothesis-jsonschema`` with a fixed seed, plus the schema's
   own ``examples``), serialised with ``canonical_json`` and tokenized with the Llama-3 and
   Qwen2 tokenizers, must be accepted token by token (zero false rejections). Instances that
   ``jsonschema`` itself rejects are skipped.

Writes a JSON report (``--out``, with the shared envelope of ``benchmarks/common/envelope.py``) and
prints a table per subset. ``--smoke`` (CI) runs three of the repository's ``schemas/`` (no data
set needed), one walk and one instance each, with the Llama-3 tokenizer only. Example::

    python -m benchmarks.jsonschemabench --limit 200 --out benchmarks/results/jsonschemabench.json

``--escape-variants``: instead of walks and tokenized instances, every valid instance (and
mutations of it that ``jsonschema`` rejects) is written in escape variants (every string
character as ``\\uXXXX`` in lower case, in upper case, ``/`` as ``\\/``, astral characters as
surrogate pairs) and checked with ``CompiledGrammar.accepts``: valid ones must all be
accepted, invalid ones all rejected (a valid instance whose plain spelling is already
rejected is counted as ``valid_canonical_rejected``, apart from the escape figures)::

    python -m benchmarks.jsonschemabench --escape-variants --limit 40 --instances 8 \
        --out benchmarks/results/jsonschemabench-escapes.json

The whole set in shards (run them anywhere, in any order), then the combined table::

    python -m benchmarks.jsonschemabench --shard 0/8 --out jsb-0.json   # ... --shard 7/8
    python -m benchmarks.jsonschemabench --merge jsb-*.json --out jsonschemabench-full.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import signal
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
import jsonschema

from benchmarks.common import envelope as envelope_lib
from benchmarks.common.checkout import ROOT
from structgen.config import CompileOptions
from structgen.errors import StructgenError
from structgen.validation import jsonschema_validator


def default_data() -> Path:
    """``/work/shared/data/jsonschemabench`` if present, else ``../shared/...`` of the repo."""
    for p in (Path("/work/shared/data/jsonschemabench"),
              ROOT.parent / "shared" / "data" / "jsonschemabench"):
        if p.is_dir():
            return p
    return ROOT.parent / "shared" / "data" / "jsonschemabench"


def repo_schemas() -> list[dict[str, Any]]:
    """The repository's example schemas (``schemas/NAME.schema.json``) with their valid samples
    (``NAME.valid.json``, as ``instances``), in the rows format of :func:`load_schemas`."""
    rows = []
    for f in sorted((ROOT / "schemas").glob("*.schema.json")):
        name = f.name[: -len(".schema.json")]
        valid = f.with_name(f"{name}.valid.json")
        row: dict[str, Any] = {"id": name, "subset": "repo", "schema": json.loads(f.read_text())}
        if valid.exists():
            row["instances"] = [json.loads(valid.read_text())]
        rows.append(row)
    return rows


class _Timeout(Exception):
    pass


def _alarm(_sig: int, _frm: Any) -> None:
    raise _Timeout()


def load_schemas(data: Path, subsets: list[str] | None, limit: int | None,
                 seed: int) -> list[dict[str, Any]]:
    """A fixed sample: per subset file, shuffled with ``seed``, the first ``limit`` rows."""
    rows: list[dict[str, Any]] = []
    for f in sorted(data.glob("*.jsonl")):
        if subsets and f.stem not in subsets:
            continue
        sub = [json.loads(line) for line in f.open(encoding="utf-8") if line.strip()]
        if limit is not None:
            random.Random(seed).shuffle(sub)
            sub = sub[:limit]
        for r in sub:
            r["subset"] = r.get("subset") or f.stem
        rows.extend(sub)
    return rows


def keyword_of(exc: BaseException) -> str:
    kw = getattr(exc, "keyword", None)
    return f"{type(exc).__name__}:{kw}" if kw else type(exc).__name__


CLOSING = (b'}]"0,:nulltrfase123456789.-abcdefghijklmopqvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_/ '
           b'{[+!#$%&*=?@^`|~()<>;\\')
MAX_GREEDY_BYTES = 4000


def _in_string(data: bytes | bytearray) -> bool:
    """Does JSON text ``data`` end inside a string literal?"""
    inside = esc = False
    for b in data:
        if esc:
            esc = False
        elif inside and b == 0x5C:
            esc = True
        elif b == 0x22:
            inside = not inside
    return inside
_SHORT_TOKENS: dict[int, dict[bytes, int]] = {}


def _short_tokens(vocab: Any) -> dict[bytes, int]:
    """bytes -> the first token id spelling them (tokens of at most 8 bytes), per vocabulary."""
    got = _SHORT_TOKENS.get(id(vocab))
    if got is None:
        got = {}
        for tid, b in enumerate(vocab.token_bytes):
            if b and len(b) <= 8 and b not in got:
                got[b] = tid
        _SHORT_TOKENS[id(vocab)] = got
    return got


def random_walk(matcher: Any, vocab: Any, rng: random.Random, max_steps: int) -> bytes | None:
    """Random allowed tokens, then a shortest completion; the produced bytes (None if stuck)."""
    eng = matcher.grammar.engine
    out = bytearray()
    steps = rng.randint(0, max_steps)
    eos = set(vocab.eos_token_ids)
    for _ in range(steps):
        allowed = [t for t in matcher.allowed_token_ids() if t not in eos]
        if not allowed:
            break
        t = rng.choice(allowed)
        assert matcher.accept_token(t)
        out += vocab.token_bytes[t]
    by_bytes = _short_tokens(vocab)
    # finish: a shortest completion, tokenized greedily with allowed tokens. The
    # breadth-first search gives up on long completions through recursive rules (each
    # '[' or '{' is a new configuration); then close greedily, one byte at a time
    # (closing brackets and quotes first), and search again
    tail = None
    for k in range(MAX_GREEDY_BYTES):
        if k % 16 == 0:
            tail = eng.shortest_completion(matcher._hist[-1], prefer=CLOSING,
                                           max_nodes=5_000 if k == 0 else 1_000)
            if tail is not None:
                break
        elif matcher.is_accepting():
            tail = b""
            break
        for b in (b'"' + CLOSING) if _in_string(out) else CLOSING:
            tid = by_bytes.get(bytes([b]))
            if tid is not None and matcher.accept_token(tid):
                out.append(b)
                break
        else:
            return None
    if tail is None:
        return None
    i = 0
    while i < len(tail):
        for ln in range(min(8, len(tail) - i), 0, -1):
            tid = by_bytes.get(tail[i:i + ln])
            if tid is not None and matcher.accept_token(tid):
                out += tail[i:i + ln]
                i += ln
                break
        else:
            return None
    if not matcher.is_accepting():
        return None
    return bytes(out)


def valid_instances(schema: Any, n: int, seed: int, deadline_s: float) -> list[Any]:
    """The schema's own ``examples`` (up to ``n``), then up to ``n`` derandomised
    hypothesis-jsonschema instances (``seed`` is not used: the draw is fixed per schema)."""
    out: list[Any] = []
    ex = schema.get("examples") if isinstance(schema, dict) else None
    if isinstance(ex, list):
        out.extend(ex[:n])
    del seed
    return out + hypothesis_instances(schema, n, None, deadline_s)


def hypothesis_instances(schema: Any, n: int, seed: int | None, deadline_s: float) -> list[Any]:
    """Up to ``n`` instances from hypothesis-jsonschema within ``deadline_s`` seconds
    (``[]`` if it is unavailable or cannot handle the schema). ``seed`` None: derandomised.

    hypothesis-jsonschema rewrites the schema it is given in place (it inlines $ref, merges
    allOf and sorts keys): it gets a copy, or the caller's schema (and with it the canonical
    property order of canonical_json) would change under its feet.
    """
    try:
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import seed as hyp_seed
        from hypothesis_jsonschema import from_schema
    except ImportError:
        return []
    found: list[Any] = []
    try:
        strat = from_schema(copy.deepcopy(schema))

        @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), derandomize=seed is None)
        @given(strat)
        def collect(v: Any) -> None:
            if len(found) < n:
                found.append(v)

        if seed is not None:
            collect = hyp_seed(seed)(collect)
        old = signal.signal(signal.SIGALRM, _alarm)
        # repeating: an alarm that lands in a callback whose exceptions Python ignores (a
        # weakref finaliser) is raised again a second later
        signal.setitimer(signal.ITIMER_REAL, deadline_s, 1.0)
        try:
            collect()
        finally:
            while True:
                try:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    break
                except _Timeout:
                    continue
            signal.signal(signal.SIGALRM, old)
    except _Timeout:
        pass
    except Exception:  # noqa: BLE001 - hypothesis-jsonschema cannot handle every schema
        pass
    return found


ESCAPE_VARIANTS = ("all-u", "all-U", "slash", "pairs")


def _spell(ch: str, variant: str) -> str:
    """``ch`` inside a JSON string in one escape variant (json.dumps's spelling where the
    variant does not touch it)."""
    cp = ord(ch)
    if variant in ("all-u", "all-U") or (variant == "pairs" and cp > 0xFFFF):
        if cp > 0xFFFF:
            hi, lo = divmod(cp - 0x10000, 0x400)
            text = f"\\u{0xD800 + hi:04x}\\u{0xDC00 + lo:04x}"
        else:
            text = f"\\u{cp:04x}"
        return text.upper().replace("\\U", "\\u") if variant == "all-U" else text
    if variant == "slash" and ch == "/":
        return "\\/"
    return json.dumps(ch, ensure_ascii=False)[1:-1]


def write_escaped(value: Any, variant: str) -> str:
    """``value`` as compact JSON (keys in its own order) with every string, keys
    included, spelled in ``variant``."""
    if isinstance(value, str):
        return '"' + "".join(_spell(c, variant) for c in value) + '"'
    if isinstance(value, dict):
        return "{" + ",".join(write_escaped(k, variant) + ":" + write_escaped(v, variant)
                              for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(write_escaped(v, variant) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def string_mutations(value: Any, limit: int = 6) -> list[Any]:
    """Copies of ``value`` with one string (value or key) changed: a character appended,
    the last dropped, one replaced by ``/``, ``é`` or an astral character, emptied."""
    out: list[Any] = []

    def edits(s: str) -> list[str]:
        return [s + "/", s[:-1], s + "\u00e9", "\U0001F600" + s, "", s[:1] + "/" + s[2:]]

    def walk(v: Any, rebuild: Any) -> None:
        if len(out) >= limit:
            return
        if isinstance(v, str):
            for e in edits(v):
                if e != v and len(out) < limit:
                    out.append(rebuild(e))
        elif isinstance(v, dict):
            items = list(v.items())
            for j, (k, x) in enumerate(items):
                walk(x, lambda y, j=j, k=k: rebuild(dict(items[:j] + [(k, y)] + items[j + 1:])))
                if len(out) < limit and isinstance(k, str):
                    nk = k + "/"
                    if nk not in v:
                        out.append(rebuild(dict(items[:j] + [(nk, x)] + items[j + 1:])))
        elif isinstance(v, list):
            for j, x in enumerate(v):
                walk(x, lambda y, j=j: rebuild(v[:j] + [y] + v[j + 1:]))

    walk(value, lambda y: y)
    return out


def selected_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The schemas a run covers: ``--limit`` per subset of ``--data`` (``--smoke``: the first three
    of the repository's schemas), then ``--shard``'s share."""
    if not args.smoke:
        rows = load_schemas(args.data, args.subset, args.limit, args.seed)
    else:
        rows = repo_schemas()[:3]
    if args.shard:
        k, n = (int(x) for x in args.shard.split("/"))
        rows = rows[k::n]
    return rows


def escape_variants_main(args: argparse.Namespace, envelope: dict[str, Any]) -> int:
    """The ``--escape-variants`` run (see the module docstring); returns the exit status."""
    from structgen.json_schema import (
        canonical_json,
        compile_json_schema,
        format_checker_for,
        schema_for_re_validators,
    )

    rows = selected_rows(args)
    copts = CompileOptions(timeout_s=args.timeout)
    total: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    t_start = time.time()
    for i, row in enumerate(rows):
        schema = row["schema"]
        total["schemas"] += 1
        try:
            g = compile_json_schema(schema, compile_options=copts, for_generation=False)
        except StructgenError:
            total["compile_error"] += 1
            continue
        except Exception as e:  # noqa: BLE001 - a crash is a bug: record it
            total["crash"] += 1
            failures.append({"id": row.get("id"), "kind": "crash", "error": repr(e)[:300]})
            continue
        total["compiled"] += 1
        try:
            cls = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
            # jsonschema reads patterns with Python's re: give it their ECMA-262 meaning
            validator = cls(schema_for_re_validators(schema), format_checker=format_checker_for(schema))
        except Exception:  # noqa: BLE001
            continue
        used = False
        for inst in valid_instances(schema, args.instances, args.seed, 5.0):
            try:
                if not validator.is_valid(inst):
                    continue
                # declared keys first, as the grammar expects; json.loads keeps that order
                ordered = json.loads(canonical_json(inst, schema))
            except Exception:  # noqa: BLE001
                continue
            used = True
            total["valid_instances"] += 1
            canonical = write_escaped(ordered, "none")
            if not g.accepts(canonical):
                # a false rejection that no spelling causes (numbers, say): counted apart,
                # and its variants are not counted as escape rejections
                total["valid_canonical_rejected"] += 1
                failures.append({"id": row.get("id"), "kind": "rejected_canonical", "doc": canonical[:400]})
                continue
            for variant in ESCAPE_VARIANTS:
                text = write_escaped(ordered, variant)
                total["valid_variants"] += 1
                if not g.accepts(text):
                    total["valid_variant_rejected"] += 1
                    total[f"valid_rejected_{variant}"] += 1
                    failures.append({"id": row.get("id"), "kind": f"rejected_{variant}",
                                     "doc": text[:400]})
            for bad in string_mutations(ordered):
                try:
                    if validator.is_valid(bad):
                        continue
                except Exception:  # noqa: BLE001
                    continue
                total["invalid_instances"] += 1
                canonical = write_escaped(bad, "none")
                if g.accepts(canonical):  # a soundness problem of its own, not of escapes
                    total["invalid_canonical_accepted"] += 1
                    failures.append({"id": row.get("id"), "kind": "accepted_invalid_canonical",
                                     "doc": canonical[:400]})
                for variant in ESCAPE_VARIANTS:
                    text = write_escaped(bad, variant)
                    total["invalid_variants"] += 1
                    if g.accepts(text):
                        total["invalid_variant_accepted"] += 1
                        failures.append({"id": row.get("id"), "kind": f"accepted_invalid_{variant}",
                                         "doc": text[:400]})
        total["schemas_with_instances"] += used
        if (i + 1) % 50 == 0:
            print(f"  {i + 1}/{len(rows)} schemas, {time.time() - t_start:.0f} s", file=sys.stderr,
                  flush=True)
    report = {"mode": "escape-variants", "variants": list(ESCAPE_VARIANTS), "total": dict(total),
              "failures": failures[:500], "seconds": round(time.time() - t_start, 1),
              "args": {k: str(v) for k, v in vars(args).items()}}
    for key in ("schemas", "compiled", "schemas_with_instances", "valid_instances",
                "valid_canonical_rejected", "valid_variants", "valid_variant_rejected",
                "invalid_instances", "invalid_variants",
                "invalid_variant_accepted", "invalid_canonical_accepted", "crash"):
        print(f"{key:28} {total[key]}")
    if args.out:
        envelope_lib.write(args.out, envelope, report)
    return 1 if total["valid_variant_rejected"] or total["invalid_variant_accepted"] or total["crash"] else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=default_data())
    ap.add_argument("--subset", action="append", help="only these subsets (repeatable)")
    ap.add_argument("--limit", type=int, default=None, help="schemas per subset")
    ap.add_argument("--walks", type=int, default=3)
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--instances", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=10.0, help="compile timeout per schema (s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--walk-tokenizer", action="append", choices=("llama3", "qwen2"),
                    help="vocabularies for the random walks (repeatable; default llama3)")
    ap.add_argument("--smoke", action="store_true",
                    help="3 of the repository's schemas (no data set needed), 1 walk, 1 instance, "
                         "the Llama-3 tokenizer only (CI)")
    ap.add_argument("--no-instances", action="store_true")
    ap.add_argument("--shard", default=None, help="I/N: only every N-th schema starting at I (0-based)")
    ap.add_argument("--merge", type=Path, nargs="+", default=None,
                    help="print the combined table of these report files (e.g. all shards) and exit")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--escape-variants", action="store_true",
                    help="check escape variants of valid and invalid instances (no walks)")
    ap.add_argument("--strict", action="store_true",
                    help="compile in strict mode (generation's default: objects closed to their declared "
                         "keys); the walks check that strict output still validates, and valid instances "
                         "are not checked (those with undeclared keys are rejected by design)")
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    if args.merge:
        reports = [json.loads(p.read_text()) for p in args.merge]
        merged = merge_reports(reports)
        print_report(merged)
        if args.out:
            envelope_lib.write(args.out, envelope, merged)
        return 0
    if args.smoke:
        # the compile time limit is wall-clock: on a loaded CI machine the first compile of a
        # process (warm-up included) can take seconds, and the smoke checks results, not speed
        args.walks, args.instances, args.timeout = 1, 1, max(args.timeout, 120.0)
    walk_toks = args.walk_tokenizer or ["llama3"]
    if not args.data.exists() and not args.smoke:
        print(f"data folder {args.data} not found (pass --data)", file=sys.stderr)
        return 2
    if args.escape_variants:
        return escape_variants_main(args, envelope)

    from structgen.assets import store as model_store
    from structgen.json_schema import (
        canonical_json,
        compile_json_schema,
        format_checker_for,
        schema_for_re_validators,
        schema_warnings,
    )
    from structgen.masks.matcher import Matcher
    from structgen.masks.vocab import Vocabulary

    toks = {a: model_store.load_tokenizer(a) for a in (("llama3",) if args.smoke else ("llama3", "qwen2"))}
    vocabs = {a: Vocabulary.from_tokenizer(t) for a, t in toks.items()}
    rows = selected_rows(args)
    copts = CompileOptions(timeout_s=args.timeout)
    per: dict[str, Counter[str]] = defaultdict(Counter)
    errors: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    unlocated: list[dict[str, Any]] = []  # compile errors naming no keyword or no pointer
    compile_times: list[float] = []
    rng = random.Random(args.seed)
    t_start = time.time()
    for i, row in enumerate(rows):
        sub, schema = row["subset"], row["schema"]
        c = per[sub]
        c["schemas"] += 1
        t0 = time.perf_counter()
        try:
            g = compile_json_schema(schema, compile_options=copts, strict=args.strict,
                                    for_generation=False)
        except StructgenError as e:
            c["compile_error"] += 1
            errors[keyword_of(e)] += 1
            msg = str(e)
            has_ptr = bool(getattr(e, "pointer", "")) or " at #" in msg
            has_kw = bool(getattr(e, "keyword", None))
            if not (has_ptr and has_kw):
                c["compile_error_unlocated"] += 1
                unlocated.append({"id": row.get("id"), "subset": sub, "error": type(e).__name__,
                                  "pointer": has_ptr, "keyword": has_kw, "message": msg[:300]})
            continue
        except RecursionError:
            c["crash"] += 1
            errors["RecursionError"] += 1
            failures.append({"id": row.get("id"), "kind": "crash", "error": "RecursionError"})
            continue
        except Exception as e:  # noqa: BLE001 - a crash is a bug: record it
            c["crash"] += 1
            errors[f"CRASH:{type(e).__name__}"] += 1
            failures.append({"id": row.get("id"), "kind": "crash", "error": repr(e)[:300]})
            continue
        compile_times.append(time.perf_counter() - t0)
        c["compiled"] += 1
        if any(w.startswith("strict:") for w in schema_warnings(g)):
            c["strict_left_open"] += 1
        try:
            cls = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
            # formats as structgen enforces them: the 2020-12 definitions of the formats the
            # schema's draft defines (the global FormatChecker() would check "time" with draft
            # 3's "%H:%M:%S")
            # structgen's builder: a remote $ref in a benchmark schema must not be fetched
            validator = jsonschema_validator(schema_for_re_validators(schema), cls,
                                             format_checker=format_checker_for(schema))
        except Exception:  # noqa: BLE001
            validator = None
        # soundness walks
        for _w, walk_tok in ((w, a) for w in range(args.walks) for a in walk_toks):
            m = Matcher(g, vocabs[walk_tok])
            data = random_walk(m, vocabs[walk_tok], rng, args.max_steps)
            if data is None:
                c["walk_stuck"] += 1
                continue
            c["walks"] += 1
            try:
                inst = json.loads(data.decode("utf-8"))
            except Exception:  # noqa: BLE001
                c["walk_invalid"] += 1
                failures.append({"id": row.get("id"), "kind": "walk_not_json", "vocab": walk_tok,
                                 "doc": data[:300].decode("utf-8", "replace")})
                continue
            if validator is not None and not validator.is_valid(inst):
                c["walk_invalid"] += 1
                err = next(iter(validator.iter_errors(inst)))
                failures.append({"id": row.get("id"), "kind": "walk_invalid", "vocab": walk_tok,
                                 "doc": data[:300].decode("utf-8", "replace"),
                                 "error": f"{list(err.absolute_path)}: {err.message[:200]}"})
        # completeness
        if not args.no_instances and not args.strict and validator is not None:
            for inst in valid_instances(schema, args.instances, args.seed, 5.0):
                try:
                    if not validator.is_valid(inst):
                        continue
                    text = canonical_json(inst, schema)
                except Exception:  # noqa: BLE001
                    continue
                c["instances"] += 1
                for alias, tok in toks.items():
                    ids = tok.encode(text, add_special_tokens=False)
                    m = Matcher(g, vocabs[alias])
                    n = m.accept_tokens(ids)
                    if n != len(ids) or not m.is_accepting():
                        c[f"false_reject_{alias}"] += 1
                        failures.append({"id": row.get("id"), "kind": f"false_reject_{alias}",
                                         "doc": text[:300], "at_token": n})
        if (i + 1) % 100 == 0:
            print(f"  {i + 1}/{len(rows)} schemas, {time.time() - t_start:.0f} s", file=sys.stderr)

    total = Counter()
    for c in per.values():
        total.update(c)
    report = {"per_subset": {k: dict(v) for k, v in per.items()}, "total": dict(total),
              "errors": dict(errors), "failures": failures[:500], "unlocated_errors": unlocated[:500],
              "compile_times_s": [round(t, 5) for t in compile_times],
              "args": {k: str(v) for k, v in vars(args).items()},
              "schema_source": "repository schemas/" if args.smoke else str(args.data)}
    print_report(report)
    if args.out:
        envelope_lib.write(args.out, envelope, report)
    bad = (total["walk_invalid"] + total["false_reject_llama3"] + total["false_reject_qwen2"]
           + total["crash"])
    return 1 if bad else 0


def merge_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum shard reports (counters per subset, errors; failure lists concatenated)."""
    per: dict[str, Counter[str]] = defaultdict(Counter)
    errors: Counter[str] = Counter()
    out: dict[str, Any] = {"failures": [], "unlocated_errors": [], "compile_times_s": [],
                           "args": [r.get("args") for r in reports],
                           "shard_envelopes": [r.get("envelope") for r in reports]}
    for r in reports:
        for sub, c in r["per_subset"].items():
            per[sub].update(c)
        errors.update(r["errors"])
        for k in ("failures", "unlocated_errors", "compile_times_s"):
            out[k].extend(r.get(k, []))
    total: Counter[str] = Counter()
    for c in per.values():
        total.update(c)
    out.update({"per_subset": {k: dict(v) for k, v in per.items()}, "total": dict(total),
                "errors": dict(errors)})
    return out


def print_report(report: dict[str, Any]) -> None:
    per = {k: Counter(v) for k, v in report["per_subset"].items()}
    total = Counter(report["total"])
    print(f"{'subset':18} {'schemas':>7} {'compiled':>8} {'rate':>6} {'walks':>6} {'invalid':>7} "
          f"{'inst':>5} {'FR-llama':>8} {'FR-qwen':>7} {'crash':>5}")
    for name in sorted(per) + ["TOTAL"]:
        c = total if name == "TOTAL" else per[name]
        rate = c["compiled"] / c["schemas"] if c["schemas"] else 0
        print(f"{name:18} {c['schemas']:7d} {c['compiled']:8d} {rate:6.1%} {c['walks']:6d} "
              f"{c['walk_invalid']:7d} {c['instances']:5d} {c['false_reject_llama3']:8d} "
              f"{c['false_reject_qwen2']:7d} {c['crash']:5d}")
    print("compile errors by type/keyword:", dict(Counter(report["errors"]).most_common(20)))
    print(f"compile errors naming no keyword or no JSON pointer: {len(report['unlocated_errors'])}")
    if total["strict_left_open"]:
        print(f"strict mode left something open (a warning) in {total['strict_left_open']} schemas")
    ct = sorted(report.get("compile_times_s") or [])
    if ct:
        med, p90 = ct[len(ct) // 2], ct[int(len(ct) * 0.9)]
        print(f"compile time median {med * 1e3:.1f} ms, p90 {p90 * 1e3:.1f} ms")


if __name__ == "__main__":
    sys.exit(main())
