"""structgen: grammar-constrained, grammar-drafted generation for Hugging Face causal LMs.

``import structgen`` is deliberately light: it imports neither torch, transformers nor
pydantic. Heavy pieces load on first use of the attribute that needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    AssetError,
    CompileLimitError,
    CompileTimeoutError,
    ConfigError,
    ContextLengthError,
    GrammarError,
    GrammarSyntaxError,
    MatcherUsageError,
    RegexError,
    SchemaError,
    StructgenError,
    UnsupportedFeatureError,
    VocabularyError,
)

__version__ = "0.1.0"

# public name -> "module:attribute" (imported lazily on first access)
_LAZY = {
    "CompiledGrammar": "structgen.automaton:CompiledGrammar",
    "compile_grammar": "structgen.automaton:compile_grammar",
    "compile_json_schema": "structgen.json_schema:compile_json_schema",
    "compile_lark": "structgen.lark_frontend:compile_lark",
    "compile_regex": "structgen.regex:compile_regex_grammar",
    "Vocabulary": "structgen.vocab:Vocabulary",
    "Matcher": "structgen.matcher:Matcher",
    "allocate_bitmask": "structgen.matcher:allocate_bitmask",
    "fill_bitmasks": "structgen.matcher:fill_bitmasks",
    "CompileOptions": "structgen.config:CompileOptions",
    "JsonSchemaOptions": "structgen.config:JsonSchemaOptions",
    "SpecConfig": "structgen.config:SpecConfig",
    "StructgenLogitsProcessor": "structgen.integrations:StructgenLogitsProcessor",
    "StructgenBackend": "structgen.integrations:StructgenBackend",
    "generate": "structgen.api:generate",
    "stream": "structgen.api:stream",
    "generate_model": "structgen.api:generate_model",
    "GenerationResult": "structgen.api:GenerationResult",
}

__all__ = [
    "__version__",
    "AssetError", "CompileLimitError", "CompileTimeoutError", "ConfigError", "ContextLengthError",
    "GrammarError", "GrammarSyntaxError", "MatcherUsageError", "RegexError", "SchemaError",
    "StructgenError",
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
    from .api import GenerationResult, generate, generate_model, stream
    from .automaton import CompiledGrammar, compile_grammar
    from .config import CompileOptions, JsonSchemaOptions, SpecConfig
    from .json_schema import compile_json_schema
    from .lark_frontend import compile_lark
    from .matcher import Matcher, allocate_bitmask, fill_bitmasks
    from .vocab import Vocabulary
