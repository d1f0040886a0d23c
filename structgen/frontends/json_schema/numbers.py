"""Exact grammar IR for JSON numbers under numeric constraints.

:func:`integer_expr` and :func:`number_expr` return IR (:mod:`structgen.grammar.ir`) for JSON
number literals (ASCII, no whitespace) whose *value* satisfies bounds, ``multipleOf``
and "is an integer". Constrained languages are built as explicit DFAs
(:class:`~structgen.grammar.ir.Dfa`): the automaton reads the literal digit by digit and keeps,
for each bound, the state of a digit-by-digit comparison against the bound's decimal
expansion, plus the remainder of the digits read so far modulo ``multipleOf``. Each
DFA is explored, trimmed and minimised (by :func:`structgen.grammar.fsa.explore_dfa`), so
it stays small (tens to hundreds of states).

Semantics, chosen so that the grammar never accepts an instance that ``jsonschema``
(which compares ``json.loads`` values: ``int`` for literals without ``.``/``e``,
``float`` otherwise) or exact decimal arithmetic rejects:

* Bounds are compared *both* exactly (a ``float`` bound stands for the decimal of its
  ``repr``, e.g. ``0.1`` means 1/10) *and* the way Python compares the parsed instance
  with the bound (an int literal against the bound's exact binary value; a float
  literal after rounding to the nearest double, so ``1e400`` is ``inf``). A literal is
  accepted when both agree it is in range; they differ only within half an ulp of a
  bound, e.g. for ``exclusiveMaximum: 0.1`` the literal ``0.09999999999999999999`` is
  rejected because Python rounds it to ``0.1``. (Float literals of 16+ significant
  digits that round to the last double inside a bound but lie beyond its ``repr`` are
  rejected too when the exact rounding midpoint has more than 24 significant digits: see
  ``_float_upper``.)
* ``multiple_of`` is exact decimal arithmetic (``0.3`` *is* a multiple of ``0.1``).
  ``jsonschema`` divides floats and can disagree when the divisor is not exactly
  representable in binary (it rejects ``0.3`` for ``multipleOf: 0.1``); the grammar
  follows the JSON Schema specification there. For an integral divisor, float literals
  are limited to ``|v| <= 2**53`` (so Python's float remainder is exact as well).
* ``-0``, ``-0.0`` and ``0e5`` have the value 0.

Exponent forms (``1.5e3``) are generated exactly for unconstrained numbers. Under a
non-zero bound the exponent form is restricted to a normalised mantissa (one non-zero
integer digit: ``1.5e3``, ``-7E-2``) or an all-zero mantissa; under ``multiple_of`` /
``integer_only`` additionally to mantissas with at most ``_EXP_MAX_FRACTION`` (17)
fraction digits beyond the divisor's decimal places and exponents that keep the value a
multiple without help from trailing zeros (``1.50e1`` is rejected, ``1.5e1`` accepted).
The general problem is not regular (comparing ``0.000…01e17`` with a bound needs an
unbounded counter); within the accepted shapes the check is exact, and every shape that
``json.dumps`` produces for a float is covered. Further narrowings, all documented
limits rather than semantics:

* ``integer_only`` (or a non-integral ``multiple_of``): float literals stay finite and
  small enough to keep the automaton small: ``|v| <= 1e16`` without an exponent,
  ``|v| <= 1e308`` with one (``1e400`` is ``inf``, which is not an integer).
* When the automaton would exceed :data:`MAX_DFA_STATES` (a large ``multiple_of`` with
  many-digit bounds), exponent forms are dropped, then (when every multiple is an
  integer) fraction forms; only if integer literals alone are still too large is
  :class:`~structgen.errors.CompileLimitError` raised.

All narrowings only remove literals: the grammar never accepts a value outside the
constraints.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from decimal import Decimal
from fractions import Fraction
from typing import TypeVar, Union

from structgen.errors import CompileLimitError
from structgen.frontends.json_schema.number_dfa import Bound, Mod, NumberDfa, Spec, terminating_digits
from structgen.grammar import fsa, ir

__all__ = ["integer_expr", "number_expr", "explore_dfa", "MAX_DFA_STATES", "Number"]

Number = Union[int, float, Decimal]

#: Largest DFA (after minimisation) this module builds before raising CompileLimitError.
MAX_DFA_STATES = 10_000
#: Under multiple_of/integer_only, exponent-form mantissas may have at most this many
#: fraction digits beyond the divisor's scale.
_EXP_MAX_FRACTION = 17
#: Budget (modulus x tracked fraction lengths) above which exponent forms are dropped
#: under multiple_of (the language is then narrowed to plain literals).
_EXP_MOD_BUDGET = 4096

#: A float bound's exact rounding midpoint is used as the threshold when it has at most
#: this many significant digits (else the bound double's repr; see ``_float_upper``).
_MID_DIGITS = 24
_MAX_FLOAT = Fraction(2) ** 1024 - Fraction(2) ** 971  # sys.float_info.max, exactly
_TWO_1024 = Fraction(2) ** 1024                          # the value standing in for inf
_TWO_53 = Fraction(2) ** 53
_FRAC_CAP = Fraction(10) ** 16   # |v| bound for plain float literals under integer_only
_EXP_CAP = Fraction(10) ** 308   # |v| bound for exponent literals (below float overflow)


# ---------------------------------------------------------------------------
# Bound values
# ---------------------------------------------------------------------------

def _check_number(x: object, what: str) -> None:
    if isinstance(x, bool) or not isinstance(x, (int, float, Decimal)):
        raise TypeError(f"{what} must be an int, float or Decimal, not {type(x).__name__}")
    if (isinstance(x, float) and not math.isfinite(x)) or (isinstance(x, Decimal) and not x.is_finite()):
        raise ValueError(f"{what} must be finite, got {x!r}")


def _decimal_value(x: Number) -> Fraction:
    """Exact value in decimal semantics: a float means the decimal of its repr."""
    if isinstance(x, float):
        return Fraction(Decimal(repr(x)))
    return Fraction(x)


def _python_value(x: Number) -> Fraction:
    """Exact value as Python compares it (a float is its binary value)."""
    return Fraction(x)


def _float_value(f: float) -> Fraction:
    if math.isinf(f):
        return _TWO_1024 if f > 0 else -_TWO_1024
    return Fraction(f)


def _is_even(f: float) -> bool:
    """Is the significand of ``f`` even (the round-half-even winner)? inf counts as even."""
    if math.isinf(f):
        return True
    return (struct.unpack("<Q", struct.pack("<d", f))[0] & 1) == 0


def _float_upper(bound: Fraction, strict: bool) -> tuple[Fraction, bool]:
    """A sufficient condition ``v <= T`` (``v < T`` when ``strict_T``) on an exact real v
    for ``float(v) <= bound`` (``<`` if strict); returns ``(T, strict_T)``.

    ``float`` is ``float(str)`` (so ``json.loads``): round to nearest, ties to even,
    overflow to inf. With ``f`` the largest double satisfying the bound, the exact
    condition is ``v`` below the midpoint between ``f`` and the next double; that
    midpoint is used when it has at most :data:`_MID_DIGITS` significant digits (always
    so for the integers of an int64-sized bound, where doubles are 2+ apart and the
    midpoint is an integer). Otherwise it can have up to ~770 significant digits (one
    automaton state per digit), so ``T`` is ``repr(f)`` instead: ``v <= repr(f)``
    implies ``float(v) <= f`` because ``repr`` round-trips and rounding is monotone.
    Only literals between ``repr(f)`` and that midpoint are then given up; they round
    to ``f`` and have at least 16 significant digits.
    """
    if bound > _MAX_FLOAT:
        f = float(_MAX_FLOAT)
    elif bound < -_MAX_FLOAT:
        f = -math.inf
    else:
        f = float(bound)
    while not (f == -math.inf) and (_float_value(f) > bound or (strict and _float_value(f) == bound)):
        f = math.nextafter(f, -math.inf)
    if f == 0.0:
        f = 0.0  # drop a negative zero
    if math.isinf(f):  # only values rounding to -inf qualify: exact threshold
        nxt = math.nextafter(f, math.inf)
        mid = (_float_value(f) + _float_value(nxt)) / 2
        return mid, not _is_even(f)
    nxt = math.nextafter(f, math.inf)
    if not math.isinf(nxt):
        mid = (_float_value(f) + _float_value(nxt)) / 2
        ip, frac = terminating_digits(abs(mid))
        if len((ip + frac).strip("0")) <= _MID_DIGITS:
            # a tie rounds to the even neighbour: to f (mid inclusive) when f is even
            return mid, not _is_even(f)
    return Fraction(Decimal(repr(f))), False


def _tighter_upper(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> tuple[Fraction, bool]:
    if a[0] != b[0]:
        return a if a[0] < b[0] else b
    return (a[0], a[1] or b[1])


def _tighter_lower(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> tuple[Fraction, bool]:
    if a[0] != b[0]:
        return a if a[0] > b[0] else b
    return (a[0], a[1] or b[1])


def _int_upper(x: Fraction, strict: bool) -> Fraction:
    return Fraction(math.ceil(x) - 1 if strict else math.floor(x))


def _int_lower(x: Fraction, strict: bool) -> Fraction:
    return Fraction(math.floor(x) + 1 if strict else math.ceil(x))


# ---------------------------------------------------------------------------
# Building DFAs (the algorithms live in structgen.grammar.fsa)
# ---------------------------------------------------------------------------

_S = TypeVar("_S", bound=Hashable)  # a state of an implicitly given automaton
_LIMIT_HINT = "simplify the numeric constraints (smaller multipleOf or bounds)"


def explore_dfa(start: _S, step: Callable[[_S, int], _S | None],
                accepting: Callable[[_S], bool],
                alphabet: bytes | Sequence[bytes] | Callable[[_S], Sequence[bytes]],
                what: str) -> ir.Expr:
    """:func:`structgen.grammar.fsa.explore_dfa` under this module's limit: at most
    :data:`MAX_DFA_STATES` states after minimisation (twice that while exploring), else
    :class:`~structgen.errors.CompileLimitError` naming ``what``."""
    return fsa.explore_dfa(start, step, accepting, alphabet, what, max_states=MAX_DFA_STATES,
                           hint=_LIMIT_HINT)


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------

def _digits_expr() -> ir.Expr:
    return ir.byte_range(0x30, 0x39)


def _int_part() -> ir.Expr:
    return ir.alt(ir.lit("0"), ir.seq(ir.byte_range(0x31, 0x39), ir.star(_digits_expr())))


def _plain_number(allow_frac: bool, allow_exp: bool, max_frac: int | None,
                  max_exp: int | None) -> ir.Expr:
    parts = [ir.opt(ir.lit("-")), _int_part()]
    if allow_frac:
        parts.append(ir.opt(ir.seq(ir.lit("."), ir.rep(_digits_expr(), 1, max_frac))))
    if allow_exp:
        parts.append(ir.opt(ir.seq(ir.byteset([0x45, 0x65]), ir.opt(ir.byteset([0x2B, 0x2D])),
                                   ir.rep(_digits_expr(), 1, max_exp))))
    return ir.seq(*parts)


def _fmt(x: Fraction) -> str:
    ip, fp = terminating_digits(abs(x))
    return ("-" if x < 0 else "") + (ip or "0") + ("." + fp if fp else "")


def _make_mod(m: Fraction | None, integer_only: bool, allow_exp: bool) -> Mod | None:
    if m is None and not integer_only:
        return None
    if m is not None and m <= 0:
        raise ValueError(f"multiple_of must be positive, got {m}")
    eff = m if m is not None else Fraction(1)
    if integer_only:
        eff = Fraction(math.lcm(eff.numerator, 1), math.gcd(eff.denominator, 1))
    p, q = eff.numerator, eff.denominator
    a = b = 0
    qq = q
    while qq % 2 == 0:
        qq //= 2
        a += 1
    while qq % 5 == 0:
        qq //= 5
        b += 1
    if qq != 1:  # pragma: no cover - decimal inputs always terminate
        raise ValueError(f"multiple_of {eff} is not a terminating decimal")
    K = max(a, b)
    M = p * (10 ** K // q)
    if M > 10 * MAX_DFA_STATES:
        raise CompileLimitError(
            f"multipleOf {_fmt(eff)} needs a remainder automaton of about {M} states "
            f"(limit {MAX_DFA_STATES})")
    mm, ca, cb = M, 0, 0
    while mm % 2 == 0:
        mm //= 2
        ca += 1
    while mm % 5 == 0:
        mm //= 5
        cb += 1
    S = K + _EXP_MAX_FRACTION
    if not allow_exp or M * (S + 2) > _EXP_MOD_BUDGET:
        S = -1
    canon = _residue_classes(M, 2 ** ca * 5 ** cb, max(ca, cb))
    classes = len(set(canon))
    if classes > MAX_DFA_STATES - 16:
        raise CompileLimitError(
            f"multipleOf {_fmt(eff)} needs a remainder automaton of {classes} states "
            f"(limit {MAX_DFA_STATES})")
    return Mod(M, K, S, max(ca, cb), canon)


def _residue_classes(M: int, P: int, c: int) -> tuple[int, ...]:
    """Canonical representatives of residues mod ``M = P * Q`` (``P = 2**a * 5**b``,
    ``Q`` coprime to 10, ``10**c`` divisible by ``P``).

    After ``c`` more digits the residue mod ``P`` is forgotten (``10**c = 0 mod P``), so
    two residues mod ``P`` behave alike iff the same suffixes of length ``< c`` complete
    them to a multiple of ``P``; for length ``l`` that is decided by ``-x * 10**l mod P``.
    The part mod ``Q`` is kept exactly (recombined by the Chinese remainder theorem).
    """
    Q = M // P
    rep_of_sig: dict[tuple[int, ...], int] = {}
    rep = [0] * P
    for x in range(P):
        sig = []
        for ell in range(c):
            p10 = 10 ** ell
            w0 = (-x * p10) % P
            sig.append(w0 if (p10 >= P or w0 < p10) else -1)
        rep[x] = rep_of_sig.setdefault(tuple(sig), x)
    if Q == 1:
        return tuple(rep)
    inv_p = pow(P, -1, Q)
    out = []
    for r in range(M):
        a, b = rep[r % P], r % Q
        out.append(a + P * (((b - a) * inv_p) % Q))
    return tuple(out)


_UNBOUNDED: dict[Spec, ir.Expr] = {}  # number_expr without bounds or multipleOf


@functools.lru_cache(maxsize=512)
def _build(spec: Spec, what: str) -> ir.Expr:
    if not spec.ths and spec.mod is None and spec.max_mant is None and spec.neg_zero:
        return _plain_number(spec.allow_frac, spec.allow_exp, spec.max_frac, spec.max_exp)
    # Too large? Narrow to fewer literal shapes rather than fail: first without exponent
    # forms, then (when every multiple is an integer anyway) int literals only.
    attempts = [spec]
    if spec.allow_exp:
        attempts.append(replace(spec, allow_exp=False))
    if spec.mod is not None and spec.mod.K == 0 and spec.allow_frac:
        attempts.append(replace(spec, allow_exp=False, allow_frac=False))
    for i, sp in enumerate(attempts):
        machine = NumberDfa(sp)
        try:
            return explore_dfa(("S",), machine.step, machine.accepting, machine.byte_classes, what)
        except CompileLimitError:
            if i == len(attempts) - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


Cap = tuple[Fraction, bool]
# integer bounds below this are written as digit ranges (a few nodes per digit, but unrolled
# into an automaton they grow with the square of the digits); larger ones go through the
# explored automaton and its state limit
_RANGE_DIGITS_MAX = Fraction(10) ** 300


def _int_bounds(minimum: Number | None, maximum: Number | None, excl_min: bool, excl_max: bool
                ) -> tuple[Fraction | None, Fraction | None]:
    """The least and greatest integer inside the bounds (None: unbounded on that side). A
    bound is read both as its exact decimal and as the ``float`` Python compares with; the
    tighter wins."""
    lo = hi = None
    if minimum is not None:
        lo = max(_int_lower(_decimal_value(minimum), excl_min),
                 _int_lower(_python_value(minimum), excl_min))
    if maximum is not None:
        hi = min(_int_upper(_decimal_value(maximum), excl_max),
                 _int_upper(_python_value(maximum), excl_max))
    return lo, hi


def _same_length_range(lo: str, hi: str) -> ir.Expr:
    """Digit strings of ``len(lo)`` between ``lo`` and ``hi`` (equal lengths, ``lo <= hi``),
    written digit by digit: a shared first digit, or the first digit's edge cases around a
    block of free digits."""
    if not lo:
        return ir.EMPTY
    rest = len(lo) - 1
    if lo[0] == hi[0]:
        return ir.seq(ir.lit(lo[0]), _same_length_range(lo[1:], hi[1:]))
    low_full, high_full = lo[1:] == "0" * rest, hi[1:] == "9" * rest
    first = ord(lo[0]) + (0 if low_full else 1)
    last = ord(hi[0]) - (0 if high_full else 1)
    parts = []
    if not low_full:
        parts.append(ir.seq(ir.lit(lo[0]), _same_length_range(lo[1:], "9" * rest)))
    if first <= last:
        parts.append(ir.seq(ir.byte_range(first, last), ir.rep(_digits_expr(), rest, rest)))
    if not high_full:
        parts.append(ir.seq(ir.lit(hi[0]), _same_length_range("0" * rest, hi[1:])))
    return ir.alt(*parts)


def _positive_range(lo: int, hi: int | None) -> ir.Expr:
    """Canonical literals (no sign, no leading zero) of the integers ``lo..hi``, ``1 <= lo``;
    ``hi`` None: no upper end. Consecutive widths that are whole (every literal of that many
    digits) share one ``[1-9][0-9]{m,n}``."""
    if hi is not None and hi < lo:
        return ir.NEVER
    top = len(str(hi)) if hi is not None else len(str(lo))
    parts: list[ir.Expr] = []
    whole_from: int | None = None  # first width of the current run of whole widths

    def close_run(last: int | None) -> None:
        if whole_from is not None:
            parts.append(ir.seq(ir.byte_range(0x31, 0x39),
                                ir.rep(_digits_expr(), whole_from - 1, None if last is None else last - 1)))

    for width in range(len(str(lo)), top + 1):
        a = max(lo, 10 ** (width - 1))
        b = 10 ** width - 1 if hi is None else min(hi, 10 ** width - 1)
        if a == 10 ** (width - 1) and b == 10 ** width - 1:
            whole_from = width if whole_from is None else whole_from
            continue
        close_run(width - 1)
        whole_from = None
        parts.append(_same_length_range(str(a), str(b)))
    if hi is None:
        whole_from = top + 1 if whole_from is None else whole_from
        close_run(None)
    else:
        close_run(top)
    return ir.alt(*parts)


def _integer_range(lo: int | None, hi: int | None, negative_zero: bool) -> ir.Expr:
    """JSON integer literals with value in ``lo..hi`` (None: unbounded), built as a digit
    range expression straight from the bounds' digits, with no automaton to explore."""
    if lo is not None and hi is not None and lo > hi:
        return ir.NEVER
    zero = (lo is None or lo <= 0) and (hi is None or hi >= 0)
    parts = []
    if zero:
        parts.append(ir.lit("0"))
        if negative_zero:
            parts.append(ir.lit("-0"))
    if hi is None or hi >= 1:
        parts.append(_positive_range(max(1, lo if lo is not None else 1), hi))
    if lo is None or lo <= -1:
        neg_hi = None if lo is None else -lo
        parts.append(ir.seq(ir.lit("-"), _positive_range(max(1, -hi if hi is not None else 1), neg_hi)))
    return ir.alt(*parts)


