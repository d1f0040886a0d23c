"""Pieces every subcommand of the ``structgen`` command line shares: exit codes, the usage-error
exception and the one-line message printers (all on stderr)."""

from __future__ import annotations

import sys

from structgen.errors import SchemaError, StructgenError
from structgen.settings import Settings, load_settings

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2

#: Environment variable ``structgen serve`` reads for the API key when ``--api-key`` is not given.
API_KEY_ENV = "STRUCTGEN_API_KEY"


class _Usage(Exception):
    """A usage-level failure: printed on stderr (one line unless ``keep_lines``), exit code 2."""

    def __init__(self, message: str, *, keep_lines: bool = False) -> None:
        super().__init__(message)
        self.keep_lines = keep_lines


def _err(prog: str, message: str, keep_lines: bool = False) -> None:
    text = message.rstrip() if keep_lines else " ".join(message.split())
    print(f"{prog}: error: {text}", file=sys.stderr)


def _text(e: Exception) -> str:
    """An error's message, without the empty location a SchemaError adds when it has none."""
    if isinstance(e, SchemaError) and not e.pointer and not e.keyword:
        return e.message
    return str(e)


def _note(prog: str, message: str) -> None:
    print(f"{prog}: note: {message}", file=sys.stderr)


def _isatty(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _load_settings(path: str | None) -> Settings:
    if not path:
        return Settings()
    try:
        return load_settings(path)
    except StructgenError as e:
        raise _Usage(str(e)) from None
