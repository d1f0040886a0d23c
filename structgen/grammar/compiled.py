"""What the compiler produces: :class:`CompiledGrammar` and its rule kinds.

A compiled grammar is a recursive transition network over bytes: a tuple of rules, each
answering :meth:`LazyRule.info` for its DFA states (``(row, accept, has_bytes, calls,
tail)``), plus the root rule's index. Rule kinds:

* :class:`LazyRule`: a trimmed Thompson NFA with call edges, determinised on first use;
* :class:`DfaRule`: a call-free, already trimmed DFA (an intersection, a difference or an
  explicit IR DFA), shared process-wide;
* :class:`ProductRule`: ``A - B`` of two DFAs, explored pair by pair on first use;
* :class:`CountedRule`: ``item{lo,hi}`` of a prefix-free item, counted instead of unrolled.

The result is immutable, hashable by content, picklable and shareable across threads.
Per-request state lives in :class:`structgen.masks.matcher.Matcher`; the shared, lazily
built runtime tables live in the runtime returned by :attr:`CompiledGrammar.engine`.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeAlias, TypedDict

import numpy as np
from numpy.typing import NDArray

from structgen.config import CompileOptions
from structgen.grammar import ir
from structgen.grammar.checks import run_checked
from structgen.grammar.fsa import Dfa, nfa_arrays
from structgen.json_types import JsonValue

if TYPE_CHECKING:  # pragma: no cover
    from structgen.grammar.runtime import Runtime

__all__ = ["CompiledGrammar", "CountedRule", "DfaRule", "LazyRule", "ProductRule", "Rule", "RuleInfo",
           "RuleSource", "grammar_key"]

#: What a rule's ``info(q)`` answers for its state ``q``: ``(row, accept, has_bytes, calls, tail)``
#: (see :meth:`LazyRule.info`).
RuleInfo: TypeAlias = tuple[NDArray[np.int32], bool, bool, tuple[tuple[int, int], ...], bool]


class RuleSource(NamedTuple):
    """Where one compiled rule comes from, for errors raised while the grammar is used (the
    token-budget check names the rule whose automaton it could not bound).

    ``rule``: the source rule (a Lark rule, a JSON schema lowering's rule such as ``'s3'``; for
    a rule the compiler made from a sub-expression, the rule it was made in); ``pointer`` and
    ``keyword``: the JSON schema location and keyword it was made for; ``line``: the line of
    its definition in Lark text. None where not known.
    """

    rule: str
    pointer: str | None = None
    keyword: str | None = None
    line: int | None = None


# a deferred :meth:`CompiledGrammar.set_rule_sources`: the grammar -> its rules' sources
_SourcesFn = Callable[["CompiledGrammar"], tuple[RuleSource, ...]]


class _Csr(NamedTuple):
    """A :class:`LazyRule`'s NFA as flat arrays (see :meth:`LazyRule.csr`)."""

    eps_off: NDArray[np.int32]
    eps: NDArray[np.int32]
    edge_off: NDArray[np.int32]
    edges: NDArray[np.int32]
    call_off: NDArray[np.int32]
    calls: NDArray[np.int32]
    important: NDArray[np.uint8]


def _csr_rows(off: NDArray[np.int32], items: list[Any]) -> tuple[tuple[Any, ...], ...]:
    """``items`` cut into the rows of a CSR array with offsets ``off``."""
    b = off.tolist()
    return tuple(map(tuple, map(items.__getitem__, map(slice, b, b[1:]))))


def _int_tuples(a: NDArray[np.int32]) -> list[Any]:
    """The rows of a 2-d integer array as tuples of Python ints."""
    return list(zip(*a.T.tolist())) if a.shape[0] else []


class LazyState(TypedDict):
    """The pickled form of a :class:`LazyRule`: its NFA, none of its DFA states. The NFA is
    either its flat arrays (``csr``) or its lists (``eps``, ``edges``, ``calls``); the other
    form is None."""

    name: str
    end: int
    class_of: NDArray[np.int32]
    nclass: int
    csr: _Csr | None
    eps: tuple[tuple[int, ...], ...] | None
    edges: tuple[tuple[tuple[int, int, int], ...], ...] | None
    calls: tuple[tuple[tuple[int, int], ...], ...] | None


