"""The whole-grammar passes over the Thompson NFAs of the rules a compile keeps as calls.

Once :mod:`structgen.grammar.compiler` has built one NFA per kept rule (byte edges, epsilons
and call edges to rules by index), :func:`freeze_rules` runs over all of them together, in
one set of flat arrays and the compiled kernels of :mod:`structgen.grammar._rule_kernels`:

* trimming keeps only the states that can still reach their rule's end, through calls to
  rules whose language is non-empty (a fixpoint over rules decides which are), so that every
  DFA state built lazily at run time can complete its rule;
* a rule that can call itself before reading a byte (left recursion) is rejected;
* the trimmed NFAs are frozen into the :class:`~structgen.grammar.compiled.LazyRule` the
  runtime determinises on first use.

The shared call-free rules (:class:`~structgen.grammar.compiled.DfaRule` and the other
``dfa_rules`` of a compile) follow the kept rules in the rule numbering; they are trimmed and
non-empty by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from structgen.errors import GrammarError
from structgen.grammar.compiled import CountedRule, DfaRule, LazyRule, ProductRule, Rule, _Csr
from structgen.grammar.fsa import Nfa, csr_arrays
from structgen.grammar.fsa_native import rule_kernels
from structgen.grammar.graphs import strongly_connected_components

__all__ = ["freeze_rules"]

SharedRule = DfaRule | ProductRule | CountedRule  # the call-free rules that follow the kept ones


def freeze_rules(names: Sequence[str], built: list[tuple[Nfa, int]], shared: Sequence[SharedRule],
                 tick: Callable[[], None]) -> list[LazyRule]:
    """The kept rules as :class:`LazyRule` objects holding the flat arrays the compiled
    runtime reads, trimmed (see the module docstring). ``built``: per rule (the start rule
    first) its NFA and end state, ``names`` their names; ``shared``: the call-free rules that
    follow them; ``tick``: the compile's deadline check, called between passes. Raises
    GrammarError when the start rule's language is empty or a rule is left-recursive. Every
    rule goes through the same few array operations: per-rule numpy calls would dominate for
    small rules."""
    if not built:
        return []
    kernels = rule_kernels()
    n_rules = len(built)
    n_states = np.array([len(nfa) for nfa, _end in built], dtype=np.int64)
    first = np.zeros(n_rules + 1, dtype=np.int64)  # per rule: its first state in the joined lists
    np.cumsum(n_states, out=first[1:])
    end = np.array([e for _nfa, e in built], dtype=np.int64)
    eo, eps, do, edges, co, calls = _joined_csr(built, first)
    tick()
    good, nonempty = kernels.live_states(first, end, eo, eps, do, edges, co, calls, len(shared))
    if not nonempty[0]:
        raise GrammarError(f"the grammar accepts no string at all (start rule {names[0]!r})")
    # drop every edge from or into a state that cannot reach its rule's end, and the calls of
    # empty rules; the states keep their numbers
    base = np.repeat(first[:-1], n_states)  # per state: its rule's first state

    def kept(off: NDArray[np.int32], targets: NDArray[np.int32],
             also: NDArray[np.bool_] | None = None) -> tuple[NDArray[np.int32], NDArray[np.bool_]]:
        src = np.repeat(np.arange(first[-1]), np.diff(off))
        keep = good[src] & good[base[src] + targets]
        if also is not None:
            keep &= also
        new_off = np.zeros(off.shape[0], dtype=np.int32)
        np.cumsum(np.bincount(src[keep], minlength=off.shape[0] - 1), out=new_off[1:])
        return new_off, keep

    eo, keep = kept(eo, eps)
    eps = eps[keep]
    do, keep = kept(do, edges[:, 2])
    edges = edges[keep]
    co, keep = kept(co, calls[:, 1], nonempty[calls[:, 0]])
    calls = calls[keep]
    tick()
    shared_nullable = np.array([r.nullable for r in shared], dtype=np.bool_)
    _check_left_recursion(names, shared, kernels.left_calls(first, end, eo, eps, co, calls, shared_nullable))
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
    important[first[:-1] + end] = 1
    s_at = first.tolist()
    e_at, d_at, c_at = eo[first].tolist(), do[first].tolist(), co[first].tolist()
    out = []
    for r, (name, (_nfa, rule_end)) in enumerate(zip(names, built)):
        s0, s1 = s_at[r], s_at[r + 1]
        csr = _Csr(eo[s0:s1 + 1] - e_at[r], eps[e_at[r]:e_at[r + 1]],
                   do[s0:s1 + 1] - d_at[r], edges[d_at[r]:d_at[r + 1]],
                   co[s0:s1 + 1] - c_at[r], calls[c_at[r]:c_at[r + 1]], important[s0:s1])
        out.append(LazyRule.from_csr(name, csr, rule_end, class_of[r], n_classes[r], marker_class[r]))
    return out


def _joined_csr(built: list[tuple[Nfa, int]], first: NDArray[np.int64]) -> tuple[NDArray[np.int32], ...]:
    """The rules' NFAs in one set of CSR arrays (as :func:`~structgen.grammar.fsa.nfa_arrays`
    lays them out): sources numbered on from each rule's ``first`` state, targets left local
    to their rule. Each kind of edge of all rules goes through one conversion."""
    cols = []
    for k, width in ((0, 2), (1, 4), (2, 3)):
        lists = [(nfa.eps_flat, nfa.edge_flat, nfa.call_flat)[k] for nfa, _end in built]
        counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists)) // width
        joined: list[int] = []
        for part in lists:
            joined += part
        rows = np.array(joined, dtype=np.int32).reshape(-1, width)
        rows[:, 0] += np.repeat(first[:-1], counts).astype(np.int32)
        cols.append(rows)
    return csr_arrays(int(first[-1]), cols[0], cols[1], cols[2])


def _check_left_recursion(names: Sequence[str], shared: Sequence[Rule], pairs: NDArray[np.int64]) -> None:
    """Raise GrammarError naming the rules of a cycle of calls made before a byte is read
    (``pairs``: rows ``(rule, callee)`` of such calls)."""
    all_names = list(names) + [r.name for r in shared]
    left: dict[str, set[str]] = {n: set() for n in all_names}
    for r, q in pairs.tolist():
        left[all_names[r]].add(all_names[q])
    for comp in strongly_connected_components(all_names, left):
        if len(comp) > 1 or comp[0] in left[comp[0]]:
            raise GrammarError(
                "left recursion through rule(s) " + " -> ".join(sorted(comp))
                + "; rewrite it as repetition (e.g. A: A x | y  =>  A: y x*)")
