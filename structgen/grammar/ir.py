"""The grammar IR every front-end lowers to (JSON Schema, Pydantic, Lark, regex).

A :class:`Grammar` is a set of named rules; each rule's right-hand side is a regular
expression over *bytes* and rule references (:class:`Ref`). That is a recursive
transition network: the automaton layer inlines every non-recursive reference, so
only genuinely recursive rules survive as calls, and compiles each remaining rule to
a byte-level DFA.

Nodes are immutable and hashable (structural equality, cached hash). Build them with
the smart constructors (:func:`seq`, :func:`alt`, :func:`rep`, :func:`lit`,
:func:`byteset`, ...), which flatten and simplify.

``And`` and ``Diff`` (intersection and difference) are allowed only over *regular*
sub-expressions: after inlining they must not contain a reference to a recursive rule,
otherwise compilation raises :class:`~structgen.errors.GrammarError`.

:func:`reference_accepts` is a deliberately naive, independent interpreter of the IR
(a memoised set-of-end-positions matcher). It is an oracle for tests, not a fast path.
"""

from __future__ import annotations

import builtins
import hashlib
from collections.abc import Iterable, Mapping
from typing import Protocol, Union

from structgen.errors import GrammarError

__all__ = [
    "Expr", "ByteSet", "Seq", "Alt", "Repeat", "Ref", "And", "Diff", "Dfa",
    "EMPTY", "NEVER", "Grammar",
    "byteset", "byte_range", "lit", "seq", "alt", "rep", "opt", "star", "plus", "ref",
    "and_", "diff", "reference_accepts", "ANY_BYTE",
]


class Expr:
    """Base of IR expressions. Immutable; structural equality. The hash, the referenced rule
    names and the rough NFA size (:func:`structgen.grammar.passes.expr_size`) are set when a
    node is made, from its children's (the hash of a :class:`Dfa` on first use)."""

    __slots__ = ("_hash", "_fp", "_rf", "_sz")
    # cached on first use (see __hash__, fingerprint, refs); unset until then
    _hash: int
    _fp: bytes
    _rf: frozenset[str]
    _sz: int

    def _key(self) -> tuple[object, ...]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _derive(self, key: tuple[object, ...], children: tuple[Expr, ...], size: int) -> None:
        """Set the hash (from ``key``, whose nodes have theirs), the referenced rules (those
        of ``children``) and the rough size of a node being made."""
        object.__setattr__(self, "_hash", hash((type(self).__name__, key)))
        object.__setattr__(self, "_rf", _refs_of(children))
        object.__setattr__(self, "_sz", size)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(self) is not type(other):
            return False
        assert isinstance(other, Expr)
        return hash(self) == hash(other) and self._key() == other._key()

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            pass
        # children first, without recursion (a deep expression must not overflow the stack)
        for x in self._post_order("_hash"):
            object.__setattr__(x, "_hash", hash((type(x).__name__, x._key())))
        return self._hash

    def _post_order(self, attr: str) -> list[Expr]:
        """The nodes below (and including) this one that lack the cached attribute ``attr``,
        children before parents, each once: computed iteratively."""
        out: list[Expr] = []
        seen: set[int] = set()
        stack: list[tuple[Expr, bool]] = [(self, False)]
        while stack:
            x, done = stack.pop()
            if done:
                out.append(x)
                continue
            if id(x) in seen or hasattr(x, attr):
                continue
            seen.add(id(x))
            stack.append((x, True))
            stack.extend((k, False) for k in x._children() if not hasattr(k, attr))
        return out

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("IR nodes are immutable")

    def _args(self) -> tuple[object, ...]:
        return self._key()

    def fingerprint(self) -> bytes:
        """SHA-256 of the node's full structure (cached); stable across processes."""
        try:
            return self._fp
        except AttributeError:
            pass
        for x in self._post_order("_fp"):  # children first: each _feed below reads cached ones
            h = hashlib.sha256(type(x).__name__.encode())
            if isinstance(x, (ByteSet, Dfa)):
                h.update(repr(x._key()).encode())  # plain integers: one repr, not a walk
            else:
                _feed(h, x._key())
            object.__setattr__(x, "_fp", h.digest())
        return self._fp

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), self._args())

    def refs(self) -> frozenset[str]:
        """Names of the rules referenced anywhere inside."""
        return self._rf

    def _children(self) -> tuple[Expr, ...]:
        return ()