class TableState(TypedDict):
    """The pickled form of a :class:`DfaRule`: its table."""

    name: str
    trans: NDArray[np.int32]
    accept: NDArray[np.bool_]


class CountedState(TableState):
    """The pickled form of a :class:`CountedRule`: its item's table and its bounds."""

    lo: int
    hi: int


class ProductState(TypedDict):
    """The pickled form of a :class:`ProductRule`: its two operands."""

    name: str
    a: Dfa
    b: Dfa


class GrammarState(TypedDict, total=False):
    """The pickled form of a :class:`CompiledGrammar` (``metadata`` and ``rule_sources`` are
    missing from pickles of older versions)."""

    rules: tuple[Rule, ...]
    root: int
    key: str
    source: ir.Grammar | None
    metadata: dict[str, JsonValue]
    rule_sources: tuple[tuple[str, str | None, str | None, int | None], ...]


class LazyRule:
    """One rule of a compiled grammar: a trimmed Thompson NFA over bytes and call symbols,
    determinised lazily (subset construction one state at a time, on first use).

    Compilation stays linear in the size of the grammar; only the DFA states a request
    actually visits are ever built (the lazy-DFA design of RE2). A DFA state is the set of
    *important* NFA states of an epsilon closure (those with byte edges or call edges, and
    the rule's end), so closures that differ only in pass-through states share one DFA
    state. The NFA is trimmed at compile time: every NFA state left can reach the rule's
    end (calls only to rules with a non-empty language), so every non-empty DFA state can
    still complete the rule, which keeps token masks exact without a DFA-level trim.

    Per DFA state ``q`` (0 = start), :meth:`info` gives ``(row, accept, has_bytes, calls,
    tail)``: ``row`` int32 ``[256]`` next state or -1; ``calls`` a tuple of
    ``(callee_rule_index, return_state)``; ``tail``: accepting with no byte or call edges.
    Thread-safe; picklable (the lazily built states are not pickled).
    """

    kind: Literal["lazy"] = "lazy"  # the rule kind (what the runtime and the store dispatch on)

    def __init__(self, name: str, eps: tuple[tuple[int, ...], ...],
                 edges: tuple[tuple[tuple[int, int, int], ...], ...],
                 calls: tuple[tuple[tuple[int, int], ...], ...], end: int,
                 class_of: NDArray[np.int32], nclass: int) -> None:
        self.name = name
        self.marker_class: bool | None = None  # unknown until has_value_checks asks
        self._eps = eps            # per NFA state: epsilon targets
        self._edges = edges        # per NFA state: (class_lo, class_hi, target)
        self._ncalls = calls       # per NFA state: (callee rule, target)
        self._end = end
        self._class_of = class_of  # int32 [256] byte -> class
        self._nclass = nclass
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.RLock()
        self._csr: _Csr | None = None
        n = len(self._eps)
        self._important = [bool(self._edges[x]) or bool(self._ncalls[x]) or x == self._end
                           for x in range(n)]
        self.leaf = not any(self._ncalls)  # no call edges: the rule never pushes a frame
        self._eclose: dict[int, frozenset[int]] = {}
        self._ids: dict[frozenset[int], int] = {}
        self._sets: list[frozenset[int]] = []
        self._info: list[RuleInfo | None] = []
        self._intern(self._closure_of((0,)))

    def __getstate__(self) -> LazyState:
        csr = self.__dict__.get("_csr")
        if csr is not None:  # the arrays, as the runtime reads them: no lists built to pickle
            return {"name": self.name, "end": self._end, "class_of": self._class_of, "nclass": self._nclass,
                    "csr": csr, "eps": None, "edges": None, "calls": None}
        return {"name": self.name, "end": self._end, "class_of": self._class_of, "nclass": self._nclass,
                "csr": None, "eps": self._eps, "edges": self._edges, "calls": self._ncalls}

    def __setstate__(self, st: LazyState) -> None:
        csr = st.get("csr")
        if csr is not None:
            self.__dict__.update(LazyRule.from_csr(st["name"], _Csr(*csr), st["end"], st["class_of"],
                                                   st["nclass"]).__dict__)
            return
        assert st["eps"] is not None and st["edges"] is not None and st["calls"] is not None
        LazyRule.__init__(self, st["name"], st["eps"], st["edges"], st["calls"], st["end"], st["class_of"],
                          st["nclass"])

    @classmethod
    def from_csr(cls, name: str, csr: _Csr, end: int, class_of: NDArray[np.int32], nclass: int,
                 marker_class: bool | None = None) -> LazyRule:
        """The rule whose NFA is ``csr`` (the arrays :meth:`csr` gives; a stored grammar's).
        The compiled runtime reads those arrays as they are; the NFA's Python lists and the
        rule's own DFA states (:meth:`info`, for the plain-Python paths) are built only when
        first used. ``marker_class``: whether some byte class holds value-check markers only
        (see :attr:`CompiledGrammar.has_value_checks`), when the caller knows."""
        self = cls.__new__(cls)
        self.marker_class = marker_class
        self.name = name
        self._end = end
        self._class_of = class_of
        self._nclass = nclass
        self._lock = threading.RLock()
        self._csr = csr
        self.leaf = not csr.calls.shape[0]
        return self

    # the NFA's lists and the DFA states of a rule made by :meth:`from_csr`, built on first use
    _LISTS = frozenset({"_eps", "_edges", "_ncalls", "_important", "_eclose", "_ids", "_sets", "_info"})

    def __getattr__(self, attr: str) -> object:
        if attr not in LazyRule._LISTS or "_csr" not in self.__dict__:
            raise AttributeError(attr)
        with self.__dict__["_lock"]:
            if "_eps" not in self.__dict__:
                c = self._csr
                assert c is not None  # a rule made by from_csr
                self._eps = _csr_rows(c.eps_off, c.eps.tolist())
                self._edges = _csr_rows(c.edge_off, _int_tuples(c.edges))
                self._ncalls = _csr_rows(c.call_off, _int_tuples(c.calls))
                self._reset()
                self._csr = c  # _reset forgets it
        return self.__dict__[attr]

    @property
    def num_nfa_states(self) -> int:
        """Size of the rule's (trimmed) NFA: fixed at compile time."""
        csr = self.__dict__.get("_csr")
        return len(self._eps) if csr is None else int(csr.eps_off.shape[0]) - 1

    def csr(self) -> _Csr:
        """The NFA as flat arrays for the compiled runtime (:mod:`structgen.grammar._runtime_kernels`):
        ``(eps_off [n+1], eps, edge_off [n+1], edges [m, 3] (class_lo, class_hi, target),
        call_off [n+1], calls [k, 2] (callee, target), important [n])``, all int32 but
        ``important`` (uint8). A compiled rule is made with them; one unpickled from lists
        builds them here, once."""
        got = self._csr
        if got is None:
            with self._lock:
                got = self._csr
                if got is None:
                    eo, eps, do, edges, co, calls = nfa_arrays(self._eps, self._edges, self._ncalls)
                    got = self._csr = _Csr(eo, eps, do, edges, co, calls,
                                           np.asarray(self._important, dtype=np.uint8))
        return got

    @property
    def num_states(self) -> int:
        """DFA states built so far (grows as requests visit new states)."""
        return len(self._sets)

    def _eclose1(self, x: int) -> frozenset[int]:
        got = self._eclose.get(x)
        if got is None:
            seen = {x}
            stack = [x]
            eps = self._eps
            while stack:
                y = stack.pop()
                for z in eps[y]:
                    if z not in seen:
                        seen.add(z)
                        stack.append(z)
            imp = self._important
            got = frozenset(y for y in seen if imp[y])
            self._eclose[x] = got
        return got

    def _closure_of(self, targets: Iterable[int]) -> frozenset[int]:
        ts = list(targets)
        if len(ts) == 1:
            return self._eclose1(ts[0])
        return frozenset().union(*(self._eclose1(t) for t in ts))

    def _intern(self, key: frozenset[int]) -> int:
        j = self._ids.get(key)
        if j is None:
            j = len(self._sets)
            self._ids[key] = j
            self._sets.append(key)
            self._info.append(None)
        return j

    def info(self, q: int) -> RuleInfo:
        """``(row, accept, has_bytes, calls, tail)`` of DFA state ``q`` (built on first use)."""
        got = self._info[q]
        if got is not None:
            return got
        with self._lock:
            got = self._info[q]
            if got is None:
                got = self._expand(q)
                self._info[q] = got
        return got

    def _expand(self, q: int) -> RuleInfo:
        S = self._sets[q]
        nclass = self._nclass
        buckets: list[set[int] | None] = [None] * nclass
        callt: dict[int, set[int]] = {}
        edges, ncalls = self._edges, self._ncalls
        for x in S:
            for clo, chi, t in edges[x]:
                for c in range(clo, chi + 1):
                    b = buckets[c]
                    if b is None:
                        buckets[c] = {t}
                    else:
                        b.add(t)
            for r, t in ncalls[x]:
                callt.setdefault(r, set()).add(t)
        crow = np.full(nclass, -1, dtype=np.int32)
        seen: dict[frozenset[int], int] = {}
        for c in range(nclass):
            b = buckets[c]
            if b is None:
                continue
            k = frozenset(b)
            j = seen.get(k)
            if j is None:
                j = self._intern(self._closure_of(k))
                seen[k] = j
            crow[c] = j
        row = crow[self._class_of]
        calls = tuple((r, self._intern(self._closure_of(callt[r]))) for r in sorted(callt))
        accept = self._end in S
        has_bytes = bool((crow >= 0).any())
        return (row, accept, has_bytes, calls, accept and not has_bytes and not calls)


