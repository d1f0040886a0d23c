"""The digit-by-digit automaton behind :mod:`structgen.frontends.json_schema.numbers`.

:class:`Spec` says what a number literal must satisfy (bounds as :class:`Bound` thresholds on
its decimal digits, ``multipleOf`` as a :class:`Mod` residue, which literal shapes are
allowed); :class:`NumberDfa` is the automaton that reads a literal byte by byte and keeps, for
each bound, the state of a digit comparison against the bound's decimal expansion
(:func:`terminating_digits`) and the residue of the digits read so far. The states are small
hashable tuples, so :func:`structgen.grammar.fsa.explore_dfa` can explore and minimise it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from fractions import Fraction

__all__ = ["Bound", "Mod", "NumberDfa", "Spec", "terminating_digits"]


def terminating_digits(x: Fraction) -> tuple[str, str]:
    """``x >= 0`` with a terminating decimal expansion -> (integer digits, fraction digits).

    Integer digits have no leading zeros ("" for 0); fraction digits no trailing zeros.
    """
    ip = x.numerator // x.denominator
    rest = x - ip
    d = rest.denominator
    a = b = 0
    while d % 2 == 0:
        d //= 2
        a += 1
    while d % 5 == 0:
        d //= 5
        b += 1
    if d != 1:  # pragma: no cover - inputs are decimals or dyadic rationals
        raise ValueError(f"{x} has no terminating decimal expansion")
    k = max(a, b)
    frac = str(rest.numerator * (10 ** k // rest.denominator)).rjust(k, "0") if k else ""
    return ("" if ip == 0 else str(ip)), frac.rstrip("0")


@dataclass(frozen=True)
class Bound:
    """One bound: ``v <= T`` (upper) or ``v >= T``, strict or not.

    It applies to int literals (``on_int``), plain float literals with a fraction and
    no exponent (``on_frac``) and/or literals with an exponent (``on_exp``). ``|T|`` is
    ``xi.xf`` and, when non-zero, ``xm[0].xm[1:] * 10**xe``.
    """

    on_int: bool
    on_frac: bool
    on_exp: bool
    upper: bool
    strict: bool
    tneg: bool
    tzero: bool
    xi: str
    xf: str
    xm: str
    xe: int

    @staticmethod
    def make(value: Fraction, *, on_int: bool, on_frac: bool, on_exp: bool, upper: bool,
             strict: bool) -> Bound:
        """The bound ``v <= value`` (``upper``) or ``v >= value``, strict or not, on the
        literal shapes named by ``on_int`` / ``on_frac`` / ``on_exp``."""
        a = abs(value)
        xi, xf = terminating_digits(a)
        if xi:
            xe = len(xi) - 1
            xm = (xi + xf).rstrip("0")
        elif xf:
            z = len(xf) - len(xf.lstrip("0"))
            xe = -(z + 1)
            xm = xf.lstrip("0")
        else:
            xe, xm = 0, ""
        return Bound(on_int, on_frac, on_exp, upper, strict, value < 0, value == 0, xi, xf, xm, xe)

    def ok(self, c: int) -> bool:
        """Is a literal whose comparison with the threshold is ``c`` (-1, 0, 1) within the bound?"""
        if self.upper:
            return c < 0 or (c == 0 and not self.strict)
        return c > 0 or (c == 0 and not self.strict)

    def fixed(self, neg: bool) -> int | None:
        """cmp(v, T) when the literal's sign alone decides it."""
        if not neg and self.tneg:
            return 1
        if neg and not self.tneg and not self.tzero:
            return -1
        return None

    def signed(self, neg: bool, cabs: int) -> int:
        """cmp(v, T) from cmp(|v|, |T|) when :meth:`fixed` is None."""
        return -cabs if neg else cabs


