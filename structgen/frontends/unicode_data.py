"""Code-point range sets and the Unicode tables the regex compiler needs.

A *range set* is a sorted tuple of disjoint, non-adjacent, inclusive ``(lo, hi)``
code-point pairs. Everything here is pure Python over :mod:`unicodedata` and
:mod:`re`; the tables (general categories, Python ``re``'s ``\\d``/``\\w``/``\\s``,
case-equivalence classes) are computed lazily on first use and cached for the life
of the process. Each table costs roughly 0.05-0.2 s to build once.
"""

from __future__ import annotations

import array
import bisect
import itertools
import sys
from collections.abc import Iterable
from functools import lru_cache

__all__ = [
    "MAX_CODE_POINT", "RangeSet",
    "normalize", "union", "complement", "intersect", "subtract", "contains", "size",
    "SURROGATES", "ALL", "NON_SURROGATE",
    "general_category", "CATEGORY_ALIASES", "python_class", "ecma_class",
    "case_fold",
]

MAX_CODE_POINT = 0x10FFFF
RangeSet = tuple[tuple[int, int], ...]

SURROGATES: RangeSet = ((0xD800, 0xDFFF),)
ALL: RangeSet = ((0, MAX_CODE_POINT),)
NON_SURROGATE: RangeSet = ((0, 0xD7FF), (0xE000, MAX_CODE_POINT))


# ---------------------------------------------------------------------------
# Range-set algebra
# ---------------------------------------------------------------------------

