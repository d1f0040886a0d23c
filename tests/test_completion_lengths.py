"""Shortest-completion lengths (structgen.grammar.completion) against two independent oracles.

``CompletionLengths.distance`` measures a lazy rule's DFA state as the minimum, over the NFA
states of its key, of distances solved once on the NFA (the grammar solve). Oracles:

* breadth-first search over bytes on the configuration graph (``runtime.step`` for all 256
  bytes from each configuration, to the nearest accepting one): knows nothing of rules, NFAs
  or completion.py;
* the reference method, ``CompletionLengths(runtime, explore_all=True)``: every rule state
  measured by exploring its rule's DFA (the method before the grammar solve).

Both are compared at configurations reached by random valid byte walks from the start, on
random regexes and Lark grammars (seeded), hand-written JSON schemas (patterns, enums, nested
objects and arrays, recursion, differences and counted repetitions) and the JSON-Schema-Test-
Suite's schemas in ``tests/data``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from structgen.errors import StructgenError
from structgen.frontends.constraint import compile_constraint
from structgen.grammar import _runtime_kernels as K
from structgen.grammar.completion import INFINITE, CompletionLengths, completion_lengths

SUITE = Path(__file__).parent / "data" / "json-schema-test-suite" / "tests" / "draft2020-12"

SCHEMAS = [
    {"type": "string", "pattern": "^(a|b)*a(a|b){3}$"},
    {"type": "string", "pattern": "^(ab|a)*c?d{2,4}$"},
    {"enum": ["red", "green", 12, None, {"k": [1]}]},
    {"type": "object", "properties": {"a": {"type": "integer"}, "bb": {"type": "string", "minLength": 2}},
     "required": ["bb"]},  # additional properties allowed: a key is a string minus "a" and "bb"
    {"type": "object", "properties": {"p": {"type": "array", "items": {"enum": ["x", "yy"]},
                                            "minItems": 2, "maxItems": 3}},
     "required": ["p"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "boolean"}},
                                "required": ["n"], "additionalProperties": False}, "minItems": 1},
    {"$defs": {"tree": {"type": "object", "properties": {"v": {"type": "integer"},
                                                          "kids": {"type": "array",
                                                                   "items": {"$ref": "#/$defs/tree"}}},
                        "required": ["v", "kids"], "additionalProperties": False}},
     "$ref": "#/$defs/tree"},
    {"type": "string", "minLength": 5, "maxLength": 9},
    {"type": "string", "not": {"enum": ["ab", "abc"]}},
    {"anyOf": [{"type": "integer", "minimum": 3}, {"type": "string", "pattern": "^x+y$"}]},
    {"type": "object", "patternProperties": {"^k[0-9]{2}$": {"type": "null"}}, "minProperties": 1,
     "additionalProperties": False},
]

LARK = [
    'start: "(" expr ")" | "x"\nexpr: start ("+" start)*\n',
    'start: a b? a\na: "p" | "qq" a\nb: "" | "r"\n',
    'start: item+\nitem: "ab" | "c" item "d"\n',
    'start: W "=" W\nW: /(a|b)*a(a|b){4}/\n',
]


def _random_regex(rng: random.Random, depth: int = 3) -> str:
    """A random regular expression over a, b, c (groups, alternation, repetition)."""
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(["a", "b", "c", "[ab]", "ab", "ba", "c?"])
    op = rng.choice(["cat", "cat", "alt", "star", "plus", "opt", "rep"])
    x = _random_regex(rng, depth - 1)
    if op == "cat":
        return x + _random_regex(rng, depth - 1)
    if op == "alt":
        return f"(?:{x}|{_random_regex(rng, depth - 1)})"
    if op == "rep":
        lo = rng.randint(0, 3)
        return f"(?:{x}){{{lo},{lo + rng.randint(0, 3)}}}"
    return f"(?:{x})" + {"star": "*", "plus": "+", "opt": "?"}[op]


def _random_lark(rng: random.Random) -> str:
    """A random Lark grammar of 2-4 rules, recursive but without left recursion: an
    alternative may call a rule of a lower or equal index only after a terminal it always
    reads first (the compiler inlines the rest, so recursion is what keeps calls)."""
    n = rng.randint(2, 4)
    names = ["start"] + [f"r{i}" for i in range(1, n)]
    anchors = ['"a"', '"bc"', '"d"']
    terminals = anchors + ["/[ab]c?/", '"e"*', '"f"?']
    lines = []
    for i in range(n):
        alts = []
        for k in range(rng.randint(1, 3)):
            later = names[i + 1:]
            # the first alternative calls only later rules: every rule has a sentence
            anchored = k > 0 and rng.random() < 0.7
            items = [rng.choice(anchors)] if anchored else []
            pool = later + (names if anchored else [])
            for _ in range(rng.randint(1, 3)):
                if pool and rng.random() < 0.5:
                    ref = rng.choice(pool)
                    items.append(ref + (rng.choice(["", "", "?", "*"]) if ref in later else ""))
                else:
                    items.append(rng.choice(terminals))
            alts.append(" ".join(items))
        lines.append(f"{names[i]}: " + " | ".join(alts))
    return "\n".join(lines) + "\n"


def _bfs(rt, cid: int, limit: int = 20_000) -> int | None:
    """Fewest bytes from configuration ``cid`` to acceptance by breadth-first search over all
    256 bytes (None: no accepting configuration is reachable); skips past ``limit``
    configurations."""
    if rt.is_accepting(cid):
        return 0
    seen = {cid}
    frontier = [cid]
    depth = 0
    while frontier:
        depth += 1
        nxt = []
        for c in frontier:
            for b in range(256):
                t = rt.step(c, b)
                if t >= 0 and t not in seen:
                    if rt.is_accepting(t):
                        return depth
                    seen.add(t)
                    nxt.append(t)
        if len(seen) > limit:
            pytest.skip(f"the breadth-first oracle met more than {limit} configurations")
        frontier = nxt
    return None


def _walk_configs(rt, rng: random.Random, walks: int, steps: int) -> list[int]:
    """Configurations met on ``walks`` random walks of up to ``steps`` live bytes from the start."""
    out = [rt.start]
    for _ in range(walks):
        c = rt.start
        for _ in range(rng.randrange(steps + 1)):
            live = rt.live_bytes(c).tolist()
            if not live:
                break
            c = rt.step(c, rng.choice(live))
            out.append(c)
    return out


def _check(kind: str, spec, *, seed: int = 0, walks: int = 12, steps: int = 20, bfs: bool = True) -> int:
    """Compare the distance at random configurations of ``spec`` with the oracles; returns
    the number of configurations compared."""
    g = compile_constraint(kind, spec)
    rt = g.engine
    lengths = completion_lengths(rt)
    reference = CompletionLengths(rt, explore_all=True)
    configs = _walk_configs(rt, random.Random(seed), walks, steps)
    for c in configs:
        got = lengths.distance(c)
        assert got == reference.distance(c), (spec, c)
        if bfs:
            want = _bfs(rt, c)
            assert (want is None) == (got >= INFINITE), (spec, c, want, got)
            if want is not None:
                assert got == want, (spec, c, want, got)
        if got < INFINITE:
            w = lengths.completion(c)
            assert len(w) == got and rt.is_accepting(rt.walk(c, w))
    return len(configs)


@pytest.mark.parametrize("seed", range(24))
def test_random_regexes_match_both_oracles(seed):
    rng = random.Random(seed)
    pattern = _random_regex(rng)
    _check("regex", pattern, seed=seed)


@pytest.mark.parametrize("seed", range(24))
def test_random_lark_grammars_match_both_oracles(seed):
    rng = random.Random(1000 + seed)
    text = _random_lark(rng)
    try:
        compile_constraint("grammar", text)
    except StructgenError:
        pytest.skip(f"the random grammar does not compile:\n{text}")
    _check("grammar", text, seed=seed)


@pytest.mark.parametrize("text", LARK)
def test_lark_grammars_match_both_oracles(text):
    _check("grammar", text, seed=7)


@pytest.mark.parametrize("case", range(len(SCHEMAS)))
def test_json_schemas_match_both_oracles(case):
    _check("json", SCHEMAS[case], seed=case, walks=10, steps=30)


def test_json_walks_along_valid_instances_match_both_oracles():
    """Prefixes of valid instances reach deep into objects and arrays (a random byte walk
    mostly stays in the first string it meets)."""
    schema = SCHEMAS[6]
    doc = {"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 30, "kids": [{"v": 4, "kids": []}]}]}
    g = compile_constraint("json", schema)
    rt = g.engine
    lengths, reference = completion_lengths(rt), CompletionLengths(rt, explore_all=True)
    text = json.dumps(doc, separators=(",", ":")).encode()
    c = rt.start
    for b in text:
        c = rt.step(c, b)
        assert c >= 0
        got = lengths.distance(c)
        assert got == reference.distance(c) == _bfs(rt, c)
    assert lengths.distance(c) == 0


def test_lazy_states_are_measured_without_building_their_dfa():
    """A lazy rule's state is measured from its key: measuring the start expands no state."""
    g = compile_constraint("regex", "(a|b)*a(a|b){12}")
    rt = g.engine
    before = int(rt.tab.counters[K.N_EXPANDED])
    assert completion_lengths(rt).distance(rt.start) == 13
    assert int(rt.tab.counters[K.N_EXPANDED]) == before
    dist, yields = completion_lengths(rt).nfa_distances()
    assert not dist.flags.writeable and not yields.flags.writeable
    assert int(yields[g.root]) == 13


