"""Grammar IR -> compiled byte-level automaton (a recursive transition network).

Compilation steps (all bounded by :class:`~structgen.config.CompileOptions`):

1. immediate left recursion ``A -> A a | b`` is rewritten to ``A -> b a*``; any left
   recursion that remains is a :class:`~structgen.errors.GrammarError`;
2. rules that are not recursive are inlined into their callers when that is cheap
   (used once, or small), so most JSON-Schema grammars become a single DFA and only
   genuinely recursive rules (``$ref`` cycles, nested Lark rules) remain as *calls*;
3. each remaining rule is built as a Thompson NFA over bytes and call symbols
   (``And``/``Diff``/``Dfa`` sub-expressions are compiled to DFAs by product
   construction and embedded), determinised over byte equivalence classes, trimmed to
   states that can still reach acceptance, and minimised.

The result, :class:`CompiledGrammar`, is immutable, hashable by content, picklable and
shareable across threads. Per-request state lives in :class:`structgen.masks.matcher.Matcher`;
the shared lazily-built runtime tables (configurations, transitions, mask caches) live in
:mod:`structgen.masks.engine`.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from structgen.config import CompileOptions
from structgen.errors import CompileLimitError, CompileTimeoutError, GrammarError
from structgen.grammar import ir
from structgen.grammar.gcpause import gc_paused
from structgen.grammar.graphs import reachable, strongly_connected_components

__all__ = ["CompiledGrammar", "CountedRule", "DfaRule", "LazyRule", "compile_grammar"]


# ---------------------------------------------------------------------------
# Compiled artefacts
# ---------------------------------------------------------------------------

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

    def __init__(self, name: str, eps: tuple[tuple[int, ...], ...],
                 edges: tuple[tuple[tuple[int, int, int], ...], ...],
                 calls: tuple[tuple[tuple[int, int], ...], ...], end: int,
                 class_of: np.ndarray, nclass: int) -> None:
        self.name = name
        self._eps = eps            # per NFA state: epsilon targets
        self._edges = edges        # per NFA state: (class_lo, class_hi, target)
        self._ncalls = calls       # per NFA state: (callee rule, target)
        self._end = end
        self._class_of = class_of  # int32 [256] byte -> class
        self._nclass = nclass
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.RLock()
        self._csr: tuple[np.ndarray, ...] | None = None
        n = len(self._eps)
        self._important = [bool(self._edges[x]) or bool(self._ncalls[x]) or x == self._end
                           for x in range(n)]
        self.leaf = not any(self._ncalls)  # no call edges: the rule never pushes a frame
        self._eclose: dict[int, frozenset[int]] = {}
        self._ids: dict[frozenset[int], int] = {}
        self._sets: list[frozenset[int]] = []
        self._info: list[tuple[np.ndarray, bool, bool, tuple[tuple[int, int], ...], bool] | None] = []
        self._intern(self._closure_of((0,)))

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "eps": self._eps, "edges": self._edges, "calls": self._ncalls,
                "end": self._end, "class_of": self._class_of, "nclass": self._nclass}

    def __setstate__(self, st: dict[str, Any]) -> None:
        self.__init__(st["name"], st["eps"], st["edges"], st["calls"], st["end"],  # type: ignore[misc]
                      st["class_of"], st["nclass"])

    @property
    def num_nfa_states(self) -> int:
        """Size of the rule's (trimmed) NFA: fixed at compile time."""
        return len(self._eps)

    def csr(self) -> tuple[np.ndarray, ...]:
        """The NFA as flat arrays for the compiled runtime (:mod:`structgen.grammar._pda_kernels`),
        built once: ``(eps_off [n+1], eps, edge_off [n+1], edges [m, 3] (class_lo,
        class_hi, target), call_off [n+1], calls [k, 2] (callee, target), important [n])``,
        all int32 but ``important`` (uint8)."""
        got = self._csr
        if got is None:
            def flat(lists: tuple[tuple[Any, ...], ...], width: int) -> tuple[np.ndarray, np.ndarray]:
                off = np.zeros(len(lists) + 1, dtype=np.int32)
                off[1:] = np.cumsum(np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists)))
                items = [e for x in lists for e in x]
                arr = np.array(items, dtype=np.int32).reshape(-1, width) if width > 1 else \
                    np.array(items, dtype=np.int32)
                return off, arr

            eo, eps = flat(self._eps, 1)
            do, edges = flat(self._edges, 3)
            co, calls = flat(self._ncalls, 2)
            imp = np.array(self._important, dtype=np.uint8)
            got = self._csr = (eo, eps, do, edges, co, calls, imp)
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

    def info(self, q: int) -> tuple[np.ndarray, bool, bool, tuple[tuple[int, int], ...], bool]:
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

    def _expand(self, q: int) -> tuple[np.ndarray, bool, bool, tuple[tuple[int, int], ...], bool]:
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
    engine explores them lazily (:func:`structgen.grammar._pda_kernels._expand_counted`), so a
    ``maxLength: 4096`` string is one small table, not 4096 unrolled copies of a character.
    :meth:`info` answers for the start state only (compile-time checks need nothing more)."""

    leaf = True  # never calls another rule

    def __init__(self, name: str, trans: np.ndarray, accept: np.ndarray, lo: int, hi: int) -> None:
        self.name = name
        self._trans = trans    # int32 [n, 256], -1 dead: the item
        self._accept = accept  # bool [n]
        self.lo, self.hi = int(lo), int(hi)

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "trans": self._trans, "accept": self._accept, "lo": self.lo, "hi": self.hi}

    def __setstate__(self, st: dict[str, Any]) -> None:
        self.__init__(st["name"], st["trans"], st["accept"], st["lo"], st["hi"])  # type: ignore[misc]

    @property
    def num_nfa_states(self) -> int:
        return int(self._trans.shape[0])

    @property
    def num_states(self) -> int:
        return int(self._trans.shape[0])

    def info(self, q: int) -> tuple[np.ndarray, bool, bool, tuple[tuple[int, int], ...], bool]:
        if q != 0:
            raise ValueError("CountedRule.info answers for the start state only")
        has = self.hi > 0
        return (np.full(256, -1, dtype=np.int32), self.lo == 0, has, (), self.lo == 0 and not has)


class _Counted(ir.Repeat):
    """A bounded repetition the compiler builds as a :class:`CountedRule` call (the item is
    closed and prefix-free); elsewhere (inside an intersection operand) it unrolls as the
    :class:`~structgen.grammar.ir.Repeat` it is."""

    __slots__ = ()


class DfaRule:
    """A call-free rule given as an already trimmed DFA (an intersection, a difference or
    an explicit :class:`~structgen.grammar.ir.Dfa`): same :meth:`info` interface as
    :class:`LazyRule`. Built once per distinct sub-expression and shared by every grammar
    that uses it (process-wide cache), instead of being copied into each caller's NFA."""

    leaf = True  # never calls another rule

    def __init__(self, name: str, trans: np.ndarray, accept: np.ndarray) -> None:
        self.name = name
        self._trans = trans    # int32 [n, 256], -1 dead
        self._accept = accept  # bool [n]
        has = (trans >= 0).any(axis=1).tolist()
        acc = accept.tolist()
        self._infos = [(trans[q], acc[q], has[q], (), acc[q] and not has[q])
                       for q in range(trans.shape[0])]

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "trans": self._trans, "accept": self._accept}

    def __setstate__(self, st: dict[str, Any]) -> None:
        self.__init__(st["name"], st["trans"], st["accept"])  # type: ignore[misc]

    @property
    def num_nfa_states(self) -> int:
        return int(self._trans.shape[0])

    @property
    def num_states(self) -> int:
        return int(self._trans.shape[0])

    def info(self, q: int) -> tuple[np.ndarray, bool, bool, tuple[tuple[int, int], ...], bool]:
        return self._infos[q]


class ProductRule:
    """``A - B`` over two trimmed call-free DFAs, explored lazily (pairs of states interned
    on first use). Only built where every live pair can complete (see
    ``_Compiler._lazy_diff``), so no trimming is needed. Same :meth:`info` interface as
    :class:`LazyRule`; thread-safe; picklable (pairs are rebuilt lazily)."""

    leaf = True  # never calls another rule

    def __init__(self, name: str, a: Any, b: Any) -> None:
        self.name = name
        self._a, self._b = a, b
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.RLock()
        self._ids: dict[tuple[int, int], int] = {(0, 0): 0}
        self._pairs: list[tuple[int, int]] = [(0, 0)]
        self._infos: list[Any] = [None]
        self._acc_a = self._a.accept.tolist()
        self._acc_b = self._b.accept.tolist()

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "a": self._a, "b": self._b}

    def __setstate__(self, st: dict[str, Any]) -> None:
        self.__init__(st["name"], st["a"], st["b"])  # type: ignore[misc]

    @property
    def num_nfa_states(self) -> int:
        return int(self._a.trans.shape[0] + self._b.trans.shape[0])

    @property
    def num_states(self) -> int:
        return len(self._pairs)

    def info(self, q: int) -> tuple[np.ndarray, bool, bool, tuple[tuple[int, int], ...], bool]:
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


