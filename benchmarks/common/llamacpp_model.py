"""The llama.cpp model a benchmark's ``--backend llamacpp`` runs (shared by lossless.py,
generate.py and batch.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any


def load(model: str, threads: int, smoke: bool = False) -> tuple[Any, str, str]:
    """``(lm, gguf_path, name)`` for ``model``: an alias (its ``ALIAS-gguf`` twin, pulled with
    ``structgen models pull``) or a ``.gguf`` path, run by structgen's llama.cpp backend with
    ``threads`` threads; with ``smoke`` the tiny GGUF of the tests, written to a temporary folder."""
    from structgen.assets.store import GGUF_SUFFIX, resolve_model
    from structgen.generation.llamacpp import is_gguf_path, load_gguf

    if smoke:
        from tests._tiny_gguf import write_tiny_gguf

        path = write_tiny_gguf(Path(tempfile.mkdtemp(prefix="bench-gguf-")) / "tiny.gguf")
        name = "tiny-gguf"
        # its training context is 1024 positions; the smoke prompts (schemas spelled out by a
        # tokenizer of 300 merges) are longer, and the random model does not care
        return load_gguf(path, n_threads=threads, n_ctx=4096), str(path), name
    elif is_gguf_path(model):
        path, name = Path(model), Path(model).name
    else:
        name = model if model.endswith(GGUF_SUFFIX) else model + GGUF_SUFFIX
        path = resolve_model(name)
    return load_gguf(path, n_threads=threads), str(path), name
