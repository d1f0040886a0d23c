"""Lark grammar text -> structgen grammar IR (and a compiled grammar).

Semantics
---------
A Lark grammar is read *scannerless*, exactly as
``lark.Lark(text, parser="earley", lexer="dynamic_complete", start=start)`` reads it: a
string is accepted iff that Lark parser parses it completely. Concretely:

* **Terminals** are regular languages. String literals become literal bytes (UTF-8);
  ``"..."i`` matches case-insensitively with Python ``re``'s case equivalence (so
  ``"like"i`` also matches ``LIKE`` spelled with the Kelvin sign, as Lark does).
  ``/regex/flags`` goes through :func:`structgen.frontends.regex.compile_regex` (Python dialect,
  Lark's flags). ``"a".."z"`` is a code-point range. Terminals that use other terminals
  are inlined (no ``%ignore`` inside a terminal). Terminal priorities are ignored.
* **Rules** become IR rules over :class:`~structgen.grammar.ir.Ref`. EBNF operators map to IR
  repetition directly (``x*`` -> ``star``, ``x+`` -> ``plus``, ``x?``/``[x]`` -> ``opt``,
  ``x ~ n`` / ``x ~ n..m`` -> ``rep``), so repetitions never become recursive rules.
  Left recursion is removed without changing the language: immediate left recursion
  (``a: a x | y``) becomes ``y x*``, and left recursion through other rules is first
  made immediate by substituting leading rule references (Paull's algorithm), after
  making the grammar empty-free when left recursion hides behind rules that can match
  the empty string (``a: b a x`` with ``b`` nullable). So every context-free Lark
  grammar converts; only an excessive size increase raises GrammarError.
* ``%ignore`` terminals may occur at the beginning and end of the input and between any
  two terminals of the rule level, *as Lark munches them*: at a token boundary Lark tries
  the next token right there and after each ignore match, and an ignore match is the
  longest one (its regex's first match). For the usual ignore terminals (whitespace runs,
  line and block comments: every character that extends a match keeps it a match) that
  is a one-byte lookahead condition, which structgen builds into the text before each
  terminal occurrence and at the end of the start rule (see :class:`_Ignore`); so a
  comment can never be cut short and its tail read as tokens. Each boundary gets exactly
  one such piece, which adds no ambiguity of its own.
* Things that do not change the language are ignored: rule and terminal priorities,
  ``?rule`` inlining, ``_rule``/``_TERM`` filtering, ``!rule``, aliases (``-> name``).
  Templates are expanded (one IR rule per distinct instantiation); ``%import`` of Lark's
  own grammars (``common``, ``unicode``, ...) is resolved through Lark, as are
  ``%override`` and ``%extend``. ``%import`` reads nothing else but structgen's packaged
  grammars, the folders the caller allows (``import_paths``) and, for relative imports, the
  folder of the grammar file (``grammar_path``); never the working folder.

Errors (all :class:`~structgen.errors.GrammarError` or a subclass):
grammar syntax errors -> :class:`~structgen.errors.GrammarSyntaxError` with line, column
and a caret line; undefined or duplicate names -> the line where the name is used or
defined (when it can be found in the text); ``%declare`` (a terminal fed by an external
lexer cannot be enforced scannerless); an ``%import`` outside the allowed places (relative
``%import`` in grammar text without a file); an unsupported regex (the
:class:`~structgen.errors.RegexError` is wrapped, naming the terminal); repetition
counts above :data:`MAX_REPEAT`; grammars that expand above :data:`MAX_EXPANDED_SIZE`.

Where structgen deliberately differs from Lark
----------------------------------------------
* Lark's dynamic lexer finds a regex terminal's possible lengths with Python's
  leftmost-first backtracking (the first match, then re-matching its prefixes). That
  misses lengths a regex could match when it prefers a shorter match: lazy quantifiers
  (``/a+?/`` only ever matches ``a``), anchors (``^``/``$`` refer to the whole input, not
  the token) and alternations whose earlier branch is a prefix of a later one
  (``/a|ab/`` never matches ``ab``). Lazy quantifiers and anchors in a terminal raise
  :class:`GrammarError`; for prefix-ordered alternations structgen uses the regex's full
  (declarative) language, a superset of what Lark finds. (Lark itself sorts the
  alternatives of a *composite* terminal longest-first, so ``"a" | "ab"`` is fine.)
* An ``%ignore`` terminal for which "longest match" is not a one-byte lookahead (some
  character extends a match into a non-match, e.g. ``/a(bc)?/``) makes structgen fall
  back to allowing any sequence of ignore matches at a boundary (``star``), a superset of
  what Lark allows.
* Lark's ``common.ESCAPED_STRING`` and ``common.C_COMMENT`` are written with a lazy
  quantifier (and a lookbehind); under Lark's dynamic lexer they match exactly
  ``"(?:[^"\\\\\\n]|\\\\[^\\n])*"`` and ``/\\*(?:[^*]|\\*+[^*/])*\\*+/``, which is what
  structgen uses for them.
* Extensions (grammars Lark rejects but whose meaning is clear): terminals that can match
  the empty string (Lark: "Dynamic Earley doesn't allow zero-width regexps") and the
  empty literal ``""``. Lark's purely structural checks that do not concern the language
  (duplicate alternatives ``a: b | b``, aliases on ``_rule``s) are not repeated; every
  other grammar error Lark reports is an error here too.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from structgen.errors import GrammarError, GrammarSyntaxError, RegexError
from structgen.grammar import ir

if TYPE_CHECKING:  # pragma: no cover
    from structgen.config import CompileOptions
    from structgen.grammar.automaton import CompiledGrammar

__all__ = [
    "MAX_REPEAT", "MAX_EXPANDED_SIZE", "lark_to_grammar", "compile_lark",
    "builtin_grammar", "list_builtin_grammars",
]

MAX_REPEAT = 10_000
"""Largest count accepted in ``x ~ n`` / ``x ~ n..m`` (larger raises GrammarError)."""

MAX_EXPANDED_SIZE = 2_000_000
"""Largest grammar size (IR nodes with every bounded repetition expanded) accepted."""

_MAX_TEMPLATE_INSTANCES = 10_000
_MAX_LEFT_EXPANSION = 1_000

# The composite terminals of lark's common.lark whose regexes use lazy quantifiers, by
# the raw literals they flatten to, and what they match under the dynamic lexer.
_KNOWN_LAZY = {
    ('"\\""', "/.*?/", "/(?<!\\\\)(\\\\\\\\)*?/", '"\\""'): r'"(?:[^"\\\n]|\\[^\n])*"',
    ('"/*"', "/(.|\\n)*?/", '"*/"'): r"/\*(?:[^*]|\*+[^*/])*\*+/",
}


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


def _pos(tok: Any) -> tuple[int | None, int | None]:
    """(line, column) of a Lark token, when it has them."""
    return getattr(tok, "line", None), getattr(tok, "column", None)


def _error(cls: type[GrammarError], message: str, text: str, line: int | None = None,
           column: int | None = None) -> GrammarError:
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


def _locate(text: str, name: str, *, definition: bool = False, nth: int = 0) -> tuple[int | None, int | None]:
    hits = [(ln, col) for ln, col, is_def in _name_uses(text, name) if is_def == definition]
    if len(hits) > nth:
        return hits[nth]
    return None, None


def _directive_line(text: str, directive: str) -> tuple[int | None, int | None]:
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
        return _error(GrammarSyntaxError, msg, text, line if isinstance(line, int) and line > 0 else None,
                      col if isinstance(col, int) and col > 0 else None)
    msg = str(exc.args[0]) if exc.args else str(exc)
    m = re.search(r"line (\d+) column (\d+)", msg)
    if m:
        head = re.split(r",? at line \d+ column \d+|Unexpected input at line", msg)[0].strip()
        head = head or "unexpected input"
        return _error(GrammarSyntaxError, f"grammar syntax error: {head}", text,
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
            line, col = _locate(text, m.group(1), definition=definition, nth=nth)
            return _error(GrammarError, msg, text, line, col)
    if isinstance(exc, OSError):
        line, col = _directive_line(text, "%import")
        return _error(GrammarError, f"cannot resolve %import: {exc}", text, line, col)
    return _error(GrammarError, msg or type(exc).__name__, text)


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

    def __call__(self, base_path: Any, grammar_path: str) -> tuple[Any, str]:
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
                from structgen import grammars

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
                       grammar_path: str | os.PathLike[str] | None = None) -> Any:
    """A loader for ``lark.Lark(text, import_paths=[loader])`` with the same rule as
    :func:`compile_lark`: ``%import`` reads only packaged grammars, ``import_paths`` and (relative
    imports) the folder of ``grammar_path``. A refused import raises an exception that is not an
    ``OSError`` (so Lark tries nothing else). For code that runs Lark itself (oracles)."""
    grammar_dir = os.path.dirname(os.path.abspath(grammar_path)) if grammar_path is not None else None
    return _ImportLoader(_folders(import_paths), grammar_dir)


def _folders(import_paths: Any) -> list[str]:
    """``import_paths`` as a list of folder names (one path alone is one folder, not its letters)."""
    if isinstance(import_paths, (str, bytes, os.PathLike)):
        import_paths = [import_paths]
    out = []
    for p in import_paths:
        if not isinstance(p, (str, os.PathLike)):
            raise GrammarError(f"import_paths holds {type(p).__name__}, not a folder path")
        out.append(os.fspath(p))
    return out


def _import_position(text: str, dotted: str, positions: dict[str, tuple[int, int]]
                     ) -> tuple[int | None, int | None]:
    got = positions.get(dotted.lstrip("."))
    if got is not None:
        return got
    return _directive_line(text, "%import")


def _load(text: str, *, import_paths: Sequence[str | os.PathLike[str]] = (),
          grammar_path: str | os.PathLike[str] | None = None) -> Any:
    """Parse ``text`` with Lark's grammar loader; returns its ``Grammar`` (pre-EBNF trees).

    ``%import`` reads only through :class:`_ImportLoader`: packaged grammars, ``import_paths``
    and (relative imports) the folder of ``grammar_path``; never the working folder.
    """
    from lark.exceptions import LarkError
    from lark.load_grammar import GrammarBuilder

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
        raise _error(GrammarError, exc.message, text, line, col) from None
    except RecursionError as exc:
        raise GrammarError("grammar is nested too deeply") from exc
    except (LarkError, OSError, AssertionError, AttributeError, KeyError, ValueError,
            TypeError) as exc:
        raise _translate_lark_error(exc, text) from exc
    return grammar


# ---------------------------------------------------------------------------
# Conversion
# ---------------------------------------------------------------------------

def _regex_nodes(node: Any) -> Iterator[Any]:
    from structgen.frontends import regex as rx

    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (rx.Concat, rx.Alternation)):
            stack.extend(n.items)
        elif isinstance(n, (rx.Quantified, rx.Group)):
            stack.append(n.item)


class _Converter:
    """Turns Lark's loaded grammar (rule and terminal trees) into IR rules."""

    def __init__(self, grammar: Any, text: str) -> None:
        from lark.grammar import NonTerminal, Terminal
        from lark.lexer import Token
        from lark.tree import Tree

        self.Tree, self.Token, self.NonTerminal, self.Terminal = Tree, Token, NonTerminal, Terminal
        self.text = text
        self.term_trees: dict[str, Any] = {}
        for name, (tree, _prio) in grammar.term_defs:
            self.term_trees[name] = tree
        self.rule_trees: dict[str, Any] = {}
        self.templates: dict[str, tuple[tuple[str, ...], Any]] = {}
        for name, params, tree, _opts in grammar.rule_defs:
            if params:
                self.templates[name] = (tuple(params), tree)
            else:
                self.rule_trees[name] = tree
        declared = sorted([n for n, t in self.term_trees.items() if t is None]
                          + [n for n, t in self.rule_trees.items() if t is None])
        if declared:
            line, col = _directive_line(text, "%declare")
            raise _error(GrammarError, f"%declare'd symbols {', '.join(declared)} need an external "
                         "lexer or postlexer and cannot be enforced scannerless", text, line, col)
        self.terms: dict[str, ir.Expr] = {}        # terminal name -> regular expr
        self.term_busy: set[str] = set()
        self.rules: dict[str, ir.Expr] = {}
        self.pending: list[tuple[str, Any, dict[str, tuple[ir.Expr, str]]]] = []
        self.instances: dict[tuple[str, tuple[ir.Expr, ...]], str] = {}
        self.ignore = _Ignore([self.terminal(n) for n in grammar.ignore])

    # -- terminals ------------------------------------------------------------

    def terminal(self, name: str) -> ir.Expr:
        got = self.terms.get(name)
        if got is not None:
            return got
        tree = self.term_trees.get(name)
        if tree is None:
            line, col = _locate(self.text, name)
            raise _error(GrammarError, f"terminal {name!r} is not defined", self.text, line, col)
        if name in self.term_busy:
            raise GrammarError(f"recursion in terminal {name!r}")
        self.term_busy.add(name)
        try:
            e = self.term_tree(tree, f"terminal {name}")
        finally:
            self.term_busy.discard(name)
        self.terms[name] = e
        return e

    def term_tree(self, t: Any, where: str) -> ir.Expr:
        Tree, Token = self.Tree, self.Token
        if isinstance(t, self.Terminal):
            return self.terminal(t.name)
        if isinstance(t, self.NonTerminal):
            raise GrammarError(f"rule {t.name!r} used inside {where} "
                               "(terminals may only use terminals)")
        if isinstance(t, Token):
            raise GrammarError(f"unexpected token {t!r} in {where}")
        if not isinstance(t, Tree):
            raise GrammarError(f"unexpected {type(t).__name__} in {where}")
        d = t.data
        if d == "expansions":
            return ir.alt(*(self.term_tree(c, where) for c in t.children))
        if d == "expansion":
            sig = self._literal_signature(t)
            if sig is not None and sig in _KNOWN_LAZY:
                return self.regex(_KNOWN_LAZY[sig], "", where, None, check=False)
            return ir.seq(*(self.term_tree(c, where) for c in t.children))
        if d == "value":
            return self.term_tree(t.children[0], where)
        if d == "literal":
            return self.literal(t.children[0], where)
        if d == "range":
            return self.char_range(t.children[0], t.children[1], where)
        if d == "maybe":
            return ir.opt(self.term_tree(t.children[0], where))
        if d == "expr":
            return self.repeat(self.term_tree(t.children[0], where), t.children[1:], where)
        if d == "alias":
            raise GrammarError(f"aliases (->) are not allowed in terminals (in {where})")
        if d == "template_usage":
            raise GrammarError(f"templates cannot be used inside terminals (in {where})")
        raise GrammarError(f"unsupported construct {d!r} in {where}")

    def _literal_signature(self, t: Any) -> tuple[str, ...] | None:
        """Raw literal texts of an expansion made only of (nested) literals, else None."""
        out: list[str] = []
        stack = [t]
        while stack:
            x = stack.pop()
            if isinstance(x, self.Tree):
                if x.data in ("expansion", "value") or (x.data == "expansions" and len(x.children) == 1):
                    stack.extend(reversed(x.children))
                    continue
                if x.data == "literal":
                    out.append(str(x.children[0]))
                    continue
            return None
        return tuple(out)

    def literal(self, tok: Any, where: str) -> ir.Expr:
        from lark.exceptions import LarkError
        from lark.lexer import PatternStr
        from lark.load_grammar import _literal_to_pattern

        raw = str(tok)
        line, col = _pos(tok)
        if tok.type == "STRING" and raw.rstrip("i") == '""':
            return ir.EMPTY  # extension: Lark rejects empty literals
        try:
            pat = _literal_to_pattern(tok)
        except (LarkError, AssertionError, SyntaxError, ValueError) as exc:
            msg = str(exc.args[0]) if exc.args else str(exc)
            raise _error(GrammarError, f"bad literal {raw} in {where}: {msg}", self.text, line, col) from exc
        flags = "".join(pat.flags)
        if isinstance(pat, PatternStr):
            value = pat.value
            if "i" in flags:
                return self.regex(re.escape(value), "i", where, tok, check=False)
            try:
                return ir.lit(value)
            except UnicodeEncodeError as exc:
                raise _error(GrammarError, f"literal {raw} in {where} is not valid Unicode text",
                             self.text, line, col) from exc
        return self.regex(pat.value, flags, where, tok, check=True)

    def regex(self, pattern: str, flags: str, where: str, tok: Any, *, check: bool) -> ir.Expr:
        from structgen.frontends import regex as rx

        line, col = _pos(tok)
        try:
            if check:
                node = rx.parse_regex(pattern, dialect="python", flags=flags)
                for n in _regex_nodes(node):
                    if isinstance(n, rx.Anchor):
                        raise _error(GrammarError, f"regex {tok} in {where} uses an anchor; under Lark's "
                                     "dynamic lexer anchors refer to the whole input, not the token, "
                                     "which structgen cannot express", self.text, line, col)
                    if isinstance(n, rx.Quantified) and not n.greedy and n.min != n.max:
                        raise _error(GrammarError, f"regex {tok} in {where} uses a lazy quantifier; "
                                     "Lark's dynamic lexer then matches only some lengths, which "
                                     "structgen cannot express (use a greedy pattern)", self.text, line, col)
            return rx.compile_regex(pattern, dialect="python", flags=flags, encoding="utf8")
        except RegexError as exc:
            if col is not None and exc.position is not None and tok is not None:
                raw = str(tok)
                if raw[1:raw.rindex("/")] == pattern:  # no escape rewriting: point at the spot
                    col += 1 + exc.position
            raise _error(GrammarError, f"unsupported regex {tok if tok is not None else pattern} in "
                         f"{where}: {exc.message}", self.text, line, col) from exc

    def char_range(self, a: Any, b: Any, where: str) -> ir.Expr:
        from lark.exceptions import LarkError
        from lark.load_grammar import eval_escaping

        from structgen.frontends.regex import char_class_expr

        try:
            lo, hi = eval_escaping(str(a)[1:-1]), eval_escaping(str(b)[1:-1])
        except (LarkError, SyntaxError, ValueError) as exc:
            raise _error(GrammarError, f"bad range {a}..{b} in {where}", self.text, *_pos(a)) from exc
        if len(lo) != 1 or len(hi) != 1 or ord(lo) > ord(hi):
            raise _error(GrammarError, f"bad range {a}..{b} in {where}: endpoints must be single "
                         "characters in order", self.text, *_pos(a))
        return char_class_expr([(ord(lo), ord(hi))])

    def repeat(self, item: ir.Expr, args: list[Any], where: str) -> ir.Expr:
        op = str(args[0])
        if op == "?":
            return ir.opt(item)
        if op == "*":
            return ir.star(item)
        if op == "+":
            return ir.plus(item)
        if op == "~":
            nums = [int(str(x)) for x in args[1:]]
            lo, hi = (nums[0], nums[0]) if len(nums) == 1 else (nums[0], nums[1])
            line, col = _pos(args[1])
            if hi < lo:
                raise _error(GrammarError, f"bad repetition range {lo}..{hi} in {where}",
                             self.text, line, col)
            if hi > MAX_REPEAT:
                raise _error(GrammarError, f"repetition count {hi} in {where} exceeds the limit "
                             f"{MAX_REPEAT}", self.text, line, col)
            return ir.rep(item, lo, hi)
        raise GrammarError(f"unknown operator {op!r} in {where}")

    # -- rules ----------------------------------------------------------------

    def rule_ref(self, name: str) -> ir.Expr:
        if name not in self.rules:
            tree = self.rule_trees.get(name)
            if tree is None:
                line, col = _locate(self.text, name)
                if name in self.templates:
                    raise _error(GrammarError, f"template {name!r} used without arguments",
                                 self.text, line, col)
                raise _error(GrammarError, f"rule {name!r} is not defined", self.text, line, col)
            self.rules[name] = ir.NEVER  # placeholder until converted
            self.pending.append((name, tree, {}))
        return ir.Ref(name)

    def token(self, e: ir.Expr) -> ir.Expr:
        """A terminal occurrence at the rule level: the ignored text before it, then it."""
        return self.ignore.before(e)

    def rule_tree(self, t: Any, where: str, env: dict[str, tuple[ir.Expr, str]]) -> ir.Expr:
        Tree = self.Tree
        if isinstance(t, self.NonTerminal):
            if t.name in env:
                return env[t.name][0]
            return self.rule_ref(t.name)
        if isinstance(t, self.Terminal):
            return self.token(self.terminal(t.name))
        if not isinstance(t, Tree):
            raise GrammarError(f"unexpected {type(t).__name__} in rule {where!r}")
        d = t.data
        if d == "expansions":
            return ir.alt(*(self.rule_tree(c, where, env) for c in t.children))
        if d == "expansion":
            return ir.seq(*(self.rule_tree(c, where, env) for c in t.children))
        if d == "alias":
            return self.rule_tree(t.children[0], where, env)
        if d == "value":
            return self.rule_tree(t.children[0], where, env)
        if d == "literal":
            return self.token(self.literal(t.children[0], f"rule {where!r}"))
        if d == "range":
            return self.token(self.char_range(t.children[0], t.children[1], f"rule {where!r}"))
        if d == "maybe":
            return ir.opt(self.rule_tree(t.children[0], where, env))
        if d == "expr":
            return self.repeat(self.rule_tree(t.children[0], where, env), t.children[1:], f"rule {where!r}")
        if d == "template_usage":
            return self.template(t, where, env)
        raise GrammarError(f"unsupported construct {d!r} in rule {where!r}")

    def _display(self, t: Any, env: dict[str, tuple[ir.Expr, str]]) -> str:
        if isinstance(t, (self.NonTerminal, self.Terminal)):
            return env[t.name][1] if t.name in env else t.name
        if isinstance(t, self.Tree):
            if t.data == "literal":
                return str(t.children[0])
            if t.data == "template_usage":
                return (self._display(t.children[0], env) + "{"
                        + ",".join(self._display(c, env) for c in t.children[1:]) + "}")
            return ",".join(self._display(c, env) for c in t.children)
        return str(t)

    def template(self, t: Any, where: str, env: dict[str, tuple[ir.Expr, str]]) -> ir.Expr:
        head = t.children[0]
        name = head.name
        if name in env:
            raise GrammarError(f"template parameter {name!r} used as a template in {where!r} "
                               "(higher-order templates are not supported)")
        if name not in self.templates:
            line, col = _locate(self.text, name)
            raise _error(GrammarError, f"template {name!r} is not defined", self.text, line, col)
        params, tree = self.templates[name]
        args = t.children[1:]
        if len(args) != len(params):
            line, col = _locate(self.text, name)
            raise _error(GrammarError, f"template {name!r} takes {len(params)} arguments, got {len(args)}",
                         self.text, line, col)
        arg_exprs = tuple(self.rule_tree(a, where, env) for a in args)
        key = (name, arg_exprs)
        inst = self.instances.get(key)
        if inst is None:
            if len(self.instances) >= _MAX_TEMPLATE_INSTANCES:
                raise GrammarError(f"more than {_MAX_TEMPLATE_INSTANCES} template instances "
                                   f"(runaway expansion of {name!r}?)")
            inst = f"{name}{{{','.join(self._display(a, env) for a in args)}}}"
            base, k = inst, 1
            while inst in self.rules or inst in self.rule_trees:
                k += 1
                inst = f"{base}#{k}"
            self.instances[key] = inst
            self.rules[inst] = ir.NEVER
            new_env = {p: (e, self._display(a, env)) for p, e, a in zip(params, arg_exprs, args)}
            self.pending.append((inst, tree, new_env))
        return ir.Ref(inst)

    def convert(self, start: str) -> dict[str, ir.Expr]:
        if start not in self.rule_trees:
            known = ", ".join(sorted(self.rule_trees)) or "none"
            if start in self.templates:
                raise GrammarError(f"start rule {start!r} is a template")
            raise GrammarError(f"start rule {start!r} is not defined (rules: {known})")
        self.rule_ref(start)
        while self.pending:
            name, tree, env = self.pending.pop()
            self.rules[name] = self.rule_tree(tree, name, env)
        return self.rules


