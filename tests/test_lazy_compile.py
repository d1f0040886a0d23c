"""Work that compiling defers until it is needed gives what the eager work gives.

* rule sources (where each compiled rule comes from in the schema) are placed on their first
  read, equal to placing them at compile time, and survive pickling.
"""

from __future__ import annotations

import pickle

from structgen.config import CompileOptions, JsonSchemaOptions
from structgen.frontends.json_schema import compiler as jsc
from structgen.frontends.json_schema.diagnostics import rule_sources
from structgen.grammar import compiler as gcomp

SCHEMA = {
    "type": "object",
    "$defs": {
        "node": {"type": "object", "properties": {
            "name": {"type": "string", "pattern": "^[a-z]+[0-9]*$"},
            "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}},
    },
    "properties": {
        "root": {"$ref": "#/$defs/node"},
        "tag": {"type": "string", "pattern": "^[a-z]{2,5}x?$", "maxLength": 300, "not": {"const": "ab"}},
        "when": {"type": "string", "format": "date"},
        "n": {"type": "integer", "minimum": 3, "maximum": 1234},
    },
    "required": ["root"],
}


def test_rule_sources_are_placed_on_first_read_as_at_compile_time() -> None:
    opts = JsonSchemaOptions().for_generation()
    jsc._CACHE.clear()
    gcomp._CACHE.clear()
    cg = jsc.compile_json_schema(SCHEMA, options=opts)
    assert cg._sources_fn is not None  # deferred
    placed = cg.rule_sources
    assert cg._sources_fn is None
    # the eager placement, on a fresh compile of the same IR
    grammar, _w, low = jsc._build_guarded(SCHEMA, opts.for_validation(), None)
    gcomp._CACHE.clear()
    fresh = gcomp.compile_grammar(grammar, CompileOptions())
    eager = rule_sources(fresh, grammar, low.rule_where, low.rule_kw, low.expr_kw, low.doc)
    assert placed == eager
    assert any(s.pointer not in (None, "#") for s in placed)  # placed inside the schema
    # a pickled grammar carries the places
    again = jsc.compile_json_schema(SCHEMA, options=opts)
    assert again is cg
    cg2 = pickle.loads(pickle.dumps(jsc.compile_json_schema({**SCHEMA, "required": ["n"]}, options=opts)))
    assert cg2._sources_fn is None and len(cg2.rule_sources) == len(cg2.rules)
