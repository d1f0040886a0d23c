"""The JSON escape layer: a string language L -> the JSON string contents that decode into L.

Every string automaton structgen builds (free strings, ``pattern``, ``format``, ``enum`` and
``const`` strings, property names) describes a set L of *decoded* string values. Inside a
JSON string literal each code point may be spelled in several ways, so the bytes between
the quotes form the language ``h(L)``, where the substitution ``h`` maps a code point to
the set of its spellings. This module is the one place that defines ``h``:

* ``escapes="all"`` (what validation accepts, the default): raw UTF-8 except for ``"``,
  ``\\`` and U+0000..U+001F (which JSON only allows escaped); the short escapes
  ``\\" \\\\ \\/ \\b \\f \\n \\r \\t``; ``\\uXXXX`` with hex digits of either case for every
  BMP code point; and a surrogate pair ``\\uD8xx\\uDCxx`` (either case) for every code
  point above U+FFFF.
* ``escapes="canonical"``: the one spelling ``json.dumps(s, ensure_ascii=False)`` writes:
  raw UTF-8, except ``\\" \\\\ \\b \\f \\n \\r \\t`` and ``\\u00xx`` (lower-case hex) for
  the other control characters. A seam for generation that wants a single spelling.

Lone surrogates: ``json.loads`` decodes an unpaired ``\\uD800`` to a string holding a
lone surrogate, which has no UTF-8 form and which RFC 8259 (section 8.2) calls
unpredictable; I-JSON (RFC 7493) forbids it. No spelling produced here decodes to a
lone surrogate (a high-surrogate escape must be followed by a low-surrogate escape),
so such strings are rejected even where a schema would accept any string: a narrowing,
never an acceptance of an invalid value.

Because ``h`` is injective on decoded strings and every spelling decodes uniquely
(the spellings of one code point form a prefix code, and the spellings of different
code points are disjoint), ``h`` commutes with concatenation, union, repetition,
intersection and difference. The construction therefore works at the leaves:

* :func:`json_class` maps a code-point class to the byte-level IR union of all its
  spellings, per range (UTF-8 ranges and hex-digit ranges with shared prefixes factored),
  never per code point; results are cached.
* :func:`json_content` maps a regular IR expression over raw (unescaped) UTF-8 to its
  escaped language: ASCII byte sets become :func:`json_class` of the same code points,
  ``Seq``/``Alt``/``Repeat``/``And``/``Diff`` are rebuilt around the escaped children, and
  an explicit :class:`~structgen.grammar.ir.Dfa` is rebuilt by :func:`json_dfa`, which applies the
  same substitution to each state's code-point edges (edges grouped by target, decoder
  states shared per remaining range map).

Side effects: none beyond per-process caches.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from functools import lru_cache
from typing import cast

from structgen.errors import GrammarError
from structgen.frontends import unicode_data as ud
from structgen.grammar import ir

__all__ = ["ESCAPE_MODES", "json_char", "json_class", "json_content", "json_dfa", "spellings"]

ESCAPE_MODES = ("all", "canonical")

_MAX_BMP = 0xFFFF
_SHORT_ALL = ((0x22, '"'), (0x5C, "\\"), (0x2F, "/"), (0x08, "b"), (0x0C, "f"),
              (0x0A, "n"), (0x0D, "r"), (0x09, "t"))
_SHORT_CANONICAL = tuple(x for x in _SHORT_ALL if x[0] != 0x2F)  # json.dumps writes "/" raw
_NEVER_RAW: ud.RangeSet = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))


def _check_mode(escapes: str) -> None:
    if escapes not in ESCAPE_MODES:
        raise ValueError(f"unknown escape mode {escapes!r} (expected one of {ESCAPE_MODES})")


def _short(escapes: str) -> tuple[tuple[int, str], ...]:
    return _SHORT_ALL if escapes == "all" else _SHORT_CANONICAL


def _u_escaped(escapes: str) -> ud.RangeSet:
    """Code points that have a ``\\uXXXX`` (or surrogate-pair) spelling in this mode."""
    if escapes == "all":
        return ud.NON_SURROGATE
    # canonical: control characters without a short escape
    return ud.subtract(((0x00, 0x1F),), ud.normalize((cp, cp) for cp, _ in _SHORT_CANONICAL))


def spellings(cp: int, escapes: str = "all") -> list[str]:
    """Every spelling of code point ``cp`` inside a JSON string in this mode (a test aid:
    enumerates the language :func:`json_class` builds for one code point; hex case
    variants are listed as all-lower and all-upper only)."""
    _check_mode(escapes)
    out: list[str] = []
    if 0xD800 <= cp <= 0xDFFF:
        return out
    if not ud.contains(_NEVER_RAW, cp):
        out.append(chr(cp))
    out += ["\\" + c for p, c in _short(escapes) if p == cp]
    if ud.contains(_u_escaped(escapes), cp):
        if cp <= _MAX_BMP:
            forms = [f"\\u{cp:04x}"]
        else:
            hi, lo = divmod(cp - 0x10000, 0x400)
            forms = [f"\\u{0xD800 + hi:04x}\\u{0xDC00 + lo:04x}"]
        if escapes == "all":
            forms += [f.replace("\\u", "\\U").upper().replace("\\U", "\\u") for f in forms]
        out += list(dict.fromkeys(forms))
    return out


# ---------------------------------------------------------------------------
# Code-point classes -> byte-level IR
# ---------------------------------------------------------------------------

_Symbol = tuple[tuple[int, int], ...]  # one byte out of these ranges


def _utf8_split(lo: int, hi: int) -> list[tuple[_Symbol, ...]]:
    """Split a surrogate-free code-point range into byte-range sequences (one per piece)."""
    out: list[tuple[_Symbol, ...]] = []
    stack = [(lo, hi)]
    while stack:
        s, e = stack.pop()
        for bound in (0x7F, 0x7FF, 0xFFFF):
            if s <= bound < e:
                stack.append((bound + 1, e))
                stack.append((s, bound))
                break
        else:
            if e <= 0x7F:
                out.append((((s, e),),))
                continue
            n = 2 if e <= 0x7FF else 3 if e <= 0xFFFF else 4
            halves = _split_at_digit(s, e, 6, n - 1)  # UTF-8 continuation bytes carry 6 bits
            if halves:
                stack.extend(halves)
            else:
                bs = chr(s).encode("utf-8")
                be = chr(e).encode("utf-8")
                out.append(tuple(((a, b),) for a, b in zip(bs, be)))
    out.sort()
    return out


def _split_at_digit(s: int, e: int, bits: int, digits: int) -> tuple[tuple[int, int], ...]:
    """Split ``[s, e]`` once so that each part has fixed leading digits and full ranges in
    the low ``digits`` digits of ``bits`` bits each (the later part first); () when it
    already has that shape."""
    for i in range(1, digits + 1):
        m = (1 << (bits * i)) - 1
        if s & ~m != e & ~m:
            if s & m:
                return ((s | m) + 1, e), (s, s | m)
            if e & m != m:
                return (e & ~m, e), (s, (e & ~m) - 1)
    return ()


def _hex_digit_bytes(a: int, b: int, escapes: str) -> list[tuple[int, int]]:
    """Byte ranges of the hex digits with values a..b (upper case too in mode "all")."""
    rs: list[tuple[int, int]] = []
    if a <= 9:
        rs.append((0x30 + a, 0x30 + min(b, 9)))
    if b >= 10:
        x = max(a, 10) - 10
        y = b - 10
        rs.append((0x61 + x, 0x61 + y))
        if escapes == "all":
            rs.append((0x41 + x, 0x41 + y))
    return rs


def _hex_split(lo: int, hi: int, escapes: str) -> list[tuple[_Symbol, ...]]:
    """Split a 16-bit range into 4-hex-digit sequences of digit ranges."""
    out: list[tuple[_Symbol, ...]] = []
    stack = [(lo, hi)]
    while stack:
        s, e = stack.pop()
        halves = _split_at_digit(s, e, 4, 3)  # a hex digit carries 4 bits
        if halves:
            stack.extend(halves)
        else:
            out.append(tuple(tuple(_hex_digit_bytes((s >> k) & 15, (e >> k) & 15, escapes))
                             for k in (12, 8, 4, 0)))
    out.sort()
    return out


def _trie(seqs: Sequence[tuple[_Symbol, ...]]) -> ir.Expr:
    """Union of symbol sequences with common prefixes factored and equal tails merged."""
    ends = False
    groups: dict[_Symbol, list[tuple[_Symbol, ...]]] = {}
    for s in seqs:
        if not s:
            ends = True
        else:
            groups.setdefault(s[0], []).append(s[1:])
    by_child: dict[ir.Expr, list[_Symbol]] = {}
    for sym, rests in groups.items():
        by_child.setdefault(_trie(rests), []).append(sym)
    alts = [ir.seq(ir.byteset([r for sym in syms for r in sym]), child)
            for child, syms in by_child.items()]
    if ends:
        alts.append(ir.EMPTY)
    return ir.alt(*alts)


@lru_cache(maxsize=4096)
def utf8_class(rs: ud.RangeSet) -> ir.Expr:
    """The raw UTF-8 bytes of one code point out of the (surrogate-free) set ``rs``."""
    seqs: list[tuple[_Symbol, ...]] = []
    for lo, hi in rs:
        seqs.extend(_utf8_split(lo, hi))
    return _trie(seqs)


@lru_cache(maxsize=4096)
def _hex4(rs: ud.RangeSet, escapes: str) -> ir.Expr:
    seqs: list[tuple[_Symbol, ...]] = []
    for lo, hi in rs:
        seqs.extend(_hex_split(lo, hi, escapes))
    return _trie(seqs)


_BACKSLASH_U = ir.lit("\\u")


def _surrogate_pairs(astral: ud.RangeSet, escapes: str) -> ir.Expr:
    """``XXXX\\uYYYY`` (after a leading ``\\u``) for the astral code points in ``astral``;
    high surrogates whose low-surrogate sets are equal share one alternative."""
    per_hi: dict[int, list[tuple[int, int]]] = {}
    for c1, c2 in astral:
        h1, l1 = divmod(c1 - 0x10000, 0x400)
        h2, l2 = divmod(c2 - 0x10000, 0x400)
        if h1 == h2:
            per_hi.setdefault(h1, []).append((l1, l2))
            continue
        per_hi.setdefault(h1, []).append((l1, 0x3FF))
        for h in range(h1 + 1, h2):
            per_hi.setdefault(h, []).append((0, 0x3FF))
        per_hi.setdefault(h2, []).append((0, l2))
    by_low: dict[ud.RangeSet, list[tuple[int, int]]] = {}
    for h, lows in per_hi.items():
        key = tuple((0xDC00 + a, 0xDC00 + b) for a, b in ud.normalize(lows))
        by_low.setdefault(key, []).append((0xD800 + h, 0xD800 + h))
    return ir.alt(*(ir.seq(_hex4(ud.normalize(his), escapes), _BACKSLASH_U, _hex4(lows, escapes))
                    for lows, his in by_low.items()))


@lru_cache(maxsize=4096)
def _json_class(rs: ud.RangeSet, escapes: str) -> ir.Expr:
    parts = [utf8_class(ud.subtract(rs, _NEVER_RAW))]
    esc: list[ir.Expr] = []
    letters = [ord(ch) for cp, ch in _short(escapes) if ud.contains(rs, cp)]
    if letters:
        esc.append(ir.byteset(letters))
    u_alts: list[ir.Expr] = []
    u_set = ud.intersect(rs, _u_escaped(escapes))
    bmp = ud.intersect(u_set, ((0, _MAX_BMP),))
    if bmp:
        u_alts.append(_hex4(bmp, escapes))
    astral = ud.intersect(u_set, ((0x10000, ud.MAX_CODE_POINT),))
    if astral:
        u_alts.append(_surrogate_pairs(astral, escapes))
    if u_alts:
        esc.append(ir.seq(ir.lit("u"), ir.alt(*u_alts)))
    if esc:
        parts.append(ir.seq(ir.lit("\\"), ir.alt(*esc)))
    return ir.alt(*parts)


def json_class(ranges: Sequence[tuple[int, int]], escapes: str = "all") -> ir.Expr:
    """IR for one code point out of ``ranges``, in every spelling JSON allows inside a
    string literal (``escapes="all"``) or in ``json.dumps``'s spelling only
    (``"canonical"``). Surrogates are dropped; an empty set gives :data:`ir.NEVER`.
    Cached per (set, mode)."""
    _check_mode(escapes)
    rs = ud.intersect(ud.normalize(ranges), ud.NON_SURROGATE)
    if not rs:
        return ir.NEVER
    return _json_class(rs, escapes)


@lru_cache(maxsize=4096)
def json_char(ch: str, escapes: str = "all") -> ir.Expr:
    """:func:`json_class` of the one character ``ch`` (cached: enumerations and literals
    spell the same characters over and over)."""
    cp = ord(ch)
    return json_class(((cp, cp),), escapes)


def json_literal(text: str, escapes: str = "all") -> ir.Expr:
    """Every spelling of the string ``text`` (its content between the quotes)."""
    return ir.seq(*(json_char(ch, escapes) for ch in text))


# ---------------------------------------------------------------------------
# Raw-UTF-8 IR -> escaped IR
# ---------------------------------------------------------------------------

def json_content(e: ir.Expr, escapes: str = "all") -> ir.Expr:
    """The escaped language of a regular IR expression over raw UTF-8 string contents.

    ``e`` describes decoded string values by their UTF-8 bytes; its byte sets must be
    ASCII (a multi-byte code point is only understood inside an explicit
    :class:`~structgen.grammar.ir.Dfa`, which :func:`json_dfa` decodes). Rule references are not
    allowed (string languages are regular). Raises :class:`GrammarError` otherwise.
    Cached per (expression, mode).
    """
    _check_mode(escapes)
    return _content(e, escapes)


@lru_cache(maxsize=1024)
def _content(e: ir.Expr, escapes: str) -> ir.Expr:
    memo: dict[ir.Expr, ir.Expr] = {}

    def go(x: ir.Expr) -> ir.Expr:
        got = memo.get(x)
        if got is not None:
            return got
        if isinstance(x, ir.ByteSet):
            if x.ranges and x.ranges[-1][1] > 0x7F:
                raise GrammarError("escape layer: a byte set outside ASCII in a raw string "
                                   "expression (write multi-byte code points as a Dfa)")
            r = json_class(x.ranges, escapes)
        elif isinstance(x, ir.Seq):
            r = ir.seq(*(go(i) for i in x.items))
        elif isinstance(x, ir.Alt):
            r = ir.alt(*(go(i) for i in x.items))
        elif isinstance(x, ir.Repeat):
            r = ir.rep(go(x.item), x.min, x.max)
        elif isinstance(x, ir.And):
            r = ir.and_(go(x.left), go(x.right))
        elif isinstance(x, ir.Diff):
            r = ir.diff(go(x.left), go(x.right))
        elif isinstance(x, ir.Dfa):
            r = json_dfa(x, escapes)
        else:
            raise GrammarError(f"escape layer: {type(x).__name__} in a string language")
        memo[x] = r
        return r

    return go(e)


# -- explicit automata ---------------------------------------------------------------

_CpMap = tuple[tuple[int, int, Hashable], ...]  # sorted disjoint (lo, hi, value) ranges


def _restrict(m: _CpMap, lo: int, hi: int, shift: int) -> _CpMap:
    """The part of ``m`` inside [lo, hi], moved down by ``shift``."""
    out = []
    for a, b, v in m:
        if b < lo:
            continue
        if a > hi:
            break
        out.append((max(a, lo) - shift, min(b, hi) - shift, v))
    return tuple(out)


def _split(m: _CpMap, size: int) -> list[tuple[int, _CpMap]]:
    """``m`` cut into blocks of ``size`` values: (block index, the block's map from 0)."""
    blocks: dict[int, list[tuple[int, int, Hashable]]] = {}
    for a, b, v in m:
        for blk in range(a // size, b // size + 1):
            base = blk * size
            blocks.setdefault(blk, []).append((max(a, base) - base, min(b, base + size - 1) - base, v))
    return [(blk, tuple(p)) for blk, p in sorted(blocks.items())]


@lru_cache(maxsize=64)
def _digit_bytes(digit: int, escapes: str) -> tuple[tuple[int, int], ...]:
    return tuple(_hex_digit_bytes(digit, digit, escapes))


def _merge_map(pieces: list[tuple[int, int, Hashable]]) -> _CpMap:
    pieces.sort(key=lambda p: (p[0], p[1]))
    out: list[tuple[int, int, Hashable]] = []
    for a, b, v in pieces:
        if out and out[-1][2] == v and out[-1][1] + 1 == a:
            out[-1] = (out[-1][0], b, v)
        else:
            out.append((a, b, v))
    return tuple(out)


_UTF8_VALID = ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, ud.MAX_CODE_POINT))