def _all_states_infinite(d: Any) -> bool:
    """Does every state of the trimmed DFA ``d`` have infinitely many completions (can
    reach a cycle)? Cached on ``d`` (a regular operand shared by many differences)."""
    got = getattr(d, "_all_infinite", None)
    if got is None:
        got = d._all_infinite = _all_states_infinite_of(d)
    return bool(got)


def _all_states_infinite_of(d: Any) -> bool:
    n = d.trans.shape[0]
    if n == 0:
        return False
    on_cycle = _cyclic_states(d)
    if not on_cycle.any():
        return False
    # backward reachability to cycle states
    good = on_cycle.copy()
    changed = True
    while changed:
        nxt = good | ((d.trans >= 0) & good[np.maximum(d.trans, 0)]).any(axis=1)
        changed = bool((nxt != good).any())
        good = nxt
    return bool(good.all())


def _finite_language(d: Any) -> bool:
    """Is the language of the trimmed DFA ``d`` finite (no cycle among its states)? A
    compiled cycle search, else Kahn's peeling of states without predecessors (all of them
    go exactly when there is no cycle)."""
    got = getattr(d, "_cyclic", None)
    if got is not None:
        return not got.any()
    from structgen.grammar import _dfa_kernels as dk

    if dk.COMPILED:
        return bool(dk.acyclic(_c32(d.trans)))
    n = d.trans.shape[0]
    succ = _successors(d)
    indeg = np.bincount(np.fromiter((t for ts in succ for t in ts), dtype=np.int64), minlength=n).tolist()
    todo = [q for q in range(n) if indeg[q] == 0]
    peeled = 0
    while todo:
        q = todo.pop()
        peeled += 1
        for t in succ[q]:
            indeg[t] -= 1
            if indeg[t] == 0:
                todo.append(t)
    return peeled == n


def _successors(d: Any) -> list[list[int]]:
    """Per state of DFA ``d``, its distinct successor states in ascending order."""
    n = d.trans.shape[0]
    rows, cols = np.nonzero(d.trans >= 0)
    pairs = np.unique(rows.astype(np.int64) * n + d.trans[rows, cols])  # distinct (state, successor)
    bounds = np.searchsorted(pairs // n, np.arange(n + 1)).tolist()
    tgt = (pairs % n).tolist()
    return [tgt[bounds[q]:bounds[q + 1]] for q in range(n)]


def _cyclic_states(d: Any) -> np.ndarray:
    """States that lie on a cycle (strongly connected components); cached on ``d``."""
    got = getattr(d, "_cyclic", None)
    if got is not None:
        return got
    n = d.trans.shape[0]
    succ = _successors(d)
    comps = strongly_connected_components(list(range(n)), dict(enumerate(succ)))
    out = np.zeros(n, dtype=bool)
    for comp in comps:
        if len(comp) > 1 or comp[0] in succ[comp[0]]:
            out[list(comp)] = True
    d._cyclic = out
    return out


class CompiledGrammar:
    """An immutable compiled grammar: lazily determinised rules plus the root rule's index.

    Equality and hashing are by content (a SHA-256 of the source IR and options), so
    equal grammars compiled twice are interchangeable. Runtime tables built while
    matching are shared by every matcher of this grammar (thread-safe).
    """

    def __init__(self, rules: tuple[LazyRule | DfaRule | ProductRule, ...], root: int, key: str | None,
                 source: ir.Grammar | None = None, options: CompileOptions | None = None) -> None:
        self._rules = rules
        self._root = root
        self._key = key  # None: computed from ``source`` and ``options`` when first asked for
        self._options = options
        self._source = source
        self._engine: Any = None
        self._engine_lock = threading.Lock()
        self.metadata: dict[str, Any] = {}

    # -- identity ---------------------------------------------------------
    @property
    def rules(self) -> tuple[LazyRule | DfaRule | ProductRule, ...]:
        return self._rules

    @property
    def root(self) -> int:
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

    def __getstate__(self) -> dict[str, Any]:
        return {"rules": self._rules, "root": self._root, "key": self.key,
                "source": self._source, "metadata": self.metadata}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["rules"], state["root"], state["key"], state["source"])  # type: ignore[misc]
        self.metadata = state.get("metadata", {})

    # -- runtime ------------------------------------------------------------
    @property
    def engine(self) -> Any:
        """The shared byte-level runtime (:class:`structgen.grammar.runtime.Runtime`), built on
        first use; token masks hang off it (:func:`structgen.masks.engine.engine_for`)."""
        eng = self._engine
        if eng is None:
            with self._engine_lock:
                if self._engine is None:
                    from structgen.grammar.runtime import Runtime
                    self._engine = Runtime(self)
                eng = self._engine
        return eng

    def accepts(self, data: bytes | str) -> bool:
        """Is ``data`` (bytes, or str encoded as UTF-8) a complete sentence of the grammar?"""
        if isinstance(data, str):
            data = data.encode("utf-8")
        return self.engine.run_from_start(data)[1]

    def accepts_prefix(self, data: bytes | str) -> bool:
        """Can ``data`` be extended to a sentence of the grammar (a viable prefix)?"""
        if isinstance(data, str):
            data = data.encode("utf-8")
        return self.engine.run_from_start(data)[0]


# ---------------------------------------------------------------------------
# Compilation entry point (with content cache)
# ---------------------------------------------------------------------------

_CACHE: OrderedDict[tuple, CompiledGrammar] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 256
_INLINE_SHARED_MAX = 48   # a rule referenced more than once is inlined only up to this size
_INLINE_MAX = 20_000      # no rule is inlined above this size
_MINIMISE_MIN = 256       # regular sub-automata above this size are minimised
_MINIMISE_SKIP_MIN = 8192  # ... unless above this size with almost no two states alike (see _nearly_distinct)
_SHARE_MIN = 24           # repeated sub-expressions of at least this size become shared rules
_COUNTED_MIN = 256        # a bounded repetition of a closed item unrolling to more becomes counted
_EMBED_MAX = 12           # regular sub-automata up to this many states are copied, not called
_DFA_RULES_SIZE = 1024    # process-wide caches of regular sub-automata (by IR content)
_KERNEL_STEPS_PER_S = 1e8  # work units per second of the compiled DFA kernels (measured ~1.2e8)
_REGULAR: OrderedDict[ir.Expr, Any] = OrderedDict()
_DFA_RULES: OrderedDict[ir.Expr, DfaRule] = OrderedDict()
_NO_CALLS: set[str] = set()  # sentinel for ``keep`` while building regular operands


def grammar_key(grammar: ir.Grammar, options: CompileOptions) -> str:
    h = hashlib.sha256()
    h.update(repr(options).encode())
    h.update(grammar.start.encode())
    for name in sorted(grammar.rules):
        h.update(b"\x00" + name.encode() + b"\x01" + grammar.rules[name].fingerprint())
    return h.hexdigest()


def compile_grammar(grammar: ir.Grammar, options: CompileOptions | None = None, *,
                    deadline: float | None = None) -> CompiledGrammar:
    """Compile an IR grammar (cached by content; compiled grammars are shared).

    ``deadline`` (a ``time.monotonic()`` value) replaces ``options.timeout_s`` counted from
    now, so a front-end can charge its own lowering time to the same budget.
    Raises :class:`GrammarError` (undefined rule, left recursion, non-regular operand of
    And/Diff, empty language), :class:`CompileLimitError` or :class:`CompileTimeoutError`
    (the timeout names the rule being built when it fired).
    """
    if not isinstance(grammar, ir.Grammar):
        raise TypeError(f"compile_grammar takes an IR Grammar, not {type(grammar).__name__}; "
                        "use compile_lark, compile_json_schema or compile_regex for source text")
    options = options or CompileOptions()
    # in-process key: the IR itself (nodes hash structurally with cached hashes and compare
    # deeply only on a hit), not the SHA-256 fingerprint, which walks every node once more
    key = (repr(options), grammar.start, tuple(sorted(grammar.rules.items(), key=lambda kv: kv[0])))
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    with gc_paused():
        try:
            cg = _Compiler(grammar, options, deadline).compile()
        except RecursionError:
            # the IR passes recurse over expression nesting; front-ends bound it, but an IR
            # built by hand may nest arbitrarily deep
            raise CompileLimitError("grammar expression nested too deeply to compile") from None
    with _CACHE_LOCK:
        _CACHE[key] = cg
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return cg


# ---------------------------------------------------------------------------
# IR analysis helpers
# ---------------------------------------------------------------------------

_NATIVE_READY = False


def native_ready() -> float:
    """Load the compiled DFA kernels once per process (a no-op without numba); returns the
    seconds it took (0 once loaded), which a compile adds to its deadline: loading code is
    a cost of the process, not of the grammar being compiled."""
    global _NATIVE_READY
    if _NATIVE_READY:
        return 0.0
    t0 = time.monotonic()
    from structgen.grammar import _dfa_kernels

    if _dfa_kernels.COMPILED:
        _dfa_kernels.warm()
    _NATIVE_READY = True
    return time.monotonic() - t0


