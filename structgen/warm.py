"""``python -m structgen.warm``: compile structgen's native kernels into numba's disk cache.

The grammar and mask kernels (``structgen/grammar/_*_kernels.py``, ``structgen/masks/_*_kernels.py``)
are numba functions with ``cache=True``: the first process that calls one compiles it (tens of
seconds of CPU for all of them) and stores the machine code on disk; every later process loads it
in milliseconds. ``scripts/setup.sh`` runs this module once, so that a user's first compile or
first mask does not pay for the compilation.

Where numba stores the code: in ``__pycache__`` beside each kernel module when that folder is
writable (an editable install, a wheel in a virtual environment), else in a per-user cache
folder (a system-wide install), or under ``$NUMBA_CACHE_DIR`` when set. Each cache entry records
its source file's modification time and size, so an edited kernel is compiled again rather than
loaded stale (numba's own check).

The workload: a small JSON Schema, a Lark grammar and a regex compiled, and a token mask filled
and a few tokens accepted for each over a byte-level vocabulary; that reaches every kernel with
the argument types structgen calls it with. Without numba (or with ``STRUCTGEN_NATIVE=0``) there
is nothing to compile and it says so.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import numpy as np

import structgen
from structgen.grammar.native import COMPILED
from structgen.masks import trie

__all__ = ["main", "warm_native_kernels"]

_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "kind": {"enum": ["a", "b"]},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "active"],
    "additionalProperties": False,
}
_LARK = 'start: item ("," item)*\nitem: WORD | "[" start "]"\nWORD: /[a-z]+/\n'
_REGEX = r"[A-Z][a-z]{2,8}( [0-9]+)?"


def warm_native_kernels() -> bool:
    """Run the workload (see the module docstring); False when the kernels are not native
    (numba missing or switched off), so nothing was cached."""
    if not COMPILED:
        return False
    trie.available()  # loads (or compiles) the trie, runtime and walk kernels
    tokens = [bytes([b]) for b in range(256)] + [b'{"', b'":', b'true', b'ab', b'</s>']
    vocab = structgen.Vocabulary(tokens, eos_token_ids=(len(tokens) - 1,))
    grammars = [
        (structgen.compile_json_schema(_SCHEMA), b'{"name":"Ada","age":36,"active":true}'),
        (structgen.compile_lark(_LARK), b"ab,[cd]"),
        (structgen.compile_regex(_REGEX), b"Ada 12"),
    ]
    mask = np.zeros((1, (vocab.vocab_size + 31) // 32), dtype=np.int32)
    for grammar, text in grammars:
        matcher = structgen.Matcher(grammar, vocab)
        for byte in text:
            matcher.fill_bitmask(mask, 0)
            matcher.accept_token(byte)
        matcher.fill_bitmask(mask, 0)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Warm the kernels; one line on stderr says what happened. Exit 0 (also when there is
    nothing to compile), 1 when the workload failed."""
    del argv
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        native = warm_native_kernels()
    except Exception as e:  # noqa: BLE001 - report any failure in one line; set-up decides
        print(f"structgen warm: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if not native:
        print("structgen warm: numba is not in use (missing, or STRUCTGEN_NATIVE=0): nothing to compile",
              file=sys.stderr)
        return 0
    print(f"structgen warm: native kernels ready in numba's disk cache "
          f"({time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU)", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
