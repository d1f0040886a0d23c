"""Use structgen's grammars inside generation stacks that run their own decoding loop.

One module per host library, all plain grammar-constrained decoding:

* :mod:`structgen.integrations.transformers`: :class:`StructgenLogitsProcessor`, a
  ``transformers`` ``LogitsProcessor`` for ``model.generate``;
* :mod:`structgen.integrations.vllm_style`: :class:`StructgenBackend` / :class:`StructgenGrammar`,
  the structured-output contract of serving engines in vLLM's style that are not vLLM;
* :mod:`structgen.integrations.vllm`: structgen as the structured-output backend of vLLM itself
  (loaded by vLLM as a plug-in; not imported here).

``import structgen.integrations`` imports neither torch nor transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from structgen.errors import IntegrationError, TokenRejectedError
from structgen.frontends.constraint import compile_constraint

if TYPE_CHECKING:  # pragma: no cover
    from structgen.integrations.transformers import StructgenLogitsProcessor
    from structgen.integrations.vllm_style import REQUEST_TYPES, StructgenBackend, StructgenGrammar

__all__ = ["IntegrationError", "TokenRejectedError", "StructgenLogitsProcessor", "StructgenBackend",
           "StructgenGrammar", "compile_constraint", "REQUEST_TYPES"]

# Loaded on first access: the mask engine loads numba, which vLLM's worker processes must not
# see when vLLM loads its plug-in (structgen.integrations.vllm) from this package.
_LAZY = {"StructgenLogitsProcessor": "transformers", "StructgenBackend": "vllm_style",
         "StructgenGrammar": "vllm_style", "REQUEST_TYPES": "vllm_style"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