class CountedRule:
    """``item{lo,hi}`` for a call-free, prefix-free item (no accepting state of its table has
    an edge, so an item ends exactly where the table accepts, and the empty string is not an
    item), given as the item's trimmed DFA table. A state is (items read, item state): the
    engine explores them lazily (:func:`structgen.grammar._runtime_kernels._expand_counted`), so a
    ``maxLength: 4096`` string is one small table, not 4096 unrolled copies of a character.
    :meth:`info` answers for the start state only (compile-time checks need nothing more)."""

    leaf = True  # never calls another rule
    kind: Literal["counted"] = "counted"

    def __init__(self, name: str, trans: NDArray[np.int32], accept: NDArray[np.bool_], lo: int,
                 hi: int) -> None:
        self.name = name
        self._trans = trans    # int32 [n, 256], -1 dead: the item
        self._accept = accept  # bool [n]
        self.lo, self.hi = int(lo), int(hi)

    def __getstate__(self) -> CountedState:
        return {"name": self.name, "trans": self._trans, "accept": self._accept, "lo": self.lo, "hi": self.hi}

    def __setstate__(self, st: CountedState) -> None:
        CountedRule.__init__(self, st["name"], st["trans"], st["accept"], st["lo"], st["hi"])

    @property
    def item_table(self) -> NDArray[np.int32]:
        """The item's DFA table (int32 ``[n, 256]``, -1 dead; row 0 the start; read only)."""
        return self._trans

    @property
    def item_accept(self) -> NDArray[np.bool_]:
        """Where an item ends (bool ``[n]``; read only)."""
        return self._accept

    @property
    def num_nfa_states(self) -> int:
        """Rows of the item's table (the compiled size)."""
        return int(self._trans.shape[0])

    @property
    def num_states(self) -> int:
        """Rows of the item's table (the runtime's counted states are not counted here)."""
        return int(self._trans.shape[0])

    @property
    def nullable(self) -> bool:
        """Does the rule match the empty string?"""
        return self.lo == 0

    def info(self, q: int) -> RuleInfo:
        """:meth:`LazyRule.info` of the start state (``q`` must be 0; the runtime walks the
        counted states itself); raises ValueError for any other state."""
        if q != 0:
            raise ValueError("CountedRule.info answers for the start state only")
        has = self.hi > 0
        return (np.full(256, -1, dtype=np.int32), self.lo == 0, has, (), self.lo == 0 and not has)