def _merge_equal_rules(start: str, reach: set[str], rules: dict[str, ir.Expr],
                       origin: dict[str, str]) -> bool:
    """Merge reachable rules with structurally equal bodies into one (references to the
    others are renamed; repeated while merging makes more bodies equal). ``reach`` and
    ``rules`` are updated in place; returns whether anything was merged."""
    merged = False
    for _ in range(8):
        canon: dict[ir.Expr, str] = {}
        alias: dict[str, str] = {}
        for n in [start] + sorted(reach - {start}):
            c = canon.setdefault(rules[n], n)
            if c != n:
                alias[n] = c
        if not alias:
            break
        merged = True
        for n, c in alias.items():
            reach.discard(n)
            origin.setdefault(c, origin.get(n, n))
        memo: dict[int, ir.Expr] = {}
        for n in reach:
            rules[n] = _rename_refs(rules[n], alias, memo)
    return merged


def _rename_refs(e: ir.Expr, alias: dict[str, str], memo: dict[int, ir.Expr]) -> ir.Expr:
    """``e`` with every ``Ref(a)`` for ``a`` in ``alias`` replaced by ``Ref(alias[a])``."""
    got = memo.get(id(e))
    if got is not None:
        return got
    out: ir.Expr = e
    if alias.keys().isdisjoint(e.refs()):
        pass  # nothing to rename below
    elif isinstance(e, ir.Ref):
        if e.name in alias:
            out = ir.Ref(alias[e.name])
    elif isinstance(e, (ir.Seq, ir.Alt)):
        items = tuple(_rename_refs(x, alias, memo) for x in e.items)
        if any(a is not b for a, b in zip(items, e.items)):
            out = type(e)(items)
    elif isinstance(e, ir.Repeat):
        item = _rename_refs(e.item, alias, memo)
        if item is not e.item:
            out = ir.Repeat(item, e.min, e.max)
    elif isinstance(e, (ir.And, ir.Diff)):
        left, right = _rename_refs(e.left, alias, memo), _rename_refs(e.right, alias, memo)
        if left is not e.left or right is not e.right:
            out = type(e)(left, right)
    memo[id(e)] = out
    return out


def _closed(e: ir.Expr) -> bool:
    """No rule references inside ``e`` (its automaton depends on nothing else)."""
    return not e.refs()


def _refs(e: ir.Expr, out: set[str]) -> None:
    out |= e.refs()


def _size(e: ir.Expr) -> int:
    """Rough NFA size of an expression (for inlining decisions), cached on the node (a pure
    function of its structure: equal expressions have one size; no dictionary lookup that
    would compare equal but distinct expressions deeply)."""
    try:
        return e._sz  # type: ignore[attr-defined,no-any-return]
    except AttributeError:
        pass
    # post-order over the DAG without recursion: children first, each node once
    stack: list[tuple[ir.Expr, bool]] = [(e, False)]
    while stack:
        x, done = stack.pop()
        if hasattr(x, "_sz"):
            continue
        if isinstance(x, _Counted):
            kids: tuple[ir.Expr, ...] = ()
        elif isinstance(x, (ir.Seq, ir.Alt)):
            kids = x.items
        elif isinstance(x, ir.Repeat):
            kids = (x.item,)
        elif isinstance(x, (ir.And, ir.Diff)):
            kids = (x.left, x.right)
        else:
            kids = ()
        if not done and any(not hasattr(k, "_sz") for k in kids):
            stack.append((x, True))
            stack.extend((k, False) for k in kids if not hasattr(k, "_sz"))
            continue
        if isinstance(x, _Counted):
            s = 2  # a call of its counted rule
        elif isinstance(x, (ir.Seq, ir.Alt)):
            s = 1 + sum(k._sz for k in kids)  # type: ignore[attr-defined]
        elif isinstance(x, ir.Repeat):
            reps = x.max if x.max is not None else max(x.min, 1)
            s = 1 + x.item._sz * max(1, min(reps, 10_000))  # type: ignore[attr-defined]
        elif isinstance(x, (ir.And, ir.Diff)):
            s = 1 + x.left._sz * x.right._sz  # type: ignore[attr-defined]
        elif isinstance(x, ir.Dfa):
            s = len(x.trans)
        else:
            s = 1
        object.__setattr__(x, "_sz", s)
    return e._sz  # type: ignore[attr-defined,no-any-return]


def _eliminate_immediate_left_recursion(name: str, e: ir.Expr) -> ir.Expr:
    branches = e.items if isinstance(e, ir.Alt) else (e,)
    rec: list[ir.Expr] = []
    base: list[ir.Expr] = []
    for b in branches:
        items = b.items if isinstance(b, ir.Seq) else (b,)
        if items and items[0] == ir.Ref(name):
            tail = ir.seq(*items[1:])
            if tail != ir.EMPTY:  # A -> A alone adds nothing
                rec.append(tail)
        else:
            base.append(b)
    if not rec:
        return e
    return ir.seq(ir.alt(*base), ir.star(ir.alt(*rec)))


# ---------------------------------------------------------------------------
# NFA
# ---------------------------------------------------------------------------

class _Nfa:
    __slots__ = ("eps", "edges", "calls")

    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int, int]]] = []
        self.calls: list[list[tuple[int, int]]] = []

    def new(self) -> int:
        self.eps.append([])
        self.edges.append([])
        self.calls.append([])
        return len(self.eps) - 1

    def __len__(self) -> int:
        return len(self.eps)


@dataclass
class _Dfa:
    """Intermediate DFA over bytes: trans [n, 256] int32 (-1 dead), accept [n], calls."""

    trans: np.ndarray
    accept: np.ndarray
    calls: list[tuple[tuple[int, int], ...]]


_BuildNode = Generator[tuple[ir.Expr, int, tuple[str, ...]], int, int]  # see _Compiler._build_node


