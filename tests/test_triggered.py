"""Triggered grammars (structgen.calls.triggered) at the token level.

Oracle: an independent byte-level recogniser of the definition in the module docstring,
written here with Python's ``re`` for region bodies; every string over a small alphabet is
checked against the Matcher under two tokenizations (single bytes, and greedy longest match
over a vocabulary of all strings of length <= 3, whose tokens split and merge triggers with
the text around them), and the masks are checked against ``accept_token`` along the way.
"""

from __future__ import annotations

import itertools
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structgen.calls.triggered import (
    Region,
    TriggeredGrammar,
    body_grammar,
    compile_triggered,
)
from structgen.masks.engine import engine_for
from structgen.masks.matcher import Matcher, vocab_table
from structgen.masks.vocab import Vocabulary

ALPHABET = "a<>b"
MAX_LEN = 6

# a vocabulary of every string of length 1..3 over the alphabet, plus EOS
_TOKENS = [("".join(p)).encode() for n in (1, 2, 3) for p in itertools.product(ALPHABET, repeat=n)]
VOCAB = Vocabulary(_TOKENS + [None], [len(_TOKENS)])
EOS = len(_TOKENS)
_BY_BYTES = {t: i for i, t in enumerate(_TOKENS)}


def _tokenize(data: bytes, longest: bool) -> list[int]:
    out, i = [], 0
    while i < len(data):
        n = min(3, len(data) - i) if longest else 1
        out.append(_BY_BYTES[data[i:i + n]])
        i += n
    return out


def oracle(spec: dict, s: str) -> bool:
    """The byte-level definition, directly: first trigger occurrence opens a region, its body
    must fullmatch the body regex, then the end marker, and so on."""
    regions = spec["regions"]  # [(trigger, body_regex, end)]

    def rest_ok(s: str, count: int, at_start: bool) -> bool:
        mx = spec["max"]
        if spec["regions_only"]:
            if s == "" and count >= spec["min"]:
                return True
            if spec["stop_after"] and count >= 1:
                return False
            sep = spec["sep"] if count else ""
            if not s.startswith(sep) or (mx is not None and count + 1 > mx):
                return False
            s = s[len(sep):]
            for trig, body, end in regions:
                if s.startswith(trig) and _region_then(s[len(trig):], body, end, count):
                    return True
            return False
        # free text up to the first completed trigger
        first = None
        for e in range(1, len(s) + 1):
            if any(s[:e].endswith(t) for t, _, _ in regions):
                first = e
                break
        if first is None:
            return count >= spec["min"]
        if spec["stop_after"] and count >= 1:
            return False
        if mx is not None and count + 1 > mx:
            return False
        for trig, body, end in regions:
            if s[:first].endswith(trig) and _region_then(s[first:], body, end, count):
                return True
        return False

    def _region_then(s: str, body: str, end: str, count: int) -> bool:
        for j in range(len(s) + 1):
            if re.fullmatch(body, s[:j]) and s[j:].startswith(end):
                rest = s[j + len(end):]
                if spec["stop_after"]:
                    if rest == "" and count + 1 >= spec["min"]:
                        return True
                elif rest_ok(rest, count + 1, False):
                    return True
        return False

    return rest_ok(s, 0, True)


def _compile(spec: dict):
    regions = tuple(Region(t, body_grammar("regex", b), e) for t, b, e in spec["regions"])
    return compile_triggered(TriggeredGrammar(regions, spec["min"], spec["max"], spec["regions_only"],
                                              spec["sep"], spec["stop_after"]))


def _check_all_strings(spec: dict) -> None:
    g = _compile(spec)
    m = Matcher(g, VOCAB)
    for n in range(MAX_LEN + 1):
        for p in itertools.product(ALPHABET, repeat=n):
            s = "".join(p)
            want = oracle(spec, s)
            for longest in (False, True):
                ids = _tokenize(s.encode(), longest)
                m.reset()
                got = m.accept_tokens(ids) == len(ids) and m.is_accepting()
                assert got == want, (spec, s, longest, got, want)
                if want:  # EOS closes it; nothing else is terminated
                    assert m.accept_token(EOS) and m.is_terminated()


def _check_masks_along(spec: dict, s: str) -> None:
    m = Matcher(_compile(spec), VOCAB)
    for t in _tokenize(s.encode(), True):
        allowed = set(m.allowed_token_ids())
        for cand in range(len(_TOKENS) + 1):
            assert (cand in allowed) == m.is_token_allowed(cand)
        if not m.accept_token(t):
            break


_trigger = st.sampled_from(["<a>", "<", "aa", "<b", "a<", "ab>"])
_body = st.sampled_from(["b+", "(ab)*", "b|bb", "a*b", "", "[ab]{1,2}"])
_end = st.sampled_from(["", ">", "<b", "a"])


@st.composite
def specs(draw: st.DrawFn) -> dict:
    k = draw(st.integers(1, 2))
    regions = [(draw(_trigger), draw(_body), draw(_end)) for _ in range(k)]
    lo = draw(st.integers(0, 2))
    hi = draw(st.sampled_from([None, lo, lo + 1]))
    stop_after = draw(st.booleans()) and lo <= 1 and hi != 0
    if stop_after and hi is not None:
        hi = max(hi, 1)
    regions_only = draw(st.booleans())
    if regions_only and lo == 0 and hi == 0:
        hi = None
    return {"regions": regions, "min": lo, "max": hi, "regions_only": regions_only,
            "sep": draw(st.sampled_from(["", "b"])), "stop_after": stop_after}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_token_language_equals_byte_definition(spec: dict) -> None:
    _check_all_strings(spec)