class DfaRule:
    """A call-free rule given as an already trimmed DFA (an intersection, a difference or
    an explicit :class:`~structgen.grammar.ir.Dfa`): same :meth:`info` interface as
    :class:`LazyRule`. Built once per distinct sub-expression and shared by every grammar
    that uses it (process-wide cache), instead of being copied into each caller's NFA."""

    leaf = True  # never calls another rule
    kind: Literal["dfa"] = "dfa"

    def __init__(self, name: str, trans: NDArray[np.int32], accept: NDArray[np.bool_]) -> None:
        self.name = name
        self._trans = trans    # int32 [n, 256], -1 dead
        self._accept = accept  # bool [n]
        has: list[bool] = np.asarray((trans >= 0).any(axis=1)).tolist()
        acc: list[bool] = accept.tolist()
        self._infos: list[RuleInfo] = [(trans[q], acc[q], has[q], (), acc[q] and not has[q])
                                       for q in range(trans.shape[0])]

    def __getstate__(self) -> TableState:
        return {"name": self.name, "trans": self._trans, "accept": self._accept}

    def __setstate__(self, st: TableState) -> None:
        DfaRule.__init__(self, st["name"], st["trans"], st["accept"])

    @property
    def num_nfa_states(self) -> int:
        """States of the table (the compiled size)."""
        return int(self._trans.shape[0])

    @property
    def num_states(self) -> int:
        """States of the table (all built at compile time)."""
        return int(self._trans.shape[0])

    @property
    def nullable(self) -> bool:
        """Does the rule match the empty string?"""
        return bool(self._accept[0])

    def info(self, q: int) -> RuleInfo:
        """``(row, accept, has_bytes, calls, tail)`` of state ``q`` (see :meth:`LazyRule.info`)."""
        return self._infos[q]


