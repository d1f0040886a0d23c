"""Shared runtime of a compiled grammar: a lazily determinised pushdown automaton.

A *stack* is an interned chain of frames ``(parent, rule, state)``; the top frame's
state is where the rule's DFA currently is, lower frames hold return states. A
*configuration* is the set of stacks the parse may be in (more than one when the
grammar is ambiguous or a call and a byte edge compete), closed under calls and
returns, and keeps only stacks whose top state has byte edges; plus a flag saying
whether the whole input may end here.

Configurations are interned to small integers, and the byte transition function
between them is tabulated in ``trans`` (int32 ``[capacity, 256]``: -2 unknown, -1 dead),
filled one row at a time on first use. Everything a matcher needs is then integer
lookups: stepping a token is one lookup per byte, and a token mask over the whole
vocabulary is a vectorised walk of the vocabulary's byte matrix through ``trans``
(:meth:`Engine.token_mask`), cached per configuration.

One Engine is shared by every matcher of a grammar; a lock guards growth of the tables.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .automaton import CompiledGrammar

__all__ = ["Engine", "VocabTable", "DEAD", "UNKNOWN"]

DEAD = -1
UNKNOWN = -2
ROOT = 0  # the empty stack


class Engine:
    """Runtime tables for one compiled grammar (thread-safe, grows lazily)."""

    def __init__(self, grammar: CompiledGrammar, *, mask_cache_bytes: int = 64 << 20) -> None:
        self.grammar = grammar
        self.rules = grammar.rules
        self._trans_py = [r.trans for r in self.rules]
        self._accept = [r.accept.tolist() for r in self.rules]
        self._has_bytes = [r.has_bytes.tolist() for r in self.rules]
        self._calls = [r.calls for r in self.rules]
        # tail return states: accepting, no byte edges, no calls -> returning is immediate
        self._tail = [[a and not hb and not cs for a, hb, cs in zip(acc, hbs, calls)]
                      for acc, hbs, calls in zip(self._accept, self._has_bytes, self._calls)]
        self.lock = threading.RLock()
        # stacks
        self.frames: list[tuple[int, int, int]] = [(-1, -1, -1)]  # id 0 = ROOT
        self.frame_ids: dict[tuple[int, int, int], int] = {}
        self._closure: dict[int, tuple[frozenset[int], bool]] = {}
        # configurations
        self.configs: list[tuple[frozenset[int], bool]] = []
        self.config_ids: dict[tuple[frozenset[int], bool], int] = {}
        self.trans = np.full((64, 256), UNKNOWN, dtype=np.int32)
        self.filled = np.zeros(64, dtype=bool)
        self.accepting = np.zeros(64, dtype=bool)
        # masks: (vocab key, config) -> packed uint32 words
        self.mask_cache: OrderedDict[tuple[Any, int], np.ndarray] = OrderedDict()
        self.mask_cache_bytes = 0
        self.mask_cache_limit = mask_cache_bytes
        self.stats = {"mask_hits": 0, "mask_misses": 0, "rows_filled": 0}
        root_stack = self._intern(ROOT, grammar.root, 0)
        stacks, acc = self.closure(root_stack)
        self.start = self._config(stacks, acc)

    # -- stacks -------------------------------------------------------------------
    def _intern(self, parent: int, rule: int, state: int) -> int:
        key = (parent, rule, state)
        sid = self.frame_ids.get(key)
        if sid is None:
            sid = len(self.frames)
            self.frames.append(key)
            self.frame_ids[key] = sid
        return sid

    def closure(self, sid: int) -> tuple[frozenset[int], bool]:
        """Stacks reachable from ``sid`` by calls and returns, restricted to those whose
        top state has byte edges; and whether the empty stack (end of input) is reachable."""
        got = self._closure.get(sid)
        if got is not None:
            return got
        out: set[int] = set()
        acc = False
        seen = {sid}
        todo = [sid]
        frames = self.frames
        while todo:
            s = todo.pop()
            if s == ROOT:
                acc = True
                continue
            parent, r, q = frames[s]
            if self._has_bytes[r][q]:
                out.add(s)
            if self._accept[r][q] and parent not in seen:
                seen.add(parent)
                todo.append(parent)
            for callee, q2 in self._calls[r][q]:
                ret = parent if self._tail[r][q2] else self._intern(parent, r, q2)
                ns = self._intern(ret, callee, 0)
                if ns not in seen:
                    seen.add(ns)
                    todo.append(ns)
        res = (frozenset(out), acc)
        self._closure[sid] = res
        return res

    # -- configurations ---------------------------------------------------------
    def _config(self, stacks: frozenset[int], acc: bool) -> int:
        if not stacks and not acc:
            return DEAD
        key = (stacks, acc)
        cid = self.config_ids.get(key)
        if cid is None:
            cid = len(self.configs)
            self.configs.append(key)
            self.config_ids[key] = cid
            if cid >= self.trans.shape[0]:
                cap = self.trans.shape[0] * 2
                t = np.full((cap, 256), UNKNOWN, dtype=np.int32)
                t[: self.trans.shape[0]] = self.trans
                f = np.zeros(cap, dtype=bool)
                f[: self.filled.shape[0]] = self.filled
                a = np.zeros(cap, dtype=bool)
                a[: self.accepting.shape[0]] = self.accepting
                self.trans, self.filled, self.accepting = t, f, a
            self.accepting[cid] = acc
        return cid

    def is_accepting(self, cid: int) -> bool:
        return cid >= 0 and bool(self.configs[cid][1])

    def fill_row(self, cid: int) -> None:
        """Compute ``trans[cid, :]`` (all 256 bytes) if not yet known."""
        if self.filled[cid]:
            return
        with self.lock:
            if self.filled[cid]:
                return
            stacks, _acc = self.configs[cid]
            per_stack: list[np.ndarray] = []
            results: list[frozenset[int] | None] = [None]
            res_ids: dict[frozenset[int], int] = {}
            accs: list[bool] = [False]
            for s in stacks:
                parent, r, q = self.frames[s]
                row = self._trans_py[r][q]
                arr = np.zeros(256, dtype=np.int32)  # 0 = nothing from this stack
                for tgt in np.unique(row[row >= 0]).tolist():
                    ns = self._intern(parent, r, tgt)
                    st, a = self.closure(ns)
                    key = st | (frozenset([-1]) if a else frozenset())
                    j = res_ids.get(key)
                    if j is None:
                        j = len(results)
                        results.append(st)
                        accs.append(a)
                        res_ids[key] = j
                    arr[row == tgt] = j
                per_stack.append(arr)
            out = np.full(256, DEAD, dtype=np.int32)
            if per_stack:
                mat = np.stack(per_stack)  # [num_stacks, 256]
                if mat.shape[0] == 1:
                    combos = {int(j): None for j in np.unique(mat[0]).tolist()}
                    for j in combos:
                        if j == 0:
                            continue
                        st = results[j]
                        assert st is not None
                        out[mat[0] == j] = self._config(st, accs[j])
                else:
                    cols, inv = np.unique(mat, axis=1, return_inverse=True)
                    inv = inv.reshape(-1)
                    for k in range(cols.shape[1]):
                        js = [int(x) for x in cols[:, k] if x != 0]
                        if not js:
                            continue
                        st_u: frozenset[int] = frozenset().union(*(results[j] for j in js))  # type: ignore[misc]
                        a_u = any(accs[j] for j in js)
                        out[inv == k] = self._config(st_u, a_u)
            self.trans[cid] = out
            self.filled[cid] = True
            self.stats["rows_filled"] += 1

    def step(self, cid: int, b: int) -> int:
        v = int(self.trans[cid, b])
        if v == UNKNOWN:
            self.fill_row(cid)
            v = int(self.trans[cid, b])
        return v

    def walk(self, cid: int, data: bytes) -> int:
        """Configuration after consuming ``data`` from ``cid`` (DEAD if rejected)."""
        trans = self.trans
        for b in data:
            if cid < 0:
                return DEAD
            v = trans[cid, b]
            if v == UNKNOWN:
                self.fill_row(cid)
                trans = self.trans
                v = trans[cid, b]
            cid = int(v)
        return cid

    def live_bytes(self, cid: int) -> np.ndarray:
        """Byte values that keep the parse alive from ``cid`` (int array)."""
        self.fill_row(cid)
        return np.nonzero(self.trans[cid] >= 0)[0]

    # -- token masks ----------------------------------------------------------------
    def token_mask(self, cid: int, vt: VocabTable) -> np.ndarray:
        """Packed allowed-token words for configuration ``cid`` (uint32 ``[vt.num_words]``).

        Bit ``j`` of word ``w`` allows token ``32*w + j``. EOS tokens are allowed exactly
        when the configuration is accepting. Cached per (vocabulary, configuration).
        """
        key = (vt.key, cid)
        cache = self.mask_cache
        m = cache.get(key)
        if m is not None:
            self.stats["mask_hits"] += 1
            cache.move_to_end(key)
            return m
        self.stats["mask_misses"] += 1
        allowed = self._allowed_tokens(cid, vt)
        bits = np.zeros(vt.num_words * 32, dtype=bool)
        bits[allowed] = True
        if self.is_accepting(cid):
            bits[vt.eos_ids] = True
        m = np.packbits(bits, bitorder="little").view(np.uint32)
        with self.lock:
            cache[key] = m
            self.mask_cache_bytes += m.nbytes
            while self.mask_cache_bytes > self.mask_cache_limit and len(cache) > 1:
                _, old = cache.popitem(last=False)
                self.mask_cache_bytes -= old.nbytes
        return m

    def _allowed_tokens(self, cid: int, vt: VocabTable) -> np.ndarray:
        """Token ids (original numbering) whose bytes can be consumed from ``cid``."""
        if cid < 0 or not self.configs[cid][0]:
            return np.zeros(0, dtype=np.int64)
        act = np.arange(vt.num_tokens, dtype=np.int64)  # indices into the length-sorted arrays
        st = np.full(vt.num_tokens, cid, dtype=np.int32)
        done: list[np.ndarray] = []
        mat = vt.matrix
        for j in range(vt.max_len):
            # tokens of length j (sorted descending by length: indices >= count_longer[j]) end here
            cut = vt.count_longer[j]
            fin = act >= cut
            if fin.any():
                done.append(act[fin])
                act = act[~fin]
                st = st[~fin]
            if act.size == 0:
                break
            b = mat[act, j]
            filled = self.filled[st]
            if not filled.all():
                for c in np.unique(st[~filled]).tolist():
                    self.fill_row(int(c))
            nxt = self.trans[st, b]
            keep = nxt >= 0
            act = act[keep]
            st = nxt[keep]
        if act.size:
            done.append(act)
        if not done:
            return np.zeros(0, dtype=np.int64)
        return vt.order[np.concatenate(done)]

    # -- introspection -------------------------------------------------------------
    def memory_bytes(self) -> int:
        """Approximate bytes held by the runtime tables and the mask cache."""
        return int(self.trans.nbytes + self.filled.nbytes + self.accepting.nbytes
                   + self.mask_cache_bytes + 64 * (len(self.frames) + len(self.configs)))


class VocabTable:
    """Vectorisation-friendly view of a vocabulary (built once per vocabulary).

    order:        int64 [N]           token ids with non-empty bytes, sorted by byte length descending
    matrix:       uint8 [N, max_len]  their bytes, zero padded
    count_longer: int64 [max_len + 1] count_longer[j] = number of tokens longer than j bytes
    eos_ids:      int64 [E]
    num_words:    ceil(vocab_size / 32)
    """

    def __init__(self, token_bytes: list[bytes | None], eos_ids: list[int], vocab_size: int,
                 key: Any) -> None:
        self.key = key
        self.vocab_size = vocab_size
        self.num_words = (vocab_size + 31) // 32
        ids = [i for i, b in enumerate(token_bytes) if b]
        lens = np.array([len(token_bytes[i]) for i in ids], dtype=np.int64)  # type: ignore[arg-type]
        perm = np.argsort(-lens, kind="stable")
        self.order = np.array(ids, dtype=np.int64)[perm]
        lens = lens[perm]
        self.max_len = int(lens[0]) if lens.size else 0
        self.num_tokens = len(ids)
        mat = np.zeros((len(ids), max(self.max_len, 1)), dtype=np.uint8)
        for row, tid in enumerate(self.order.tolist()):
            b = token_bytes[tid]
            assert b is not None
            mat[row, : len(b)] = np.frombuffer(b, dtype=np.uint8)
        self.matrix = mat
        self.count_longer = np.array([(lens > j).sum() for j in range(self.max_len + 1)],
                                     dtype=np.int64)
        self.eos_ids = np.array(sorted(set(eos_ids)), dtype=np.int64)
        self.token_bytes = token_bytes
