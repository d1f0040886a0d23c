"""The compiled automaton kernels (:mod:`structgen.grammar._fsa_kernels`,
:mod:`structgen.grammar._rule_kernels`) as the grammar core reaches them: imported on first
use, since importing them imports numba, which ``import structgen`` should not pay for.

:func:`dfa_kernels` and :func:`rule_kernels` return the kernel modules (typed by
:class:`FsaKernels` and :class:`RuleKernels`, what their callers use of them);
:func:`native_ready` loads and warms them once per process and says how long that took, so
that a compile can leave that time out of its deadline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from structgen import limits

if TYPE_CHECKING:
    from structgen.grammar._jit import B1, I8, I32, I64, U8

__all__ = ["FsaKernels", "RuleKernels", "dfa_kernels", "native_ready", "rule_kernels"]


class FsaKernels(Protocol):
    """What :mod:`structgen.grammar.fsa` and the compiler use of
    :mod:`structgen.grammar._fsa_kernels` (statuses ``OK`` / ``LIMIT``; ``COMPILED``: whether
    the kernels are native code rather than plain Python)."""

    COMPILED: bool
    OK: int
    LIMIT: int

    def determinise(self, eps_o: I32, eps: I32, edg_o: I32, edg: I32, start: int, end: int, limit: int,
                    budget: int, stop: I8) -> tuple[int, I32, B1]:
        """Subset construction of a call-free NFA: ``(status, trans, accept)``."""
        ...

    def product(self, ta: I32, acc_a: B1, tb: I32, acc_b: B1, is_and: bool, limit: int, budget: int,
                stop: I8) -> tuple[int, I32, B1]:
        """The intersection or difference of two DFAs: ``(status, trans, accept)``."""
        ...

    def trim(self, trans: I32, accept: B1) -> tuple[I32, B1]:
        """The DFA restricted to reachable states that can accept."""
        ...

    def minimise(self, trans: I32, accept: B1, budget: int, stop: I8) -> tuple[int, I32, B1]:
        """Hopcroft minimisation of a trimmed DFA: ``(status, trans, accept)``."""
        ...

    def acyclic(self, trans: I32) -> bool:
        """Whether the DFA's graph has no cycle."""
        ...

    def warm(self) -> None:
        """Run every kernel once (loads them from numba's cache, or compiles them)."""
        ...


class RuleKernels(Protocol):
    """What :mod:`structgen.grammar.rule_nfas` uses of :mod:`structgen.grammar._rule_kernels`."""

    def live_states(self, first: I64, end: I64, eo: I32, eps: I32, do: I32, edges: I32, co: I32,
                    calls: I32, n_shared: int) -> tuple[B1, B1]:
        """Per state whether it reaches its rule's end, per rule whether it is non-empty."""
        ...

    def left_calls(self, first: I64, end: I64, eo: I32, eps: I32, co: I32, calls: I32,
                   shared_nullable: B1) -> I64:
        """The ``(rule, callee)`` calls a rule can make before reading a byte."""
        ...

    def frozen_rules(self, first: I64, end: I64, eps_rows: I32, edge_rows: I32, call_rows: I32,
                     shared_nullable: B1) -> tuple[bool, I32, I32, I32, I32, I32, I32, U8, I32, I64, B1, I64]:
        """Every pass of ``freeze_rules`` at once: the rules' NFAs grouped, trimmed, in byte
        classes, with their important states and left calls."""
        ...

    def warm(self) -> None:
        """Run every kernel once (loads them from numba's cache, or compiles them)."""
        ...


def rule_kernels() -> RuleKernels:
    """:mod:`structgen.grammar._rule_kernels`, imported on first use (it imports numba)."""
    from structgen.grammar import _rule_kernels

    return _rule_kernels


def dfa_kernels() -> FsaKernels:
    """:mod:`structgen.grammar._fsa_kernels`, imported on first use (it imports numba)."""
    from structgen.grammar import _fsa_kernels

    return _fsa_kernels


_NATIVE_READY = False


def native_ready() -> float:
    """Load the compiled grammar kernels once per process (a no-op without numba); returns the
    seconds it took (0 once loaded), which a compile adds to its deadline: loading code is
    a cost of the process, not of the grammar being compiled."""
    global _NATIVE_READY
    if _NATIVE_READY:
        return 0.0
    t0 = limits.now()
    kernels = dfa_kernels()
    if kernels.COMPILED:
        from structgen.grammar import _rule_kernels

        kernels.warm()
        _rule_kernels.warm()
    _NATIVE_READY = True
    return limits.now() - t0