# ---------------------------------------------------------------------------
# %ignore: Lark's greedy munching, exactly
# ---------------------------------------------------------------------------

_MAX_IGNORE_NFA = 20_000
_MAX_IGNORE_DFA = 2_000
_MAX_IGNORE_CLASSES = 6


def _regular_dfa(e: ir.Expr) -> tuple[list[list[tuple[int, int, int]]], set[int]] | None:
    """Trimmed byte DFA (start state 0) of a regular, Ref-free IR expression, or None when
    it has unsupported nodes or is too big. Returns (edges per state, accepting states)."""
    eps: list[list[int]] = []
    edges: list[list[tuple[int, int, int]]] = []

    def new() -> int:
        if len(eps) >= _MAX_IGNORE_NFA:
            raise OverflowError
        eps.append([])
        edges.append([])
        return len(eps) - 1

    def build(x: ir.Expr, s: int) -> int:
        if isinstance(x, ir.ByteSet):
            t = new()
            edges[s].extend((lo, hi, t) for lo, hi in x.ranges)
            return t
        if isinstance(x, ir.Seq):
            for it in x.items:
                s = build(it, s)
            return s
        if isinstance(x, ir.Alt):
            t = new()
            for it in x.items:
                a = new()
                eps[s].append(a)
                eps[build(it, a)].append(t)
            return t
        if isinstance(x, ir.Repeat):
            for _ in range(x.min):
                s = build(x.item, s)
            if x.max is None:
                a = new()
                eps[s].append(a)
                eps[build(x.item, a)].append(a)
                return a
            for _ in range(x.max - x.min):
                j = new()
                eps[s].append(j)
                eps[build(x.item, s)].append(j)
                s = j
            return s
        if isinstance(x, ir.Dfa):
            base = [new() for _ in x.trans]
            t = new()
            eps[s].append(base[x.start])
            for q, es in enumerate(x.trans):
                edges[base[q]].extend((lo, hi, base[r]) for lo, hi, r in es)
                if q in x.accept:
                    eps[base[q]].append(t)
            return t
        raise TypeError(type(x).__name__)

    try:
        start = new()
        final = build(e, start)
    except (OverflowError, TypeError):
        return None

    def close(states: set[int]) -> frozenset[int]:
        stack, seen = list(states), set(states)
        while stack:
            for t in eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)

    first = close({start})
    index = {first: 0}
    order = [first]
    trans: list[list[tuple[int, int, int]]] = []
    while len(trans) < len(order):
        cur = order[len(trans)]
        cuts = {0, 256}
        for q in cur:
            for lo, hi, _t in edges[q]:
                cuts.update((lo, hi + 1))
        bounds = sorted(cuts)
        out: list[tuple[int, int, int]] = []
        for lo, nxt in zip(bounds, bounds[1:]):
            hi = nxt - 1
            tgt = {t for q in cur for a, b, t in edges[q] if a <= lo and hi <= b}
            if not tgt:
                continue
            key = close(tgt)
            if key not in index:
                if len(order) >= _MAX_IGNORE_DFA:
                    return None
                index[key] = len(order)
                order.append(key)
            out.append((lo, hi, index[key]))
        trans.append(out)
    accept = {i for i, st in enumerate(order) if final in st}
    live = set(accept)
    changed = True
    while changed:
        changed = False
        for q, out in enumerate(trans):
            if q not in live and any(t in live for _lo, _hi, t in out):
                live.add(q)
                changed = True
    return [[(lo, hi, t) for lo, hi, t in out if t in live] for out in trans], accept