def _thresholds(minimum: Number | None, maximum: Number | None, excl_min: bool, excl_max: bool,
                *, floats: bool, frac_cap: Cap | None = None, exp_cap: Cap | None = None
                ) -> tuple[Bound, ...]:
    """The comparison thresholds for int literals and (with ``floats``) float literals.

    A float literal's bound is the tighter of the exact decimal bound and the bound
    that Python's comparison of the parsed ``float`` implies; ``frac_cap``/``exp_cap``
    (value, strict) additionally bound ``|v|`` for plain float / exponent literals.
    """
    out: list[Bound] = []
    lo_i, hi_i = _int_bounds(minimum, maximum, excl_min, excl_max)
    lo_f: Cap | None = None
    hi_f: Cap | None = None
    if minimum is not None:
        dec, py = _decimal_value(minimum), _python_value(minimum)
        t, tstrict = _float_upper(-py, excl_min)
        lo_f = _tighter_lower((dec, excl_min), (-t, tstrict))
    if maximum is not None:
        dec, py = _decimal_value(maximum), _python_value(maximum)
        hi_f = _tighter_upper((dec, excl_max), _float_upper(py, excl_max))
    if lo_i is not None:
        out.append(Bound.make(lo_i, on_int=True, on_frac=False, on_exp=False, upper=False,
                            strict=False))
    if hi_i is not None:
        out.append(Bound.make(hi_i, on_int=True, on_frac=False, on_exp=False, upper=True,
                            strict=False))
    if not floats:
        return tuple(out)

    def capped(b: Cap | None, cap: Cap | None, upper: bool) -> Cap | None:
        if cap is None:
            return b
        c = (cap[0], cap[1]) if upper else (-cap[0], cap[1])
        if b is None:
            return c
        return _tighter_upper(b, c) if upper else _tighter_lower(b, c)

    for b, upper in ((lo_f, False), (hi_f, True)):
        bf = capped(b, frac_cap, upper)
        be = capped(b, exp_cap, upper)
        if bf is not None and bf == be:
            out.append(Bound.make(bf[0], on_int=False, on_frac=True, on_exp=True, upper=upper,
                                strict=bf[1]))
            continue
        if bf is not None:
            out.append(Bound.make(bf[0], on_int=False, on_frac=True, on_exp=False, upper=upper,
                                strict=bf[1]))
        if be is not None:
            out.append(Bound.make(be[0], on_int=False, on_frac=False, on_exp=True, upper=upper,
                                strict=be[1]))
    return tuple(out)


