"""The runner of ``structgen serve``: uvicorn, hardened for clients nobody vouches for.

:func:`run_server` serves the FastAPI application of :mod:`structgen.serving.app` with
:func:`protocol_class`, uvicorn's h11 protocol plus what uvicorn lacks: a deadline for a
request's head, a cap on its size (431), the answer past the connection cap (503) and to
malformed HTTP (400), each an OpenAI error object. :func:`server_config` is its
``uvicorn.Config`` (tests start a ``uvicorn.Server`` on it). uvicorn and h11 are imported when
a server is configured, not with the module.
"""

from __future__ import annotations

import asyncio
import gc
import json
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import uvicorn
    from fastapi import FastAPI
    from starlette.types import Receive, Scope, Send
    from uvicorn.server import ServerState

__all__ = ["DEFAULT_HEADER_TIMEOUT_S", "DEFAULT_KEEP_ALIVE_S", "DEFAULT_MAX_CONNECTIONS", "MAX_HEAD_BYTES",
           "protocol_class", "run_server", "server_config"]

#: Seconds a client has to send a request's head (request line and headers); then the
#: connection is closed. Also bounds a new connection that sends nothing.
DEFAULT_HEADER_TIMEOUT_S = 10.0
#: Seconds an idle keep-alive connection is kept open between requests.
DEFAULT_KEEP_ALIVE_S = 5.0
#: Connections served at once; a request on one more gets a 503.
DEFAULT_MAX_CONNECTIONS = 256
#: Largest request head (request line and headers) :func:`run_server` reads; larger: 431.
#: The same as h11's limit for a head that arrives in pieces.
MAX_HEAD_BYTES = 16 * 1024
_HEAD_END = re.compile(rb"\n\r?\n")  # the blank line that ends a head, as h11 finds it


def _error_bytes(message: str, *, type: str, code: str) -> bytes:  # noqa: A002
    """The body of an OpenAI error object (as :class:`structgen.serving.app.ApiError` writes
    one) for a response the protocol layer writes itself."""
    error = {"message": message, "type": type, "param": None, "code": code}
    return json.dumps({"error": error}).encode()


def _too_many_connections(limit: int) -> bytes:
    """The body of the 503 answered past ``limit`` open connections."""
    return _error_bytes(f"the server has too many open connections (limit {limit}); retry later",
                        type="server_error", code="too_many_connections")