class _Compiler:
    def __init__(self, grammar: ir.Grammar, options: CompileOptions, deadline: float | None = None) -> None:
        self.g = grammar
        self.opt = options
        self.deadline = time.monotonic() + options.timeout_s if deadline is None else deadline
        self.where = ""  # the rule being worked on, named by a timeout
        self.total_states = 0
        self.rule_index: dict[str, int] = {}
        self.kept: list[str] = []
        self.exprs: dict[str, ir.Expr] = {}
        self._regular_cache: dict[ir.Expr, _Dfa] = {}
        self._hoist_done: dict[int, tuple[ir.Expr, ir.Expr]] = {}
        self.dfa_rules: list[DfaRule | ProductRule | CountedRule] = []
        self._prefix_free: dict[ir.Expr, bool] = {}
        self.dfa_rule_index: dict[ir.Expr, int] = {}
        self.keep: set[str] = set()
        self.origin: dict[str, str] = {}  # synthetic rule -> the source rule it came from
        self._hoist_owner = ""
        self._tick = 0
        self._regular_stack: list[ir.Expr] = []  # And/Diff being built (errors name them)
        # the first intersection/difference that finished past the deadline, and its rule:
        # what a later timeout names (the time went there, the check came after)
        self._late: tuple[str, tuple[ir.Expr, ...]] | None = None

    def _located(self, err: CompileLimitError, rule: str | None = None,
                 exprs: tuple[ir.Expr, ...] | None = None) -> CompileLimitError:
        """Attach where compilation was (the rule, the regular sub-expressions being built,
        the rules kept as calls) so that a front-end can map the error to its source."""
        name = rule if rule is not None else self.where
        err.rule = self.origin.get(name, name) or None
        err.ir_exprs = tuple(self._regular_stack) if exprs is None else exprs
        err.ir_calls = frozenset(self.keep)
        return err

    # -- limits ---------------------------------------------------------------
    def check_time(self) -> None:
        self._tick += 1
        if self._tick & 255 == 0 and time.monotonic() > self.deadline:
            name, exprs = self.where, None
            if not self._regular_stack and self._late is not None:
                name, exprs = self._late
            at = f" while building rule {self.origin.get(name, name)!r}" if name else ""
            raise self._located(CompileTimeoutError(
                f"grammar compilation exceeded its time limit of {self.opt.timeout_s:g} s{at} "
                "(CompileOptions.timeout_s)"), name, exprs)

    def check_time_now(self) -> None:
        """:meth:`check_time` without its call-count stride (for coarse loops)."""
        self._tick |= 255
        self.check_time()

    def dfa_kernels(self) -> Any:
        """:mod:`structgen.grammar._dfa_kernels`, loaded (the loading time extends the deadline)."""
        self.deadline += native_ready()
        from structgen.grammar import _dfa_kernels

        return _dfa_kernels

    def work_budget(self) -> int:
        """Inner steps a compiled DFA kernel may take before the deadline (a conservative
        rate; the kernel stops with OUT_OF_TIME past it)."""
        return int(max(self.deadline - time.monotonic(), 0.0) * _KERNEL_STEPS_PER_S) + 1000

    def kernel_status(self, status: int, what: str) -> None:
        """Raise for a DFA kernel's LIMIT / OUT_OF_TIME status."""
        from structgen.grammar import _dfa_kernels as dk

        if status == dk.LIMIT:
            at = f" in rule {self.origin.get(self.where, self.where)!r}" if self.where else ""
            raise self._located(CompileLimitError(
                f"{what} automaton exceeds {self.opt.max_states} states{at} (CompileOptions.max_states)"))
        if status == dk.OUT_OF_TIME:
            self.deadline = min(self.deadline, time.monotonic())
            self.check_time_now()

    def count_states(self, n: int, what: str) -> None:
        self.total_states += n
        if self.total_states > self.opt.max_states:
            raise self._located(CompileLimitError(
                f"grammar automaton exceeds {self.opt.max_states} states while building {what} "
                "(CompileOptions.max_states)"))

    # -- driver ---------------------------------------------------------------
    def compile(self) -> CompiledGrammar:
        g = self.g
        if len(g.rules) > self.opt.max_rules:
            raise CompileLimitError(f"grammar has {len(g.rules)} rules, more than "
                                    f"CompileOptions.max_rules={self.opt.max_rules}")
        rules = {n: _eliminate_immediate_left_recursion(n, e) for n, e in g.rules.items()}
        refs: dict[str, set[str]] = {}
        for n, e in rules.items():
            s: set[str] = set()
            _refs(e, s)
            for r in s:
                if r not in rules:
                    raise GrammarError(f"rule {n!r} refers to undefined rule {r!r}")
            refs[n] = s
        # reachable rules from start
        reach = reachable(g.start, refs.__getitem__)
        recursive: set[str] = set()
        for comp in strongly_connected_components(sorted(reach), refs):
            if len(comp) > 1 or comp[0] in refs[comp[0]]:
                recursive.update(comp)
        # big repetitions of big items: hoist the item into a rule of its own (a call), so
        # that {m,n} unrolls calls rather than copies of a large automaton
        hoisted: dict[ir.Expr, str] = {}
        for n in sorted(reach):
            self._hoist_owner = self.where = n
            rules[n] = self._hoist(rules[n], hoisted, rules)
        # shared sub-expressions (a JSON string value, a number, an object shape used by
        # several properties): one synthetic rule each, called from every place, so the
        # automaton is not copied and runtime mask caches per rule state are shared
        self._share_common(sorted(reach), rules, hoisted)
        for name in hoisted.values():
            reach.add(name)
            refs[name] = set()
            _refs(rules[name], refs[name])
        # rules with equal bodies (the same string type under many property names) become
        # one rule: one automaton, and one set of runtime mask caches for all of them
        if _merge_equal_rules(g.start, reach, rules, self.origin):
            for n in reach:
                refs[n] = set()
                _refs(rules[n], refs[n])
            recursive = set()
            for comp in strongly_connected_components(sorted(reach), refs):
                if len(comp) > 1 or comp[0] in refs[comp[0]]:
                    recursive.update(comp)
        # decide which non-recursive rules stay as calls: bottom-up, a rule used once is
        # inlined unless huge, a shared rule only while small (rules are determinised lazily,
        # so copies buy nothing at run time and cost NFA size at compile time)
        uses: dict[str, int] = {n: 0 for n in reach}
        for n in reach:
            counter: dict[str, int] = {}
            self._count_refs(rules[n], counter)
            for r, c in counter.items():
                uses[r] += c
        keep = {g.start} | recursive
        full: dict[str, int] = {}
        # children first: Tarjan emits a component after everything it reaches
        order = [c for comp in strongly_connected_components(sorted(reach), refs) for c in comp]
        for n in order:
            if n in recursive:
                full[n] = 1
                continue
            own = _size(rules[n])
            inl = sum(full.get(r, 1) for r in refs[n] if r not in keep)
            full[n] = own + inl
            if n != g.start and ((uses[n] > 1 and full[n] > _INLINE_SHARED_MAX)
                                 or full[n] > _INLINE_MAX):
                keep.add(n)
                full[n] = 1
        self.kept = [g.start] + sorted(keep - {g.start})
        self.rule_index = {n: i for i, n in enumerate(self.kept)}
        self.exprs = rules
        self.recursive = recursive
        self.keep = keep

        built: list[tuple[_Nfa, int]] = []
        total = 0
        for n in self.kept:
            self.where = n
            nfa = _Nfa()
            start = nfa.new()
            assert start == 0
            end = self._build(nfa, rules[n], start, inline_stack=(n,))
            total += len(nfa)
            built.append((nfa, end))
            if total > self.opt.max_states:
                # name the biggest rule so far (and the source rule it came from)
                big = max(range(len(built)), key=lambda i: len(built[i][0]))
                name = self.kept[big]
                raise self._located(CompileLimitError(
                    f"grammar automaton exceeds {self.opt.max_states} NFA states in rule "
                    f"{self.origin.get(name, name)!r} (CompileOptions.max_states)"), name)
        # whole-grammar passes: a timeout names the biggest rule
        self.where = self.kept[max(range(len(built)), key=lambda i: len(built[i][0]))] if built else ""
        trimmed = self._trim_nfas(built)
        self._check_left_recursion_nfa(trimmed)
        out: list[LazyRule | DfaRule | ProductRule] = [
            _lazy_rule(n, nfa, end) for n, (nfa, end) in zip(self.kept, trimmed)]
        out.extend(self.dfa_rules)
        return CompiledGrammar(tuple(out), 0, None, source=self.g, options=self.opt)

    # -- NFA-level trimming and checks ------------------------------------------------
    def _trim_nfas(self, built: list[tuple[_Nfa, int]]) -> list[tuple[_Nfa, int]]:
        """Keep only NFA states that can reach their rule's end (through byte edges,
        epsilons and calls to rules whose language is non-empty); drop edges into the rest.
        A fixpoint over rules decides which languages are non-empty."""
        preds: list[list[list[int]]] = []
        call_preds: list[list[list[tuple[int, int]]]] = []
        for nfa, _end in built:
            self.check_time()
            n = len(nfa)
            pr: list[list[int]] = [[] for _ in range(n)]
            cp: list[list[tuple[int, int]]] = [[] for _ in range(n)]
            for x in range(n):
                for t in nfa.eps[x]:
                    pr[t].append(x)
                for _lo, _hi, t in nfa.edges[x]:
                    pr[t].append(x)
                for r, t in nfa.calls[x]:
                    cp[t].append((x, r))
            preds.append(pr)
            call_preds.append(cp)
        # shared DFA rules are trimmed and non-empty by construction
        nonempty = [False] * len(built) + [True] * len(self.dfa_rules)
        good: list[list[bool]] = [[] for _ in built]
        callees = [{r for ps in cp for _x, r in ps} for cp in call_preds]
        fresh = [True] * len(built)  # some callee became non-empty since the last pass
        changed = True
        while changed:
            changed = False
            for i, (nfa, end) in enumerate(built):
                if not fresh[i]:
                    continue
                fresh[i] = False
                self.check_time()
                g = [False] * len(nfa)
                g[end] = True
                stack = [end]
                pr, cp = preds[i], call_preds[i]
                while stack:
                    y = stack.pop()
                    for x in pr[y]:
                        if not g[x]:
                            g[x] = True
                            stack.append(x)
                    for x, r in cp[y]:
                        if nonempty[r] and not g[x]:
                            g[x] = True
                            stack.append(x)
                good[i] = g
                if g[0] and not nonempty[i]:
                    nonempty[i] = True
                    changed = True
                    for j, cs in enumerate(callees):
                        if i in cs:
                            fresh[j] = True
        if not nonempty[0]:
            raise GrammarError(f"the grammar accepts no string at all (start rule {self.kept[0]!r})")
        out: list[tuple[_Nfa, int]] = []
        for i, (nfa, end) in enumerate(built):
            g = good[i]
            if all(g) and all(nonempty[r] for r in callees[i]):
                out.append((nfa, end))  # nothing to drop
                continue
            t = _Nfa()
            t.eps = [[y for y in ys if g[y]] if g[x] else [] for x, ys in enumerate(nfa.eps)]
            t.edges = [[e for e in es if g[e[2]]] if g[x] else [] for x, es in enumerate(nfa.edges)]
            t.calls = [[(r, y) for r, y in cs if nonempty[r] and g[y]] if g[x] else []
                       for x, cs in enumerate(nfa.calls)]
            out.append((t, end))
        return out

    def _check_left_recursion_nfa(self, built: list[tuple[_Nfa, int]]) -> None:
        """Reject left recursion (a rule that can call itself before consuming a byte)."""
        def reach(nfa: _Nfa, nullable: list[bool]) -> tuple[set[int], set[int]]:
            seen = {0}
            stack = [0]
            callees: set[int] = set()
            while stack:
                x = stack.pop()
                nxt = list(nfa.eps[x])
                for r, t in nfa.calls[x]:
                    callees.add(r)
                    if nullable[r]:
                        nxt.append(t)
                for y in nxt:
                    if y not in seen:
                        seen.add(y)
                        stack.append(y)
            return seen, callees

        nullable = [False] * len(built) + [bool(r.info(0)[1]) for r in self.dfa_rules]
        names = self.kept + [r.name for r in self.dfa_rules]
        changed = True
        while changed:
            changed = False
            for i, (nfa, end) in enumerate(built):
                if not nullable[i] and end in reach(nfa, nullable)[0]:
                    nullable[i] = True
                    changed = True
        left = {self.kept[i]: {names[r] for r in reach(nfa, nullable)[1]}
                for i, (nfa, _end) in enumerate(built)}
        for r in self.dfa_rules:
            left[r.name] = set()
        for comp in strongly_connected_components(names, left):
            if len(comp) > 1 or comp[0] in left[comp[0]]:
                raise GrammarError(
                    "left recursion through rule(s) " + " -> ".join(sorted(comp))
                    + "; rewrite it as repetition (e.g. A: A x | y  =>  A: y x*)")

    def _hoist(self, e: ir.Expr, hoisted: dict[ir.Expr, str], rules: dict[str, ir.Expr]) -> ir.Expr:
        """Replace the item of a large repetition with a call to a synthetic rule (each node
        of the expression DAG visited once: results are kept by node, with the node)."""
        got = self._hoist_done.get(id(e))
        if got is not None:
            return got[1]
        out = self._hoist_node(e, hoisted, rules)
        self._hoist_done[id(e)] = (e, out)
        return out

    def _hoist_node(self, e: ir.Expr, hoisted: dict[ir.Expr, str], rules: dict[str, ir.Expr]) -> ir.Expr:
        if isinstance(e, ir.Repeat):
            if self._countable(e):
                return _Counted(e.item, e.min, e.max)
            item = self._hoist(e.item, hoisted, rules)
            reps = e.max if e.max is not None else max(e.min, 1)
            if reps > 2 and _size(item) * reps > 2000 and not isinstance(item, ir.Ref):
                name = hoisted.get(item)
                if name is None:
                    name = _hoisted_name("__rep", item, hoisted, rules)
                    rules[name] = item
                    self.origin[name] = self.origin.get(self._hoist_owner, self._hoist_owner)
                item = ir.Ref(name)
            return ir.Repeat(item, e.min, e.max) if item is not e.item else e
        if isinstance(e, (ir.Seq, ir.Alt)):
            items = tuple(self._hoist(x, hoisted, rules) for x in e.items)
            if all(a is b for a, b in zip(items, e.items)):
                return e
            return type(e)(items)
        return e  # And/Diff operands stay regular (they are inlined in full anyway)

    def _countable(self, e: ir.Repeat) -> bool:
        """Should bounded repetition ``e`` become a :class:`CountedRule`? Its item must be
        closed (no rule references) and prefix-free, and the unrolled repetition large."""
        if isinstance(e, _Counted):
            return True
        if e.max is None or e.max < 2 or not _closed(e.item) or _size(e.item) * e.max <= _COUNTED_MIN:
            return False
        got = self._prefix_free.get(e.item)
        if got is None:
            saved = self.where
            try:
                d = self._regular_operand(e.item, (self._hoist_owner or self.g.start,))
            finally:
                self.where = saved
            edges = (d.trans >= 0).any(axis=1)
            got = bool(d.trans.shape[0] > 0 and not d.accept[0] and not (d.accept & edges).any()
                       and d.accept.any())
            self._prefix_free[e.item] = got
        return got

    def _counted_rule(self, e: _Counted) -> int:
        """Index of the (per-grammar) :class:`CountedRule` for ``e``."""
        j = self.dfa_rule_index.get(e)
        if j is None:
            d = self._regular_operand(e.item, (self.where or self.g.start,))
            j = len(self.kept) + len(self.dfa_rules)
            self.dfa_rule_index[e] = j
            self.dfa_rules.append(CountedRule(f"__cnt{j}", d.trans, d.accept, e.min,  # type: ignore[arg-type]
                                              e.max))
        return j

    def _share_common(self, names: list[str], rules: dict[str, ir.Expr],
                      hoisted: dict[ir.Expr, str]) -> None:
        """Hoist sub-expressions of size >= ``_SHARE_MIN`` that occur more than once."""
        count: dict[ir.Expr, int] = {}
        stack = [rules[n] for n in names]
        seen_ids: set[int] = set()
        while stack:
            x = stack.pop()
            if isinstance(x, (ir.Seq, ir.Alt, ir.Repeat)) and _size(x) >= _SHARE_MIN:
                if isinstance(x, _Counted):
                    count[x] = count.get(x, 0) + 1
                    continue  # its item is built once, as the counted rule's table
                c = count.get(x, 0)
                count[x] = c + 1
                if c or id(x) in seen_ids:
                    continue  # children already counted for this content
                seen_ids.add(id(x))
                stack.extend(x.items if isinstance(x, (ir.Seq, ir.Alt)) else (x.item,))
        shared = {x for x, c in count.items() if c > 1}
        if not shared:
            return
        done: dict[int, ir.Expr] = {}
        owner = [""]

        def rewrite(e: ir.Expr, top: bool) -> ir.Expr:
            got = done.get(id(e))
            if got is not None and not top:
                return got
            if not top and e in shared:
                name = hoisted.get(e)
                if name is None:
                    name = _hoisted_name("__cse", e, hoisted, rules)
                    self.origin[name] = owner[0]
                    rules[name] = rewrite(e, True)
                out: ir.Expr = ir.Ref(name)
            elif isinstance(e, (ir.Seq, ir.Alt)):
                items = tuple(rewrite(x, False) for x in e.items)
                out = e if all(a is b for a, b in zip(items, e.items)) else type(e)(items)
            elif isinstance(e, _Counted):
                out = e
            elif isinstance(e, ir.Repeat):
                item = rewrite(e.item, False)
                out = e if item is e.item else ir.Repeat(item, e.min, e.max)
            else:
                out = e
            if not top:
                done[id(e)] = out
            return out

        for n in names:
            owner[0] = self.origin.get(n, n)
            rules[n] = rewrite(rules[n], True)

    def _count_refs(self, e: ir.Expr, counter: dict[str, int]) -> None:
        stack = [e]
        while stack:
            x = stack.pop()
            if not x.refs():
                continue  # (cached per node) nothing to count below
            if isinstance(x, ir.Ref):
                counter[x.name] = counter.get(x.name, 0) + 1
            elif isinstance(x, (ir.Seq, ir.Alt)):
                stack.extend(x.items)
            elif isinstance(x, ir.Repeat):
                k = x.max if x.max is not None else max(x.min, 1)
                for _ in range(min(k, 2)):
                    stack.append(x.item)
            elif isinstance(x, (ir.And, ir.Diff)):
                stack.append(x.left)
                stack.append(x.right)

    # -- Thompson construction -------------------------------------------------
    def _build(self, nfa: _Nfa, e: ir.Expr, s: int, inline_stack: tuple[str, ...]) -> int:
        """Add ``e`` to ``nfa`` starting at state ``s``; return its end state.

        Iterative: each node is a generator (:meth:`_build_node`) that yields the
        sub-expressions it needs built and receives their end states, driven from an
        explicit stack, so a deep expression (a chain of thousands of inlined rules, one per
        required property, say) costs heap, not Python stack."""
        stack = [self._build_node(nfa, e, s, inline_stack)]
        result: int | None = None
        error: BaseException | None = None
        while stack:
            gen = stack[-1]
            try:
                if error is not None:
                    req = gen.throw(error)
                    error = None
                else:
                    req = gen.send(result)
            except StopIteration as stop:
                stack.pop()
                result = stop.value
                continue
            except BaseException as exc:  # unwinds the generators below, running their finally blocks
                stack.pop()
                if not stack:
                    raise
                error = exc
                continue
            sub, start, where = req
            if isinstance(sub, ir.ByteSet):  # the common leaf, without a generator
                t = nfa.new()
                for lo, hi in sub.ranges:
                    nfa.edges[start].append((lo, hi, t))
                result = t
                continue
            stack.append(self._build_node(nfa, sub, start, where))
            result = None
        assert result is not None
        return result

    def _build_node(self, nfa: _Nfa, e: ir.Expr, s: int, inline_stack: tuple[str, ...]) -> _BuildNode:
        """One node of :meth:`_build`: ``yield (sub, start, inline_stack)`` asks for ``sub``
        to be built from ``start`` and evaluates to its end state."""
        self.check_time()
        if len(nfa) > self.opt.max_states:
            raise self._located(CompileLimitError(
                f"grammar automaton exceeds {self.opt.max_states} NFA states in rule "
                f"{self.origin.get(inline_stack[0], inline_stack[0])!r} (CompileOptions.max_states)"),
                inline_stack[0])
        if isinstance(e, ir.ByteSet):
            t = nfa.new()
            for lo, hi in e.ranges:
                nfa.edges[s].append((lo, hi, t))
            return t
        if isinstance(e, ir.Seq):
            cur = s
            for it in e.items:
                cur = yield (it, cur, inline_stack)
            return cur
        if isinstance(e, ir.Alt):
            t = nfa.new()
            if not e.items:
                return t  # unreachable end: empty language
            for it in e.items:
                b = nfa.new()
                nfa.eps[s].append(b)
                end = yield (it, b, inline_stack)
                nfa.eps[end].append(t)
            return t
        if isinstance(e, _Counted) and self.keep is not _NO_CALLS:
            t = nfa.new()
            nfa.calls[s].append((self._counted_rule(e), t))
            return t
        if isinstance(e, ir.Repeat):
            cur = s
            for _ in range(e.min):
                cur = yield (e.item, cur, inline_stack)
            if e.max is None:
                # cur -> loop: item* via a hub state
                hub = nfa.new()
                nfa.eps[cur].append(hub)
                b = nfa.new()
                nfa.eps[hub].append(b)
                end = yield (e.item, b, inline_stack)
                nfa.eps[end].append(hub)
                return hub
            k = e.max - e.min
            if k == 0:
                return cur
            t = nfa.new()
            for _ in range(k):
                nfa.eps[cur].append(t)
                cur = yield (e.item, cur, inline_stack)
            nfa.eps[cur].append(t)
            return t
        if isinstance(e, ir.Ref):
            name = e.name
            if name in self.keep:
                t = nfa.new()
                nfa.calls[s].append((self.rule_index[name], t))
                return t
            if name in inline_stack:  # defensive; recursive rules are kept
                raise GrammarError(f"unexpected recursion through rule {name!r}")
            outer, self.where = self.where, name  # an inlined rule: a timeout names it
            try:
                return (yield (self.exprs[name], s, inline_stack + (name,)))
            finally:
                self.where = outer
        if isinstance(e, ir.Diff) and self.keep is not _NO_CALLS:
            lazy = self._lazy_diff(e, inline_stack)
            if lazy is not None:
                return lazy(nfa, s)  # type: ignore[no-any-return]
        if isinstance(e, (ir.And, ir.Diff, ir.Dfa)):
            d = self._regular(e, inline_stack)
            if d.trans.shape[0] <= _EMBED_MAX or self.keep is _NO_CALLS:
                return _embed(nfa, d, s)
            t = nfa.new()
            if bool(d.accept.any()):  # an empty language leaves ``t`` unreachable
                nfa.calls[s].append((self._dfa_rule(e, d), t))
            return t
        raise GrammarError(f"unknown IR node {type(e).__name__}")

    # -- regular sub-languages (And / Diff / Dfa) --------------------------------
    def _lazy_diff(self, e: ir.Diff, inline_stack: tuple[str, ...]) -> Any:
        """``A - B`` without building the product, when that is exact: ``B`` finite and
        every live state of ``A`` has infinitely many completions. Then every live pair
        state can still complete outside ``B`` (finitely many strings cannot cover an
        infinite set), so the product needs no trimming and is explored lazily at run
        time by a :class:`ProductRule`. Returns a function adding the call, or None."""
        j = self.dfa_rule_index.get(e)
        if j is not None and isinstance(self.dfa_rules[j - len(self.kept)], ProductRule):
            return self._call_adder(j)  # the same difference elsewhere in the grammar
        self._regular_stack.append(e)
        try:
            a = self._regular_operand(e.left, inline_stack)
            if not _all_states_infinite(a):
                return None
            b = self._regular_operand(e.right, inline_stack)
            if not _finite_language(b):
                return None
        finally:
            self._regular_stack.pop()
        j = self.dfa_rule_index.get(e)
        if j is None:
            j = len(self.kept) + len(self.dfa_rules)
            self.dfa_rule_index[e] = j
            self.dfa_rules.append(ProductRule(f"__diff{j}", a, b))  # type: ignore[arg-type]
        return self._call_adder(j)

    @staticmethod
    def _call_adder(j: int) -> Callable[[_Nfa, int], int]:
        """A function adding a call of rule ``j`` after a state (returns the new end state)."""
        def add(nfa: _Nfa, s: int) -> int:
            t = nfa.new()
            nfa.calls[s].append((j, t))
            return t
        return add

    def _dfa_rule(self, e: ir.Expr, d: _Dfa) -> int:
        """Index of the (shared) :class:`DfaRule` for regular sub-expression ``e``."""
        j = self.dfa_rule_index.get(e)
        if j is None:
            with _CACHE_LOCK:
                rule = _DFA_RULES.get(e)
                if rule is None:
                    rule = DfaRule(f"__dfa{len(_DFA_RULES)}", d.trans, d.accept)
                    _DFA_RULES[e] = rule
                    while len(_DFA_RULES) > _DFA_RULES_SIZE:
                        _DFA_RULES.popitem(last=False)
                else:
                    _DFA_RULES.move_to_end(e)
            j = len(self.kept) + len(self.dfa_rules)
            self.dfa_rule_index[e] = j
            self.dfa_rules.append(rule)
        return j

    def _regular(self, e: ir.Expr, inline_stack: tuple[str, ...]) -> _Dfa:
        got = self._regular_cache.get(e)
        if got is not None:
            return got
        shareable = _closed(e)
        if shareable:
            with _CACHE_LOCK:
                got = _REGULAR.get(e)
                if got is not None:
                    _REGULAR.move_to_end(e)
            if got is not None:
                self._regular_cache[e] = got
                return got
        if isinstance(e, ir.Dfa):
            self.dfa_kernels()
            n = len(e.trans)
            trans = np.full((n, 256), -1, dtype=np.int32)
            for q, edges in enumerate(e.trans):
                for lo, hi, t in edges:
                    trans[q, lo:hi + 1] = t
            acc = np.zeros(n, dtype=bool)
            acc[list(e.accept)] = True
            if e.start != 0:
                perm = [e.start] + [q for q in range(n) if q != e.start]
                inv = np.empty(n, dtype=np.int32)
                inv[perm] = np.arange(n, dtype=np.int32)
                trans = trans[perm]
                trans = np.where(trans >= 0, inv[np.maximum(trans, 0)], -1).astype(np.int32)
                acc = acc[perm]
            d = _trim_regular(_Dfa(trans, acc, [() for _ in range(n)]))
        else:
            assert isinstance(e, (ir.And, ir.Diff))
            self._regular_stack.append(e)
            try:
                left = self._regular_operand(e.left, inline_stack)
                right = self._regular_operand(e.right, inline_stack)
                d = self._product(left, right, "and" if isinstance(e, ir.And) else "diff")
                if self._late is None and time.monotonic() > self.deadline:
                    self._late = (self.where, tuple(self._regular_stack))
            finally:
                self._regular_stack.pop()
        self._regular_cache[e] = d
        if shareable:
            with _CACHE_LOCK:
                _REGULAR[e] = d
                while len(_REGULAR) > _DFA_RULES_SIZE:
                    _REGULAR.popitem(last=False)
        return d

    def _regular_operand(self, e: ir.Expr, inline_stack: tuple[str, ...]) -> _Dfa:
        if isinstance(e, (ir.And, ir.Diff, ir.Dfa)):
            return self._regular(e, inline_stack)
        got = self._regular_cache.get(e)
        if got is not None:
            return got
        shareable = _closed(e)
        if shareable:
            with _CACHE_LOCK:
                got = _REGULAR.get(e)
            if got is not None:
                self._regular_cache[e] = got
                return got
        nfa = _Nfa()
        start = nfa.new()
        saved_keep = self.keep
        # operands of And/Diff must be fully regular: inline every non-recursive rule
        self.keep = _NO_CALLS
        try:
            end = self._build_regular(nfa, e, start, inline_stack)
        finally:
            self.keep = saved_keep
        d = self._determinise(nfa, start, end, inline_stack[0])
        d = _trim_regular(d)
        if d.trans.shape[0] > _MINIMISE_MIN:
            d = _minimise(d, self.check_time_now)
        self._regular_cache[e] = d
        if shareable:
            with _CACHE_LOCK:
                _REGULAR[e] = d
                while len(_REGULAR) > _DFA_RULES_SIZE:
                    _REGULAR.popitem(last=False)
        return d

    def _build_regular(self, nfa: _Nfa, e: ir.Expr, s: int, inline_stack: tuple[str, ...]) -> int:
        refs: set[str] = set()
        _refs(e, refs)
        bad = sorted(r for r in refs if r in self.recursive)
        if bad:
            raise GrammarError(
                f"intersection/difference over a recursive rule ({', '.join(bad)}) cannot be "
                "compiled to a finite automaton")
        return self._build(nfa, e, s, inline_stack)

    def _product(self, a: _Dfa, b: _Dfa, op: str) -> _Dfa:
        """Product of two call-free DFAs (missing transitions = dead), explored from the
        start pair over the joint byte classes of both automata (compiled when numba is
        present), then trimmed and minimised."""
        dk = self.dfa_kernels()
        if dk.COMPILED:
            status, trans, acc = dk.product(_c32(a.trans), a.accept, _c32(b.trans), b.accept, op == "and",
                                            self.opt.max_states, self.work_budget())
            self.kernel_status(int(status), "intersection/difference")
            d = _trim_regular(_Dfa(trans, acc, [()] * trans.shape[0]))
            if d.trans.shape[0] > _MINIMISE_SKIP_MIN and _nearly_distinct(d):
                return d
            return _minimise(d, self.check_time_now) if d.trans.shape[0] > _MINIMISE_MIN else d
        # joint byte classes: bytes on which every state of both automata agrees
        joint = np.concatenate([a.trans, b.trans], axis=0)  # [na + nb, 256]
        # equal columns by row hashing of the transpose (a structured-array unique sorts
        # the whole matrix)
        _u, first, cls_of = np.unique(_row_classes(joint.T), return_index=True, return_inverse=True)
        cls_of = cls_of.reshape(-1)
        ta = a.trans[:, first].tolist()  # [na][nclass]
        tb = b.trans[:, first].tolist()  # [nb][nclass]
        nclass = len(first)
        dead_b = [-1] * nclass
        is_and = op == "and"
        ids: dict[tuple[int, int], int] = {(0, 0): 0}
        order = [(0, 0)]
        rows: list[list[int]] = []
        limit = self.opt.max_states
        i = 0
        while i < len(order):
            if i & 63 == 0:
                self.check_time()
            qa, qb = order[i]
            ra = ta[qa]
            rb = tb[qb] if qb >= 0 else dead_b
            row = [-1] * nclass
            for c in range(nclass):
                pa = ra[c]
                if pa < 0:
                    continue
                pb = rb[c]
                if is_and and pb < 0:
                    continue
                key = (pa, pb)
                j = ids.get(key)
                if j is None:
                    j = len(order)
                    ids[key] = j
                    order.append(key)
                    if j >= limit:
                        at = f" in rule {self.origin.get(self.where, self.where)!r}" if self.where else ""
                        raise self._located(CompileLimitError(
                            f"intersection/difference automaton exceeds {limit} states{at} "
                            "(CompileOptions.max_states)"))
                row[c] = j
            rows.append(row)
            i += 1
        trans = np.array(rows, dtype=np.int32)[:, cls_of]
        acc_a = a.accept.tolist()
        acc_b = b.accept.tolist()
        acc = np.array([(acc_a[qa] and (qb >= 0 and acc_b[qb])) if is_and
                        else (acc_a[qa] and not (qb >= 0 and acc_b[qb])) for qa, qb in order],
                       dtype=bool)
        d = _Dfa(np.ascontiguousarray(trans), acc, [() for _ in range(len(order))])
        d = _trim_regular(d)
        return _minimise(d, self.check_time_now) if d.trans.shape[0] > _MINIMISE_MIN else d

    # -- subset construction ------------------------------------------------------
    def _determinise(self, nfa: _Nfa, start: int, end: int, name: str) -> _Dfa:
        dk = self.dfa_kernels()
        if dk.COMPILED and not any(nfa.calls):
            eo, eps, do, edges = _nfa_csr(nfa)
            status, trans, acc = dk.determinise(eo, eps, do, edges, start, end, self.opt.max_states,
                                                self.work_budget())
            if status == dk.LIMIT:
                raise self._located(CompileLimitError(
                    f"rule {self.origin.get(name, name)!r}: automaton exceeds "
                    f"{self.opt.max_states} states (CompileOptions.max_states)"), name)
            self.kernel_status(int(status), f"rule {name!r}")
            self.count_states(trans.shape[0], f"rule {name!r}")
            return _Dfa(trans, acc, [()] * trans.shape[0])
        class_of, nclass, cedges = _byte_classes(nfa)

        eps = nfa.eps
        closure_memo: dict[int, frozenset[int]] = {}

        def eclose(states: Iterable[int]) -> frozenset[int]:
            seen = set()
            stack = list(states)
            while stack:
                x = stack.pop()
                if x in seen:
                    continue
                seen.add(x)
                stack.extend(eps[x])
            return frozenset(seen)

        def eclose1(x: int) -> frozenset[int]:
            got = closure_memo.get(x)
            if got is None:
                got = eclose((x,))
                closure_memo[x] = got
            return got

        s0 = eclose1(start)
        ids: dict[frozenset[int], int] = {s0: 0}
        subsets = [s0]
        rows: list[list[int]] = []
        calls: list[tuple[tuple[int, int], ...]] = []
        accept: list[bool] = []
        i = 0
        while i < len(subsets):
            self.check_time()
            S = subsets[i]
            tgt: list[set[int] | None] = [None] * nclass
            callt: dict[int, set[int]] = {}
            for x in S:
                for clo, chi, t in cedges[x]:
                    for c in range(clo, chi + 1):
                        bucket = tgt[c]
                        if bucket is None:
                            tgt[c] = {t}
                        else:
                            bucket.add(t)
                for r, t in nfa.calls[x]:
                    callt.setdefault(r, set()).add(t)
            row = [-1] * nclass
            seen_targets: dict[frozenset[int], int] = {}
            for c in range(nclass):
                bucket = tgt[c]
                if bucket is None:
                    continue
                key = frozenset(bucket)
                j = seen_targets.get(key)
                if j is None:
                    closed = frozenset().union(*(eclose1(t) for t in bucket))
                    j = ids.get(closed)
                    if j is None:
                        j = len(subsets)
                        ids[closed] = j
                        subsets.append(closed)
                        if len(subsets) > self.opt.max_states:
                            raise self._located(CompileLimitError(
                                f"rule {self.origin.get(name, name)!r}: automaton exceeds "
                                f"{self.opt.max_states} states (CompileOptions.max_states)"), name)
                    seen_targets[key] = j
                row[c] = j
            crow = []
            for r in sorted(callt):
                closed = frozenset().union(*(eclose1(t) for t in callt[r]))
                j = ids.get(closed)
                if j is None:
                    j = len(subsets)
                    ids[closed] = j
                    subsets.append(closed)
                crow.append((r, j))
            rows.append(row)
            calls.append(tuple(crow))
            accept.append(end in S)
            i += 1
        self.count_states(len(subsets), f"rule {name!r}")
        ctrans = np.array(rows, dtype=np.int32).reshape(len(subsets), nclass)
        trans = ctrans[:, class_of]
        return _Dfa(np.ascontiguousarray(trans), np.array(accept, dtype=bool), calls)


