"""Serving benchmark: ``structgen serve`` and llama-cpp-python's server under 1, 4 and 16
concurrent clients, on the transformers model or on the same GGUF file.

Three servers run side by side as subprocesses: ``spec`` (``python -m structgen serve``,
speculative, the default), ``plain`` (``--no-speculative``: plain constrained decoding in the
same continuous batch) and ``llama_cpp.server`` (llama-cpp-python's OpenAI-compatible server,
``benchmarks/common/llamacpp_server.py``, on the model's GGUF: the ``ALIAS-gguf`` twin of ``--model``,
or ``--gguf``). ``--backend`` picks what ``structgen serve`` runs: ``transformers`` (the default:
``--model``, float32, ``OMP_NUM_THREADS`` = ``--threads``) or ``llamacpp`` (``structgen serve
--model FILE.gguf --threads N --ctx-size 4096`` on the very GGUF file llama_cpp.server gets, which
has ``n_threads`` = ``n_threads_batch`` = N and ``n_ctx`` 4096; default model
``qwen2.5-coder-0.5b``, so the ``qwen2.5-coder-0.5b-gguf`` file, Q4_K_M). A load generator (this
process, ``httpx`` async, every request streamed) sends the same request list to each at every
concurrency level (``--concurrency``; default 1,4,16, with ``--backend llamacpp`` 1,16), the
engines interleaved per level and workload. ``--engines`` picks the servers (``llama`` is short
for ``llama_cpp.server``).

Workloads (``--workload``; default ``distinct``, with ``--backend llamacpp`` ``shared,distinct``):
``distinct`` mixes the JSON extraction tasks of ``benchmarks/tasks/extraction.py`` (each its own
short prompt and schema) with a grammar request (a small SQL query); ``shared`` sends the same
extraction tasks behind one long system prompt every request shares (extraction rules and a
tool list, ``benchmarks/tasks/shared_prefix.py``: 494 tokens in Qwen2.5-Coder's tokenizer; the
run records the count in its GGUF's tokenizer), each with its own short user message and its
JSON schema as ``response_format``: the case of issue 38's prefix cache. Every server sees the
shared prompt in its warm-up requests, as a server serving it all day has;
llama_cpp.server reuses the KV state of the prefix it shares with the previous request (its
one ``Llama``), structgen serve its prefix cache.

What llama_cpp.server is sent differs where its API differs, not in the task: its
``response_format`` takes ``{"type": "json_object", "schema": ...}`` (0.3.36 refuses the
``json_schema`` form), and it has no Lark grammars, so the SQL request carries the same
language as a GBNF grammar in its ``grammar`` field. Greedy decoding like ``structgen serve``'s
default (``temperature`` 0, ``repeat_penalty`` 1 instead of its 1.1). Its stream carries no
``usage``: its output tokens are counted as its streamed content chunks (one per sampled token;
the end-of-generation token is not streamed, as it is not counted in ``usage`` either).

Reported per engine, workload and concurrency: requests/s, output tokens/s (completion tokens
from ``usage`` over the level's wall time), time to first token (first content chunk) p50, p95
and p99, inter-token latency (per request: (last chunk - first chunk) / (tokens - 1)) p50/p99,
validity (``jsonschema`` with formats for the JSON requests, Lark's own parser for the grammar
one); per workload the two bars of issue 31: output tokens/s at the highest level over 1 client
(>= 2x at 16), and TTFT p50 there over the idle TTFT p50 at 1 client (<= 3x); per row the
ratios of structgen's servers to llama_cpp.server; whether greedy ``spec`` outputs equal
``plain``'s request by request (``spec_equals_plain``); and with ``--backend llamacpp`` issue
38's bars (``bars.issue38``): output tokens/s of spec over llama_cpp.server >= 1.3x at 1 client
and >= 3x at 16, TTFT p50 of the shared-prefix requests <= 0.3x, every structgen output valid,
greedy spec output identical to plain. TTFT is also reported without the level's first
``concurrency`` requests (``ttft_steady_*``): those arrive all at once and queue behind each
other's prefills, while a later request arrives at a batch already running (the situation of
issue 31's bar: "a request arriving while 15 are running"). Every constraint is compiled on each
structgen server before the timed levels: the figures measure generation, not first compiles
(llama_cpp.server has no grammar cache: it converts each request's schema again, inside TTFT).

    python -m benchmarks.serve                   # smollm2-135m -> benchmarks/results/serve-<model>-cpu.json
    python -m benchmarks.serve --backend llamacpp --max-tokens 128 --requests 6,32
        # -> benchmarks/results/serve-qwen2.5-coder-0.5b-gguf-llamacpp-cpu.json (and .md)
    python -m benchmarks.serve --smoke --out x.json   # tiny random models, 1 and 4 clients (CI)
    python -m benchmarks.serve --smoke --backend llamacpp --out x.json   # the tests' tiny GGUF

In ``--smoke`` llama_cpp.server (and, with ``--backend llamacpp``, structgen serve) runs the tests'
tiny GGUF (``tests/_tiny_gguf.py``), llama_cpp.server when llama-cpp-python and its server's
packages are installed (else it is left out, and the results say so). With the shared envelope
of ``benchmarks/common/envelope.py``; an ``--out`` ending in ``.json`` gets a Markdown summary beside it
(``.md``). State the machine's load (``uptime``) with the figures: the servers and the load
generator share the CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
import httpx
import jsonschema

from benchmarks.common import envelope as envelope_lib
from benchmarks.common.checkout import ROOT, module_command
from benchmarks.tasks.extraction import TASKS, messages
from benchmarks.tasks.shared_prefix import SYSTEM_PROMPT, shared_messages

SQL = ('start: "SELECT " cols " FROM " NAME (" WHERE " NAME " = " NUMBER)?\n'
       'cols: NAME (", " NAME)*\nNAME: /[a-z_]{1,12}/\nNUMBER: /[0-9]{1,4}/\n')
# the same language as GBNF, for llama_cpp.server (llama.cpp's grammar format; no Lark there)
SQL_GBNF = ('root ::= "SELECT " cols " FROM " name (" WHERE " name " = " number)?\n'
            'cols ::= name (", " name)*\nname ::= [a-z_]{1,12}\nnumber ::= [0-9]{1,4}\n')
N_CTX = 4096  # llama_cpp.server's context (structgen serve sizes its own from the model)
SQL_PROMPT = [{"role": "user", "content": "Write one SQL query that selects the name and age columns "
                                          "of table people where id = 7.\nSQL:"}]


WORKLOADS = ("shared", "distinct")


def _requests(count: int, max_tokens: int, workload: str = "distinct") -> list[dict[str, Any]]:
    """``count`` chat requests of ``workload``. ``distinct``: the extraction tasks in turn (each
    its own short system and user message), every fifth a Lark SQL request; ``shared``: the
    extraction tasks in turn behind the shared system prompt of ``benchmarks/tasks/shared_prefix.py``
    (instructions and a tool list), JSON only."""
    out: list[dict[str, Any]] = []
    for i in range(count):
        if workload == "distinct" and i % 5 == 4:
            out.append({"messages": SQL_PROMPT, "max_tokens": max_tokens,
                        "response_format": {"type": "grammar", "grammar": SQL}, "_kind": "grammar"})
        else:
            t = TASKS[i % len(TASKS)]
            out.append({"messages": shared_messages(t) if workload == "shared" else messages(t),
                        "max_tokens": max_tokens, "_kind": "json", "_schema": t["schema"],
                        "response_format": {"type": "json_schema",
                                            "json_schema": {"name": t["name"], "schema": t["schema"]}}})
        out[-1]["_i"] = i
    return out


STRUCTGEN_FLAGS = {"spec": [], "plain": ["--no-speculative"]}
LLAMA = "llama_cpp.server"
ENGINES = (*STRUCTGEN_FLAGS, LLAMA)
ENGINE_ALIASES = {"llama": LLAMA}
BACKENDS = ("transformers", "llamacpp")
DESCRIPTIONS = {
    "spec": "python -m structgen serve (speculative, the default)",
    "plain": "python -m structgen serve --no-speculative",
    LLAMA: "llama-cpp-python's OpenAI-compatible server (llama_cpp.server.app.create_app + uvicorn, "
           "benchmarks/common/llamacpp_server.py: weight repacking off, interrupt_requests off, --threads "
           "threads) on the model's GGUF",
}


def _body(engine: str, req: dict[str, Any]) -> dict[str, Any]:
    """The request ``engine`` is sent: for llama_cpp.server its spelling of the same constraint
    (``json_object`` with a schema, the GBNF grammar) and greedy decoding like structgen's default."""
    body = {k: v for k, v in req.items() if not k.startswith("_")}
    body.update(model="bench", stream=True, stream_options={"include_usage": True})
    if engine == LLAMA:
        if req["_kind"] == "json":
            body["response_format"] = {"type": "json_object", "schema": req["_schema"]}
        else:
            del body["response_format"]
            body["grammar"] = SQL_GBNF
        body.update(temperature=0.0, repeat_penalty=1.0)
    return body


