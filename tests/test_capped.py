"""CappedMatcher: a token cap before a marker, checked against a whole-string oracle.

Oracle: a token sequence is admitted iff the plain Matcher admits it and, where the marker has
not occurred within the first ``cap`` tokens, the bytes after them spell the rest of the marker
(continuing the partial match their text ends with) before anything else -- a statement about
the whole string, not the per-token rule the matcher applies. Brute force over every token
sequence of up to four tokens of a small vocabulary whose tokens split and merge the marker.
"""

from __future__ import annotations

import itertools

import pytest

from structgen.calls.triggered import Region, TriggeredGrammar, body_grammar, compile_triggered
from structgen.masks.capped import CappedMatcher
from structgen.masks.matcher import Matcher
from structgen.masks.vocab import Vocabulary

MARKER = b"</t>"
_TOKENS = [b"a", b"<", b"/", b"t", b">", b"b", b"</", b"t>", b"a</t", b">b", b"</t>", b"<a", b">bb"]
VOCAB = Vocabulary(_TOKENS + [None], [len(_TOKENS)])
EOS = len(_TOKENS)
GRAMMAR = compile_triggered(TriggeredGrammar((Region(MARKER, body_grammar("regex", "b+")),), 1, 1,
                                             stop_after=True))


def _partial(tail: bytes) -> int:
    return max((k for k in range(1, len(MARKER)) if tail.endswith(MARKER[:k])), default=0)


def oracle(ids: list[int], cap: int) -> bool:
    m = Matcher(GRAMMAR, VOCAB)
    if m.accept_tokens(ids) != len(ids):
        return False
    head = b"".join(_TOKENS[t] for t in ids[:cap] if t != EOS)
    if MARKER in head or len(ids) <= cap:
        return True
    rest = MARKER[_partial(head):]
    after = b"".join(_TOKENS[t] for t in ids[cap:] if t != EOS)
    # the marker must be finished by the tokens after the cap before anything else; the
    # token completing it may carry on
    if EOS in ids[cap:]:
        return after.startswith(rest)
    return after.startswith(rest) or rest.startswith(after)


@pytest.mark.parametrize("cap", [0, 1, 2, 3])
def test_capped_language_brute_force(cap: int) -> None:
    m = CappedMatcher(GRAMMAR, VOCAB, marker=MARKER, cap=cap)
    alphabet = list(range(len(_TOKENS) + 1))
    for n in range(1, 5):
        for ids in itertools.product(alphabet, repeat=n):
            ids = list(ids)
            m.reset()
            want = oracle(ids, cap)
            assert (m.accept_tokens(ids) == n) == want, (ids, cap)
            m.reset()
            assert (m.validate_tokens(ids) == n) == want


@pytest.mark.parametrize("cap", [0, 2])
def test_capped_masks_fork_rollback(cap: int) -> None:
    m = CappedMatcher(GRAMMAR, VOCAB, marker=MARKER, cap=cap)
    path = [0, 0, 1, 2, 3, 4, 5]  # "aa</t>b"
    for t in path:
        allowed = set(m.allowed_token_ids())
        for cand in range(len(_TOKENS) + 1):
            assert (cand in allowed) == m.is_token_allowed(cand)
        f = m.fork()
        assert isinstance(f, CappedMatcher)
        if not m.accept_token(t):
            assert t not in allowed
            break
    if cap == 0:
        m.reset()
        assert m.forced_bytes() == b"</t>b"
        assert m.allowed_token_ids() == [1, 6, 10]  # "<", "</", "</t>"
        assert m.accept_tokens([6, 0]) == 1  # "</" then "a" is off the marker
        m.rollback(1)
        assert m.accept_tokens([10]) == 1 and m.forced_bytes() == b"b"


@pytest.mark.parametrize("cap", [0, 2])
def test_capped_with_the_free_text_shortcut(cap: int) -> None:
    """With the forbidden ids asked for at every step (so that the plain matcher's free-text
    shortcut is taken), the language is still the oracle's, and the forbidden ids are the
    complement of the mask, or None while the marker is forced."""
    m = CappedMatcher(GRAMMAR, VOCAB, marker=MARKER, cap=cap)
    alphabet = list(range(len(_TOKENS) + 1))
    for n in range(1, 4):
        for ids in itertools.product(alphabet, repeat=n):
            ids = list(ids)
            m.reset()
            got = 0
            for t in ids:
                few = m.forbidden_token_ids()
                allowed = set(m.allowed_token_ids())
                if few is not None:
                    assert set(few.tolist()) == set(alphabet) - allowed, (ids, t)
                else:
                    assert m._forcing() or m.is_terminated()
                if not m.accept_token(t):
                    break
                got += 1
            assert (got == n) == oracle(ids, cap), (ids, cap)
