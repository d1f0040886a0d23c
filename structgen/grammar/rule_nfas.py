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
from structgen.grammar.fsa import Nfa
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
    GrammarError when the start rule's language is empty or a rule is left-recursive. All
    rules go through one kernel call together (:func:`~structgen.grammar._rule_kernels.frozen_rules`):
    per-rule, or even per-pass, array calls would dominate for small grammars."""
    if not built:
        return []
    kernels = rule_kernels()
    n_rules = len(built)
    n_states = np.array([len(nfa) for nfa, _end in built], dtype=np.int64)
    first = np.zeros(n_rules + 1, dtype=np.int64)  # per rule: its first state in the joined lists
    np.cumsum(n_states, out=first[1:])
    end = np.array([e for _nfa, e in built], dtype=np.int64)
    eps_rows, edge_rows, call_rows = _joined_rows(built, first)
    shared_nullable = np.array([r.nullable for r in shared], dtype=np.bool_)
    tick()
    (ok, eo, eps, do, edges, co, calls, important, class_of, n_classes_a, marker_a,
     left) = kernels.frozen_rules(first, end, eps_rows, edge_rows, call_rows, shared_nullable)
    tick()
    if not ok:
        raise GrammarError(f"the grammar accepts no string at all (start rule {names[0]!r})")
    if left.shape[0]:
        _check_left_recursion(names, shared, left)
    n_classes: list[int] = n_classes_a.tolist()
    marker_class: list[bool] = marker_a.tolist()
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


def _joined_rows(built: list[tuple[Nfa, int]], first: NDArray[np.int64]) -> tuple[NDArray[np.int32], ...]:
    """The rules' edge rows (as :meth:`~structgen.grammar.fsa.Nfa.flat_arrays` gives them) in
    one array per kind of edge: sources numbered on from each rule's ``first`` state, targets
    left local to their rule. Each kind goes through one conversion."""
    out = []
    for k, width in ((0, 2), (1, 4), (2, 3)):
        lists = [(nfa.eps_flat, nfa.edge_flat, nfa.call_flat)[k] for nfa, _end in built]
        counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists)) // width
        joined: list[int] = []
        for part in lists:
            joined += part
        rows = np.array(joined, dtype=np.int32).reshape(-1, width)
        rows[:, 0] += np.repeat(first[:-1], counts).astype(np.int32)
        out.append(rows)
    return out[0], out[1], out[2]


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