def _code_point_edges(d: ir.Dfa) -> list[_CpMap]:
    """Per state of ``d``: its code-point transitions (UTF-8 decoded), as range maps."""
    cont_memo: dict[tuple[int, int], list[tuple[int, int, int]]] = {}

    def cont(q: int, k: int) -> list[tuple[int, int, int]]:
        """Offsets in [0, 64**k) readable as k continuation bytes from q -> end state."""
        key = (q, k)
        got = cont_memo.get(key)
        if got is not None:
            return got
        size = 64 ** (k - 1)
        pieces: list[tuple[int, int, int]] = []
        for lo, hi, t in d.trans[q]:
            lo, hi = max(lo, 0x80), min(hi, 0xBF)
            if lo > hi:
                continue
            if k == 1:
                pieces.append((lo - 0x80, hi - 0x80, t))
                continue
            sub = cont(t, k - 1)
            if len(sub) == 1 and sub[0][0] == 0 and sub[0][1] == size - 1:
                pieces.append(((lo - 0x80) * size, (hi - 0x80 + 1) * size - 1, sub[0][2]))
                continue
            for c in range(lo, hi + 1):
                base = (c - 0x80) * size
                pieces.extend((base + a, base + b, v) for a, b, v in sub)
        got = list(_merge_map(pieces))  # type: ignore[arg-type]
        cont_memo[key] = got
        return got

    out: list[_CpMap] = []
    for q in range(len(d.trans)):
        pieces: list[tuple[int, int, Hashable]] = []
        for lo, hi, t in d.trans[q]:
            if lo <= 0x7F:
                pieces.append((lo, min(hi, 0x7F), t))
            for b in range(max(lo, 0xC2), min(hi, 0xF4) + 1):
                n = 2 if b <= 0xDF else 3 if b <= 0xEF else 4
                base = (b & (0x7F >> n)) << (6 * (n - 1))
                vlo, vhi = _UTF8_VALID[n - 1]
                for a, c, v in cont(t, n - 1):
                    a, c = max(base + a, vlo), min(base + c, vhi)
                    for s, e in ud.intersect(((a, c),), ud.NON_SURROGATE) if a <= c else ():
                        pieces.append((s, e, v))
        out.append(_merge_map(pieces))
    return out


