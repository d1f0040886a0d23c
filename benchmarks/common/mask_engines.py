"""The engines of ``benchmarks/masks.py``: one adapter per engine, and the worker process each
engine runs in (a compile that overruns its time limit is killed with the process).

:class:`EngineProc` (parent side) starts a spawned worker that loads the tokenizer's vocabulary,
builds the engine's :class:`Adapter`, warms it up, then runs one case per request and answers
with its measurements (:class:`_Replayer`). See ``benchmarks/masks.py`` for what is measured.

Every case is replayed twice in its worker: first on the matcher made right after the compile
(the engine's caches are cold for this grammar: the *first pass*), then the same tokens again
on a fresh matcher of the same compiled grammar (caches warm: the *warm pass*). With
``opts["forward_ms"]`` > 0 a simulated model forward pass (``time.sleep``) runs between two
steps, outside the timed step; an engine's own background threads get the CPU meanwhile.
"""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.util
import json
import multiprocessing as mp
import os
import signal
import time
import traceback
from typing import Any

WARMUP_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                 "required": ["a"]}
WARMUP_TEXT = '{"a":12,"b":"xy"}'
# Grammar-independent tables an engine may build on first use (Unicode character classes of
# patterns, string format automata) are built by this second warm-up compile, the same for
# every engine, as in a long-running server; otherwise they land on whichever benchmark case
# happens to use them first (a 100-case sample; MaskBench-style runs over thousands of schemas
# amortise them the same way). Content-keyed caches are still cleared before every case.
WARMUP_TABLES_SCHEMA = {"type": "object", "properties": {
    "p": {"type": "string", "pattern": "^\\w+\\s\\d+.$"},
    **{f"f{i}": {"type": "string", "format": f} for i, f in enumerate(
        ("date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uri",
         "uri-reference", "uuid"))}}}


def respell_json(text: str, spelling: str) -> str:
    """``text`` (compact JSON) in the spelling an engine's JSON-schema grammar defines:
    ``"compact"`` (unchanged) or ``"spaced"`` (GLRMask's: a space after every ``,`` and ``:``
    outside strings, as ``json.dumps`` writes by default, and U+007F inside strings escaped as
    ``\\u007f``, which its string grammar requires); nothing else changes (other escapes,
    number spellings and property order stay as they are)."""
    if spelling == "compact":
        return text
    if spelling != "spaced":
        raise ValueError(f"unknown JSON spelling {spelling!r}")
    out: list[str] = []
    in_str = esc = False
    for ch in text:
        if in_str and ch == "\x7f":
            out.append("\\u007f")
            continue
        out.append(ch)
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in ",:":
            out.append(" ")
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Engine adapters (run inside the worker processes)
# ---------------------------------------------------------------------------------------------