@dataclass(frozen=True)
class Mod:
    """``v`` must be a multiple of ``M / 10**K`` (exact decimal arithmetic)."""

    M: int
    K: int
    S: int          # max fraction digits in an exponent-form mantissa (-1: no exponent forms)
    cmax: int       # n0 search bound: max exponent of 2 and 5 in M
    #: canon[r]: a representative of r's class; residues in one class accept the same
    #: digit suffixes (only the 2/5 part of M can merge), so the automaton is explored
    #: over classes instead of all M residues
    canon: tuple[int, ...] = field(compare=False, repr=False, default=())

    def push(self, r: int, d: int) -> int:
        """The class of the digits of ``r`` followed by digit ``d``."""
        return self.canon[(r * 10 + d) % self.M]

    def shift(self, r: int, n: int) -> int:
        """The class of ``r`` followed by ``n`` zeros."""
        return self.canon[(r * pow(10, n, self.M)) % self.M]

    def n0(self, r: int) -> int | None:
        """Least n >= 0 with r * 10**n divisible by M, or None."""
        for n in range(self.cmax + 1):
            if (r * pow(10, n, self.M)) % self.M == 0:
                return n
        return None


@dataclass(frozen=True)
class Spec:
    """What a number literal must satisfy: thresholds, a ``multipleOf`` residue, which shapes
    (fraction, exponent) are allowed and how many digits they may have."""

    ths: tuple[Bound, ...]
    mod: Mod | None
    allow_frac: bool
    allow_exp: bool
    max_frac: int | None
    max_exp: int | None
    max_mant: int | None = None  # mantissa digits (a lone leading 0 not counted)
    neg_zero: bool = True        # accept -0, -0.0, -0e1 (value 0)


# ---------------------------------------------------------------------------
# Digit comparators (pure functions on small hashable states)
# ---------------------------------------------------------------------------
# "plain" comparator of a literal I[.F] (|v|) against xi.xf:
#   ('i', k, c): reading integer digits, k significant digits so far (leading zeros are
#                skipped), c = cmp of those against xi[:k];
#   ('f', j):    fraction digits equal so far to xf[:j] (j capped at len(xf));
#   ('r', c):    decided.
# "lex" comparator of a digit sequence against digit string xs padded with zeros:
#   j (equal so far, capped at len(xs)) or ('r', c).

_PC0 = ("i", 0, 0)


def _sgn(a: int, b: int) -> int:
    return (a > b) - (a < b)


def _step_int_comparison(st: tuple, d: int, xi: str) -> tuple:
    """The comparison of an integer part with the bound's integer digits ``xi`` after one more
    digit ``d``: ``("r", sign)`` once resolved, else the digits seen so far and the pending sign."""
    if st[0] == "r":
        return st
    _, k, c = st
    if k == 0 and d == 0:
        return st
    if k >= len(xi):
        return ("r", 1)
    if c == 0:
        c = _sgn(d, ord(xi[k]) - 48)
    return ("i", k + 1, c)


def _pc_dot(st: tuple, xi: str) -> tuple:
    if st[0] == "r":
        return st
    _, k, c = st
    if k < len(xi):
        return ("r", -1)
    if c != 0:
        return ("r", c)
    return ("f", 0)


def _pc_frac(st: tuple, d: int, xf: str) -> tuple:
    if st[0] == "r":
        return st
    j = st[1]
    xd = ord(xf[j]) - 48 if j < len(xf) else 0
    if d == xd:
        return ("f", min(j + 1, len(xf)))
    return ("r", _sgn(d, xd))


def _pc_res(st: tuple, xi: str, xf: str) -> int:
    tag = st[0]
    if tag == "r":
        return st[1]
    if tag == "i":
        _, k, c = st
        if k < len(xi):
            return -1
        if c != 0:
            return c
        return -1 if xf else 0
    return -1 if st[1] < len(xf) else 0


def _step_digit_comparison(st: int | tuple, d: int, xs: str) -> int | tuple:
    """The lexicographic comparison of a digit string with ``xs`` after one more digit ``d``:
    the number of digits matched so far, or ``("r", sign)`` once they differ."""
    if isinstance(st, tuple):
        return st
    xd = ord(xs[st]) - 48 if st < len(xs) else 0
    if d == xd:
        return min(st + 1, len(xs))
    return ("r", _sgn(d, xd))


def _lx_res(st: int | tuple, xs: str) -> int:
    if isinstance(st, tuple):
        return st[1]
    return -1 if st < len(xs) else 0