def integer_expr(minimum: Number | None = None, maximum: Number | None = None, *,
                 exclusive_minimum: bool = False, exclusive_maximum: bool = False,
                 multiple_of: Number | None = None, max_digits: int | None = None,
                 negative_zero: bool = True) -> ir.Expr:
    """JSON integer literals ``-?(0|[1-9][0-9]*)`` whose value ``v`` is in range.

    Exact: accepts exactly the literals with ``minimum <= v <= maximum`` (``<`` where
    exclusive; either side may be None; bounds may be huge), at most ``max_digits`` digits
    (None: any number) and ``v`` a multiple of ``multiple_of``. ``-0`` is accepted when 0
    is (it is valid JSON and parses to 0), unless ``negative_zero`` is false.
    Non-integral bounds mean the nearest integers inside them (a float bound is checked
    both as its ``repr`` decimal and as its exact binary value); a non-integral
    ``multiple_of`` means the least integral multiple of it (``1.5`` -> 3).

    Returns :data:`~structgen.grammar.ir.NEVER` for an empty range. Raises ``ValueError`` for
    a non-positive ``multiple_of`` or non-finite numbers, and
    :class:`~structgen.errors.CompileLimitError` when the automaton would exceed
    :data:`MAX_DFA_STATES` states (e.g. ``multiple_of`` above ~10**4, or a large
    ``multiple_of`` combined with many-digit bounds).
    """
    for name, x in (("minimum", minimum), ("maximum", maximum), ("multiple_of", multiple_of)):
        if x is not None:
            _check_number(x, name)
    m = _decimal_value(multiple_of) if multiple_of is not None else None
    mod = _make_mod(m, True, False) if m is not None else None
    if mod is not None and mod.M == 1 and mod.K == 0:
        mod = None
    cap = Fraction(10 ** max_digits - 1) if max_digits is not None else None
    if mod is None:
        lo, hi = _int_bounds(minimum, maximum, exclusive_minimum, exclusive_maximum)
        if cap is not None:
            lo = -cap if lo is None else max(lo, -cap)
            hi = cap if hi is None else min(hi, cap)
        if all(b is None or abs(b) < _RANGE_DIGITS_MAX for b in (lo, hi)):
            return _integer_range(None if lo is None else int(lo), None if hi is None else int(hi),
                                  negative_zero)
    ths = _thresholds(minimum, maximum, exclusive_minimum, exclusive_maximum, floats=False)
    if cap is not None:
        ths += tuple(Bound.make(c, on_int=True, on_frac=False, on_exp=False, upper=c > 0,
                                 strict=False) for c in (-cap, cap))
    spec = Spec(ths, mod, False, False, None, None, None, negative_zero)
    return _build(spec, "integer")


