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
shareable across threads. Per-request state lives in :class:`structgen.matcher.Matcher`;
the shared lazily-built runtime tables (configurations, transitions, mask caches) live in
:mod:`structgen.engine`.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import ir
from .config import CompileOptions
from .errors import CompileLimitError, CompileTimeoutError, GrammarError
from .graphs import strongly_connected_components

__all__ = ["CompiledGrammar", "RuleDfa", "compile_grammar"]


# ---------------------------------------------------------------------------
# Compiled artefacts
# ---------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class RuleDfa:
    """One rule's deterministic automaton over bytes plus call edges.

    trans:  int32 [num_states, 256], next state or -1 (dead).
    accept: bool  [num_states], the rule may return here.
    calls:  per state, a tuple of ``(callee_rule_index, return_state)``.
    has_bytes: bool [num_states], the state has at least one byte edge.
    State 0 is the start state.
    """

    name: str
    trans: np.ndarray
    accept: np.ndarray
    calls: tuple[tuple[tuple[int, int], ...], ...]
    has_bytes: np.ndarray

    @property
    def num_states(self) -> int:
        return int(self.trans.shape[0])


class CompiledGrammar:
    """An immutable compiled grammar: rule DFAs plus the index of the root rule.

    Equality and hashing are by content (a SHA-256 of the source IR and options), so
    equal grammars compiled twice are interchangeable. Runtime tables built while
    matching are shared by every matcher of this grammar (thread-safe).
    """

    def __init__(self, rules: tuple[RuleDfa, ...], root: int, key: str,
                 source: ir.Grammar | None = None) -> None:
        self._rules = rules
        self._root = root
        self._key = key
        self._source = source
        self._engine: Any = None
        self._engine_lock = threading.Lock()
        self.metadata: dict[str, Any] = {}

    # -- identity ---------------------------------------------------------
    @property
    def rules(self) -> tuple[RuleDfa, ...]:
        return self._rules

    @property
    def root(self) -> int:
        return self._root

    @property
    def key(self) -> str:
        """Content hash (hex) of the source IR and compile options."""
        return self._key

    @property
    def source(self) -> ir.Grammar | None:
        """The IR grammar this was compiled from (for ``--explain``)."""
        return self._source

    @property
    def num_states(self) -> int:
        return sum(r.num_states for r in self._rules)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CompiledGrammar) and other._key == self._key

    def __repr__(self) -> str:
        return (f"CompiledGrammar(rules={len(self._rules)}, states={self.num_states}, "
                f"key={self._key[:12]})")

    def __getstate__(self) -> dict[str, Any]:
        return {"rules": self._rules, "root": self._root, "key": self._key,
                "source": self._source, "metadata": self.metadata}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["rules"], state["root"], state["key"], state["source"])  # type: ignore[misc]
        self.metadata = state.get("metadata", {})

    # -- runtime ------------------------------------------------------------
    @property
    def engine(self) -> Any:
        """The shared runtime (:class:`structgen.engine.Engine`), built on first use."""
        eng = self._engine
        if eng is None:
            with self._engine_lock:
                if self._engine is None:
                    from .engine import Engine
                    self._engine = Engine(self)
                eng = self._engine
        return eng

    def accepts(self, data: bytes | str) -> bool:
        """Is ``data`` (bytes, or str encoded as UTF-8) a complete sentence of the grammar?"""
        if isinstance(data, str):
            data = data.encode("utf-8")
        eng = self.engine
        c = eng.walk(eng.start, data)
        return c >= 0 and eng.is_accepting(c)

    def accepts_prefix(self, data: bytes | str) -> bool:
        """Can ``data`` be extended to a sentence of the grammar (a viable prefix)?"""
        if isinstance(data, str):
            data = data.encode("utf-8")
        eng = self.engine
        return eng.walk(eng.start, data) >= 0


# ---------------------------------------------------------------------------
# Compilation entry point (with content cache)
# ---------------------------------------------------------------------------

_CACHE: OrderedDict[str, CompiledGrammar] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 256


