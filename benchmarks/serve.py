"""Serving benchmark: ``structgen serve`` and llama-cpp-python's server under 1, 4 and 16
concurrent clients.

Three servers run side by side as subprocesses, on the same model: ``spec`` (``python -m
structgen serve``, speculative, the default), ``plain`` (``--no-speculative``: plain
constrained decoding in the same continuous batch) and ``llama_cpp.server`` (llama-cpp-python's
OpenAI-compatible server, ``benchmarks/_llamacpp_server.py``, on the model's GGUF: the
``ALIAS-gguf`` twin of ``--model``, or ``--gguf``). A load generator (this process, ``httpx``
async, every request streamed) sends the same request list to each at concurrency 1, 4 and 16,
the engines interleaved per concurrency level. The requests mix the JSON extraction tasks of
``benchmarks/tasks/extraction.py`` (each its own schema) with a grammar request (a small SQL
query). ``--engines`` picks the servers (``llama`` is short for ``llama_cpp.server``).

What llama_cpp.server is sent differs where its API differs, not in the task: its
``response_format`` takes ``{"type": "json_object", "schema": ...}`` (0.3.36 refuses the
``json_schema`` form), and it has no Lark grammars, so the SQL request carries the same
language as a GBNF grammar in its ``grammar`` field. Greedy decoding like ``structgen serve``'s
default (``temperature`` 0, ``repeat_penalty`` 1 instead of its 1.1). Its stream carries no
``usage``: its output tokens are counted as its streamed content chunks (one per sampled token;
the end-of-generation token is not streamed, as it is not counted in ``usage`` either).

Reported per engine and concurrency: requests/s, output tokens/s (completion tokens from
``usage`` over the level's wall time), time to first token (first content chunk) and
inter-token latency (per request: (last chunk - first chunk) / (tokens - 1)) p50/p99, validity
(``jsonschema`` with formats for the JSON requests, Lark's own parser for the grammar one), and
the two bars of issue 31: output tokens/s at 16 clients over 1 client (>= 2x), and TTFT p50 at
16 clients over the idle TTFT p50 at 1 client (<= 3x); and per level the ratios of structgen's
servers to llama_cpp.server. TTFT is also reported without the
level's first ``concurrency`` requests (``ttft_steady_*``): those arrive all at once and queue
behind each other's prefills, while a later request arrives at a batch already running (the
situation of the bar: "a request arriving while 15 are running"). Every constraint is compiled on each
structgen server before the timed levels: the figures measure generation, not first compiles
(llama_cpp.server has no grammar cache: it converts each request's schema again, inside TTFT).

    python benchmarks/serve.py                   # smollm2-135m -> benchmarks/results/serve-<model>-cpu.json
    python benchmarks/serve.py --smoke --out x.json   # tiny random models, 1 and 4 clients (CI)

In ``--smoke`` llama_cpp.server runs the tests' tiny GGUF (``tests/_tiny_gguf.py``), when
llama-cpp-python and its server's packages are installed (else it is left out, and the results
say so). With the shared envelope of ``benchmarks/_envelope.py``. State the machine's load
(``uptime``) with the figures: the servers and the load generator share the CPU.
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
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import _envelope  # noqa: E402
import httpx  # noqa: E402
import jsonschema  # noqa: E402
from tasks.extraction import TASKS, messages  # noqa: E402

SQL = ('start: "SELECT " cols " FROM " NAME (" WHERE " NAME " = " NUMBER)?\n'
       'cols: NAME (", " NAME)*\nNAME: /[a-z_]{1,12}/\nNUMBER: /[0-9]{1,4}/\n')
# the same language as GBNF, for llama_cpp.server (llama.cpp's grammar format; no Lark there)
SQL_GBNF = ('root ::= "SELECT " cols " FROM " name (" WHERE " name " = " number)?\n'
            'cols ::= name (", " name)*\nname ::= [a-z_]{1,12}\nnumber ::= [0-9]{1,4}\n')
SQL_PROMPT = [{"role": "user", "content": "Write one SQL query that selects the name and age columns "
                                          "of table people where id = 7.\nSQL:"}]


def _requests(count: int, max_tokens: int) -> list[dict[str, Any]]:
    """``count`` chat requests: the extraction tasks in turn, every fifth a Lark SQL request."""
    out = []
    for i in range(count):
        if i % 5 == 4:
            out.append({"messages": SQL_PROMPT, "max_tokens": max_tokens,
                        "response_format": {"type": "grammar", "grammar": SQL}, "_kind": "grammar"})
            continue
        t = TASKS[i % len(TASKS)]
        out.append({"messages": messages(t), "max_tokens": max_tokens, "_kind": "json",
                    "_schema": t["schema"],
                    "response_format": {"type": "json_schema",
                                        "json_schema": {"name": t["name"], "schema": t["schema"]}}})
    return out


STRUCTGEN_FLAGS = {"spec": [], "plain": ["--no-speculative"]}
LLAMA = "llama_cpp.server"
ENGINES = (*STRUCTGEN_FLAGS, LLAMA)
ENGINE_ALIASES = {"llama": LLAMA}
DESCRIPTIONS = {
    "spec": "python -m structgen serve (speculative, the default)",
    "plain": "python -m structgen serve --no-speculative",
    LLAMA: "llama-cpp-python's OpenAI-compatible server (llama_cpp.server.app.create_app + uvicorn, "
           "benchmarks/_llamacpp_server.py: weight repacking off, interrupt_requests off, 1 thread) "
           "on the model's GGUF",
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


class Server:
    """A server subprocess: ``structgen serve`` (``spec``, ``plain``) or llama_cpp.server."""

    def __init__(self, name: str, model: str, max_running: int, gguf: str | None = None) -> None:
        self.name = name
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        env = {**os.environ, "OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]}
        if name == LLAMA:
            assert gguf is not None
            cmd = [sys.executable, str(ROOT / "benchmarks" / "_llamacpp_server.py"), gguf,
                   "--port", str(self.port), "--threads", "1", "--n-ctx", "4096"]
            # llama.cpp's own kernel choice (structgen's backend turns the tiled one off for
            # itself); no llama_cpp.server config file from the caller's environment
            env = {k: v for k, v in env.items() if k not in ("GGML_CPU_TILED_MM", "CONFIG_FILE")}
            self.ready_path = "/v1/models"
        else:
            cmd = [sys.executable, "-m", "structgen", "serve", "--model", model, "--port", str(self.port),
                   "--log-level", "warning", "--max-running", str(max_running), *STRUCTGEN_FLAGS[name]]
            self.ready_path = "/health"
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
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "error": (await r.aread()).decode()[:300]}
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
    t1 = time.perf_counter()
    text = "".join(parts)
    if usage:
        tokens, counted = int(usage.get("completion_tokens", 0)), "usage"
    else:  # llama_cpp.server: one content chunk per sampled token, plus the end token as in usage
        tokens, counted = len(stamps) + (finish == "stop"), "chunks"
    itl = (stamps[-1] - stamps[0]) / (tokens - 1) if len(stamps) > 1 and tokens > 1 else None
    valid = _valid(req, text)
    return {"status": 200, "ttft": (stamps[0] - t0) if stamps else None, "itl": itl, "latency": t1 - t0,
            "tokens": tokens, "tokens_counted": counted, "finish_reason": finish, "valid": valid,
            "invalid": None if valid else {"kind": req["_kind"], "finish_reason": finish,
                                           "text_tail": text[-300:]},
            "tokens_per_pass": (usage.get("structgen") or {}).get("tokens_per_pass")}


async def _level(url: str, reqs: list[dict[str, Any]], concurrency: int, engine: str) -> dict[str, Any]:
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
            "ttft_p50_s": q(ttft, 0.5), "ttft_p99_s": q(ttft, 0.99),
            "ttft_steady_p50_s": q(steady, 0.5), "ttft_steady_p99_s": q(steady, 0.99),
            "itl_p50_s": q(itl, 0.5), "itl_p99_s": q(itl, 0.99),
            "valid": f"{sum(d['valid'] for d in ok)}/{len(ok)}",
            "output_tokens_counted": sorted({d["tokens_counted"] for d in ok}),
            "finish_reasons": {f: sum(d["finish_reason"] == f for d in ok)
                               for f in sorted({str(d["finish_reason"]) for d in ok})},
            "errors": [d.get("error") for d in done if d["status"] != 200][:3],
            "invalid_outputs": [d["invalid"] for d in ok if d["invalid"]][:3]}


async def _warm(url: str, count: int, max_tokens: int, engine: str) -> None:
    """Compile every distinct constraint of the run on the server (a 1-token budget gets a 400
    right after the compile, which structgen's server caches; llama_cpp.server generates one
    token), then generate two requests."""
    seen: set[str] = set()
    async with httpx.AsyncClient(timeout=900) as client:
        for req in _requests(count, max_tokens):
            key = json.dumps(req["response_format"], sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            body = {**_body(engine, req), "max_tokens": 1, "stream": False}
            body.pop("stream_options")
            await client.post(url + "/v1/chat/completions", json=body)
    await _level(url, _requests(2, max_tokens), 2, engine)


def _smoke_model(folder: Path) -> str:
    from structgen.tools.bench import SMOKE_FAVOUR, tiny_model

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
    """``(path, name)`` of the GGUF llama_cpp.server runs: the tests' tiny GGUF in ``--smoke``,
    else ``--gguf`` (an alias or a .gguf file), else the ``ALIAS-gguf`` twin of ``--model``."""
    if args.smoke:
        sys.path.insert(0, str(ROOT / "tests"))
        from _tiny_gguf import write_tiny_gguf

        return str(write_tiny_gguf(folder / "tiny.gguf")), "tiny-gguf"
    from structgen.generation.model_store import GGUF_SUFFIX, resolve_model

    name = args.gguf or (args.model if args.model.endswith(GGUF_SUFFIX) else args.model + GGUF_SUFFIX)
    path = resolve_model(name)
    if path.is_dir():
        raise ValueError(f"{name} is not a GGUF model (give --gguf ALIAS-gguf or a .gguf file)")
    return str(path), Path(name).name


def _ratios(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """Per level, ``a``'s figure over ``b``'s: throughput (higher is better for ``a`` above 1)
    and latency (lower is better for ``a`` below 1)."""
    out: dict[str, list[float | None]] = {}
    for key in ("output_tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s",
                "itl_p99_s"):
        out[key] = [round(x[key] / y[key], 2) if x.get(key) and y.get(key) else None for x, y in zip(a, b)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--gguf", default=None,
                    help="llama_cpp.server's model: a GGUF alias or .gguf file (default: the ALIAS-gguf "
                         "twin of --model)")
    ap.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts")
    ap.add_argument("--requests", default=None,
                    help="requests per level, comma-separated like --concurrency (default 8,16,32)")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--engines", default=None,
                    help=f"comma-separated, of {', '.join(ENGINES)} ('llama' for short; default: all three, "
                         f"{LLAMA} left out when llama-cpp-python's server is not installed)")
    ap.add_argument("--smoke", action="store_true", help="tiny random models, 1 and 4 clients (CI)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    envelope = _envelope.capture(argv, __file__)
    levels = [int(x) for x in ("1,4" if args.smoke else args.concurrency).split(",")]
    counts = [int(x) for x in (args.requests or ("3,6" if args.smoke else "8,16,32")).split(",")]
    if len(counts) != len(levels):
        ap.error("--requests needs one count per --concurrency level")
    names = [ENGINE_ALIASES.get(e, e) for e in (args.engines or ",".join(ENGINES)).split(",") if e]
    unknown = [e for e in names if e not in ENGINES]
    if unknown or not names:
        ap.error(f"--engines: unknown engine {', '.join(unknown) or '(none given)'} "
                 f"(of {', '.join(ENGINES)})")
    names = list(dict.fromkeys(names))
    skipped: dict[str, str] = {}
    if LLAMA in names and (why := _llama_missing()):
        if args.engines:
            ap.error(f"--engines {LLAMA}: {why}")
        names.remove(LLAMA)
        skipped[LLAMA] = why
        print(f"{LLAMA} left out: {why}", flush=True)
    tmp = tempfile.TemporaryDirectory()
    gguf = gguf_name = None
    if LLAMA in names:
        try:
            gguf, gguf_name = _gguf_path(args, Path(tmp.name))
        except Exception as e:  # noqa: BLE001 - an uncached alias, a missing file, no gguf package
            if args.engines:
                ap.error(f"{LLAMA}'s GGUF: {e}")
            names.remove(LLAMA)
            skipped[LLAMA] = f"no GGUF: {e}"
            print(f"{LLAMA} left out: no GGUF: {e}", flush=True)
    model = args.model
    if args.smoke and any(n in STRUCTGEN_FLAGS for n in names):
        model = _smoke_model(Path(tmp.name) / "tiny")
    max_tokens = 128 if args.smoke else args.max_tokens
    servers = {n: Server(n, model, max_running=max(levels), gguf=gguf) for n in names}
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    width = max(len(n) for n in names)
    try:
        for s in servers.values():
            s.wait_ready()
        for n, s in servers.items():  # compile every constraint once (the compile cache), warm the model
            asyncio.run(_warm(s.url, max(counts), max_tokens, n))
        for c, n_req in zip(levels, counts):
            reqs = _requests(n_req, max_tokens)
            order = names if c % 2 else list(reversed(names))
            for n in order:
                r = asyncio.run(_level(servers[n].url, reqs, c, n))
                results[n].append(r)
                print(f"{n:{width}s} c={c:2d}: {r['output_tokens_per_s']:7.1f} tok/s  "
                      f"{r['requests_per_s']:.2f} req/s  "
                      f"TTFT p50 {r['ttft_p50_s']} p99 {r['ttft_p99_s']} "
                      f"steady p50 {r['ttft_steady_p50_s']}  "
                      f"ITL p50 {r['itl_p50_s']} p99 {r['itl_p99_s']}  "
                      f"valid {r['valid']}", flush=True)
    finally:
        for s in servers.values():
            s.stop()
        tmp.cleanup()
    bars: dict[str, Any] = {}
    for n, rows in results.items():
        lo, hi = rows[0], rows[-1]
        bars[n] = {
            "throughput_ratio_high_vs_1": round(hi["output_tokens_per_s"] / lo["output_tokens_per_s"], 2)
            if lo["output_tokens_per_s"] else None,
            "ttft_p50_ratio_high_vs_idle": round(hi["ttft_p50_s"] / lo["ttft_p50_s"], 2)
            if lo["ttft_p50_s"] and hi["ttft_p50_s"] else None,
            "ttft_steady_p50_ratio_high_vs_idle": round(hi["ttft_steady_p50_s"] / lo["ttft_p50_s"], 2)
            if lo["ttft_p50_s"] and hi["ttft_steady_p50_s"] else None,
        }
    if "spec" in results and "plain" in results:
        bars["spec_vs_plain_tokens_per_s"] = [
            round(a["output_tokens_per_s"] / b["output_tokens_per_s"], 2)
            if b["output_tokens_per_s"] else None
            for a, b in zip(results["spec"], results["plain"])]
    for n in STRUCTGEN_FLAGS:  # per level: structgen's server over llama_cpp.server
        if n in results and LLAMA in results:
            bars[f"{n}_vs_{LLAMA}"] = _ratios(results[n], results[LLAMA])
    print(json.dumps(bars))
    if LLAMA in results:
        _envelope.add_peers(envelope, ["llama-cpp-python", "sse-starlette", "starlette-context",
                                       "pydantic-settings", "uvicorn"])
    meta = {"model": "tiny-random" if args.smoke else args.model, "levels": levels, "requests": counts,
            "max_tokens": max_tokens, "mode": "smoke" if args.smoke else "full",
            "engines": {n: DESCRIPTIONS[n] for n in names}}
    if LLAMA in results:
        meta[LLAMA] = {
            "gguf": gguf_name, "threads": 1, "n_ctx": 4096,
            "json_requests": 'response_format {"type": "json_object", "schema": ...} (0.3.36 refuses '
                             '{"type": "json_schema"})',
            "grammar_requests": "the SQL grammar as GBNF in the request's grammar field (no Lark); "
                                "validated by the same Lark parser as the other engines",
            "decoding": "temperature 0, repeat_penalty 1.0 (greedy, like structgen serve's default)",
            "output_tokens": "streamed content chunks (one per sampled token) + 1 for an end token "
                             "(finish_reason stop), as structgen's usage counts it: its stream has no usage",
        }
    if skipped:
        meta["skipped"] = skipped
    out = args.out
    if out is None and not args.smoke:
        out = ROOT / "benchmarks" / "results" / f"serve-{args.model}-cpu.json"
    if out is not None:
        _envelope.write(out, envelope, {"meta": meta, "results": results, "bars": bars})
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