def _hex_map(m: _CpMap, escapes: str) -> _CpMap:
    """The ``\\u`` map of a state: 16-bit value -> ("T", target) for a BMP code point, or
    ("LOW", map of low-surrogate offsets) for a high surrogate (mode "all")."""
    allowed = _u_escaped(escapes)
    pieces: list[tuple[int, int, Hashable]] = []
    for a, b, t in m:
        for s, e in ud.intersect(((a, min(b, _MAX_BMP)),), allowed) if a <= _MAX_BMP else ():
            pieces.append((s, e, ("T", t)))
    if escapes == "all":
        astral = _restrict(m, 0x10000, ud.MAX_CODE_POINT, 0x10000)
        if astral:
            h_lo, h_hi = astral[0][0] >> 10, astral[-1][1] >> 10
            h = h_lo
            while h <= h_hi:
                lows = _restrict(astral, h << 10, (h << 10) + 0x3FF, h << 10)
                if not lows:
                    h += 1
                    continue
                # a run of high surrogates inside one full-range piece shares its low map
                run_end = h
                if len(lows) == 1 and lows[0][:2] == (0, 0x3FF):
                    piece = next(p for p in astral if p[0] <= h << 10 <= p[1])
                    run_end = ((piece[1] + 1) >> 10) - 1
                pieces.append((0xD800 + h, 0xD800 + max(h, run_end), ("LOW", lows)))
                h = max(h, run_end) + 1
    return _merge_map(pieces)