class CompileFailed(Exception):
    """The engine refused the grammar (unsupported feature, limit, syntax): not a crash.
    ``timeout``: the engine's own compile time limit stopped it."""

    def __init__(self, message: str, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


class Adapter:
    """One engine behind the benchmark's interface.

    ``compile(case)`` -> compiled grammar (raises :class:`CompileFailed`);
    ``new_matcher(compiled)`` -> a fresh matcher at the start state;
    ``fill(matcher, bitmask)`` writes the packed int32 mask into ``bitmask[0]`` (torch
    ``[1, ceil(V/32)]``); ``advance(matcher, token)`` -> False if the token is refused.
    """

    name = ""
    module = "structgen"  # the engine's top-level module: checked before the vocabulary is loaded
    # how the engine's JSON-schema grammars spell JSON between tokens (see respell_json): the
    # replayed instance is written (and tokenized) in this spelling for this engine
    spelling = "compact"

    @staticmethod
    def worker_env(opts: dict[str, Any]) -> dict[str, str]:
        """Environment variables set in the worker before the engine's module is imported."""
        return {}

    def __init__(self, tokenizer: Any, vocab: Any, opts: dict[str, Any]) -> None:
        self.tok = tokenizer
        self.vocab = vocab
        self.opts = opts

    def version(self) -> str:
        return "?"

    def supports(self, case: dict[str, Any]) -> str | None:
        """None if the engine can run the case, else why not (reported as n/a)."""
        return None

    def clear_caches(self) -> list[str]:
        return []

    def compile(self, case: dict[str, Any]) -> Any:
        raise NotImplementedError

    def new_matcher(self, compiled: Any) -> Any:
        raise NotImplementedError

    def keep_start(self, compiled: Any, matcher: Any) -> None:
        """Called (untimed) after the first mask of the first matcher, before any token: an
        engine whose compiled grammar is its first matcher keeps a copy of the start state
        here for the warm pass's fresh matcher."""

    def fill(self, matcher: Any, bitmask: Any) -> None:
        raise NotImplementedError

    def advance(self, matcher: Any, token: int) -> bool:
        raise NotImplementedError

    def memory(self, compiled: Any, matcher: Any) -> dict[str, Any]:
        return {}


def clear_structgen_caches() -> list[str]:
    """Clear structgen's content-keyed caches (compiled grammars, schema documents, compiled
    patterns, numeric expressions), so the next compile is cold for that grammar; returns
    their names. Tables that do not depend on the grammar (Unicode data, formats, the
    vocabulary table) stay warm, as in a long-running server."""
    cleared = []
    js = "structgen.frontends.json_schema"
    for mod_name, attr in ((f"{js}.compiler", "_CACHE"), (f"{js}.compiler", "_DOC_CACHE"),
                           ("structgen.grammar.compiler", "_CACHE"),
                           ("structgen.frontends.lark", "_LRU"),
                           (f"{js}.compiler", "_WARNINGS")):
        obj = getattr(importlib.import_module(mod_name), attr, None)
        if hasattr(obj, "clear"):
            obj.clear()
            cleared.append(f"{mod_name}.{attr}")
    for mod_name, attr in ((f"{js}.patterns", "compile_pattern"), (f"{js}.numbers", "_build")):
        fn = getattr(importlib.import_module(mod_name), attr, None)
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()
            cleared.append(f"{mod_name}.{attr}")
    return cleared


class StructgenAdapter(Adapter):
    name = "structgen"

    def __init__(self, tokenizer: Any, vocab: Any, opts: dict[str, Any]) -> None:
        super().__init__(tokenizer, vocab, opts)
        from structgen.config import CompileOptions
        from structgen.frontends.lark import compile_lark
        from structgen.json_schema import compile_json_schema
        from structgen.masks.matcher import Matcher

        self._copts = CompileOptions(timeout_s=float(opts["compile_timeout"]))
        # validation's language, as the peers are set up (every valid instance replays): the
        # generation default would close objects and bound numbers the instances may use
        self._cjs = functools.partial(compile_json_schema, for_generation=False)
        self._clark, self._Matcher = compile_lark, Matcher
        # with a simulated forward pass, the masks a few bytes ahead are prepared during it,
        # as a decode loop does (Matcher.start_look_ahead)
        self._look_ahead = float(opts.get("forward_ms") or 0.0) > 0 and bool(opts.get("look_ahead", True))

    def version(self) -> str:
        import structgen

        return structgen.__version__

    def clear_caches(self) -> list[str]:
        return clear_structgen_caches()

    def compile(self, case: dict[str, Any]) -> Any:
        from structgen.errors import StructgenError

        try:
            if case["kind"] == "schema":
                # the spelling generation uses (structgen.generate, the integrations): strings
                # canonical, as the peers' JSON grammars write them
                return self._cjs(case["schema"], compile_options=self._copts, string_escapes="canonical")
            return self._clark(case["grammar"], compile_options=self._copts)
        except StructgenError as e:
            kw = getattr(e, "keyword", None)
            raise CompileFailed(f"{type(e).__name__}{':' + str(kw) if kw else ''}: {str(e)[:200]}",
                                timeout=type(e).__name__ == "CompileTimeoutError") from None

    def new_matcher(self, compiled: Any) -> Any:
        return self._Matcher(compiled, self.vocab)

    def fill(self, matcher: Any, bitmask: Any) -> None:
        matcher.fill_bitmask(bitmask, 0)
        if self._look_ahead:
            matcher.start_look_ahead()

    def advance(self, matcher: Any, token: int) -> bool:
        return matcher.accept_token(token)

    def memory(self, compiled: Any, matcher: Any) -> dict[str, Any]:
        from structgen.masks.engine import engine_for

        eng = engine_for(compiled)  # the grammar's token-mask engine over its byte runtime
        return {"mask_cache_bytes": int(eng.mask_cache_bytes), "masks_cached": len(eng.mask_cache),
                "engine_bytes": int(eng.memory_bytes()), "configurations": eng.runtime.num_configs,
                "rule_states": eng.runtime.num_rule_states, "automaton_states": int(compiled.num_states)}


class XgrammarAdapter(Adapter):
    name = "xgrammar"
    module = "xgrammar"

    def __init__(self, tokenizer: Any, vocab: Any, opts: dict[str, Any]) -> None:
        super().__init__(tokenizer, vocab, opts)
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab.vocab_size, stop_token_ids=list(vocab.eos_token_ids))
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=int(opts["threads"]), cache_enabled=False)

    def version(self) -> str:
        from importlib.metadata import version

        return version("xgrammar")

    def supports(self, case: dict[str, Any]) -> str | None:
        if case["kind"] == "lark" and not hasattr(self.compiler, "compile_lark"):
            return "this xgrammar version has no Lark front-end (compile_lark)"
        return None

    def clear_caches(self) -> list[str]:
        self.compiler.clear_cache()
        return ["GrammarCompiler.clear_cache (cache_enabled=False)"]

    def compile(self, case: dict[str, Any]) -> Any:
        try:
            if case["kind"] == "schema":
                return self.compiler.compile_json_schema(
                    json.dumps(case["schema"]), any_whitespace=False, separators=(",", ":"),
                    strict_mode=False)
            return self.compiler.compile_lark(case["grammar"])
        except (RuntimeError, ValueError, TypeError) as e:
            raise CompileFailed(f"{type(e).__name__}: {str(e)[:200]}") from None

    def new_matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher: Any, bitmask: Any) -> None:
        matcher.fill_next_token_bitmask(bitmask, 0)

    def advance(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))

    def memory(self, compiled: Any, matcher: Any) -> dict[str, Any]:
        try:
            return {"compiled_bytes": int(compiled.memory_size_bytes)}
        except Exception:  # noqa: BLE001
            return {}


