"""The whole-grammar passes over the kept rules' NFAs (``structgen.grammar.rule_nfas``): empty
rules found, dead states trimmed, left recursion rejected.

Oracles, independent of the compiler: the language of each rule up to a length, by a
least fixpoint over the IR (strings of at most ``N`` bytes); a rule's emptiness by the
textbook productive-rules fixpoint over the IR; for trimming, a breadth-first search from every
configuration the compiled grammar reaches on a live byte (each must still reach acceptance).
"""

from __future__ import annotations

import itertools
import random

import pytest

from structgen.errors import GrammarError
from structgen.grammar import ir
from structgen.grammar.compiler import compile_grammar

N = 7  # the oracle's length bound
ALPHABET = b"ab"


def _random_grammar(rng: random.Random) -> dict[str, ir.Expr]:
    """2-4 rules over a, b: alternatives of items that are bytes, optional bytes or calls of
    any rule (so some rules never end, and some recursion is left recursion)."""
    names = [f"r{i}" for i in range(rng.randint(2, 4))]
    rules = {}
    for name in names:
        alts = []
        for _ in range(rng.randint(1, 3)):
            items = []
            for _ in range(rng.randint(1, 3)):
                roll = rng.random()
                if roll < 0.4:
                    items.append(ir.lit(rng.choice(["a", "b"])))
                elif roll < 0.5:
                    items.append(ir.opt(ir.lit("a")))
                else:
                    items.append(ir.ref(rng.choice(names)))
            alts.append(ir.seq(*items))
        rules[name] = ir.alt(*alts)
    return rules


def _productive(rules: dict[str, ir.Expr]) -> set[str]:
    """Rules that derive some string: a least fixpoint over the IR."""
    good: set[str] = set()

    def derives(e: ir.Expr) -> bool:
        if isinstance(e, ir.Ref):
            return e.name in good
        if isinstance(e, ir.Seq):
            return all(derives(x) for x in e.items)
        if isinstance(e, ir.Alt):
            return any(derives(x) for x in e.items)
        return True  # bytes and optional parts

    changed = True
    while changed:
        changed = False
        for name, e in rules.items():
            if name not in good and derives(e):
                good.add(name)
                changed = True
    return good


def _languages(rules: dict[str, ir.Expr]) -> dict[str, set[bytes]]:
    """Every string of at most N bytes each rule derives: a least fixpoint over the IR."""
    lang: dict[str, set[bytes]] = {n: set() for n in rules}

    def strings(e: ir.Expr) -> set[bytes]:
        if isinstance(e, ir.Ref):
            return lang[e.name]
        if isinstance(e, ir.ByteSet):
            return {bytes([b]) for lo, hi in e.ranges for b in range(lo, hi + 1)}
        if isinstance(e, ir.Alt):
            return set().union(*(strings(x) for x in e.items))
        if isinstance(e, ir.Repeat):  # only opt() is generated
            assert e.min == 0 and e.max == 1
            return {b""} | strings(e.item)
        assert isinstance(e, ir.Seq)
        out = {b""}
        for x in e.items:
            out = {u + v for u in out for v in strings(x) if len(u) + len(v) <= N}
        return out

    changed = True
    while changed:
        changed = False
        for name, e in rules.items():
            got = strings(e)
            if got - lang[name]:
                lang[name] |= got
                changed = True
    return lang


def _reaches_acceptance(rt, cid: int, limit: int = 5_000) -> bool:
    seen, frontier = {cid}, [cid]
    while frontier:
        if any(rt.is_accepting(c) for c in frontier):
            return True
        nxt = []
        for c in frontier:
            for b in ALPHABET:
                t = rt.step(c, b)
                if t >= 0 and t not in seen:
                    seen.add(t)
                    nxt.append(t)
        if len(seen) > limit:
            pytest.skip("the breadth-first oracle met too many configurations")
        frontier = nxt
    return False


@pytest.mark.parametrize("seed", range(200))
def test_random_grammars_are_trimmed_and_exact(seed: int) -> None:
    rng = random.Random(seed)
    rules = _random_grammar(rng)
    productive = _productive(rules)
    try:
        g = compile_grammar(ir.Grammar(rules, "r0"))
    except GrammarError as e:
        if "left recursion" in str(e):
            return  # reported, named: the other test checks the message
        assert "accepts no string" in str(e) and "r0" not in productive, (rules, e)
        return
    assert "r0" in productive, rules
    lang = _languages(rules)["r0"]
    prefixes = {s[:k] for s in lang for k in range(len(s) + 1)}
    rt = g.engine
    for n in range(5):
        for t in itertools.product(ALPHABET, repeat=n):
            s = bytes(t)
            assert g.accepts(s) == (s in lang), (rules, s)
            if s in prefixes:
                assert g.accepts_prefix(s), (rules, s)
    # no dead end: every configuration a live byte leads to can still be completed
    for c in {rt.walk(rt.start, s[:k]) for s in lang for k in range(len(s) + 1)}:
        for b in rt.live_bytes(c).tolist():
            assert _reaches_acceptance(rt, rt.step(c, b)), (rules, c, b)


def test_indirect_left_recursion_names_its_rules() -> None:
    # a calls b first; b may skip its optional byte and call a first: a cycle before any byte
    rules = {"start": ir.seq(ir.ref("a"), ir.lit("!")),
             "a": ir.alt(ir.seq(ir.ref("b"), ir.lit("x")), ir.lit("y")),
             "b": ir.alt(ir.seq(ir.opt(ir.lit("q")), ir.ref("a"), ir.lit("z")), ir.lit("w"))}
    with pytest.raises(GrammarError, match=r"left recursion through rule\(s\) a -> b"):
        compile_grammar(ir.Grammar(rules, "start"))
    # the same through a kept rule that derives the empty string (recursive, so it is a call)
    nullable = {**rules, "b": ir.alt(ir.seq(ir.ref("n"), ir.ref("a"), ir.lit("z")), ir.lit("w")),
                "n": ir.alt(ir.seq(ir.lit("q"), ir.ref("n")), ir.EMPTY)}
    with pytest.raises(GrammarError, match=r"left recursion through rule\(s\) a -> b"):
        compile_grammar(ir.Grammar(nullable, "start"))
    # the byte first breaks the cycle
    rules["b"] = ir.alt(ir.seq(ir.lit("q"), ir.ref("a"), ir.lit("z")), ir.lit("w"))
    g = compile_grammar(ir.Grammar(rules, "start"))
    assert g.accepts(b"qyzx!") and g.accepts(b"y!") and not g.accepts(b"yzx!")


def test_a_rule_that_never_ends_is_cut_from_its_callers() -> None:
    # loop never ends, so "b" then loop is a dead branch: "b" is no prefix of the language
    rules = {"start": ir.alt(ir.lit("a"), ir.seq(ir.lit("b"), ir.ref("loop"))),
             "loop": ir.seq(ir.lit("c"), ir.ref("loop"))}
    g = compile_grammar(ir.Grammar(rules, "start"))
    assert g.accepts(b"a") and not g.accepts_prefix(b"b") and not g.accepts_prefix(b"bc")
    with pytest.raises(GrammarError, match="accepts no string"):
        compile_grammar(ir.Grammar({"start": ir.seq(ir.lit("b"), ir.ref("loop")),
                                    "loop": rules["loop"]}, "start"))
