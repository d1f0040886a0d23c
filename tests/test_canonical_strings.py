"""Generation spells strings canonically (``string_escapes="canonical"``), validation accepts
every JSON spelling: enum values, consts and property names are forced text when generating."""

from __future__ import annotations

import json

import jsonschema
import pytest

import structgen
from structgen.generation.api import resolve_grammar
from structgen.integrations import compile_constraint

SCHEMA = {
    "type": "object",
    "properties": {"status": {"enum": ["open", "closed", "pending"]}, "kind": {"const": "tick\u00e9t"},
                   "path": {"type": "string", "pattern": "^/"}},
    "required": ["status", "kind", "path"],
    "additionalProperties": False,
}
CANONICAL = json.dumps({"status": "pending", "kind": "tick\u00e9t", "path": "/a\"b\n"},
                       ensure_ascii=False, separators=(",", ":"))
ESCAPED = [
    '{"status":"p\\u0065nding","kind":"tick\u00e9t","path":"/a\\"b\\n"}',      # enum value
    '{"st\\u0061tus":"pending","kind":"tick\u00e9t","path":"/a\\"b\\n"}',      # property name
    '{"status":"pending","kind":"tick\\u00E9t","path":"/a\\"b\\n"}',           # const, upper hex
    '{"status":"pending","kind":"tick\u00e9t","path":"\\/a\\"b\\u000a"}',      # \/ and \u000a
]


def _generation_grammars() -> list:
    # every door to a generation grammar, the mask front door (compile_json_schema) included
    return [resolve_grammar(schema=SCHEMA)[0], compile_constraint("json", SCHEMA),
            structgen.compile_json_schema(SCHEMA)]


def test_validation_accepts_every_spelling_generation_only_the_canonical_one() -> None:
    validating = structgen.compile_json_schema(SCHEMA, for_generation=False)
    for text in [CANONICAL, *ESCAPED]:
        jsonschema.validate(json.loads(text), SCHEMA)  # the oracle: all are valid
        assert validating.accepts(text), text
    for g in _generation_grammars():
        assert g.accepts(CANONICAL)
        for text in ESCAPED:
            assert not g.accepts(text), text


@pytest.mark.parametrize("prefix, rest", [
    ('{"status":"p', 'ending","kind":"tick\u00e9t","path":"/'),
    ('{"status":"c', 'losed","kind":"tick\u00e9t","path":"/'),
    ('{"status":"o', 'pen","kind":"tick\u00e9t","path":"/'),
])
def test_enum_rest_const_and_keys_are_forced_after_the_distinguishing_byte(prefix: str, rest: str) -> None:
    # a byte-level vocabulary: forced text is exactly what the grammar alone determines
    vocab = structgen.Vocabulary([bytes([b]) for b in range(256)] + [None], eos_token_ids=[256])
    for g in _generation_grammars():
        m = structgen.Matcher(g, vocab)
        assert m.accept_tokens(list(prefix.encode())) == len(prefix.encode())
        assert m.forced_bytes() == rest.encode()
    # validating grammar: the escape forms leave nothing forced inside the enum value
    m = structgen.Matcher(structgen.compile_json_schema(SCHEMA, for_generation=False), vocab)
    m.accept_tokens(list(prefix.encode()))
    assert m.forced_bytes() == b""


def test_a_decoding_loop_of_ones_own_gets_the_generation_language() -> None:
    # compile_json_schema + Matcher, without generate(): no escape inside an enum value and no
    # undeclared key, though the schema leaves its object open and the oracle accepts both
    schema = {"type": "object", "properties": {"status": {"enum": ["open", "pending"]}},
              "required": ["status"]}
    for valid in ['{"status":"p\\u0065nding"}', '{"status":"open","extra":1}']:
        jsonschema.validate(json.loads(valid), schema)
    vocab = structgen.Vocabulary([bytes([b]) for b in range(256)] + [None], eos_token_ids=[256])
    m = structgen.Matcher(structgen.compile_json_schema(schema), vocab)
    m.accept_tokens(list(b'{"status":"p'))
    assert not m.is_token_allowed(ord("\\"))
    m = structgen.Matcher(structgen.compile_json_schema(schema), vocab)
    assert m.accept_tokens(list(b'{"status":"open"')) == 16
    assert m.allowed_token_ids() == [ord("}")]
    validating = structgen.Matcher(structgen.compile_json_schema(schema, for_generation=False), vocab)
    validating.accept_tokens(list(b'{"status":"open"'))
    assert validating.is_token_allowed(ord(","))
