"""Error messages of ``structgen serve`` in the HTTP API's terms.

The engine's checks raise the library's typed errors, whose messages name the Python API
(``max_new_tokens``, ``on_budget='cut'``). A client of the HTTP API knows ``max_tokens`` and the
request body's fields instead, so the server rewrites those messages from the errors' own
figures before answering.
"""

from __future__ import annotations

from structgen.errors import StructgenError

__all__ = ["http_message"]

# the limits compile errors name, as the Python API spells them -> as the server's --config does
_LIMIT_NAMES = (("CompileOptions.max_rules=", "the server's compile.max_rules limit of "),
                ("max_depth=", "the server's json_schema.max_depth limit of "),
                ("max_enum=", "the server's json_schema.max_enum limit of "))
# a shortest output that no sequence of the vocabulary's tokens spells (masks.budget.UNREACHABLE)
_UNREACHABLE = 1 << 30


def http_message(e: StructgenError) -> str:
    """``e``'s message as the HTTP API says it (unchanged where it names nothing of Python's)."""
    name = type(e).__name__
    if name == "TokenBudgetError":
        given, needed = getattr(e, "max_new_tokens", None), getattr(e, "needed", None)
        if needed is None or given is None:
            return str(e)
        if needed >= _UNREACHABLE:
            shortest = "no valid output this model's tokens can spell"
        else:  # the check stops counting past the budget: the figure is a lower bound
            shortest = f"at least {needed} tokens, counting the end token"
        return (f"max_tokens={given} is below the shortest valid output ({shortest}) for this "
                "request's response_format or tools; raise max_tokens, or leave out "
                '"on_max_tokens": "refuse" to get the output cut at max_tokens (finish_reason "length")')
    if name == "ContextLengthError":
        prompt, given, limit = (getattr(e, k, None) for k in ("prompt_tokens", "max_new_tokens",
                                                               "context_length"))
        if not (isinstance(prompt, int) and isinstance(given, int) and isinstance(limit, int)):
            return str(e)
        room = limit - prompt
        hint = f"lower max_tokens to at most {room}" if room >= 1 else "shorten the messages"
        return (f"the prompt has {prompt} tokens and max_tokens is {given}: {prompt + given} "
                f"positions, more than the model's context of {limit} tokens ({hint})")
    if name == "CompileLimitError":
        # a limit of the server's configuration: name it as its --config file spells it
        text = str(e)
        for python, config in _LIMIT_NAMES:
            text = text.replace(python, config)
        return text
    return str(e)