_NO_REFS: frozenset[str] = frozenset()


def _refs_of(children: tuple[Expr, ...]) -> frozenset[str]:
    """The rules referenced below ``children`` (each knows its own since it was made)."""
    out = _NO_REFS
    for k in children:
        rf = k._rf
        if rf and rf is not out:
            out = rf if not out else out | rf
    return out


class ByteSet(Expr):
    """Exactly one byte out of ``ranges`` (sorted, disjoint, inclusive ``(lo, hi)`` pairs)."""

    __slots__ = ("ranges",)
    ranges: tuple[tuple[int, int], ...]
    _rf: frozenset[str] = frozenset()  # a leaf: no references (shadows the slot)

    def __init__(self, ranges: tuple[tuple[int, int], ...]) -> None:
        object.__setattr__(self, "ranges", ranges)
        object.__setattr__(self, "_hash", hash((type(self).__name__, ranges)))
        object.__setattr__(self, "_sz", 1)

    def _key(self) -> tuple[object, ...]:
        return self.ranges

    def _args(self) -> tuple[object, ...]:
        return (self.ranges,)

    def contains(self, b: int) -> bool:
        """Is byte ``b`` in the set?"""
        return any(lo <= b <= hi for lo, hi in self.ranges)

    def __repr__(self) -> str:
        def one(lo: int, hi: int) -> str:
            return f"{lo:02x}" if lo == hi else f"{lo:02x}-{hi:02x}"
        return "[" + " ".join(one(lo, hi) for lo, hi in self.ranges) + "]"


class Seq(Expr):
    """Concatenation. ``Seq(())`` is the empty string (:data:`EMPTY`)."""

    __slots__ = ("items",)
    items: tuple[Expr, ...]

    def __init__(self, items: tuple[Expr, ...]) -> None:
        object.__setattr__(self, "items", items)
        self._derive(items, items, 1 + sum(k._sz for k in items))

    def _key(self) -> tuple[object, ...]:
        return self.items

    def _children(self) -> tuple[Expr, ...]:
        return self.items

    def _args(self) -> tuple[object, ...]:
        return (self.items,)

    def __repr__(self) -> str:
        return "Seq(" + ", ".join(map(repr, self.items)) + ")"


class Alt(Expr):
    """Alternation. ``Alt(())`` is the empty language (:data:`NEVER`)."""

    __slots__ = ("items",)
    items: tuple[Expr, ...]

    def __init__(self, items: tuple[Expr, ...]) -> None:
        object.__setattr__(self, "items", items)
        self._derive(items, items, 1 + sum(k._sz for k in items))

    def _key(self) -> tuple[object, ...]:
        return self.items

    def _children(self) -> tuple[Expr, ...]:
        return self.items

    def _args(self) -> tuple[object, ...]:
        return (self.items,)

    def __repr__(self) -> str:
        return "Alt(" + " | ".join(map(repr, self.items)) + ")"


class Repeat(Expr):
    """``item{min,max}``; ``max is None`` means unbounded."""

    __slots__ = ("item", "min", "max")
    item: Expr
    min: int
    max: int | None

    def __init__(self, item: Expr, min: int, max: int | None) -> None:
        object.__setattr__(self, "item", item)
        object.__setattr__(self, "min", min)
        object.__setattr__(self, "max", max)
        reps = max if max is not None else min  # (the parameters shadow the builtins)
        self._derive((item, min, max), (item,),
                     1 + item._sz * (1 if reps < 1 else reps if reps < 10_000 else 10_000))

    def _key(self) -> tuple[object, ...]:
        return (self.item, self.min, self.max)

    def _children(self) -> tuple[Expr, ...]:
        return (self.item,)

    def __repr__(self) -> str:
        return f"Repeat({self.item!r}, {self.min}, {self.max})"


class Ref(Expr):
    """A reference to the rule called ``name``."""

    __slots__ = ("name",)
    name: str

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_hash", hash((type(self).__name__, (name,))))
        object.__setattr__(self, "_rf", frozenset((name,)))
        object.__setattr__(self, "_sz", 1)

    def _key(self) -> tuple[object, ...]:
        return (self.name,)

    def __repr__(self) -> str:
        return f"<{self.name}>"


