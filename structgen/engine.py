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

from . import trie as native

if TYPE_CHECKING:  # pragma: no cover
    from .automaton import CompiledGrammar

__all__ = ["Engine", "VocabTable", "DEAD", "UNKNOWN"]

DEAD = -1
UNKNOWN = -2
ROOT = 0  # the empty stack
_WALK_IDS_MAX = 4096  # above this many context-dependent tokens, walk the trie instead
_SPLIT_DEPTH = 6  # most stack frames a rooted split walk takes
_HORIZON_BUDGET = 4  # pair checks one horizon query may do, per unit of depth
_HORIZON_HOPS = 64  # predecessors followed back to a state whose class is known
_HORIZON_MEMO = 500_000  # memoised state pairs kept per engine


class _HorizonAbort(Exception):
    pass


class Engine:
    """Runtime tables for one compiled grammar (thread-safe, grows lazily)."""

    def __init__(self, grammar: CompiledGrammar, *, mask_cache_bytes: int = 32 << 20) -> None:
        self.grammar = grammar
        self.rules = grammar.rules
        # per rule: info(q) -> (row [256], accept, has_bytes, calls, tail), built lazily;
        # tail = accepting with no byte edges and no calls (returning is immediate)
        self._info = [r.info for r in self.rules]
        self.lock = threading.RLock()
        # stacks
        self.frames: list[tuple[int, int, int]] = [(-1, -1, -1)]  # id 0 = ROOT
        self.frame_ids: dict[tuple[int, int, int], int] = {}
        self._closure: dict[int, tuple[frozenset[int], bool]] = {}
        self._rel: dict[tuple[int, int], tuple[tuple[tuple[tuple[int, int], ...], ...], bool]] = {}
        self._srows: dict[int, tuple[np.ndarray, list[tuple[frozenset[int], bool]]]] = {}
        self._groups: dict[tuple[int, int], tuple[np.ndarray, list[int]]] = {}
        self._rtabs: dict[int, _RuleTable] = {}  # call-free rules' DFA tables (compiled walks)
        # bounded-horizon equivalence of rule states (:meth:`_horizon_rep`)
        self._hshape: dict[tuple[int, int], tuple[bytes, tuple[int, ...], tuple[tuple[int, int], ...],
                                                  bool]] = {}
        self._hstat: dict[int, list[int]] = {}  # rule -> [work, shared]; work -1 = off
        self._hrep_of: dict[tuple[int, int, int], int] = {}  # (rule, depth, state) -> representative
        self._hpred: dict[tuple[int, int], int] = {}  # (rule, state) -> a state it succeeds (bytes or call)
        self._hpair: dict[tuple[int, int, int], int] = {}  # (rule, p, q) -> depth verified equal
        self._hfail: dict[tuple[int, int, int], int] = {}  # (rule, p, q) -> depth they differ at
        # configurations
        self.configs: list[tuple[frozenset[int], bool]] = []
        self.config_ids: dict[tuple[frozenset[int], bool], int] = {}
        self.trans = np.full((64, 256), UNKNOWN, dtype=np.int32)
        self.filled = np.zeros(64, dtype=bool)
        self.accepting = np.zeros(64, dtype=bool)
        # per configuration, filled by the compiled walks: bytes that loop (4 x uint64), known?
        self.loopset = np.zeros((64, 4), dtype=np.uint64)
        self.loopok = np.zeros(64, dtype=np.uint8)
        # masks: (vocab key, config) -> packed uint32 words
        self.mask_cache = _ByteLru(mask_cache_bytes)
        self.native = native.available()  # compiled trie walks (structgen.trie) when numba is present
        self.stats = {"mask_hits": 0, "mask_misses": 0, "rows_filled": 0, "ci_hits": 0, "ci_misses": 0}
        # rooted split walks per (vocab, top frames, exact): packed words of the tokens
        # accepted whatever lies below, and the ids of the tokens that depend on it
        self.ci_cache = _ByteLru(mask_cache_bytes // 2)
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
        top state has byte edges; and whether the empty stack (end of input) is reachable.

        What happens above the parent frame depends only on the top frame's (rule, state):
        that part is computed once per (rule, state) as frame chains relative to the parent
        (:meth:`_relative_closure`) and re-rooted here; where the top frame can return, the
        parent's own closure (cached) joins."""
        got = self._closure.get(sid)
        if got is not None:
            return got
        parent, r, q = self.frames[sid]
        chains, returns = self._relative_closure(r, q)
        intern = self._intern
        out: set[int] = set()
        for chain in chains:
            s = parent
            for fr, fq in chain:
                s = intern(s, fr, fq)
            out.add(s)
        acc = False
        if returns:
            if parent == ROOT:
                acc = True
            else:
                below, acc = self.closure(parent)
                out |= below
        res = (frozenset(out), acc)
        self._closure[sid] = res
        return res

    def _relative_closure(self, r: int, q: int) -> tuple[tuple[tuple[tuple[int, int], ...], ...], bool]:
        """Closure of a frame ``(r, q)`` above an unknown parent: the frame chains (bottom
        first) of the reachable stacks whose top has byte edges, and whether the parent is
        reached (the frame can return). Left recursion is rejected at compile time, so
        chains are finite."""
        key = (r, q)
        got = self._rel.get(key)
        if got is not None:
            return got
        info = self._info
        pred = self._hpred
        start: tuple[tuple[int, int], ...] = ((r, q),)
        seen = {start}
        todo = [start]
        chains: list[tuple[tuple[int, int], ...]] = []
        returns = False
        while todo:
            st = todo.pop()
            if not st:
                returns = True
                continue
            rr, qq = st[-1]
            info_r = info[rr]
            _row, acc_q, bytes_q, calls_q, _tail = info_r(qq)
            if bytes_q:
                chains.append(st)
            below = st[:-1]
            if acc_q and below not in seen:
                seen.add(below)
                todo.append(below)
            for callee, q2 in calls_q:
                pred.setdefault((rr, q2), qq)
                ret = below if info_r(q2)[4] else below + ((rr, q2),)
                ns = ret + ((callee, 0),)
                if ns not in seen:
                    seen.add(ns)
                    todo.append(ns)
        got = (tuple(chains), returns)
        self._rel[key] = got
        return got

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
                ls = np.zeros((cap, 4), dtype=np.uint64)
                ls[: self.loopset.shape[0]] = self.loopset
                lk = np.zeros(cap, dtype=np.uint8)
                lk[: self.loopok.shape[0]] = self.loopok
                # trans last: a compiled walk reads it last, so every array it gets along with
                # a grown trans is grown too
                self.loopset, self.loopok, self.filled, self.accepting = ls, lk, f, a
                self.trans = t
            self.accepting[cid] = acc
        return cid

    def is_accepting(self, cid: int) -> bool:
        return cid >= 0 and bool(self.configs[cid][1])

    def fill_row(self, cid: int) -> None:
        """Compute ``trans[cid, :]`` (all 256 bytes) if not yet known.

        Each stack of the configuration steps on its own (:meth:`_stack_row`, cached per
        stack); a byte's successor is the union of the stacks' successors on it."""
        if self.filled[cid]:
            return
        with self.lock:
            if self.filled[cid]:
                return
            stacks, _acc = self.configs[cid]
            config = self._config
            if len(stacks) == 1:
                (sid,) = tuple(stacks)
                labels, results = self._stack_row(sid)
                lut = np.array([DEAD] + [config(st, a) for st, a in results], dtype=np.int32)
                out = lut[labels]
            elif not stacks:
                out = np.full(256, DEAD, dtype=np.int32)
            else:
                rows = [self._stack_row(sid) for sid in stacks]
                # joint label per byte: relabel (label so far, this stack's label) pairs
                joint = rows[0][0].astype(np.int64)
                for labels, results in rows[1:]:
                    _u, joint = np.unique(joint * (len(results) + 1) + labels, return_inverse=True)
                    joint = joint.reshape(-1)
                _u, first, joint = np.unique(joint, return_index=True, return_inverse=True)
                lut_l: list[int] = []
                for b in first.tolist():
                    parts = [res[lab[b] - 1] for lab, res in rows if lab[b]]
                    if not parts:
                        lut_l.append(DEAD)
                    elif len(parts) == 1:
                        lut_l.append(config(*parts[0]))
                    else:
                        st_u: frozenset[int] = frozenset().union(*(p[0] for p in parts))
                        lut_l.append(config(st_u, any(p[1] for p in parts)))
                out = np.array(lut_l, dtype=np.int32)[joint.reshape(-1)]
            self.trans[cid] = out
            self.filled[cid] = True
            self.stats["rows_filled"] += 1

    def _stack_row(self, sid: int) -> tuple[np.ndarray, list[tuple[frozenset[int], bool]]]:
        """Successors of one stack on every byte: labels (int32 [256], 0 = dead, j = the
        (stacks, accepting) closure ``results[j - 1]``)."""
        got = self._srows.get(sid)
        if got is not None:
            return got
        parent, r, q = self.frames[sid]
        key = (r, q)
        grp = self._groups.get(key)
        if grp is None:
            row = self._info[r](q)[0]
            uniq, inv = np.unique(row, return_inverse=True)
            targets = uniq.tolist()
            if targets and targets[0] < 0:  # dead bytes get label 0
                targets = targets[1:]
                labels = inv.reshape(-1).astype(np.int32)
            else:
                labels = inv.reshape(-1).astype(np.int32) + 1
            grp = (labels, targets)
            self._groups[key] = grp
            for t in targets:
                self._hpred.setdefault((r, t), q)
        labels, targets = grp
        intern, closure = self._intern, self.closure
        got = (labels, [closure(intern(parent, r, t)) for t in targets])
        self._srows[sid] = got
        return got

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

    def shortest_completion(self, cid: int, max_nodes: int = 50_000,
                            prefer: bytes = b"") -> bytes | None:
        """A shortest byte string leading from ``cid`` to an accepting configuration
        (breadth-first over configurations; bytes in ``prefer`` are tried first, then
        ascending). None if none is found within ``max_nodes`` configurations."""
        if cid < 0:
            return None
        if self.is_accepting(cid):
            return b""
        order = list(dict.fromkeys(list(prefer) + list(range(32, 127)) + list(range(256))))
        parent: dict[int, tuple[int, int]] = {cid: (-1, -1)}
        frontier = [cid]
        while frontier and len(parent) < max_nodes:
            nxt: list[int] = []
            for c in frontier:
                self.fill_row(c)
                row = self.trans[c]
                for b in order:
                    t = int(row[b])
                    if t < 0 or t in parent:
                        continue
                    parent[t] = (c, b)
                    if self.is_accepting(t):
                        out = bytearray()
                        while t != cid:
                            t, bb = parent[t]
                            out.append(bb)
                        return bytes(reversed(out))
                    nxt.append(t)
            frontier = nxt
        return None

    # -- token masks ----------------------------------------------------------------
    def token_mask(self, cid: int, vt: VocabTable) -> np.ndarray:
        """Packed allowed-token words for configuration ``cid`` (uint32 ``[vt.num_words]``).

        Bit ``j`` of word ``w`` allows token ``32*w + j``. EOS tokens are allowed exactly
        when the configuration is accepting. Cached per (vocabulary, configuration).
        """
        key = (vt.key, cid)
        m = self.mask_cache.get(key)
        if m is not None:
            self.stats["mask_hits"] += 1
            return m
        self.stats["mask_misses"] += 1
        m = self._split_mask(cid, vt)
        if m is None:
            m = np.zeros(vt.num_words, dtype=np.uint32)
            self._allowed_into(cid, vt, m)
            if self.is_accepting(cid) and vt.eos_ids.size:
                _set_bits(m, vt.eos_ids)
        with self.lock:
            self.mask_cache.put(key, m, m.nbytes)
        return m

    @property
    def mask_cache_bytes(self) -> int:
        return self.mask_cache.bytes

    # -- context-independent split (masks shared by every stack with the same top) -------
    def _split_mask(self, cid: int, vt: VocabTable) -> np.ndarray | None:
        """The packed mask of ``cid`` assembled from per-stack-top caches, or None when the
        split does not apply (a single stack at the bottom of the parse).

        A configuration is a union of stacks, so its allowed tokens are the union over its
        stacks. For a stack, walking a token from its top frames with an empty stack below
        (a *rooted* walk) tells most tokens apart without the real context: a token the
        rooted walk accepts is accepted in any context; a token it rejects without having
        passed a point where the rooted frames could return is rejected in any context.
        Only the rest depend on the frames below; those are walked from the real stack.
        The rooted results are cached per (vocabulary, top frames) and shared by every
        context (every property that calls the same string rule, every nesting depth of a
        recursive rule). One top frame is tried first; while too many tokens stay
        undecided (a rule that matches one character inside its caller's loop, say), one
        more frame is taken (:meth:`_context_independent`)."""
        if cid < 0:
            return None
        stacks = self.configs[cid][0]
        if not stacks:
            return None
        frames = self.frames
        if len(stacks) == 1:
            (only,) = tuple(stacks)
            if frames[only][0] == ROOT:
                return None
        words = np.zeros(vt.num_words, dtype=np.uint32)
        pending: list[tuple[int, np.ndarray]] = []
        for sid in stacks:
            certain, uncertain = self._context_independent(sid, vt)
            words |= certain
            if uncertain.size:
                pending.append((self._config(*self.closure(sid)), uncertain))
        for single, ids in pending:
            if ids.size > _WALK_IDS_MAX:
                self._allowed_into(single, vt, words)  # a trie walk prunes better
            elif self.native:
                native.walk_ids(self, vt.trie(), single, ids, words)
            else:
                ids = ids[((words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1) == 0]
                if ids.size:
                    ok = self._walk_ids(single, ids, vt)
                    if ok.size:
                        _set_bits(words, ok)
        if self.is_accepting(cid) and vt.eos_ids.size:
            _set_bits(words, vt.eos_ids)
        return words

    def _context_independent(self, sid: int, vt: VocabTable) -> tuple[np.ndarray, np.ndarray]:
        """(certain words, undecided ids) of stack ``sid`` from its shallowest rooted top
        (at most ``_SPLIT_DEPTH`` frames) that leaves at most ``_WALK_IDS_MAX`` tokens
        undecided; a top that is the whole stack decides every token."""
        frames = self.frames
        chain: list[tuple[int, int]] = []
        s = sid
        while True:
            parent, r, q = frames[s]
            chain.append((r, q))
            exact = parent == ROOT
            got = self._rooted_split(tuple(chain), exact, vt)
            if exact or got[1].size <= _WALK_IDS_MAX or len(chain) >= _SPLIT_DEPTH:
                return got
            s = parent

    def _rooted_split(self, chain: tuple[tuple[int, int], ...], exact: bool,
                      vt: VocabTable) -> tuple[np.ndarray, np.ndarray]:
        key = (vt.key, chain, exact)
        got = self.ci_cache.get(key)
        if got is not None:
            self.stats["ci_hits"] += 1
            return got
        # a chain whose frames behave like already-walked ones on every token (a counted
        # string's character positions far from its bounds) shares their walk
        with self.lock:
            canon = tuple((r, self._horizon_rep(r, q, vt.max_len)) for r, q in chain)
        if canon != chain:
            got = self.ci_cache.get((vt.key, canon, exact))
            if got is not None:
                self.stats["ci_hits"] += 1
                return got
            key = (vt.key, canon, exact)  # filed under the class; walked from the real frames
        self.stats["ci_misses"] += 1
        empty = np.zeros(0, dtype=np.int64)
        if self.native and len(chain) == 1 and self.rules[chain[0][0]].leaf:
            # one call-free frame: walk the rule's own DFA table, no stacks or configurations
            r, q = chain[0]
            w = np.zeros(vt.num_words, dtype=np.uint32)
            unc = self._native_walk(self._rule_table(r), q, vt, w, split=not exact)
            got = (w, unc.copy())
        else:
            with self.lock:
                s = ROOT
                for r, q in reversed(chain):
                    s = self._intern(s, r, q)
                rooted = self._config(*self.closure(s))
            if rooted < 0:
                got = (np.zeros(vt.num_words, dtype=np.uint32), empty)
            elif self.native:
                w = np.zeros(vt.num_words, dtype=np.uint32)
                unc = self._native_walk(self, rooted, vt, w, split=not exact)
                got = (w, unc.copy())
            elif exact:  # the rooted stack is the real one: nothing depends on anything else
                w = np.zeros(vt.num_words, dtype=np.uint32)
                self._allowed_into(rooted, vt, w)
                got = (w, empty)
            else:
                certain, uncertain = self._trie_walk(rooted, vt)
                bits = np.zeros(vt.num_words * 32, dtype=bool)
                bits[certain] = True
                got = (np.packbits(bits, bitorder="little").view(np.uint32), uncertain)
        with self.lock:
            self.ci_cache.put(key, got, got[0].nbytes + got[1].nbytes)
        return got

    # -- bounded-horizon equivalence of rule states ------------------------------------
    def _horizon_rep(self, r: int, q: int, depth: int) -> int:
        """A state of rule ``r`` that behaves like ``q`` on every input of at most ``depth``
        symbols (bytes or calls), or ``q`` itself.

        Such states are interchangeable for any token of at most ``depth`` bytes as long as
        every call consumes at least one byte: walking the token from either visits states
        with the same acceptance, the same byte partition and the same callees, so rooted
        split walks (and masks) from them are equal. A counted string (``maxLength``) is a
        chain of one state per character: every position at least ``depth`` characters
        away from its bounds falls in one class, so the vocabulary is walked once for them,
        not once per character.

        The class is found by going back along recorded predecessors (a state whose
        successor ``q`` is) while each consecutive pair is equivalent (transitivity), to a
        state whose representative is known, or else the furthest one, which becomes the
        representative. Pairs are compared structurally (:meth:`_heq`), memoising how deep
        each pair was verified; a pair is verified ``depth`` deeper than asked, so going
        along a chain re-verifies only every ``depth`` states (constant amortised work per
        state). A rule whose queries cost much more than the walks they share is not tried
        again."""
        stat = self._hstat.get(r)
        if stat is None:
            stat = self._hstat[r] = [0, 0]  # [work spent, walks shared]; work -1 = off
        if stat[0] < 0:
            return q
        got = self._hrep_of.get((r, depth, q))
        if got is not None:
            return got
        start = _HORIZON_BUDGET * max(depth, 1)
        budget = [start]
        path = [q]
        rep = None
        try:
            x = q
            for _ in range(_HORIZON_HOPS):
                p = self._hpred.get((r, x))
                if p is None or p in path or not self._heq(r, p, x, depth, depth, budget):
                    break
                rep = self._hrep_of.get((r, depth, p))
                if rep is not None:
                    break
                path.append(p)
                x = p
        except _HorizonAbort:
            stat[0] = -1
            return q
        if rep is None:
            rep = path[-1]
        stat[0] += start - budget[0]
        if rep != q:
            stat[1] += 1
        if stat[0] > _HORIZON_BUDGET * depth * (2 + 16 * stat[1]):
            stat[0] = -1  # costs more than it saves
        if len(self._hpair) + len(self._hfail) > _HORIZON_MEMO:
            self._hpair.clear()  # representatives stay valid; the pair memo is rebuilt
            self._hfail.clear()
        for x in path:
            self._hrep_of[(r, depth, x)] = rep
        return rep

    def _hlocal(self, r: int, q: int) -> tuple[bytes, tuple[int, ...], tuple[tuple[int, int], ...], bool]:
        """(byte labels in first-occurrence order, targets in that order (-1 dead), calls,
        accepting) of state ``q`` of rule ``r``; raises :class:`_HorizonAbort` at a call of
        a rule that may consume nothing."""
        got = self._hshape.get((r, q))
        if got is None:
            row, acc, _bytes, calls, _tail = self._info[r](q)
            for callee, _q2 in calls:
                if self._relative_closure(callee, 0)[1]:
                    raise _HorizonAbort  # a call that may consume nothing: no byte bound
            uniq, first, inv = np.unique(row, return_index=True, return_inverse=True)
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            got = (rank[inv.reshape(-1)].astype(np.uint8).tobytes(),
                   tuple(int(t) for t in uniq[order].tolist()), tuple(calls), bool(acc))
            self._hshape[(r, q)] = got
            pred = self._hpred
            for t in got[1]:
                if t >= 0:
                    pred.setdefault((r, t), q)
            for _c, t in calls:
                pred.setdefault((r, t), q)
        return got

    def _heq(self, r: int, p: int, q: int, need: int, slack: int, budget: list[int]) -> bool:
        """Whether states ``p`` and ``q`` of rule ``r`` agree on every input of at most
        ``need`` symbols. A pair not yet verified that deep is verified ``need + slack``
        deep (memoised per pair; differences memoised with the depth they show at)."""
        if p == q:
            return True
        key = (r, p, q)
        if self._hpair.get(key, -1) >= need:
            return True
        f = self._hfail.get(key)
        if f is not None and f <= need:
            return False
        need += slack
        budget[0] -= 1
        if budget[0] < 0:
            raise _HorizonAbort
        lp, tp, cp, ap = self._hlocal(r, p)
        lq, tq, cq, aq = self._hlocal(r, q)
        fail = None
        if ap != aq:
            fail = 0
        elif need == 0:
            pass
        elif lp != lq or len(cp) != len(cq) or any(a[0] != b[0] for a, b in zip(cp, cq)):
            fail = 1
        else:
            pairs = [(a, b) for a, b in zip(tp, tq) if a != b] + [(a[1], b[1]) for a, b in zip(cp, cq)
                                                                  if a[1] != b[1]]
            for a, b in pairs:
                if a < 0 or b < 0:
                    fail = 1
                    break
                if not self._heq(r, a, b, need - 1, 0, budget):
                    fail = self._hfail[(r, a, b)] + 1
                    break
        if fail is not None:
            # a valid upper bound on the depth they differ at (exact where slack is 0)
            self._hfail[key] = min(fail, self._hfail.get(key, fail))
            if slack and fail > need - slack:  # they differ only deeper than asked: ask exactly
                return self._heq(r, p, q, need - slack, 0, budget)
            return False
        self._hpair[key] = need
        return True

    def _trie_walk(self, cid: int, vt: VocabTable, split: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Level-by-level walk of the vocabulary's byte trie from ``cid``, expanding only
        children of live nodes: (tokens accepted, tokens that depend on the context). With
        ``split`` (a rooted walk, see :meth:`_split_mask`), a node reached in an accepting
        configuration is not expanded further and its descendants are context-dependent;
        without it the second array is empty."""
        nodes = np.zeros(1, dtype=np.int64)
        states = np.array([cid], dtype=np.int32)
        taint = np.zeros(0, dtype=np.int64)  # previous-level nodes whose subtrees are uncertain
        certain: list[np.ndarray] = []
        uncertain: list[np.ndarray] = []
        for lv in vt.levels:
            if taint.size:
                tc = lv.child_count[taint]
                tt = int(tc.sum())
                taint = _expand(lv.child_start[taint], tc, tt) if tt else np.zeros(0, np.int64)
                if taint.size:
                    k = lv.tok_count[taint]
                    nk = int(k.sum())
                    if nk:
                        uncertain.append(lv.tok_ids[_expand(lv.tok_start[taint], k, nk)])
            if nodes.size:
                starts = lv.child_start[nodes]
                counts = lv.child_count[nodes]
                total = int(counts.sum())
                if total:
                    child = _expand(starts, counts, total)
                    par_state = np.repeat(states, counts)
                    self._fill_rows(par_state)
                    nxt = self.trans[par_state, lv.byte[child]]
                    keep = nxt >= 0
                    live = child[keep]
                    st = nxt[keep]
                    k = lv.tok_count[live]
                    nk = int(k.sum())
                    if nk:
                        certain.append(lv.tok_ids[_expand(lv.tok_start[live], k, nk)])
                    acc = self.accepting[st] if split else None
                    if acc is not None and acc.any():
                        taint = np.concatenate([taint, live[acc]])
                        nodes, states = live[~acc], st[~acc]
                    else:
                        nodes, states = live, st
                else:
                    nodes = np.zeros(0, dtype=np.int64)
            if nodes.size == 0 and taint.size == 0:
                break
        empty = np.zeros(0, dtype=np.int64)
        return (np.concatenate(certain) if certain else empty,
                np.concatenate(uncertain) if uncertain else empty)

    def _walk_ids(self, cid: int, ids: np.ndarray, vt: VocabTable) -> np.ndarray:
        """The token ids among ``ids`` (non-empty tokens) accepted from configuration ``cid``."""
        return self._walk_flat(cid, np.searchsorted(vt.flat_ids, ids), vt)

    def _walk_flat(self, cid: int, act: np.ndarray, vt: VocabTable) -> np.ndarray:
        """Token ids of the flat vocabulary rows ``act`` whose bytes are consumed from ``cid``
        (all tokens walked in parallel, one byte column at a time)."""
        lens = vt.flat_lens
        mat = vt.matrix
        st = np.full(act.size, cid, dtype=np.int32)
        found: list[np.ndarray] = []
        for j in range(vt.max_len):
            fin = lens[act] == j
            if fin.any():
                found.append(vt.flat_ids[act[fin]])
                act = act[~fin]
                st = st[~fin]
            if act.size == 0:
                break
            self._fill_rows(st)
            nxt = self.trans[st, mat[act, j]]
            keep = nxt >= 0
            act = act[keep]
            st = nxt[keep]
        if act.size:  # tokens of the maximum length, fully consumed
            found.append(vt.flat_ids[act])
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def _fill_rows(self, states: np.ndarray) -> None:
        """Make sure the transition rows of every configuration in ``states`` are known."""
        filled = self.filled
        if not filled[states].all():
            for c in np.unique(states[~filled[states]]).tolist():
                self.fill_row(int(c))

    def _allowed_tokens(self, cid: int, vt: VocabTable) -> np.ndarray:
        """Token ids (original numbering) whose bytes can be consumed from ``cid``.

        Two vectorised strategies: where most bytes loop back to ``cid`` (string bodies and
        the like) the tokens made only of looping bytes are allowed outright and only the
        rest are walked byte by byte; elsewhere a level-by-level walk of the vocabulary's
        byte trie expands only children of live nodes, so restrictive states prune at once.
        """
        if cid < 0 or not self.configs[cid][0]:
            return np.zeros(0, dtype=np.int64)
        self.fill_row(cid)
        loops = self.trans[cid] == cid
        if int(loops.sum()) >= 32:
            return self._allowed_loop_split(cid, vt, loops)
        return self._allowed_trie(cid, vt)

    def _allowed_into(self, cid: int, vt: VocabTable, words: np.ndarray) -> None:
        """OR the tokens allowed from ``cid`` (EOS aside) into packed ``words``: the compiled
        walks when available, else :meth:`_allowed_tokens`."""
        if not self.native:
            ok = self._allowed_tokens(cid, vt)
            if ok.size:
                _set_bits(words, ok)
        elif cid >= 0 and self.configs[cid][0]:
            self._native_walk(self, cid, vt, words, split=False)

    @staticmethod
    def _native_walk(src: Any, start: int, vt: VocabTable, words: np.ndarray, split: bool) -> np.ndarray:
        """Compiled walk from state ``start`` of ``src`` (this engine's configurations or a
        :class:`_RuleTable`): where at least 32 bytes loop on the start, the tokens made of
        looping bytes are taken at once and the rest walked one by one; elsewhere the trie
        is walked. Returns the undecided ids of a ``split`` walk."""
        src.fill_row(start)
        loops = src.trans[start] == start
        if int(loops.sum()) >= 32:
            return native.walk_loop_split(src, vt.trie(), start, loops, words, split)
        return native.walk_trie(src, vt.trie(), start, split, words)

    def _rule_table(self, r: int) -> _RuleTable:
        tab = self._rtabs.get(r)
        if tab is None:
            with self.lock:
                tab = self._rtabs.get(r)
                if tab is None:
                    tab = _RuleTable(self._info[r], self.lock)
                    self._rtabs[r] = tab
        return tab

    def _allowed_loop_split(self, cid: int, vt: VocabTable, loops: np.ndarray) -> np.ndarray:
        words = np.packbits(~loops, bitorder="little").view(np.uint64)  # [4] non-loop bytes
        impure = (vt.byte_bits & words).any(axis=1)  # [N] token has a non-looping byte
        return np.concatenate([vt.flat_ids[~impure],
                               self._walk_flat(cid, np.nonzero(impure)[0], vt)])

    def _allowed_trie(self, cid: int, vt: VocabTable) -> np.ndarray:
        return self._trie_walk(cid, vt, split=False)[0]

    # -- introspection -------------------------------------------------------------
    def memory_bytes(self) -> int:
        """Approximate bytes held by the runtime tables and the mask cache."""
        tables = (self.trans, self.filled, self.accepting, self.loopset, self.loopok)
        rule_tables = sum(t.trans.nbytes + t.loopset.nbytes for t in self._rtabs.values())
        return int(sum(a.nbytes for a in tables) + rule_tables + self.mask_cache.bytes + self.ci_cache.bytes
                   + 64 * (len(self.frames) + len(self.configs)))


class _ByteLru:
    """An LRU map bounded by the bytes of its values (the caller states each value's size;
    the newest entry always stays). Callers hold the engine lock around :meth:`put`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._d: OrderedDict[Any, tuple[Any, int]] = OrderedDict()

    def get(self, key: Any) -> Any:
        hit = self._d.get(key)
        if hit is None:
            return None
        self._d.move_to_end(key)
        return hit[0]

    def put(self, key: Any, value: Any, nbytes: int) -> None:
        old = self._d.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._d[key] = (value, nbytes)
        self.bytes += nbytes
        while self.bytes > self.limit and len(self._d) > 1:
            _, (_v, n) = self._d.popitem(last=False)
            self.bytes -= n

    def __len__(self) -> int:
        return len(self._d)

    def __iter__(self) -> Any:
        return iter(self._d)


class _RuleTable:
    """The byte transitions of one call-free rule's DFA, tabulated for the compiled walks
    (rows filled on first use). It has the attributes the walks read from an Engine:
    ``trans`` (int32 [cap, 256]: -2 unknown, -1 dead), ``accepting`` (the rule may return),
    ``loopset``/``loopok`` and :meth:`fill_row`."""

    def __init__(self, info: Any, lock: Any) -> None:
        self._info = info
        self.lock = lock
        self.filled = np.zeros(0, dtype=bool)
        self.accepting = np.zeros(0, dtype=bool)
        self.loopset = np.zeros((0, 4), dtype=np.uint64)
        self.loopok = np.zeros(0, dtype=np.uint8)
        self.trans = np.full((0, 256), UNKNOWN, dtype=np.int32)
        self._grow(16)

    def _grow(self, need: int) -> None:
        old = self.trans.shape[0]
        if need <= old:
            return
        cap = max(need, 2 * old)

        def ext(a: np.ndarray, fill: Any) -> np.ndarray:
            b = np.full((cap,) + a.shape[1:], fill, dtype=a.dtype)
            b[:old] = a
            return b

        self.filled, self.accepting = ext(self.filled, False), ext(self.accepting, False)
        self.loopset, self.loopok = ext(self.loopset, 0), ext(self.loopok, 0)
        self.trans = ext(self.trans, UNKNOWN)  # last (see Engine._config)

    def fill_row(self, q: int) -> None:
        if q < self.filled.shape[0] and self.filled[q]:
            return
        with self.lock:
            if q < self.filled.shape[0] and self.filled[q]:
                return
            info = self._info
            row, acc = info(q)[:2]
            targets = np.unique(row[row >= 0]).tolist()
            self._grow(max([q] + targets) + 1)
            self.accepting[q] = acc
            for t in targets:
                self.accepting[t] = info(t)[1]
            self.trans[q] = row
            self.filled[q] = True


def _set_bits(words: np.ndarray, ids: np.ndarray) -> None:
    np.bitwise_or.at(words, ids >> 5, (np.uint32(1) << (ids & 31).astype(np.uint32)))


def _expand(starts: np.ndarray, counts: np.ndarray, total: int) -> np.ndarray:
    """Concatenate the integer ranges ``[starts[i], starts[i] + counts[i])``."""
    ends = np.cumsum(counts)
    offs = np.repeat(starts - (ends - counts), counts)
    return offs + np.arange(total, dtype=np.int64)


class _Level:
    """Trie nodes at one depth, sorted by (parent, byte).

    byte:        uint8 [n]        the byte on the edge into the node
    child_start: int64 [n_prev]   first child (at this level) of each previous-level node
    child_count: int64 [n_prev]
    tok_start / tok_count: int64 [n]   range in ``tok_ids`` of tokens ending at the node
    tok_ids:     int64 [k]        token ids (original numbering) ending at this level
    """

    __slots__ = ("byte", "child_start", "child_count", "tok_start", "tok_count", "tok_ids")


class VocabTable:
    """Vectorisation-friendly view of a vocabulary (built once per vocabulary).

    levels:    the byte trie of all tokens with non-empty bytes, one :class:`_Level` per depth
    eos_ids:   int64 [E]
    num_words: ceil(vocab_size / 32)
    """

    def __init__(self, token_bytes: list[bytes | None], eos_ids: list[int], vocab_size: int,
                 key: Any, flat_view: tuple[Any, Any, Any] | None = None) -> None:
        self.key = key
        self.vocab_size = vocab_size
        self.num_words = (vocab_size + 31) // 32
        self.token_bytes = token_bytes
        self.eos_ids = np.array(sorted(set(eos_ids)), dtype=np.int64)
        if flat_view is not None:
            # the vocabulary's own lazily built arrays: lengths [V], offsets [V+1], bytes [total]
            all_lens, all_offs, flat = flat_view
            ids = np.nonzero(np.asarray(all_lens) > 0)[0].astype(np.int64)
            lens = np.asarray(all_lens, dtype=np.int64)[ids]
            offs = np.asarray(all_offs, dtype=np.int64)[ids]
            flat = np.asarray(flat, dtype=np.uint8)
        else:
            ids = np.array([i for i, b in enumerate(token_bytes) if b], dtype=np.int64)
            blobs = [token_bytes[i] for i in ids.tolist()]
            lens = np.array([len(b) for b in blobs], dtype=np.int64)  # type: ignore[arg-type]
            flat = np.frombuffer(b"".join(blobs), dtype=np.uint8)  # type: ignore[arg-type]
            offs = (np.concatenate([[0], np.cumsum(lens)[:-1]]) if lens.size
                    else np.zeros(0, np.int64))
        self.num_tokens = int(ids.size)
        self.max_len = int(lens.max()) if lens.size else 0
        node = np.zeros(self.num_tokens, dtype=np.int64)  # node of each token's prefix so far
        n_prev = 1
        active = np.arange(self.num_tokens, dtype=np.int64)
        self.levels: list[_Level] = []
        # flat per-token arrays (ids ascending): lengths, zero-padded byte matrix, byte bitmaps
        self.flat_ids = ids
        self.flat_lens = lens
        width = max(self.max_len, 1)
        mat = np.zeros((self.num_tokens, width), dtype=np.uint8)
        col = np.arange(flat.size, dtype=np.int64) - np.repeat(offs, lens)
        row = np.repeat(np.arange(self.num_tokens, dtype=np.int64), lens)
        mat[row, col] = flat
        self.matrix = mat
        bits = np.zeros((self.num_tokens, 256), dtype=bool)
        bits[row, flat] = True
        self.byte_bits = np.packbits(bits, axis=1, bitorder="little").view(np.uint64)  # [N, 4]
        for j in range(self.max_len):
            active = active[lens[active] > j]
            if active.size == 0:
                break
            keys = node[active] * 256 + flat[offs[active] + j]
            uniq, inv = np.unique(keys, return_inverse=True)
            lv = _Level()
            parent = uniq // 256
            lv.byte = (uniq % 256).astype(np.uint8)
            lv.child_start = np.searchsorted(parent, np.arange(n_prev)).astype(np.int64)
            lv.child_count = (np.searchsorted(parent, np.arange(n_prev), side="right")
                              - lv.child_start).astype(np.int64)
            node[active] = inv.reshape(-1)
            ending = active[lens[active] == j + 1]
            end_nodes = node[ending]
            order = np.argsort(end_nodes, kind="stable")
            lv.tok_ids = ids[ending[order]]
            sorted_nodes = end_nodes[order]
            lv.tok_start = np.searchsorted(sorted_nodes, np.arange(uniq.size)).astype(np.int64)
            lv.tok_count = (np.searchsorted(sorted_nodes, np.arange(uniq.size), side="right")
                            - lv.tok_start).astype(np.int64)
            self.levels.append(lv)
            n_prev = uniq.size
        self._trie: native.Trie | None = None

    def trie(self) -> native.Trie:
        """The depth-first trie for the compiled walks (built on first use, shared per vocabulary)."""
        if self._trie is None:
            self._trie = native.trie_for(self.key, self.token_bytes, self.vocab_size)
        return self._trie
