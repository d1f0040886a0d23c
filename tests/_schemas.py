"""Small JSON schemas shared by the generation, integration and backend tests."""

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
STATUS_TAGS = {"type": "object",
               "properties": {"status": {"enum": ["open", "closed", "pending"]},
                              "tags": {"type": "array", "items": {"type": "string", "maxLength": 5},
                                       "maxItems": 3}},
               "required": ["status", "tags"], "additionalProperties": False}
NESTED = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "number"},
                                           "child": {"type": ["null", "object"],
                                                     "properties": {"x": {"type": "integer"}},
                                                     "required": ["x"], "additionalProperties": False}},
          "required": ["ok", "n", "child"], "additionalProperties": False}