class LlguidanceAdapter(Adapter):
    name = "llguidance"
    module = "llguidance"

    def __init__(self, tokenizer: Any, vocab: Any, opts: dict[str, Any]) -> None:
        super().__init__(tokenizer, vocab, opts)
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.fill_fn = llguidance.torch.fill_next_token_bitmask
        self.lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab.vocab_size,
                                                  eos_token=list(vocab.eos_token_ids))

    def version(self) -> str:
        from importlib.metadata import version

        return version("llguidance")

    def compile(self, case: dict[str, Any]) -> Any:
        M = self.llg.LLMatcher
        try:
            if case["kind"] == "schema":
                g = M.grammar_from_json_schema(
                    case["schema"], defaults={"whitespace_flexible": False, "item_separator": ",",
                                              "key_separator": ":"})
            else:
                g = M.grammar_from_lark(case["grammar"])
            m = M(self.lltok, g, log_level=0)
        except (ValueError, RuntimeError, TypeError) as e:
            raise CompileFailed(f"{type(e).__name__}: {str(e)[:200]}") from None
        if m.is_error():
            raise CompileFailed(m.get_error()[:200])
        # the first matcher is the compiled grammar itself; later ones are copies of its start
        return {"first": m}

    def new_matcher(self, compiled: Any) -> Any:
        if "first" in compiled:
            return compiled.pop("first")
        return compiled["start"].deep_copy()

    def keep_start(self, compiled: Any, matcher: Any) -> None:
        compiled["start"] = matcher.deep_copy()

    def fill(self, matcher: Any, bitmask: Any) -> None:
        self.fill_fn(matcher, bitmask, 0)

    def advance(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token))