@functools.lru_cache(maxsize=256)
def _digit_classes(marks: frozenset[int]) -> tuple[bytes, ...]:
    """The digit bytes in classes that no comparison with a digit in ``marks`` tells apart:
    each mark alone, the digits between two marks together (0, a leading zero, is always
    a mark)."""
    out: list[bytes] = []
    run = b""
    for d in range(10):
        if d == 0 or d in marks:
            if run:
                out.append(run)
                run = b""
            out.append(bytes([0x30 + d]))
        else:
            run += bytes([0x30 + d])
    if run:
        out.append(run)
    return tuple(out)


def _marks(*xs: str) -> frozenset[int]:
    return frozenset(ord(c) - 48 for x in xs for c in x)


# An exponent comparator compares the digits |E| is still reading with a bound X by what is
# left of X: (started, rest, c) with rest the digits of X not yet matched while c == 0, and
# only their number once c, the comparison of the digits read with X's first ones, is
# decided. Bounds that differ only in digits no longer compared then share states.

def _exp_cmp_start(x: int) -> tuple[bool, str | int, int]:
    return (False, _int_str(x), 0)


def _exp_cmp_step(st: tuple[bool, str | int, int], d: int) -> tuple[bool, str | int, int] | None:
    """After one more digit ``d``; None once ``|E|`` has more digits than ``X`` (it is larger)."""
    started, rest, c = st
    if not started and d == 0:
        return st  # a leading zero
    if isinstance(rest, int):
        return (True, rest - 1, c) if rest else None
    if not rest:
        return None
    c = _sgn(d, ord(rest[0]) - 48)
    return (True, rest[1:], 0) if c == 0 else (True, len(rest) - 1, c)


def _exp_cmp_result(st: tuple[bool, str | int, int]) -> int:
    """cmp(|E|, X) if the exponent ends here."""
    return -1 if st[1] else st[2]


def _int_str(x: int) -> str:
    return str(abs(x)) if x else ""


# ---------------------------------------------------------------------------
# The number automaton
# ---------------------------------------------------------------------------
# State tuples:
#   ('S',)                                  start
#   (ph, neg, cs, mk, ms, md, cnt)          ph in '-' (sign read), 'I', '.', 'F'
#       cs: per threshold, for plain (int / fraction) literals: a plain comparator,
#           ('x', c) decided (c = cmp(v, T)), or None (not applicable / not needed)
#       mk: mantissa kind 'z' (all zero so far) / 'n' (one non-zero integer digit) / 'o'
#       ms: per threshold, lex comparator of the mantissa against xm (or None)
#       md: (r, j, s, tailz) or None (no modulus); s > S means "no exponent form"
#       cnt: fraction digits (only counted with max_frac)
#   ('e', lo, hi)                          read e/E: every condition on a literal with an
#       exponent reduces, once the mantissa is read, to an interval lo <= E <= hi on the
#       exponent (None: unbounded)
#   (ph, cmin, cmax, cnt)                  ph in 's' (exponent sign read), 'E' (digits): with
#       the sign known, the interval becomes amin <= |E| <= amax on the exponent's digits;
#       cmin/cmax are exponent comparators (see above) against amin / amax, or None when that
#       side is unbounded or met; cnt: exponent digits
# Decided comparisons are canonicalised (a satisfied bound becomes ('x', -1) / ('x', 1), a
# satisfied exponent bound is dropped, a violated one ends the literal) and parts that can
# no longer matter are dropped, so equivalent states coincide and dead ends are not explored.


