"""The whole-grammar passes over the Thompson NFAs of the rules a compile keeps as calls.

Once :mod:`structgen.grammar.compiler` has built one NFA per kept rule (byte edges, epsilons
and call edges to rules by index), these run over all of them together:

* :func:`trim_rule_nfas` keeps only the states that can still reach their rule's end, through
  calls to rules whose language is non-empty (a fixpoint over rules decides which are), so
  that every DFA state built lazily at run time can complete its rule;
* :func:`check_left_recursion` rejects a rule that can call itself before reading a byte;
* :func:`lazy_rule` freezes a trimmed NFA into the :class:`~structgen.grammar.compiled.LazyRule`
  the runtime determinises on first use.

The shared call-free rules (:class:`~structgen.grammar.compiled.DfaRule` and the other
``dfa_rules`` of a compile) follow the kept rules in the rule numbering; they are trimmed and
non-empty by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from structgen.errors import GrammarError
from structgen.grammar.compiled import LazyRule, Rule
from structgen.grammar.fsa import Nfa, byte_classes
from structgen.grammar.graphs import strongly_connected_components

__all__ = ["check_left_recursion", "lazy_rule", "trim_rule_nfas"]


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


def lazy_rule(name: str, nfa: Nfa, end: int) -> LazyRule:
    """Freeze a trimmed NFA into a :class:`LazyRule`."""
    class_of, nclass, cedges = byte_classes(nfa)
    return LazyRule(name, tuple(tuple(x) for x in nfa.eps), tuple(tuple(es) for es in cedges),
                    tuple(tuple(c) for c in nfa.calls), end, class_of, nclass)
