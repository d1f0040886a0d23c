"""One spawned worker process with the Triton interpreter on, for tests that run Triton kernels on
CPU tensors.

``TRITON_INTERPRET=1`` only works when it is set before ``triton`` is first imported, and
another test module may already have imported it; so the kernels run in a spawned worker whose
initializer sets the variable before anything imports triton (this process's environment and
modules are never touched). A case is a module-level function submitted to the worker; an
AssertionError raised there is re-raised by ``future.result()``.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor


def _worker_init() -> None:
    import torch

    os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


def _interpreter_active() -> bool:
    from structgen.generation.verify import load_kernels

    return bool(load_kernels("triton_verify").interpreter_active())


def interpreter_worker(timeout_s: float = 300) -> Iterator[ProcessPoolExecutor]:
    """Yield the worker (for a module-scoped fixture), checking the interpreter is on in it."""
    ex = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_init)
    try:
        assert ex.submit(_interpreter_active).result(timeout=timeout_s)
        yield ex
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