def grammar_key(grammar: ir.Grammar, options: CompileOptions) -> str:
    h = hashlib.sha256()
    h.update(repr(options).encode())
    h.update(grammar.start.encode())
    for name in sorted(grammar.rules):
        h.update(b"\x00" + name.encode() + b"\x01" + grammar.rules[name].fingerprint())
    return h.hexdigest()


def compile_grammar(grammar: ir.Grammar, options: CompileOptions | None = None) -> CompiledGrammar:
    """Compile an IR grammar (cached by content; compiled grammars are shared).

    Raises :class:`GrammarError` (undefined rule, left recursion, non-regular operand of
    And/Diff, empty language), :class:`CompileLimitError` or :class:`CompileTimeoutError`.
    """
    options = options or CompileOptions()
    key = grammar_key(grammar, options)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    cg = _Compiler(grammar, options).compile(key)
    with _CACHE_LOCK:
        _CACHE[key] = cg
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return cg


# ---------------------------------------------------------------------------
# IR analysis helpers
# ---------------------------------------------------------------------------

def _refs(e: ir.Expr, out: set[str]) -> None:
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, ir.Ref):
            out.add(x.name)
        elif isinstance(x, (ir.Seq, ir.Alt)):
            stack.extend(x.items)
        elif isinstance(x, ir.Repeat):
            stack.append(x.item)
        elif isinstance(x, (ir.And, ir.Diff)):
            stack.append(x.left)
            stack.append(x.right)


def _size(e: ir.Expr, memo: dict[int, int]) -> int:
    """Rough NFA size of an expression (for inlining decisions)."""
    k = id(e)
    got = memo.get(k)
    if got is not None:
        return got
    if isinstance(e, (ir.Seq, ir.Alt)):
        s = 1 + sum(_size(x, memo) for x in e.items)
    elif isinstance(e, ir.Repeat):
        reps = e.max if e.max is not None else max(e.min, 1)
        s = 1 + _size(e.item, memo) * max(1, min(reps, 10_000))
    elif isinstance(e, (ir.And, ir.Diff)):
        s = 1 + _size(e.left, memo) * _size(e.right, memo)
    elif isinstance(e, ir.Dfa):
        s = len(e.trans)
    else:
        s = 1
    memo[k] = s
    return s


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