def _utf8_len(lead: int) -> int:
    return 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


def _follow_bytes(trans: list[list[tuple[int, int, int]]], q: int) -> frozenset[int]:
    return frozenset(b for lo, hi, _t in trans[q] for b in range(lo, hi + 1))


def _extension_closed(trans: list[list[tuple[int, int, int]]], accept: set[int]) -> bool:
    """From every accepting state, does every character that keeps the match alive end in
    an accepting state? Then a match is maximal iff the next byte cannot continue it."""
    for q in accept:
        for lo, hi, t in trans[q]:
            for b in range(lo, hi + 1):
                if b >= 0x80 and b < 0xC0:
                    return False  # a continuation byte right after a complete match
                cur = {t}
                for _ in range(_utf8_len(b) - 1):
                    cur = {r for s in cur for a, z, r in trans[s] if z >= 0x80 and a <= 0xBF}
                if any(s not in accept for s in cur):
                    return False
    return True


def _first_bytes(e: ir.Expr) -> frozenset[int]:
    """Over-approximation of the bytes a non-empty string of ``e`` can start with."""
    if isinstance(e, ir.ByteSet):
        return frozenset(b for lo, hi in e.ranges for b in range(lo, hi + 1))
    if isinstance(e, ir.Seq):
        out: set[int] = set()
        for it in e.items:
            out |= _first_bytes(it)
            if not _nullable(it, {}):
                break
        return frozenset(out)
    if isinstance(e, ir.Alt):
        return frozenset().union(*(_first_bytes(x) for x in e.items))
    if isinstance(e, ir.Repeat):
        return _first_bytes(e.item) if e.max != 0 else frozenset()
    if isinstance(e, ir.Dfa):
        return frozenset(b for lo, hi, _t in e.trans[e.start] for b in range(lo, hi + 1))
    if isinstance(e, (ir.And, ir.Diff)):
        return _first_bytes(e.left)
    return frozenset(range(256))


