"""The engine layer under bad input: matcher misuse is a typed error, deep input is
a typed error or handled without recursion, and matching stays within a memory budget
while staying exact.

Oracles: Python's ``re`` for regular languages, ``json`` for instances, brute force for
token masks; memory bounds are checked in a subprocess under ``resource`` limits so this
process cannot blow up.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _ab_oracle import AB_EOS, AB_TOKENS, ab_regex, ab_step, ab_vocab, viable
from _toy_vocab import ToyVocab

import structgen
from structgen.errors import CompileLimitError, MatcherUsageError, StructgenError
from structgen.grammar import ir
from structgen.grammar.compiler import compile_grammar
from structgen.kernels.bitmask import allocate_bitmask
from structgen.masks.matcher import Matcher, bitmask_words, fill_bitmasks

ROOT = Path(__file__).resolve().parents[1]




def _ab_matcher(**kw: object) -> tuple[Matcher, ToyVocab]:
    """A matcher of ``a+b`` over the tokens a, b, ab, EOS (40 ids: two bitmask words)."""
    cg = compile_grammar(ir.Grammar({"s": ir.seq(ir.plus(ir.lit(b"a")), ir.lit(b"b"))}, "s"))
    tb: list[bytes | None] = [b"a", b"b", b"ab", None] + [b"zz"] * 36
    vocab = ToyVocab(tb, (3,), 40)
    return Matcher(cg, vocab, **kw), vocab  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# 11. Matcher misuse
# ---------------------------------------------------------------------------------------------

def test_matcher_usage_error_is_typed_and_exported() -> None:
    assert issubclass(MatcherUsageError, StructgenError)
    assert issubclass(MatcherUsageError, ValueError) and issubclass(MatcherUsageError, TypeError)
    assert structgen.MatcherUsageError is MatcherUsageError
    assert "MatcherUsageError" in structgen.__all__


@pytest.mark.parametrize("dtype", [np.int16, np.uint8, np.int64, np.uint32, np.float32])
def test_fill_bitmask_rejects_wrong_numpy_dtype(dtype: type) -> None:
    m, vocab = _ab_matcher()
    bm = np.full((2, bitmask_words(vocab.vocab_size)), 7, dtype=dtype)
    with pytest.raises(MatcherUsageError, match="int32"):
        m.fill_bitmask(bm, 0)
    assert (bm == 7).all()  # nothing written


def test_fill_bitmask_rejects_wrong_torch_dtype() -> None:
    torch = pytest.importorskip("torch")
    m, vocab = _ab_matcher()
    for dt in (torch.int16, torch.uint8, torch.int64, torch.float32):
        bm = torch.zeros((2, bitmask_words(vocab.vocab_size)), dtype=dt)
        with pytest.raises(MatcherUsageError, match="int32"):
            m.fill_bitmask(bm, 0)
        assert (bm == 0).all()


@pytest.mark.parametrize("row", [-1, -2, 2, 100, 1.0, True, "0", None])
def test_fill_bitmask_rejects_bad_rows(row: object) -> None:
    m, vocab = _ab_matcher()
    bm = np.full((2, bitmask_words(vocab.vocab_size)), -1, dtype=np.int32)
    with pytest.raises(MatcherUsageError):
        m.fill_bitmask(bm, row)  # type: ignore[arg-type]
    assert (bm == -1).all()  # row=-1 used to write the last row


def test_fill_bitmask_rejects_bad_shapes_and_objects() -> None:
    m, vocab = _ab_matcher()
    w = bitmask_words(vocab.vocab_size)
    bad = [np.full((w,), -1, np.int32), np.full((2, w - 1), -1, np.int32),
           np.full((2, w, 1), -1, np.int32), [[-1] * w], "bitmask", None]
    for bm in bad:
        with pytest.raises(MatcherUsageError):
            m.fill_bitmask(bm, 0)
    ro = np.full((1, w), -1, np.int32)
    ro.flags.writeable = False
    with pytest.raises(MatcherUsageError, match="read-only"):
        m.fill_bitmask(ro, 0)


def _bits(words: np.ndarray) -> set[int]:
    bits = np.unpackbits(np.ascontiguousarray(words).view(np.uint8), bitorder="little")
    return set(np.nonzero(bits)[0].tolist())


def test_fill_bitmask_zeroes_extra_columns_numpy_torch_and_batch() -> None:
    torch = pytest.importorskip("torch")
    m, vocab = _ab_matcher()
    w = bitmask_words(vocab.vocab_size)
    expect = {0, 2}  # a, ab (b needs an a first; EOS not yet)
    bm = np.full((3, w + 3), -1, dtype=np.int32)  # a model whose logits are wider
    m.fill_bitmask(bm, 1)
    assert _bits(bm[1]) == expect
    assert (bm[1, w:] == 0).all() and (bm[0] == -1).all() and (bm[2] == -1).all()
    tb = torch.full((3, w + 3), -1, dtype=torch.int32)
    m.fill_bitmask(tb, 2)
    assert _bits(tb[2].numpy()) == expect and (tb[2, w:] == 0).all() and (tb[:2] == -1).all()
    # non-contiguous (a column slice of a wider tensor) is written correctly too
    big = torch.full((2, 2 * (w + 1)), -1, dtype=torch.int32)
    view = big[:, ::2]
    m.fill_bitmask(view, 0)
    assert _bits(view[0].contiguous().numpy()) == expect and (big[0, 1::2] == -1).all()
    # the batch path: extra columns zeroed for matchers, all ones for a None matcher
    bb = np.full((2, w + 2), 5, dtype=np.int32)
    fill_bitmasks([m, None], bb)
    assert _bits(bb[0]) == expect and (bb[0, w:] == 0).all() and (bb[1] == -1).all()


def test_fill_bitmask_follows_a_tensor_whose_storage_moved() -> None:
    """fill_bitmask keeps a host view of the last buffer it was given; a CPU tensor whose
    storage is replaced in place (``set_``) is written in its new storage, not the old one."""
    torch = pytest.importorskip("torch")
    m, vocab = _ab_matcher()
    w = bitmask_words(vocab.vocab_size)
    tb = torch.full((2, w), -1, dtype=torch.int32)
    m.fill_bitmask(tb, 0)
    assert _bits(tb[0].numpy()) == {0, 2}
    before = tb.data_ptr()
    tb.set_(torch.full((3, w), 7, dtype=torch.int32))
    assert tb.data_ptr() != before
    m.fill_bitmask(tb, 2)
    assert _bits(tb[2].numpy()) == {0, 2} and (tb[:2] == 7).all()


def test_fill_bitmasks_rejects_misuse() -> None:
    m, vocab = _ab_matcher()
    w = bitmask_words(vocab.vocab_size)
    bm = np.zeros((2, w), dtype=np.int32)
    with pytest.raises(MatcherUsageError):
        fill_bitmasks([m], bm, [-1])
    with pytest.raises(MatcherUsageError):
        fill_bitmasks([m], bm, [2])
    with pytest.raises(MatcherUsageError):
        fill_bitmasks([m, m], bm, [0, 0])
    with pytest.raises(MatcherUsageError):
        fill_bitmasks([m], np.zeros((2, w), dtype=np.int16))
    with pytest.raises(MatcherUsageError):
        fill_bitmasks(["not a matcher"], bm)
    with pytest.raises(ValueError):  # a MatcherUsageError, still a ValueError for old callers
        fill_bitmasks([m, m], bm, [0])


@pytest.mark.parametrize("bad", [-1, -10])
def test_negative_max_rollback_is_rejected(bad: int) -> None:
    with pytest.raises(MatcherUsageError, match="max_rollback"):
        _ab_matcher(max_rollback=bad)


def test_max_rollback_bounds_history() -> None:
    m, _ = _ab_matcher(max_rollback=0)
    assert m.accept_token(0) and m.accept_token(0)
    assert m.num_accepted == 0
    with pytest.raises(MatcherUsageError):
        m.rollback(1)
    with pytest.raises(MatcherUsageError):
        _ab_matcher(max_rollback=1.5)  # type: ignore[arg-type]


def test_rollback_misuse() -> None:
    m, _ = _ab_matcher()
    assert m.accept_token(0)
    for n in (-1, 2, 1.0, "1"):
        with pytest.raises(MatcherUsageError):
            m.rollback(n)  # type: ignore[arg-type]
    assert m.num_accepted == 1
    m.rollback(np.int64(1))
    assert m.num_accepted == 0


def test_token_ids_outside_the_vocabulary_are_typed_errors() -> None:
    m, vocab = _ab_matcher()
    for bad in (-1, vocab.vocab_size, 10**12):
        with pytest.raises(MatcherUsageError, match="outside the vocabulary"):
            m.accept_token(bad)
        with pytest.raises(MatcherUsageError):
            m.is_token_allowed(bad)
        with pytest.raises(MatcherUsageError):
            m.validate_tokens([0, bad])
    for bad in (1.7, "0", None, True):
        with pytest.raises(MatcherUsageError):
            m.accept_token(bad)  # type: ignore[arg-type]
    assert m.num_accepted == 0
    # grammar-forbidden ids in range are a verdict, not an error
    assert m.accept_token(1) is False
    assert m.accept_token(np.int32(0)) is True


def test_allocate_bitmask_arguments() -> None:
    pytest.importorskip("torch")
    for rows, v in ((-1, 10), (1, 0), (1, -5), (1.5, 10), (1, "10")):
        with pytest.raises(MatcherUsageError):
            allocate_bitmask(rows, v)  # type: ignore[arg-type]
    assert tuple(allocate_bitmask(2, 33).shape) == (2, 2)


def test_matcher_needs_a_compiled_grammar() -> None:
    _, vocab = _ab_matcher()
    with pytest.raises(MatcherUsageError):
        Matcher("a+b", vocab)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# 4. Bounded memory while matching (lazily built tables are flushed, answers stay exact)
# ---------------------------------------------------------------------------------------------

def test_flushing_keeps_accepts_and_masks_exact() -> None:
    rx, cg = ab_regex(9)
    eng = cg.engine
    eng.table_budget = 1  # flush at every safe point after any growth
    rng = random.Random(7)
    for _ in range(150):
        s = "".join(rng.choice("ab") for _ in range(rng.randrange(0, 120))) + rng.choice(["", "c", "cc"])
        assert cg.accepts(s) == (rx.fullmatch(s) is not None), s
        assert cg.accepts_prefix(s) == viable(rx, "[ab]*", s), s
    vocab = ab_vocab()
    for _ in range(12):
        m = Matcher(cg, vocab)  # type: ignore[arg-type]
        other = Matcher(cg, vocab)  # type: ignore[arg-type]
        assert other.accept_token(0)  # a second history to carry across flushes
        text = ""
        accepted: list[int] = []
        for _ in range(rng.randrange(5, 60)):
            t = ab_step(m, rx, text, rng)
            if t == AB_EOS:
                break
            accepted.append(t)
            text += AB_TOKENS[t].decode()  # type: ignore[union-attr]
            assert m.is_accepting() == (rx.fullmatch(text) is not None)
        k = rng.randrange(len(accepted) + 1)
        m.rollback(k + (1 if m.is_terminated() else 0))
        text = "".join(AB_TOKENS[t].decode() for t in accepted[:len(accepted) - k])  # type: ignore[union-attr]
        assert m.is_accepting() == (rx.fullmatch(text) is not None)
        assert other.is_accepting() is False and other.validate_tokens([2]) == 0
    assert eng.flushes > 20  # the budget really forced flushes


def test_a_mask_asked_for_across_a_flush_is_not_cached() -> None:
    """The window a lock-free mask read leaves: the caller read a configuration id, then
    another thread flushed before the mask took the lock. The id may name another
    configuration now; nothing may be computed or cached under it."""
    from structgen.masks.engine import engine_for

    rx, cg = ab_regex(3)
    vocab = ab_vocab()
    m = Matcher(cg, vocab)  # type: ignore[arg-type]
    for t in (0, 1, 0, 0, 1):
        assert m.accept_token(t)
    rt = cg.engine
    masks = engine_for(cg)
    cid, epoch = m._hist[-1], rt.epoch
    with rt.lock:
        rt.flush()
    vt = m._vt
    assert masks.token_mask_at(cid, vt, epoch) is None
    assert masks.cached_mask(cid, vt) is None
    text = "abaab"
    assert (AB_EOS in m.allowed_token_ids()) == (rx.fullmatch(text) is not None)
    assert masks.token_mask_at(m._hist[-1], vt, rt.epoch) is not None


def test_tables_grown_into_room_made_ahead_keep_masks_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Room for the next doubling, made on a background thread (structgen.grammar.growth),
    holds the same tables as a plain doubling: masks follow the regex oracle, and the
    doublings did take that room."""
    import time

    import structgen.grammar.growth as growth
    import structgen.grammar.runtime as runtime

    monkeypatch.setattr(runtime, "SPARE_MIN_BYTES", 0)  # every table group gets room made ahead
    taken = []
    plain_take = growth.Spares.take

    def take(self: growth.Spares, *a: object) -> object:
        got = plain_take(self, *a)  # type: ignore[arg-type]
        taken.append(got is not None)
        return got

    monkeypatch.setattr(growth.Spares, "take", take)
    rx, cg = ab_regex(9)
    vocab = ab_vocab()
    rng = random.Random(11)
    for _ in range(40):
        m = Matcher(cg, vocab)  # type: ignore[arg-type]
        text = ""
        for _ in range(rng.randrange(5, 60)):
            spares = cg.engine.tab.spares
            end = time.monotonic() + 10
            while spares._busy and time.monotonic() < end:  # let the room be made
                time.sleep(0.001)
            t = ab_step(m, rx, text, rng)
            if t == AB_EOS:
                break
            text += AB_TOKENS[t].decode()  # type: ignore[union-attr]
    assert any(taken)  # some doubling used the room made ahead


