"""structgen: grammar-constrained, grammar-drafted generation for Hugging Face causal LMs.

``import structgen`` is deliberately light: it imports neither torch, transformers nor
pydantic. Heavy pieces load on first use of the attribute that needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from structgen.errors import (
    AssetError,
    CompileLimitError,
    CompileTimeoutError,
    ConfigError,
    ContextLengthError,
    GrammarError,
    GrammarSyntaxError,
    MatcherUsageError,
    ModelValidationError,
    RegexError,
    RequestCancelledError,
    SchemaError,
    StructgenError,
    TokenBudgetError,
    UnsupportedFeatureError,
    VocabularyError,
)

__version__ = "0.1.0"

# public name -> "module:attribute" (imported lazily on first access)
_LAZY = {
    "CompiledGrammar": "structgen.grammar.compiled:CompiledGrammar",
    "compile_grammar": "structgen.grammar.compiler:compile_grammar",
    "compile_json_schema": "structgen.frontends.json_schema.compiler:compile_json_schema",
    "compile_lark": "structgen.frontends.lark:compile_lark",
    "compile_regex": "structgen.frontends.regex:compile_regex_grammar",
    "Vocabulary": "structgen.masks.vocab:Vocabulary",
    "Matcher": "structgen.masks.matcher:Matcher",
    "allocate_bitmask": "structgen.kernels.bitmask:allocate_bitmask",
    "fill_bitmasks": "structgen.masks.matcher:fill_bitmasks",
    "CompileOptions": "structgen.config:CompileOptions",
    "JsonSchemaOptions": "structgen.config:JsonSchemaOptions",
    "SpecConfig": "structgen.config:SpecConfig",
    "StructgenLogitsProcessor": "structgen.integrations.transformers:StructgenLogitsProcessor",
    "StructgenBackend": "structgen.integrations.vllm_style:StructgenBackend",
    "generate": "structgen.generation.api:generate",
    "stream": "structgen.generation.api:stream",
    "generate_model": "structgen.generation.api:generate_model",
    "stream_model": "structgen.generation.api:stream_model",
    "PartialJsonReader": "structgen.generation.partial:PartialJsonReader",
    "GenerationResult": "structgen.generation.api:GenerationResult",
    "StreamEvent": "structgen.generation.api:StreamEvent",
}

__all__ = [
    "__version__",
    "AssetError", "CompileLimitError", "CompileTimeoutError", "ConfigError", "ContextLengthError",
    "GrammarError", "GrammarSyntaxError", "MatcherUsageError", "ModelValidationError", "RegexError",
    "RequestCancelledError",
    "SchemaError",
    "StructgenError", "TokenBudgetError",
    "UnsupportedFeatureError", "VocabularyError",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'structgen' has no attribute {name!r}")
    mod_name, attr = target.split(":")
    value = getattr(importlib.import_module(mod_name), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:  # pragma: no cover
    from structgen.config import CompileOptions, JsonSchemaOptions, SpecConfig
    from structgen.frontends.json_schema.compiler import compile_json_schema
    from structgen.frontends.lark import compile_lark
    from structgen.frontends.regex import compile_regex_grammar as compile_regex
    from structgen.generation.api import (
        GenerationResult,
        StreamEvent,
        generate,
        generate_model,
        stream,
        stream_model,
    )
    from structgen.generation.partial import PartialJsonReader
    from structgen.grammar.compiled import CompiledGrammar
    from structgen.grammar.compiler import compile_grammar
    from structgen.integrations.transformers import StructgenLogitsProcessor
    from structgen.integrations.vllm_style import StructgenBackend
    from structgen.kernels.bitmask import allocate_bitmask
    from structgen.masks.matcher import Matcher, fill_bitmasks
    from structgen.masks.vocab import Vocabulary
