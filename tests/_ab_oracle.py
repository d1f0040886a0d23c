"""The ``(a|b)*a(a|b){k}c`` oracle shared by tests that drive a matcher over a toy vocabulary
while something happens under it (flushes, doublings, the look-ahead thread)."""

from __future__ import annotations

import random
import re

from _toy_vocab import ToyVocab

#: token bytes of the toy vocabulary; id 8 is EOS
AB_TOKENS: list[bytes | None] = [b"a", b"b", b"c", b"ab", b"ba", b"aab", b"bc", b"abc", None]
AB_EOS = 8


def ab_regex(k: int) -> tuple[re.Pattern[str], object]:
    """``(a|b)*a(a|b){k}c``: Python's pattern (the oracle) and structgen's compiled grammar."""
    from structgen import compile_regex

    pat = f"(a|b)*a(a|b){{{k}}}c"
    return re.compile(pat), compile_regex(pat)


def ab_vocab() -> ToyVocab:
    return ToyVocab(list(AB_TOKENS), (AB_EOS,), len(AB_TOKENS))


def viable(pattern: re.Pattern[str], body: str, text: str) -> bool:
    """Oracle for ``(a|b)*a(a|b){k}c``: a prefix is viable iff it is over {a, b} or in the
    language (nothing follows the final c)."""
    return re.fullmatch(body, text) is not None or pattern.fullmatch(text) is not None


def ab_step(m: object, rx: re.Pattern[str], text: str, rng: random.Random) -> int:
    """Check the matcher's allowed tokens at ``text`` against :func:`viable`, then accept a
    random allowed token (EOS only when nothing else is allowed); returns its id."""
    allowed = set(m.allowed_token_ids())  # type: ignore[attr-defined]
    for t, tb in enumerate(AB_TOKENS):
        want = viable(rx, "[ab]*", text) and rx.fullmatch(text) is not None if tb is None \
            else viable(rx, "[ab]*", text + tb.decode())
        assert (t in allowed) == want, (text, t)
    t = rng.choice([t for t in allowed if t != AB_EOS] or [AB_EOS])
    assert m.accept_token(t)  # type: ignore[attr-defined]
    return t