def test_tables_grown_in_reserved_address_space_keep_masks_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Transition tables doubled as wider views of a reservation (structgen.grammar.growth.reserve)
    hold the same rows as tables doubled by copying: masks follow the regex oracle while the
    tables grow into the reservation and then past it (copied again from there on)."""
    import structgen.grammar.growth as growth

    if not growth.can_reserve():
        pytest.skip("no address space can be reserved here (RLIMIT_AS, or no anonymous mappings)")
    monkeypatch.setattr(growth, "RESERVE_FROM_BYTES", 0)  # reserve at the first doubling
    monkeypatch.setattr(growth, "RESERVE_MAX_BYTES", 1 << 20)  # 1,024 rows: outgrown below
    made: list[np.ndarray] = []
    plain_reserve = growth.reserve

    def reserve(rows: int, dims: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        got = plain_reserve(rows, dims, dtype)
        if got is not None:
            made.append(got)
        return got

    monkeypatch.setattr(growth, "reserve", reserve)
    rx, cg = ab_regex(11)  # 2^12 DFA states: the configuration table outgrows 1,024 rows
    rt = cg.engine
    with rt.lock:
        rt.flush()  # tables made under the patched limits
    vocab = ab_vocab()
    rng = random.Random(5)
    widened = False
    for _ in range(60):
        m = Matcher(cg, vocab)  # type: ignore[arg-type]
        text = ""
        for _ in range(rng.randrange(20, 80)):
            trans = rt.tab.trans
            widened = widened or any(trans.shape[0] > 256 and np.shares_memory(trans, r) for r in made)
            t = ab_step(m, rx, text, rng)
            if t == AB_EOS:
                break
            text += AB_TOKENS[t].decode()  # type: ignore[union-attr]
    assert widened  # a doubling took a wider view of its reservation
    assert rt.tab.trans.shape[0] > 1024  # and the table then grew past it
    assert not any(np.shares_memory(rt.tab.trans, r) for r in made)


def test_no_address_space_is_reserved_under_an_address_space_limit() -> None:
    """Under ``RLIMIT_AS`` reserved address space would crowd out real allocations: a runtime
    made there doubles its tables by copying (checked in a subprocess)."""
    code = textwrap.dedent("""
        import resource
        from structgen.grammar import growth
        from structgen.grammar.runtime import RuntimeTables
        from structgen import compile_regex
        cg = compile_regex("(a|b)*c")
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        limit = 16 << 30 if hard == resource.RLIM_INFINITY else min(16 << 30, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        assert not growth.can_reserve()
        assert growth.reserve(1024, (256,), __import__("numpy").dtype("int32")) is None
        assert RuntimeTables(cg.rules, 256 << 20).reservations.limit == 0
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_room_made_ahead_is_taken_only_at_its_shape() -> None:

    import structgen.grammar.growth as growth

    spares = growth.Spares()
    assert spares.prepare("g", [("t", (4, 3), np.dtype(np.int32), 7), ("u", (8,), np.dtype(np.uint8), None)])
    spares.wait("g", timeout=10)  # what a doubling does when it finds the room still being made
    assert spares.nbytes() == 4 * 3 * 4 + 8
    spares.wait("nothing being made")  # returns at once
    assert spares.take("t", (8, 3), np.dtype(np.int32)) is None  # another size: dropped
    assert spares.take("t", (4, 3), np.dtype(np.int32)) is None
    got = spares.take("u", (8,), np.dtype(np.uint8))
    assert got is not None and got.shape == (8,) and spares.nbytes() == 0


_RSS_SCRIPT = textwrap.dedent("""
    import random, re, resource, sys
    from structgen import compile_regex
    from structgen.validation import Document, SchemaValidator
    def peak():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    pat = "(a|b)*a(a|b){20}"
    cg = compile_regex(pat)
    cg.accepts("ab" * 50)
    rng = random.Random(5)
    text = "".join(rng.choice("ab") for _ in range(int(sys.argv[1])))
    base = peak()
    got = cg.accepts(text)
    grew = peak() - base
    # the validator's own (smaller) budget, through the jsonschema + grammar path
    v = SchemaValidator({"type": "string", "pattern": "^(a|b)*a(a|b){20}$"})
    res = v.validate(Document(1, text[:10000]), "-")
    want = re.fullmatch(pat, text) is not None
    print(got == want, grew, res.grammar == (re.fullmatch(pat, text[:10000]) is not None),
          v._grammar.engine.flushes > 0)
""")


def test_lazy_dfa_memory_is_bounded_exactly() -> None:
    """(a|b)*a(a|b){20} has 2**21 DFA states: 300 kB of input used 2.1 GB before. With a
    16 MiB table budget, 40 kB stay far below that (peak RSS growth in a subprocess) and
    the verdict equals re.fullmatch."""
    env = dict(os.environ, STRUCTGEN_TABLE_BYTES=str(16 << 20))
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, "40000"], capture_output=True, text=True,
                         timeout=600, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    same, grew, grammar_ok, flushed = out.stdout.split()
    assert same == "True" and grammar_ok == "True" and flushed == "True"
    assert int(grew) < 100, f"peak RSS grew by {grew} MB"  # was about 280 MB


