"""Reading Lark grammar text with Lark's own grammar loader, and the errors of the Lark
front-end placed in the source (line, column and a caret line).

``%import`` is resolved here, by the only loader Lark is given (:class:`_ImportLoader`): it
reads structgen's packaged grammars, Lark's own, the folders the caller allows and, for
relative imports, the folder of the grammar file; never the working folder. The lowering of
the loaded grammar to IR is :mod:`structgen.frontends.lark`.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from structgen import grammars
from structgen.config import CompileOptions
from structgen.errors import GrammarError, GrammarSyntaxError

if TYPE_CHECKING:  # pragma: no cover - lark itself is imported when a grammar is read
    from lark.load_grammar import Grammar, PackageResource

__all__ = ["check_literal_lengths", "definition_lines", "directive_line", "grammar_error", "import_folders",
           "lark_import_loader", "load_lark_grammar", "locate", "token_position"]


# ---------------------------------------------------------------------------
# Error helpers
# ---------------------------------------------------------------------------

def _caret(text: str, line: int | None, column: int | None) -> str | None:
    """The source line ``line`` (1-based) and a caret under ``column`` (1-based)."""
    if line is None:
        return None
    lines = text.splitlines()
    if not lines:
        return None
    line = min(max(line, 1), len(lines))
    src = lines[line - 1]
    if column is None:
        return src
    col = min(max(column, 1), len(src) + 1)
    pad = "".join("\t" if ch == "\t" else " " for ch in src[: col - 1])
    return f"{src}\n{pad}^"


def token_position(tok: object) -> tuple[int | None, int | None]:
    """(line, column) of a Lark token, when it has them."""
    return getattr(tok, "line", None), getattr(tok, "column", None)


def grammar_error(cls: type[GrammarError], message: str, text: str, line: int | None = None,
                  column: int | None = None) -> GrammarError:
    """A ``cls`` error at (1-based) ``line``/``column`` of ``text``, with the caret line."""
    return cls(message, line=line, column=column, context=_caret(text, line, column))


_DEF_HEAD = re.compile(r"^\s*(?:%override\s+|%extend\s+)?[?!]*(_?[A-Za-z][A-Za-z0-9_]*)\s*(?:\{[^}]*\})?"
                       r"\s*(?:\.\s*-?\d+\s*)?:")


def _code_only(line: str) -> str:
    """``line`` with string/regexp literals blanked and a trailing comment removed."""
    out = []
    i, n = 0, len(line)
    while i < n:
        ch = line[i]
        if ch == "#" or line.startswith("//", i):
            break
        if ch in "\"/":
            j = i + 1
            while j < n and line[j] != ch:
                j += 2 if line[j] == "\\" else 1
            out.append(" " * (min(j, n - 1) - i + 1))
            i = j + 1
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _name_uses(text: str, name: str) -> Iterator[tuple[int, int, bool]]:
    """(line, column, is_definition) of every whole-word occurrence of ``name`` in code."""
    word = re.compile(r"(?<![\w.%])" + re.escape(name) + r"(?![\w])")
    for ln, raw in enumerate(text.splitlines(), start=1):
        code = _code_only(raw)
        m_def = _DEF_HEAD.match(code)
        for m in word.finditer(code):
            is_def = bool(m_def and m_def.group(1) == name and m.start() == m_def.start(1))
            yield ln, m.start() + 1, is_def


def locate(text: str, name: str, *, definition: bool = False, nth: int = 0) -> tuple[int | None, int | None]:
    """(line, column), 1-based, of the ``nth`` use (or, with ``definition``, definition) of
    rule or terminal ``name`` in grammar ``text``; ``(None, None)`` when not found."""
    hits = [(ln, col) for ln, col, is_def in _name_uses(text, name) if is_def == definition]
    if len(hits) > nth:
        return hits[nth]
    return None, None


def definition_lines(text: str) -> dict[str, int]:
    """The (1-based) line of the first definition of each rule and terminal of ``text``
    (one pass over its lines)."""
    out: dict[str, int] = {}
    for ln, raw in enumerate(text.splitlines(), start=1):
        m = _DEF_HEAD.match(raw)
        if m:
            out.setdefault(m.group(1), ln)
    return out


# Lark's string literal and regular expression tokens (lark.load_grammar's STRING and REGEXP)
# and its comments, which may hold either delimiter. An unterminated literal runs to the end of
# its line (a string) or of the text (a regexp), so the scan never starts over inside one:
# it is linear in the text.
_LITERALS = re.compile(r'//[^\n]*|#[^\n]*|"(?:\\["\\]|[^"\n])*+(?:"|$)|/(?!/)(?:\\[/\\]|[^/])*+(?:/|\Z)',
                       re.MULTILINE)
_EXCERPT = 60  # characters of a long line shown around the caret of an error


def check_literal_lengths(text: str, limit: int) -> None:
    """Raise :class:`GrammarError` at the first string literal or regular expression of Lark
    grammar ``text`` longer than ``limit`` characters (delimiters excluded), before Lark
    parses it: a literal costs time and memory in proportion at every stage, Lark's own
    parser included. Linear in the text; nothing to do for a text no longer than ``limit``."""
    if len(text) <= limit:
        return
    for m in _LITERALS.finditer(text):
        start, end = m.span()
        if end - start - 2 <= limit or text[start] == "#" or text.startswith("//", start):
            continue  # short enough, or a comment
        line = text.count("\n", 0, start) + 1
        bol = text.rfind("\n", 0, start) + 1
        column = start - bol + 1
        # the caret line, cut short around the literal's start (the line may be megabytes)
        eol = text.find("\n", start)
        eol = len(text) if eol < 0 else eol
        lo = max(bol, start - _EXCERPT)
        hi = min(eol, start + _EXCERPT)
        excerpt = ("..." if lo > bol else "") + text[lo:hi] + ("..." if hi < eol else "")
        pad = " " * (start - lo + (3 if lo > bol else 0))
        kind = "string literal" if text[start] == '"' else "regular expression"
        raise GrammarError(f"{kind} of {end - start - 2} characters is longer than "
                           f"CompileOptions.max_literal_length={limit}", line=line, column=column,
                           context=f"{excerpt}\n{pad}^")


def directive_line(text: str, directive: str) -> tuple[int | None, int | None]:
    """(line, column), 1-based, of the first line of ``text`` starting with ``directive``
    (e.g. ``%declare``); ``(None, None)`` when there is none."""
    for ln, raw in enumerate(text.splitlines(), start=1):
        m = re.match(r"\s*(" + re.escape(directive) + r")\b", raw)
        if m:
            return ln, m.start(1) + 1
    return None, None


def _translate_lark_error(exc: BaseException, text: str) -> GrammarError:
    """Turn an exception raised while Lark loads ``text`` into a located GrammarError."""
    from lark.exceptions import UnexpectedInput

    if isinstance(exc, UnexpectedInput):
        line, col = getattr(exc, "line", None), getattr(exc, "column", None)
        token = getattr(exc, "token", None)
        expected = sorted(getattr(exc, "expected", ()) or ())
        msg = "grammar syntax error"
        if token is not None:
            msg += f": unexpected {str(token)!r}"
        if expected:
            msg += f" (expected one of {', '.join(expected)})"
        return grammar_error(GrammarSyntaxError, msg, text,
                             line if isinstance(line, int) and line > 0 else None,
                             col if isinstance(col, int) and col > 0 else None)
    msg = str(exc.args[0]) if exc.args else str(exc)
    m = re.search(r"line (\d+) column (\d+)", msg)
    if m:
        head = re.split(r",? at line \d+ column \d+|Unexpected input at line", msg)[0].strip()
        head = head or "unexpected input"
        return grammar_error(GrammarSyntaxError, f"grammar syntax error: {head}", text,
                             int(m.group(1)), int(m.group(2)))
    for pat, definition, nth in (
        (r"'([\w]+)' used but not defined", False, 0),
        (r"Terminal used but not defined: (\w+)", False, 0),
        (r"'([\w]+)' defined more than once", True, 1),
        (r"Template '([\w]+)' used but not defined", False, 0),
        (r"Recursion in terminal '([\w]+)'", True, 0),
        (r"Rules aren't allowed inside terminals \((\w+) in", False, 0),
    ):
        m = re.search(pat, msg)
        if m:
            line, col = locate(text, m.group(1), definition=definition, nth=nth)
            return grammar_error(GrammarError, msg, text, line, col)
    if isinstance(exc, OSError):
        line, col = directive_line(text, "%import")
        return grammar_error(GrammarError, f"cannot resolve %import: {exc}", text, line, col)
    return grammar_error(GrammarError, msg or type(exc).__name__, text)


# ---------------------------------------------------------------------------
# Loading with Lark
# ---------------------------------------------------------------------------

class _ImportRefused(Exception):
    """An ``%import`` that :class:`_ImportLoader` will not resolve (never an ``OSError``, so Lark
    does not go on to try other places, the working folder among them)."""

    def __init__(self, message: str, dotted: str) -> None:
        super().__init__(message)
        self.message = message
        self.dotted = dotted


class _ImportLoader:
    """Lark import loader that is the only place ``%import`` can read from.

    Lark calls the entries of ``import_paths`` first, for every import; this loader answers every
    call itself (text, or :class:`_ImportRefused`), so Lark's own fallbacks (the grammar's folder
    as Lark computes it -- the working folder for text -- and a last ``open`` relative to the
    working folder) never run. Resolution:

    * library imports (``%import common.WS``, ``%import json.value``): Lark's packaged grammars,
      then structgen's (:mod:`structgen.grammars`), then each folder of ``import_paths``;
    * relative imports (``%import .sub.inner.X``): relative to the folder of the grammar file
      that holds them, and only when that is the top grammar's folder (``grammar_path``), an
      ``import_paths`` folder or a folder below one; grammar text without a file has no folder.

    A file is read only if it is a regular file whose real path (symlinks resolved) lies inside
    an allowed folder. Side effect: reads those files and package resources, nothing else.
    """

    def __init__(self, import_paths: list[str], grammar_dir: str | None) -> None:
        self.library_roots = [os.path.realpath(r) for r in import_paths]
        self.roots = self.library_roots + ([os.path.realpath(grammar_dir)] if grammar_dir else [])

    def _inside(self, path: str) -> bool:
        real = os.path.realpath(path)
        return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in self.roots)

    def _read_file(self, path: str, dotted: str) -> tuple[str, str]:
        if not self._inside(path):
            raise _ImportRefused(f"%import {dotted}: {path} is outside the folders grammars may "
                                 "import from", dotted)
        try:
            st = os.stat(path)
        except OSError:
            raise _ImportRefused(f"%import {dotted}: no grammar file {path}", dotted) from None
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
            raise _ImportRefused(f"%import {dotted}: {path} is not a regular file", dotted)
        try:
            with open(path, encoding="utf-8") as f:
                return os.path.realpath(path), f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise _ImportRefused(f"%import {dotted}: cannot read {path}: {e}", dotted) from None

    def __call__(self, base_path: str | PackageResource | None, grammar_path: str
                 ) -> tuple[str | PackageResource, str]:
        from lark.load_grammar import PackageResource, stdlib_loader

        dotted = grammar_path[: -len(".lark")].replace(os.sep, ".")
        if isinstance(base_path, PackageResource):  # inside a packaged grammar
            if base_path.pkg_name == stdlib_loader.pkg_name:
                try:
                    return stdlib_loader(base_path, grammar_path)
                except OSError:
                    pass
            raise _ImportRefused(f"%import .{dotted}: no such packaged grammar", dotted)
        if base_path is None:  # library import
            try:
                return stdlib_loader(None, grammar_path)
            except OSError:
                pass
            if os.sep not in grammar_path:
                try:
                    text = grammars.read_grammar(grammar_path)
                except FileNotFoundError:
                    pass
                else:
                    return PackageResource("structgen.grammars", grammar_path), text
            for root in self.library_roots:
                candidate = os.path.join(root, grammar_path)
                if os.path.lexists(candidate):
                    return self._read_file(candidate, dotted)
            where = "Lark's and structgen's packaged grammars" + (
                " and " + ", ".join(self.library_roots) if self.library_roots else "")
            raise _ImportRefused(f"%import {dotted}: no grammar {grammar_path!r} in {where}", dotted)
        if not base_path:  # Lark's folder for grammar text without a file: the working folder
            raise _ImportRefused(f"relative %import .{dotted} needs the grammar's file "
                                 "(grammar_path=); grammar text has no folder to import from "
                                 "(Lark's and structgen's own grammars import without a dot, "
                                 "e.g. %import common.WS)", dotted)
        return self._read_file(os.path.join(base_path, grammar_path), "." + dotted)


def lark_import_loader(import_paths: Sequence[str | os.PathLike[str]] = (),
                       grammar_path: str | os.PathLike[str] | None = None) -> _ImportLoader:
    """A loader for ``lark.Lark(text, import_paths=[loader])`` with the same rule as
    :func:`compile_lark`: ``%import`` reads only packaged grammars, ``import_paths`` and (relative
    imports) the folder of ``grammar_path``. A refused import raises an exception that is not an
    ``OSError`` (so Lark tries nothing else). For code that runs Lark itself (oracles)."""
    grammar_dir = os.path.dirname(os.path.abspath(grammar_path)) if grammar_path is not None else None
    return _ImportLoader(import_folders(import_paths), grammar_dir)


def import_folders(import_paths: str | bytes | os.PathLike[str] | Iterable[object]) -> list[str]:
    """``import_paths`` as a list of folder names (one path alone is one folder, not its letters)."""
    paths: Iterable[object] = [import_paths] if isinstance(import_paths, (str, bytes, os.PathLike)) \
        else import_paths
    out = []
    for p in paths:
        if not isinstance(p, (str, os.PathLike)):
            raise GrammarError(f"import_paths holds {type(p).__name__}, not a folder path")
        out.append(os.fspath(p))
    return out


def _import_position(text: str, dotted: str, positions: dict[str, tuple[int, int]]
                     ) -> tuple[int | None, int | None]:
    got = positions.get(dotted.lstrip("."))
    if got is not None:
        return got
    return directive_line(text, "%import")


def load_lark_grammar(text: str, *, import_paths: Sequence[str | os.PathLike[str]] = (),
                      grammar_path: str | os.PathLike[str] | None = None,
                      max_literal_length: int | None = None) -> Grammar:
    """Parse ``text`` with Lark's grammar loader; returns its ``Grammar`` (pre-EBNF trees).

    ``%import`` reads only through :class:`_ImportLoader`: packaged grammars, ``import_paths``
    and (relative imports) the folder of ``grammar_path``; never the working folder. A literal
    longer than ``max_literal_length`` characters (default:
    ``CompileOptions.max_literal_length``) is a GrammarError before Lark sees the text
    (:func:`check_literal_lengths`).
    """
    from lark.exceptions import LarkError
    from lark.load_grammar import GrammarBuilder

    if max_literal_length is None:
        max_literal_length = CompileOptions().max_literal_length
    check_literal_lengths(text, max_literal_length)

    loader = lark_import_loader(import_paths, grammar_path)
    positions: dict[str, tuple[int, int]] = {}

    class Builder(GrammarBuilder):  # records where each top-level %import names its grammar
        def _unpack_import(self, stmt: Any, grammar_name: str) -> Any:
            dotted_path, base_path, aliases = super()._unpack_import(stmt, grammar_name)
            first = stmt.children[0].children[0] if stmt.children and stmt.children[0].children \
                else None
            line, column = getattr(first, "line", None), getattr(first, "column", None)
            if isinstance(line, int) and isinstance(column, int):
                positions.setdefault(".".join(dotted_path), (line, column))
            return dotted_path, base_path, aliases

    builder = Builder(import_paths=[loader])
    # the grammar's name is its absolute path when it has a file (relative imports start
    # from its folder), else a name without a folder (relative imports are refused)
    name = os.path.abspath(grammar_path) if grammar_path is not None else "<grammar>"
    try:
        builder.load_grammar(text, name)
        grammar = builder.build()
    except _ImportRefused as exc:
        line, col = _import_position(text, exc.dotted, positions)
        raise grammar_error(GrammarError, exc.message, text, line, col) from None
    except RecursionError as exc:
        raise GrammarError("grammar is nested too deeply") from exc
    except (LarkError, OSError, AssertionError, AttributeError, KeyError, ValueError,
            TypeError) as exc:
        raise _translate_lark_error(exc, text) from exc
    return grammar