class _Ignore:
    """The text Lark lets through at a token boundary, for a given list of %ignore terminals.

    Lark (dynamic lexer) scans the next token at the boundary itself and at every position
    reached by matching an ignore terminal there, repeatedly; each ignore match is the
    regex's first match, i.e. (for the usual greedy patterns) the longest. When every
    ignore terminal is *extension-closed* (see :func:`_extension_closed`: whitespace runs,
    line and block comments) "longest" is a one-byte lookahead condition: the byte after
    an ignore match must not be one that could continue it. Each ignore terminal's DFA is
    split by the follow set of its accepting states into classes; then the boundary before
    a token T is the least solution of

        K0 = T  | sum_c P_c K_c           (nothing ignored yet: no constraint)
        Kc = T' | sum_d P_d' K_d          (after a maximal match of class c)

    where ``X'`` is X restricted to strings whose first byte cannot continue class c,
    solved with Arden's lemma. If some ignore terminal is not extension-closed the
    declarative ``star(alt(ignores)) T`` is used instead (documented difference).
    """

    def __init__(self, exprs: list[ir.Expr]) -> None:
        self.exprs = exprs
        self.cache: dict[ir.Expr | None, ir.Expr] = {}
        self.classes: list[tuple[ir.Dfa, frozenset[int], frozenset[int]]] | None = None
        self.star = ir.star(ir.alt(*exprs)) if exprs else ir.EMPTY
        if exprs:
            self.classes = self._classes()

    def _classes(self) -> list[tuple[ir.Dfa, frozenset[int], frozenset[int]]] | None:
        out: list[tuple[ir.Dfa, frozenset[int], frozenset[int]]] = []
        for e in self.exprs:
            got = _regular_dfa(e)
            if got is None:
                return None
            trans, accept = got
            accept = {q for q in accept if q != 0}  # zero-width ignores change nothing
            if not accept:
                continue
            if not _extension_closed(trans, accept):
                return None
            groups: dict[frozenset[int], set[int]] = {}
            for q in accept:
                groups.setdefault(_follow_bytes(trans, q), set()).add(q)
            for follow, qs in groups.items():
                dfa = ir.Dfa(0, qs, trans)
                out.append((dfa, follow, _first_bytes(dfa)))
        if len(out) > _MAX_IGNORE_CLASSES:
            return None
        return out

    @staticmethod
    def _restrict_dfa(d: ir.Dfa, allowed: frozenset[int]) -> ir.Expr:
        start_edges = [(b, b, t) for lo, hi, t in d.trans[d.start] for b in range(lo, hi + 1) if b in allowed]
        if not start_edges:
            return ir.NEVER
        return ir.Dfa(len(d.trans), d.accept, list(d.trans) + [start_edges])

    @staticmethod
    def _restrict(e: ir.Expr, allowed: frozenset[int]) -> ir.Expr:
        first = _first_bytes(e)
        if first <= allowed and not _nullable(e, {}):
            return e
        if not (first & allowed):
            return ir.NEVER
        return ir.and_(e, ir.seq(ir.byteset(sorted(allowed)), ir.star(ir.ANY_BYTE)))

    def before(self, token: ir.Expr | None) -> ir.Expr:
        """Ignored text then ``token`` (None: the end of the input)."""
        if not self.exprs:
            return token if token is not None else ir.EMPTY
        got = self.cache.get(token)
        if got is not None:
            return got
        if self.classes is None:
            r = ir.seq(self.star, token) if token is not None else self.star
        else:
            r = self._solve(token)
        self.cache[token] = r
        return r

    def _solve(self, token: ir.Expr | None) -> ir.Expr:
        classes = self.classes or []
        m = len(classes)
        everything = frozenset(range(256))
        allowed = [everything - follow for _d, follow, _f in classes]
        a: list[ir.Expr] = [token if token is not None else ir.EMPTY]
        for c in range(m):
            a.append(self._restrict(token, allowed[c]) if token is not None else ir.EMPTY)
        b = [[ir.NEVER] * (m + 1) for _ in range(m + 1)]
        for j, (d, _follow, first) in enumerate(classes):
            b[0][j + 1] = d
            for c in range(m):
                b[c + 1][j + 1] = d if first <= allowed[c] else self._restrict_dfa(d, allowed[c])
        for i in range(m, 0, -1):  # eliminate K_i (Arden: K = X K | Y  =>  K = X* Y)
            loop = ir.star(b[i][i])
            ai = ir.seq(loop, a[i])
            bi = [ir.seq(loop, b[i][j]) for j in range(i)]
            for k in range(i):
                if b[k][i] == ir.NEVER:
                    continue
                a[k] = ir.alt(a[k], ir.seq(b[k][i], ai))
                for j in range(i):
                    if bi[j] != ir.NEVER:
                        b[k][j] = ir.alt(b[k][j], ir.seq(b[k][i], bi[j]))
                b[k][i] = ir.NEVER
        return ir.seq(ir.star(b[0][0]), a[0])


