"""The JSON Schema front-end's public names, at their stable path.

The implementation lives in :mod:`structgen.frontends.json_schema`.
"""

from structgen.config import JsonSchemaOptions
from structgen.frontends.json_schema.compiler import (
    SPEC_FORMATS,
    canonical_json,
    compile_json_schema,
    format_checker_for,
    schema_to_grammar,
    schema_warnings,
)
from structgen.frontends.json_schema.patterns import schema_for_re_validators

__all__ = ["JsonSchemaOptions", "SPEC_FORMATS", "canonical_json", "compile_json_schema", "format_checker_for",
           "schema_for_re_validators", "schema_to_grammar", "schema_warnings"]