def json_dfa(d: ir.Dfa, escapes: str = "all") -> ir.Expr:
    """The escaped language of an explicit DFA over raw UTF-8 (see the module docstring).

    Each state keeps its identity; its code-point edges (grouped into ranges per target)
    are replaced by the decoder tries of their spellings. A decoder state is identified
    by what it still has to read and the range map of its remaining values to targets,
    so equal remainders share one state. Returns an :class:`~structgen.grammar.ir.Dfa`, or
    :data:`ir.NEVER` when nothing is accepted.
    """
    _check_mode(escapes)
    return _json_dfa(d, escapes)


@lru_cache(maxsize=64)
def _json_dfa(d: ir.Dfa, escapes: str) -> ir.Expr:
    cps = _code_point_edges(d)
    short = _short(escapes)
    raw_ok = ud.complement(_NEVER_RAW)
    ids: dict[Hashable, int] = {}
    work: list[Hashable] = []
    trans: list[list[tuple[int, int, int]]] = []

    def sid(key: Hashable) -> int:
        j = ids.get(key)
        if j is None:
            j = ids[key] = len(work)
            work.append(key)
            trans.append([])
        return j

    def lookup(m: _CpMap, cp: int) -> Hashable | None:
        for a, b, v in m:
            if a <= cp <= b:
                return v
        return None

    hex_maps: dict[int, _CpMap] = {}

    def hex_map(q: int) -> _CpMap:
        got = hex_maps.get(q)
        if got is None:
            got = hex_maps[q] = _hex_map(cps[q], escapes)
        return got

    def top_edges(q: int) -> list[tuple[int, int, int]]:
        m = cps[q]
        edges: list[tuple[int, int, int]] = []
        for a, b, t in m:
            for s, e in ud.intersect(((a, min(b, 0x7F)),), raw_ok) if a <= 0x7F else ():
                edges.append((s, e, sid(("S", t))))
        if m and m[-1][1] > 0x7F:
            for lead in range(0xC2, 0xF5):
                n = 2 if lead <= 0xDF else 3 if lead <= 0xEF else 4
                base = (lead & (0x7F >> n)) << (6 * (n - 1))
                sub = _restrict(m, base, base + (1 << (6 * (n - 1))) - 1, base)
                if sub:
                    edges.append((lead, lead, sid(("u8", n - 1, sub))))
        if any(lookup(m, cp) is not None for cp, _ in short) or hex_map(q):
            edges.append((0x5C, 0x5C, sid(("bs", q))))
        return edges

    def backslash_edges(q: int) -> list[tuple[int, int, int]]:
        m = cps[q]
        edges = []
        for cp, letter in short:
            t = lookup(m, cp)
            if t is not None:
                edges.append((ord(letter), ord(letter), sid(("S", t))))
        hm = hex_map(q)
        if hm:
            edges.append((0x75, 0x75, sid(("hex", 4, hm))))
        return edges

    def hex_edges(k: int, m: _CpMap) -> list[tuple[int, int, int]]:
        edges: list[tuple[int, int, int]] = []
        for digit, sub in _split(m, 16 ** (k - 1)):
            if k == 1:
                tag, val = cast("tuple[str, Hashable]", sub[0][2])  # a last digit's (tag, value)
                target = sid(("S", val)) if tag == "T" else sid(("lbs", val))
            else:
                target = sid(("hex", k - 1, sub))
            edges.extend((lo, hi, target) for lo, hi in _digit_bytes(digit, escapes))
        return edges

    def utf8_edges(k: int, m: _CpMap) -> list[tuple[int, int, int]]:
        edges: list[tuple[int, int, int]] = []
        for c, sub in _split(m, 64 ** (k - 1)):
            target = sid(("S", sub[0][2])) if k == 1 else sid(("u8", k - 1, sub))
            if edges and edges[-1][2] == target and edges[-1][1] == 0x80 + c - 1:
                edges[-1] = (edges[-1][0], 0x80 + c, target)
            else:
                edges.append((0x80 + c, 0x80 + c, target))
        return edges

    start = sid(("S", d.start))
    i = 0
    while i < len(work):
        key = work[i]
        tag = key[0]  # type: ignore[index]
        if tag == "S":
            trans[i] = top_edges(key[1])  # type: ignore[index]
        elif tag == "bs":
            trans[i] = backslash_edges(key[1])  # type: ignore[index]
        elif tag == "hex":
            trans[i] = hex_edges(key[1], key[2])  # type: ignore[index]
        elif tag == "u8":
            trans[i] = utf8_edges(key[1], key[2])  # type: ignore[index]
        elif tag == "lbs":  # a high surrogate was read: "\" "u" and a low surrogate follow
            trans[i] = [(0x5C, 0x5C, sid(("lu", key[1])))]  # type: ignore[index]
        else:  # "lu"
            lows = tuple((0xDC00 + a, 0xDC00 + b, ("T", t)) for a, b, t in key[1])  # type: ignore[index]
            trans[i] = [(0x75, 0x75, sid(("hex", 4, lows)))]
        i += 1
    accept = [j for j, key in enumerate(work) if key[0] == "S" and key[1] in d.accept]  # type: ignore[index]
    if not accept:
        return ir.NEVER
    return ir.Dfa(start, accept, trans)