def _suite_schemas(limit_files: int | None = None) -> list[tuple[str, object]]:
    out = []
    for path in sorted(SUITE.glob("*.json"))[:limit_files]:
        for group in json.loads(path.read_text()):
            out.append((f"{path.stem}::{group['description']}", group["schema"]))
    return out


def test_the_suites_schemas_match_the_reference():
    """The JSON-Schema-Test-Suite's schemas (those that compile): the distance on random
    walks equals the reference method's."""
    compared = schemas = 0
    for name, schema in _suite_schemas():
        try:
            g = compile_constraint("json", schema)
        except StructgenError:
            continue
        rt = g.engine
        lengths, reference = completion_lengths(rt), CompletionLengths(rt, explore_all=True)
        configs = _walk_configs(rt, random.Random(len(name)), 4, 12)
        for c in configs:
            assert lengths.distance(c) == reference.distance(c), name
        compared += len(configs)
        schemas += 1
    assert schemas > 200 and compared > 5_000


def test_the_suites_valid_instances_walk_to_distance_zero():
    """Along every prefix of a valid instance of a suite schema the distance equals the
    reference's, and it is 0 where the whole instance is read."""
    checked = 0
    for path in sorted(SUITE.glob("*.json")):
        for group in json.loads(path.read_text()):
            try:
                g = compile_constraint("json", group["schema"])
            except StructgenError:
                continue
            rt = g.engine
            lengths, reference = completion_lengths(rt), CompletionLengths(rt, explore_all=True)
            for test in group["tests"]:
                text = json.dumps(test["data"], separators=(",", ":")).encode()
                if not test["valid"] or not g.accepts(text):
                    continue
                c = rt.start
                for b in text:
                    c = rt.step(c, b)
                    assert lengths.distance(c) == reference.distance(c), (path.stem, group["description"])
                assert lengths.distance(c) == 0
                checked += 1
    assert checked > 300