def test_memory_budget_is_configurable() -> None:
    from structgen.grammar import runtime as runtime_mod
    from structgen.masks import engine as engine_mod

    with pytest.raises(StructgenError):
        engine_mod.set_memory_budget(table_bytes=-1)
    old = (runtime_mod.DEFAULT_TABLE_BYTES, engine_mod.DEFAULT_MASK_CACHE_BYTES)
    try:
        engine_mod.set_memory_budget(table_bytes=1 << 20, mask_cache_bytes=1 << 16)
        cg = compile_grammar(ir.Grammar({"s": ir.plus(ir.lit(b"xyz"))}, "s"))
        rt = runtime_mod.Runtime(cg)
        eng = engine_mod.Engine(rt)
        assert rt.table_budget == 1 << 20 and eng.mask_cache.limit == 1 << 16
    finally:
        engine_mod.set_memory_budget(table_bytes=old[0], mask_cache_bytes=old[1])


# ---------------------------------------------------------------------------------------------
# 3. Deep input: no RecursionError
# ---------------------------------------------------------------------------------------------

def _deep_dict(n: int) -> dict:
    d: dict = {}
    for _ in range(n):
        d = {"a": d}
    return d


def _nested_schema(n: int) -> dict:
    s: dict = {"type": "integer"}
    for _ in range(n):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


