"""Hostile constraints (issue 44): measured exactly, or refused with a typed error, in bounded
work -- never a hang, never gigabytes.

The token-budget check before generation (``on_budget="close"``) measures the shortest output
of a constraint. Four small constraints made it unbounded: a pattern whose lazily determinised
automaton has 2^21 states (``(a|b)*a(a|b){20}``, in every place a schema or grammar can hold
one), a string of ``minLength`` 10^9, a Lark grammar of forty rules each doubling the one below
(a shortest sentence of 2^40 bytes) and a 1 MB Lark literal. The pattern is a valid constraint
with a short output: it is now measured exactly on its NFA, without building its DFA. The
others must be refused with a typed error that says where, after work bounded by the
constraint's compiled size; so must an exploration (the one rule kind still explored, a
difference of two automata) past its state bound.

Oracles: the error's type, location (JSON pointer and keyword, Lark rule and line) and
message; the shortest outputs and their token counts, worked out by hand and by a greedy
tokenizer written here; the work done, counted in automaton states and configurations
(deterministic on any machine, where a wall-clock limit would not be); and the growth of the
process's resident memory (``VmRSS``), with a generous bound. Everything runs at the matcher
level over GPT-2's real vocabulary (no model), but for passes through ``structgen.generate``
with the tiny random model of ``tests/_tiny_lm.py``.
"""

from __future__ import annotations

import pytest

import structgen
from structgen import limits
from structgen.config import CompileOptions
from structgen.errors import CompileLimitError, CompileTimeoutError, GrammarError, TokenBudgetError
from structgen.frontends.constraint import compile_constraint
from structgen.generation.loop import check_budget
from structgen.grammar.completion import LONGEST, completion_lengths, solve_bound
from structgen.masks.matcher import Matcher

pytestmark = pytest.mark.assets

EVIL = "(a|b)*a(a|b){20}"  # the minimal DFA has 2^21 states, every one reachable
BUDGET = 512  # a realistic max_new_tokens
RSS_MB = 300  # resident memory a refusal may add (the unbounded check took gigabytes)


def _rss_mb() -> float:
    """The process's resident memory (MB), from /proc (skips where there is none)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    pytest.skip("no /proc/self/status to read the resident memory from")


@pytest.fixture(scope="module")
def vocab(tokenizer_by_alias):
    """GPT-2's vocabulary, with its budget tables and trie built (so that the memory measured
    below is the check's own, not the one-time cost of a vocabulary)."""
    from structgen.masks.vocab import Vocabulary

    v = Vocabulary.from_tokenizer(tokenizer_by_alias("gpt2"))
    check_budget(Matcher(compile_constraint("json", {"type": "string", "maxLength": 3}), v), BUDGET)
    return v


A21 = b"a" * 21  # the byte-wise smallest sentence of EVIL
# (kind, spec, its first shortest output, worked out by hand): the exploding pattern wherever
# a constraint can hold it
EXPLODING = [
    ("json", {"type": "string", "pattern": f"^{EVIL}$"}, b'"' + A21 + b'"'),
    ("json", {"type": "object", "properties": {"n": {"type": "integer"},
                                               "s": {"type": "string", "pattern": f"^{EVIL}$"}},
              "required": ["s"]}, b'{"s":"' + A21 + b'"}'),
    ("json", {"type": "object", "patternProperties": {f"^{EVIL}$": {"type": "integer"}}}, b"{}"),
    ("json", {"type": "object", "propertyNames": {"pattern": f"^{EVIL}$"}, "minProperties": 1},
     b'{"' + A21 + b'":0}'),
    ("regex", EVIL, A21),
    ("grammar", f'start: "x" word\nword: "<" W ">"\nW: /{EVIL}/\n', b"x<" + A21 + b">"),
]


def _greedy_tokens(vocab, data: bytes) -> int:
    """Tokens of the greedy longest-match tokenization of ``data`` over ``vocab`` (EOS left
    out), written here independently of structgen.masks.budget."""
    eos = set(vocab.eos_token_ids)
    tokens = {t for i, t in enumerate(vocab.token_bytes) if t and i not in eos}
    longest = max(map(len, tokens))
    n = i = 0
    while i < len(data):
        i += next(k for k in range(min(longest, len(data) - i), 0, -1) if data[i:i + k] in tokens)
        n += 1
    return n