class And(Expr):
    """Intersection of two regular languages."""

    __slots__ = ("left", "right")
    left: Expr
    right: Expr

    def __init__(self, left: Expr, right: Expr) -> None:
        object.__setattr__(self, "left", left)
        object.__setattr__(self, "right", right)
        self._derive((left, right), (left, right), 1 + left._sz * right._sz)

    def _key(self) -> tuple[object, ...]:
        return (self.left, self.right)

    def _children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    def __repr__(self) -> str:
        return f"And({self.left!r}, {self.right!r})"


class Diff(Expr):
    """``left`` minus ``right`` (both regular)."""

    __slots__ = ("left", "right")
    left: Expr
    right: Expr

    def __init__(self, left: Expr, right: Expr) -> None:
        object.__setattr__(self, "left", left)
        object.__setattr__(self, "right", right)
        self._derive((left, right), (left, right), 1 + left._sz * right._sz)

    def _key(self) -> tuple[object, ...]:
        return (self.left, self.right)

    def _children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    def __repr__(self) -> str:
        return f"Diff({self.left!r}, {self.right!r})"


class Dfa(Expr):
    """An explicit byte-level DFA, embedded as a regular sub-expression.

    ``trans[q]`` is a tuple of ``(lo, hi, target)`` edges (inclusive byte ranges,
    disjoint within a state); ``start`` the start state; ``accept`` the accepting
    states. Useful for languages that are easy as automata and awkward as regular
    expressions (divisibility for ``multipleOf``, numeric bounds, counters).
    """

    __slots__ = ("start", "accept", "trans")
    _rf: frozenset[str] = frozenset()  # no references (shadows the slot)
    start: int
    accept: frozenset[int]
    trans: tuple[tuple[tuple[int, int, int], ...], ...]

    def __init__(self, start: int, accept: Iterable[int],
                 trans: Iterable[Iterable[tuple[int, int, int]]]) -> None:
        t = tuple(tuple(sorted((int(lo), int(hi), int(q)) for lo, hi, q in edges)) for edges in trans)
        n = len(t)
        for edges in t:
            for lo, hi, q in edges:
                if not (0 <= lo <= hi <= 255) or not (0 <= q < n):
                    raise GrammarError(f"invalid DFA edge ({lo}, {hi}, {q})")
        acc = frozenset(int(q) for q in accept)
        if not (0 <= start < n) or any(not (0 <= q < n) for q in acc):
            raise GrammarError("invalid DFA start or accepting state")
        object.__setattr__(self, "start", int(start))
        object.__setattr__(self, "accept", acc)
        object.__setattr__(self, "trans", t)
        object.__setattr__(self, "_sz", n)

    @classmethod
    def canonical(cls, start: int, accept: Iterable[int],
                  trans: Iterable[Iterable[tuple[int, int, int]]]) -> Dfa:
        """The node whose ``trans`` rows are already as the constructor would make them (int
        edges within range, sorted): without its checks, for the automata the grammar package
        builds itself."""
        self = cls.__new__(cls)
        t = tuple(map(tuple, trans))
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "accept", frozenset(accept))
        object.__setattr__(self, "trans", t)
        object.__setattr__(self, "_sz", len(t))
        return self

    def _key(self) -> tuple[object, ...]:
        return (self.start, tuple(sorted(self.accept)), self.trans)

    def step(self, q: int, b: int) -> int:
        """The state after byte ``b`` from state ``q`` (-1: no transition)."""
        for lo, hi, t in self.trans[q]:
            if lo <= b <= hi:
                return t
        return -1

    def __repr__(self) -> str:
        return f"Dfa({len(self.trans)} states)"


class _Hasher(Protocol):
    """What :func:`_feed` needs of a :mod:`hashlib` hash object."""

    def update(self, data: bytes, /) -> None: ...


def _feed(h: _Hasher, part: object) -> None:
    if isinstance(part, Expr):
        h.update(b"E" + part.fingerprint())
    elif isinstance(part, (tuple, frozenset)):
        items = sorted(part) if isinstance(part, frozenset) else part
        h.update(b"(%d" % len(items))
        for x in items:
            _feed(h, x)
        h.update(b")")
    else:
        h.update(b"V" + repr(part).encode() + b";")


EMPTY: Expr = Seq(())
NEVER: Expr = Alt(())


