"""The grammar's compiled kernels as the other packages use them (the mask walks of
:mod:`structgen.masks`, the warm-up command): ``njit`` (numba's, or a pass-through when the
kernels run as plain Python), ``COMPILED`` (whether they are native), the runtime's lazy
transition ``expand`` with its answers ``DONE`` / ``NEED_GROW`` / ``UNKNOWN``, the stack
successor ``succ_row``, ``Tables`` (the runtime tables as the kernels see them) and ``int64``
(``np.int64`` typed, for kernels that return it). The kernels themselves live in the private
modules ``_jit``, ``_runtime_kernels``, ``_stack_kernels`` and ``_fsa_kernels``; their layout
may change with the runtime, this surface changes only with its callers."""

from __future__ import annotations

from structgen.grammar import _fsa_kernels
from structgen.grammar._jit import COMPILED, int64, njit
from structgen.grammar._runtime_kernels import DONE, NEED_GROW, UNKNOWN, Tables, expand
from structgen.grammar._stack_kernels import succ_row

__all__ = ["COMPILED", "DONE", "NEED_GROW", "UNKNOWN", "Tables", "expand", "int64", "njit", "succ_row",
           "warm_fsa_kernels"]


def warm_fsa_kernels() -> None:
    """Compile (or load from numba's cache) the automaton kernels of :mod:`structgen.grammar.fsa`."""
    _fsa_kernels.warm()