def number_expr(minimum: Number | None = None, maximum: Number | None = None, *,
                exclusive_minimum: bool = False, exclusive_maximum: bool = False,
                multiple_of: Number | None = None, integer_only: bool = False,
                max_fraction_digits: int | None = None, max_exponent_digits: int | None = None,
                max_mantissa_digits: int | None = None, negative_zero: bool = True) -> ir.Expr:
    """JSON number literals ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?`` in range.

    Without constraints this is the full JSON number grammar (fraction and exponent
    digit counts optionally bounded by ``max_fraction_digits`` / ``max_exponent_digits``;
    None means unbounded; ``max_mantissa_digits`` bounds the digits before and after the
    point together, a lone ``0`` before it not counted, and replaces ``max_fraction_digits``;
    ``negative_zero`` false rejects ``-0``, ``-0.0e1``...). With ``minimum``/``maximum``
    (exclusive when the flags say so), ``multiple_of`` or ``integer_only`` (value has no
    fractional part, so ``1.0`` and ``1e2`` count, as JSON Schema's ``integer`` type
    does) the result never accepts
    a literal outside the constraints; it accepts every such literal without an
    exponent, and exponent forms as described in the module docstring.

    Returns :data:`~structgen.grammar.ir.NEVER` when nothing satisfies the constraints. Raises
    ``ValueError`` (non-positive ``multiple_of``, non-finite numbers, negative digit
    limits) and :class:`~structgen.errors.CompileLimitError` (automaton too large).
    """
    for name, x in (("minimum", minimum), ("maximum", maximum), ("multiple_of", multiple_of)):
        if x is not None:
            _check_number(x, name)
    for name, lim in (("max_fraction_digits", max_fraction_digits),
                      ("max_exponent_digits", max_exponent_digits),
                      ("max_mantissa_digits", max_mantissa_digits)):
        if lim is not None and lim < 1:
            raise ValueError(f"{name} must be >= 1, got {lim}")
    m = _decimal_value(multiple_of) if multiple_of is not None else None
    mod = _make_mod(m, integer_only, True)
    frac_cap = exp_cap = None
    if mod is not None:
        if m is not None and m.denominator == 1:
            # an integral divisor: float literals small enough for an exact float remainder
            frac_cap = exp_cap = (_TWO_53, False)
        else:
            # never overflow to inf (inf is not an integer); plain float literals are
            # kept below 1e16 (where Python's repr switches to exponents) to keep the
            # automaton small
            frac_cap, exp_cap = (_FRAC_CAP, False), (_EXP_CAP, False)
    ths = _thresholds(minimum, maximum, exclusive_minimum, exclusive_maximum, floats=True,
                      frac_cap=frac_cap, exp_cap=exp_cap)
    spec = Spec(ths, mod, True, True, max_fraction_digits, max_exponent_digits,
                 max_mantissa_digits, negative_zero)
    if minimum is None and maximum is None and multiple_of is None:
        # no bounds: one fixed language per (integer_only, digit limits), a library constant
        # like the Unicode tables (JSON Schema's "integer" alone is one), kept for the process
        got = _UNBOUNDED.get(spec)
        if got is None:
            got = _UNBOUNDED.setdefault(spec, _build.__wrapped__(spec, "number"))
        return got
    return _build(spec, "number")