def test_many_required_properties_build_without_recursion() -> None:
    """Required properties became a chain of inlined rules and the Thompson construction
    recursed along it: 1,500 of them overflowed the default stack. To keep the test quick,
    600 are compiled with only 250 frames of headroom (the recursive builder needed about
    400 for them); the iterative one needs none per property."""
    import inspect

    from structgen import CompileOptions, compile_json_schema

    n = 600
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)},
              "required": [f"p{i}" for i in range(n)]}
    compile_json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})  # warm-up
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + 250)  # lowered, for this call only
    try:
        cg = compile_json_schema(schema, compile_options=CompileOptions(timeout_s=120))
    finally:
        sys.setrecursionlimit(old)
    doc = {f"p{i}": i for i in range(n)}
    assert cg.accepts(json.dumps(doc, separators=(",", ":")))
    del doc["p350"]
    assert not cg.accepts(json.dumps(doc, separators=(",", ":")))


def test_deep_schema_documents_are_compile_limit_errors() -> None:
    from structgen import compile_json_schema

    for schema in ({"const": _deep_dict(10_000)}, {"x-note": _deep_dict(10_000)},
                   "[" * 100_000 + "]" * 100_000):
        with pytest.raises(CompileLimitError) as info:
            compile_json_schema(schema)
        assert "\n" not in str(info.value) and len(str(info.value)) < 300


