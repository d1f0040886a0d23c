"""Grammar IR -> :class:`~structgen.grammar.compiled.CompiledGrammar`: the compiler, its
content cache, and the limits and timeout it enforces.

Compilation steps (all bounded by :class:`~structgen.config.CompileOptions`):

1. immediate left recursion ``A -> A a | b`` is rewritten to ``A -> b a*``; any left
   recursion that remains is a :class:`~structgen.errors.GrammarError`;
2. rules that are not recursive are inlined into their callers when that is cheap
   (used once, or small), so most JSON-Schema grammars become a single DFA and only
   genuinely recursive rules (``$ref`` cycles, nested Lark rules) remain as *calls*
   (the IR rewrites live in :mod:`structgen.grammar.passes`);
3. each remaining rule is built as a Thompson NFA over bytes and call symbols
   (``And``/``Diff``/``Dfa`` sub-expressions are compiled to DFAs by product
   construction and embedded or called; see :mod:`structgen.grammar.fsa`) and trimmed to
   states that can still reach acceptance; rules are determinised lazily at run time.

Compiled grammars are cached by content (process-wide, least recently used first out), as
are the DFAs of closed regular sub-expressions, which many grammars share.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Generator
from types import ModuleType
from typing import NoReturn, TypeAlias, cast

import numpy as np

from structgen import limits
from structgen.config import CompileOptions
from structgen.errors import CompileLimitError, CompileTimeoutError, GrammarError
from structgen.grammar import ir
from structgen.grammar.compiled import CompiledGrammar, CountedRule, DfaRule, ProductRule, Rule
from structgen.grammar.fsa import (
    MINIMISE_MIN,
    Dfa,
    Nfa,
    all_states_infinite,
    determinise,
    embed,
    finite_language,
    minimise,
    native_ready,
    product,
    trim,
)
from structgen.grammar.gcpause import gc_paused
from structgen.grammar.graphs import reachable, strongly_connected_components
from structgen.grammar.passes import (
    Counted,
    count_refs,
    expr_size,
    hoisted_name,
    merge_equal_rules,
    remove_immediate_left_recursion,
    share_common,
)
from structgen.grammar.rule_nfas import freeze_rules

__all__ = ["compile_grammar"]

# in-process key of a compiled grammar: (repr of the options, start rule, rules by name)
_Key: TypeAlias = tuple[str, str, tuple[tuple[str, ir.Expr], ...]]
_CACHE: OrderedDict[_Key, CompiledGrammar] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 256
_INLINE_SHARED_MAX = 48   # a rule referenced more than once is inlined only up to this size
_INLINE_MAX = 20_000      # no rule is inlined above this size
_COUNTED_MIN = 256        # a bounded repetition of a closed item unrolling to more becomes counted
_DIRECT_DEPTH = 200       # Thompson construction by recursion to this depth, iteratively below it
_EMBED_MAX = 12           # regular sub-automata up to this many states are copied, not called
_DFA_RULES_SIZE = 1024    # process-wide caches of regular sub-automata (by IR content)
_KERNEL_STEPS_PER_S = 1e8  # work units per second of the compiled DFA kernels (a conservative rate)
_REGULAR: OrderedDict[ir.Expr, Dfa] = OrderedDict()
_DFA_RULES: OrderedDict[ir.Expr, DfaRule] = OrderedDict()
_NO_CALLS: set[str] = set()  # sentinel for ``keep`` while building regular operands



def compile_grammar(grammar: ir.Grammar, options: CompileOptions | None = None, *,
                    deadline: float | None = None) -> CompiledGrammar:
    """Compile an IR grammar (cached by content; compiled grammars are shared).

    ``deadline`` (a ``structgen.limits.now()`` value) replaces ``options.timeout_s`` counted from
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
    key: _Key = (repr(options), grammar.start, tuple(sorted(grammar.rules.items(), key=lambda kv: kv[0])))
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



def _closed(e: ir.Expr) -> bool:
    """No rule references inside ``e`` (its automaton depends on nothing else)."""
    return not e.refs()


def _refs(e: ir.Expr, out: set[str]) -> None:
    out |= e.refs()


_BuildNode = Generator[tuple[ir.Expr, int, tuple[str, ...]], int, int]  # see _Compiler._build_node


