"""Output files that are never left half-written and never destroy what was there.

Every file the command line writes (``generate --out / --values-out / --metrics-out``, the
benchmark reports, ``Metrics.write``) goes through :class:`AtomicOutput`:

* the data is written to a temporary file in the destination's own folder (so that the final
  rename stays on one file system) and flushed as it goes, so a crash keeps what was finished;
* :meth:`AtomicOutput.commit` flushes it to disk and renames it over the destination: an
  existing file is replaced only when the run succeeded;
* :meth:`AtomicOutput.abort` (failure, Ctrl-C) leaves the destination untouched; what was
  written so far is kept as ``NAME.partial`` beside it (removed when nothing was written).

A destination that exists and is not a regular file (``/dev/null``, a FIFO, a terminal) is
written directly: there is nothing to protect and it cannot be renamed over.

:func:`check_distinct` refuses an output path that is one of the inputs or another output,
comparing resolved real paths and (for existing files) device and inode numbers, so symbolic
and hard links are seen through.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable
from types import TracebackType
from typing import IO

from structgen.errors import ConfigError

__all__ = ["AtomicOutput", "PARTIAL_SUFFIX", "abort_all", "check_distinct", "write_text_atomic"]

PARTIAL_SUFFIX = ".partial"


def _is_special(path: str) -> bool:
    """True when ``path`` exists and is not a regular file (device, FIFO, socket)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


class AtomicOutput:
    """A text (or binary) output file written through a temporary file and renamed into place.

    Opening creates the temporary file at once (so an unwritable folder fails before any
    work). Use :attr:`stream` to write; then exactly one of :meth:`commit` or :meth:`abort`.
    As a context manager it commits on a normal exit and aborts on an exception.
    """

    def __init__(self, path: str | os.PathLike[str], *, binary: bool = False,
                 encoding: str = "utf-8") -> None:
        self.path = str(path)
        # write beside the file a symbolic link points to, so the rename replaces the target
        # (not the link) and stays on the target's file system
        self.target = os.path.realpath(self.path)
        self.partial_path: str | None = None
        self.direct = _is_special(self.target)
        self._closed = False
        # one of the two is open: bytes with ``binary``, else text
        self._bytes: IO[bytes] | None = None
        self._text: IO[str] | None = None
        if self.direct:
            self._tmp: str | None = None
            if binary:
                self._bytes = open(self.target, "wb")
            else:
                self._text = open(self.target, "w", encoding=encoding)
            return
        folder, name = os.path.split(self.target)
        fd, self._tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder or ".")
        try:
            mode = stat.S_IMODE(os.stat(self.target).st_mode)
        except OSError:  # a new file: the permissions open() would give it
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(self._tmp, mode)
        if binary:
            self._bytes = os.fdopen(fd, "wb")
        else:
            self._text = os.fdopen(fd, "w", encoding=encoding)

    @property
    def stream(self) -> IO[str] | IO[bytes]:
        """The open file (bytes with ``binary``, else text)."""
        stream = self._bytes if self._text is None else self._text
        assert stream is not None  # (one of them is always open)
        return stream

    def write(self, data: str | bytes) -> int:
        """Write ``data`` (str; bytes with ``binary``) to the temporary file; returns what the
        stream's ``write`` returns."""
        if isinstance(data, str) and self._text is not None:
            return self._text.write(data)
        if isinstance(data, (bytes, bytearray)) and self._bytes is not None:
            return self._bytes.write(data)
        raise TypeError(f"write() argument must be {'bytes' if self._text is None else 'str'}, "
                        f"not {type(data).__name__}")

    def flush(self) -> None:
        """Flush Python's buffer to the operating system (survives a crash of this process)."""
        self.stream.flush()

    def commit(self) -> None:
        """Flush to disk and rename the temporary file over the destination."""
        if self._closed:
            return
        self._closed = True
        self.stream.flush()
        if self._tmp is None:
            self.stream.close()
            return
        try:
            os.fsync(self.stream.fileno())
        except OSError:  # some file systems cannot sync; the rename is still atomic
            pass
        self.stream.close()
        os.replace(self._tmp, self.target)

    def abort(self) -> str | None:
        """Leave the destination as it was. Returns the ``.partial`` file holding what was
        written so far, or None when nothing was written (the temporary file is removed)."""
        if self._closed:
            return self.partial_path
        self._closed = True
        try:
            self.stream.close()
        except OSError:
            pass
        if self._tmp is None:
            return None
        try:
            if os.path.getsize(self._tmp) == 0:
                os.unlink(self._tmp)
                return None
            self.partial_path = self.target + PARTIAL_SUFFIX
            os.replace(self._tmp, self.partial_path)
        except OSError:
            return None
        return self.partial_path

    def __enter__(self) -> AtomicOutput:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self.commit()
        else:
            self.abort()


def write_text_atomic(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` through a temporary file renamed into place (an existing file
    is replaced only once the new content is complete on disk)."""
    with AtomicOutput(path, encoding=encoding) as out:
        out.write(text)


def _identity(path: str) -> tuple[str, tuple[int, int] | None]:
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return real, None
    if not stat.S_ISREG(st.st_mode):
        return real, None
    return real, (st.st_dev, st.st_ino)


def check_distinct(inputs: Iterable[tuple[str, str | os.PathLike[str] | None]],
                   outputs: Iterable[tuple[str, str | os.PathLike[str] | None]]) -> None:
    """Raise :class:`ConfigError` when an output path is one of the inputs or another output.

    ``inputs`` / ``outputs`` are ``(label, path)`` pairs (a label such as ``--prompts``; a path
    of None or ``-`` is skipped). Paths are the same when their resolved real paths are equal
    or, for existing files, their device and inode numbers are (hard links). Existing paths that
    are not regular files (``/dev/null``) are never "the same" as anything: writing there twice
    loses nothing.
    """
    seen: list[tuple[str, str, str, tuple[int, int] | None, bool]] = []
    for is_output, pairs in ((False, inputs), (True, outputs)):
        for label, path in pairs:
            if path is None or str(path) == "-":
                continue
            p = str(path)
            if _is_special(p):
                continue
            real, ident = _identity(p)
            for other_label, other_path, other_real, other_ident, other_is_output in seen:
                if real == other_real or (ident is not None and ident == other_ident):
                    how = "another output" if other_is_output else "an input"
                    raise ConfigError(
                        f"{label} {p}: is the same file as {other_label} {other_path}; writing it "
                        f"would destroy {how} (choose another output path)", key=label.lstrip("-"))
            seen.append((label, p, real, ident, is_output))
            if is_output and os.path.isdir(real):
                raise ConfigError(f"{label} {p}: is a folder, not a file", key=label.lstrip("-"))


def abort_all(outputs: Iterable[AtomicOutput]) -> list[str]:
    """Abort ``outputs``; return one message per ``.partial`` file kept."""
    notes = []
    for o in outputs:
        kept = o.abort()
        if kept is not None:
            notes.append(f"{o.path} left unchanged; the output written so far is in {kept}")
    return notes
