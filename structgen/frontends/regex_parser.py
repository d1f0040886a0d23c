"""Regular expressions -> :class:`RegexNode` trees: the parser of :mod:`structgen.frontends.regex`.

:func:`parse_regex` reads a pattern in Python's ``re`` dialect or ECMA-262's (what JSON Schema
``pattern`` means) into a small tree of code-point sets, concatenations, alternations,
repetitions, groups and anchors, with the flags (case, dot-all, multi-line, verbose, ASCII)
already applied to the sets. Syntax the byte-level IR cannot express (backreferences,
lookaround, ...) raises :class:`~structgen.errors.RegexError` here, with its position.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from structgen.errors import RegexError
from structgen.frontends import unicode_data as ud

__all__ = [
    "DIALECTS", "ECMA_LINE_TERMINATORS", "MAX_REPEAT", "NEWLINE", "Alternation", "Anchor",
    "CharSet", "Concat", "Group", "Quantified", "RegexNode", "parse_regex",
]

MAX_REPEAT = 10_000
"""Largest repetition count accepted in ``{m,n}``; larger counts raise RegexError."""

DIALECTS = ("python", "ecma")


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
    """One of the items, whichever matches (``a|b``)."""
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
NEWLINE: ud.RangeSet = ((0x0A, 0x0A),)
ECMA_LINE_TERMINATORS: ud.RangeSet = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))
_PY_ASCII_SPACE: ud.RangeSet = ((0x09, 0x0D), (0x20, 0x20))


class _Parser:
    def __init__(self, pattern: str, dialect: str, flags: str) -> None:
        if dialect not in DIALECTS:
            raise ValueError(f"unknown regex dialect {dialect!r} (expected one of {DIALECTS})")
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
            return CharSet(ud.complement(NEWLINE if self.py else ECMA_LINE_TERMINATORS))
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