def test_trigger_split_and_merged_with_text() -> None:
    spec = {"regions": [("<a>", "b+", ">")], "min": 0, "max": None, "regions_only": False,
            "sep": "", "stop_after": False}
    _check_all_strings(spec)
    g = _compile(spec)
    m = Matcher(g, VOCAB)
    # "a<a" merges free text with the trigger's start; ">bb" the trigger's end with the body
    assert m.accept_tokens([_BY_BYTES[b"a<a"], _BY_BYTES[b">bb"], _BY_BYTES[b">ab"]]) == 3
    assert m.is_accepting()
    m.reset()  # the first trigger occurrence opens the region: "<a<a>" is "<a" + trigger
    assert m.accept_tokens(_tokenize(b"<a<a>b>", True)) == 3 and m.is_accepting()


@settings(max_examples=10, deadline=None)
@given(specs(), st.text(alphabet=ALPHABET, max_size=MAX_LEN))
def test_masks_agree_with_accept(spec: dict, s: str) -> None:
    _check_masks_along(spec, s)


def test_verbs_rollback_fork_forced() -> None:
    spec = {"regions": [("<a>", "bab", ">")], "min": 1, "max": 1, "regions_only": False,
            "sep": "", "stop_after": True}
    m = Matcher(_compile(spec), VOCAB)
    assert m.forced_bytes() == b""  # free text: nothing is forced
    assert m.accept_tokens(_tokenize(b"ab<a>", True)) == 2
    assert m.forced_bytes() == b"bab>"  # inside the region: the body and the end marker
    f = m.fork()
    assert f.accept_tokens(_tokenize(b"bab>", True)) == 2 and f.is_accepting()
    assert not m.is_accepting()
    f.rollback(2)
    assert f.forced_bytes() == b"bab>"
    assert f.validate_tokens(_tokenize(b"bab>", True) + [EOS]) == 3
    assert f.validate_tokens(_tokenize(b"bab>a", True)) == 1  # stop_after: nothing after


def test_special_token_as_trigger() -> None:
    # id 0 is a special token (no text) until the vocabulary gives it the trigger's text
    toks = [b"<T>", b"a", b"<", b"T", b">", b"b"]
    vocab = Vocabulary(toks + [None], [len(toks)], special_ids=[0])
    region = Region("<T>", body_grammar("regex", "b+"))
    g = compile_triggered(TriggeredGrammar((region,), 1, 1, stop_after=True))
    assert Matcher(g, vocab).accept_tokens([1, 0]) == 1  # a special token writes nothing
    given = vocab.with_token_text({0: "<T>"})
    m = Matcher(g, given)
    assert m.accept_tokens([1, 0, 5]) == 3 and m.is_accepting()
    assert given.decode_bytes([1, 0, 5]) == b"a<T>b"
    m.reset()  # the text spelled by ordinary tokens opens the region too
    assert m.accept_tokens([2, 3, 4, 5]) == 4 and m.is_accepting()


def _check_free_fast_path(spec: dict) -> None:
    """Every string up to MAX_LEN - 1 bytes, greedy tokens, asking for the forbidden ids at
    every step (so that configurations visited often get their token-step shortcut): the
    forbidden ids are exactly the tokens whose bytes the byte-level runtime rejects after the
    text so far (EOS: where it is not accepting), and the language is the oracle's."""
    g = _compile(spec)
    rt = g.engine  # the byte-level runtime: walks bytes, knows nothing of tokens or masks
    m = Matcher(g, VOCAB)
    for n in range(MAX_LEN):
        for p in itertools.product(ALPHABET, repeat=n):
            s = "".join(p).encode()
            m.reset()
            done = b""
            for t in _tokenize(s, True) + [None]:
                at = rt.walk(rt.start, done)
                want = {c for c, tb in enumerate(_TOKENS) if rt.walk(at, tb) < 0}
                if not rt.is_accepting(at):
                    want.add(EOS)
                got = m.forbidden_token_ids()
                assert got is not None and set(got.tolist()) == want, (spec, done)
                if t is None:
                    break
                assert m.accept_token(t) == (t not in want), (spec, done, t)
                if t in want:
                    break
                done += _TOKENS[t]
            else:
                assert m.is_accepting() == oracle(spec, s.decode()), (spec, s)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_free_fast_path_equals_byte_walks(spec: dict) -> None:
    # small vocabularies make every configuration "free" (few forbidden tokens), so the
    # shortcut is taken wherever most tokens lead to one configuration, regions included
    _check_free_fast_path(spec)


def test_free_fast_path_verbs() -> None:
    """accept / validate / rollback / fork through configurations that have the shortcut
    agree with a matcher replaying from the start."""
    spec = {"regions": [("<a>", "b+", ">")], "min": 0, "max": None, "regions_only": False,
            "sep": "", "stop_after": False}
    _check_free_fast_path(spec)
    g = _compile(spec)
    text = b"ab<a<a>bb>aab<a>b>ba"
    ids = _tokenize(text, False)
    m = Matcher(g, VOCAB)
    for _ in range(6):  # visit every configuration on the way often enough
        m.reset()
        for t in ids:
            m.forbidden_token_ids()
            assert m.accept_token(t)
    assert m.is_accepting()
    assert any(f.jumps is not None for f in engine_for(g).free_states(vocab_table(VOCAB)).values())
    for k in range(len(ids) + 1):
        f = m.fork()
        f.rollback(k)
        ref = Matcher(g, VOCAB)
        assert ref.accept_tokens(ids[: len(ids) - k]) == len(ids) - k
        assert f.forbidden_token_ids().tolist() == sorted(set(range(EOS + 1)) - set(ref.allowed_token_ids()))
        assert f.validate_tokens(ids[len(ids) - k:]) == k
        assert f.accept_tokens(ids[len(ids) - k:]) == k and f.is_accepting()