class NumberDfa:
    """The automaton of the literals :class:`Spec` ``spec`` accepts, given implicitly: start
    state ``("S",)``, :meth:`step` per byte, :meth:`accepting` per state (the state tuples are
    described above)."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.ths = spec.ths
        self.mod = spec.mod
        self._every_digit = self.mod is not None and self.mod.M > 1  # residues tell all digits apart

    def byte_classes(self, st: tuple) -> tuple[bytes, ...]:
        """The bytes that state ``st`` may read, in classes it does not tell apart (:meth:`step`
        sees one byte of each): a digit meets only the next digit of each undecided
        comparison, and 0 (a leading or trailing zero)."""
        ph = st[0]
        if ph == "e":
            return (b"+", b"-", *_digit_classes(_marks(_int_str(st[1] or 0), _int_str(st[2] or 0))))
        if ph in ("s", "E"):
            return _digit_classes(frozenset(ord(c[1][0]) - 48 for c in st[1:3]
                                            if c is not None and isinstance(c[1], str) and c[1]))
        if ph == "S":
            return (b"-", *self._mantissa_digits(None))
        digits = self._mantissa_digits(st)
        if ph == "I":
            return (*digits, b".", b"Ee")
        return (*digits, b"Ee") if ph == "F" else digits

    def _mantissa_digits(self, st: tuple | None) -> tuple[bytes, ...]:
        if self._every_digit:
            return _digit_classes(frozenset(range(10)))
        marks: set[int] = set()
        if st is None:  # the start: every comparison is at its first digit
            marks.update(ord(x[0]) - 48 for th in self.ths for x in (th.xi, th.xm) if x)
            return _digit_classes(frozenset(marks))
        for th, c in zip(self.ths, st[2]):
            if c is None:
                continue
            if c[0] == "i":
                if c[2] == 0 and c[1] < len(th.xi):
                    marks.add(ord(th.xi[c[1]]) - 48)
            elif c[0] == "f" and c[1] < len(th.xf):
                marks.add(ord(th.xf[c[1]]) - 48)
        for th, m in zip(self.ths, st[4]):
            if isinstance(m, int) and m < len(th.xm):
                marks.add(ord(th.xm[m]) - 48)
        return _digit_classes(frozenset(marks))

    @staticmethod
    def _sat(th: Bound) -> tuple:
        return ("x", -1 if th.upper else 1)

    def _init(self, neg: bool) -> tuple:
        cs: list[tuple | None] = []
        ms: list[int | None] = []
        for th in self.ths:
            f = th.fixed(neg)
            if th.on_int or th.on_frac:
                cs.append(("x", f) if f is not None else _PC0)
            else:
                cs.append(None)
            ms.append(0 if (th.on_exp and not th.tzero and f is None) else None)
        md = (0, 0, 0, True) if self.mod is not None else None
        return ("-", neg, tuple(cs), "z", tuple(ms), md, 0)

    def _canon_plain(self, ph: str, neg: bool, cs: tuple, mk: str, ms: tuple,
                     md: tuple | None, cnt: int) -> tuple | None:
        spec = self.spec
        mod = self.mod
        ncs: list[tuple | None] = []
        int_ok = ph in ("-", "I")
        frac_ok = spec.allow_frac
        exp_ok = spec.allow_exp
        for th, c in zip(self.ths, cs):
            if c is not None and c[0] == "r":
                c = ("x", th.signed(neg, c[1]))
            if c is not None and c[0] == "x":
                if th.ok(c[1]):
                    c = self._sat(th)
                else:
                    int_ok = int_ok and not th.on_int
                    frac_ok = frac_ok and not th.on_frac
            ncs.append(c)
            if th.on_exp and exp_ok:
                f = th.fixed(neg)
                if f is None and th.tzero and mk != "z":  # a non-zero mantissa: the sign decides
                    f = th.signed(neg, 1)
                if f is not None:
                    exp_ok = th.ok(f)
                elif mk == "o" and not th.tzero:
                    exp_ok = False  # not normalised: cannot compare exactly
        if md is not None:
            assert mod is not None
            if not md[3]:
                int_ok = frac_ok = False
            if mk != "z" and (mod.S < 0 or md[2] > mod.S):
                exp_ok = False
        if not (int_ok or frac_ok or exp_ok):
            return None
        ncs = [c if ((th.on_int and int_ok) or (th.on_frac and frac_ok)) else None
               for th, c in zip(self.ths, ncs)]
        if not exp_ok:
            ms = (None,) * len(ms)
            if ph in (".", "F") and (spec.neg_zero or not neg or mk != "z"):
                mk = "o"  # (a negative zero mantissa stays "z": it is rejected)
            if md is not None and mod is not None and mod.S >= 0:
                md = (md[0], md[1], mod.S + 1, md[3])
        return (ph, neg, tuple(ncs), mk, ms, md, cnt)

    @staticmethod
    def _exp_signed(lo: int | None, hi: int | None, eneg: bool) -> tuple | None:
        """The exponent state once its sign is known: ``lo <= E <= hi`` as bounds on ``|E|``."""
        amin, amax = (None if hi is None else -hi, None if lo is None else -lo) if eneg else (lo, hi)
        if amax is not None and amax < 0:
            return None
        return ("s", None if amin is None or amin <= 0 else _exp_cmp_start(amin),
                None if amax is None else _exp_cmp_start(amax), 0)

    @staticmethod
    def _exp_digit(cmin: tuple | None, cmax: tuple | None, d: int, cnt: int) -> tuple | None:
        """The ``E`` state after digit ``d``: a lower bound on ``|E|`` is dropped once met (more
        digits only make ``|E|`` larger), the literal ends once the upper bound is passed."""
        if cmin is not None:
            cmin = _exp_cmp_step(cmin, d)
            if cmin is None or (not cmin[1] and cmin[2] >= 0):
                cmin = None
        if cmax is not None:
            cmax = _exp_cmp_step(cmax, d)
            if cmax is None or (not cmax[1] and cmax[2] > 0):
                return None
        return ("E", cmin, cmax, cnt)

    def _mod_digit(self, md: tuple, d: int, in_frac: bool) -> tuple | None:
        mod = self.mod
        assert mod is not None
        r, j, s, tailz = md
        K, S = mod.K, mod.S
        if not in_frac:
            return (mod.push(r, d), j, s, tailz)
        s2 = min(s + 1, S + 1) if S >= 0 else 0
        if j < K:
            return (mod.push(r, d), j + 1, s2, tailz)
        if tailz:
            if d == 0:
                return (r, j, s2, True)
            if S < 0 or s + 1 > S:
                return None  # plain form needs a zero tail, exponent form too long
            return (mod.push(mod.shift(r, s - K), d), j, s2, False)
        if S < 0 or s + 1 > S:
            return None
        return (mod.push(r, d), j, s2, False)

    def _mod_plain_ok(self, md: tuple | None) -> bool:
        if md is None:
            return True
        mod = self.mod
        assert mod is not None
        r, j, _s, tailz = md
        return tailz and (r * pow(10, mod.K - j, mod.M)) % mod.M == 0

    # -- transition function ----------------------------------------------
    def step(self, st: tuple, b: int) -> tuple | None:
        """The state after byte ``b`` in state ``st``; None when no accepted literal continues so."""
        ph = st[0]
        spec = self.spec
        if ph == "S":
            if b == 0x2D:  # '-'
                return self._canon_plain(*self._init(True))
            if 0x30 <= b <= 0x39:
                return self._int_digit(self._init(False), b - 48)
            return None
        if ph in ("-", "I"):
            if 0x30 <= b <= 0x39:
                if ph == "I" and st[3] == "z":
                    return None  # no leading zeros
                return self._int_digit(st, b - 48)
            if ph == "-":
                return None
            if b == 0x2E and spec.allow_frac:
                _, neg, cs, mk, ms, md, cnt = st
                ncs = tuple(None if (c is None or not th.on_frac) else
                            (c if c[0] == "x" else _pc_dot(c, th.xi))
                            for th, c in zip(self.ths, cs))
                return self._canon_plain(".", neg, ncs, mk, ms, md, cnt)  # 0 without max_mant
            if b in (0x45, 0x65) and spec.allow_exp:
                return self._to_exp(st)
            return None
        if ph in (".", "F"):
            if 0x30 <= b <= 0x39:
                return self._frac_digit(st, b - 48)
            if ph == "F" and b in (0x45, 0x65) and spec.allow_exp:
                return self._to_exp(st)
            return None
        # exponent phases
        if ph == "e":
            if b in (0x2B, 0x2D):
                return self._exp_signed(st[1], st[2], b == 0x2D)
            signed = self._exp_signed(st[1], st[2], False)  # a digit: the sign is +
            if signed is None:
                return None
            st = signed
        if 0x30 <= b <= 0x39:
            _, cmin, cmax, cnt = st
            if spec.max_exp is not None:
                cnt += 1
                if cnt > spec.max_exp:
                    return None
            return self._exp_digit(cmin, cmax, b - 48, cnt)
        return None

    def _int_digit(self, st: tuple, d: int) -> tuple | None:
        _, neg, cs, mk, ms, md, cnt = st
        if self.spec.max_mant is not None and not (st[0] == "-" and d == 0):
            cnt += 1
            if cnt > self.spec.max_mant:
                return None
        ncs = tuple(None if c is None else (c if c[0] == "x" else _step_int_comparison(c, d, th.xi))
                    for th, c in zip(self.ths, cs))
        nmk = ("z" if d == 0 else "n") if st[0] == "-" else "o"
        if nmk == "n":
            nms = tuple(None if m is None else _step_digit_comparison(m, d, th.xm)
                        for th, m in zip(self.ths, ms))
        else:
            nms = (None,) * len(ms)
        if md is not None:
            md = self._mod_digit(md, d, False)
        return self._canon_plain("I", neg, ncs, nmk, nms, md, cnt)

    def _frac_digit(self, st: tuple, d: int) -> tuple | None:
        _, neg, cs, mk, ms, md, cnt = st
        spec = self.spec
        lim = spec.max_frac if spec.max_mant is None else spec.max_mant
        if lim is not None:
            cnt += 1
            if cnt > lim:
                return None
        ncs = tuple(None if c is None else (c if c[0] == "x" else _pc_frac(c, d, th.xf))
                    for th, c in zip(self.ths, cs))
        if mk == "n":
            nmk = "n"
            nms = tuple(None if m is None else _step_digit_comparison(m, d, th.xm)
                        for th, m in zip(self.ths, ms))
        elif mk == "z" and d == 0:
            nmk, nms = "z", ms
        else:
            nmk, nms = "o", (None,) * len(ms)
        if md is not None:
            md = self._mod_digit(md, d, True)
            if md is None:
                return None
        return self._canon_plain("F", neg, ncs, nmk, nms, md, cnt)

    def _to_exp(self, st: tuple) -> tuple | None:
        """Reduce everything known about the mantissa to an interval on the exponent."""
        _, neg, _cs, mk, ms, md, _cnt = st
        if neg and mk == "z" and not self.spec.neg_zero:
            return None
        lo: int | None = None
        hi: int | None = None
        for th, m in zip(self.ths, ms):
            if not th.on_exp:
                continue
            f = th.fixed(neg)
            if f is None and th.tzero:
                f = th.signed(neg, 0 if mk == "z" else 1)
            elif f is None and mk == "z":
                f = th.signed(neg, -1)
            if f is not None:
                if not th.ok(f):
                    return None
                continue
            if mk != "n" or m is None:
                return None  # not normalised: cannot compare exactly
            cm = _lx_res(m, th.xm)
            # cmp(|v|, |T|) is cmp(E, xe), or cm when E == xe
            if th.upper != neg:  # need |v| below |T|
                eq_ok = cm < 0 or (cm == 0 and not th.strict)
                u = th.xe if eq_ok else th.xe - 1
                hi = u if hi is None else min(hi, u)
            else:                 # need |v| above |T|
                eq_ok = cm > 0 or (cm == 0 and not th.strict)
                lw = th.xe if eq_ok else th.xe + 1
                lo = lw if lo is None else max(lo, lw)
        if md is not None and mk != "z":
            mod = self.mod
            assert mod is not None
            r, _j, s, tailz = md
            if mod.S < 0 or s > mod.S:
                return None
            r_all = r if (not tailz or s <= mod.K) else mod.shift(r, s - mod.K)
            n0 = mod.n0(r_all)
            if n0 is None:
                return None
            t = s - mod.K + n0
            lo = t if lo is None else max(lo, t)
        if lo is not None and hi is not None and lo > hi:
            return None
        return ("e", lo, hi)

    # -- acceptance --------------------------------------------------------
    def accepting(self, st: tuple) -> bool:
        """Does a literal that ends in state ``st`` satisfy the spec?"""
        ph = st[0]
        if ph in ("I", "F"):
            _, neg, cs, mk, _ms, md, _ = st
            if neg and mk == "z" and not self.spec.neg_zero:
                return False
            for th, c in zip(self.ths, cs):
                if not (th.on_int if ph == "I" else th.on_frac):
                    continue
                if c is None:
                    return False  # plain forms were ruled out
                v = c[1] if c[0] == "x" else th.signed(neg, _pc_res(c, th.xi, th.xf))
                if not th.ok(v):
                    return False
            return self._mod_plain_ok(md)
        if ph == "E":
            _, cmin, cmax, _ = st
            return ((cmin is None or _exp_cmp_result(cmin) >= 0)
                    and (cmax is None or _exp_cmp_result(cmax) <= 0))
        return False
