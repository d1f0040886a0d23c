"""JSON Schema ``pattern`` keywords as languages of JSON string content.

A pattern is a Python regular expression searched anywhere in the decoded string
(``re.search``, what the validator does); its language here is over the JSON *spelling* of
that string, in the escape forms the grammar allows (:mod:`structgen.frontends.json_escape`).
Used by the lowering (:mod:`structgen.frontends.json_schema.lower`) and, through
:func:`pattern_error`, by the normaliser to reject patterns the regex compiler cannot express.
"""

from __future__ import annotations

from functools import lru_cache

from structgen.errors import RegexError
from structgen.grammar import ir

__all__ = ["CONTENT_ENCODING", "compile_pattern", "pattern_error"]

#: the regex compiler's encoding of JSON string content, per ``string_escapes`` mode
CONTENT_ENCODING = {"all": "json", "canonical": "json-canonical"}


@lru_cache(maxsize=1024)
def compile_pattern(p: str, escapes: str = "all") -> ir.Expr:
    """A JSON Schema ``pattern`` (Python ``re.search`` semantics) over JSON string content
    spelled with ``escapes`` (see :mod:`structgen.frontends.json_escape`). Cached (1,024
    patterns); raises :class:`~structgen.errors.RegexError` for a pattern it cannot express."""
    from structgen.frontends import regex  # imported lazily: building its Unicode tables costs a little

    return regex.compile_regex(p, dialect="python", search=True, encoding=CONTENT_ENCODING[escapes])


def pattern_error(p: str) -> str | None:
    """Why ``p`` cannot be compiled (None if it can)."""
    try:
        compile_pattern(p)
    except RegexError as e:
        return str(e)
    return None