@pytest.mark.parametrize("case", range(len(EXPLODING)), ids=lambda i: f"{EXPLODING[i][0]}-{i}")
def test_an_exploding_pattern_is_measured_exactly_without_its_automaton(vocab, case):
    kind, spec, shortest = EXPLODING[case]
    g = compile_constraint(kind, spec)
    m = Matcher(g, vocab)
    before = _rss_mb()
    check_budget(m, BUDGET)  # passes: the shortest output is a few tokens
    lengths = completion_lengths(g.engine)
    assert lengths.distance(g.engine.start) == len(shortest)
    assert lengths.completion(g.engine.start) == shortest
    assert g.accepts(shortest)
    # the count: the greedy tokenization of the first shortest output, plus EOS
    assert m.tokens_to_finish(limit=64) == _greedy_tokens(vocab, shortest) + 1
    # the work: the states of the spelled output and of the masks' walks, not 2^21
    assert g.engine.num_rule_states < 1000
    assert _rss_mb() - before < 50


def test_the_work_bound_still_refuses_an_exploration_past_it(vocab, monkeypatch):
    """A difference of two automata (a key of an object with additionalProperties: any string
    but the named keys) is the one rule kind still explored, pair state by pair state: past
    its bound the check is a located CompileLimitError, and refused again the same way."""
    import structgen.grammar.completion as completion

    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "bb": {"type": "string"}},
              "additionalProperties": {"type": "integer"}}
    monkeypatch.setattr(completion, "MIN_SOLVE_STATES", 10)
    monkeypatch.setattr(completion, "SOLVE_STATES_PER_STATE", 0)
    g = compile_constraint("json", schema, compile_options=CompileOptions(timeout_s=28))  # its own runtime
    assert solve_bound(g) == 10
    with pytest.raises(CompileLimitError) as info:
        check_budget(Matcher(g, vocab), BUDGET)
    e = info.value
    assert type(e) is CompileLimitError  # the state bound, not a clock: the same on any machine
    assert "more than 10 automaton states" in str(e) and "token-budget check" in str(e)
    assert (e.pointer, e.keyword, e.rule) == ("#", "additionalProperties", "root")
    assert "#" in str(e) and "'additionalProperties'" in str(e)
    assert g.engine.num_rule_states < 100
    with pytest.raises(CompileLimitError) as again:  # nothing half-done is kept as solved
        check_budget(Matcher(g, vocab), BUDGET)
    assert (again.value.pointer, again.value.keyword, again.value.rule) == (e.pointer, e.keyword, e.rule)
    # within the default bound the same schema is measured: '{}'
    monkeypatch.undo()
    fine = compile_constraint("json", schema, compile_options=CompileOptions(timeout_s=27))
    assert completion_lengths(fine.engine).distance(fine.engine.start) == 2


def test_the_reference_exploration_refuses_the_pattern_the_grammar_solve_measures(vocab):
    """Exploring the pattern's DFA (the reference method, the budget check's before the
    grammar solve) meets the bound; the bound follows the compiled size and max_states."""
    from structgen.grammar.completion import CompletionLengths

    g = compile_constraint("regex", EVIL)
    assert solve_bound(g) == 20_000  # the floor, for a grammar of a few dozen NFA states
    small = compile_constraint("regex", EVIL, compile_options=CompileOptions(max_states=5_000))
    assert solve_bound(small) == 5_000
    rt = small.engine
    with pytest.raises(CompileLimitError) as info:
        CompletionLengths(rt, explore_all=True).distance(rt.start)
    assert "more than 5000 automaton states" in str(info.value)
    assert rt.num_rule_states <= 3 * 5_000 + 100
    assert completion_lengths(rt).distance(rt.start) == 21


def test_past_the_deadline_the_check_is_a_timeout_naming_the_rule(vocab):
    # a step clock (1 s a read): the grammar solve reads the clock first (its deadline: 1 + 3)
    # and then every 256 NFA states settled, so it strikes at the fifth read, after 4 * 256 of
    # the doubling grammar's 2 * 10^5; the strike depends on the count of reads, not on the
    # machine's speed
    g = compile_constraint("grammar", _doubling(40), compile_options=CompileOptions(timeout_s=3))
    with limits.use_clock(limits.StepClock(step=1.0)):
        with pytest.raises(CompileTimeoutError) as info:
            check_budget(Matcher(g, vocab), BUDGET)
    e = info.value
    # the rule whose NFA states it was settling, and the line of its definition
    assert (e.pointer, e.keyword) == (None, None) and e.rule is not None and e.rule.startswith("a")
    assert f"rule {e.rule!r} (line {2 + 40 - int(e.rule[1:])})" in str(e)
    assert "time limit of 3 s" in str(e) and "deadline" in str(e)
    assert "after 1024 automaton states" in str(e)
    assert g.engine.num_rule_states < 100