def test_schema_validator_deep_schemas_are_typed() -> None:
    from structgen.validation import SchemaValidator

    with pytest.raises(CompileLimitError):
        SchemaValidator({"x": _deep_dict(10_000)}, use_grammar=False)
    with pytest.raises(CompileLimitError):  # 120 subschemas: under max_depth, over jsonschema's stack
        SchemaValidator(_nested_schema(120), use_grammar=False)


def _validate_cli(tmp_path: Path, schema: object, instance_text: str) -> subprocess.CompletedProcess:
    (tmp_path / "s.json").write_text(json.dumps(schema))
    (tmp_path / "i.json").write_text(instance_text)
    return subprocess.run([sys.executable, "-m", "structgen", "validate", "--no-grammar", "-s",
                           str(tmp_path / "s.json"), str(tmp_path / "i.json")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_validate_cli_deep_schema_is_exit_2(tmp_path: Path) -> None:
    out = _validate_cli(tmp_path, _nested_schema(120), "1\n")
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert "too deeply" in out.stderr


def test_validate_cli_deep_instances_are_invalid(tmp_path: Path) -> None:
    # 100,000 nested arrays: json cannot parse it; the instance is reported, not valid
    out = _validate_cli(tmp_path, {"type": "array"}, "[" * 100_000 + "]" * 100_000 + "\n")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "nested too deeply" in out.stdout
    # 300 levels: parsed, but deeper than the validator checks
    out = _validate_cli(tmp_path, {"type": "array"}, "[" * 300 + "]" * 300 + "\n")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "nested too deeply to check" in out.stdout and len(out.stdout.strip().splitlines()) == 1


def test_long_ref_chains_are_compile_limit_errors() -> None:
    """$ref -> $ref -> ... 2,000 deep: the normaliser recursed once per reference."""
    from structgen import compile_json_schema

    def chain(n: int) -> dict:
        defs: dict = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
        defs[f"d{n}"] = {"type": "integer"}
        return {"$defs": defs, "$ref": "#/$defs/d0"}

    with pytest.raises(CompileLimitError, match="in place"):
        compile_json_schema(chain(2000))
    cg = compile_json_schema(chain(100))
    assert cg.accepts("5") and not cg.accepts('"x"')


def test_deep_ir_hashes_iteratively_and_fails_typed() -> None:
    """An IR nested 5,000 deep (built through the Python API): hashing and fingerprints
    work without recursion, compiling is a CompileLimitError, never a RecursionError."""
    e = ir.lit(b"a")
    for _ in range(5000):
        e = ir.Alt((ir.Seq((ir.lit(b"x"), e)), ir.lit(b"y")))
    assert len(e.fingerprint()) == 32 and isinstance(hash(e), int)
    try:
        cg = compile_grammar(ir.Grammar({"s": e}, "s"))
    except CompileLimitError:
        return
    assert cg.accepts(b"x" * 100 + b"a")


def test_flushes_from_other_threads_keep_matchers_exact() -> None:
    """Matchers of one grammar in four threads, tables flushed at every growth: each
    thread's answers equal the oracle (a flush by one thread renumbers the others' states)."""
    import threading

    rx, cg = ab_regex(9)
    cg.engine.table_budget = 1
    tokens = [b"a", b"b", b"c", b"ab", b"ba", b"bba", None]
    vocab = ToyVocab(tokens, (6,), 7)
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(6):
                m = Matcher(cg, vocab)  # type: ignore[arg-type]
                text = ""
                for _ in range(rng.randrange(20, 80)):
                    t = rng.randrange(5)
                    ok = m.accept_token(t)
                    want = viable(rx, "[ab]*", text + tokens[t].decode())  # type: ignore[union-attr]
                    if ok != want:
                        errors.append(f"accept {text!r} + {tokens[t]!r}: {ok}")
                        return
                    if ok:
                        text += tokens[t].decode()  # type: ignore[union-attr]
                    if m.is_accepting() != (rx.fullmatch(text) is not None):
                        errors.append(f"accepting {text!r}")
                        return
                    if (6 in m.allowed_token_ids()) != (rx.fullmatch(text) is not None):
                        errors.append(f"mask {text!r}")
                        return
        except Exception as e:  # reported below, with the thread's failure
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]
    assert cg.engine.flushes > 10