def _coreachable(d: _Dfa, nonempty: list[bool]) -> np.ndarray:
    """States from which an accepting state is reachable (byte edges, and call edges to
    non-empty rules), by backward breadth-first search over a CSR of reversed edges."""
    n = d.trans.shape[0]
    src, _b = np.nonzero(d.trans >= 0)
    dst = d.trans[src, _b].astype(np.int64)
    extra_src = [q for q in range(n) for r, _t in d.calls[q] if nonempty[r]]
    extra_dst = [t for q in range(n) for r, t in d.calls[q] if nonempty[r]]
    if extra_src:
        src = np.concatenate([src, np.array(extra_src, dtype=np.int64)])
        dst = np.concatenate([dst, np.array(extra_dst, dtype=np.int64)])
    keys = np.unique(dst * n + src)
    rdst, rsrc = keys // n, keys % n  # sorted by destination
    indptr = np.searchsorted(rdst, np.arange(n + 1))
    good = d.accept.copy()
    frontier = np.nonzero(good)[0]
    while frontier.size:
        starts, ends = indptr[frontier], indptr[frontier + 1]
        counts = ends - starts
        total = int(counts.sum())
        if total == 0:
            break
        idx = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + np.arange(total)
        preds = np.unique(rsrc[idx])
        preds = preds[~good[preds]]
        good[preds] = True
        frontier = preds
    return good


