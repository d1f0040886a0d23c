"""Front-ends: JSON Schema, Lark, regex and the one dispatcher that turns any constraint
into a compiled grammar."""
