"""A real uvicorn server on 127.0.0.1 for the HTTP tests: a free port, a thread, a clean stop."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