class OutlinesCoreAdapter(Adapter):
    name = "outlines-core"
    module = "outlines_core"

    def __init__(self, tokenizer: Any, vocab: Any, opts: dict[str, Any]) -> None:
        super().__init__(tokenizer, vocab, opts)
        import outlines_core
        from outlines_core.json_schema import build_regex_from_schema

        self.oc = outlines_core
        self.build_regex = build_regex_from_schema
        eos = int(vocab.eos_token_ids[0])
        by_bytes: dict[bytes, list[int]] = {}
        for tid, b in enumerate(vocab.token_bytes):
            if b and tid != eos:
                by_bytes.setdefault(bytes(b), []).append(tid)
        self.ocvocab = outlines_core.Vocabulary(eos, by_bytes)

    def version(self) -> str:
        from importlib.metadata import version

        return version("outlines-core")

    def supports(self, case: dict[str, Any]) -> str | None:
        if case["kind"] != "schema":
            return "regular expressions only (no context-free grammars)"
        return None

    def compile(self, case: dict[str, Any]) -> Any:
        try:
            regex = self.build_regex(json.dumps(case["schema"]), whitespace_pattern="")
            return self.oc.Index(regex, self.ocvocab)
        except (ValueError, RuntimeError, TypeError) as e:
            raise CompileFailed(f"{type(e).__name__}: {str(e)[:200]}") from None

    def new_matcher(self, compiled: Any) -> Any:
        return self.oc.Guide(compiled)

    def fill(self, matcher: Any, bitmask: Any) -> None:
        row = bitmask[0]
        matcher.write_mask_into(row.data_ptr(), row.numel(), 4)

    def advance(self, matcher: Any, token: int) -> bool:
        try:
            matcher.advance(token, return_tokens=False)
        except ValueError:
            return False
        return True


class GlrmaskAdapter(Adapter):
    name = "glrmask"
    module = "glrmask"
    # glrmask 0.5's JSON-schema grammars write ", " and ": " between tokens (no option for
    # compact JSON) and U+007F in strings as an escape: the instance is replayed in that
    # spelling (respell_json), tokenized on its own
    spelling = "spaced"

    @staticmethod
    def worker_env(opts: dict[str, Any]) -> dict[str, str]:
        # compile threads as for xgrammar (--threads); glrmask compiles with rayon
        n = str(int(opts["threads"]))
        return {"RAYON_NUM_THREADS": n, "GLRMASK_COMPILE_THREADS": n}

    def __init__(self, tokenizer: Any, vocab: Any, opts: dict[str, Any]) -> None:
        super().__init__(tokenizer, vocab, opts)
        import glrmask

        self.glr = glrmask
        # the text tokens' bytes, as for outlines-core; special tokens have none
        self.glrvocab = glrmask.Vocab.from_id_to_bytes(
            {tid: bytes(b) for tid, b in enumerate(vocab.token_bytes) if b})
        # EOS after the grammar, so that the mask allows it exactly where the grammar accepts
        # (what the other engines' masks do)
        self.eos = glrmask.TokenSet(list(vocab.eos_token_ids))
        self._bm: Any = None
        self._row: Any = None

    def version(self) -> str:
        return str(self.glr.__version__)

    def compile(self, case: dict[str, Any]) -> Any:
        glr = self.glr
        try:
            if case["kind"] == "schema":
                g = glr.Grammar.from_json_schema(case["schema"])
            else:
                g = glr.Grammar.from_lark(case["grammar"])
            return glr.Grammar.from_expr(glr.Expr.sequence(g, self.eos)).compile(self.glrvocab)
        except (ValueError, RuntimeError, TypeError, OverflowError) as e:
            raise CompileFailed(f"{type(e).__name__}: {str(e)[:200]}") from None

    def new_matcher(self, compiled: Any) -> Any:
        return compiled.start()

    def fill(self, matcher: Any, bitmask: Any) -> None:
        if bitmask is not self._bm:  # the replayer's one bitmask: its row as NumPy, once
            self._bm, self._row = bitmask, bitmask[0].numpy()
        matcher.fill_mask(self._row)

    def advance(self, matcher: Any, token: int) -> bool:
        return bool(matcher.commit_token(token))


ADAPTERS: dict[str, type[Adapter]] = {
    "structgen": StructgenAdapter, "xgrammar": XgrammarAdapter, "llguidance": LlguidanceAdapter,
    "outlines-core": OutlinesCoreAdapter, "glrmask": GlrmaskAdapter,
}


def load_vocab(alias: str) -> tuple[Any, Any]:
    """The tokenizer of a structgen alias and its :class:`~structgen.masks.vocab.Vocabulary`."""
    from structgen.assets import store as model_store
    from structgen.masks.vocab import Vocabulary

    tok = model_store.load_tokenizer(alias)
    return tok, Vocabulary.from_tokenizer(tok)


