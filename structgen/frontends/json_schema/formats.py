"""Grammar IR for JSON Schema ``format`` values.

:func:`format_expr` returns the *content* of a JSON string (the bytes between the
quotes, decoded) for a known format. Every language here is pure ASCII.

Every language describes *decoded* string values: :mod:`structgen.frontends.json_escape` turns it
into the JSON string contents (any escape spelling) when a schema is lowered.

The languages follow the RFCs that JSON Schema names, narrowed where the checker that
``jsonschema`` (4.26) runs is stricter, so an accepted string is never rejected by
``jsonschema.FormatChecker``:

* ``date``: RFC 3339 ``full-date`` with the exact number of days per month, leap years
  included (Gregorian rule), years 0001-9999 (``datetime.date`` has no year 0).
* ``time``: RFC 3339 ``full-time``; seconds 00-59 (the leap second ``60`` is rejected,
  as ``jsonschema``'s ``rfc3339-validator`` does); ``T``/``Z`` in either case.
* ``date-time``: ``date`` ``T``|``t`` ``time`` (no space separator).
* ``duration``: the RFC 3339 appendix A grammar exactly (``P1Y2M``, ``PT1H30M``,
  ``P3W``; units in order without gaps in a run, e.g. ``P1Y1D`` is not in the ABNF).
* ``email``: RFC 5321 ``Mailbox`` with a dot-atom local part of at most 64 bytes (no
  quoted local parts) and a domain that is an LDH ``Domain`` (RFC 5321 section 4.1.2:
  ``sub-domain = Let-dig [Ldh-str]``, so any label of letters, digits and interior
  hyphens, A-labels such as ``xn--j1aef`` and labels like ``a--b`` included) or an
  ``[IPv4]`` / ``[IPv6:...]`` literal. The same for every draft: RFC 5321 does not ask
  A-labels to be valid Punycode (and ``jsonschema`` only checks for an ``@``).
* ``hostname``, per draft (the ``draft`` argument of :func:`format_expr`):

  - draft-04 and draft-06 ``hostname``: RFC 1034 section 3.1
    "preferred name syntax" as relaxed by RFC 1123 section 2.1 (a label may start with a
    digit): every LDH label of 1-63 bytes not starting or ending with a hyphen. A-labels
    (``xn--...``) are LDH labels, so they are accepted without Punycode checks; that is
    what these drafts' definition asks.
  - draft-07, 2019-09, 2020-12 (the default): RFC 1123 plus RFC 5890/5891, which make a
    label with ``--`` in its 3rd and 4th positions (an R-LDH label) valid only as an
    A-label, i.e. ``xn--`` followed by Punycode that decodes to a valid U-label (IDNA2008
    code points, contextual and bidi rules). That check is beyond a finite automaton (the
    decoded code points depend on arithmetic over the whole label), so :func:`format_expr`
    rejects R-LDH labels, valid A-labels included: the safe subset generation uses.
    Validation uses :func:`checked_format`: every LDH label, with each R-LDH label checked
    per value (:mod:`structgen.frontends.json_schema.idn`). Other labels with ``--``
    (``a--b``) are accepted by both.

  Both: dot separated, no trailing dot, at most 253 bytes in all. Label lengths are
  narrowed to keep the automaton small (about 2,000 states instead of 24,038 for the
  exact language): the first label, and a label starting at a multiple of 32 bytes, may
  have up to 63 bytes; any other label has at least 32 and at most 63 available, exactly
  ``63 - (start mod 32)``. The LDH variant is also used for ``email`` domains.
* ``idn-hostname`` / ``idn-email``: :func:`format_expr` gives the safe ASCII subsets
  (``hostname`` without R-LDH labels; ``email`` with such a domain), every string of which
  is valid; validation checks any string per value (:func:`checked_format`, RFC 5890-5893
  and 6531, see :mod:`structgen.frontends.json_schema.idn`).
* ``ipv4``: dotted quad, each 0-255 without leading zeros.
* ``ipv6``: every RFC 4291 text form (``::`` compression, embedded IPv4), no zone id.
* ``uuid``: 8-4-4-4-12 hex digits, either case.
* ``uri`` / ``uri-reference``: RFC 3986 ``URI`` / ``URI-reference`` (ASCII only:
  ``iri`` forms are not included).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from structgen.frontends.json_schema import idn
from structgen.frontends.json_schema.numbers import explore_dfa
from structgen.grammar import ir

__all__ = ["FORMATS", "checked_format", "format_expr", "format_length_bounds", "formats_imply_length",
           "length_bounds"]


def _cls(chars: str) -> ir.Expr:
    return ir.byteset(ord(c) for c in chars)


def _rng(lo: str, hi: str) -> ir.Expr:
    return ir.byte_range(ord(lo), ord(hi))


DIGIT = _rng("0", "9")
ALPHA = ir.alt(_rng("A", "Z"), _rng("a", "z"))
HEXDIG = ir.alt(DIGIT, _rng("A", "F"), _rng("a", "f"))
_ALNUM = ir.alt(ALPHA, DIGIT)


def _lit(s: str) -> ir.Expr:
    return ir.lit(s)


def _ci(s: str) -> ir.Expr:
    """A case-insensitive ASCII literal."""
    return ir.seq(*(_cls(c.lower() + c.upper()) if c.isalpha() else _lit(c) for c in s))


def _two(first: str, second: str) -> ir.Expr:
    """Two digits: the first from ``first``, the second from ``second`` (char classes)."""
    return ir.seq(_cls(first), _cls(second))


# ---------------------------------------------------------------------------
# Dates and times (RFC 3339)
# ---------------------------------------------------------------------------

def _date() -> ir.Expr:
    d = DIGIT
    # years 0001-9999
    year = ir.alt(ir.seq(_rng("1", "9"), d, d, d), ir.seq(_lit("0"), _rng("1", "9"), d, d),
                  ir.seq(_lit("00"), _rng("1", "9"), d), ir.seq(_lit("000"), _rng("1", "9")))
    # two-digit multiples of 4: 00 04 08 12 16 ... 96
    mult4_nz = ir.alt(_two("2468", "048"), _two("0", "48"), _two("13579", "26"))
    # leap: yy%4 == 0 and yy != 00 (any century), or century%4 == 0 with yy == 00
    leap_year = ir.alt(ir.seq(d, d, mult4_nz), ir.seq(mult4_nz, _lit("00")))
    day28 = ir.alt(ir.seq(_lit("0"), _rng("1", "9")), ir.seq(_lit("1"), d),
                   ir.seq(_lit("2"), _rng("0", "8")))
    day30 = ir.alt(day28, _lit("29"), _lit("30"))
    day31 = ir.alt(day30, _lit("31"))
    m31 = ir.alt(_lit("01"), _lit("03"), _lit("05"), _lit("07"), _lit("08"), _lit("10"),
                 _lit("12"))
    m30 = ir.alt(_lit("04"), _lit("06"), _lit("09"), _lit("11"))
    dash = _lit("-")
    return ir.alt(
        ir.seq(year, dash, m31, dash, day31),
        ir.seq(year, dash, m30, dash, day30),
        ir.seq(year, dash, _lit("02"), dash, day28),
        ir.seq(leap_year, _lit("-02-29")),
    )


def _hour() -> ir.Expr:
    return ir.alt(_two("01", "0123456789"), _two("2", "0123"))


def _minute() -> ir.Expr:
    return ir.seq(_rng("0", "5"), DIGIT)


def _time() -> ir.Expr:
    colon = _lit(":")
    secfrac = ir.opt(ir.seq(_lit("."), ir.plus(DIGIT)))
    offset = ir.alt(_cls("Zz"), ir.seq(_cls("+-"), _hour(), colon, _minute()))
    # seconds 00-59: jsonschema's checker rejects the leap second 60
    return ir.seq(_hour(), colon, _minute(), colon, _minute(), secfrac, offset)


def _date_time() -> ir.Expr:
    return ir.seq(_date(), _cls("Tt"), _time())


def _duration() -> ir.Expr:
    n = ir.plus(DIGIT)

    def unit(c: str) -> ir.Expr:
        return ir.seq(n, _lit(c))

    second = unit("S")
    minute = ir.seq(unit("M"), ir.opt(second))
    hour = ir.seq(unit("H"), ir.opt(minute))
    dur_time = ir.seq(_lit("T"), ir.alt(hour, minute, second))
    day = unit("D")
    month = ir.seq(unit("M"), ir.opt(day))
    year = ir.seq(unit("Y"), ir.opt(month))
    dur_date = ir.seq(ir.alt(day, month, year), ir.opt(dur_time))
    week = unit("W")
    return ir.seq(_lit("P"), ir.alt(dur_date, dur_time, week))


# ---------------------------------------------------------------------------
# Internet addresses and names
# ---------------------------------------------------------------------------

def _dec_octet() -> ir.Expr:
    d = DIGIT
    return ir.alt(d, ir.seq(_rng("1", "9"), d), ir.seq(_lit("1"), d, d),
                  ir.seq(_lit("2"), _rng("0", "4"), d), ir.seq(_lit("25"), _rng("0", "5")))


def _ipv4() -> ir.Expr:
    o = _dec_octet()
    dot = _lit(".")
    return ir.seq(o, dot, o, dot, o, dot, o)


def _ipv6() -> ir.Expr:
    h16 = ir.rep(HEXDIG, 1, 4)
    h16c = ir.seq(h16, _lit(":"))
    ls32 = ir.alt(ir.seq(h16, _lit(":"), h16), _ipv4())
    dc = _lit("::")

    def before(k: int) -> ir.Expr:
        """``[ *k( h16 ":" ) h16 ]``: up to k+1 groups before ``::``."""
        return ir.opt(ir.seq(ir.rep(h16c, 0, k), h16))

    return ir.alt(
        ir.seq(ir.rep(h16c, 6, 6), ls32),
        ir.seq(dc, ir.rep(h16c, 5, 5), ls32),
        ir.seq(ir.opt(h16), dc, ir.rep(h16c, 4, 4), ls32),
        ir.seq(before(1), dc, ir.rep(h16c, 3, 3), ls32),
        ir.seq(before(2), dc, ir.rep(h16c, 2, 2), ls32),
        ir.seq(before(3), dc, h16c, ls32),
        ir.seq(before(4), dc, ls32),
        ir.seq(before(5), dc, h16),
        ir.seq(before(6), dc),
    )


_ALNUM_BYTES = bytes(range(0x30, 0x3A)) + bytes(range(0x41, 0x5B)) + bytes(range(0x61, 0x7B))


HOSTNAME_MAX_LENGTH = 253
"""Longest hostname accepted (bytes): the RFC 1035 limit on a name's text form."""
HOSTNAME_LABEL_ALIGN = 32
"""Label-length bookkeeping granularity of the ``hostname`` automaton (see ``_hostname``)."""