def _norm_ranges(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    rs = sorted((int(lo), int(hi)) for lo, hi in ranges if lo <= hi)
    out: list[tuple[int, int]] = []
    for lo, hi in rs:
        if not (0 <= lo <= 255 and 0 <= hi <= 255):
            raise ValueError(f"byte range out of bounds: {lo}-{hi}")
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def byteset(ranges: Iterable[tuple[int, int]] | Iterable[int]) -> Expr:
    """One byte from a set, given as ``(lo, hi)`` pairs or as individual byte values."""
    items = list(ranges)
    pairs = [(x, x) if isinstance(x, int) else x for x in items]
    norm = _norm_ranges(pairs)  # type: ignore[arg-type]
    return ByteSet(norm) if norm else NEVER


def byte_range(lo: int, hi: int) -> Expr:
    """One byte from ``lo`` to ``hi`` inclusive."""
    return byteset([(lo, hi)])


ANY_BYTE: Expr = ByteSet(((0, 255),))


def lit(data: bytes | str) -> Expr:
    """The literal byte string (``str`` is UTF-8 encoded)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return seq(*(ByteSet(((b, b),)) for b in data))


def seq(*items: Expr) -> Expr:
    """The concatenation of ``items``, flattened (a NEVER item makes it NEVER)."""
    out: list[Expr] = []
    for it in items:
        if isinstance(it, Seq):
            out.extend(it.items)
        elif isinstance(it, Alt) and not it.items:  # NEVER (compared without __eq__)
            return NEVER
        else:
            out.append(it)
    if len(out) == 1:
        return out[0]
    return Seq(tuple(out))


def alt(*items: Expr) -> Expr:
    """The alternation of ``items``, flattened and deduplicated, single-byte
    alternatives merged into one byte set."""
    out: list[Expr] = []
    seen: set[Expr] = set()
    for it in items:
        subs = it.items if isinstance(it, Alt) else (it,)
        for s in subs:
            if s not in seen:
                seen.add(s)
                out.append(s)
    # merge single-byte alternatives into one ByteSet
    bytesets = [s for s in out if isinstance(s, ByteSet)]
    if len(bytesets) > 1:
        merged = byteset(r for b in bytesets for r in b.ranges)
        first = out.index(bytesets[0])
        out = [s for s in out if not isinstance(s, ByteSet)]
        out.insert(min(first, len(out)), merged)
    if len(out) == 1:
        return out[0]
    return Alt(tuple(out))


# Counts at or above this never occur in text that exists (2**62 bytes is 4 EiB): a bound this
# large is clamped to it, which keeps the language on every representable input and keeps the
# counters inside int64 (a schema may say ``maxLength: 2**64``).
MAX_COUNT = 2**62


def rep(item: Expr, min: int = 0, max: int | None = None) -> Expr:
    """``item`` repeated ``min`` to ``max`` times (``max`` None: unbounded). Bounds of
    :data:`MAX_COUNT` or more are clamped (``max`` becomes unbounded)."""
    if min < 0 or (max is not None and max < min):
        raise GrammarError(f"invalid repetition bounds {{{min},{max}}}")
    if max is not None and max >= MAX_COUNT:
        max = None
    min = builtins.min(min, MAX_COUNT)
    if max == 0 or item == EMPTY:
        return EMPTY
    if item == NEVER:
        return EMPTY if min == 0 else NEVER
    if min == 1 and max == 1:
        return item
    return Repeat(item, min, max)


def opt(item: Expr) -> Expr:
    """``item`` or nothing."""
    return rep(item, 0, 1)


def star(item: Expr) -> Expr:
    """``item`` repeated zero or more times."""
    return rep(item, 0, None)


def plus(item: Expr) -> Expr:
    """``item`` repeated one or more times."""
    return rep(item, 1, None)


def ref(name: str) -> Expr:
    """A reference to the rule ``name``."""
    return Ref(name)


def and_(left: Expr, right: Expr) -> Expr:
    """The intersection of the two languages."""
    if left == NEVER or right == NEVER:
        return NEVER
    if left == right:
        return left
    return And(left, right)


def diff(left: Expr, right: Expr) -> Expr:
    """``left``'s language minus ``right``'s."""
    if left == NEVER:
        return NEVER
    if right == NEVER:
        return left
    return Diff(left, right)


class Grammar:
    """Named rules plus a start rule. Immutable once built.

    ``rules`` maps rule name -> Expr. Every :class:`Ref` must name a rule.
    """

    __slots__ = ("rules", "start", "_hash")
    rules: dict[str, Expr]
    start: str
    _hash: int  # cached on first use

    def __init__(self, rules: Mapping[str, Expr], start: str) -> None:
        object.__setattr__(self, "rules", dict(rules))
        object.__setattr__(self, "start", start)
        if start not in self.rules:
            raise GrammarError(f"start rule {start!r} is not defined")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Grammar is immutable")

    def __reduce__(self) -> tuple[object, ...]:
        return (Grammar, (self.rules, self.start))

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            h = hash((self.start, tuple(sorted(self.rules.items(), key=lambda kv: kv[0]))))
            object.__setattr__(self, "_hash", h)
            return h

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Grammar) and self.start == other.start
                and self.rules == other.rules)

    def __repr__(self) -> str:
        lines = [f"Grammar(start={self.start!r})"]
        for name, e in self.rules.items():
            lines.append(f"  {name} ::= {e!r}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# Reference interpreter (test oracle)
# ---------------------------------------------------------------------------

def reference_accepts(grammar: Grammar, data: bytes | str, *, prefix: bool = False) -> bool:
    """Naive oracle: does ``grammar`` derive exactly ``data``?

    With ``prefix=True``: is ``data`` a prefix of some string the grammar derives
    (checked by bounded exploration, so only use with small grammars and inputs).
    Exponential in the worst case and not meant for left-recursive grammars.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    n = len(data)
    memo: dict[tuple[int, int], frozenset[int]] = {}
    active: set[tuple[int, int]] = set()
    rules = grammar.rules

    def ends(e: Expr, i: int) -> frozenset[int]:
        key = (id(e), i)
        got = memo.get(key)
        if got is not None:
            return got
        if key in active:  # left recursion guard: no derivation through this path
            return frozenset()
        active.add(key)
        try:
            r = _ends(e, i)
        finally:
            active.discard(key)
        memo[key] = r
        return r

    def _ends(e: Expr, i: int) -> frozenset[int]:
        if isinstance(e, ByteSet):
            return frozenset([i + 1]) if i < n and e.contains(data[i]) else frozenset()
        if isinstance(e, Seq):
            cur = frozenset([i])
            for it in e.items:
                nxt: set[int] = set()
                for j in cur:
                    nxt |= ends(it, j)
                cur = frozenset(nxt)
                if not cur:
                    break
            return cur
        if isinstance(e, Alt):
            out: set[int] = set()
            for it in e.items:
                out |= ends(it, i)
            return frozenset(out)
        if isinstance(e, Repeat):
            at: set[int] = {i}
            for _ in range(e.min):  # mandatory repetitions
                step: set[int] = set()
                for j in at:
                    step |= ends(e.item, j)
                at = step
                if not at:
                    return frozenset()
            result = set(at)
            frontier = set(at)
            count = e.min
            while frontier and (e.max is None or count < e.max):
                nxt = set()
                for j in frontier:
                    nxt |= ends(e.item, j)
                count += 1
                # bounded: positions may repeat with different counts, keep them all;
                # unbounded: only new positions can lead anywhere new
                frontier = nxt if e.max is not None else nxt - result
                result |= nxt
            return frozenset(result)
        if isinstance(e, Ref):
            if e.name not in rules:
                raise GrammarError(f"undefined rule {e.name!r}")
            return ends(rules[e.name], i)
        if isinstance(e, And):
            return ends(e.left, i) & ends(e.right, i)
        if isinstance(e, Diff):
            return ends(e.left, i) - ends(e.right, i)
        if isinstance(e, Dfa):
            out_d: set[int] = set()
            q = e.start
            if q in e.accept:
                out_d.add(i)
            j = i
            while j < n:
                q = e.step(q, data[j])
                if q < 0:
                    break
                j += 1
                if q in e.accept:
                    out_d.add(j)
            return frozenset(out_d)
        raise TypeError(f"unknown IR node {type(e).__name__}")

    if prefix:
        raise NotImplementedError("prefix mode is not provided by the reference oracle")
    return n in ends(rules[grammar.start], 0)


Node = Union[ByteSet, Seq, Alt, Repeat, Ref, And, Diff, Dfa]