def normalize(ranges: Iterable[tuple[int, int]]) -> RangeSet:
    """Sort, merge overlapping/adjacent pairs and drop empty ones."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def union(*sets: Iterable[tuple[int, int]]) -> RangeSet:
    """The union of code point range sets, normalised."""
    return normalize(itertools.chain.from_iterable(sets))


def complement(rs: RangeSet) -> RangeSet:
    """All code points 0..U+10FFFF not in ``rs`` (``rs`` must be normalized)."""
    out: list[tuple[int, int]] = []
    nxt = 0
    for lo, hi in rs:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return tuple(out)


def intersect(a: RangeSet, b: RangeSet) -> RangeSet:
    """The code points in both ``a`` and ``b``."""
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def subtract(a: RangeSet, b: RangeSet) -> RangeSet:
    """The code points of ``a`` not in ``b``."""
    return intersect(a, complement(b))


def contains(rs: RangeSet, cp: int) -> bool:
    """Is code point ``cp`` in ``rs``? (binary search)"""
    i = bisect.bisect_right(rs, (cp, MAX_CODE_POINT + 1)) - 1
    return i >= 0 and rs[i][0] <= cp <= rs[i][1]


def size(rs: RangeSet) -> int:
    """The number of code points in ``rs``."""
    return sum(hi - lo + 1 for lo, hi in rs)


def _runs(cps: Iterable[int]) -> RangeSet:
    return normalize((c, c) for c in cps)


# ---------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _all_chars() -> str:
    """Every code point 0..U+10FFFF (surrogates included) as one str, index == code point."""
    enc = "utf-32-le" if sys.byteorder == "little" else "utf-32-be"
    return array.array("I", range(MAX_CODE_POINT + 1)).tobytes().decode(enc, "surrogatepass")


@lru_cache(maxsize=1)
def _category_table() -> dict[str, RangeSet]:
    import unicodedata

    table: dict[str, list[tuple[int, int]]] = {}
    pos = 0
    for cat, group in itertools.groupby(map(unicodedata.category, _all_chars())):
        n = len(list(group))
        table.setdefault(cat, []).append((pos, pos + n - 1))
        pos += n
    out = {k: tuple(v) for k, v in table.items()}
    for major in "LMNPSZC":
        out[major] = union(*(v for k, v in out.items() if len(k) == 2 and k[0] == major))
    out["LC"] = union(out.get("Lu", ()), out.get("Ll", ()), out.get("Lt", ()))
    out["Any"] = ALL
    out["ASCII"] = ((0, 0x7F),)
    out["Assigned"] = complement(out.get("Cn", ()))
    return out


CATEGORY_ALIASES: dict[str, str] = {
    "Letter": "L", "Cased_Letter": "LC", "Uppercase_Letter": "Lu", "Lowercase_Letter": "Ll",
    "Titlecase_Letter": "Lt", "Modifier_Letter": "Lm", "Other_Letter": "Lo",
    "Mark": "M", "Combining_Mark": "M", "Nonspacing_Mark": "Mn", "Spacing_Mark": "Mc",
    "Enclosing_Mark": "Me",
    "Number": "N", "Decimal_Number": "Nd", "digit": "Nd", "Letter_Number": "Nl",
    "Other_Number": "No",
    "Punctuation": "P", "punct": "P", "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd",
    "Open_Punctuation": "Ps", "Close_Punctuation": "Pe", "Initial_Punctuation": "Pi",
    "Final_Punctuation": "Pf", "Other_Punctuation": "Po",
    "Symbol": "S", "Math_Symbol": "Sm", "Currency_Symbol": "Sc", "Modifier_Symbol": "Sk",
    "Other_Symbol": "So",
    "Separator": "Z", "Space_Separator": "Zs", "Line_Separator": "Zl",
    "Paragraph_Separator": "Zp",
    "Other": "C", "Control": "Cc", "cntrl": "Cc", "Format": "Cf", "Surrogate": "Cs",
    "Private_Use": "Co", "Unassigned": "Cn",
}
_SHORT_NAMES = frozenset(
    "L LC Lu Ll Lt Lm Lo M Mn Mc Me N Nd Nl No P Pc Pd Ps Pe Pi Pf Po S Sm Sc Sk So "
    "Z Zs Zl Zp C Cc Cf Cs Co Cn Any ASCII Assigned".split())


def _loose(name: str) -> str:
    return name.replace("_", "").replace("-", "").replace(" ", "").lower()


_LOOSE = {**{_loose(k): v for k, v in CATEGORY_ALIASES.items()}, **{_loose(k): k for k in _SHORT_NAMES}}


def general_category(name: str, *, loose: bool = False) -> RangeSet | None:
    """Code points of a Unicode general category (``"L"``, ``"Lu"``, ``"Letter"``, ...).

    Also ``"Any"``, ``"ASCII"``, ``"Assigned"`` and ``"LC"``. ``loose`` ignores case,
    underscores, hyphens and spaces in the name (as the ``regex`` module does). Returns
    None for an unknown name. Uses the Unicode version of :mod:`unicodedata`.
    """
    key = name if name in _SHORT_NAMES else CATEGORY_ALIASES.get(name)
    if key is None and loose:
        key = _LOOSE.get(_loose(name))
    if key is None:
        return None
    return _category_table().get(key, ())


@lru_cache(maxsize=None)
def python_class(letter: str) -> RangeSet:
    """What Python's ``re`` matches with ``\\d``, ``\\w`` or ``\\s`` in a str pattern.

    Computed by running ``re`` itself over every code point, so it is exact for the
    running interpreter.
    """
    import re

    if letter not in ("d", "w", "s"):
        raise ValueError(f"unknown class letter {letter!r}")
    pat = re.compile("\\" + letter + "+")
    return tuple((m.start(), m.end() - 1) for m in pat.finditer(_all_chars()))


_ECMA_LINE_TERMINATORS: RangeSet = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))


@lru_cache(maxsize=None)
def ecma_class(letter: str) -> RangeSet:
    """ECMA-262 ``\\d`` (ASCII digits), ``\\w`` (ASCII word) or ``\\s`` (WhiteSpace + LineTerminator)."""
    if letter == "d":
        return ((0x30, 0x39),)
    if letter == "w":
        return ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
    if letter == "s":
        zs = general_category("Zs") or ()
        return union(zs, ((0x09, 0x0D), (0xFEFF, 0xFEFF)), _ECMA_LINE_TERMINATORS)
    raise ValueError(f"unknown class letter {letter!r}")


# ---------------------------------------------------------------------------
# Case folding
# ---------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _fold_tables() -> tuple[list[int], dict[int, tuple[int, ...]]]:
    """(sorted code points that have case partners, code point -> its equivalence class).

    Two code points are case-equivalent when their simple lowercase mappings (as
    ``_sre.unicode_tolower``) are equal, or linked by ``re``'s table of extra cases
    (``ſ``/``s``, ``ı``/``i``, ``µ``/``μ``, ...). That is how Python's ``re`` decides
    IGNORECASE matches for literals and BMP character sets.
    """
    import _sre

    try:
        from re._casefix import _EXTRA_CASES as extra
    except ImportError:  # pragma: no cover - older layouts
        extra = {}
    tolower = _sre.unicode_tolower
    lows = array.array("I", map(tolower, range(MAX_CODE_POINT + 1)))
    groups: dict[int, set[int]] = {}
    for cp in itertools.compress(range(MAX_CODE_POINT + 1),
                                 map(int.__ne__, lows, range(MAX_CODE_POINT + 1))):
        low = lows[cp]
        groups.setdefault(low, {low}).add(cp)
    for low, others in extra.items():
        groups.setdefault(low, {low})
        for o in others:
            groups.setdefault(o, {o})
    # x matches c case-insensitively iff lower(x) is lower(c) or one of its extra cases
    classes: dict[int, tuple[int, ...]] = {}
    for members in list(groups.values()):
        for cp in members:
            low = lows[cp]
            full: set[int] = set()
            for k in (low, *extra.get(low, ())):
                full |= groups.get(k, {k})
            if len(full) > 1:
                classes[cp] = tuple(sorted(full))
    return sorted(classes), classes


def _ascii_fold(rs: RangeSet) -> RangeSet:
    extra: list[tuple[int, int]] = []
    for lo, hi in rs:
        for a, b, delta in ((0x41, 0x5A, 0x20), (0x61, 0x7A, -0x20)):
            l2, h2 = max(lo, a), min(hi, b)
            if l2 <= h2:
                extra.append((l2 + delta, h2 + delta))
    return union(rs, extra)


@lru_cache(maxsize=512)
def case_fold(rs: RangeSet, mode: str = "unicode") -> RangeSet:
    """Close a range set under case equivalence.

    ``mode="unicode"``: Python ``re``'s IGNORECASE equivalence (see :func:`_fold_tables`);
    ``mode="ascii"``: only A-Z/a-z. The first unicode call builds the tables (~0.1 s).
    """
    if mode == "ascii":
        return _ascii_fold(rs)
    if mode != "unicode":
        raise ValueError(f"unknown case-fold mode {mode!r}")
    cased, classes = _fold_tables()
    added: set[int] = set()
    for lo, hi in rs:
        i = bisect.bisect_left(cased, lo)
        j = bisect.bisect_right(cased, hi)
        for cp in cased[i:j]:
            added.update(classes[cp])
    if not added:
        return rs
    return union(rs, _runs(added))
