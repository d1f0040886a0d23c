"""A real uvicorn server on 127.0.0.1 for the HTTP tests: a free port, a thread, a clean stop."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running(app: Any, *, timeout: float = 60.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in a daemon thread; yields the base
    URL (``http://127.0.0.1:PORT``) once the server accepts connections, and stops it after."""
    import uvicorn

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.monotonic() + timeout
    while not srv.started:
        assert time.monotonic() < deadline and th.is_alive(), "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        th.join(timeout)


@contextmanager
def tiny_server(tok: Any, *, api_key: str, **engine_kw: Any) -> Iterator[Any]:
    """``structgen serve``'s app over a tiny random Llama on ``tok`` (tests/_tiny_lm.py), running:
    yields ``url``, ``engine``, ``lm`` and an official ``openai`` client (no retries). Engine
    options default to a small batch (4 rows, 16 queued, 40 tokens)."""
    import openai
    from _tiny_lm import build_tiny_llama

    from structgen.generation.model import CausalLM
    from structgen.serving.app import create_app
    from structgen.serving.engine import Engine

    lm = CausalLM(build_tiny_llama(tok, "random"), tok)
    options = {"max_running": 4, "max_queued": 16, "default_max_tokens": 40, "compile_workers": 2,
               **engine_kw}
    engine = Engine(lm, **options)
    app = create_app(engine, model_name="tiny", api_key=api_key, max_body_bytes=100_000)
    with running(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=120)
        yield SimpleNamespace(url=url, engine=engine, lm=lm, client=client)
