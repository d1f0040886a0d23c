"""Prompt prefill on llama.cpp: llama-cpp-python (its defaults) vs structgen's backend.

For each prompt of the extraction tasks (``benchmarks/tasks/extraction.py``, the model's chat
template), the time to evaluate the prompt but its last token (what both engines do before
their first generated token) in llama-cpp-python's ``Llama.eval`` and in structgen's
``LlamaCppLM.extend``, back to back, one thread each. Both use ggml's kernels on the same
weights, so the figures tell how much of a batch-1 run any decoder must spend before its first
token (``benchmarks/results/llamacpp-qwen2.5-coder-0.5b.md``).

    python -m benchmarks.llamacpp_prefill --model qwen2.5-coder-0.5b [--out results.json]
    python -m benchmarks.llamacpp_prefill --smoke --out x.json   # the tests' tiny GGUF, 2 prompts (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from benchmarks.common import envelope as envelope_lib
from benchmarks.tasks.extraction import TASKS, messages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="model alias (its -gguf asset is used)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="the tests' tiny GGUF, 2 prompts (CI)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv)
    from llama_cpp import Llama

    from benchmarks.common import llamacpp_model

    lm, path, _name = llamacpp_model.load(args.model, args.threads, args.smoke)
    peer = Llama(model_path=os.fspath(path), n_ctx=4096, n_threads=args.threads,
                 n_threads_batch=args.threads, verbose=False)
    rows = []
    for task in TASKS[:2] if args.smoke else TASKS:
        ids = lm.tokenizer.apply_chat_template(messages(task), add_generation_prompt=True, tokenize=True)
        peer.reset()
        t0 = time.perf_counter()
        peer.eval(ids[:-1])
        peer_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        lm.reset()
        lm.extend(ids[:-1], all_logits=False)
        ours_s = time.perf_counter() - t0
        rows.append({"task": task["name"], "prompt_tokens": len(ids), "peer_prefill_s": round(peer_s, 3),
                     "structgen_prefill_s": round(ours_s, 3)})
        print(json.dumps(rows[-1]), flush=True)
    summary = {"peer_prefill_s": round(sum(r["peer_prefill_s"] for r in rows), 2),
               "structgen_prefill_s": round(sum(r["structgen_prefill_s"] for r in rows), 2)}
    print(json.dumps(summary))
    if args.out:
        out = {"envelope": envelope, "summary": summary, "rows": rows}
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
