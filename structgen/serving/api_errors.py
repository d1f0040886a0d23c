"""The error answers of ``structgen serve``: OpenAI error objects, and the JSON response that
carries them (and every other answer of the routes).

:class:`ApiError` is raised by the routes and answered as ``{"error": {"message", "type",
"param", "code"}}`` with its HTTP status; :class:`SafeJSONResponse` sends a body whose text
holds a lone surrogate with ``\\uXXXX`` escapes instead of failing mid-response.
"""

from __future__ import annotations

import json

from fastapi.responses import JSONResponse, Response

__all__ = ["ApiError", "SafeJSONResponse"]


class ApiError(Exception):
    """An error answered as an OpenAI error object with HTTP ``status`` (and extra response
    ``headers``, e.g. ``Connection: close``)."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",  # noqa: A002
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None, **extra: object) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers
        self.body: dict[str, dict[str, object]] = {
            "error": {"message": message, "type": type, "param": param, "code": code, **extra}}

    def response(self) -> Response:
        """This error as an HTTP response."""
        return SafeJSONResponse(self.body, status_code=self.status, headers=self.headers)


class SafeJSONResponse(JSONResponse):
    """Starlette's JSON response (UTF-8, non-ASCII characters as themselves), except that a
    body whose text cannot be UTF-8 (a lone surrogate) is sent with ``\\uXXXX`` escapes
    instead of failing while the response is sent."""

    def render(self, content: object) -> bytes:
        """The body's bytes."""
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()
