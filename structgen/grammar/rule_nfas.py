"""The whole-grammar passes over the Thompson NFAs of the rules a compile keeps as calls.

Once :mod:`structgen.grammar.compiler` has built one NFA per kept rule (byte edges, epsilons
and call edges to rules by index), these run over all of them together:

* :func:`trim_rule_nfas` keeps only the states that can still reach their rule's end, through
  calls to rules whose language is non-empty (a fixpoint over rules decides which are), so
  that every DFA state built lazily at run time can complete its rule;
* :func:`check_left_recursion` rejects a rule that can call itself before reading a byte;
* :func:`lazy_rules` freezes the trimmed NFAs into the :class:`~structgen.grammar.compiled.LazyRule`
  the runtime determinises on first use.

The shared call-free rules (:class:`~structgen.grammar.compiled.DfaRule` and the other
``dfa_rules`` of a compile) follow the kept rules in the rule numbering; they are trimmed and
non-empty by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain

import numpy as np

from structgen.errors import GrammarError
from structgen.grammar.compiled import LazyRule, Rule, _Csr
from structgen.grammar.fsa import Nfa, nfa_arrays
from structgen.grammar.graphs import strongly_connected_components

__all__ = ["check_left_recursion", "lazy_rules", "trim_rule_nfas"]


def trim_rule_nfas(built: list[tuple[Nfa, int]], shared: int, start: str,
                   tick: Callable[[], None]) -> list[tuple[Nfa, int]]:
    """``built`` (per kept rule, its NFA and end state; the start rule first, named ``start``)
    with only the NFA states that can reach their rule's end (through byte edges, epsilons and
    calls to rules whose language is non-empty), edges into the rest dropped. ``shared``: how
    many call-free rules follow the kept ones (non-empty). ``tick`` is called once per rule and
    pass (the compile's deadline check). Raises GrammarError when the start rule's language is
    empty."""
    preds: list[list[list[int]]] = []
    call_preds: list[list[list[tuple[int, int]]]] = []
    for nfa, _end in built:
        tick()
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
    nonempty = [False] * len(built) + [True] * shared
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
            tick()
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
        raise GrammarError(f"the grammar accepts no string at all (start rule {start!r})")
    out: list[tuple[Nfa, int]] = []
    for i, (nfa, end) in enumerate(built):
        g = good[i]
        if all(g) and all(nonempty[r] for r in callees[i]):
            out.append((nfa, end))  # nothing to drop
            continue
        kept = Nfa()
        kept.eps = [[y for y in ys if g[y]] if g[x] else [] for x, ys in enumerate(nfa.eps)]
        kept.edges = [[e for e in es if g[e[2]]] if g[x] else [] for x, es in enumerate(nfa.edges)]
        kept.calls = [[(r, y) for r, y in cs if nonempty[r] and g[y]] if g[x] else []
                      for x, cs in enumerate(nfa.calls)]
        out.append((kept, end))
    return out


def check_left_recursion(built: list[tuple[Nfa, int]], names: Sequence[str], shared: Sequence[Rule]) -> None:
    """Reject left recursion (a rule that can call itself before consuming a byte): raises
    GrammarError naming the rules of the cycle. ``built``: the kept rules' trimmed NFAs and
    end states, ``names`` their names; ``shared``: the call-free rules that follow them."""
    def reach(nfa: Nfa, nullable: list[bool]) -> tuple[set[int], set[int]]:
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

    nullable = [False] * len(built) + [bool(r.info(0)[1]) for r in shared]
    all_names = list(names) + [r.name for r in shared]
    changed = True
    while changed:
        changed = False
        for i, (nfa, end) in enumerate(built):
            if not nullable[i] and end in reach(nfa, nullable)[0]:
                nullable[i] = True
                changed = True
    left = {names[i]: {all_names[r] for r in reach(nfa, nullable)[1]}
            for i, (nfa, _end) in enumerate(built)}
    for r in shared:
        left[r.name] = set()
    for comp in strongly_connected_components(all_names, left):
        if len(comp) > 1 or comp[0] in left[comp[0]]:
            raise GrammarError(
                "left recursion through rule(s) " + " -> ".join(sorted(comp))
                + "; rewrite it as repetition (e.g. A: A x | y  =>  A: y x*)")


def lazy_rules(names: Sequence[str], built: list[tuple[Nfa, int]]) -> list[LazyRule]:
    """Freeze trimmed NFAs (``built``: per rule its NFA and end state, ``names`` their names)
    into :class:`LazyRule` objects holding the flat arrays the compiled runtime reads (their
    Python lists are built only if a plain-Python path asks for them). Every rule is flattened
    in the same few array operations: per-rule numpy calls would dominate for small rules."""
    if not built:
        return []
    n_rules = len(built)
    n_states = np.array([len(nfa) for nfa, _end in built], dtype=np.int64)
    first = np.zeros(n_rules + 1, dtype=np.int64)  # per rule: its first state in the joined lists
    np.cumsum(n_states, out=first[1:])
    eo, eps, do, edges, co, calls = nfa_arrays(
        list(chain.from_iterable(nfa.eps for nfa, _end in built)),
        list(chain.from_iterable(nfa.edges for nfa, _end in built)),
        list(chain.from_iterable(nfa.calls for nfa, _end in built)))
    # byte classes per rule: bytes between two consecutive edge boundaries go everywhere alike
    rule_of_edge = np.repeat(np.repeat(np.arange(n_rules), n_states), np.diff(do))
    bound = np.zeros((n_rules, 257), dtype=np.bool_)
    bound[:, 0] = bound[:, 256] = True
    bound[rule_of_edge, edges[:, 0]] = True
    bound[rule_of_edge, edges[:, 1] + 1] = True
    class_of = (np.cumsum(bound[:, :256], axis=1, dtype=np.int32) - 1).astype(np.int32)
    n_classes = (bound.sum(axis=1) - 1).tolist()
    # a class of value-check markers only (0xF8-0xFF) starts at a boundary among them
    marker_class: list[bool] = np.asarray(bound[:, 0xF8:0x100].any(axis=1)).tolist()
    edges[:, 0] = class_of[rule_of_edge, edges[:, 0]]
    edges[:, 1] = class_of[rule_of_edge, edges[:, 1]]
    # the important states: byte or call edges, and each rule's end
    important = ((np.diff(do) > 0) | (np.diff(co) > 0)).astype(np.uint8)
    important[first[:-1] + np.array([end for _nfa, end in built], dtype=np.int64)] = 1
    s_at = first.tolist()
    e_at, d_at, c_at = eo[first].tolist(), do[first].tolist(), co[first].tolist()
    out = []
    for r, (name, (_nfa, end)) in enumerate(zip(names, built)):
        s0, s1 = s_at[r], s_at[r + 1]
        csr = _Csr(eo[s0:s1 + 1] - e_at[r], eps[e_at[r]:e_at[r + 1]],
                   do[s0:s1 + 1] - d_at[r], edges[d_at[r]:d_at[r + 1]],
                   co[s0:s1 + 1] - c_at[r], calls[c_at[r]:c_at[r + 1]], important[s0:s1])
        out.append(LazyRule.from_csr(name, csr, end, class_of[r], n_classes[r], marker_class[r]))
    return out