def protocol_class(header_timeout_s: float | None = DEFAULT_HEADER_TIMEOUT_S) -> type:
    """uvicorn's h11 HTTP protocol (pass it as ``uvicorn.Config(http=...)``) with what a
    server facing untrusted clients needs and uvicorn lacks:

    * a deadline for a request's head: a connection must deliver a request line and its
      headers within ``header_timeout_s`` seconds of its first byte (a new connection: of
      opening), else it is closed (with a 408 if part of a head arrived). uvicorn itself waits
      for ever, so a few slow senders at a byte a second ("slowloris") would hold every
      connection. The same deadline bounds the rest of a body nobody reads any more (the
      server answered early, e.g. 401). Bodies being read are bounded by ``create_app``'s
      ``body_timeout_s``;
    * the answer past ``uvicorn.Config(limit_concurrency=...)`` open connections: a 503 with
      an OpenAI error object (uvicorn's own is plain text), at once on the connection past the
      cap (uvicorn waits for its request);
    * a cap on a request head: :data:`MAX_HEAD_BYTES`, else 431 (h11 caps only a head that
      arrives in pieces, so one sent at once could be any size);
    * the answer to malformed HTTP: a 400 with an OpenAI error object (uvicorn's own is plain
      text).

    None: no head deadline. uvicorn is imported here, not with the module: only the runner
    needs it."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        """uvicorn's h11 protocol with a head deadline and JSON error answers."""

        def __init__(self, config: uvicorn.Config, server_state: ServerState,
                     app_state: dict[str, object], _loop: asyncio.AbstractEventLoop | None = None) -> None:
            super().__init__(config, server_state, app_state, _loop)
            self._read_timer: asyncio.TimerHandle | None = None
            # take over uvicorn's concurrency check (it would answer plain text): the limit
            # moves into an app wrapper that answers JSON
            self._connection_limit = self.limit_concurrency
            self.limit_concurrency = None
            self._inner_app = self.app
            if self._connection_limit is not None:
                self.app = self._app_within_limit

        async def _app_within_limit(self, scope: Scope, receive: Receive, send: Send) -> None:
            # this connection and this request's task are counted already
            limit = self._connection_limit
            assert limit is not None
            if len(self.connections) > limit or len(self.tasks) > limit:
                self.logger.warning("Exceeded the limit of %d connections.", limit)
                body = _too_many_connections(limit)
                await send({"type": "http.response.start", "status": 503, "headers": [
                    (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"), (b"retry-after", b"1")]})
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            await self._inner_app(scope, receive, send)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            """uvicorn's, then the head deadline starts. A connection past the cap is answered
            503 and closed at once, so that silent connections cannot pile up past it either
            (uvicorn would keep it open until it sent a request)."""
            super().connection_made(transport)
            limit = self._connection_limit
            if limit is not None and len(self.connections) > limit:
                self.logger.warning("Exceeded the limit of %d connections.", limit)
                self._write_response(503, _too_many_connections(limit), retry_after=True)
                transport.close()
                return
            self._watch_reads()

        def data_received(self, data: bytes) -> None:
            """A request head over :data:`MAX_HEAD_BYTES` is answered 431 and the connection
            closed (h11 limits only a head that arrives in pieces); then uvicorn's."""
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                pending = self.conn.trailing_data[0] + data
                if len(pending) > MAX_HEAD_BYTES and not _HEAD_END.search(pending, 0, MAX_HEAD_BYTES + 4):
                    self.logger.warning("Request head over %d bytes.", MAX_HEAD_BYTES)
                    body = _error_bytes(f"the request line and headers are over {MAX_HEAD_BYTES} bytes",
                                        type="invalid_request_error", code="request_header_too_large")
                    self._write_response(431, body)
                    self.transport.close()
                    return
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            """The deadline is dropped, then uvicorn's."""
            self._stop_read_timer()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            """uvicorn's, then the deadline follows the connection's new state."""
            super().handle_events()
            self._watch_reads()

        def on_response_complete(self) -> None:
            """uvicorn's, then the deadline follows the connection's new state."""
            super().on_response_complete()
            self._watch_reads()

        def _watch_reads(self) -> None:
            """Start the deadline when the connection waits for bytes that must come in time,
            stop it once they have come."""
            if self.transport is None or self.transport.is_closing() or header_timeout_s is None:
                self._stop_read_timer()
                return
            state = self.conn.their_state
            if state is h11.IDLE:
                # a new connection, or part of the next request's head (between requests with
                # nothing sent, the keep-alive timeout applies instead)
                waiting = self.cycle is None or bool(self.conn.trailing_data[0])
            elif state is h11.SEND_BODY:
                # a body still arriving after the answer went out: nobody reads it
                waiting = self.cycle is not None and self.cycle.response_complete
            else:
                waiting = False
            if not waiting:
                self._stop_read_timer()
            elif self._read_timer is None:
                self._read_timer = self.loop.call_later(header_timeout_s, self._read_timed_out)

        def _stop_read_timer(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def _read_timed_out(self) -> None:
            self._read_timer = None
            if self.transport.is_closing():
                return
            self.logger.debug("Closed a connection that was too slow to send its request.")
            if self.conn.our_state is h11.IDLE and self.conn.trailing_data[0]:
                # part of a head came: the client is there to read why it is cut off (a silent
                # connection gets no answer, which a client's pool could take for the answer
                # to a later request)
                body = _error_bytes(f"the request head was not received within {header_timeout_s:g} s",
                                    type="invalid_request_error", code="request_timeout")
                self._write_response(408, body)
            self.transport.close()

        def _write_response(self, status: int, body: bytes, *, retry_after: bool = False) -> None:
            """Write a whole JSON response (and ``Connection: close``) outside any ASGI cycle."""
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]
            if retry_after:
                headers.append((b"retry-after", b"1"))
            try:
                for event in (h11.Response(status_code=status, headers=headers),
                              h11.Data(data=body), h11.EndOfMessage()):
                    self.transport.write(self.conn.send(event) or b"")
            except h11.LocalProtocolError:
                pass  # the connection is past the point of an answer: it is closed all the same

        def send_400_response(self, msg: str) -> None:
            """The answer to malformed HTTP (called by uvicorn): an OpenAI error object, then
            the connection is closed."""
            if self.cycle is not None and not self.cycle.response_complete:
                # the request in progress can no longer be read or answered: its app sees a
                # disconnect, and its sends do nothing
                self.cycle.disconnected = True
                self.cycle.message_event.set()
            if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                body = _error_bytes(f"{msg} The request is not valid HTTP/1.1.",
                                    type="invalid_request_error", code="bad_request")
                self._write_response(400, body)
            self.transport.close()

    GuardedH11Protocol.__qualname__ = "GuardedH11Protocol"
    return GuardedH11Protocol


def server_config(app: FastAPI, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
                  graceful_timeout_s: float = 30.0, keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
                  max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
                  header_timeout_s: float | None = DEFAULT_HEADER_TIMEOUT_S) -> uvicorn.Config:
    """The ``uvicorn.Config`` :func:`run_server` serves ``app`` with (tests start a
    ``uvicorn.Server`` on it in a thread): the :func:`protocol_class` protocol, idle
    keep-alive connections closed after ``keep_alive_s``, at most ``max_connections``
    connections served at once (None: no cap), no access log."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level=log_level,
                          timeout_graceful_shutdown=int(graceful_timeout_s), access_log=False,
                          http=protocol_class(header_timeout_s),
                          timeout_keep_alive=keep_alive_s,  # type: ignore[arg-type] # a float works
                          limit_concurrency=max_connections)


def run_server(app: FastAPI, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
               graceful_timeout_s: float = 30.0, keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
               max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
               header_timeout_s: float | None = DEFAULT_HEADER_TIMEOUT_S) -> None:
    """Serve ``app`` with uvicorn until SIGINT / SIGTERM; open requests get up to
    ``graceful_timeout_s`` to finish (the engine drains), then the process exits. The
    connection limits are :func:`server_config`'s. Everything alive when it starts (the
    model, the tokenizer, the libraries) is frozen out of the cyclic garbage collector's
    reach (``gc.freeze``): it lives as long as the server, and a full collection would scan
    it every time, pausing every request (hundreds of milliseconds with the default model)."""
    import uvicorn

    gc.collect()  # what is garbage now is not frozen with the rest
    gc.freeze()
    uvicorn.Server(server_config(app, host=host, port=port, log_level=log_level,
                                 graceful_timeout_s=graceful_timeout_s, keep_alive_s=keep_alive_s,
                                 max_connections=max_connections,
                                 header_timeout_s=header_timeout_s)).run()
