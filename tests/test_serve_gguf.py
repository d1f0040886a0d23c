"""``structgen serve --model x.gguf``: the CLI serving a GGUF on llama.cpp, in its own process
on 127.0.0.1, exercised with the official ``openai`` client.

Oracles: ``jsonschema`` for validity; plain constrained decoding (``speculative=False``) of
:func:`structgen.generate` on the same GGUF in this process, one request at a time, for the
greedy text of each request served concurrently in the continuous batch; the server's
``/metrics`` for what the prefix cache restored. The model is the tests' tiny GGUF
(tests/_tiny_gguf.py). Needs llama-cpp-python.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import pytest
from _tiny_gguf import write_tiny_gguf

pytest.importorskip("llama_cpp")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import structgen  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = ("You turn short notes into JSON records. Copy names and numbers exactly as written; "
          "leave out what the note does not say. "
          + " ".join(f"Rule {i}: field {i} is exact." for i in range(12)))
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"enum": ["open", "closed"]},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                               "maxItems": 2}},
     "required": ["status", "tags"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
]
NOTES = ["Bob is 42.", "Ticket closed, tags db and ui.", "Numbers 4 and 7.", "Ann, 31 years.",
         "Open ticket, tag net.", "Just 9."]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("serve-gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def server(gguf):
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "structgen", "serve", "--model", str(gguf), "--port", str(port),
         "--threads", "1", "--ctx-size", "2048", "--max-running", "4", "--compile-processes", "0",
         "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"structgen serve did not start on the GGUF:\n{proc.stdout.read()}")
        time.sleep(0.2)
    yield url
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _messages(note: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": note}]


def test_gguf_serve_concurrent_requests_equal_plain_decoding(server, gguf) -> None:
    """Six requests sharing a system prompt, four at a time in the batch (rows join as others
    finish): each text is valid and equals plain decoding of the request alone; the prefix
    cache restored the system prompt for most of them."""
    from structgen.generation.llamacpp import load_gguf

    client = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=300)
    cases = [(NOTES[i], SCHEMAS[i % len(SCHEMAS)]) for i in range(len(NOTES))]

    def ask(case):
        note, schema = case
        r = client.chat.completions.create(
            model="tiny", messages=_messages(note), max_tokens=48, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "out", "schema": schema}})
        return r.choices[0].message.content, r.choices[0].finish_reason

    with ThreadPoolExecutor(len(cases)) as pool:
        answers = list(pool.map(ask, cases))
    lm = load_gguf(gguf, n_threads=1, n_ctx=2048)
    for (note, schema), (text, finish) in zip(cases, answers):
        alone = structgen.generate(lm, schema=schema, messages=_messages(note), max_new_tokens=48,
                                   speculative=False)
        assert text == alone.text, note
        if finish == "stop":
            jsonschema.validate(json.loads(text), schema)
    metrics = httpx.get(server + "/metrics").text
    def counter(name: str) -> float:
        return float(re.search(rf"^structgen_serve_prefix_cache_{name} (\S+)$", metrics, re.M).group(1))

    hits, reused = counter("hits_total"), counter("reused_tokens_total")
    cache_lines = "\n".join(x for x in metrics.splitlines() if "prefix_cache" in x and not x.startswith("#"))
    assert hits >= len(cases) - 2 and reused >= 64 * hits, cache_lines
    assert counter("restore_failures_total") == 0


def test_gguf_serve_streams_and_reports_usage(server) -> None:
    client = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=300)
    stream = client.chat.completions.create(
        model="tiny", messages=_messages(NOTES[0]), max_tokens=48, stream=True,
        stream_options={"include_usage": True},
        response_format={"type": "json_schema", "json_schema": {"name": "out", "schema": SCHEMAS[0]}})
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and usage.completion_tokens > 0 and usage.prompt_tokens > 64
    assert text.startswith("{")