def test_a_cancelled_request_stops_the_check(vocab):
    from structgen.errors import RequestCancelledError

    g = compile_constraint("regex", "(c|d)*c(c|d){20}")
    with limits.scope(cancelled=lambda: True):
        with pytest.raises(RequestCancelledError):
            check_budget(Matcher(g, vocab), BUDGET)
    assert g.engine.num_rule_states < 100  # the first test of the flag stopped it


def test_a_billion_byte_string_is_refused_without_spelling_it(vocab):
    g = compile_constraint("json", {"type": "string", "minLength": 10**9, "maxLength": 10**9})
    m = Matcher(g, vocab)
    before = _rss_mb()
    with pytest.raises(TokenBudgetError) as info:
        check_budget(m, BUDGET)
    e = info.value
    # no tokenization of 10^9 + 2 bytes has fewer tokens than that over the longest token (128)
    assert e.needed >= (10**9 + 2) // 128 and e.max_new_tokens == BUDGET
    assert f"needs more than {BUDGET} tokens" in str(e) and str(e.needed) in str(e)
    assert g.engine.num_configs < 50  # nothing was spelled
    assert _rss_mb() - before < RSS_MB
    # the count stops past the limit it is given; without one it is exact (here: unaffordable)
    assert m.tokens_to_finish(limit=BUDGET) > BUDGET
    assert m.tokens_to_finish(limit=10) == m.tokens_to_finish(limit=BUDGET)


def test_counting_stops_at_the_limit_but_is_exact_below_it(vocab):
    # a 3000-character string: each count spells at most about the limit's worth of tokens
    g = compile_constraint("json", {"type": "string", "minLength": 3000, "maxLength": 3000})
    exact = Matcher(g, vocab).tokens_to_finish()
    assert exact > 64
    fresh = compile_constraint("json", {"type": "string", "minLength": 3000, "maxLength": 3000},
                               compile_options=CompileOptions(timeout_s=29))  # its own runtime
    m = Matcher(fresh, vocab)
    got = m.tokens_to_finish(limit=64)
    assert 64 < got <= exact
    assert fresh.engine.num_configs < 64 * 128  # at most about limit * (longest token) bytes spelled
    assert m.tokens_to_finish(limit=exact) == exact == m.tokens_to_finish()
    with pytest.raises(TokenBudgetError) as info:
        check_budget(m, exact - 1)
    assert info.value.needed == exact  # just past the budget: counted to the end, exact


def _doubling(depth: int, recursive: bool = False) -> str:
    """Lark rules a<depth> .. a0, each two of the one below: a shortest sentence of 2^depth
    bytes. ``recursive``: each rule may also wrap itself in brackets, so that the compiler
    keeps every rule as a call (a small automaton)."""
    wrap = ' | "(" a{i} ")"' if recursive else ""
    return f"start: a{depth}\n" + "".join(f"a{i}: a{i - 1} a{i - 1}{wrap.format(i=i)}\n"
                                          for i in range(depth, 0, -1)) + 'a0: "x"\n'


def test_a_two_to_the_sixty_byte_sentence_saturates_and_is_refused(vocab):
    g = compile_constraint("grammar", _doubling(60, recursive=True))
    m = Matcher(g, vocab)
    assert completion_lengths(g.engine).distance(g.engine.start) == LONGEST  # "at least 2^40 - 1"
    with pytest.raises(TokenBudgetError) as info:
        check_budget(m, BUDGET)
    assert info.value.needed > 2**30 - 2 and f"needs more than {BUDGET} tokens" in str(info.value)
    assert g.engine.num_configs < 50


def test_forty_doubling_rules_are_refused_after_work_in_proportion_to_the_compile(vocab):
    g = compile_constraint("grammar", _doubling(40))  # inlined: about 2 * 10^5 NFA states
    m = Matcher(g, vocab)
    before = _rss_mb()
    with pytest.raises(TokenBudgetError) as info:
        check_budget(m, BUDGET)
    assert info.value.needed > 2**30 - 2
    # measured on the NFA: no DFA state is built for it (the DFA exploration built one per
    # NFA state, about 2 * 10^5, and some 360 MB)
    assert g.engine.num_rule_states < 100
    assert completion_lengths(g.engine).distance(g.engine.start) == 2**40 - 1  # LONGEST: "at least"
    assert _rss_mb() - before < 100


