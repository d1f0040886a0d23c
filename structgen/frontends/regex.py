"""Regular expressions -> grammar IR, exact at the level of UTF-8 bytes.

Two dialects:

* ``"python"``: Python :mod:`re` syntax and semantics for ``str`` patterns (used for Lark
  terminals). ``\\d``, ``\\w`` and ``\\s`` are Unicode-aware exactly as ``re`` defines
  them (computed by running ``re`` itself over every code point); IGNORECASE uses
  ``re``'s case equivalence (simple lowercase plus ``re``'s table of extra cases).
  Extensions over ``re``: ``\\p{..}``/``\\P{..}`` general categories, ``(?<name>..)``
  and ``\\z``.
* ``"ecma"``: ECMA-262 syntax (JSON Schema ``pattern``), matched by code point.
  ``\\u{..}``, ``\\p{..}`` and surrogate-pair escapes are always accepted (as with the
  ``u`` flag); the ``u`` flag additionally makes identity escapes strict. ``\\d``/``\\w``
  are ASCII, ``\\s`` is WhiteSpace + LineTerminator, ``.`` excludes the four line
  terminators, ``$`` is the very end (``^``/``$`` see line terminators only with ``m``).
  Modifier groups (``(?i:..)``, ``(?-s:..)``; flags ``i``, ``m``, ``s``) are accepted, and
  as an extension the same flags set globally at the start (``(?i)``). Python-only syntax
  (``\\A``, ``\\Z``, ``(?P<name>..)``, possessive quantifiers, ``(?x)``) is an error that
  says so.
  The ``i`` flag uses the same case equivalence as the Python dialect (close to ECMA's
  ``u``-mode simple case folding), applied to every set including ``\\w`` and ``\\p``.
  Annex B leniency kept without the ``u`` flag: a ``{`` that does not start a quantifier
  is a literal, ``[\\w-.]`` is a union, other non-alphanumeric characters may be escaped;
  legacy octal escapes and unknown letter escapes are always errors.

Everything that would change the language in a way the IR cannot express (backrefs,
lookaround, word boundaries, conditionals, atomic groups, possessive quantifiers,
anchors that are not at the start/end of a top-level alternative) raises
:class:`~structgen.errors.RegexError` with the 0-based offset of the construct.

Encodings (what a matched code point becomes in the byte language):

* ``"utf8"``: its UTF-8 bytes; surrogates U+D800..U+DFFF are never matched.
* ``"json"``: any way it may appear *inside* a JSON string literal: raw UTF-8 (except
  ``"``, ``\\`` and U+0000..U+001F, which are only escaped), the short escapes
  (``\\" \\\\ \\/ \\b \\f \\n \\r \\t``), ``\\uXXXX`` with hex digits of either case for
  every BMP code point, and a ``\\uD8xx\\uDCxx`` surrogate-pair escape for astral code
  points. Lone surrogate escapes are never accepted. This is the escape layer of
  :mod:`structgen.frontends.json_escape` (``json_class``), which every string language shares.
* ``"json-canonical"``: the one spelling ``json.dumps(s, ensure_ascii=False)`` writes (raw
  UTF-8; ``\\"``, ``\\\\`` and control characters escaped): what generation uses.

Code-point sets become compact IR: ranges are split into sub-ranges that share UTF-8
(or hex-digit) prefixes, common prefixes are factored and siblings with equal tails
merged, so "any code point" is a handful of alternatives. Encoded sets are cached per
process (:func:`char_class_expr`), so compiling a typical schema pattern takes well
under a millisecond once the Unicode tables are built.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from structgen.errors import RegexError
from structgen.frontends import json_escape
from structgen.frontends import unicode_data as ud
from structgen.grammar import ir

if TYPE_CHECKING:  # pragma: no cover
    from structgen.grammar.compiled import CompiledGrammar

__all__ = [
    "MAX_REPEAT", "RegexNode", "CharSet", "Concat", "Alternation", "Quantified", "Group",
    "Anchor", "parse_regex", "compile_regex", "char_class_expr", "any_char_expr",
    "compile_regex_grammar",
]

MAX_REPEAT = 10_000
"""Largest repetition count accepted in ``{m,n}``; larger counts raise RegexError."""

_DIALECTS = ("python", "ecma")
_ENCODINGS = ("utf8", "json", "json-canonical")


# ---------------------------------------------------------------------------
# AST
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class RegexNode:
    """Base class of parsed regex nodes. Flags (case, dotall, ...) are already applied."""


@dataclass(frozen=True)
class CharSet(RegexNode):
    """One code point out of ``ranges`` (sorted disjoint inclusive code-point pairs)."""

    ranges: ud.RangeSet


@dataclass(frozen=True)
class Concat(RegexNode):
    """Items matched one after another."""
    items: tuple[RegexNode, ...]


@dataclass(frozen=True)
class Alternation(RegexNode):
    """Any one of the items (``a|b``)."""
    items: tuple[RegexNode, ...]


@dataclass(frozen=True)
class Quantified(RegexNode):
    """``item{min,max}`` (``max`` None: unbounded). ``greedy`` is informational only."""

    item: RegexNode
    min: int
    max: int | None
    greedy: bool = True


@dataclass(frozen=True)
class Group(RegexNode):
    """A parenthesised group: capturing or not, optionally named."""
    item: RegexNode
    name: str | None = None
    capturing: bool = True


@dataclass(frozen=True)
class Anchor(RegexNode):
    """A zero-width position assertion.

    ``kind``: ``"bos"`` (start of string: ``^``, ``\\A``), ``"bol"`` (start of a line:
    ``^`` in multiline mode), ``"eos"`` (end of string: ``\\Z``, ``\\z``, ECMA ``$``),
    ``"eos_nl"`` (Python ``$``: end, or before a final ``\\n``), ``"eol"`` (end of a
    line: ``$`` in multiline mode). ``position``: offset in the pattern.
    """

    kind: str
    position: int


# ---------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------

_VERBOSE_WS = frozenset(" \t\n\r\v\f")
_HEX = frozenset("0123456789abcdefABCDEF")
_OCT = frozenset("01234567")
_DIGITS = frozenset("0123456789")
_PY_SIMPLE = {"a": 7, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11}
_ECMA_SIMPLE = {"f": 12, "n": 10, "r": 13, "t": 9, "v": 11}
_ECMA_SYNTAX = frozenset("^$\\.*+?()[]{}|/")
_PY_FLAGS = frozenset("aiLmsux")
_ECMA_FLAGS = frozenset("imsux")
_ECMA_MODIFIERS = frozenset("ims")  # the flags an ECMA-262 modifier group may set: (?i:..), (?-s:..)
_NEWLINE: ud.RangeSet = ((0x0A, 0x0A),)
_ECMA_LT: ud.RangeSet = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))
_PY_ASCII_SPACE: ud.RangeSet = ((0x09, 0x0D), (0x20, 0x20))


class _Parser:
    def __init__(self, pattern: str, dialect: str, flags: str) -> None:
        if dialect not in _DIALECTS:
            raise ValueError(f"unknown regex dialect {dialect!r} (expected one of {_DIALECTS})")
        self.p = pattern
        self.n = len(pattern)
        self.pos = 0
        self.py = dialect == "python"
        allowed = _PY_FLAGS if self.py else _ECMA_FLAGS
        for f in flags:
            if f not in allowed or f == "L":
                raise RegexError(f"unknown or unsupported flag {f!r} for dialect {dialect!r}",
                                 pattern=pattern)
        self.flags = set(flags)
        self.names: set[str] = set()
        self.global_ok = True
        self.last_set_foldable = True  # set by escape(): may IGNORECASE fold the last class escape

    # -- helpers -------------------------------------------------------------
    def error(self, message: str, pos: int | None = None) -> RegexError:
        return RegexError(message, pattern=self.p, position=self.pos if pos is None else pos)

    def peek(self, k: int = 0) -> str:
        i = self.pos + k
        return self.p[i] if i < self.n else ""

    def skip_ws(self) -> None:
        if "x" not in self.flags:
            return
        while self.pos < self.n:
            c = self.p[self.pos]
            if c in _VERBOSE_WS:
                self.pos += 1
            elif c == "#":
                j = self.p.find("\n", self.pos)
                self.pos = self.n if j < 0 else j + 1
            else:
                break

    def fold(self, rs: ud.RangeSet) -> ud.RangeSet:
        if "i" not in self.flags:
            return rs
        return ud.case_fold(rs, "ascii" if (self.py and "a" in self.flags) else "unicode")

    # -- grammar -------------------------------------------------------------
    def parse(self) -> RegexNode:
        node = self.alternation()
        if self.pos < self.n:  # only a stray ')' stops the top level early
            raise self.error("unbalanced parenthesis")
        return node

    def alternation(self) -> RegexNode:
        branches = [self.concat()]
        while self.peek() == "|":
            self.pos += 1
            branches.append(self.concat())
        return branches[0] if len(branches) == 1 else Alternation(tuple(branches))

    def concat(self) -> RegexNode:
        items: list[RegexNode] = []
        while True:
            self.skip_ws()
            c = self.peek()
            if c == "" or c in "|)":
                break
            atom = self.atom()
            if atom is None:
                continue
            self.global_ok = False
            self.skip_ws()
            q = self.quantifier()
            if q is not None:
                lo, hi, greedy, qpos = q
                if isinstance(atom, Anchor):
                    raise self.error("nothing to repeat (a quantifier after an anchor)", qpos)
                atom = Quantified(atom, lo, hi, greedy)
                self.skip_ws()
                save = self.pos
                if self.quantifier() is not None:
                    raise self.error("multiple repeat", save)
            items.append(atom)
        if len(items) == 1:
            return items[0]
        return Concat(tuple(items))

    def quantifier(self) -> tuple[int, int | None, bool, int] | None:
        """Parse a quantifier at the cursor (consuming it), or return None (consuming nothing)."""
        start = self.pos
        c = self.peek()
        lo: int
        hi: int | None
        if c == "*":
            lo, hi = 0, None
            self.pos += 1
        elif c == "+":
            lo, hi = 1, None
            self.pos += 1
        elif c == "?":
            lo, hi = 0, 1
            self.pos += 1
        elif c == "{":
            b = self.braces(start)
            if b is None:
                return None
            lo, hi = b
        else:
            return None
        greedy = True
        if self.peek() == "?":
            greedy = False
            self.pos += 1
        elif self.peek() == "+":
            if self.py:
                raise self.error("possessive quantifiers are not supported")
            raise self.error("multiple repeat (possessive quantifiers are Python syntax, not ECMA-262)")
        return lo, hi, greedy, start

    def braces(self, start: int) -> tuple[int, int | None] | None:
        """``{m}``, ``{m,}``, ``{m,n}`` (and ``{,n}``, ``{,}`` in Python) or None if not one."""
        j = start + 1
        p = self.p
        k = j
        while k < self.n and p[k] in _DIGITS:
            k += 1
        lo_s = p[j:k]
        hi_s: str | None
        if k < self.n and p[k] == ",":
            m = k + 1
            while m < self.n and p[m] in _DIGITS:
                m += 1
            hi_s = p[k + 1:m]
            k = m
        else:
            hi_s = lo_s
        if k >= self.n or p[k] != "}":
            return None
        if not lo_s and not self.py:
            return None
        if self.py and not lo_s and hi_s is not None and k == j:  # "{}"
            return None
        lo = int(lo_s) if lo_s else 0
        hi = int(hi_s) if hi_s else None
        for v in (lo, hi):
            if v is not None and v > MAX_REPEAT:
                raise self.error(f"repetition count {v} exceeds the limit of {MAX_REPEAT}", start)
        if hi is not None and hi < lo:
            raise self.error("min repeat greater than max repeat", start)
        self.pos = k + 1
        return lo, hi

    def literal(self, cp: int) -> CharSet:
        return CharSet(self.fold(((cp, cp),)))

    def atom(self) -> RegexNode | None:
        start = self.pos
        c = self.p[self.pos]
        if c == "(":
            return self.group()
        if c == "[":
            return self.char_class()
        if c == ".":
            self.pos += 1
            if "s" in self.flags:
                return CharSet(ud.ALL)
            return CharSet(ud.complement(_NEWLINE if self.py else _ECMA_LT))
        if c == "^":
            self.pos += 1
            return Anchor("bol" if "m" in self.flags else "bos", start)
        if c == "$":
            self.pos += 1
            if "m" in self.flags:
                return Anchor("eol", start)
            return Anchor("eos_nl" if self.py else "eos", start)
        if c == "\\":
            kind, val = self.escape(in_class=False)
            if kind == "anchor":
                assert isinstance(val, str)
                return Anchor(val, start)
            if kind == "set":
                assert isinstance(val, tuple)
                return CharSet(self.fold(val) if self.last_set_foldable else val)
            assert isinstance(val, int)
            return self.literal(val)
        if c in "*+?":
            raise self.error("nothing to repeat")
        if c == "{":
            if self.braces(start) is not None:
                self.pos = start
                raise self.error("nothing to repeat")
            if not self.py and "u" in self.flags:
                raise self.error("lone quantifier bracket")
        if not self.py and "u" in self.flags and c in "}]":
            raise self.error("lone quantifier bracket" if c == "}" else "lone ']'")
        self.pos += 1
        return self.literal(ord(c))

    # -- groups --------------------------------------------------------------
    def group(self) -> RegexNode | None:
        start = self.pos
        self.pos += 1
        name: str | None = None
        capturing = True
        saved_flags: set[str] | None = None
        if self.peek() == "?":
            self.pos += 1
            c = self.peek()
            if c == "":
                raise self.error("unexpected end of pattern")
            if c == ":":
                self.pos += 1
                capturing = False
            elif c == "P" and not self.py:
                raise self.error("(?P...) is Python syntax, not ECMA-262 (a named group is "
                                 "(?<name>...))")
            elif c == "P":
                self.pos += 1
                c2 = self.peek()
                if c2 == "<":
                    self.pos += 1
                    name = self.group_name(">")
                elif c2 == "=":
                    raise self.error("backreferences are not supported", start)
                else:
                    raise self.error(f"unknown extension ?P{c2}", start)
            elif c == "<":
                c2 = self.peek(1)
                if c2 in ("=", "!"):
                    raise self.error("lookbehind assertions are not supported", start)
                self.pos += 1
                name = self.group_name(">")
            elif c in ("=", "!"):
                raise self.error("lookahead assertions are not supported", start)
            elif c == "#" and self.py:
                j = self.p.find(")", self.pos)
                if j < 0:
                    raise self.error("missing ), unterminated comment", start)
                self.pos = j + 1
                return None
            elif c == "(":
                raise self.error("conditional groups are not supported", start)
            elif c == ">":
                raise self.error("atomic groups are not supported", start)
            elif c.isalpha() or c == "-":
                on, off, scoped = self.flag_group(start)
                if not scoped:
                    if not self.global_ok:
                        raise self.error("global flags not at the start of the expression", start)
                    self.flags |= on
                    return None
                saved_flags = set(self.flags)
                self.flags = (self.flags | on) - off
                capturing = False
            else:
                raise self.error(f"unknown extension ?{c}")
        self.global_ok = False
        item = self.alternation()
        if self.peek() != ")":
            raise self.error("missing ), unterminated subpattern", start)
        self.pos += 1
        if saved_flags is not None:
            self.flags = saved_flags
        return Group(item, name, capturing)

    def group_name(self, close: str) -> str:
        start = self.pos
        j = self.p.find(close, start)
        if j < 0:
            raise self.error("missing >, unterminated name", start)
        name = self.p[start:j]
        if not name or not (name if self.py else name.replace("$", "_")).isidentifier():
            raise self.error(f"bad character in group name {name!r}", start)
        if name in self.names:
            raise self.error(f"redefinition of group name {name!r}", start)
        self.names.add(name)
        self.pos = j + 1
        return name

    def flag_group(self, start: int) -> tuple[set[str], set[str], bool]:
        allowed = _PY_FLAGS if self.py else _ECMA_MODIFIERS
        on: set[str] = set()
        off: set[str] = set()
        cur = on
        while True:
            c = self.peek()
            if c == "":
                raise self.error("missing -, : or )", start)
            if c == ")" or c == ":":
                break
            if c == "-":
                if cur is off:
                    raise self.error("bad inline flags", self.pos)
                cur = off
            elif c not in allowed or c == "L":
                why = "" if self.py else " (ECMA-262 modifiers are i, m and s)"
                raise self.error(f"unknown or unsupported inline flag {c!r}{why}", self.pos)
            else:
                cur.add(c)
            self.pos += 1
        scoped = self.peek() == ":"
        if not scoped and off:
            raise self.error("flags cannot be turned off globally", start)
        self.pos += 1
        return on, off, scoped

    # -- character classes ---------------------------------------------------
    def char_class(self) -> CharSet:
        start = self.pos
        self.pos += 1
        negate = False
        if self.peek() == "^":
            negate = True
            self.pos += 1
        literal: list[tuple[int, int]] = []
        foldable_sets: list[ud.RangeSet] = []
        fixed_sets: list[ud.RangeSet] = []
        first = True
        while True:
            if self.pos >= self.n:
                raise self.error("unterminated character set", start)
            c = self.p[self.pos]
            if c == "]" and not (first and self.py):
                self.pos += 1
                break
            first = False
            item_pos = self.pos
            kind, val, foldable = self.class_atom()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                kind2, val2, foldable2 = self.class_atom()
                if kind != "cp" or kind2 != "cp":
                    if self.py or "u" in self.flags:
                        raise self.error("bad character range (a class escape as a range end)",
                                         item_pos)
                    # ECMA Annex B: [\w-.] is the union of \w, '-' and '.'
                    literal.append((0x2D, 0x2D))
                    for k, v, f in ((kind, val, foldable), (kind2, val2, foldable2)):
                        if k == "cp":
                            assert isinstance(v, int)
                            literal.append((v, v))
                        else:
                            assert isinstance(v, tuple)
                            (foldable_sets if f else fixed_sets).append(v)
                    continue
                assert isinstance(val, int) and isinstance(val2, int)
                if val2 < val:
                    raise self.error(f"bad character range {chr(val)}-{chr(val2)}", item_pos)
                literal.append((val, val2))
            elif kind == "cp":
                assert isinstance(val, int)
                literal.append((val, val))
            else:
                assert isinstance(val, tuple)
                (foldable_sets if foldable else fixed_sets).append(val)
        rs = self.fold(ud.union(literal, *foldable_sets))
        rs = ud.union(rs, *fixed_sets)
        if negate:
            rs = ud.complement(rs)
        return CharSet(rs)

    def class_atom(self) -> tuple[str, int | ud.RangeSet, bool]:
        c = self.p[self.pos]
        if c == "\\":
            kind, val = self.escape(in_class=True)
            if kind == "set":
                assert isinstance(val, tuple)
                return "set", val, self.last_set_foldable
            assert isinstance(val, int)
            return "cp", val, True
        self.pos += 1
        return "cp", ord(c), True

    # -- escapes -------------------------------------------------------------
    def escape(self, in_class: bool) -> tuple[str, int | str | ud.RangeSet]:
        """Parse ``\\...`` at the cursor: ("cp", code point) | ("set", ranges) | ("anchor", kind)."""
        start = self.pos
        if self.pos + 1 >= self.n:
            raise self.error("bad escape (end of pattern)")
        c = self.p[self.pos + 1]
        self.pos += 2
        self.last_set_foldable = True
        if c in "dDwWsS":
            return "set", self.class_escape(c)
        if c in "pP":
            return "set", self.property_escape(c, start)
        if self.py:
            return self.py_escape(c, start, in_class)
        return self.ecma_escape(c, start, in_class)

    def class_escape(self, c: str) -> ud.RangeSet:
        low = c.lower()
        if self.py:
            if "a" in self.flags:
                rs = ud.ecma_class(low) if low != "s" else _PY_ASCII_SPACE
            else:
                rs = ud.python_class(low)
            # Python's re does not case-fold \d, \w, \s (they are category tests)
            self.last_set_foldable = False
        else:
            # ECMA (u+i): \w is the folded word set (adding U+017F, U+212A); \W its complement
            rs = self.fold(ud.ecma_class(low))
        return ud.complement(rs) if c.isupper() else rs

    def property_escape(self, c: str, start: int) -> ud.RangeSet:
        if self.peek() == "{":
            j = self.p.find("}", self.pos)
            if j < 0:
                raise self.error("missing } in \\p{...}", start)
            name = self.p[self.pos + 1:j]
            self.pos = j + 1
        elif self.py and self.peek().isalpha():
            name = self.peek()
            self.pos += 1
        else:
            raise self.error("\\p must be followed by {property}", start)
        negated = c == "P"
        if name.startswith("^") and self.py:
            negated = not negated
            name = name[1:]
        if "=" in name:
            key, _, value = name.partition("=")
            if key.strip() not in ("General_Category", "gc", "generalcategory", "general_category"):
                raise self.error(f"unsupported Unicode property {name!r} (only general categories)",
                                 start)
            name = value
        rs = ud.general_category(name.strip(), loose=self.py)
        if rs is None:
            raise self.error(f"unknown or unsupported Unicode property {name!r} "
                             "(scripts and binary properties are not supported)", start)
        return ud.complement(rs) if negated else rs

    def hex_digits(self, count: int, start: int) -> int:
        s = self.p[self.pos:self.pos + count]
        if len(s) != count or any(ch not in _HEX for ch in s):
            raise self.error("incomplete escape", start)
        self.pos += count
        return int(s, 16)

    def py_escape(self, c: str, start: int, in_class: bool) -> tuple[str, int | str | ud.RangeSet]:
        if c in _PY_SIMPLE:
            return "cp", _PY_SIMPLE[c]
        if c == "b":
            if in_class:
                return "cp", 8
            raise self.error("word boundaries (\\b) are not supported", start)
        if c == "B":
            if in_class:
                raise self.error("bad escape \\B", start)
            raise self.error("word boundaries (\\B) are not supported", start)
        if c in "AZz":
            if in_class:
                raise self.error(f"bad escape \\{c}", start)
            return "anchor", "bos" if c == "A" else "eos"
        if c == "x":
            return "cp", self.hex_digits(2, start)
        if c == "u":
            return "cp", self.hex_digits(4, start)
        if c == "U":
            v = self.hex_digits(8, start)
            if v > ud.MAX_CODE_POINT:
                raise self.error(f"bad escape \\U{v:08x}", start)
            return "cp", v
        if c == "N":
            if self.peek() != "{":
                raise self.error("missing {", start)
            j = self.p.find("}", self.pos)
            if j < 0:
                raise self.error("missing }, unterminated name", start)
            name = self.p[self.pos + 1:j]
            try:
                ch = unicodedata.lookup(name)
            except KeyError:
                raise self.error(f"undefined character name {name!r}", start) from None
            self.pos = j + 1
            return "cp", ord(ch)
        if c == "0":
            digits = c
            while len(digits) < 3 and self.peek() in _OCT and self.peek() != "":
                digits += self.peek()
                self.pos += 1
            return "cp", int(digits, 8)
        if c in _DIGITS:
            if in_class:
                if c not in _OCT:
                    raise self.error(f"bad escape \\{c}", start)
                digits = c
                while len(digits) < 3 and self.peek() in _OCT and self.peek() != "":
                    digits += self.peek()
                    self.pos += 1
                v = int(digits, 8)
                if v > 0o377:
                    raise self.error(f"octal escape value \\{digits} outside of range 0-0o377", start)
                return "cp", v
            d2, d3 = self.peek(), self.peek(1)
            if c in _OCT and d2 and d2 in _OCT and d3 and d3 in _OCT:
                self.pos += 2
                v = int(c + d2 + d3, 8)
                if v > 0o377:
                    raise self.error(f"octal escape value \\{c}{d2}{d3} outside of range 0-0o377",
                                     start)
                return "cp", v
            raise self.error("backreferences are not supported", start)
        if c.isascii() and c.isalpha():
            raise self.error(f"bad escape \\{c}", start)
        return "cp", ord(c)

    def ecma_escape(self, c: str, start: int, in_class: bool) -> tuple[str, int | str | ud.RangeSet]:
        if c in _ECMA_SIMPLE:
            return "cp", _ECMA_SIMPLE[c]
        if c == "b":
            if in_class:
                return "cp", 8
            raise self.error("word boundaries (\\b) are not supported", start)
        if c == "B":
            raise self.error("word boundaries (\\B) are not supported", start)
        if c == "c":
            d = self.peek()
            if d and d.isascii() and d.isalpha():
                self.pos += 1
                return "cp", ord(d) % 32
            raise self.error("invalid escape \\c", start)
        if c == "0":
            if self.peek() in _DIGITS and self.peek() != "":
                raise self.error("legacy octal escapes are not supported", start)
            return "cp", 0
        if c in _DIGITS:
            raise self.error("backreferences are not supported" if not in_class
                             else f"invalid class escape \\{c}", start)
        if c == "k":
            raise self.error("backreferences are not supported", start)
        if c == "x":
            return "cp", self.hex_digits(2, start)
        if c == "u":
            return "cp", self.ecma_unicode_escape(start)
        if c == "-" and (in_class or "u" not in self.flags):
            return "cp", ord(c)
        if c in _ECMA_SYNTAX:
            return "cp", ord(c)
        if c in "AZz":
            raise self.error(f"invalid escape \\{c} (Python's string anchors are not ECMA-262: "
                             "^ and $ are)", start)
        if c.isascii() and c.isalnum():
            raise self.error(f"invalid escape \\{c}", start)
        if "u" in self.flags:
            raise self.error(f"invalid identity escape \\{c} (u flag)", start)
        return "cp", ord(c)

    def ecma_unicode_escape(self, start: int) -> int:
        if self.peek() == "{":
            j = self.p.find("}", self.pos)
            digits = self.p[self.pos + 1:j] if j >= 0 else ""
            if j < 0 or not digits or any(ch not in _HEX for ch in digits):
                raise self.error("invalid \\u{...} escape", start)
            v = int(digits, 16)
            if v > ud.MAX_CODE_POINT:
                raise self.error("\\u{...} code point above U+10FFFF", start)
            self.pos = j + 1
            return v
        v = self.hex_digits(4, start)
        if 0xD800 <= v <= 0xDBFF and self.p.startswith("\\u", self.pos):
            s = self.p[self.pos + 2:self.pos + 6]
            if len(s) == 4 and all(ch in _HEX for ch in s) and 0xDC00 <= int(s, 16) <= 0xDFFF:
                self.pos += 6
                return 0x10000 + ((v - 0xD800) << 10) + (int(s, 16) - 0xDC00)
        return v


def parse_regex(pattern: str, *, dialect: str = "python", flags: str = "") -> RegexNode:
    """Parse ``pattern`` into a :class:`RegexNode` tree, with flags applied to the sets.

    ``dialect``: ``"python"`` or ``"ecma"``. ``flags``: any of ``i`` (ignore case),
    ``s`` (dot matches newlines), ``m`` (``^``/``$`` match at line boundaries), ``x``
    (verbose), ``u`` (ECMA: strict identity escapes; Python: no effect) and, for Python,
    ``a`` (ASCII classes). Raises :class:`RegexError` (with ``position``) for bad or
    unsupported syntax; ``ValueError`` for an unknown dialect.
    """
    try:
        return _Parser(pattern, dialect, flags).parse()
    except RecursionError:
        raise RegexError("pattern is nested too deeply", pattern=pattern) from None


# ---------------------------------------------------------------------------
# Code-point sets -> byte-level IR
# ---------------------------------------------------------------------------

def char_class_expr(ranges: Sequence[tuple[int, int]], encoding: str = "utf8") -> ir.Expr:
    """IR for exactly one code point out of the inclusive code-point ``ranges``.

    Surrogates (U+D800..U+DFFF) are dropped. ``encoding``: ``"utf8"`` (the code point's
    UTF-8 bytes) or ``"json"`` (any spelling of it inside a JSON string literal; see the
    module docstring). An empty set gives :data:`ir.NEVER`. Results are cached.
    """
    if encoding not in _ENCODINGS:
        raise ValueError(f"unknown encoding {encoding!r} (expected one of {_ENCODINGS})")
    for lo, hi in ranges:
        if not (0 <= lo and hi <= ud.MAX_CODE_POINT):
            raise ValueError(f"code-point range out of bounds: {lo}-{hi}")
    rs = ud.intersect(ud.normalize(ranges), ud.NON_SURROGATE)
    if not rs:
        return ir.NEVER
    if encoding == "utf8":
        return json_escape.utf8_class(rs)
    return json_escape.json_class(rs, "canonical" if encoding == "json-canonical" else "all")


def any_char_expr(encoding: str = "utf8", *, exclude_newline: bool = False) -> ir.Expr:
    """IR for any one code point (except ``\\n`` if ``exclude_newline``) in ``encoding``."""
    return char_class_expr(ud.complement(_NEWLINE) if exclude_newline else ud.ALL, encoding)


# ---------------------------------------------------------------------------
# Lowering: RegexNode -> IR, with anchors resolved
# ---------------------------------------------------------------------------

_START_RANK = {None: 0, "bol": 1, "bos": 2}
_END_RANK = {None: 0, "eol": 1, "eos_nl": 2, "eos": 3}


@dataclass
class _Piece:
    """A part of the language whose strings start/end at anchored positions.

    ``start``/``end``: the strictest anchor kind that must hold before/after ``expr``
    (None: unanchored); positions are for error messages.
    """

    start: str | None
    expr: ir.Expr
    end: str | None
    start_pos: int | None = None
    end_pos: int | None = None


def _merge(pieces: list[_Piece]) -> list[_Piece]:
    """One piece per (start, end) anchor kind, alternating the expressions."""
    groups: dict[tuple[str | None, str | None], list[_Piece]] = {}
    for p in pieces:
        groups.setdefault((p.start, p.end), []).append(p)
    out = []
    for (start, end), ps in groups.items():
        expr = ps[0].expr if len(ps) == 1 else ir.alt(*(p.expr for p in ps))
        out.append(_Piece(start, expr, end, ps[0].start_pos, ps[0].end_pos))
    return out


class _Lowerer:
    def __init__(self, pattern: str, encoding: str) -> None:
        self.pattern = pattern
        self.encoding = encoding

    def error(self, message: str, pos: int | None) -> RegexError:
        return RegexError(message, pattern=self.pattern, position=pos)

    def lower(self, node: RegexNode) -> list[_Piece]:
        if isinstance(node, CharSet):
            return [_Piece(None, char_class_expr(node.ranges, self.encoding), None)]
        if isinstance(node, Group):
            return self.lower(node.item)
        if isinstance(node, Anchor):
            if node.kind in ("bos", "bol"):
                return [_Piece(node.kind, ir.EMPTY, None, node.position, None)]
            return [_Piece(None, ir.EMPTY, node.kind, None, node.position)]
        if isinstance(node, Alternation):
            return _merge([p for it in node.items for p in self.lower(it)])
        if isinstance(node, Concat):
            parts = [self.lower(it) for it in node.items]
            if all(len(ps) == 1 and ps[0].start is None and ps[0].end is None for ps in parts):
                return [_Piece(None, ir.seq(*(ps[0].expr for ps in parts)), None)]
            acc = [_Piece(None, ir.EMPTY, None)]
            for right in parts:
                acc = _merge([self.combine(x, y) for x in acc for y in right])
            return acc
        if isinstance(node, Quantified):
            inner = self.lower(node.item)
            if all(p.start is None and p.end is None for p in inner):
                return [_Piece(None, ir.rep(inner[0].expr if len(inner) == 1
                                            else ir.alt(*(p.expr for p in inner)),
                                            node.min, node.max), None)]
            if node.max == 0:
                return [_Piece(None, ir.EMPTY, None)]
            if node.max == 1:
                extra = [_Piece(None, ir.EMPTY, None)] if node.min == 0 else []
                return _merge(inner + extra)
            bad = next(p for p in inner if p.start is not None or p.end is not None)
            raise self.error("anchors inside a repeated group are not supported",
                             bad.start_pos if bad.start_pos is not None else bad.end_pos)
        raise TypeError(f"unknown regex node {type(node).__name__}")

    def combine(self, x: _Piece, y: _Piece) -> _Piece:
        if x.end is not None and y.expr != ir.EMPTY:
            raise self.error("end anchor is followed by more pattern (anchors are only "
                             "supported at the start/end of a top-level alternative)", x.end_pos)
        if y.start is not None and x.expr != ir.EMPTY:
            raise self.error("start anchor is preceded by more pattern (anchors are only "
                             "supported at the start/end of a top-level alternative)", y.start_pos)
        start = x.start if _START_RANK[x.start] >= _START_RANK[y.start] else y.start
        end = x.end if _END_RANK[x.end] >= _END_RANK[y.end] else y.end
        return _Piece(start, ir.seq(x.expr, y.expr), end,
                      x.start_pos if x.start_pos is not None else y.start_pos,
                      y.end_pos if y.end_pos is not None else x.end_pos)


@lru_cache(maxsize=8)
def _any_star(encoding: str) -> ir.Expr:
    return ir.star(any_char_expr(encoding))


def compile_regex(pattern: str, *, dialect: str = "python", flags: str = "",
                  encoding: str = "utf8", search: bool = False) -> ir.Expr:
    """Compile ``pattern`` to an IR expression over bytes.

    ``search=False``: the language of strings the pattern fully matches (``re.fullmatch``);
    ``^``/``$``/``\\A``/``\\Z`` at the start/end of a top-level alternative are then
    trivially satisfied. ``search=True``: strings in which the pattern matches somewhere
    (``re.search``, JSON Schema ``pattern``): an unanchored side gets "any code-point
    sequence" (newlines included), ``^`` (``\\A``) pins the start, ``$`` pins the end
    (Python: end or before a final ``\\n``; ECMA: end), multiline anchors allow a line
    boundary. An anchor anywhere else raises :class:`RegexError`. See :func:`parse_regex`
    for ``dialect``/``flags`` and the module docstring for ``encoding``.
    """
    if encoding not in _ENCODINGS:
        raise ValueError(f"unknown encoding {encoding!r} (expected one of {_ENCODINGS})")
    node = parse_regex(pattern, dialect=dialect, flags=flags)
    try:
        pieces = _Lowerer(pattern, encoding).lower(node)
    except RecursionError:
        raise RegexError("pattern is nested too deeply", pattern=pattern) from None
    if not search:
        return ir.alt(*(p.expr for p in pieces))
    anys = _any_star(encoding)
    lt = char_class_expr(_NEWLINE if dialect == "python" else _ECMA_LT, encoding)
    nl = char_class_expr(_NEWLINE, encoding)
    out: list[ir.Expr] = []
    for p in pieces:
        prefix = {None: anys, "bos": ir.EMPTY, "bol": ir.opt(ir.seq(anys, lt))}[p.start]
        suffix = {None: anys, "eos": ir.EMPTY, "eos_nl": ir.opt(nl),
                  "eol": ir.opt(ir.seq(lt, anys))}[p.end]
        out.append(ir.seq(prefix, p.expr, suffix))
    return ir.alt(*out)


def compile_regex_grammar(pattern: str, **kw: Any) -> CompiledGrammar:
    """``compile_regex(pattern, **kw)`` as the start rule of a grammar, compiled to an automaton."""
    from structgen.grammar.compiler import compile_grammar

    return compile_grammar(ir.Grammar({"start": compile_regex(pattern, **kw)}, "start"))