class ProductRule:
    """``A - B`` over two trimmed call-free DFAs, explored lazily (pairs of states interned
    on first use). Only built where every live pair can complete (see the compiler's
    ``_lazy_diff``), so no trimming is needed. Same :meth:`info` interface as
    :class:`LazyRule`; thread-safe; picklable (pairs are rebuilt lazily)."""

    leaf = True  # never calls another rule
    kind: Literal["product"] = "product"

    def __init__(self, name: str, a: Dfa, b: Dfa) -> None:
        self.name = name
        self._a, self._b = a, b
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.RLock()
        self._ids: dict[tuple[int, int], int] = {(0, 0): 0}
        self._pairs: list[tuple[int, int]] = [(0, 0)]
        self._infos: list[RuleInfo | None] = [None]
        self._acc_a: list[bool] = self._a.accept.tolist()
        self._acc_b: list[bool] = self._b.accept.tolist()

    def __getstate__(self) -> ProductState:
        return {"name": self.name, "a": self._a, "b": self._b}

    def __setstate__(self, st: ProductState) -> None:
        ProductRule.__init__(self, st["name"], st["a"], st["b"])

    @property
    def num_nfa_states(self) -> int:
        """States of both operands (the compiled size)."""
        return int(self._a.trans.shape[0] + self._b.trans.shape[0])

    @property
    def num_states(self) -> int:
        """Pair states interned so far (grows as requests visit new pairs)."""
        return len(self._pairs)

    @property
    def nullable(self) -> bool:
        """Does the rule match the empty string (without building a pair state)?"""
        return bool(self._acc_a[0]) and not bool(self._acc_b[0])

    def info(self, q: int) -> RuleInfo:
        """``(row, accept, has_bytes, calls, tail)`` of pair state ``q``, built on first use
        (see :meth:`LazyRule.info`)."""
        got = self._infos[q]
        if got is not None:
            return got
        with self._lock:
            got = self._infos[q]
            if got is None:
                qa, qb = self._pairs[q]
                ra = self._a.trans[qa]
                rb = self._b.trans[qb] if qb >= 0 else np.full(256, -1, np.int32)
                key = ra.astype(np.int64) * (self._b.trans.shape[0] + 1) + (rb + 1)
                row = np.full(256, -1, dtype=np.int32)
                live = ra >= 0
                nb1 = self._b.trans.shape[0] + 1
                for k in np.unique(key[live]).tolist():
                    pair = (k // nb1, k % nb1 - 1)
                    j = self._ids.get(pair)
                    if j is None:
                        j = len(self._pairs)
                        self._ids[pair] = j
                        self._pairs.append(pair)
                        self._infos.append(None)
                    row[live & (key == k)] = j
                acc = bool(self._acc_a[qa]) and not (qb >= 0 and bool(self._acc_b[qb]))
                has = bool(live.any())
                got = (row, acc, has, (), acc and not has)
                self._infos[q] = got
        return got



class CompiledGrammar:
    """An immutable compiled grammar: lazily determinised rules plus the root rule's index.

    Equality and hashing are by content (a SHA-256 of the source IR and options), so
    equal grammars compiled twice are interchangeable. Runtime tables built while
    matching are shared by every matcher of this grammar (thread-safe).
    """

    def __init__(self, rules: tuple[Rule, ...], root: int, key: str | None,
                 source: ir.Grammar | None = None, options: CompileOptions | None = None, *,
                 rule_origins: tuple[str, ...] | None = None,
                 rule_exprs: tuple[ir.Expr | None, ...] | None = None) -> None:
        self._rules = rules
        self._root = root
        self._key = key  # None: computed from ``source`` and ``options`` when first asked for
        self._options = options
        self._source = source
        origins = rule_origins if rule_origins is not None and len(rule_origins) == len(rules) else \
            tuple(r.name for r in rules)
        self._rule_sources = tuple(RuleSource(o) for o in origins)
        self._sources_fn: _SourcesFn | None = None  # see set_rule_sources
        self._sources_lock = threading.RLock()
        self._sources_busy = False
        # per rule, the IR sub-expression the compiler made it from (None: a source rule);
        # front-ends read it once to place the rule in their source, it is not pickled
        self._rule_exprs = rule_exprs if rule_exprs is not None and len(rule_exprs) == len(rules) else \
            (None,) * len(rules)
        self._engine: Runtime | None = None
        self._engine_lock = threading.Lock()
        #: what front-ends record about the grammar (JSON values: their warnings, the schema)
        self.metadata: dict[str, JsonValue] = {}
        self._value_checks: bool | None = None

    # -- identity ---------------------------------------------------------
    @property
    def rules(self) -> tuple[Rule, ...]:
        """The rules, indexed by the rule numbers that call edges use."""
        return self._rules

    @property
    def root(self) -> int:
        """Index of the start rule in :attr:`rules`."""
        return self._root

    @property
    def key(self) -> str:
        """Content hash (hex) of the source IR and compile options (SHA-256, stable across
        processes; computed on first use: compiling needs only the in-process cache key)."""
        if self._key is None:
            assert self._source is not None
            self._key = grammar_key(self._source, self._options or CompileOptions())
        return self._key

    @property
    def source(self) -> ir.Grammar | None:
        """The IR grammar this was compiled from (for ``--explain``)."""
        return self._source

    @property
    def options(self) -> CompileOptions:
        """The compile options this grammar was compiled with (the defaults for a grammar
        loaded from storage, which does not keep them)."""
        return self._options or CompileOptions()

    @property
    def rule_sources(self) -> tuple[RuleSource, ...]:
        """Per rule (indexed like :attr:`rules`), where it comes from (:class:`RuleSource`):
        the source rule's name from the compiler, the schema location or grammar line from the
        front-end that compiled it (:meth:`set_rule_sources`; a deferred placement is worked
        out here, on first read)."""
        if self._sources_fn is not None:
            self._resolve_sources()
        return self._rule_sources

    @property
    def rule_exprs(self) -> tuple[ir.Expr | None, ...]:
        """Per rule, the IR sub-expression the compiler made it from (an intersection, a
        difference, a counted repetition), None for a rule of the source grammar and for every
        rule of a grammar loaded from storage."""
        return self._rule_exprs

    def set_rule_sources(self, sources: tuple[RuleSource, ...] | _SourcesFn) -> None:
        """Replace :attr:`rule_sources` (a front-end placing the rules in its source, once
        compiled). The grammar is shared by content: the front-end that compiled it last
        names the places, as with :attr:`metadata`. ``sources`` may be a function of the
        grammar returning the tuple: it is called on the first read of :attr:`rule_sources`
        (places are only needed by errors raised while the grammar is used, so compiling does
        not pay for them), and reads the compiler's places from :attr:`rule_sources` meanwhile.
        Raises ValueError for a tuple of the wrong length (a function's: when it is called)."""
        if callable(sources):
            with self._sources_lock:
                self._sources_fn = sources
            return
        if len(sources) != len(self._rules) or not all(isinstance(x, RuleSource) for x in sources):
            raise ValueError("rule_sources needs one RuleSource per rule")
        with self._sources_lock:
            self._rule_sources = tuple(sources)
            self._sources_fn = None

    def _resolve_sources(self) -> None:
        """Call the deferred :meth:`set_rule_sources` function once (thread-safe; a read of
        :attr:`rule_sources` from inside it gets the compiler's places)."""
        with self._sources_lock:
            fn = self._sources_fn
            if fn is None or self._sources_busy:
                return
            self._sources_busy = True
            try:
                got = fn(self)
            finally:
                self._sources_busy = False
            if self._sources_fn is fn:
                self.set_rule_sources(got)

    @property
    def num_states(self) -> int:
        """NFA states over all rules (the compiled size; fixed at compile time)."""
        return sum(r.num_nfa_states for r in self._rules)

    @property
    def num_dfa_states(self) -> int:
        """DFA states built lazily so far, over all rules."""
        return sum(r.num_states for r in self._rules)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CompiledGrammar) and (other is self or other.key == self.key)

    def __repr__(self) -> str:
        return (f"CompiledGrammar(rules={len(self._rules)}, states={self.num_states}, "
                f"key={self.key[:12]})")

    def __getstate__(self) -> GrammarState:
        return {"rules": self._rules, "root": self._root, "key": self.key,
                "source": self._source, "metadata": self.metadata,
                "rule_sources": tuple((x.rule, x.pointer, x.keyword, x.line) for x in self.rule_sources)}

    def __setstate__(self, state: GrammarState) -> None:
        CompiledGrammar.__init__(self, state["rules"], state["root"], state["key"], state["source"])
        self.metadata = state.get("metadata", {})
        sources = state.get("rule_sources")
        if sources is not None and len(sources) == len(self._rules):
            self._rule_sources = tuple(RuleSource(*x) for x in sources)

    # -- runtime ------------------------------------------------------------
    @property
    def engine(self) -> Runtime:
        """The shared byte-level runtime (:class:`structgen.grammar.runtime.Runtime`), built on
        first use; token masks are built over it (:func:`structgen.masks.engine.engine_for`)."""
        eng = self._engine
        if eng is None:
            with self._engine_lock:
                eng = self._engine
                if eng is None:
                    # lazy: the runtime loads the numba kernels, which checking a stored
                    # grammar's text with the plain kernels must not (structgen validate)
                    from structgen.grammar.runtime import Runtime
                    eng = self._engine = Runtime(self)
        return eng

    @property
    def has_value_checks(self) -> bool:
        """Does the grammar carry value checks (:mod:`structgen.grammar.checks`)? Then it checks
        text (:meth:`accepts`) but does not drive token masks. Computed once, from the rules'
        edges on the marker bytes."""
        got = self._value_checks
        if got is None:
            lazy = [r for r in self._rules if isinstance(r, LazyRule)]
            unknown = [r for r in lazy if r.marker_class is None]
            marked = [r for r in lazy if r.marker_class]
            marked += [r for r, m in zip(unknown, _marker_classes(unknown)) if m]
            others = [r for r in self._rules if not isinstance(r, LazyRule)]
            got = self._value_checks = any(_uses_markers(r) for r in (*marked, *others))
        return got

    def _run(self, data: bytes | str) -> tuple[bool, bool]:
        if isinstance(data, str):
            data = data.encode("utf-8")
        if self.has_value_checks:
            return run_checked(self.engine, data)
        return self.engine.run_from_start(data)

    def accepts(self, data: bytes | str) -> bool:
        """Is ``data`` (bytes, or str encoded as UTF-8) a complete sentence of the grammar?
        Value checks, where the grammar has them, run on each JSON string they mark."""
        return self._run(data)[1]

    def accepts_prefix(self, data: bytes | str) -> bool:
        """Can ``data`` be extended to a sentence of the grammar (a viable prefix)?"""
        return self._run(data)[0]