class _Compiler:
    """One compilation of one grammar (not reused): the IR passes, the Thompson construction
    of every kept rule, the regular sub-automata, and the deadline and state limits they
    share. It is the :class:`~structgen.grammar.fsa.BuildBudget` of the fsa algorithms it
    calls; its errors carry where compilation was (see :meth:`_located`)."""

    def __init__(self, grammar: ir.Grammar, options: CompileOptions, deadline: float | None = None) -> None:
        self.g = grammar
        self.opt = options
        own = limits.now() + options.timeout_s if deadline is None else deadline
        within = limits.deadline_within(own)
        self.deadline = own if within is None else within
        self.where = ""  # the rule being worked on, named by a timeout
        self.total_states = 0
        self.rule_index: dict[str, int] = {}
        self.kept: list[str] = []
        self.exprs: dict[str, ir.Expr] = {}
        self._regular_cache: dict[ir.Expr, Dfa] = {}
        self._hoist_done: dict[int, tuple[ir.Expr, ir.Expr]] = {}
        self.dfa_rules: list[DfaRule | ProductRule | CountedRule] = []
        self.dfa_rule_owner: list[str] = []  # per entry of dfa_rules: the rule it was built in
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

    def _owner(self) -> str:
        """The source rule of the rule being built (what a synthetic rule made now comes from)."""
        name = self.where or self._hoist_owner or self.g.start
        return self.origin.get(name, name)

    # -- limits ---------------------------------------------------------------
    def check_time(self) -> None:
        """Raise CompileTimeoutError past the deadline (the clock is read every 256 calls),
        naming the rule being built or the late intersection that used the time."""
        self._tick += 1
        if self._tick & 255:
            return
        limits.check()  # the request was cancelled: stop here
        if limits.now() > self.deadline:
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

    def dfa_kernels(self) -> ModuleType:
        """:mod:`structgen.grammar._fsa_kernels`, loaded (the loading time extends the deadline)."""
        self.deadline += native_ready()
        # lazy: the kernels load numba, which a process that only checks text does without
        from structgen.grammar import _fsa_kernels

        return _fsa_kernels

    def work_budget(self) -> int:
        """Inner steps a compiled DFA kernel may take before the deadline (a conservative
        rate; the kernel stops with OUT_OF_TIME past it)."""
        return int(max(self.deadline - limits.now(), 0.0) * _KERNEL_STEPS_PER_S) + 1000

    def kernel_status(self, status: int, what: str) -> None:
        """Raise for a DFA kernel's LIMIT / OUT_OF_TIME status."""
        dk = self.dfa_kernels()  # loaded already: the status is one of theirs
        if status == dk.LIMIT:
            self.too_many_states(what)
        if status == dk.OUT_OF_TIME:
            self.deadline = min(self.deadline, limits.now())
            self.check_time_now()

    def too_many_states(self, what: str) -> NoReturn:
        """Raise the state-limit error for automaton ``what`` of the rule being built."""
        at = f" in rule {self.origin.get(self.where, self.where)!r}" if self.where else ""
        raise self._located(CompileLimitError(
            f"{what} automaton exceeds {self.opt.max_states} states{at} (CompileOptions.max_states)"))

    def rule_too_big(self, name: str) -> NoReturn:
        """Raise the state-limit error for the automaton of rule ``name``."""
        raise self._located(CompileLimitError(
            f"rule {self.origin.get(name, name)!r}: automaton exceeds "
            f"{self.opt.max_states} states (CompileOptions.max_states)"), name)

    def _check_unrolling(self, per_copy: int, copies_left: int, rule_states: int) -> None:
        """Refuse a repetition whose unrolled copies cannot fit before building them: every copy
        of an item takes as many NFA states as the first one took (``per_copy``), so a rule at
        ``rule_states`` with ``copies_left`` to go passes ``max_states`` when the sum does
        (``{"minItems": 10**9}`` is refused at once rather than after 200,000 states)."""
        if per_copy > 0 and rule_states + per_copy * copies_left > self.opt.max_states:
            name = self.where
            raise self._located(CompileLimitError(
                f"grammar automaton exceeds {self.opt.max_states} NFA states in rule "
                f"{self.origin.get(name, name)!r} (CompileOptions.max_states)"), name)

    def count_states(self, n: int, what: str) -> None:
        """Add ``n`` states to the grammar's total; raise past ``max_states``."""
        self.total_states += n
        if self.total_states > self.opt.max_states:
            raise self._located(CompileLimitError(
                f"grammar automaton exceeds {self.opt.max_states} states while building {what} "
                "(CompileOptions.max_states)"))

    # -- driver ---------------------------------------------------------------
    def compile(self) -> CompiledGrammar:
        """Run every step (see the module docstring) and return the compiled grammar."""
        g = self.g
        if len(g.rules) > self.opt.max_rules:
            raise CompileLimitError(f"grammar has {len(g.rules)} rules, more than "
                                    f"CompileOptions.max_rules={self.opt.max_rules}")
        rules = {n: remove_immediate_left_recursion(n, e, {}) for n, e in g.rules.items()}
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
        share_common(sorted(reach), rules, hoisted, self.origin)
        for name in hoisted.values():
            reach.add(name)
            refs[name] = set()
            _refs(rules[name], refs[name])
        # rules with equal bodies (the same string type under many property names) become
        # one rule: one automaton, and one set of runtime mask caches for all of them
        if merge_equal_rules(g.start, reach, rules, self.origin):
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
            count_refs(rules[n], counter)
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
            own = expr_size(rules[n])
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

        built: list[tuple[Nfa, int]] = []
        total = 0
        for n in self.kept:
            self.where = n
            nfa = Nfa()
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
        self.deadline += native_ready()  # (the kernels' loading time is not the grammar's)
        out: list[Rule] = [*freeze_rules(self.kept, built, self.dfa_rules, self.check_time)]
        out.extend(self.dfa_rules)
        # where each compiled rule comes from, for errors raised after compilation (the
        # token-budget check names the rule whose states it could not bound)
        made_from = {j: e for e, j in self.dfa_rule_index.items()}
        origins = tuple(self.origin.get(n, n) for n in self.kept) + tuple(self.dfa_rule_owner)
        exprs = (None,) * len(self.kept) + tuple(made_from.get(len(self.kept) + i)
                                                  for i in range(len(self.dfa_rules)))
        return CompiledGrammar(tuple(out), 0, None, source=self.g, options=self.opt,
                               rule_origins=origins, rule_exprs=exprs)

    def _hoist(self, e: ir.Expr, hoisted: dict[ir.Expr, str], rules: dict[str, ir.Expr]) -> ir.Expr:
        """Replace the item of a large repetition with a call to a synthetic rule (each node
        of the expression DAG visited once: results are kept by node, with the node)."""
        if expr_size(e) <= _COUNTED_MIN:
            # sizes only shrink downwards, so no repetition below is large enough to be
            # counted or hoisted
            return e
        got = self._hoist_done.get(id(e))
        if got is not None:
            return got[1]
        out = self._hoist_node(e, hoisted, rules)
        self._hoist_done[id(e)] = (e, out)
        return out

    def _hoist_node(self, e: ir.Expr, hoisted: dict[ir.Expr, str], rules: dict[str, ir.Expr]) -> ir.Expr:
        if isinstance(e, ir.Repeat):
            if self._countable(e):
                return Counted(e.item, e.min, e.max)
            item = self._hoist(e.item, hoisted, rules)
            reps = e.max if e.max is not None else max(e.min, 1)
            if reps > 2 and expr_size(item) * reps > 2000 and not isinstance(item, ir.Ref):
                name = hoisted.get(item)
                if name is None:
                    name = hoisted_name("__rep", item, hoisted, rules)
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
        if isinstance(e, Counted):
            return True
        if e.max is None or e.max < 2 or not _closed(e.item) or expr_size(e.item) * e.max <= _COUNTED_MIN:
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

    def _counted_rule(self, e: Counted) -> int:
        """Index of the (per-grammar) :class:`CountedRule` for ``e``."""
        j = self.dfa_rule_index.get(e)
        if j is None:
            d = self._regular_operand(e.item, (self.where or self.g.start,))
            j = len(self.kept) + len(self.dfa_rules)
            self.dfa_rule_index[e] = j
            self.dfa_rule_owner.append(self._owner())
            assert e.max is not None  # bounded: see _countable
            self.dfa_rules.append(CountedRule(f"__cnt{j}", d.trans, d.accept, e.min, e.max))
        return j

    # -- Thompson construction -------------------------------------------------
    def _build(self, nfa: Nfa, e: ir.Expr, s: int, inline_stack: tuple[str, ...], depth: int = 0) -> int:
        """Add ``e`` to ``nfa`` starting at state ``s``; return its end state.

        Each node is laid out by its generator (:meth:`_build_node`), which yields the
        sub-expressions it needs built and receives their end states. Here they are built
        by recursion, ``depth`` levels deep so far; past ``_DIRECT_DEPTH`` levels
        :meth:`_build_iterative` drives the generators from an explicit stack instead. Byte
        sets, sequences and alternations, most of any grammar, are laid out here directly,
        states and edges in the order their generators would give them (a generator per
        node costs more than the node)."""
        kind = type(e)
        if kind is ir.ByteSet:  # the commonest leaf, without a generator
            self.check_time()
            if nfa.n > self.opt.max_states:
                self._too_many_states(inline_stack)
            t = nfa.new()
            flat = nfa.edge_flat
            for lo, hi in cast(ir.ByteSet, e).ranges:
                flat += (s, lo, hi, t)
            return t
        if depth > _DIRECT_DEPTH:
            return self._build_iterative(nfa, e, s, inline_stack)
        if kind is ir.Seq or kind is ir.Alt:
            # the commonest inner nodes, by direct recursion (as _build_node lays them out)
            self.check_time()
            if nfa.n > self.opt.max_states:
                self._too_many_states(inline_stack)
            items = cast(ir.Seq, e).items
            if kind is ir.Seq:
                flat = nfa.edge_flat
                for it in items:
                    if type(it) is ir.ByteSet:  # a literal's bytes, without a call each
                        self.check_time()
                        if nfa.n > self.opt.max_states:
                            self._too_many_states(inline_stack)
                        t = nfa.new()
                        for lo, hi in it.ranges:
                            flat += (s, lo, hi, t)
                        s = t
                    else:
                        s = self._build(nfa, it, s, inline_stack, depth + 1)
                return s
            t = nfa.new()
            for it in items:
                b = nfa.new()
                nfa.eps_flat += (s, b)
                end = self._build(nfa, it, b, inline_stack, depth + 1)
                nfa.eps_flat += (end, t)
            return t
        node = self._build_node(nfa, e, s, inline_stack)
        try:
            req = next(node)
            while True:
                try:
                    end = self._build(nfa, req[0], req[1], req[2], depth + 1)
                except BaseException as exc:  # through the node, running its finally blocks
                    req = node.throw(exc)
                    continue
                req = node.send(end)
        except StopIteration as stop:
            return cast(int, stop.value)

    def _too_many_states(self, inline_stack: tuple[str, ...]) -> NoReturn:
        """Raise the state-limit error, naming the rule being built."""
        raise self._located(CompileLimitError(
            f"grammar automaton exceeds {self.opt.max_states} NFA states in rule "
            f"{self.origin.get(inline_stack[0], inline_stack[0])!r} (CompileOptions.max_states)"),
            inline_stack[0])

    def _build_iterative(self, nfa: Nfa, e: ir.Expr, s: int, inline_stack: tuple[str, ...]) -> int:
        """:meth:`_build` for any node at any depth.

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
                elif result is None:  # a generator just pushed: start it
                    req = next(gen)
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
            if isinstance(sub, ir.ByteSet):
                leaves: tuple[ir.Expr, ...] = (sub,)
            elif type(sub) is ir.Seq and all(type(x) is ir.ByteSet for x in sub.items):
                leaves = sub.items
            else:
                leaves = ()
            if leaves:
                # a byte set or a literal (a key, a keyword, punctuation), the common leaves:
                # a chain of states, without a generator per byte
                t = start
                flat = nfa.edge_flat
                for x in leaves:
                    nxt = nfa.new()
                    for lo, hi in cast(ir.ByteSet, x).ranges:
                        flat += (t, lo, hi, nxt)
                    t = nxt
                result = t
                continue
            stack.append(self._build_node(nfa, sub, start, where))
            result = None
        assert result is not None
        return result

    def _build_node(self, nfa: Nfa, e: ir.Expr, s: int, inline_stack: tuple[str, ...]) -> _BuildNode:
        """One node of :meth:`_build`: ``yield (sub, start, inline_stack)`` asks for ``sub``
        to be built from ``start`` and evaluates to its end state."""
        self.check_time()
        if nfa.n > self.opt.max_states:
            self._too_many_states(inline_stack)
        # (byte sets never come here: both drivers lay them out themselves)
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
                nfa.add_eps(s, b)
                end = yield (it, b, inline_stack)
                nfa.add_eps(end, t)
            return t
        if isinstance(e, Counted) and self.keep is not _NO_CALLS:
            t = nfa.new()
            nfa.add_call(s, self._counted_rule(e), t)
            return t
        if isinstance(e, ir.Repeat):
            cur = s
            copies = e.min + (1 if e.max is None else e.max - e.min)  # of the item, unrolled
            for i in range(e.min):
                before = len(nfa)
                cur = yield (e.item, cur, inline_stack)
                if i == 0:
                    self._check_unrolling(len(nfa) - before, copies - 1, len(nfa))
            if e.max is None:
                # cur -> loop: item* via a hub state
                hub = nfa.new()
                nfa.add_eps(cur, hub)
                b = nfa.new()
                nfa.add_eps(hub, b)
                end = yield (e.item, b, inline_stack)
                nfa.add_eps(end, hub)
                return hub
            k = e.max - e.min
            if k == 0:
                return cur
            t = nfa.new()
            for i in range(k):
                nfa.add_eps(cur, t)
                before = len(nfa)
                cur = yield (e.item, cur, inline_stack)
                if i == 0 and e.min == 0:
                    self._check_unrolling(len(nfa) - before, k - 1, len(nfa))
            nfa.add_eps(cur, t)
            return t
        if isinstance(e, ir.Ref):
            name = e.name
            if name in self.keep:
                t = nfa.new()
                nfa.add_call(s, self.rule_index[name], t)
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
                return lazy(nfa, s)
        if isinstance(e, (ir.And, ir.Diff, ir.Dfa)):
            d = self._regular(e, inline_stack)
            if d.trans.shape[0] <= _EMBED_MAX or self.keep is _NO_CALLS:
                return embed(nfa, d, s)
            t = nfa.new()
            if bool(d.accept.any()):  # an empty language leaves ``t`` unreachable
                nfa.add_call(s, self._dfa_rule(e, d), t)
            return t
        raise GrammarError(f"unknown IR node {type(e).__name__}")

    # -- regular sub-languages (And / Diff / Dfa) --------------------------------
    def _lazy_diff(self, e: ir.Diff, inline_stack: tuple[str, ...]) -> Callable[[Nfa, int], int] | None:
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
            if not all_states_infinite(a):
                return None
            b = self._regular_operand(e.right, inline_stack)
            if not finite_language(b):
                return None
        finally:
            self._regular_stack.pop()
        j = self.dfa_rule_index.get(e)
        if j is None:
            j = len(self.kept) + len(self.dfa_rules)
            self.dfa_rule_index[e] = j
            self.dfa_rule_owner.append(self._owner())
            self.dfa_rules.append(ProductRule(f"__diff{j}", a, b))
        return self._call_adder(j)

    @staticmethod
    def _call_adder(j: int) -> Callable[[Nfa, int], int]:
        """A function adding a call of rule ``j`` after a state (returns the new end state)."""
        def add(nfa: Nfa, s: int) -> int:
            t = nfa.new()
            nfa.add_call(s, j, t)
            return t
        return add

    def _dfa_rule(self, e: ir.Expr, d: Dfa) -> int:
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
            self.dfa_rule_owner.append(self._owner())
            self.dfa_rules.append(rule)
        return j

    def _regular(self, e: ir.Expr, inline_stack: tuple[str, ...]) -> Dfa:
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
            d = trim(Dfa(trans, acc, [() for _ in range(n)]))
        else:
            assert isinstance(e, (ir.And, ir.Diff))
            self._regular_stack.append(e)
            try:
                left = self._regular_operand(e.left, inline_stack)
                right = self._regular_operand(e.right, inline_stack)
                op = "and" if isinstance(e, ir.And) else "diff"
                d = product(left, right, op, self.opt.max_states, self)
                if self._late is None and limits.now() > self.deadline:
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

    def _regular_operand(self, e: ir.Expr, inline_stack: tuple[str, ...]) -> Dfa:
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
        nfa = Nfa()
        start = nfa.new()
        saved_keep = self.keep
        # operands of And/Diff must be fully regular: inline every non-recursive rule
        self.keep = _NO_CALLS
        try:
            end = self._build_regular(nfa, e, start, inline_stack)
        finally:
            self.keep = saved_keep
        d = determinise(nfa, start, end, inline_stack[0], self.opt.max_states, self)
        d = trim(d)
        if d.trans.shape[0] > MINIMISE_MIN:
            d = minimise(d, self.check_time_now)
        self._regular_cache[e] = d
        if shareable:
            with _CACHE_LOCK:
                _REGULAR[e] = d
                while len(_REGULAR) > _DFA_RULES_SIZE:
                    _REGULAR.popitem(last=False)
        return d

    def _build_regular(self, nfa: Nfa, e: ir.Expr, s: int, inline_stack: tuple[str, ...]) -> int:
        refs: set[str] = set()
        _refs(e, refs)
        bad = sorted(r for r in refs if r in self.recursive)
        if bad:
            raise GrammarError(
                f"intersection/difference over a recursive rule ({', '.join(bad)}) cannot be "
                "compiled to a finite automaton")
        return self._build(nfa, e, s, inline_stack)