# ---------------------------------------------------------------------------
# Left recursion
# ---------------------------------------------------------------------------

def _nullable_rules(rules: dict[str, ir.Expr]) -> dict[str, bool]:
    null = dict.fromkeys(rules, False)
    changed = True
    while changed:
        changed = False
        for name, e in rules.items():
            if not null[name] and _nullable(e, null):
                null[name] = changed = True
    return null


def _nullable(e: ir.Expr, null: dict[str, bool]) -> bool:
    if isinstance(e, ir.ByteSet):
        return False
    if isinstance(e, ir.Seq):
        return all(_nullable(x, null) for x in e.items)
    if isinstance(e, ir.Alt):
        return any(_nullable(x, null) for x in e.items)
    if isinstance(e, ir.Repeat):
        return e.min == 0 or _nullable(e.item, null)
    if isinstance(e, ir.Ref):
        return null.get(e.name, False)
    if isinstance(e, ir.And):
        return _nullable(e.left, null) and _nullable(e.right, null)
    if isinstance(e, ir.Diff):
        return _nullable(e.left, null) and not _nullable(e.right, null)
    if isinstance(e, ir.Dfa):
        return e.start in e.accept
    raise TypeError(f"unknown IR node {type(e).__name__}")


def _left_refs(e: ir.Expr, null: dict[str, bool], out: set[str]) -> None:
    """Add to ``out`` the rules that can be called before any byte is consumed in ``e``."""
    if isinstance(e, ir.Ref):
        out.add(e.name)
    elif isinstance(e, ir.Seq):
        for x in e.items:
            _left_refs(x, null, out)
            if not _nullable(x, null):
                break
    elif isinstance(e, ir.Alt):
        for x in e.items:
            _left_refs(x, null, out)
    elif isinstance(e, ir.Repeat):
        if e.max != 0:
            _left_refs(e.item, null, out)
    elif isinstance(e, (ir.And, ir.Diff)):
        _left_refs(e.left, null, out)
        _left_refs(e.right, null, out)