def _restrict(d: _Dfa, keep: np.ndarray, nonempty: list[bool]) -> _Dfa:
    """Drop states not in ``keep`` (and unreachable ones), renumbering from 0."""
    n = d.trans.shape[0]
    if not keep[0]:
        return _Dfa(np.full((1, 256), -1, np.int32), np.zeros(1, bool), [()])
    trans = np.where((d.trans >= 0) & keep[np.maximum(d.trans, 0)], d.trans, -1)
    # forward reachability from 0
    reach = np.zeros(n, dtype=bool)
    reach[0] = True
    stack = [0]
    calls = [tuple((r, t) for r, t in d.calls[q] if nonempty[r] and keep[t]) for q in range(n)]
    while stack:
        q = stack.pop()
        nxt = set(trans[q][trans[q] >= 0].tolist())
        nxt.update(t for _r, t in calls[q])
        for t in nxt:
            if not reach[t]:
                reach[t] = True
                stack.append(t)
    alive = keep & reach
    order = np.nonzero(alive)[0]
    remap = np.full(n, -1, dtype=np.int32)
    remap[order] = np.arange(len(order), dtype=np.int32)
    nt = trans[order]
    nt = np.where(nt >= 0, remap[np.maximum(nt, 0)], -1).astype(np.int32)
    ncalls = [tuple((r, int(remap[t])) for r, t in calls[q]) for q in order]
    return _Dfa(np.ascontiguousarray(nt), d.accept[order].copy(), ncalls)


