"""llama-cpp-python with its own JSON-schema grammar, as a peer engine of ``benchmarks/generate.py``.

The peer runs in a child process of its own (one per engine), so that it sees llama.cpp as a
user's process would, with llama-cpp-python's defaults: weight repacking (llama.cpp's extra
CPU buffer types: faster kernels whose results depend on the number of positions per pass,
which structgen's backend leaves off for exactness) is on unless ``repack=False``. With
repacking, ``llama_decode`` crashed (SIGSEGV) on an AVX-512/AMX Xeon for SmolLM2 Q4_1 and
Qwen2.5 Q4_K_M, in llama-cpp-python's own ``Llama`` too: there, run the peer without it
(``python -m benchmarks.generate --peer-repack off``). A crash of the peer (llama.cpp also aborts on
some grammar + draft combinations) costs the task, not the benchmark: the child is restarted
for the next task.

Engines: ``grammar`` (``LlamaGrammar.from_json_schema`` + ``create_completion``, greedy) and
``lookup`` (the same plus ``LlamaPromptLookupDecoding``, llama-cpp-python's prompt-lookup
speculative decoding). Timing: grammar construction plus generation, measured in the child.

    python -m benchmarks.common.llamacpp_peer MODEL.gguf THREADS ENGINE [on|off]   # the child (repack)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from benchmarks.common.checkout import child_env, module_command

ENGINES = ("grammar", "lookup")


def no_repack() -> None:
    """Make ``llama_model_default_params`` (what ``llama_cpp.Llama`` starts from) turn weight
    repacking off, for this process."""
    import llama_cpp.llama_cpp as low_level

    default_params = low_level.llama_model_default_params

    def params_without_repacking() -> Any:
        params = default_params()
        params.use_extra_bufts = False
        return params

    low_level.llama_model_default_params = params_without_repacking


def _serve(model_path: str, threads: int, engine: str, repack: bool = True) -> None:
    """Child: read one JSON request per line, answer one JSON line each."""
    from llama_cpp import Llama, LlamaGrammar

    if not repack:
        no_repack()
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(num_pred_tokens=10) if engine == "lookup" else None
    llm = Llama(model_path=model_path, n_ctx=4096, n_threads=threads, n_threads_batch=threads,
                draft_model=draft, verbose=False)
    out = sys.stdout
    sys.stdout = sys.stderr  # llama-cpp-python's chatter must not reach the answer pipe
    for line in sys.stdin:
        req = json.loads(line)
        try:
            t0 = time.perf_counter()
            grammar = LlamaGrammar.from_json_schema(json.dumps(req["schema"]), verbose=False)
            t1 = time.perf_counter()
            llm.reset()
            r = llm.create_completion(req["prompt_ids"], max_tokens=req["max_new"], temperature=0.0,
                                      top_k=1, repeat_penalty=1.0, grammar=grammar)
            t2 = time.perf_counter()
            choice = r["choices"][0]
            ans = {"text": choice["text"], "new_tokens": int(r["usage"]["completion_tokens"]),
                   "complete": choice["finish_reason"] == "stop", "finish_reason": choice["finish_reason"],
                   "wall_s": t2 - t0, "grammar_s": t1 - t0}
        except Exception as e:  # a grammar llama.cpp refuses: the task fails, the peer goes on
            ans = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(ans) + "\n")
        out.flush()


class Peer:
    """A child process running one llama-cpp-python engine on ``model_path``."""

    def __init__(self, model_path: str | os.PathLike[str], threads: int, engine: str, *,
                 repack: bool = True) -> None:
        if engine not in ENGINES:
            raise ValueError(f"unknown llama-cpp-python engine {engine!r}")
        self.args = module_command("benchmarks.common.llamacpp_peer", os.fspath(model_path), str(threads),
                                   engine, "on" if repack else "off")
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        return subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env=child_env())

    def run(self, prompt_ids: list[int], schema: dict[str, Any], max_new: int) -> dict[str, Any]:
        """One greedy generation; ``{"error": ...}`` when the engine failed or crashed."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        req = {"prompt_ids": prompt_ids, "schema": schema, "max_new": max_new}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            self.proc = None
            return {"error": f"llama-cpp-python crashed (exit status {rc})"}
        return json.loads(line)

    def close(self) -> None:
        """End the child process."""
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        self.proc = None


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), sys.argv[3], repack=sys.argv[4:5] != ["off"])
