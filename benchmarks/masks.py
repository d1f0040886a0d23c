"""Token-mask benchmark: structgen against xgrammar, llguidance, outlines-core and GLRMask.

Every engine gets the same tokenizer vocabulary (``--tokenizer``: ``llama3`` 128k by default,
``qwen2`` 151k, ``mistral`` 32k SentencePiece with byte fallback), the same grammars and the
same replayed token sequences (GLRMask: the same instances in its JSON spelling, see below),
and the engines run interleaved, case by case (for each case
every engine in turn, the starting engine rotating), each in its own worker process so that
a compile that overruns ``--compile-timeout`` is killed without stalling the run.

Cases:

* JSON schemas from JSONSchemaBench (``--data``; ``--limit`` schemas per subset, sampled with
  ``--seed``; or ``--sample N``: N schemas drawn with ``--seed`` from all subsets pooled),
  each with one fixed valid instance: candidates are the schema's own
  ``examples`` and ``--candidates`` instances from hypothesis-jsonschema (seeded with
  ``--seed``); those ``jsonschema`` accepts (formats checked) are serialised with
  :func:`structgen.json_schema.canonical_json` (compact, declared properties in schema
  order: the form structgen's grammar defines) and the longest one of at most
  ``--max-chars`` characters is kept. The text is tokenized with a plain ``encode`` (for
  SentencePiece tokenizers the dummy-prefix space is removed, see :func:`replay_tokens`). A
  structgen rejection of such an instance is a false rejection (a bug). An engine whose
  JSON-schema grammars spell JSON otherwise (GLRMask: ``", "`` and ``": "``, U+007F escaped)
  replays the same instance in its spelling (:func:`mask_engines.respell_json`: a space after
  every ``,`` and ``:`` outside strings, U+007F in strings as ``\\u007f``, nothing else
  changed), tokenized the same way: its token sequence is then its own, a few tokens longer.
* Lark grammars from ``structgen/grammars/`` (JSON, SQL, arithmetic) with fixed sample inputs that
  Lark's own Earley parser accepts. llguidance, xgrammar and GLRMask take the Lark text
  directly; outlines-core is regular-expression only and reports n/a.

Engine settings (compact JSON, no whitespace between tokens, wherever the engine has the option):

* structgen: ``compile_json_schema(schema, for_generation=False)`` (validation's language, as the
  peers' settings: every valid instance replays) / ``compile_lark(text)`` with the compile timeout,
  ``Matcher.fill_bitmask`` + ``Matcher.accept_token``;
* xgrammar: ``GrammarCompiler(max_threads=--threads, cache_enabled=False)``,
  ``compile_json_schema(any_whitespace=False, separators=(",", ":"), strict_mode=False)``
  (strict mode would forbid properties the schema allows) or ``compile_lark``;
  ``GrammarMatcher.fill_next_token_bitmask`` + ``accept_token``;
* llguidance: ``LLMatcher(tokenizer, LLMatcher.grammar_from_json_schema(schema, defaults=
  {"whitespace_flexible": False, ...}))`` or ``grammar_from_lark``; ``llguidance.torch.
  fill_next_token_bitmask`` + ``consume_token``;
* outlines-core: ``Index(build_regex_from_schema(schema, whitespace_pattern=""), vocabulary)``,
  ``Guide.write_mask_into`` + ``Guide.advance``. Its ``Vocabulary`` is built from the
  token bytes of :class:`structgen.masks.vocab.Vocabulary` (its own ``from_pretrained`` needs the
  Hugging Face hub).
* GLRMask (``glrmask``): ``Grammar.from_json_schema(schema)`` or ``Grammar.from_lark(text)``,
  followed by the EOS token (``Grammar.from_expr(Expr.sequence(grammar, TokenSet(eos)))``, so
  its mask allows EOS exactly where the grammar accepts, as the other engines' masks do),
  ``.compile(vocab)`` with the default mask strategy (``MaskStrategy.AUTO``);
  ``ConstraintState.fill_mask`` (into the same packed int32 row) + ``commit_token``. Its
  ``Vocab`` is ``Vocab.from_id_to_bytes`` over the text tokens' bytes of structgen's
  ``Vocabulary``; compile threads ``RAYON_NUM_THREADS`` = ``GLRMASK_COMPILE_THREADS`` =
  ``--threads``. Its JSON-schema grammars have a fixed spelling with a space after ``,`` and
  ``:`` (0.5 has no compact option) and U+007F escaped in strings: see the cases above.

Measurements (``time.perf_counter_ns``), per engine and case:

* compile: cold (structgen's content caches and xgrammar's compiler cache are cleared; the
  process itself is warm: every worker compiles and replays a small schema first, then
  compiles one with a Unicode-class pattern and the common string formats, so that tables
  which do not depend on the grammar are not charged to whichever case first needs them);
* time to first mask (TTFM): compile + matcher creation + the first mask fill;
* step: advance by the next replayed token + fill the next mask (median / mean / p99 over
  all steps of a case kind), in two passes over the same tokens in the same worker:
  *first pass*, on the matcher made right after the compile (the engine's caches are cold
  for this grammar: what a new request sees), then *warm*, on a fresh matcher of the same
  compiled grammar (the engine's caches for it are warm: a repeated request). Both report
  p50 / p99 / p99.9 / max (``first_pass`` and ``warm`` in the summary; the older ``step_*``
  keys are the first pass). ``--forward-ms F`` sleeps F ms before every step (a model forward
  pass; not in the step time, the same for every engine): an engine may use that time on its
  own background threads, as a real decode loop lets it while the GPU runs (structgen starts
  its look-ahead, ``Matcher.start_look_ahead``, after every mask; ``--no-look-ahead``: not);
* compile rate: compiled / attempted (n/a excluded; compile errors, time-outs and crashes
  count as failures);
* allowed tokens per step: popcount of the mask over the text tokens (special tokens and
  EOS excluded, so engines with different special-token policies compare); structgen's
  count is compared with each peer's step by step and disagreements are listed;
* rejections: a replayed token missing from the mask or refused on advance (for structgen a
  false rejection; for a peer it can also be a deliberate narrowing of the schema);
* structgen's runtime memory after the replay: ``Engine.mask_cache_bytes`` (the mask cache)
  and ``Engine.memory_bytes()`` (tables + mask cache).

Ratios structgen/peer are computed over the cases both engines replayed (steps cut to the
common prefix; for a peer replaying another spelling, the whole replays of the cases both
replayed without a rejection), TTFM over the cases both compiled, separately for JSON-schema
and Lark cases. Over the JSON-schema cases the report checks these bars (``bars``: met / not
met with the figures): TTFM p50 <= 1.0x llguidance and p99 <= 2x; first-pass step p99 <= 2x
GLRMask and max <= 5x; warm step p50 <= 1.0x the faster of llguidance and GLRMask; structgen's
compile rate >= 95%. Output: a table on stdout, the same summary as Markdown (``--md``), and
JSON in ``benchmarks/results/masks-<tokenizer>.json`` (``--out``) with the shared envelope of
``benchmarks/common/envelope.py`` and the machine's load average during the run.

``--smoke`` (CI): the first 3 of the repository's ``schemas/`` with their valid examples (no
data set, no hypothesis) and 1 Lark case; peers run when they are installed (the ``bench`` extra).
Exit status 1 when structgen falsely rejects an
instance or crashes. Examples::

    python -m benchmarks.masks --smoke
    python -m benchmarks.masks --limit 10                     # Llama-3, 10 schemas per subset
    python -m benchmarks.masks --limit 5 --tokenizer qwen2
    python -m benchmarks.masks --sample 150 --no-lark --engines structgen,llguidance,glrmask \\
        --out benchmarks/results/masks-llama3-glrmask.json --md benchmarks/results/masks-llama3-glrmask.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from benchmarks.common import envelope as envelope_lib
from benchmarks.common.checkout import ROOT
from benchmarks.common.mask_engines import ADAPTERS, EngineProc, load_vocab, respell_json
from benchmarks.jsonschemabench import (
    default_data,
    hypothesis_instances,
    load_schemas,
    repo_schemas,
)

RESULTS = ROOT / "benchmarks" / "results"
ENGINES = ("structgen", "xgrammar", "llguidance", "outlines-core", "glrmask")
PEERS = ENGINES[1:]


# Lark cases: (grammar file stem, sample inputs). Every sample is checked with Lark's own
# parser before it is used.
LARK_SAMPLES: dict[str, list[str]] = {
    "json": [
        '{"name": "Ada Lovelace", "tags": ["math", "engine"], "n": -1.5e3, "ok": true,'
        ' "nested": {"a": null, "b": [0, 0.25]}}',
        '[1, 2,\n 3, {"k": "v\\n\\u00e9", "empty": {}, "list": []}]',
        '{"id":42,"title":"Structured output","price":12.99,"in_stock":false}',
    ],
    "sql": [
        "SELECT u.name, COUNT(*) AS n FROM users AS u LEFT OUTER JOIN orders AS o ON u.id = o.user_id"
        " WHERE o.total > 10 AND u.name LIKE 'A%' GROUP BY u.name HAVING COUNT(*) >= 2"
        " ORDER BY n DESC LIMIT 10;",
        "select distinct city from customers where country in ('DE', 'FR') and not age < 18"
        " order by city asc",
        "SELECT id, price * 1.2 AS gross FROM products WHERE discontinued IS NOT NULL"
        " OR (stock = 0 AND name <> 'x')",
    ],
    "arithmetic": [
        "(1 + 2.5) * -3 / (4 - 5)",
        "12*(3+4)-5/6",
        "-(-(7)) + 8 * 9 - 10 / (11 + 12.75)",
    ],
}

# ---------------------------------------------------------------------------------------------
# Cases (parent process)
# ---------------------------------------------------------------------------------------------

def _validator(schema: Any) -> Any:
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
        # formats as structgen enforces them (2020-12 definitions of the draft's formats)
        from structgen.json_schema import format_checker_for, schema_for_re_validators
        from structgen.validation import jsonschema_validator

        # structgen's builder: no registry-less validator, whose $ref would fetch URLs / read files;
        # patterns get their ECMA-262 meaning (jsonschema reads them with Python's re)
        return jsonschema_validator(schema_for_re_validators(schema), cls,
                                    format_checker=format_checker_for(schema))
    except Exception:  # noqa: BLE001 - a malformed schema: no instance can be checked
        return None


def pick_instance(schema: Any, candidates: list[Any], max_chars: int) -> tuple[str | None, int]:
    """The canonical text of the longest ``jsonschema``-valid candidate of at most ``max_chars``
    characters (else the shortest valid one); and how many candidates were valid."""
    from structgen.json_schema import canonical_json

    v = _validator(schema)
    if v is None:
        return None, 0
    texts = []
    for inst in candidates:
        try:
            if not v.is_valid(inst):
                continue
            texts.append(canonical_json(inst, schema))
        except Exception:  # noqa: BLE001 - unrepresentable value or a schema jsonschema cannot use
            continue
    if not texts:
        return None, 0
    fit = [t for t in texts if len(t) <= max_chars]
    best = max(fit, key=len) if fit else min(texts, key=len)
    return best, len(texts)


def replay_tokens(tok: Any, vocab: Any, text: str) -> list[int] | None:
    """A plain ``encode`` of ``text`` whose token bytes spell exactly ``text``.

    SentencePiece tokenizers add a dummy-prefix space at the start of an encoding ("▁{"),
    which is not part of the output text a grammar sees in the middle of a generation; then
    ``"\\n" + text`` is encoded and the tokens of ``"\\n"`` are dropped. None if no
    tokenization spells the text exactly.
    """
    want = text.encode("utf-8")
    ids = list(tok.encode(text, add_special_tokens=False))
    if vocab.decode_bytes(ids) == want:
        return ids
    pre = list(tok.encode("\n", add_special_tokens=False))
    full = list(tok.encode("\n" + text, add_special_tokens=False))
    if full[: len(pre)] == pre and vocab.decode_bytes(full[len(pre):]) == want:
        return full[len(pre):]
    return None


def sample_schemas(data: Path, subsets: list[str] | None, n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` schemas drawn without replacement from all subset files pooled (``subsets``: only
    these), with ``random.Random(seed)``; in the drawn order."""
    pool = load_schemas(data, subsets, None, seed)
    return random.Random(seed).sample(pool, min(n, len(pool)))