def test_a_megabyte_literal_is_refused_before_it_is_parsed():
    text = 'start: "x" big\nbig: "' + "ab" * (1 << 19) + '"\n'
    before = _rss_mb()
    with pytest.raises(GrammarError) as info:
        structgen.compile_lark(text)
    e = info.value
    assert (e.line, e.column) == (2, 6)
    assert "max_literal_length=65536" in str(e) and "1048576 characters" in str(e)
    assert len(str(e)) < 400  # the caret excerpt is cut short, not the megabyte line
    assert _rss_mb() - before < 100
    # the limit is an option; a literal within it compiles
    assert structgen.compile_lark('start: "' + "ab" * 600 + '"\n',
                                  compile_options=CompileOptions(max_literal_length=1200)).accepts("ab" * 600)
    with pytest.raises(GrammarError, match="regular expression of 1201 characters"):
        structgen.compile_lark("start: /" + "a" * 1201 + "/\n",
                               compile_options=CompileOptions(max_literal_length=1200))
    # comments and other literals do not count; an unterminated literal is Lark's syntax error
    ok = '// "' + "c" * 2000 + '\nstart: "a" | /b/ # / ' + "d" * 2000 + "\n"
    assert structgen.compile_lark(ok, compile_options=CompileOptions(max_literal_length=100)).accepts("b")


def test_generate_refuses_each_hostile_constraint_with_a_typed_error(tokenizer_by_alias):
    import json
    import re

    import torch
    from _tiny_lm import build_tiny_llama

    from structgen.generation.model import CausalLM

    torch.set_num_threads(1)
    tok = tokenizer_by_alias("gpt2")
    lm = CausalLM(build_tiny_llama(tok, "random"), tok)
    structgen.generate(lm, schema={"type": "string", "maxLength": 4}, prompt="x", max_new_tokens=8)
    cases = [
        ({"schema": {"type": "string", "minLength": 10**9, "maxLength": 10**9}}, TokenBudgetError),
        ({"grammar": _doubling(50, recursive=True)}, TokenBudgetError),
        ({"grammar": 'start: "' + "a" * (1 << 20) + '"'}, GrammarError),
    ]
    for kw, err in cases:
        before = _rss_mb()
        with pytest.raises(err):
            structgen.generate(lm, prompt="x", max_new_tokens=64, **kw)
        assert _rss_mb() - before < RSS_MB, kw
    # forty doubling rules, inlined: refused soon after the compile, without building its DFA
    g = compile_constraint("grammar", _doubling(40))
    before = _rss_mb()
    with pytest.raises(TokenBudgetError):
        structgen.generate(lm, grammar=g, prompt="x", max_new_tokens=64)
    # the work counted, not timed: a handful of rule states, not the ~197k a DFA walk builds
    assert g.engine.num_rule_states < 100 and _rss_mb() - before < 100
    # the exploding pattern is a valid constraint with a short output: generated under the
    # budget rule, closed within 64 tokens. A schema's pattern is searched for, as jsonschema
    # does with Python's re (whose "$" also matches before a final newline); a regex and a
    # Lark terminal match whole
    for kw in ({"schema": {"type": "string", "pattern": f"^{EVIL}$"}}, {"regex": EVIL},
               {"grammar": f"start: W\nW: /{EVIL}/\n"}):
        before = _rss_mb()
        r = structgen.generate(lm, prompt="x", max_new_tokens=64, **kw)
        if "schema" in kw:
            assert re.search(f"^{EVIL}$", json.loads(r.text)), r.text
        else:
            assert re.fullmatch(EVIL, r.text), (kw, r.text)
        assert r.finish_reason in ("stop", "budget_close") and len(r.tokens) <= 64
        assert _rss_mb() - before < 200, kw
    # on_budget="cut" needs no measure of the shortest output either
    r = structgen.generate(lm, regex=EVIL, prompt="x", max_new_tokens=8, on_budget="cut")
    assert r.finish_reason in ("length", "stop")


def test_a_huge_repetition_is_refused_before_it_is_unrolled(monkeypatch: pytest.MonkeyPatch) -> None:
    from structgen.grammar import fsa

    made = [0]
    new = fsa.Nfa.new

    def counting_new(self: fsa.Nfa) -> int:
        made[0] += 1
        return new(self)

    monkeypatch.setattr(fsa.Nfa, "new", counting_new)
    for lo, hi in ((10**9, 10**9), (0, 10**6), (3, 10**7)):
        made[0] = 0
        schema = {"type": "array", "items": {"type": "integer"}, "minItems": lo, "maxItems": hi}
        with pytest.raises(CompileLimitError) as e:
            structgen.compile_json_schema(schema)
        assert (e.value.pointer, e.value.keyword) == ("#", "maxItems")
        assert made[0] < 10_000, (lo, hi, made[0])  # one copy of the item, not 200,000 states
    # a repetition that fits is still unrolled in full
    cg = structgen.compile_json_schema({"type": "array", "items": {"type": "integer"}, "minItems": 2,
                                        "maxItems": 3000})
    ones = ["1"] * 3001
    assert cg.accepts("[" + ",".join(ones[:3000]) + "]") and not cg.accepts("[" + ",".join(ones) + "]")