def _leading_branches(items: tuple[ir.Expr, ...], name: str, null: dict[str, bool],
                      budget: list[int], active: set[tuple[ir.Expr, ...]] | None = None
                      ) -> list[tuple[ir.Expr, ...]]:
    """Distribute leading Seq/Alt/Repeat of ``items`` so that any branch that can start with
    ``Ref(name)`` visibly does; other branches are left intact. The union of the returned
    branches is the language of ``items``."""
    if not items:
        return [()]
    first, rest = items[0], items[1:]
    lead: set[str] = set()
    _left_refs(first, null, lead)
    can_be_empty = _nullable(first, null)
    rest_lead: set[str] = set()
    if can_be_empty:
        for x in rest:
            _left_refs(x, null, rest_lead)
            if not _nullable(x, null):
                break
    if name not in lead and name not in rest_lead:
        return [items]
    if isinstance(first, ir.Ref) or not isinstance(first, (ir.Seq, ir.Alt, ir.Repeat)):
        return [items]
    if isinstance(first, ir.Repeat) and first.max == 0:
        return [items]
    active = set() if active is None else active
    if items in active:
        # reached again without consuming input (through empty choices): by the least
        # fixpoint this branch adds nothing the others do not already give
        return []
    budget[0] -= 1
    if budget[0] < 0:
        raise GrammarError(f"left recursion of rule {name!r} is too entangled to remove; "
                           "rewrite it with repetition")
    active.add(items)
    try:
        if isinstance(first, ir.Seq):
            return _leading_branches(first.items + rest, name, null, budget, active)
        if isinstance(first, ir.Alt):
            out: list[tuple[ir.Expr, ...]] = []
            for x in first.items:
                out.extend(_leading_branches((x,) + rest, name, null, budget, active))
            return out
        assert isinstance(first, ir.Repeat)
        # item{m,M} = item item{m-1,M-1}   (m >= 1)   |   eps | item item{0,M-1}   (m == 0)
        more = ir.rep(first.item, max(first.min - 1, 0), None if first.max is None else first.max - 1)
        out = _leading_branches((first.item, more) + rest, name, null, budget, active)
        if first.min == 0:
            out = _leading_branches(rest, name, null, budget, active) + out
        return out
    finally:
        active.discard(items)