def _spelled(tok: Any, vocab: Any, text: str, spelling: str, max_tokens: int) -> dict[str, Any]:
    """The instance ``text`` respelled for an engine (see ``respell_json``) and its tokens."""
    alt = respell_json(text, spelling)
    if json.loads(alt) != json.loads(text):  # the same value: only whitespace was added
        raise AssertionError(f"respelling changed the value: {text[:200]!r}")
    ids = replay_tokens(tok, vocab, alt)
    out: dict[str, Any] = {"text": alt, "tokens": ids, "truncated": False}
    if ids is not None and len(ids) > max_tokens:
        out["tokens"], out["truncated"] = ids[:max_tokens], True
    return out


def build_cases(args: argparse.Namespace, tok: Any, vocab: Any,
                spellings: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """All cases (JSON schemas first, then Lark), with their replayed token ids; for every
    JSON spelling in ``spellings`` other than compact also ``case["spelled"][spelling]``
    (text, tokens, truncated) for the engines that replay it."""
    import lark

    from structgen.frontends.lark import builtin_grammar, lark_import_loader

    info: dict[str, Any] = {"schemas_without_instance": [], "untokenizable": []}
    cases: list[dict[str, Any]] = []
    sample = getattr(args, "sample", None)
    if not args.no_schemas:
        if args.smoke:
            rows = repo_schemas()[:3]
            info["schema_source"] = str(ROOT / "schemas")
        elif args.data.is_dir() and sample:
            rows = sample_schemas(args.data, args.subset, sample, args.seed)
            info["schema_source"] = str(args.data)
            info["sample"] = {"schemas": len(rows), "seed": args.seed, "subsets": args.subset or "all",
                              "drawn_from": "all subset files pooled, random.Random(seed).sample"}
        elif args.data.is_dir():
            rows = load_schemas(args.data, args.subset, args.limit, args.seed)
            info["schema_source"] = str(args.data)
        else:
            rows = repo_schemas()
            info["schema_source"] = f"{ROOT / 'schemas'} ({args.data} not found)"
        t0 = time.time()
        for r in rows:
            schema = r["schema"]
            cands: list[Any] = list(r.get("instances") or [])
            ex = schema.get("examples") if isinstance(schema, dict) else None
            if isinstance(ex, list):
                cands.extend(ex)
            if args.candidates > 0:
                cands.extend(hypothesis_instances(schema, args.candidates, args.seed, args.instance_deadline))
            text, n_valid = pick_instance(schema, cands, args.max_chars)
            name = f"{r['subset']}/{r.get('id')}"
            case: dict[str, Any] = {"kind": "schema", "name": name, "subset": r["subset"], "schema": schema,
                                    "text": text, "valid_candidates": n_valid, "tokens": None}
            if text is None:
                info["schemas_without_instance"].append(name)
            else:
                ids = replay_tokens(tok, vocab, text)
                if ids is None:
                    info["untokenizable"].append(name)
                else:
                    if len(ids) > args.max_tokens:
                        ids, case["truncated"] = ids[: args.max_tokens], True
                    case["tokens"] = ids
                for sp in spellings:
                    if sp != "compact":
                        case.setdefault("spelled", {})[sp] = _spelled(tok, vocab, text, sp, args.max_tokens)
                        if case["spelled"][sp]["tokens"] is None:
                            info["untokenizable"].append(f"{name} ({sp})")
            cases.append(case)
        info["instance_prep_s"] = round(time.time() - t0, 1)
    if not args.no_lark:
        grammars = args.grammar or (["arithmetic"] if args.smoke else list(LARK_SAMPLES))
        for g in grammars:
            text = builtin_grammar(g)
            parser = lark.Lark(text, parser="earley", lexer="dynamic_complete",
                               import_paths=[lark_import_loader()])
            samples = LARK_SAMPLES[g][:1] if args.smoke else LARK_SAMPLES[g]
            for i, s in enumerate(samples):
                parser.parse(s)  # the oracle: Lark itself accepts every sample
                ids = replay_tokens(tok, vocab, s)
                if ids is None:
                    info["untokenizable"].append(f"lark/{g}#{i}")
                    continue
                cases.append({"kind": "lark", "name": f"lark/{g}#{i}", "subset": "lark", "grammar": text,
                              "grammar_name": g, "text": s, "tokens": ids})
    return cases, info


# ---------------------------------------------------------------------------------------------
# Statistics and report
# ---------------------------------------------------------------------------------------------

def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    import numpy as np

    return float(np.percentile(np.asarray(xs, dtype=np.float64), q))


def _mean(xs: list[float]) -> float | None:
    return float(sum(xs) / len(xs)) if xs else None


def _step_stats(steps_ns: list[int]) -> dict[str, Any]:
    us = [s / 1e3 for s in steps_ns]
    return {"steps": len(us), "step_median_us": _pct(us, 50), "step_mean_us": _mean(us),
            "step_p99_us": _pct(us, 99), "step_max_us": max(us) if us else None}


def _dist(steps_ns: list[int]) -> dict[str, Any]:
    """Step-time distribution in microseconds: p50 / p99 / p99.9 / max / mean."""
    us = [s / 1e3 for s in steps_ns]
    return {"steps": len(us), "p50_us": _pct(us, 50), "p99_us": _pct(us, 99), "p999_us": _pct(us, 99.9),
            "max_us": max(us) if us else None, "mean_us": _mean(us)}


def case_summary(res: dict[str, Any]) -> dict[str, Any]:
    """Per case and engine: what goes into the JSON file (no per-step arrays)."""
    out = {k: v for k, v in res.items() if k not in ("steps_ns", "warm_steps_ns", "allowed", "traceback")}
    for k in ("compile_ns", "ttfm_ns", "first_fill_ns", "warm_first_fill_ns"):
        if isinstance(out.get(k), int):
            out[k.replace("_ns", "_ms")] = out.pop(k) / 1e6
    if "steps_ns" in res:
        out.update(_step_stats(res["steps_ns"]))
        al = res.get("allowed") or []
        out["allowed_mean"] = _mean(al)
        out["allowed_first"] = al[0] if al else None
    if "warm_steps_ns" in res:
        w = _dist(res["warm_steps_ns"])
        out["warm_step_median_us"], out["warm_step_max_us"] = w["p50_us"], w["max_us"]
    return out


def engine_summary(cases: list[dict[str, Any]], engine: str) -> dict[str, Any]:
    st: dict[str, Any] = {"cases": 0, "ok": 0, "replayed": 0, "compile_error": 0, "compile_timeout": 0,
                          "replay_timeout": 0, "crash": 0, "n/a": 0, "rejections": 0, "eos_refused": 0}
    compile_ms, ttfm_ms, steps, warm, allowed = [], [], [], [], []
    warm_differs = 0
    for c in cases:
        r = c["raw"].get(engine)
        if r is None:
            continue
        st["cases"] += 1
        s = r.get("status", "crash")
        st[s] = st.get(s, 0) + 1
        if s != "ok":
            continue
        compile_ms.append(r["compile_ns"] / 1e6)
        ttfm_ms.append(r["ttfm_ns"] / 1e6)
        if _tokens_for(c, engine):
            st["replayed"] += 1
            steps.extend(r["steps_ns"])
            warm.extend(r.get("warm_steps_ns") or [])
            warm_differs += r.get("warm_mask_differs") or 0
            allowed.extend(r["allowed"])
            if r.get("reject"):
                st["rejections"] += 1
            elif r.get("eos_ok") is False:
                st["eos_refused"] += 1
    # compiled: the compile succeeded (a replay that timed out afterwards included); attempted:
    # every case but n/a; compile errors, compile time-outs and crashes are failures
    attempted = st["cases"] - st["n/a"]
    compiled = st["ok"] + st["replay_timeout"]
    st.update({"spelling": ADAPTERS[engine].spelling,
               "attempted": attempted, "compiled": compiled,
               "compile_rate": compiled / attempted if attempted else None,
               "compile_median_ms": _pct(compile_ms, 50), "compile_mean_ms": _mean(compile_ms),
               "ttfm_median_ms": _pct(ttfm_ms, 50), "ttfm_p90_ms": _pct(ttfm_ms, 90),
               "ttfm_p50_ms": _pct(ttfm_ms, 50), "ttfm_p99_ms": _pct(ttfm_ms, 99),
               "ttfm_max_ms": max(ttfm_ms) if ttfm_ms else None,
               "allowed_per_step_mean": _mean(allowed), "allowed_per_step_median": _pct(allowed, 50)})
    st.update(_step_stats(steps))
    st["first_pass"] = _dist(steps)
    st["warm"] = _dist(warm)
    st["warm_mask_differs"] = warm_differs
    return st


def _tokens_for(case: dict[str, Any], engine: str) -> list[int] | None:
    """The tokens ``engine`` replays for ``case`` (its JSON spelling's for schema cases)."""
    sp = ADAPTERS[engine].spelling
    if case["kind"] == "schema" and sp != "compact":
        return (case.get("spelled") or {}).get(sp, {}).get("tokens")
    return case.get("tokens")


def _same_tokens(kind: str, peer: str) -> bool:
    return kind != "schema" or ADAPTERS[peer].spelling == ADAPTERS["structgen"].spelling


def _paired(a: dict[str, Any], b: dict[str, Any], key: str, same: bool) -> tuple[list[int], list[int]] | None:
    """One case's steps of structgen (``a``) and a peer (``b``) for the ratios, or None: the
    common prefix when both replayed the same tokens; else both whole replays, only when
    neither was rejected."""
    sa, sb = a.get(key) or [], b.get(key) or []
    if same:
        n = min(len(sa), len(sb))
        return (sa[:n], sb[:n]) if n else None
    rej = "reject" if key == "steps_ns" else "warm_reject"
    if a.get(rej) or b.get(rej) or not sa or not sb:
        return None
    return sa, sb


def ratios(cases: list[dict[str, Any]], peer: str, kind: str = "schema") -> dict[str, Any]:
    """structgen / peer over the cases both compiled (TTFM, compile) and replayed (steps, see
    :func:`_paired`), for the first pass and the warm pass."""
    same = _same_tokens(kind, peer)
    a_first: list[int] = []
    b_first: list[int] = []
    a_warm: list[int] = []
    b_warm: list[int] = []
    a_ttfm, b_ttfm, a_comp, b_comp = [], [], [], []
    n_first = n_warm = 0
    for c in cases:
        a, b = c["raw"].get("structgen"), c["raw"].get(peer)
        if not a or not b or a.get("status") != "ok" or b.get("status") != "ok":
            continue
        a_ttfm.append(a["ttfm_ns"] / 1e6)
        b_ttfm.append(b["ttfm_ns"] / 1e6)
        a_comp.append(a["compile_ns"])
        b_comp.append(b["compile_ns"])
        pf = _paired(a, b, "steps_ns", same)
        if pf:
            n_first += 1
            a_first.extend(pf[0])
            b_first.extend(pf[1])
        pw = _paired(a, b, "warm_steps_ns", same)
        if pw:
            n_warm += 1
            a_warm.extend(pw[0])
            b_warm.extend(pw[1])

    def r(x: float | None, y: float | None) -> float | None:
        return x / y if x is not None and y else None

    fa, fb, wa, wb = _dist(a_first), _dist(b_first), _dist(a_warm), _dist(b_warm)
    values: dict[str, Any] = {
        "ttfm_p50_ms": {"structgen": _pct(a_ttfm, 50), peer: _pct(b_ttfm, 50)},
        "ttfm_p99_ms": {"structgen": _pct(a_ttfm, 99), peer: _pct(b_ttfm, 99)},
        "first_pass": {"structgen": fa, peer: fb}, "warm": {"structgen": wa, peer: wb}}
    out: dict[str, Any] = {
        "pairing": ("steps cut to the common prefix of the same tokens" if same else
                    "whole replays of the cases both replayed without a rejection "
                    "(different JSON spellings)"),
        "cases_compiled_both": len(a_ttfm), "cases_replayed_both": n_first, "cases_warm_both": n_warm,
        "steps": len(a_first), "peer_steps": len(b_first),
        "step_median": r(fa["p50_us"], fb["p50_us"]), "step_mean": r(fa["mean_us"], fb["mean_us"]),
        "step_p99": r(fa["p99_us"], fb["p99_us"]),
        "compile_median": r(_pct(a_comp, 50), _pct(b_comp, 50)),
        "ttfm_median": r(_pct(a_ttfm, 50), _pct(b_ttfm, 50)),
        "ttfm_p90": r(_pct(a_ttfm, 90), _pct(b_ttfm, 90)),
        "ttfm_p99": r(_pct(a_ttfm, 99), _pct(b_ttfm, 99))}
    for pas, da, db in (("first_pass", fa, fb), ("warm", wa, wb)):
        for q in ("p50", "p99", "p999", "max"):
            out[f"{pas}_{q}"] = r(da[f"{q}_us"], db[f"{q}_us"])
    out["values"] = values
    return out


# The issue's bars over the JSON-schema cases: (key, statement, peers, ratio key, limit). A
# bar with several peers is checked against the faster one (the largest ratio).
BARS: tuple[tuple[str, str, tuple[str, ...], str, float], ...] = (
    ("ttfm_p50", "TTFM p50 <= 1.0x llguidance", ("llguidance",), "ttfm_median", 1.0),
    ("ttfm_p99", "TTFM p99 <= 2x llguidance", ("llguidance",), "ttfm_p99", 2.0),
    ("first_pass_p99", "first-pass step p99 <= 2x GLRMask", ("glrmask",), "first_pass_p99", 2.0),
    ("first_pass_max", "first-pass step max <= 5x GLRMask", ("glrmask",), "first_pass_max", 5.0),
    ("warm_p50", "warm step p50 <= 1.0x the faster of llguidance and GLRMask", ("llguidance", "glrmask"),
     "warm_p50", 1.0),
)
MIN_COMPILE_RATE = 0.95


def _bar_figures(rat: dict[str, Any], peer: str, rkey: str) -> str:
    v = rat["values"]
    if rkey.startswith("ttfm"):
        q = "p50" if rkey == "ttfm_median" else "p99"
        x = v[f"ttfm_{q}_ms"]
        return (f"structgen {_fmt(x['structgen'], 2)} ms vs {peer} {_fmt(x[peer], 2)} ms "
                f"({rat['cases_compiled_both']} cases both compiled)")
    pas, q = rkey.rsplit("_", 1)
    x = v[pas]
    n = rat["cases_replayed_both"] if pas == "first_pass" else rat["cases_warm_both"]
    return (f"structgen {_fmt(x['structgen'][f'{q}_us'])} us vs {peer} {_fmt(x[peer][f'{q}_us'])} us "
            f"({n} cases, {x['structgen']['steps']} / {x[peer]['steps']} steps)")


def bars(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's bars checked on the JSON-schema cases of this run (ratios structgen/peer)."""
    rat = report["ratios"].get("schema", {})
    out: list[dict[str, Any]] = []
    for key, text, peers, rkey, limit in BARS:
        have = [(p, rat[p][rkey]) for p in peers if p in rat and rat[p].get(rkey) is not None]
        row: dict[str, Any] = {"bar": key, "text": text, "limit": limit}
        if not have:
            row.update({"met": None,
                        "verdict": f"not evaluated ({', '.join(peers)} not run or no paired cases)"})
            out.append(row)
            continue
        peer, ratio = max(have, key=lambda pr: pr[1])
        missing = [p for p in peers if p not in dict(have)]
        row.update({"peer": peer, "ratio": ratio, "met": ratio <= limit,
                    "figures": _bar_figures(rat[peer], peer, rkey)
                    + (f"; not run: {', '.join(missing)}" if missing else "")})
        row["verdict"] = f"{'met' if row['met'] else 'NOT MET'}: {ratio:.2f}x {peer} (bar {limit:g}x)"
        out.append(row)
    sg = report["summary"].get("schema", {}).get("structgen") or {}
    rate = sg.get("compile_rate")
    row = {"bar": "compile_rate", "text": f"structgen compile rate >= {MIN_COMPILE_RATE:.0%}",
           "limit": MIN_COMPILE_RATE, "ratio": rate,
           "met": None if rate is None else rate >= MIN_COMPILE_RATE}
    if rate is None:
        row["verdict"] = "not evaluated (no JSON-schema cases)"
    else:
        row["figures"] = (f"{sg['compiled']}/{sg['attempted']} compiled ({sg['compile_error']} errors, "
                          f"{sg['compile_timeout']} time-outs, {sg['crash']} crashes)")
        row["verdict"] = f"{'met' if row['met'] else 'NOT MET'}: {rate:.1%}"
    out.append(row)
    return out


def disagreements(cases: list[dict[str, Any]], peer: str, tok: Any, limit: int = 12,
                  kind: str = "schema") -> dict[str, Any]:
    """Steps where structgen's allowed-token count (text tokens) differs from the peer's."""
    if not _same_tokens(kind, peer):
        return {"n/a": f"{peer} replays another JSON spelling ({ADAPTERS[peer].spelling})"}
    compared = differ = 0
    cases_differ: list[str] = []
    examples: list[dict[str, Any]] = []
    for c in cases:
        a, b = c["raw"].get("structgen"), c["raw"].get(peer)
        if not a or not b or a.get("status") != "ok" or b.get("status") != "ok":
            continue
        ca, cb = a.get("allowed") or [], b.get("allowed") or []
        n = min(len(ca), len(cb))
        first = None
        for i in range(n):
            compared += 1
            if ca[i] != cb[i]:
                differ += 1
                if first is None:
                    first = i
        if first is not None:
            cases_differ.append(c["name"])
            if len(examples) < limit:
                prefix = tok.decode(c["tokens"][:first]) if c.get("tokens") else ""
                examples.append({"case": c["name"], "step": first, "structgen": ca[first], peer: cb[first],
                                 "after": prefix[-80:]})
    return {"steps_compared": compared, "steps_differ": differ, "cases_differ": len(cases_differ),
            "case_names": cases_differ[:50], "first_difference_examples": examples}


def _fmt(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return str(x)


def issue_table(report: dict[str, Any]) -> str:
    """The JSON-schema summary as Markdown: per engine, the ratios, the bars."""
    per = report["summary"].get("schema") or {}
    engines = [e for e, s in per.items() if not s.get("unavailable")]
    if not engines:
        return ""
    n = per[engines[0]]["cases"]
    load = report.get("load_average") or {}
    lines = [f"JSON-schema cases: {n} ({report['prep'].get('schema_source', '')}), tokenizer "
             f"{report['tokenizer']} (vocab {report['vocab_size']:,}); forward pass between steps "
             f"{report['forward_ms']:g} ms"
             + (" (structgen looks ahead during it)" if report["forward_ms"] and
                report["args"].get("no_look_ahead") != "True" else "")
             + "; load average (1 min) at start / during (max) / end: "
             f"{_fmt(load.get('start'), 2)} / {_fmt(load.get('max'), 2)} / {_fmt(load.get('end'), 2)} "
             f"on {os.cpu_count()} CPUs", ""]

    def cell(e: str, row: str) -> str:
        s = per[e]
        if row == "compiled":
            rate = s["compile_rate"]
            return f"{s['compiled']}/{s['attempted']} ({_fmt(None if rate is None else 100 * rate)}%)"
        if row == "ttfm":
            return f"{_fmt(s['ttfm_p50_ms'], 2)} / {_fmt(s['ttfm_p99_ms'], 1)}"
        d = s["warm"] if row == "warm" else s["first_pass"]
        qs = ("p50", "p99", "max") if row == "warm" else ("p99", "p999", "max")
        return " / ".join(_fmt(d[f"{q}_us"]) for q in qs)

    lines.append("| | " + " | ".join(engines) + " |")
    lines.append("|---|" + "---:|" * len(engines))
    for row, label in (("compiled", "compiled (rate)"),
                       ("ttfm", "time to first mask (compile + matcher + first mask), p50 / p99, ms"),
                       ("warm", "step (mask + advance), warm, p50 / p99 / max, us"),
                       ("first", "step, first pass over a new grammar, p99 / p99.9 / max, us")):
        lines.append(f"| {label} | " + " | ".join(cell(e, row) for e in engines) + " |")
    rat = report["ratios"].get("schema") or {}
    if rat:
        lines += ["", "Ratios structgen / peer on the cases both compiled (TTFM) and replayed (steps):", "",
                  "| peer | cases (TTFM / first / warm) | TTFM p50 | TTFM p99 | first p99 | first p99.9 "
                  "| first max | warm p50 | warm p99 | warm max |",
                  "|---|---|" + "---:|" * 8]
        for p, r in rat.items():
            keys = ("ttfm_median", "ttfm_p99", "first_pass_p99", "first_pass_p999", "first_pass_max",
                    "warm_p50", "warm_p99", "warm_max")
            lines.append(f"| {p} | {r['cases_compiled_both']} / {r['cases_replayed_both']} / "
                         f"{r['cases_warm_both']} | " + " | ".join(_fmt(r[k], 2) for k in keys) + " |")
    lines += ["", "| bar | verdict | figures |", "|---|---|---|"]
    for b in report.get("bars") or []:
        lines.append(f"| {b['text']} | {b['verdict']} | {b.get('figures', '')} |")
    return "\n".join(lines) + "\n"


def print_report(report: dict[str, Any]) -> None:
    for kind, label in (("schema", "JSON-schema cases"), ("lark", "Lark cases")):
        per = report["summary"].get(kind)
        if not per:
            continue
        print(f"\n== {label} ({report['tokenizer']}, vocab {report['vocab_size']:,}) ==")
        hdr = (f"{'engine':14} {'cases':>5} {'ok':>4} {'fail':>4} {'t/o':>3} {'compile ms':>10} "
               f"{'TTFM med':>9} {'TTFM p90':>9} {'step med us':>11} {'mean us':>9} {'p99 us':>9} "
               f"{'steps':>6} {'allowed':>8} {'rej':>4}")
        print(hdr)
        for eng, s in per.items():
            if s.get("unavailable"):
                print(f"{eng:14} skipped: {s['unavailable']}")
                continue
            fail = s["compile_error"] + s["crash"] + s["n/a"]
            tmo = s["compile_timeout"] + s["replay_timeout"]
            print(f"{eng:14} {s['cases']:5d} {s['ok']:4d} {fail:4d} {tmo:3d} "
                  f"{_fmt(s['compile_median_ms'], 2):>10} "
                  f"{_fmt(s['ttfm_median_ms'], 2):>9} {_fmt(s['ttfm_p90_ms'], 2):>9} "
                  f"{_fmt(s['step_median_us']):>11} {_fmt(s['step_mean_us']):>9} {_fmt(s['step_p99_us']):>9} "
                  f"{s['steps']:6d} {_fmt(s['allowed_per_step_mean'], 0):>8} {s['rejections']:4d}")
        print(f"{'steps, first pass / warm':24} {'p50 us':>15} {'p99 us':>19} {'p99.9 us':>19} "
              f"{'max us':>19}")
        for eng, s in per.items():
            if s.get("unavailable"):
                continue
            f, w = s["first_pass"], s["warm"]
            print(f"{eng:24} " + " ".join(f"{_fmt(f[q + '_us']):>9} /{_fmt(w[q + '_us']):>9}"
                                           for q in ("p50", "p99", "p999", "max"))
                  + (f"  (warm masks differing: {s['warm_mask_differs']})" if s["warm_mask_differs"] else ""))
        rat = report["ratios"].get(kind, {})
        if rat:
            print(f"{'ratio structgen/peer':22} {'cases':>5} {'step med':>9} {'mean':>7} {'p99':>7} "
                  f"{'compile':>8} {'TTFM med':>9} {'TTFM p90':>9} {'TTFM p99':>9} {'warm p50':>9} "
                  f"{'first max':>9}")
            for peer, r in rat.items():
                print(f"  / {peer:18} {r['cases_replayed_both']:5d} {_fmt(r['step_median'], 2):>9} "
                      f"{_fmt(r['step_mean'], 2):>7} {_fmt(r['step_p99'], 2):>7} "
                      f"{_fmt(r['compile_median'], 2):>8} "
                      f"{_fmt(r['ttfm_median'], 2):>9} {_fmt(r['ttfm_p90'], 2):>9} "
                      f"{_fmt(r['ttfm_p99'], 2):>9} "
                      f"{_fmt(r['warm_p50'], 2):>9} {_fmt(r['first_pass_max'], 2):>9}")
        dis = report["disagreements"].get(kind, {})
        for peer, d in dis.items():
            if "n/a" in d:
                print(f"  allowed-count disagreements with {peer}: n/a ({d['n/a']})")
                continue
            print(f"  allowed-count disagreements with {peer}: "
                  f"{d['steps_differ']}/{d['steps_compared']} steps, "
                  f"{d['cases_differ']} cases")
    if report.get("bars"):
        print("\n" + issue_table(report))
    sg = report.get("structgen", {})
    if sg:
        print(f"\nstructgen over the JSON schemas: TTFM median {_fmt(sg.get('ttfm_median_ms'), 2)} ms, "
              f"p90 {_fmt(sg.get('ttfm_p90_ms'), 2)} ms ({sg.get('schemas_compiled')} compiled of "
              f"{sg.get('schemas')}); mask cache after replay: median "
              f"{_fmt(sg.get('mask_cache_median_mb'), 2)} MB, max {_fmt(sg.get('mask_cache_max_mb'), 2)} MB; "
              f"engine tables + cache: median {_fmt(sg.get('engine_median_mb'), 2)} MB, "
              f"max {_fmt(sg.get('engine_max_mb'), 2)} MB; false rejections: {sg.get('false_rejections')}")
        for fr in sg.get("false_rejection_cases", [])[:10]:
            print(f"  FALSE REJECTION {fr['case']} at token {fr['at']} ({fr['how']}): ...{fr['after']!r}")
        for cr in sg.get("crashes", [])[:10]:
            print(f"  CRASH {cr['case']}: {cr['error']}")


def structgen_summary(cases: list[dict[str, Any]], tok: Any) -> dict[str, Any]:
    schema_cases = [c for c in cases if c["kind"] == "schema"]
    ttfm, cache, eng = [], [], []
    false_rej, crashes = [], []
    for c in cases:
        r = c["raw"].get("structgen")
        if not r:
            continue
        if r.get("status") == "crash":
            crashes.append({"case": c["name"], "error": r.get("error"), "traceback": r.get("traceback")})
        if r.get("status") != "ok":
            continue
        if c["kind"] == "schema":
            ttfm.append(r["ttfm_ns"] / 1e6)
            mem = r.get("memory") or {}
            if "mask_cache_bytes" in mem:
                cache.append(mem["mask_cache_bytes"] / 2**20)
            if "engine_bytes" in mem:
                eng.append(mem["engine_bytes"] / 2**20)
        rej = r.get("reject")
        if rej:
            toks = c.get("tokens") or []
            false_rej.append({"case": c["name"], "at": rej["at"], "how": rej["how"],
                              "token": toks[rej["at"]] if rej["at"] < len(toks) else None,
                              "after": tok.decode(toks[: rej["at"]])[-80:],
                              "text": (c.get("text") or "")[:2000]})
        elif r.get("eos_ok") is False:
            false_rej.append({"case": c["name"], "at": len(c.get("tokens") or []),
                              "how": "EOS refused at the end",
                              "after": (c.get("text") or "")[-80:], "text": (c.get("text") or "")[:2000]})
    return {"schemas": len(schema_cases), "schemas_compiled": len(ttfm),
            "ttfm_median_ms": _pct(ttfm, 50), "ttfm_p90_ms": _pct(ttfm, 90),
            "mask_cache_median_mb": _pct(cache, 50), "mask_cache_p90_mb": _pct(cache, 90),
            "mask_cache_max_mb": max(cache) if cache else None,
            "engine_median_mb": _pct(eng, 50), "engine_max_mb": max(eng) if eng else None,
            "memory_source": "Engine.mask_cache_bytes and Engine.memory_bytes() after the replay",
            "false_rejections": len(false_rej), "false_rejection_cases": false_rej, "crashes": crashes}


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="llama3", help="structgen tokenizer alias: llama3, qwen2, mistral")
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help="comma-separated subset of " + ", ".join(ENGINES))
    ap.add_argument("--data", type=Path, default=default_data(), help="JSONSchemaBench folder (*.jsonl)")
    ap.add_argument("--subset", action="append", help="only these subsets (repeatable)")
    ap.add_argument("--limit", type=int, default=10, help="schemas per subset (0: all)")
    ap.add_argument("--sample", type=int, default=None,
                    help="instead of --limit: N schemas drawn (--seed) from all subsets pooled")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grammar", action="append", choices=sorted(LARK_SAMPLES),
                    help="only these Lark grammars")
    ap.add_argument("--no-schemas", action="store_true")
    ap.add_argument("--no-lark", action="store_true")
    ap.add_argument("--candidates", type=int, default=20,
                    help="hypothesis-jsonschema instances tried per schema")
    ap.add_argument("--instance-deadline", type=float, default=10.0, help="seconds of hypothesis per schema")
    ap.add_argument("--max-chars", type=int, default=3000, help="longest instance text kept")
    ap.add_argument("--max-tokens", type=int, default=2000, help="replayed tokens per case (longer: cut)")
    ap.add_argument("--compile-timeout", type=float, default=20.0, help="seconds per compile (worker killed)")
    ap.add_argument("--replay-timeout", type=float, default=120.0, help="seconds per replay after compile")
    ap.add_argument("--threads", type=int, default=1, help="xgrammar and GLRMask compile threads")
    ap.add_argument("--forward-ms", type=float, default=0.0,
                    help="simulated model forward pass (sleep) before every step, not timed")
    ap.add_argument("--no-look-ahead", action="store_true",
                    help="with --forward-ms: structgen does not prepare masks during the forward pass")
    ap.add_argument("--smoke", action="store_true", help="3 schemas + 1 Lark case (CI)")
    ap.add_argument("--out", type=Path, default=None, help="JSON report path")
    ap.add_argument("--md", type=Path, default=None, help="also write the JSON-schema summary as Markdown")
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    if args.smoke:  # the repository's schemas come with a valid instance each
        args.candidates = 0
        # wall-clock limit: generous, so that a loaded CI machine does not time a compile out
        args.compile_timeout = max(args.compile_timeout, 60.0)
    if args.limit == 0:
        args.limit = None
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if args.forward_ms < 0 or (args.sample is not None and args.sample < 1):
        print("--forward-ms must be >= 0 and --sample >= 1", file=sys.stderr)
        return 2
    if bad or "structgen" not in engines:
        print(f"--engines must include structgen and name only {', '.join(ENGINES)} (got {bad or engines})",
              file=sys.stderr)
        return 2
    out = args.out or RESULTS / f"masks-{args.tokenizer}{'-smoke' if args.smoke else ''}.json"
    t_start = time.time()

    opts = {"compile_timeout": args.compile_timeout, "threads": args.threads, "forward_ms": args.forward_ms,
            "look_ahead": not args.no_look_ahead}
    load = {"start": os.getloadavg()[0], "samples": []}
    procs = {e: EngineProc(e, args.tokenizer, opts) for e in engines}
    for p in procs.values():  # set-up runs in the workers while the cases are prepared here
        p.start()
    try:
        from structgen.errors import AssetError

        try:
            tok, vocab = load_vocab(args.tokenizer)
        except AssetError as e:
            print(f"tokenizer {args.tokenizer!r} unavailable: {e}", file=sys.stderr)
            return 2
        cases, prep = build_cases(args, tok, vocab, tuple(sorted({ADAPTERS[e].spelling for e in engines})))
        print(f"{len(cases)} cases ({sum(c['kind'] == 'schema' for c in cases)} schemas, "
              f"{sum(c['kind'] == 'lark' for c in cases)} Lark) prepared in {time.time() - t_start:.0f} s",
              file=sys.stderr)
        engine_info: dict[str, Any] = {}
        for e, p in procs.items():
            ok = p.wait_ready()
            engine_info[e] = {"available": ok, **(p.info or {})}
            if not ok:
                engine_info[e]["unavailable"] = p.unavailable
                print(f"engine {e} skipped: {p.unavailable}", file=sys.stderr)
        if not engine_info["structgen"]["available"]:
            print(f"structgen worker failed: {procs['structgen'].unavailable}", file=sys.stderr)
            return 1
        live = [e for e in engines if engine_info[e]["available"]]
        for i, case in enumerate(cases):
            case["raw"] = {}
            slim = {k: case[k] for k in ("kind", "schema", "grammar", "tokens", "truncated") if k in case}
            k = i % len(live)
            t_case = time.time()
            for e in live[k:] + live[:k]:  # interleaved, the first engine rotating
                sp = ADAPTERS[e].spelling
                mine = slim
                if case["kind"] == "schema" and sp != "compact":  # the instance in its spelling
                    alt = (case.get("spelled") or {}).get(sp) or {}
                    mine = {**slim, "tokens": alt.get("tokens"), "truncated": alt.get("truncated", False)}
                # two passes over the tokens, each with a forward pass before every step
                replay_s = args.replay_timeout + 2 * len(mine.get("tokens") or []) * args.forward_ms / 1e3
                case["raw"][e] = procs[e].run(mine, args.compile_timeout, replay_s)
            if time.time() - t_case > 30:
                states = ", ".join(f"{e}: {r.get('status')}" for e, r in case["raw"].items())
                print(f"  slow case {case['name']} ({time.time() - t_case:.0f} s; {states})", file=sys.stderr)
            if (i + 1) % 10 == 0 or i + 1 == len(cases):
                load["samples"].append(round(os.getloadavg()[0], 2))
                print(f"  {i + 1}/{len(cases)} cases, {time.time() - t_start:.0f} s, "
                      f"load {load['samples'][-1]}", file=sys.stderr)
        for e in live:
            engine_info[e]["worker_restarts"] = procs[e].restarts
    finally:
        for p in procs.values():
            p.close()

    report: dict[str, Any] = {
        "benchmark": "masks", "tokenizer": args.tokenizer, "vocab_size": vocab.vocab_size,
        "args": {k: str(v) for k, v in vars(args).items()}, "engines": engine_info, "prep": prep,
        "forward_ms": args.forward_ms,
        # 1-minute load average at the start, after every 10 cases, at the end; on os.cpu_count()
        "load_average": {"start": load["start"], "samples": load["samples"],
                         "max": max([load["start"], *load["samples"]]), "end": os.getloadavg()[0],
                         "cpus": os.cpu_count()},
        "summary": {}, "ratios": {}, "disagreements": {},
    }
    avail = [e for e in engines if engine_info[e]["available"]]
    for kind in ("schema", "lark"):
        kc = [c for c in cases if c["kind"] == kind]
        if not kc:
            continue
        report["summary"][kind] = {e: (engine_summary(kc, e) if e in avail
                                       else {"unavailable": engine_info[e].get("unavailable")})
                                   for e in engines}
        report["ratios"][kind] = {p: ratios(kc, p, kind) for p in avail if p != "structgen"}
        report["disagreements"][kind] = {p: disagreements(kc, p, tok, kind=kind) for p in avail
                                         if p != "structgen"}
    report["bars"] = bars(report)
    report["structgen"] = structgen_summary(cases, tok)
    report["cases"] = [{"name": c["name"], "kind": c["kind"], "subset": c["subset"],
                        "text_chars": len(c["text"]) if c.get("text") else None,
                        "tokens": len(c["tokens"]) if c.get("tokens") else 0,
                        "truncated": bool(c.get("truncated")), "text": c.get("text"),
                        **({"spelled_tokens": {sp: len(v["tokens"] or []) for sp, v in c["spelled"].items()}}
                           if c.get("spelled") else {}),
                        "engines": {e: case_summary(r) for e, r in c["raw"].items()}} for c in cases]
    report["wall_s"] = round(time.time() - t_start, 1)
    print_report(report)
    envelope_lib.add_peers(envelope, [e for e in engines if engine_info[e]["available"]])
    envelope_lib.write(out, envelope, report, ensure_ascii=False)
    print(f"\nwrote {out} ({report['wall_s']} s)")
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        cmd = " ".join(envelope.get("command") or [])
        args.md.write_text(f"# Token masks: structgen and its peers\n\n`{cmd}` ({envelope.get('date')}, "
                           f"commit {envelope.get('commit')})\n\n" + issue_table(report), encoding="utf-8")
        print(f"wrote {args.md}")
    sg = report["structgen"]
    return 1 if sg["false_rejections"] or sg["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