@functools.lru_cache(maxsize=None)
def _hostname(allow_rldh: bool = False) -> ir.Expr:
    """RFC 1123 hostnames of at most 253 bytes, with a sound narrowing on label lengths.

    Exact enforcement of both "labels of 1-63 bytes" and "at most 253 bytes in all"
    needs the pair (bytes so far, bytes in the current label): the minimal DFA has 24,038
    states, which costs tens of seconds of compilation per ``hostname`` field. Instead
    the total is counted exactly and a label's start is remembered only to within
    :data:`HOSTNAME_LABEL_ALIGN` bytes (rounded down), and a label must end within 63
    bytes of that rounded start. Rounding down makes the check stricter, never looser, so
    every accepted label has at most 63 bytes: the first label (and any label starting at
    a multiple of 32) may use all 63 bytes, every other label at least 32 (2,076 states).
    """
    limit, align = HOSTNAME_MAX_LENGTH, HOSTNAME_LABEL_ALIGN

    # state (t, b, m, hy): t bytes so far; b: the current label's start rounded down to a
    # multiple of ``align``, divided by it; m = min(bytes in the label, 4); hy: last byte '-'
    def step(st: tuple[int, int, int, bool], c: int) -> tuple[int, int, int, bool] | None:
        t, b, m, hy = st
        if t >= limit:
            return None
        if c == 0x2E:
            return (t + 1, (t + 1) // align, 0, False) if m >= 1 and not hy else None
        if t + 1 > b * align + 63:  # the label could be longer than 63 bytes
            return None
        if c == 0x2D:
            if m == 3 and hy and not allow_rldh:
                # "--" in the 3rd and 4th positions: A-labels ("xn--") and other reserved
                # LDH labels; their IDNA validity cannot be checked by an automaton, so they
                # are rejected (a narrowing, never an over-acceptance)
                return None
            return (t + 1, b, min(m + 1, 4), True) if m >= 1 else None
        return (t + 1, b, min(m + 1, 4), False)

    return explore_dfa((0, 0, 0, False), step, lambda st: st[2] >= 1 and not st[3],
                       [_ALNUM_BYTES, b"-", b"."], "hostname")


_ATEXT_BYTES = _ALNUM_BYTES + b"!#$%&'*+-/=?^_`{|}~"


@functools.lru_cache(maxsize=None)
def _email(allow_rldh: bool = True) -> ir.Expr:
    # dot-atom local part of at most 64 bytes: state (n, last byte was a dot)
    def step(st: tuple[int, bool], b: int) -> tuple[int, bool] | None:
        n, dot = st
        if n >= 64:
            return None
        if b == 0x2E:
            return (n + 1, True) if n >= 1 and not dot else None
        return (n + 1, False)

    local = explore_dfa((0, False), step, lambda st: st[0] >= 1 and not st[1],
                        [_ATEXT_BYTES, b"."], "email local part")
    domain = ir.alt(_hostname(allow_rldh=allow_rldh),
                    ir.seq(_lit("["), _ipv4(), _lit("]")),
                    ir.seq(_lit("[IPv6:"), _ipv6(), _lit("]")))
    return ir.seq(local, _lit("@"), domain)


def _uuid() -> ir.Expr:
    def h(n: int) -> ir.Expr:
        return ir.rep(HEXDIG, n, n)
    dash = _lit("-")
    return ir.seq(h(8), dash, h(4), dash, h(4), dash, h(4), dash, h(12))


# ---------------------------------------------------------------------------
# URIs (RFC 3986)
# ---------------------------------------------------------------------------

def _uri_parts() -> dict[str, ir.Expr]:
    unreserved = ir.alt(_ALNUM, _cls("-._~"))
    sub_delims = _cls("!$&'()*+,;=")
    pct = ir.seq(_lit("%"), HEXDIG, HEXDIG)
    pchar = ir.alt(unreserved, pct, sub_delims, _cls(":@"))
    segment = ir.star(pchar)
    segment_nz = ir.plus(pchar)
    segment_nz_nc = ir.plus(ir.alt(unreserved, pct, sub_delims, _lit("@")))
    scheme = ir.seq(ALPHA, ir.star(ir.alt(_ALNUM, _cls("+-."))))
    userinfo = ir.star(ir.alt(unreserved, pct, sub_delims, _lit(":")))
    ipvfuture = ir.seq(_lit("v"), ir.plus(HEXDIG), _lit("."),
                       ir.plus(ir.alt(unreserved, sub_delims, _lit(":"))))
    ip_literal = ir.seq(_lit("["), ir.alt(_ipv6(), ipvfuture), _lit("]"))
    reg_name = ir.star(ir.alt(unreserved, pct, sub_delims))
    host = ir.alt(ip_literal, _ipv4(), reg_name)
    port = ir.star(DIGIT)
    authority = ir.seq(ir.opt(ir.seq(userinfo, _lit("@"))), host,
                       ir.opt(ir.seq(_lit(":"), port)))
    slash_seg = ir.star(ir.seq(_lit("/"), segment))
    path_abempty = slash_seg
    path_absolute = ir.seq(_lit("/"), ir.opt(ir.seq(segment_nz, slash_seg)))
    path_noscheme = ir.seq(segment_nz_nc, slash_seg)
    path_rootless = ir.seq(segment_nz, slash_seg)
    query = ir.star(ir.alt(pchar, _cls("/?")))
    tail = ir.seq(ir.opt(ir.seq(_lit("?"), query)), ir.opt(ir.seq(_lit("#"), query)))
    hier_part = ir.alt(ir.seq(_lit("//"), authority, path_abempty), path_absolute,
                       path_rootless, ir.EMPTY)
    relative_part = ir.alt(ir.seq(_lit("//"), authority, path_abempty), path_absolute,
                           path_noscheme, ir.EMPTY)
    uri = ir.seq(scheme, _lit(":"), hier_part, tail)
    relative_ref = ir.seq(relative_part, tail)
    return {"uri": uri, "uri-reference": ir.alt(uri, relative_ref)}


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------

_BUILDERS: dict[str, Callable[[], ir.Expr]] = {
    "date": _date,
    "time": _time,
    "date-time": _date_time,
    "duration": _duration,
    "email": _email,
    "hostname": _hostname,
    "ipv4": _ipv4,
    "ipv6": _ipv6,
    "uuid": _uuid,
    "uri": lambda: _uri_parts()["uri"],
    "uri-reference": lambda: _uri_parts()["uri-reference"],
    # the safe subsets (see the module docstring); validation checks the superset per value
    "idn-hostname": lambda: _hostname(allow_rldh=False),
    "idn-email": lambda: _email(allow_rldh=False),
}

#: The format names :func:`format_expr` knows.
FORMATS: frozenset[str] = frozenset(_BUILDERS)


def length_bounds(e: ir.Expr) -> tuple[int, int | None] | None:
    """(shortest, longest) match length in bytes of a regular IR expression.

    ``longest`` is None when unbounded; the result is None for an empty language or an
    expression this does not analyse (rule references, ``And``/``Diff``).
    """
    if isinstance(e, ir.ByteSet):
        return (1, 1) if e.ranges else None
    if isinstance(e, ir.Seq):
        lo = 0
        hi: int | None = 0
        for x in e.items:
            b = length_bounds(x)
            if b is None:
                return None
            lo += b[0]
            hi = None if hi is None or b[1] is None else hi + b[1]
        return lo, hi
    if isinstance(e, ir.Alt):
        bs = [b for b in (length_bounds(x) for x in e.items)]
        if not bs or any(b is None for b in bs):
            return None
        his = [b[1] for b in bs]  # type: ignore[index]
        return min(b[0] for b in bs), (None if None in his else max(his))  # type: ignore[index, type-var]
    if isinstance(e, ir.Repeat):
        b = length_bounds(e.item)
        if b is None:
            return (0, 0) if e.min == 0 else None
        hi = None if e.max is None or b[1] is None else b[1] * e.max
        return b[0] * e.min, (0 if e.max == 0 else hi)
    if isinstance(e, ir.Dfa):
        return _dfa_length_bounds(e)
    return None


def _dfa_length_bounds(d: ir.Dfa) -> tuple[int, int | None] | None:
    n = len(d.trans)
    succ = [sorted({t for _lo, _hi, t in edges}) for edges in d.trans]
    # live states: reachable from the start and able to reach acceptance
    reach = {d.start}
    stack = [d.start]
    while stack:
        for t in succ[stack.pop()]:
            if t not in reach:
                reach.add(t)
                stack.append(t)
    pred: list[list[int]] = [[] for _ in range(n)]
    for q in reach:
        for t in succ[q]:
            pred[t].append(q)
    live = {q for q in d.accept if q in reach}
    stack = list(live)
    while stack:
        for p in pred[stack.pop()]:
            if p not in live:
                live.add(p)
                stack.append(p)
    if d.start not in live:
        return None
    # shortest: BFS; longest: longest path in the live part (None if it has a cycle)
    dist = {d.start: 0}
    frontier = [d.start]
    shortest = None
    while frontier and shortest is None:
        nxt = []
        for q in frontier:
            if q in d.accept:
                shortest = dist[q]
                break
            for t in succ[q]:
                if t in live and t not in dist:
                    dist[t] = dist[q] + 1
                    nxt.append(t)
        frontier = nxt
    longest: dict[int, int] = {}  # longest path from q to an accepting state
    state: dict[int, int] = {}  # 1: on the DFS stack, 2: done
    stack2: list[tuple[int, int]] = [(d.start, 0)]
    while stack2:
        q, i = stack2.pop()
        if i == 0:
            if state.get(q) == 2:
                continue
            state[q] = 1
        kids = [t for t in succ[q] if t in live]
        if i < len(kids):
            stack2.append((q, i + 1))
            t = kids[i]
            if state.get(t) == 1:
                return (shortest or 0), None  # a cycle: unbounded
            if state.get(t) != 2:
                stack2.append((t, 0))
            continue
        best = 0 if q in d.accept else -1
        for t in kids:
            if longest[t] >= 0:
                best = max(best, longest[t] + 1)
        longest[q] = best
        state[q] = 2
    return (shortest or 0), longest[d.start]


@functools.lru_cache(maxsize=None)
def format_length_bounds(name: str) -> tuple[int, int | None] | None:
    """(shortest, longest) length of format ``name``'s strings (bytes = code points: every
    format language here is ASCII); None if unknown. Lets the JSON Schema lowering drop a
    ``minLength``/``maxLength`` that the format already implies (an intersection with a
    length counter can multiply the automaton's size)."""
    e = format_expr(name)
    return None if e is None else length_bounds(e)


def formats_imply_length(names: frozenset[str], lo: int, hi: int | None) -> bool:
    """Do the formats ``names`` alone keep every string's length within [lo, hi]?

    Then a length counter is redundant and can be left out: intersecting a format's
    automaton with a counter can multiply its size (``email`` with ``maxLength: 1024``).
    Format languages are ASCII, so their byte lengths are code-point lengths.
    """
    if not names:
        return False
    f_lo, f_hi = 0, None
    for name in names:
        b = format_length_bounds(name)
        if b is None:
            return False
        f_lo = max(f_lo, b[0])
        f_hi = b[1] if f_hi is None else (f_hi if b[1] is None else min(f_hi, b[1]))
    return f_lo >= lo and (hi is None or (f_hi is not None and f_hi <= hi))


_LDH_HOSTNAME_DRAFTS = frozenset({"3", "4", "6"})
"""Drafts whose ``hostname`` is plain LDH syntax (RFC 1034/1123), A-labels unchecked."""


@functools.lru_cache(maxsize=None)
def format_expr(name: str, draft: str | None = None) -> ir.Expr | None:
    """IR for the decoded content of a JSON string in format ``name``, or None if unknown.

    ``draft`` ("3", "4", "6", "7", "2019-09", "2020-12"; None: the latest) selects the
    draft's definition where they differ (``hostname``). The result describes decoded
    characters (no escapes); see the module docstring for each format's exact language.
    Built once per (name, draft) and cached.
    """
    if name == "hostname" and draft in _LDH_HOSTNAME_DRAFTS:
        return _hostname(allow_rldh=True)
    build = _BUILDERS.get(name)
    return build() if build is not None else None


_CHECKED = frozenset({"hostname", "idn-hostname", "idn-email"})


def checked_format(name: str, draft: str | None = None) -> tuple[ir.Expr | None, int] | None:
    """How validation checks format ``name`` under ``draft`` per value, or None when the
    automaton of :func:`format_expr` is already exact.

    Returns ``(superset, marker)``: ``superset`` is the IR of a language containing every
    valid value (None: any string), and ``marker`` the value check
    (:mod:`structgen.frontends.json_schema.idn`) that decides each string of it.
    """
    if name not in _CHECKED or (name == "hostname" and draft in _LDH_HOSTNAME_DRAFTS):
        return None
    if name == "hostname":
        return _hostname(allow_rldh=True), idn.HOSTNAME_CHECK
    if name == "idn-hostname":
        return None, idn.IDN_HOSTNAME_CHECK
    if name == "idn-email":
        return None, idn.IDN_EMAIL_CHECK
    return None