def _marker_classes(rules: list[LazyRule]) -> list[bool]:
    """Per rule of ``rules``: has it a byte class made of marker bytes (0xF8-0xFF) only? Only
    such a rule can have an edge on a marker (:func:`_uses_markers`); this checks every rule
    in a few array operations instead of a few per rule."""
    if not rules:
        return []
    lo = 0xF8
    cls = np.stack([r._class_of for r in rules])  # [n, 256]
    rows = np.arange(len(rules))[:, None]
    below = np.zeros((len(rules), int(cls.max()) + 1), dtype=np.bool_)
    below[rows, cls[:, :lo]] = True  # the classes some byte below the markers is in
    marked = np.asarray((~below[rows, cls[:, lo:]]).any(axis=1))
    return [bool(x) for x in marked]


def _uses_markers(rule: Rule) -> bool:
    """Has ``rule`` an edge on a value-check marker byte (0xF8-0xFF) that no other byte takes?
    A marker byte that goes where some byte below 0xF8 goes too (free text over any byte, for
    example) is an ordinary byte of that rule, not a check."""
    lo = 0xF8
    if isinstance(rule, LazyRule):
        cls = rule._class_of
        # bytes share a class when every state treats them alike: a class with a byte below
        # 0xF8 in it is no marker class (nearly always so: the markers are not UTF-8)
        below = np.zeros(int(cls.max()) + 1, dtype=np.bool_)
        below[cls[:lo]] = True
        high = cls[lo:]
        marks = high[~below[high]]
        if not marks.size:
            return False
        edges = rule.csr()[3]  # [m, 3]: (class_lo, class_hi, target); the runtime builds it anyway
        if not len(edges):
            return False
        hit = (edges[:, 0:1] <= marks[None, :]) & (marks[None, :] <= edges[:, 1:2])
        return bool(hit.any())
    trans = np.asarray(rule._a.trans if isinstance(rule, ProductRule) else rule._trans)
    if not (trans[:, lo:] >= 0).any():  # no state goes anywhere on a marker (UTF-8 text, numbers)
        return False
    for m in range(lo, 0x100):
        col = trans[:, m]
        live = col >= 0
        if live.any() and not (trans[live, :lo] == col[live, None]).any(axis=1).all():
            return True
    return False


#: A rule of a compiled grammar (indexed by the rule numbers that call edges use).
Rule: TypeAlias = LazyRule | DfaRule | ProductRule | CountedRule


def grammar_key(grammar: ir.Grammar, options: CompileOptions) -> str:
    """SHA-256 (hex) of ``options`` and ``grammar`` (start rule, then every rule by name and
    body fingerprint): equal for equal grammars in any process. Walks every IR node once."""
    h = hashlib.sha256()
    h.update(repr(options).encode())
    h.update(grammar.start.encode())
    for name in sorted(grammar.rules):
        h.update(b"\x00" + name.encode() + b"\x01" + grammar.rules[name].fingerprint())
    return h.hexdigest()