def _valid(req: dict[str, Any], text: str) -> bool:
    try:
        if req["_kind"] == "json":
            jsonschema.validate(json.loads(text), req["_schema"], format_checker=jsonschema.FormatChecker())
        else:
            import lark

            lark.Lark(SQL).parse(text)
        return True
    except Exception:  # noqa: BLE001 - any failure is an invalid output
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve_flags(*flags: str) -> set[str]:
    """Which of ``flags`` ``structgen serve`` takes (read from its ``--help``)."""
    out = subprocess.run([sys.executable, "-m", "structgen", "serve", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    return {f for f in flags if f in out.stdout}


class Server:
    """A server subprocess: ``structgen serve`` (``spec``, ``plain``) or llama_cpp.server.

    ``model``: what ``structgen serve --model`` gets (an alias, a folder, or the .gguf file of
    ``--backend llamacpp``); ``gguf``: llama_cpp.server's .gguf file; ``threads``:
    llama_cpp.server's ``n_threads`` / ``n_threads_batch``, ``structgen serve --threads`` where
    ``serve_threads`` (the llama.cpp backend; with ``--ctx-size`` llama_cpp.server's context) and
    every server's ``OMP_NUM_THREADS``."""

    def __init__(self, name: str, model: str, max_running: int, gguf: str | None = None, *,
                 threads: int = 1, serve_threads: bool = False) -> None:
        self.name = name
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        if name == LLAMA:
            assert gguf is not None
            cmd = module_command("benchmarks.common.llamacpp_server", gguf, "--port", str(self.port),
                                 "--threads", str(threads), "--n-ctx", str(N_CTX))
            # llama.cpp's own kernel choice (structgen's backend turns the tiled one off for
            # itself); no llama_cpp.server config file from the caller's environment
            env = {k: v for k, v in env.items() if k not in ("GGML_CPU_TILED_MM", "CONFIG_FILE")}
            self.ready_path = "/v1/models"
        else:
            cmd = [sys.executable, "-m", "structgen", "serve", "--model", model, "--port", str(self.port),
                   "--log-level", "warning", "--max-running", str(max_running), *STRUCTGEN_FLAGS[name]]
            if serve_threads:
                cmd += ["--threads", str(threads), "--ctx-size", str(N_CTX)]
            self.ready_path = "/health"
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=self.log, env=env)

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"server {self.name} exited: {self.log.read().decode()[-2000:]}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"server {self.name} not ready after {timeout} s")

    def check_alive(self) -> None:
        """Raise, with the end of the server's log, when its process has exited."""
        if self.proc.poll() is not None:
            self.log.seek(0)
            raise RuntimeError(f"server {self.name} exited ({self.proc.returncode}): "
                               f"{self.log.read().decode(errors='replace')[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


async def _one(client: httpx.AsyncClient, url: str, req: dict[str, Any], engine: str) -> dict[str, Any]:
    body = _body(engine, req)
    t0 = time.perf_counter()
    stamps: list[float] = []
    parts: list[str] = []
    usage: dict[str, Any] = {}
    finish = None
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return {"status": r.status_code, "i": req["_i"], "error": (await r.aread()).decode()[:300]}
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for c in chunk.get("choices", []):
                    finish = c.get("finish_reason") or finish
                    text = (c.get("delta") or {}).get("content")
                    if text:
                        stamps.append(time.perf_counter())
                        parts.append(text)
    except httpx.HTTPError as e:  # a dropped connection, a server that died: an error, not a crash
        return {"status": 0, "i": req["_i"], "error": f"{type(e).__name__}: {e}"[:300]}
    t1 = time.perf_counter()
    text = "".join(parts)
    if usage:
        tokens, counted = int(usage.get("completion_tokens", 0)), "usage"
    else:  # llama_cpp.server: one content chunk per sampled token, plus the end token as in usage
        tokens, counted = len(stamps) + (finish == "stop"), "chunks"
    itl = (stamps[-1] - stamps[0]) / (tokens - 1) if len(stamps) > 1 and tokens > 1 else None
    valid = _valid(req, text)
    return {"status": 200, "i": req["_i"], "text": text,
            "ttft": (stamps[0] - t0) if stamps else None, "itl": itl, "latency": t1 - t0,
            "tokens": tokens, "tokens_counted": counted, "finish_reason": finish, "valid": valid,
            "invalid": None if valid else {"kind": req["_kind"], "finish_reason": finish,
                                           "text_tail": text[-300:]},
            "tokens_per_pass": (usage.get("structgen") or {}).get("tokens_per_pass")}


async def _level(url: str, reqs: list[dict[str, Any]], concurrency: int, engine: str) -> dict[str, Any]:
    """Send ``reqs`` with ``concurrency`` clients; the level's figures, and under ``_texts`` every
    answered request's output by request index (the caller removes it before writing)."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for r in reqs:
        queue.put_nowait(r)
    done: list[dict[str, Any]] = []

    started = [0]

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            order = started[0]
            started[0] += 1
            d = await _one(client, url, queue.get_nowait(), engine)
            d["burst"] = order < concurrency  # sent at the start, with every client at once
            done.append(d)

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    ok = [d for d in done if d["status"] == 200]
    tokens = sum(d["tokens"] for d in ok)

    def q(values: list[Any], p: float) -> float | None:
        values = sorted(v for v in values if v is not None)
        if not values:
            return None
        if p == 0.5:
            return round(statistics.median(values), 4)
        return round(values[min(len(values) - 1, int(p * len(values)))], 4)

    ttft = [d["ttft"] for d in ok]
    steady = [d["ttft"] for d in ok if not d["burst"]]
    itl = [d["itl"] for d in ok]
    return {"concurrency": concurrency, "requests": len(done), "ok": len(ok), "wall_s": round(wall, 3),
            "requests_per_s": round(len(ok) / wall, 3), "output_tokens": tokens,
            "output_tokens_per_s": round(tokens / wall, 2),
            "ttft_p50_s": q(ttft, 0.5), "ttft_p95_s": q(ttft, 0.95), "ttft_p99_s": q(ttft, 0.99),
            "ttft_steady_p50_s": q(steady, 0.5), "ttft_steady_p95_s": q(steady, 0.95),
            "ttft_steady_p99_s": q(steady, 0.99),
            "itl_p50_s": q(itl, 0.5), "itl_p99_s": q(itl, 0.99),
            "valid": f"{sum(d['valid'] for d in ok)}/{len(ok)}",
            "output_tokens_counted": sorted({d["tokens_counted"] for d in ok}),
            "finish_reasons": {f: sum(d["finish_reason"] == f for d in ok)
                               for f in sorted({str(d["finish_reason"]) for d in ok})},
            "errors": [d.get("error") for d in done if d["status"] != 200][:3],
            "invalid_outputs": [d["invalid"] for d in ok if d["invalid"]][:3],
            "_texts": {d["i"]: d["text"] for d in ok}}


async def _warm(url: str, count: int, max_tokens: int, engine: str, workloads: list[str]) -> None:
    """Compile every distinct constraint of the run on the server (a 1-token budget gets a 400
    right after the compile, which structgen's server caches; llama_cpp.server generates one
    token), then generate two requests of each workload (the last: ``shared``, when run, so each
    server has seen the shared prefix, as a server serving it all day has)."""
    seen: set[str] = set()
    async with httpx.AsyncClient(timeout=900) as client:
        for req in (r for w in workloads for r in _requests(count, max_tokens, w)):
            key = json.dumps(req["response_format"], sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            body = {**_body(engine, req), "max_tokens": 1, "stream": False}
            body.pop("stream_options")
            try:
                await client.post(url + "/v1/chat/completions", json=body)
            except httpx.HTTPError:  # the caller checks the server is still alive
                pass
    for w in sorted(workloads, key=lambda w: w == "shared"):
        await _level(url, _requests(2, max_tokens, w), 2, engine)


def _smoke_model(folder: Path) -> str:
    from benchmarks.bench_suite import SMOKE_FAVOUR, tiny_model

    lm = tiny_model(favour=SMOKE_FAVOUR)
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return str(folder)


def _llama_missing() -> str | None:
    """Why llama_cpp.server cannot run here (a missing package), or None."""
    import importlib.util

    for mod in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings"):
        if importlib.util.find_spec(mod) is None:
            return (f"{mod} is not installed (llama-cpp-python and its server's packages: "
                    "see benchmarks/README.md)")
    return None


def _gguf_path(args: argparse.Namespace, folder: Path) -> tuple[str, str]:
    """``(path, name)`` of the GGUF llama_cpp.server (and, with ``--backend llamacpp``, ``structgen
    serve``) runs: the tests' tiny GGUF in ``--smoke``, else ``--gguf`` (an alias or a .gguf
    file), else ``--model`` when it is a GGUF, else the ``ALIAS-gguf`` twin of ``--model``."""
    if args.smoke:
        from tests._tiny_gguf import write_tiny_gguf

        return str(write_tiny_gguf(folder / "tiny.gguf", n_ctx=N_CTX)), "tiny-gguf"
    from structgen.assets.store import GGUF_SUFFIX, resolve_model

    model = args.model
    is_gguf = model.endswith((GGUF_SUFFIX, ".gguf"))
    name = args.gguf or (model if is_gguf else model + GGUF_SUFFIX)
    path = Path(name) if name.endswith(".gguf") and Path(name).is_file() else resolve_model(name)
    if path.is_dir():
        raise ValueError(f"{name} is not a GGUF model (give --gguf ALIAS-gguf or a .gguf file)")
    return str(path), Path(name).name


def _prefix_tokens(gguf: str | None) -> int | None:
    """Tokens of the shared system prompt in ``gguf``'s tokenizer (llama.cpp's, vocabulary only), or
    None without llama-cpp-python or a GGUF."""
    if gguf is None:
        return None
    try:
        import llama_cpp

        vocab = llama_cpp.Llama(gguf, vocab_only=True, verbose=False)
        return len(vocab.tokenize(SYSTEM_PROMPT.encode(), add_bos=False, special=False))
    except Exception:  # noqa: BLE001 - a count for the record only
        return None


def _ratios(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """Per row (workload and level), ``a``'s figure over ``b``'s: throughput (higher is better for
    ``a`` above 1) and latency (lower is better for ``a`` below 1)."""
    out: dict[str, list[float | None]] = {}
    for key in ("output_tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s",
                "itl_p50_s", "itl_p99_s"):
        out[key] = [round(x[key] / y[key], 2) if x.get(key) and y.get(key) else None for x, y in zip(a, b)]
    return out


def _scaling(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Issue 31's bars for one engine and workload: the highest level over the first (None with
    one level)."""
    if len(rows) < 2:
        return dict.fromkeys(("throughput_ratio_high_vs_1", "ttft_p50_ratio_high_vs_idle",
                              "ttft_steady_p50_ratio_high_vs_idle"))
    lo, hi = rows[0], rows[-1]
    return {
        "throughput_ratio_high_vs_1": round(hi["output_tokens_per_s"] / lo["output_tokens_per_s"], 2)
        if lo["output_tokens_per_s"] else None,
        "ttft_p50_ratio_high_vs_idle": round(hi["ttft_p50_s"] / lo["ttft_p50_s"], 2)
        if lo["ttft_p50_s"] and hi["ttft_p50_s"] else None,
        "ttft_steady_p50_ratio_high_vs_idle": round(hi["ttft_steady_p50_s"] / lo["ttft_p50_s"], 2)
        if lo["ttft_p50_s"] and hi["ttft_steady_p50_s"] else None,
    }