def _left_graph(rules: dict[str, ir.Expr], null: dict[str, bool]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, e in rules.items():
        s: set[str] = set()
        _left_refs(e, null, s)
        graph[name] = {x for x in s if x in rules}
    return graph


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components, each in rule (definition) order."""
    from structgen.grammar.graphs import strongly_connected_components

    order = {n: i for i, n in enumerate(graph)}
    return strongly_connected_components(graph, graph, key=order.__getitem__)


def _substitute_leading(e: ir.Expr, target: str, body: ir.Expr, null: dict[str, bool]) -> ir.Expr:
    """``e`` with every leading ``Ref(target)`` replaced by ``body`` (same language)."""
    lead: set[str] = set()
    _left_refs(e, null, lead)
    if target not in lead:
        return e
    branches = _leading_branches((e,), target, null, [_MAX_LEFT_EXPANSION])
    return ir.alt(*(ir.seq(body, *br[1:]) if br and br[0] == ir.Ref(target) else ir.seq(*br)
                    for br in branches))


def _remove_immediate(name: str, e: ir.Expr, null: dict[str, bool]) -> ir.Expr:
    """``A -> A a | b``  =>  ``A -> b a*`` (with the branches made visible first)."""
    lead: set[str] = set()
    _left_refs(e, null, lead)
    if name not in lead:
        return e
    rec: list[ir.Expr] = []
    base: list[ir.Expr] = []
    found = False
    for br in _leading_branches((e,), name, null, [_MAX_LEFT_EXPANSION]):
        if br and br[0] == ir.Ref(name):
            found = True
            tail = ir.seq(*br[1:])
            if tail != ir.EMPTY:  # A -> A adds nothing
                rec.append(tail)
        else:
            base.append(ir.seq(*br))
    return ir.seq(ir.alt(*base), ir.star(ir.alt(*rec))) if found else e


def _paull(rules: dict[str, ir.Expr]) -> tuple[dict[str, ir.Expr], list[str] | None]:
    """Paull's algorithm per left-recursive group; returns the rules and a remaining cycle."""
    null = _nullable_rules(rules)  # the rewrites preserve each rule's language
    out = dict(rules)
    for comp in _sccs(_left_graph(rules, null)):
        if len(comp) == 1 and comp[0] not in _left_graph({comp[0]: out[comp[0]]}, null)[comp[0]]:
            continue
        for i, a in enumerate(comp):
            e = out[a]
            for b in comp[:i]:
                e = _substitute_leading(e, b, out[b], null)
            out[a] = _remove_immediate(a, e, null)
        if _expanded_size({n: out[n] for n in comp}) > MAX_EXPANDED_SIZE:
            raise GrammarError(f"removing the left recursion of rules {', '.join(comp)} makes the "
                               "grammar too large; rewrite it with repetition")
    return out, _find_cycle(_left_graph(out, _nullable_rules(out)))


def _nonempty(e: ir.Expr, null: dict[str, bool]) -> ir.Expr:
    """L(e) without the empty string, for ``e`` whose nullable rule references are already
    written as ``opt(Ref(A+))`` (so nullability is syntactic)."""
    if isinstance(e, (ir.ByteSet, ir.Ref)):
        return e if not _nullable(e, null) else ir.NEVER
    if isinstance(e, ir.Seq):
        if not e.items:
            return ir.NEVER
        head, rest = e.items[0], ir.seq(*e.items[1:])
        first = ir.seq(_nonempty(head, null), rest)
        return ir.alt(first, _nonempty(rest, null)) if _nullable(head, null) else first
    if isinstance(e, ir.Alt):
        return ir.alt(*(_nonempty(x, null) for x in e.items))
    if isinstance(e, ir.Repeat):
        if e.max == 0:
            return ir.NEVER
        if _nullable(e.item, null):  # empty items can pad up to the minimum
            return ir.rep(_nonempty(e.item, null), 1, e.max)
        return e if e.min >= 1 else ir.rep(e.item, 1, e.max)
    if isinstance(e, ir.Dfa):
        if e.start not in e.accept:
            return e
        return ir.Dfa(len(e.trans), e.accept, list(e.trans) + [e.trans[e.start]])
    if isinstance(e, ir.And):
        return ir.and_(_nonempty(e.left, null), e.right)
    if isinstance(e, ir.Diff):
        return ir.diff(_nonempty(e.left, null), e.right)
    raise TypeError(f"unknown IR node {type(e).__name__}")


def _replace_refs(e: ir.Expr, repl: dict[str, ir.Expr]) -> ir.Expr:
    if isinstance(e, ir.Ref):
        return repl.get(e.name, e)
    if isinstance(e, ir.Seq):
        return ir.seq(*(_replace_refs(x, repl) for x in e.items))
    if isinstance(e, ir.Alt):
        return ir.alt(*(_replace_refs(x, repl) for x in e.items))
    if isinstance(e, ir.Repeat):
        return ir.rep(_replace_refs(e.item, repl), e.min, e.max)
    if isinstance(e, ir.And):
        return ir.and_(_replace_refs(e.left, repl), _replace_refs(e.right, repl))
    if isinstance(e, ir.Diff):
        return ir.diff(_replace_refs(e.left, repl), _replace_refs(e.right, repl))
    return e


def _without_empty_rules(rules: dict[str, ir.Expr], start: str) -> dict[str, ir.Expr]:
    """An equivalent grammar in which no rule but ``start`` derives the empty string: each
    nullable rule A gets a rule ``A+`` for its non-empty strings and every reference to A
    becomes ``opt(Ref(A+))``."""
    null = _nullable_rules(rules)
    plus = {a: f"{a}+" for a, n in null.items() if n}
    repl = {a: ir.opt(ir.Ref(p)) for a, p in plus.items()}
    null2 = dict.fromkeys(list(rules) + list(plus.values()), False)
    out: dict[str, ir.Expr] = {}
    for a, e in rules.items():
        body = _replace_refs(e, repl)
        if a in plus:
            out[plus[a]] = _nonempty(body, null2)
            if a == start:
                out[a] = ir.opt(ir.Ref(plus[a]))
        else:
            out[a] = body
    return _prune(out, start)


def _prune(rules: dict[str, ir.Expr], start: str) -> dict[str, ir.Expr]:
    keep = {start}
    todo = [start]
    while todo:
        refs: set[str] = set()
        _collect_refs(rules[todo.pop()], refs)
        for r in refs:
            if r not in keep and r in rules:
                keep.add(r)
                todo.append(r)
    return {n: e for n, e in rules.items() if n in keep}


def _eliminate_left_recursion(rules: dict[str, ir.Expr], start: str) -> dict[str, ir.Expr]:
    """Remove left recursion without changing the language. Within each left-recursive
    group of rules A1..An (in rule order), leading references to earlier rules of the
    group are replaced by their (already rewritten) bodies, then immediate left recursion
    ``A -> A a | b`` becomes ``A -> b a*`` (Paull's algorithm). If left recursion hidden
    behind rules that derive the empty string survives, the grammar is first made
    empty-free (see :func:`_without_empty_rules`) and the algorithm rerun."""
    out, cycle = _paull(rules)
    if cycle:
        out, cycle = _paull(_without_empty_rules(rules, start))
    if cycle:  # pragma: no cover - an empty-free grammar has no hidden left recursion
        path = " -> ".join(cycle + [cycle[0]])
        raise GrammarError(f"left recursion through rules {path} could not be removed; "
                           "rewrite it with repetition")
    return out


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(graph, WHITE)
    for root in sorted(graph):
        if color[root] != WHITE:
            continue
        stack: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        path = [root]
        color[root] = GREY
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                color[node] = BLACK
            elif color[nxt] == GREY:
                return path[path.index(nxt):]
            elif color[nxt] == WHITE:
                color[nxt] = GREY
                path.append(nxt)
                stack.append((nxt, iter(sorted(graph[nxt]))))
    return None


# ---------------------------------------------------------------------------
# Size guard
# ---------------------------------------------------------------------------

def _expanded_size(rules: dict[str, ir.Expr]) -> int:
    memo: dict[int, int] = {}

    def size(e: ir.Expr) -> int:
        k = id(e)
        got = memo.get(k)
        if got is not None:
            return got
        if isinstance(e, (ir.Seq, ir.Alt)):
            r = 1 + sum(size(x) for x in e.items)
        elif isinstance(e, ir.Repeat):
            r = 1 + size(e.item) * max(1, e.max if e.max is not None else e.min)
        elif isinstance(e, (ir.And, ir.Diff)):
            r = 1 + size(e.left) + size(e.right)
        elif isinstance(e, ir.Dfa):
            r = 1 + len(e.trans)
        else:
            r = 1
        r = min(r, MAX_EXPANDED_SIZE + 1)
        memo[k] = r
        return r

    total = 0
    for e in rules.values():
        total += size(e)
        if total > MAX_EXPANDED_SIZE:
            break
    return total


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------

def lark_to_grammar(text: str, *, start: str = "start",
                    import_paths: Sequence[str | os.PathLike[str]] = (),
                    grammar_path: str | os.PathLike[str] | None = None) -> ir.Grammar:
    """Convert Lark grammar ``text`` into a structgen :class:`~structgen.grammar.ir.Grammar`.

    The grammar's language is the set of strings ``lark.Lark(text, parser="earley",
    lexer="dynamic_complete", start=start)`` parses completely (see the module docstring
    for the exact semantics and the few documented differences). Only rules reachable
    from ``start`` are converted. Raises :class:`~structgen.errors.GrammarSyntaxError` for
    malformed grammar text and :class:`~structgen.errors.GrammarError` for everything
    else that is wrong or unsupported, with a line and column where one is known.
    Cost: about linear in the grammar size (Lark's grammar parser plus a few passes over the
    trees); removing left recursion can enlarge the rules involved, within
    :data:`MAX_EXPANDED_SIZE`.

    ``%import`` reads only Lark's and structgen's packaged grammars, files in the
    ``import_paths`` folders and, for relative imports (``%import .sub.rule``), files below the
    folder of ``grammar_path`` (the file ``text`` was read from; without it grammar text has no
    folder and relative imports are a GrammarError). Never the working folder; an import that
    is refused is a GrammarError with the line and column of the import.
    """
    if not isinstance(text, str):
        raise TypeError(f"grammar text must be str, not {type(text).__name__}")
    if not isinstance(start, str) or not start:
        raise GrammarError("start must be a non-empty rule name")
    grammar = _load(text, import_paths=tuple(_folders(import_paths)), grammar_path=grammar_path)
    try:
        conv = _Converter(grammar, text)
        rules = conv.convert(start)
        rules = _eliminate_left_recursion(rules, start)
        size = _expanded_size(rules)
    except RecursionError as exc:
        raise GrammarError("grammar is nested too deeply to convert") from exc
    if size > MAX_EXPANDED_SIZE:
        raise GrammarError(f"grammar is too large once repetitions are expanded (more than "
                           f"{MAX_EXPANDED_SIZE} IR nodes); reduce the repetition counts")
    root = start
    tail = conv.ignore.before(None)
    if tail != ir.EMPTY:
        used_inside: set[str] = set()
        for e in rules.values():
            _collect_refs(e, used_inside)
        if start in used_inside:
            root = "__top__"
            rules[root] = ir.seq(ir.Ref(start), tail)
        else:
            rules[start] = ir.seq(rules[start], tail)
    return ir.Grammar(rules, root)


def _collect_refs(e: ir.Expr, out: set[str]) -> None:
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, ir.Ref):
            out.add(x.name)
        elif isinstance(x, (ir.Seq, ir.Alt)):
            stack.extend(x.items)
        elif isinstance(x, ir.Repeat):
            stack.append(x.item)
        elif isinstance(x, (ir.And, ir.Diff)):
            stack.extend((x.left, x.right))


