"""Generation benchmark: speculative vs plain constrained decoding vs peers, same run.

For each JSON extraction task (``benchmarks/tasks/extraction.py``: prompts that contain the
facts, schemas with 5-30 fields, nested objects, arrays, enums), greedy, batch 1:

* ``plain``  -- ``structgen.generate(..., speculative=False)`` (the baseline);
* ``spec``   -- ``structgen.generate(..., speculative=True)`` (grammar-forced + prompt lookup
  drafts, optionally ``--draft-model``);
* ``xgrammar`` -- transformers ``generate`` with XGrammar's logits processor (if installed);
* ``outlines`` -- outlines' transformers integration (if installed).

``--backend llamacpp`` runs ``plain`` and ``spec`` on the model's GGUF (``ALIAS-gguf``) with
structgen's llama.cpp backend, and the engines default to the llama.cpp peers:

* ``llama-grammar`` -- llama-cpp-python with its own grammar (``LlamaGrammar.from_json_schema``),
  greedy, same GGUF, in a child process with llama-cpp-python's defaults
  (``benchmarks/common/llamacpp_peer.py``);
* ``llama-lookup`` -- the same plus llama-cpp-python's prompt-lookup decoding;
* ``hf-spec`` -- structgen speculative on transformers (the model alias, ``--hf-dtype``,
  default bfloat16).

Every engine uses ``--threads`` threads (llama.cpp's threads, torch's threads).

The engine runners and the oracles are shared with the full suite (``benchmarks/bench_suite.py``,
``structgen bench``), which also covers code and prose tasks.

Rounds are interleaved (each task runs every engine before the next task) so machine noise
hits all engines alike. Reports per engine: wall time, new tokens, tokens per target forward
pass, draft acceptance (accepted / proposed draft tokens), validity (jsonschema), task
success (exact match with the reference answer), and the speed ratio against ``plain`` and
the peers. Also checks that greedy ``spec`` output is token-identical to ``plain``.

    python -m benchmarks.generate --model qwen2.5-coder-0.5b --out benchmarks/results/generate.json
    python -m benchmarks.generate --smoke        # tiny random model, 2 tasks (CI)
    python -m benchmarks.generate --backend llamacpp --model qwen2.5-coder-0.5b --out ...
    python -m benchmarks.generate --backend llamacpp --smoke   # tiny GGUF, plain and spec (CI)

``--out`` writes the figures and every task's result with the shared envelope of
``benchmarks/common/envelope.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from benchmarks import bench_suite as bench
from benchmarks.common import envelope as envelope_lib
from benchmarks.tasks.extraction import TASKS, messages
from structgen.config import SpecConfig
from structgen.generation.model import CausalLM, load_model, stock_copy


def _task(task: dict[str, Any]) -> dict[str, Any]:
    return {**task, "type": "json", "messages": messages(task)}


def run_structgen(lm: CausalLM, task: dict[str, Any], *, speculative: bool, max_new: int,
                  cfg: SpecConfig, draft: Any) -> dict[str, Any]:
    return bench.run_structgen(lm, _task(task), speculative=speculative, max_new=max_new, cfg=cfg,
                               draft=draft)


def run_xgrammar(lm: CausalLM, task: dict[str, Any], max_new: int, state: dict[str, Any]) -> dict[str, Any]:
    return bench.run_xgrammar(lm, _task(task), max_new, state)


def run_outlines(lm: CausalLM, task: dict[str, Any], max_new: int, state: dict[str, Any]) -> dict[str, Any]:
    return bench.run_outlines(lm, _task(task), max_new, state)


LLAMACPP_ENGINES = "plain,spec,llama-grammar,llama-lookup,hf-spec"


def run_llamacpp_peer(peer: Any, lm: Any, task: dict[str, Any], max_new: int) -> dict[str, Any]:
    """One llama-cpp-python generation on the prompt tokens structgen feeds its own engines."""
    t = _task(task)
    ids = list(lm.tokenizer.encode(bench.prompt_text(lm, t["messages"]), add_special_tokens=False))
    r = peer.run(ids, task["schema"], max_new)
    if "error" in r:
        print(f"[llama.cpp peer] {task['name']}: {r['error']}", file=sys.stderr)
        return {"text": "", "tokens": [], "wall_s": 0.0, "new_tokens": 0, "complete": False,
                "error": r["error"]}
    return {**r, "tokens": []}


def check(task: dict[str, Any], text: str) -> tuple[bool, bool]:
    c = bench.check_output(_task(task), text, None)
    return c["valid"], bool(c["quality"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--draft-model", default=None)
    ap.add_argument("--tasks", type=int, default=len(TASKS))
    ap.add_argument("--max-new-tokens", type=int, default=400)
    ap.add_argument("--engines", default=None,
                    help="default: plain,spec,xgrammar,outlines (transformers) or "
                    f"{LLAMACPP_ENGINES} (llamacpp)")
    ap.add_argument("--backend", choices=("transformers", "llamacpp"), default="transformers",
                    help="llamacpp: plain and spec on the model's GGUF (ALIAS-gguf) run by llama.cpp")
    ap.add_argument("--peer-repack", choices=("on", "off"), default="on",
                    help="llama-cpp-python peers: weight repacking (its default: on; off where it crashes)")
    ap.add_argument("--hf-dtype", default="bfloat16", help="weights of the hf-spec engine (llamacpp backend)")
    ap.add_argument("--dtype", default="float32", help="model weights: float32, bfloat16, auto "
                    "(all engines use the same loaded model)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    torch.set_num_threads(args.threads)
    llamacpp = args.backend == "llamacpp"
    engines = (args.engines or (LLAMACPP_ENGINES if llamacpp else "plain,spec,xgrammar,outlines")).split(",")
    gguf_path = None
    if args.smoke:
        args.tasks, args.max_new_tokens = 2, 48
        engines = [e for e in engines if e in ("plain", "spec")]
    if llamacpp:
        from benchmarks.common import llamacpp_model

        lm, gguf_path, _name = llamacpp_model.load(args.model, args.threads, args.smoke)
    elif args.smoke:
        lm = bench.tiny_model()
    else:
        lm = load_model(args.model, dtype=args.dtype)
    draft = load_model(args.draft_model, dtype=args.dtype) if args.draft_model else None
    peers: dict[str, Any] = {}
    if llamacpp:
        from benchmarks.common.llamacpp_peer import Peer

        peers = {e: Peer(gguf_path, args.threads, e.split("-", 1)[1], repack=args.peer_repack == "on")
                 for e in engines if e in ("llama-grammar", "llama-lookup")}
    hf_lm = None
    if "hf-spec" in engines:
        hf_lm = load_model(args.model.removesuffix("-gguf"), dtype=args.hf_dtype)
    peer_lm = lm
    hf_peers = any(e in engines for e in ("xgrammar", "outlines"))
    if not llamacpp and getattr(lm, "row_invariant", False) and hf_peers:
        # the peers get the model as a user would load it (structgen's row-invariant forward
        # is its own; a copy keeps it out of the peers' measurements)
        peer_lm = CausalLM(stock_copy(lm.model), lm.tokenizer, row_invariant=False)
    cfg = SpecConfig()
    results: dict[str, list[dict[str, Any]]] = {e: [] for e in engines}
    peer_state: dict[str, dict[str, Any]] = {e: {} for e in engines}
    identical = 0
    tasks = TASKS[: args.tasks]
    # warm-up (compiles, caches, first-call overheads) on the first task, not timed
    run_structgen(lm, tasks[0], speculative=True, max_new=8, cfg=cfg, draft=draft)
    if hf_lm is not None:
        run_structgen(hf_lm, tasks[0], speculative=True, max_new=8, cfg=cfg, draft=None)
    for peer in peers.values():  # loads the model in the child
        run_llamacpp_peer(peer, lm, tasks[0], 8)
    for task in tasks:
        for e in engines:
            try:
                if e == "plain":
                    r = run_structgen(lm, task, speculative=False, max_new=args.max_new_tokens, cfg=cfg,
                                      draft=None)
                elif e == "spec":
                    r = run_structgen(lm, task, speculative=True, max_new=args.max_new_tokens, cfg=cfg,
                                      draft=draft)
                elif e == "xgrammar":
                    r = run_xgrammar(peer_lm, task, args.max_new_tokens, peer_state[e])
                elif e == "outlines":
                    r = run_outlines(peer_lm, task, args.max_new_tokens, peer_state[e])
                elif e in peers:
                    r = run_llamacpp_peer(peers[e], lm, task, args.max_new_tokens)
                elif e == "hf-spec" and hf_lm is not None:
                    r = run_structgen(hf_lm, task, speculative=True, max_new=args.max_new_tokens, cfg=cfg,
                                      draft=None)
                else:
                    raise SystemExit(f"unknown engine {e}")
            except ImportError as exc:
                print(f"[{e}] skipped: {exc}", file=sys.stderr)
                engines = [x for x in engines if x != e]
                continue
            r["valid"], r["success"] = check(task, r["text"])
            r["task"] = task["name"]
            results[e].append(r)
            print(f"{task['name']:12} {e:9} {r['wall_s']:7.2f}s tokens={r['new_tokens']:4d} "
                  f"passes={r.get('forward_passes', '-')} valid={r['valid']} success={r['success']}",
                  file=sys.stderr)
        if "plain" in results and "spec" in results and results["plain"] and results["spec"]:
            identical += int(results["plain"][-1]["tokens"] == results["spec"][-1]["tokens"])

    summary: dict[str, Any] = {}
    for e, rs in results.items():
        if not rs:
            continue
        wall = sum(r["wall_s"] for r in rs)
        toks = sum(r["new_tokens"] for r in rs)
        s = {"tasks": len(rs), "wall_s": wall, "new_tokens": toks,
             "tokens_per_s": toks / wall if wall else 0.0,
             "errors": sum("error" in r for r in rs), "complete": sum(bool(r.get("complete")) for r in rs),
             "valid": sum(r["valid"] for r in rs), "success": sum(r["success"] for r in rs),
             "median_task_s": statistics.median(r["wall_s"] for r in rs)}
        if "forward_passes" in rs[0]:
            passes = sum(r["forward_passes"] for r in rs)
            drafted = sum(r["drafted"] for r in rs)
            s["forward_passes"] = passes
            s["tokens_per_pass"] = toks / passes if passes else None
            s["acceptance"] = sum(r["accepted"] for r in rs) / drafted if drafted else None
            per: dict[str, dict[str, int]] = {}
            for r in rs:
                for name, d in r["drafters"].items():
                    p = per.setdefault(name, {"proposed": 0, "accepted": 0})
                    p["proposed"] += d["proposed"]
                    p["accepted"] += d["accepted"]
            s["drafters"] = {k: {**v, "acceptance": v["accepted"] / v["proposed"] if v["proposed"] else None}
                             for k, v in per.items()}
            s["time_split"] = {k: sum(r["time"][k] for r in rs) for k in rs[0]["time"]}
        summary[e] = s
    if "spec" in summary:
        for e in summary:
            if e != "spec":
                summary["spec"][f"speedup_vs_{e}"] = summary[e]["wall_s"] / summary["spec"]["wall_s"]
                if summary[e]["tokens_per_s"]:
                    summary["spec"][f"tokens_per_s_vs_{e}"] = (summary["spec"]["tokens_per_s"]
                                                               / summary[e]["tokens_per_s"])
    summary["identical_greedy_outputs"] = f"{identical}/{len(tasks)}"
    for peer in peers.values():
        peer.close()
    envelope_lib.add_peers(envelope, [e for e, rs in results.items() if rs and e in ("xgrammar", "outlines")])
    if llamacpp:
        envelope_lib.add_peers(envelope, ["llama_cpp_python"])
    meta = {"cpu_threads": torch.get_num_threads(), "backend": args.backend,
            "model": ("tiny-gguf" if llamacpp else "tiny-random") if args.smoke else args.model,
            "dtype": "gguf" if llamacpp else str(lm.model.dtype),
            "hf_dtype": args.hf_dtype if hf_lm is not None else None,
            "peer_repack": args.peer_repack if peers else None,
            "draft_model": args.draft_model,
            "max_new_tokens": args.max_new_tokens}
    print(json.dumps({"meta": meta, "summary": summary}, indent=1))
    if args.out:
        envelope_lib.write(args.out, envelope, {"meta": meta, "summary": summary, "results": results})
    if "plain" in summary and "spec" in summary and identical != len(tasks):
        print("ERROR: speculative greedy output differs from plain", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
