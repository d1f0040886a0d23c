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

from typing import TYPE_CHECKING

from structgen.errors import IntegrationError, TokenRejectedError
from structgen.frontends.constraint import compile_constraint
from structgen.integrations import transformers as _transformers
from structgen.integrations.vllm_style import REQUEST_TYPES, StructgenBackend, StructgenGrammar

if TYPE_CHECKING:  # pragma: no cover
    from structgen.integrations.transformers import StructgenLogitsProcessor

__all__ = ["IntegrationError", "TokenRejectedError", "StructgenLogitsProcessor", "StructgenBackend",
           "StructgenGrammar", "compile_constraint", "REQUEST_TYPES"]


def __getattr__(name: str) -> type:
    if name == "StructgenLogitsProcessor":  # built on first access: imports transformers
        return _transformers.StructgenLogitsProcessor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