def _identity(texts: dict[tuple[str, str, int], dict[int, str]]) -> dict[str, Any]:
    """Greedy speculative outputs against plain decoding's on the same backend, request by request
    (same workload, level and request index)."""
    compared = same = 0
    diffs: list[dict[str, Any]] = []
    for (engine, w, c), spec in texts.items():
        if engine != "spec" or ("plain", w, c) not in texts:
            continue
        plain = texts[("plain", w, c)]
        for i in sorted(set(spec) & set(plain)):
            compared += 1
            if spec[i] == plain[i]:
                same += 1
            elif len(diffs) < 5:
                at = next((k for k, (x, y) in enumerate(zip(spec[i], plain[i])) if x != y),
                          min(len(spec[i]), len(plain[i])))
                diffs.append({"workload": w, "concurrency": c, "request": i, "first_diff_char": at,
                              "spec": spec[i][max(0, at - 40):at + 60],
                              "plain": plain[i][max(0, at - 40):at + 60]})
    return {"compared": compared, "identical": same, "differences": diffs}


def _issue38(results: dict[str, list[dict[str, Any]]], identity: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 38's bars, one row per measured case: output tok/s of structgen spec over
    llama_cpp.server at 1 client (>= 1.3x) and at the highest level (stated at 16 clients, >= 3x),
    TTFT p50 of the shared-prefix requests (<= 0.3x, every level), every structgen output valid,
    greedy speculative output identical to plain decoding."""
    out: list[dict[str, Any]] = []

    def bar(name: str, value: float | None, op: str, target: float, **where: Any) -> None:
        met = None if value is None else (value >= target if op == ">=" else value <= target)
        out.append({"bar": name, **where, "value": value, "target": f"{op} {target}", "met": met})

    spec, llama = results.get("spec"), results.get(LLAMA)
    if spec and llama:
        top = max(r["concurrency"] for r in spec)
        for a, b in zip(spec, llama):
            w, c = a["workload"], a["concurrency"]
            tps = round(a["output_tokens_per_s"] / b["output_tokens_per_s"], 2) \
                if b["output_tokens_per_s"] else None
            if c == 1:
                bar("output tok/s, spec / llama_cpp.server, 1 client", tps, ">=", 1.3, workload=w,
                    concurrency=c)
            elif c == top:
                bar(f"output tok/s, spec / llama_cpp.server, {c} clients"
                    + ("" if c == 16 else " (the issue states it at 16)"), tps, ">=", 3.0, workload=w,
                    concurrency=c)
            if w == "shared":
                ttft = round(a["ttft_p50_s"] / b["ttft_p50_s"], 2) if a["ttft_p50_s"] and b["ttft_p50_s"] \
                    else None
                bar(f"TTFT p50 of shared-prefix requests, spec / llama_cpp.server, {c} client(s)", ttft,
                    "<=", 0.3, workload=w, concurrency=c)
    for n in STRUCTGEN_FLAGS:
        if n in results:
            ok = sum(r["ok"] for r in results[n])
            valid = sum(int(r["valid"].split("/")[0]) for r in results[n])
            req = sum(r["requests"] for r in results[n])
            bar(f"valid outputs, {n} ({valid}/{req})", round(valid / req, 4) if req else None, ">=", 1.0,
                answered=f"{ok}/{req}")
    if identity["compared"]:
        bar(f"greedy spec output identical to plain ({identity['identical']}/{identity['compared']})",
            round(identity["identical"] / identity["compared"], 4), ">=", 1.0)
    return out


def _fmt(v: Any, suffix: str = "") -> str:
    return "-" if v is None else f"{v}{suffix}"


def markdown(meta: dict[str, Any], results: dict[str, list[dict[str, Any]]], bars: dict[str, Any],
             envelope: dict[str, Any]) -> str:
    """The run as a short Markdown page: the per-level table, the ratios, issue 38's bars."""
    m = envelope["machine"]
    lines = [f"# Serving: structgen serve vs llama_cpp.server, {meta['model']} ({meta['backend']} backend)",
             "",
             f"{envelope['date']}, commit `{envelope['commit'][:12]}`, {m['cpu']} ({m['cores']} cores, load "
             f"{m['load_average']} at the start); {meta['threads']} thread(s) per server"
             + (f"; GGUF `{meta['gguf']}` for " + ("every server" if meta["backend"] == "llamacpp"
                                                    else LLAMA) if meta.get("gguf") else "")
             + f"; max_tokens {meta['max_tokens']}, greedy, every request streamed, engines interleaved "
             f"per level and workload.", ""]
    if "shared" in meta["workloads"]:
        lines += ["Workload `shared`: every request starts with the same system prompt (extraction rules "
                  f"and a tool list, {_fmt(meta.get('shared_prefix_tokens'))} tokens; "
                  "`benchmarks/tasks/shared_prefix.py`), "
                  "then its own short user message; JSON schema response_format. `distinct`: each request "
                  "its own prompt (extraction tasks, every fifth a Lark SQL grammar).", ""]
    lines += ["| engine | workload | clients | requests | req/s | output tok/s | TTFT p50 (s) | TTFT p95 (s) "
              "| ITL p50 (s) | valid |", "|---|---|---|---|---|---|---|---|---|---|"]
    for n, rows in results.items():
        for r in rows:
            lines.append(f"| {n} | {r['workload']} | {r['concurrency']} | {r['requests']} "
                         f"| {r['requests_per_s']} | {r['output_tokens_per_s']} | {_fmt(r['ttft_p50_s'])} "
                         f"| {_fmt(r['ttft_p95_s'])} | {_fmt(r['itl_p50_s'])} | {r['valid']} |")
    for n in STRUCTGEN_FLAGS:
        key = f"{n}_vs_{LLAMA}"
        if key in bars:
            lines += ["", f"{n} / {LLAMA}, per row:", "",
                      "| workload | clients | output tok/s | TTFT p50 | TTFT p95 |", "|---|---|---|---|---|"]
            for r, tps, t50, t95 in zip(results[n], bars[key]["output_tokens_per_s"], bars[key]["ttft_p50_s"],
                                        bars[key]["ttft_p95_s"]):
                lines.append(f"| {r['workload']} | {r['concurrency']} | {_fmt(tps, 'x')} | {_fmt(t50, 'x')} "
                             f"| {_fmt(t95, 'x')} |")
    if bars.get("issue38"):
        lines += ["", "Issue 38's bars:", "", "| bar | workload | value | target | met |",
                  "|---|---|---|---|---|"]
        for b in bars["issue38"]:
            lines.append(f"| {b['bar']} | {b.get('workload', 'all')} | {_fmt(b['value'])} | {b['target']} "
                         f"| {'-' if b['met'] is None else ('yes' if b['met'] else 'no')} |")
    ident = bars.get("spec_equals_plain")
    if ident and ident["differences"]:
        lines += ["", "First spec/plain differences: " + "; ".join(
            f"{d['workload']} c={d['concurrency']} request {d['request']} at char {d['first_diff_char']}"
            for d in ident["differences"])]
    if meta.get("skipped"):
        lines += ["", "Left out: " + "; ".join(f"{k}: {v}" for k, v in meta["skipped"].items())]
    lines += ["", f"Command: `{' '.join(envelope['command'])}`"]
    return "\n".join(lines) + "\n"


DEFAULT_COUNTS = {1: 8, 4: 16, 16: 32}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=BACKENDS, default="transformers",
                    help="structgen serve's model: transformers (--model, float32) or llamacpp (the GGUF "
                         "llama_cpp.server runs, the same file)")
    ap.add_argument("--model", default=None,
                    help="alias or folder (default smollm2-135m; qwen2.5-coder-0.5b with --backend llamacpp, "
                         "whose ALIAS-gguf twin both servers then run)")
    ap.add_argument("--gguf", default=None,
                    help="the GGUF: an alias or .gguf file (default: the ALIAS-gguf twin of --model)")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads of every server: llama_cpp.server's n_threads and n_threads_batch, "
                         "structgen serve --threads (llamacpp backend), OMP_NUM_THREADS (default 1)")
    ap.add_argument("--workload", default=None,
                    help=f"comma-separated, of {', '.join(WORKLOADS)} (default: distinct; shared,distinct "
                         "with --backend llamacpp)")
    ap.add_argument("--concurrency", default=None,
                    help="comma-separated client counts (default 1,4,16; 1,16 with --backend llamacpp)")
    ap.add_argument("--requests", default=None,
                    help="requests per level, comma-separated like --concurrency (default 8 at 1 client, "
                         "16 at 4, 32 at 16, else twice the clients)")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--engines", default=None,
                    help=f"comma-separated, of {', '.join(ENGINES)} ('llama' for short; default: all three, "
                         f"{LLAMA} left out when llama-cpp-python's server is not installed)")
    ap.add_argument("--smoke", action="store_true", help="tiny random models, 1 and 4 clients (CI)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    gguf_backend = args.backend == "llamacpp"
    if args.model is None:
        args.model = "qwen2.5-coder-0.5b" if gguf_backend else "smollm2-135m"
    workloads = list(dict.fromkeys((args.workload or ("shared,distinct" if gguf_backend else "distinct"))
                                   .split(",")))
    if not workloads or any(w not in WORKLOADS for w in workloads):
        ap.error(f"--workload: of {', '.join(WORKLOADS)}")
    levels = [int(x) for x in ("1,4" if args.smoke else args.concurrency or ("1,16" if gguf_backend
                                                                               else "1,4,16")).split(",")]
    counts = [int(x) for x in args.requests.split(",")] if args.requests else \
        [3 if c == 1 else 6 for c in levels] if args.smoke else [DEFAULT_COUNTS.get(c, 2 * c) for c in levels]
    if len(counts) != len(levels):
        ap.error("--requests needs one count per --concurrency level")
    names = [ENGINE_ALIASES.get(e, e) for e in (args.engines or ",".join(ENGINES)).split(",") if e]
    unknown = [e for e in names if e not in ENGINES]
    if unknown or not names:
        ap.error(f"--engines: unknown engine {', '.join(unknown) or '(none given)'} "
                 f"(of {', '.join(ENGINES)})")
    names = list(dict.fromkeys(names))
    skipped: dict[str, str] = {}
    if gguf_backend:
        import importlib.util

        if importlib.util.find_spec("llama_cpp") is None:
            ap.error("--backend llamacpp: llama-cpp-python is not installed (the llamacpp extra)")
    if LLAMA in names and (why := _llama_missing()):
        if args.engines:
            ap.error(f"--engines {LLAMA}: {why}")
        names.remove(LLAMA)
        skipped[LLAMA] = why
        print(f"{LLAMA} left out: {why}", flush=True)
    if not names:
        ap.error("no engine left to run")
    tmp = tempfile.TemporaryDirectory()
    gguf = gguf_name = None
    if LLAMA in names or gguf_backend:
        try:
            gguf, gguf_name = _gguf_path(args, Path(tmp.name))
        except Exception as e:  # noqa: BLE001 - an uncached alias, a missing file, no gguf package
            if args.engines or gguf_backend:
                ap.error(f"the GGUF: {e}")
            names.remove(LLAMA)
            skipped[LLAMA] = f"no GGUF: {e}"
            print(f"{LLAMA} left out: no GGUF: {e}", flush=True)
    structgen_names = [n for n in names if n in STRUCTGEN_FLAGS]
    serve_threads = False
    if gguf_backend and structgen_names:
        serve_threads = _serve_flags("--threads", "--ctx-size") == {"--threads", "--ctx-size"}
        if not serve_threads:
            print("warning: structgen serve has no --threads / --ctx-size flag: it runs llama.cpp's "
                  f"default thread count, not {args.threads}", flush=True)
    if gguf_backend:
        model = str(gguf)
    elif args.smoke and structgen_names:
        model = _smoke_model(Path(tmp.name) / "tiny")
    else:
        model = args.model
    # the tiny GGUF's small vocabulary spells the shortest extraction outputs in up to ~140 tokens
    max_tokens = (256 if gguf_backend else 128) if args.smoke else args.max_tokens
    # counted before tmp (the smoke's GGUF) goes
    prefix_tokens = _prefix_tokens(gguf) if "shared" in workloads else None
    servers = {n: Server(n, model, max_running=max(levels), gguf=gguf, threads=args.threads,
                         serve_threads=serve_threads) for n in names}
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    texts: dict[tuple[str, str, int], dict[int, str]] = {}
    width = max(len(n) for n in names)
    try:
        for s in servers.values():
            s.wait_ready()
        for n, s in servers.items():  # compile every constraint once (the compile cache), warm the model
            asyncio.run(_warm(s.url, max(counts), max_tokens, n, workloads))
            s.check_alive()
        turn = 0
        for c, n_req in zip(levels, counts):
            for w in workloads:
                reqs = _requests(n_req, max_tokens, w)
                order = names if turn % 2 == 0 else list(reversed(names))
                turn += 1
                for n in order:
                    r = {"workload": w, **asyncio.run(_level(servers[n].url, reqs, c, n))}
                    servers[n].check_alive()
                    texts[(n, w, c)] = r.pop("_texts")
                    results[n].append(r)
                    print(f"{n:{width}s} {w:8s} c={c:2d}: {r['output_tokens_per_s']:7.1f} tok/s  "
                          f"{r['requests_per_s']:.2f} req/s  "
                          f"TTFT p50 {r['ttft_p50_s']} p95 {r['ttft_p95_s']} "
                          f"steady p50 {r['ttft_steady_p50_s']}  "
                          f"ITL p50 {r['itl_p50_s']} p99 {r['itl_p99_s']}  "
                          f"valid {r['valid']}", flush=True)
    finally:
        for s in servers.values():
            s.stop()
        tmp.cleanup()
    # results[n]: a workload's rows level by level, then the next workload's (they ran level by
    # level, the workloads in turn); the same order for every engine, so the ratio lists line up
    for rows in results.values():
        rows.sort(key=lambda r: (workloads.index(r["workload"]), levels.index(r["concurrency"])))
    bars: dict[str, Any] = {n: {w: _scaling([r for r in rows if r["workload"] == w]) for w in workloads}
                            for n, rows in results.items()}
    if "spec" in results and "plain" in results:
        bars["spec_vs_plain_tokens_per_s"] = [
            round(a["output_tokens_per_s"] / b["output_tokens_per_s"], 2)
            if b["output_tokens_per_s"] else None
            for a, b in zip(results["spec"], results["plain"])]
    for n in STRUCTGEN_FLAGS:  # per row: structgen's server over llama_cpp.server
        if n in results and LLAMA in results:
            bars[f"{n}_vs_{LLAMA}"] = _ratios(results[n], results[LLAMA])
    identity = _identity(texts)
    bars["spec_equals_plain"] = identity
    if gguf_backend:
        bars["issue38"] = _issue38(results, identity)
    print(json.dumps({k: v for k, v in bars.items() if k != "spec_equals_plain"}))
    print(f"spec == plain (greedy): {identity['identical']}/{identity['compared']}")
    if LLAMA in results:
        envelope_lib.add_peers(envelope, ["llama-cpp-python", "sse-starlette", "starlette-context",
                                       "pydantic-settings", "uvicorn"])
    elif gguf_backend:
        envelope_lib.add_peers(envelope, ["llama-cpp-python"])
    meta: dict[str, Any] = {
        "model": ("tiny-gguf" if gguf_backend else "tiny-random") if args.smoke else
        (gguf_name if gguf_backend else args.model),
        "backend": args.backend, "threads": args.threads, "workloads": workloads, "levels": levels,
        "requests": counts, "rows": [[r["workload"], r["concurrency"]] for r in next(iter(results.values()))],
        "max_tokens": max_tokens, "mode": "smoke" if args.smoke else "full",
        "engines": {n: DESCRIPTIONS[n] for n in names}, "gguf": gguf_name}
    if structgen_names:
        meta["structgen_serve"] = {
            "model": "the GGUF file llama_cpp.server runs" if gguf_backend else meta["model"],
            "threads": (args.threads if serve_threads else "llama.cpp's default (structgen serve has no "
                        "--threads flag)") if gguf_backend else f"OMP_NUM_THREADS={args.threads}"}
        if gguf_backend and serve_threads:
            meta["structgen_serve"]["ctx_size"] = N_CTX
    if "shared" in workloads:
        meta["shared_prefix_tokens"] = prefix_tokens
        meta["shared_prefix"] = ("the same system message (benchmarks/tasks/shared_prefix.py: extraction "
                                 "rules and a tool list) first in every request; shared_prefix_tokens: its "
                                 "tokens in the GGUF's tokenizer; each server saw it in its warm-up requests")
    if LLAMA in results:
        meta[LLAMA] = {
            "gguf": gguf_name, "threads": args.threads, "n_ctx": N_CTX,
            "json_requests": 'response_format {"type": "json_object", "schema": ...} (0.3.36 refuses '
                             '{"type": "json_schema"})',
            "grammar_requests": "the SQL grammar as GBNF in the request's grammar field (no Lark); "
                                "validated by the same Lark parser as the other engines",
            "decoding": "temperature 0, repeat_penalty 1.0 (greedy, like structgen serve's default)",
            "output_tokens": "streamed content chunks (one per sampled token) + 1 for an end token "
                             "(finish_reason stop), as structgen's usage counts it: its stream has no usage",
            "prefix_reuse": "llama-cpp-python's own: a request reuses the KV state of the longest prefix "
                            "it shares with the previous request's tokens (one Llama, one sequence); no "
                            "prompt cache (its default)",
        }
    if skipped:
        meta["skipped"] = skipped
    out = args.out
    if out is None and not args.smoke:
        out = ROOT / "benchmarks" / "results" / (
            f"serve-{Path(args.model).name.removesuffix('.gguf').removesuffix('-gguf')}-gguf-llamacpp-cpu.json"
            if gguf_backend else f"serve-{args.model}-cpu.json")
    if out is not None:
        envelope_lib.write(out, envelope, {"meta": meta, "results": results, "bars": bars})
        print(f"wrote {out}")
        if out.suffix == ".json":
            out.with_suffix(".md").write_text(markdown(meta, results, bars, envelope), encoding="utf-8")
            print(f"wrote {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
