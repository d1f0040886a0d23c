"""OpenAI's ``logprobs`` objects of ``structgen serve``, from the engine's per-token entries.

The engine records, for a request that asks (``logprobs: true`` in Chat Completions,
``logprobs: k`` in legacy Completions), one
:class:`~structgen.generation.results.TokenLogprob` per output token: its log-probability in
the distribution it was drawn from (the grammar-masked target distribution at the sampling
temperature, temperature 1 when greedy; top-p applied when sampling with ``top_p < 1``) and
its most likely alternatives. This module writes them in the two wire formats:

* chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
  "bytes"}]}], "refusal": None}``;
* completions: ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
  "text_offset"}``, where a token's ``text_offset`` is the summed length of the token strings
  before it (equal to its offset in ``text`` except where a character's bytes straddle tokens).

A streamed chunk carries the entries of the tokens whose text begins in it; joined, they are
the non-streamed list.
"""

from __future__ import annotations

import math

from structgen.generation.results import TokenLogprob

__all__ = ["UNLIKELY_LOGPROB", "chat_logprobs", "completion_logprobs"]

#: What a log-probability of minus infinity is written as (JSON has no infinity): OpenAI's own
#: stand-in. Only a token accepted by the opt-in lossy verification can be outside the
#: distribution it is reported against.
UNLIKELY_LOGPROB = -9999.0


def _finite(value: float) -> float:
    return value if math.isfinite(value) else UNLIKELY_LOGPROB


def chat_logprobs(entries: list[TokenLogprob] | None) -> dict[str, object] | None:
    """Chat Completions' ``choices[i].logprobs`` for ``entries`` (None when none were asked)."""
    if entries is None:
        return None
    content = []
    for e in entries:
        content.append({
            "token": e.token, "logprob": _finite(e.logprob), "bytes": list(e.token_bytes),
            "top_logprobs": [{"token": t.token, "logprob": _finite(t.logprob), "bytes": list(t.token_bytes)}
                             for t in e.top_logprobs],
        })
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[TokenLogprob] | None, offset: int = 0) -> dict[str, object] | None:
    """Legacy Completions' ``choices[i].logprobs`` for ``entries`` (None when none were asked);
    ``offset``: the ``text_offset`` of the first entry (a stream's characters before it)."""
    if entries is None:
        return None
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [_finite(e.logprob) for e in entries],
        "top_logprobs": [{t.token: _finite(t.logprob) for t in e.top_logprobs} for e in entries],
        "text_offset": offsets,
    }