def _trim_regular(d: _Dfa) -> _Dfa:
    """``d`` (call-free) restricted to states reachable from the start that can accept."""
    from structgen.grammar import _dfa_kernels as dk

    if dk.COMPILED:
        trans, acc = dk.trim(_c32(d.trans), np.ascontiguousarray(d.accept, dtype=bool))
        return _Dfa(trans, acc, [()] * trans.shape[0])
    return _restrict(d, _coreachable(d, []), [])


def _c32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int32)


def _nfa_csr(nfa: _Nfa) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A call-free NFA as flat arrays: epsilon CSR and byte-edge CSR ``(lo, hi, target)``."""
    n = len(nfa.eps)
    eo = np.zeros(n + 1, dtype=np.int64)
    eo[1:] = np.cumsum(np.fromiter((len(x) for x in nfa.eps), dtype=np.int64, count=n))
    eps = np.fromiter((t for x in nfa.eps for t in x), dtype=np.int32, count=int(eo[-1]))
    do = np.zeros(n + 1, dtype=np.int64)
    do[1:] = np.cumsum(np.fromiter((len(x) for x in nfa.edges), dtype=np.int64, count=n))
    edges = np.fromiter((v for x in nfa.edges for e in x for v in e), dtype=np.int32,
                        count=3 * int(do[-1])).reshape(-1, 3)
    return eo.astype(np.int32), eps, do.astype(np.int32), edges


def _hoisted_name(prefix: str, e: ir.Expr, hoisted: dict[ir.Expr, str], rules: dict[str, ir.Expr]) -> str:
    """A fresh rule name for the hoisted sub-expression ``e``, recorded in ``hoisted``."""
    name = f"{prefix}{len(hoisted)}"
    while name in rules:
        name += "_"
    hoisted[e] = name
    return name


def _minimise(d: _Dfa, check: Callable[[], None] | None = None) -> _Dfa:
    """Minimal DFA of ``d``: Hopcroft's algorithm in compiled code for call-free DFAs, else
    Moore partition refinement (vectorised with numpy); ``check`` runs once per round (the
    compiler's deadline)."""
    n = d.trans.shape[0]
    if n <= 1:
        return d
    from structgen.grammar import _dfa_kernels as dk

    if dk.COMPILED and not any(d.calls):
        status, trans, acc = dk.minimise(_c32(d.trans), np.ascontiguousarray(d.accept, dtype=bool),
                                         1 << 62)
        return _Dfa(trans, acc, [()] * trans.shape[0])
    called = sorted({r for cs in d.calls for r, _ in cs})
    ccols = np.full((n, len(called)), -1, dtype=np.int64)
    cpos = {r: i for i, r in enumerate(called)}
    for q, cs in enumerate(d.calls):
        for r, t in cs:
            ccols[q, cpos[r]] = t
    # initial partition: accept flag + which rules are called
    init = np.concatenate([d.accept[:, None].astype(np.int64), (ccols >= 0).astype(np.int64)], axis=1)
    block = _row_classes(init)
    nblocks = int(block.max()) + 1
    # columns (bytes) that behave identically in every state need to be compared only once
    if d.trans.shape[1] > 1:
        _u, first = np.unique(_row_classes(d.trans.T), return_index=True)
        cols = d.trans[:, first]
    else:
        cols = d.trans
    while True:
        if check is not None:
            check()
        tb = np.where(cols >= 0, block[np.maximum(cols, 0)], -1)
        cb = np.where(ccols >= 0, block[np.maximum(ccols, 0)], -1)
        sig = np.concatenate([block[:, None], tb, cb], axis=1)
        nb = _row_classes(sig)
        k = int(nb.max()) + 1
        block = nb
        if k == nblocks:
            break
        nblocks = k
    if nblocks == n:
        return d
    # renumber blocks: the start state's block becomes 0, the rest by first occurrence
    first: dict[int, int] = {int(block[0]): 0}
    for b in block.tolist():
        if b not in first:
            first[b] = len(first)
    remap = np.empty(nblocks, dtype=np.int32)
    for b, j in first.items():
        remap[b] = j
    new_of_state = remap[block]
    reps = np.zeros(nblocks, dtype=np.int64)
    reps[new_of_state] = np.arange(n)  # any member represents its block
    trans = d.trans[reps]
    trans = np.where(trans >= 0, new_of_state[np.maximum(trans, 0)], -1).astype(np.int32)
    acc = d.accept[reps].copy()
    calls = [tuple((r, int(new_of_state[t])) for r, t in d.calls[int(q)]) for q in reps]
    return _Dfa(np.ascontiguousarray(trans), acc, calls)


_HASH_RNG = np.random.default_rng(0x5EED)


def _nearly_distinct(d: _Dfa) -> bool:
    """Whether at most 1% of ``d``'s states share their acceptance and transition row with
    another. The product of two minimal DFAs where that holds is minimal or nearly so (the
    benchmark's big products shrank by 0.2-0.3% under minimisation, at ~10 ms per 1,000
    states); products with many equal rows (they shrank 25-35%) are still minimised. A
    non-minimal table is exact all the same, only larger."""
    rows = _row_classes(np.concatenate([d.accept[:, None].astype(np.int32), d.trans], axis=1))
    return int(rows.max()) + 1 >= 0.99 * d.trans.shape[0]


def _row_classes(mat: np.ndarray) -> np.ndarray:
    """Class id per row of an int matrix (equal rows <-> equal ids), via 64-bit row hashes
    checked for collisions (falls back to an exact ``np.unique`` if any)."""
    m = mat.astype(np.int64)
    mult = _HASH_RNG.integers(1, 2**62, size=m.shape[1], dtype=np.int64) | 1
    with np.errstate(over="ignore"):
        h = (m * mult).sum(axis=1) ^ (m[:, 0] << 17 if m.shape[1] else 0)
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    if not np.array_equal(m, m[first[inv]]):  # a hash collision: be exact
        _, inv = np.unique(m, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
    return inv.astype(np.int64)


def _byte_classes(nfa: _Nfa) -> tuple[np.ndarray, int, list[list[tuple[int, int, int]]]]:
    """Byte equivalence classes from all edge boundaries of ``nfa``: ``class_of`` int32
    ``[256]``, the number of classes, and per NFA state its edges as
    ``(class_lo, class_hi, target)``."""
    cuts = {0, 256}
    for es in nfa.edges:
        for lo, hi, _t in es:
            cuts.add(lo)
            cuts.add(hi + 1)
    bounds = sorted(cuts)
    class_of = np.zeros(256, dtype=np.int32)
    for ci in range(len(bounds) - 1):
        class_of[bounds[ci]:bounds[ci + 1]] = ci
    cl = class_of.tolist()
    cedges = [[(cl[lo], cl[hi], t) for lo, hi, t in es] for es in nfa.edges]
    return class_of, len(bounds) - 1, cedges


def _lazy_rule(name: str, nfa: _Nfa, end: int) -> LazyRule:
    """Freeze a trimmed NFA into a :class:`LazyRule`."""
    class_of, nclass, cedges = _byte_classes(nfa)
    return LazyRule(name, tuple(tuple(x) for x in nfa.eps), tuple(tuple(es) for es in cedges),
                    tuple(tuple(c) for c in nfa.calls), end, class_of, nclass)


def _embed(nfa: _Nfa, d: _Dfa, s: int) -> int:
    """Copy a call-free DFA into the NFA after state ``s``; return the end state."""
    n = d.trans.shape[0]
    base0 = len(nfa)
    for _ in range(n + 1):
        nfa.new()
    end = base0 + n
    nfa.eps[s].append(base0)
    trans = d.trans
    # run boundaries per row: positions where the target changes
    change = np.ones((n, 257), dtype=bool)
    change[:, 1:256] = trans[:, 1:] != trans[:, :-1]
    rows, cols = np.nonzero(change)  # row-major: grouped by state, ascending
    bounds = np.searchsorted(rows, np.arange(n + 1))
    cols_l = cols.tolist()
    for q in range(n):
        edges = nfa.edges[base0 + q]
        starts = cols_l[bounds[q]:bounds[q + 1]]
        row = trans[q]
        for k in range(len(starts) - 1):
            lo = int(starts[k])
            t = int(row[lo])
            if t >= 0:
                edges.append((lo, int(starts[k + 1]) - 1, base0 + t))
        if d.accept[q]:
            nfa.eps[base0 + q].append(end)
    return end