class _Compiler:
    def __init__(self, grammar: ir.Grammar, options: CompileOptions) -> None:
        self.g = grammar
        self.opt = options
        self.deadline = time.monotonic() + options.timeout_s
        self.total_states = 0
        self.rule_index: dict[str, int] = {}
        self.kept: list[str] = []
        self.exprs: dict[str, ir.Expr] = {}
        self._regular_cache: dict[ir.Expr, _Dfa] = {}
        self._tick = 0

    # -- limits ---------------------------------------------------------------
    def check_time(self) -> None:
        self._tick += 1
        if self._tick & 255 == 0 and time.monotonic() > self.deadline:
            raise CompileTimeoutError(
                f"grammar compilation exceeded its time limit of {self.opt.timeout_s:g} s "
                "(CompileOptions.timeout_s)")

    def count_states(self, n: int, what: str) -> None:
        self.total_states += n
        if self.total_states > self.opt.max_states:
            raise CompileLimitError(
                f"grammar automaton exceeds {self.opt.max_states} states while building {what} "
                "(CompileOptions.max_states)")

    # -- driver ---------------------------------------------------------------
    def compile(self, key: str) -> CompiledGrammar:
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
        reach = {g.start}
        todo = [g.start]
        while todo:
            n = todo.pop()
            for r in refs[n]:
                if r not in reach:
                    reach.add(r)
                    todo.append(r)
        recursive: set[str] = set()
        for comp in strongly_connected_components(sorted(reach), refs):
            if len(comp) > 1 or comp[0] in refs[comp[0]]:
                recursive.update(comp)
        # big repetitions of big items: hoist the item into a rule of its own (a call), so
        # that {m,n} unrolls calls rather than copies of a large automaton
        hoisted: dict[ir.Expr, str] = {}
        memo: dict[int, int] = {}
        for n in sorted(reach):
            rules[n] = self._hoist(rules[n], hoisted, memo, rules)
        for name in hoisted.values():
            reach.add(name)
            refs[name] = set()
            _refs(rules[name], refs[name])
        # decide which non-recursive rules stay as calls: bottom-up, a rule is inlined while
        # its fully inlined size times its number of uses stays small
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
            own = _size(rules[n], {})
            inl = sum(full.get(r, 1) for r in refs[n] if r not in keep)
            full[n] = own + inl
            if n != g.start and (full[n] * max(uses[n] - 1, 0) > 4000 or full[n] > 20_000):
                keep.add(n)
                full[n] = 1
        self.kept = [g.start] + sorted(keep - {g.start})
        self.rule_index = {n: i for i, n in enumerate(self.kept)}
        self.exprs = rules
        self.recursive = recursive
        self.keep = keep

        dfas: list[_Dfa] = []
        for n in self.kept:
            nfa = _Nfa()
            start = nfa.new()
            end = self._build(nfa, rules[n], start, inline_stack=(n,))
            dfa = self._determinise(nfa, start, end, n)
            dfas.append(dfa)
        dfas = self._trim_all(dfas)
        self._check_left_recursion(dfas)
        out: list[RuleDfa] = []
        for n, d in zip(self.kept, dfas):
            d = _minimise(d)
            has_bytes = (d.trans >= 0).any(axis=1)
            out.append(RuleDfa(name=n, trans=d.trans, accept=d.accept, calls=tuple(d.calls),
                               has_bytes=has_bytes))
        return CompiledGrammar(tuple(out), 0, key, source=self.g)

    def _hoist(self, e: ir.Expr, hoisted: dict[ir.Expr, str], memo: dict[int, int],
               rules: dict[str, ir.Expr]) -> ir.Expr:
        """Replace the item of a large repetition with a call to a synthetic rule."""
        if isinstance(e, ir.Repeat):
            item = self._hoist(e.item, hoisted, memo, rules)
            reps = e.max if e.max is not None else max(e.min, 1)
            if reps > 2 and _size(item, memo) * reps > 2000 and not isinstance(item, ir.Ref):
                name = hoisted.get(item)
                if name is None:
                    name = f"__rep{len(hoisted)}"
                    while name in rules:
                        name += "_"
                    hoisted[item] = name
                    rules[name] = item
                item = ir.Ref(name)
            return ir.Repeat(item, e.min, e.max) if item is not e.item else e
        if isinstance(e, (ir.Seq, ir.Alt)):
            items = tuple(self._hoist(x, hoisted, memo, rules) for x in e.items)
            if all(a is b for a, b in zip(items, e.items)):
                return e
            return type(e)(items)
        return e  # And/Diff operands stay regular (they are inlined in full anyway)

    def _count_refs(self, e: ir.Expr, counter: dict[str, int]) -> None:
        stack = [e]
        while stack:
            x = stack.pop()
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
        """Add ``e`` to ``nfa`` starting at state ``s``; return its end state."""
        self.check_time()
        if len(nfa) > self.opt.max_states:
            raise CompileLimitError(
                f"grammar automaton exceeds {self.opt.max_states} NFA states in rule "
                f"{inline_stack[0]!r} (CompileOptions.max_states)")
        if isinstance(e, ir.ByteSet):
            t = nfa.new()
            for lo, hi in e.ranges:
                nfa.edges[s].append((lo, hi, t))
            return t
        if isinstance(e, ir.Seq):
            cur = s
            for it in e.items:
                cur = self._build(nfa, it, cur, inline_stack)
            return cur
        if isinstance(e, ir.Alt):
            t = nfa.new()
            if not e.items:
                return t  # unreachable end: empty language
            for it in e.items:
                b = nfa.new()
                nfa.eps[s].append(b)
                end = self._build(nfa, it, b, inline_stack)
                nfa.eps[end].append(t)
            return t
        if isinstance(e, ir.Repeat):
            cur = s
            for _ in range(e.min):
                cur = self._build(nfa, e.item, cur, inline_stack)
            if e.max is None:
                # cur -> loop: item* via a hub state
                hub = nfa.new()
                nfa.eps[cur].append(hub)
                b = nfa.new()
                nfa.eps[hub].append(b)
                end = self._build(nfa, e.item, b, inline_stack)
                nfa.eps[end].append(hub)
                return hub
            k = e.max - e.min
            if k == 0:
                return cur
            t = nfa.new()
            for _ in range(k):
                nfa.eps[cur].append(t)
                cur = self._build(nfa, e.item, cur, inline_stack)
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
            return self._build(nfa, self.exprs[name], s, inline_stack + (name,))
        if isinstance(e, (ir.And, ir.Diff, ir.Dfa)):
            d = self._regular(e, inline_stack)
            return _embed(nfa, d, s)
        raise GrammarError(f"unknown IR node {type(e).__name__}")

    # -- regular sub-languages (And / Diff / Dfa) --------------------------------
    def _regular(self, e: ir.Expr, inline_stack: tuple[str, ...]) -> _Dfa:
        got = self._regular_cache.get(e)
        if got is not None:
            return got
        if isinstance(e, ir.Dfa):
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
            d = _Dfa(trans, acc, [() for _ in range(n)])
        else:
            assert isinstance(e, (ir.And, ir.Diff))
            left = self._regular_operand(e.left, inline_stack)
            right = self._regular_operand(e.right, inline_stack)
            d = self._product(left, right, "and" if isinstance(e, ir.And) else "diff")
        self._regular_cache[e] = d
        return d

    def _regular_operand(self, e: ir.Expr, inline_stack: tuple[str, ...]) -> _Dfa:
        if isinstance(e, (ir.And, ir.Diff, ir.Dfa)):
            return self._regular(e, inline_stack)
        got = self._regular_cache.get(e)
        if got is not None:
            return got
        nfa = _Nfa()
        start = nfa.new()
        saved_keep = self.keep
        # operands of And/Diff must be fully regular: inline every non-recursive rule
        self.keep = set()
        try:
            end = self._build_regular(nfa, e, start, inline_stack)
        finally:
            self.keep = saved_keep
        d = self._determinise(nfa, start, end, inline_stack[0])
        d = _trim_regular(d)
        if d.trans.shape[0] > 64:
            d = _minimise(d)
        self._regular_cache[e] = d
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
        """Product of two call-free DFAs (missing transitions = dead)."""
        na, nb = a.trans.shape[0], b.trans.shape[0]
        ids: dict[tuple[int, int], int] = {(0, 0): 0}
        order = [(0, 0)]
        rows: list[np.ndarray] = []
        i = 0
        while i < len(order):
            self.check_time()
            qa, qb = order[i]
            ta = a.trans[qa] if qa >= 0 else np.full(256, -1, np.int32)
            tb = b.trans[qb] if qb >= 0 else np.full(256, -1, np.int32)
            if op == "and":
                live = (ta >= 0) & (tb >= 0)
            else:
                live = ta >= 0
            row = np.full(256, -1, dtype=np.int32)
            pairs = ta.astype(np.int64) * (nb + 1) + (tb.astype(np.int64) + 1)
            for p in np.unique(pairs[live]):
                pa, pb = int(p) // (nb + 1), int(p) % (nb + 1) - 1
                key = (pa, pb)
                j = ids.get(key)
                if j is None:
                    j = len(order)
                    ids[key] = j
                    order.append(key)
                    if len(order) > self.opt.max_states:
                        raise CompileLimitError(
                            f"intersection/difference automaton exceeds {self.opt.max_states} states")
                row[live & (pairs == p)] = j
            rows.append(row)
            i += 1
        trans = np.stack(rows).astype(np.int32)
        acc = np.zeros(len(order), dtype=bool)
        for j, (qa, qb) in enumerate(order):
            in_a = qa >= 0 and bool(a.accept[qa])
            in_b = qb >= 0 and bool(b.accept[qb])
            acc[j] = (in_a and in_b) if op == "and" else (in_a and not in_b)
        del na
        d = _Dfa(trans, acc, [() for _ in range(len(order))])
        d = _trim_regular(d)
        return _minimise(d) if d.trans.shape[0] > 64 else d

    # -- subset construction ------------------------------------------------------
    def _determinise(self, nfa: _Nfa, start: int, end: int, name: str) -> _Dfa:
        # byte equivalence classes from all edge boundaries
        cuts = {0, 256}
        for edges in nfa.edges:
            for lo, hi, _ in edges:
                cuts.add(lo)
                cuts.add(hi + 1)
        bounds = sorted(cuts)
        class_of = np.zeros(256, dtype=np.int32)
        for ci in range(len(bounds) - 1):
            class_of[bounds[ci]:bounds[ci + 1]] = ci
        nclass = len(bounds) - 1
        # per NFA state: list of (class_lo, class_hi, target)
        cedges: list[list[tuple[int, int, int]]] = []
        for edges in nfa.edges:
            cedges.append([(int(class_of[lo]), int(class_of[hi]), t) for lo, hi, t in edges])

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
                            raise CompileLimitError(
                                f"rule {name!r}: automaton exceeds {self.opt.max_states} states "
                                "(CompileOptions.max_states)")
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

    # -- trimming across rules ----------------------------------------------------
    def _trim_all(self, dfas: list[_Dfa]) -> list[_Dfa]:
        """Remove states that cannot reach acceptance (given which rules are non-empty)."""
        n = len(dfas)
        nonempty = [False] * n
        changed = True
        coreach: list[np.ndarray] = [d.accept.copy() for d in dfas]
        while changed:
            changed = False
            for i, d in enumerate(dfas):
                cr = _coreachable(d, nonempty)
                if cr.sum() != coreach[i].sum() or not np.array_equal(cr, coreach[i]):
                    coreach[i] = cr
                    changed = True
                ne = bool(cr[0]) if d.trans.shape[0] else False
                if ne != nonempty[i]:
                    nonempty[i] = ne
                    changed = True
        if not nonempty[0]:
            raise GrammarError(f"the grammar accepts no string at all (start rule {self.kept[0]!r})")
        out = []
        for i, d in enumerate(dfas):
            out.append(_restrict(d, coreach[i], nonempty))
        return out

    def _check_left_recursion(self, dfas: list[_Dfa]) -> None:
        n = len(dfas)
        nullable = [bool(d.accept[0]) for d in dfas]
        # nullable fixpoint through calls
        changed = True
        while changed:
            changed = False
            for i, d in enumerate(dfas):
                if nullable[i]:
                    continue
                if _eps_reach(d, nullable)[1]:
                    nullable[i] = True
                    changed = True
        left: dict[str, set[str]] = {}
        for i, d in enumerate(dfas):
            states, _ = _eps_reach(d, nullable)
            callees = set()
            for q in states:
                for r, _t in d.calls[q]:
                    callees.add(self.kept[r])
            left[self.kept[i]] = callees
        for comp in strongly_connected_components(self.kept, left):
            if len(comp) > 1 or comp[0] in left[comp[0]]:
                raise GrammarError(
                    "left recursion through rule(s) " + " -> ".join(sorted(comp))
                    + "; rewrite it as repetition (e.g. A: A x | y  =>  A: y x*)")
        del n


def _eps_reach(d: _Dfa, nullable: list[bool]) -> tuple[set[int], bool]:
    """States reachable from 0 through calls to nullable rules; whether one accepts."""
    seen = {0}
    stack = [0]
    acc = False
    while stack:
        q = stack.pop()
        if d.accept[q]:
            acc = True
        for r, t in d.calls[q]:
            if nullable[r] and t not in seen:
                seen.add(t)
                stack.append(t)
    return seen, acc


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
    return _restrict(d, _coreachable(d, []), [])


def _minimise(d: _Dfa) -> _Dfa:
    """Moore partition refinement (vectorised with numpy)."""
    n = d.trans.shape[0]
    if n <= 1:
        return d
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
    cols = np.unique(d.trans, axis=1) if d.trans.shape[1] > 1 else d.trans
    while True:
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
    rows, cols = np.nonzero(change)
    for q in range(n):
        edges = nfa.edges[base0 + q]
        starts = cols[rows == q]
        row = trans[q]
        for k in range(len(starts) - 1):
            lo = int(starts[k])
            t = int(row[lo])
            if t >= 0:
                edges.append((lo, int(starts[k + 1]) - 1, base0 + t))
        if d.accept[q]:
            nfa.eps[base0 + q].append(end)
    return end