_LRU: OrderedDict[tuple[Any, ...], CompiledGrammar] = OrderedDict()
_LRU_LOCK = threading.Lock()
_LRU_SIZE = 32


def compile_lark(text: str, *, start: str = "start",
                 compile_options: CompileOptions | None = None,
                 import_paths: Sequence[str | os.PathLike[str]] = (),
                 grammar_path: str | os.PathLike[str] | None = None) -> CompiledGrammar:
    """Compile Lark grammar ``text`` to a :class:`~structgen.grammar.automaton.CompiledGrammar`.

    Equivalent to ``compile_grammar(lark_to_grammar(text, start=start), compile_options)``;
    the result is kept in a small thread-safe LRU cache keyed by ``(text, start, options)`` (and
    the import settings; an imported file edited later is not re-read while the entry is cached).
    ``import_paths`` / ``grammar_path``: where ``%import`` may read, as for :func:`lark_to_grammar`.
    Raises what :func:`lark_to_grammar` and :func:`~structgen.grammar.automaton.compile_grammar`
    raise (GrammarError, CompileLimitError, CompileTimeoutError).
    """
    from structgen.grammar.automaton import compile_grammar
    from structgen.grammar.gcpause import gc_paused

    imports = tuple(_folders(import_paths))
    where = os.fspath(grammar_path) if grammar_path is not None else None
    key = (text, start, compile_options, imports, where)
    with _LRU_LOCK:
        hit = _LRU.get(key)
        if hit is not None:
            _LRU.move_to_end(key)
            return hit
    with gc_paused():
        compiled = compile_grammar(lark_to_grammar(text, start=start, import_paths=imports,
                                                   grammar_path=where), compile_options)
    with _LRU_LOCK:
        _LRU[key] = compiled
        _LRU.move_to_end(key)
        while len(_LRU) > _LRU_SIZE:
            _LRU.popitem(last=False)
    return compiled


def list_builtin_grammars() -> list[str]:
    """Names (without ``.lark``) of the grammars shipped with structgen, sorted."""
    from structgen import grammars

    return grammars.available()


def builtin_grammar(name: str) -> str:
    """Text of the shipped grammar ``name`` (``"json"`` or ``"json.lark"``), read from the
    package data of :mod:`structgen.grammars`. Raises :class:`GrammarError` listing the
    available names."""
    from structgen import grammars

    try:
        return grammars.read_grammar(name)
    except FileNotFoundError:
        raise GrammarError(f"no built-in grammar {name!r}; available: "
                           f"{', '.join(grammars.available()) or 'none'}") from None