class _Replayer:
    """Runs one case on one adapter and measures it (inside a worker)."""

    def __init__(self, adapter: Adapter, vocab: Any, forward_ms: float = 0.0) -> None:
        import numpy as np
        import torch

        self.np = np
        self.a = adapter
        self.forward_s = max(0.0, float(forward_ms)) / 1e3
        words = (vocab.vocab_size + 31) // 32
        self.bitmask = torch.zeros((1, words), dtype=torch.int32)
        self.words = self.bitmask[0].numpy().view(np.uint32)  # shares memory with the tensor
        text = np.zeros(words * 32, dtype=bool)
        text[[i for i, b in enumerate(vocab.token_bytes) if b]] = True
        self.text_bits = np.packbits(text, bitorder="little")  # uint8 [words * 4]
        self.eos = int(vocab.eos_token_ids[0])

    def _allowed(self, t: int) -> bool:
        return bool((int(self.words[t >> 5]) >> (t & 31)) & 1)

    def _count(self) -> int:
        np = self.np
        return int(np.bitwise_count(self.words.view(np.uint8) & self.text_bits).sum())

    def _replay(self, m: Any, tokens: list[int]) -> tuple[list[int], list[int], dict[str, Any] | None]:
        """Advance ``m`` (its first mask already in the bitmask) by ``tokens``, one timed step
        (advance + fill) per token, a simulated forward pass (untimed sleep) before each.
        Returns the step times (ns), the allowed-token counts (the first mask's included) and
        the rejection (None if every token was accepted)."""
        a, bm, clock, fwd = self.a, self.bitmask, time.perf_counter_ns, self.forward_s
        counts = [self._count()]
        steps: list[int] = []
        for i, t in enumerate(tokens):
            if not self._allowed(t):
                return steps, counts, {"at": i, "how": "not in mask"}
            bm.zero_()
            if fwd:
                time.sleep(fwd)
            s0 = clock()
            ok = a.advance(m, t)
            a.fill(m, bm)
            s1 = clock()
            if not ok:
                return steps, counts, {"at": i, "how": "refused on advance"}
            steps.append(s1 - s0)
            counts.append(self._count())
        return steps, counts, None

    def run(self, case: dict[str, Any], on_compiled: Any) -> dict[str, Any]:
        a = self.a
        why = a.supports(case)
        if why:
            return {"status": "n/a", "reason": why}
        a.clear_caches()
        gc.collect()
        bm = self.bitmask
        bm.zero_()
        clock = time.perf_counter_ns
        t0 = clock()
        try:
            compiled = a.compile(case)
        except CompileFailed as e:
            on_compiled(None)
            return {"status": "compile_timeout" if e.timeout else "compile_error", "error": str(e),
                    "compile_ns": clock() - t0}
        t1 = clock()
        on_compiled(t1 - t0)
        m = a.new_matcher(compiled)
        a.fill(m, bm)
        t2 = clock()
        res: dict[str, Any] = {"status": "ok", "compile_ns": t1 - t0, "ttfm_ns": t2 - t0,
                               "first_fill_ns": t2 - t1}
        a.keep_start(compiled, m)
        tokens = case.get("tokens") or []
        # first pass: the matcher made right after the compile (engine caches cold)
        steps, counts, reject = self._replay(m, tokens)
        res["steps_ns"] = steps
        res["allowed"] = counts
        res["reject"] = reject
        if tokens and reject is None and not case.get("truncated"):
            res["eos_ok"] = self._allowed(self.eos)
        res["memory"] = a.memory(compiled, m)
        if tokens:
            # warm pass: the same tokens on a fresh matcher of the same compiled grammar
            del m
            bm.zero_()
            w0 = clock()
            m2 = a.new_matcher(compiled)
            a.fill(m2, bm)
            res["warm_first_fill_ns"] = clock() - w0
            wsteps, wcounts, wreject = self._replay(m2, tokens)
            res["warm_steps_ns"] = wsteps
            # a warm mask that differs from the first pass's at the same step (an engine bug)
            res["warm_mask_differs"] = (sum(x != y for x, y in zip(counts, wcounts))
                                        + abs(len(counts) - len(wcounts)))
            res["warm_reject"] = wreject
        return res


def engine_worker(engine: str, tok_alias: str, opts: dict[str, Any], conn: Any) -> None:
    """Worker process main loop: build the adapter, warm it up, then run cases on request."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        cls = ADAPTERS[engine]
        os.environ.update(cls.worker_env(opts))
        # a missing engine is reported before the tokenizer is loaded (seconds)
        importlib.import_module(cls.module)
        tok, vocab = load_vocab(tok_alias)
        adapter = cls(tok, vocab, opts)
        rep = _Replayer(adapter, vocab, float(opts.get("forward_ms") or 0.0))
        warm = {"kind": "schema", "schema": WARMUP_SCHEMA,
                "tokens": tok.encode(respell_json(WARMUP_TEXT, cls.spelling), add_special_tokens=False)}
        rep.run(warm, lambda _ns: None)
        try:
            rep.run({"kind": "schema", "schema": WARMUP_TABLES_SCHEMA, "tokens": []}, lambda _ns: None)
        except Exception:  # noqa: BLE001 - an engine without these features is warmed by the first
            pass
        conn.send(("ready", {"version": adapter.version(), "cold": adapter.clear_caches()}))
    except ImportError as e:
        conn.send(("unavailable", f"not importable: {e}"))
        return
    except Exception as e:  # noqa: BLE001 - reported to the parent, which skips the engine
        conn.send(("unavailable", f"set-up failed: {type(e).__name__}: {str(e)[:300]}"))
        return
    while True:
        try:
            case = conn.recv()
        except EOFError:
            return
        if case is None:
            return
        try:
            res = rep.run(case, lambda ns: conn.send(("compiled", ns)))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - a crash of the engine on this case (a Rust
            # panic surfaces as pyo3's PanicException, a BaseException)
            res = {"status": "crash", "error": f"{type(e).__name__}: {str(e)[:300]}",
                   "traceback": traceback.format_exc()[-1500:]}
        conn.send(("done", res))


class EngineProc:
    """Parent-side handle of one engine's worker process (restarted after a kill)."""

    def __init__(self, engine: str, tok_alias: str, opts: dict[str, Any]) -> None:
        self.engine = engine
        self.tok_alias = tok_alias
        self.opts = opts
        self.ctx = mp.get_context("spawn")
        self.proc: Any = None
        self.conn: Any = None
        self.info: dict[str, Any] | None = None
        self.unavailable: str | None = None
        self.restarts = 0
        self.ready = False

    def start(self) -> None:
        """Spawn the worker; an engine whose module is not installed gets none (``unavailable``)."""
        module = ADAPTERS[self.engine].module
        if importlib.util.find_spec(module) is None:
            self.unavailable = f"not importable: no module named {module!r}"
            return
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=engine_worker,
                                     args=(self.engine, self.tok_alias, self.opts, child),
                                     daemon=True, name=f"masks-{self.engine}")
        self.proc.start()
        child.close()
        self.conn = parent

    def wait_ready(self, timeout: float = 600.0) -> bool:
        if self.conn is None:
            self.start()
        if self.conn is None:
            return False
        try:
            if not self.conn.poll(timeout):
                self.kill()
                self.unavailable = f"set-up took more than {timeout:.0f} s"
                return False
            kind, payload = self.conn.recv()
        except (EOFError, OSError):
            self.kill()
            self.unavailable = "worker died during set-up"
            return False
        if kind == "unavailable":
            self.kill()
            self.unavailable = payload
            return False
        self.info = payload
        self.ready = True
        return True

    def kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None
        self.ready = False

    def respawn(self) -> None:
        """Kill the worker and start its replacement now: its set-up (tokenizer, vocabulary,
        warm-up) overlaps with the other engines' turns."""
        self.kill()
        self.restarts += 1
        self.start()

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        if self.proc is not None:
            self.proc.join(10)
        self.kill()

    def run(self, case: dict[str, Any], compile_timeout: float, replay_timeout: float) -> dict[str, Any]:
        if self.conn is None:
            self.restarts += 1
            self.start()
        if not self.ready and not self.wait_ready():
            return {"status": "crash", "error": f"worker restart failed: {self.unavailable}"}
        try:
            self.conn.send(case)
            if not self.conn.poll(compile_timeout):
                self.respawn()
                return {"status": "compile_timeout", "compile_ns": int(compile_timeout * 1e9)}
            kind, payload = self.conn.recv()
            if kind == "done":  # n/a (no compile message)
                return payload
            if not self.conn.poll(replay_timeout):
                self.respawn()
                return {"status": "replay_timeout", "compile_ns": payload}
            kind, res = self.conn.recv()
            return res
        except (EOFError, OSError) as e:
            code = self.proc.exitcode if self.proc is not None else None
            self.respawn()
            return {"status": "crash", "error": f"worker died ({type(e).__name__}, exit code {code})"}
