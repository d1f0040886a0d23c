"""Token masks of a compiled grammar: walks of a vocabulary's byte trie through the runtime.

The byte-level runtime (:mod:`structgen.grammar.runtime`) steps bytes between
configurations; a token mask over the whole vocabulary is a walk of the vocabulary's byte
trie through its transition table ``trans`` (:meth:`Engine.token_mask`), cached per
(vocabulary, configuration). The walks run in compiled code (:mod:`structgen.masks.trie`
drives :mod:`structgen.masks._walk_kernels`) when numba is available, else as numpy walks
one trie level at a time. Where a configuration holds several stacks, its mask is assembled
from per-stack-top walks shared by every context (:meth:`Engine._split_mask`).

One :class:`Engine` per compiled grammar (:func:`engine_for`), kept in the runtime's
``masks`` slot and shared by every matcher of the grammar; it shares the runtime's lock.
Memory is bounded: the token-mask caches are byte-bounded LRUs (``mask_cache_bytes``,
default :data:`DEFAULT_MASK_CACHE_BYTES`, plus half that for split walks), emptied with the
runtime's tables when those are flushed (the runtime's ``on_flush`` hook), since they are
keyed by configuration ids. :func:`set_memory_budget` changes the defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from structgen.grammar import runtime as rt_mod
from structgen.grammar.runtime import DEAD, ROOT, STALE, UNKNOWN, Runtime
from structgen.masks import trie as native
from structgen.masks.budget import BudgetTable
from structgen.masks.buffers import set_bits
from structgen.masks.counted_masks import CountedMasks
from structgen.masks.horizon import HorizonClasses
from structgen.masks.lru import ByteLru
from structgen.masks.vocab_table import VocabTable

if TYPE_CHECKING:  # pragma: no cover
    from structgen.grammar.compiled import CompiledGrammar

__all__ = ["Engine", "VocabTable", "FreeState", "engine_for", "DEAD", "UNKNOWN", "STALE", "set_memory_budget",
           "DEFAULT_MASK_CACHE_BYTES", "FREE_MAX_FORBIDDEN"]

#: Per-grammar budget of the token-mask cache (bytes; ``STRUCTGEN_MASK_CACHE_BYTES``); the
#: split-walk cache gets half as much again.
DEFAULT_MASK_CACHE_BYTES = rt_mod.env_bytes("STRUCTGEN_MASK_CACHE_BYTES", 32 << 20)


def set_memory_budget(*, table_bytes: int | None = None, mask_cache_bytes: int | None = None,
                      process_table_bytes: int | None = None) -> None:
    """Change the memory budgets (bytes) of grammars whose runtime or mask engine is created
    from now on (``table_bytes``, ``mask_cache_bytes``) and of the whole process
    (``process_table_bytes``, effective at once). An existing runtime's budget is its
    attribute ``table_budget``; an existing mask engine's, ``mask_cache.limit``. Raises
    :class:`~structgen.errors.ConfigError` for a value that is not an integer >= 0 (nothing
    is changed then)."""
    global DEFAULT_MASK_CACHE_BYTES
    rt_mod.check_budget(table_bytes=table_bytes, mask_cache_bytes=mask_cache_bytes,
                        process_table_bytes=process_table_bytes)
    rt_mod.set_table_budget(table_bytes=table_bytes, process_table_bytes=process_table_bytes)
    if mask_cache_bytes is not None:
        DEFAULT_MASK_CACHE_BYTES = mask_cache_bytes


def engine_for(grammar: CompiledGrammar) -> Engine:
    """The token-mask engine of ``grammar`` (built on first use, kept in its runtime's
    ``masks`` slot and shared by every matcher of the grammar)."""
    rt = grammar.engine
    eng = rt.masks
    if isinstance(eng, Engine):
        return eng
    with rt.lock:
        eng = rt.masks
        if not isinstance(eng, Engine):
            eng = rt.masks = Engine(rt)
    return eng


#: A configuration whose mask forbids at most this many tokens is *free* (free text between
#: triggers, say): its forbidden ids are kept as a list (:class:`FreeState`) so that a caller
#: can apply them to the logits instead of a whole-vocabulary mask.
FREE_MAX_FORBIDDEN = 4096
_FREE_MAX_JUMPS = 8192  # most tokens of a free configuration that do not go to its usual target
_FREE_STATES_MAX = 4096  # configurations classified per vocabulary (oldest dropped first)
#: visits of a free configuration (its mask asked for) before its token steps are worked out
FREE_JUMPS_AFTER = 4
_WALK_IDS_MAX = 4096  # above this many context-dependent tokens, walk the trie instead
_SPLIT_DEPTH = 6  # most stack frames a rooted split walk takes
_SPLIT_COLD_MAX = 1  # stacks of a configuration whose split walks may be missing from the cache
_PENDING_DEPTH = 64  # deepest stack whose context-dependent tokens are filed under its class
_COUNTED_MASKS = True  # counted-repetition positions from item runs (structgen.masks.counted_masks)

#: The split-walk cache's key: (vocabulary key, the top frames' rule states, top first, whether
#: they are the whole stack) ...
_SplitKey = tuple[str, tuple[int, ...], bool]
#: ... and its value: the packed words of the tokens accepted whatever lies below, and the ids
#: of the tokens that depend on it
_Split = tuple[NDArray[np.uint32], NDArray[np.int64]]


class Engine:
    """Token masks over one grammar's :class:`~structgen.grammar.runtime.Runtime` (thread-safe;
    the caches are guarded by the runtime's lock). Build it with :func:`engine_for`."""

    def __init__(self, runtime: Runtime, *, mask_cache_bytes: int | None = None) -> None:
        self.runtime = runtime
        self.rules = runtime.rules
        self.lock = runtime.lock
        self.native = native.available()  # compiled trie walks (structgen.masks.trie) when numba is present
        if mask_cache_bytes is None:
            mask_cache_bytes = DEFAULT_MASK_CACHE_BYTES
        # bounded-horizon equivalence of rule states: which walks states may share
        self.horizon = HorizonClasses(runtime)
        self.counted = CountedMasks(runtime)  # positions of counted repetitions (maxLength strings)
        # masks: (vocab key, config) -> packed uint32 words
        self.mask_cache: ByteLru[tuple[str, int], NDArray[np.uint32]] = ByteLru(mask_cache_bytes)
        self.stats = {"mask_hits": 0, "mask_misses": 0, "ci_hits": 0, "ci_misses": 0}
        # rooted split walks per (vocab, top frames, exact): packed words of the tokens
        # accepted whatever lies below, and the ids of the tokens that depend on it
        self.ci_cache: ByteLru[_SplitKey, _Split] = ByteLru(mask_cache_bytes // 2)
        # (vocab, whole stack with counted positions by class) -> packed words of its
        # context-dependent tokens that the stack accepts (:meth:`_pending_key`)
        self.pending_cache: ByteLru[tuple[str, tuple[int, ...]], NDArray[np.uint32]] = \
            ByteLru(mask_cache_bytes // 4)
        self._budget: dict[str, BudgetTable] = {}  # vocab key -> its budget table
        # vocab key -> {configuration -> FreeState}; emptied in place on a flush, so that
        # matchers may hold the inner dict
        self._free: dict[str, dict[int, FreeState]] = {}
        self._steps: dict[str, dict[int, FreeState]] = {}  # the same, only those with jumps
        self._free_bytes: dict[str, int] = {}  # vocab key -> bytes its free states hold
        self._free_limit = mask_cache_bytes // 2
        runtime.on_flush.append(self._forget)

    def _forget(self) -> None:
        """Drop everything keyed by table ids (the runtime flushed its tables)."""
        self.mask_cache.clear()
        self.ci_cache.clear()
        self.pending_cache.clear()
        for table in self._budget.values():
            table.forget()
        for states in (*self._free.values(), *self._steps.values()):
            states.clear()
        self._free_bytes.clear()
        self.horizon.forget()
        self.counted.forget()

    # -- token masks ----------------------------------------------------------------
    def token_mask(self, cid: int, vt: VocabTable) -> NDArray[np.uint32]:
        """Packed allowed-token words for configuration ``cid`` (uint32 ``[vt.num_words]``).

        Bit ``j`` of word ``w`` allows token ``32*w + j``. EOS tokens are allowed exactly
        when the configuration is accepting. Cached per (vocabulary, configuration).
        """
        m = self.token_mask_at(cid, vt, None)
        assert m is not None
        return m

    def token_mask_at(self, cid: int, vt: VocabTable, epoch: int | None) -> NDArray[np.uint32] | None:
        """:meth:`token_mask` for a caller that read ``cid`` in ``epoch`` without the lock:
        None, with nothing computed or cached, when the tables have been flushed since (``cid``
        may then name another configuration, or none, and a mask made for it would be cached
        under an id of the new epoch)."""
        key = (vt.key, cid)
        m = self.mask_cache.get(key)
        if m is not None:
            self.stats["mask_hits"] += 1
            return m
        self.stats["mask_misses"] += 1
        with self.lock:
            if epoch is not None and self.runtime.epoch != epoch:
                return None
            self.runtime.tab.prepare_growth()  # a new configuration: the tables may fill up soon
            if self.runtime.over_budget():
                (cid,) = self.runtime.flush((cid,))
                key = (vt.key, cid)
            m = self.counted.mask(cid, vt) if self.native and _COUNTED_MASKS else None
            if m is None:
                m = self._split_mask(cid, vt)
            if m is None:
                m = np.zeros(vt.num_words, dtype=np.uint32)
                self._allowed_into(cid, vt, m)
                if self.runtime.is_accepting(cid) and vt.eos_ids.size:
                    set_bits(m, vt.eos_ids)
            self.mask_cache.put(key, m, m.nbytes)
        return m

    # -- free configurations (nearly every token allowed) ------------------------------
    def free_states(self, vt: VocabTable) -> dict[int, FreeState]:
        """The :class:`FreeState` of each configuration examined so far for vocabulary ``vt``
        (filled by :meth:`free_state`; ids of the current epoch, emptied in place when the
        tables are flushed)."""
        got = self._free.get(vt.key)
        if got is None:
            with self.lock:
                got = self._free.setdefault(vt.key, {})
        return got

    def step_shortcuts(self, vt: VocabTable) -> dict[int, FreeState]:
        """The free states of :meth:`free_states` that have their token steps (``jumps``):
        what a matcher's step looks up (one lookup for any other configuration)."""
        got = self._steps.get(vt.key)
        if got is None:
            with self.lock:
                got = self._steps.setdefault(vt.key, {})
        return got

    def free_state(self, cid: int, vt: VocabTable, words: NDArray[np.uint32]) -> FreeState:
        """The :class:`FreeState` of configuration ``cid`` (``words``: its token mask, from
        :meth:`token_mask` in the current epoch), computed once and kept; hold the lock.
        A configuration whose mask forbids at most :data:`FREE_MAX_FORBIDDEN` tokens gets
        its forbidden ids (and later, when visited again, its steps: :meth:`add_jumps`)."""
        states = self.free_states(vt)
        got = states.get(cid)
        if got is not None:
            return got
        # (no bits are set past the vocabulary)
        if vt.vocab_size - int(np.bitwise_count(words).sum()) > FREE_MAX_FORBIDDEN:
            got = _NOT_FREE
        else:
            bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: vt.vocab_size]
            forbidden = np.flatnonzero(bits == 0)
            forbidden.flags.writeable = False
            got = FreeState(forbidden, -1, None, 0 if self.native else -1)
        total = self._free_bytes.get(vt.key, 0) + got.nbytes
        steps = self.step_shortcuts(vt)
        while states and (total > self._free_limit or len(states) >= _FREE_STATES_MAX):
            old = next(iter(states))  # the oldest first
            total -= states.pop(old).nbytes
            steps.pop(old, None)
        states[cid] = got
        self._free_bytes[vt.key] = total
        return got

    def add_jumps(self, cid: int, vt: VocabTable, free: FreeState) -> None:
        """Give ``free`` (the free state of ``cid``, current epoch) its token steps, if they
        are few: a usual target plus the tokens that go elsewhere, from one walk of the
        vocabulary recording where each token ends (:func:`structgen.masks.trie.walk_ends`),
        so that a step from ``cid`` is a dictionary lookup instead of a walk of the token's
        bytes. Done once (``free.visits`` set to -1); hold the lock."""
        if free.visits < 0:
            return
        free.visits = -1
        usual, jumps = self._jumps(cid, vt)
        if jumps is not None:
            grown = 100 * len(jumps)
            free.nbytes += grown
            self._free_bytes[vt.key] = self._free_bytes.get(vt.key, 0) + grown
            free.usual = usual
            free.jumps = jumps
            if self.free_states(vt).get(cid) is free:
                self.step_shortcuts(vt)[cid] = free

    def _jumps(self, cid: int, vt: VocabTable) -> tuple[int, dict[int, int] | None]:
        """(the configuration most tokens lead to from ``cid``, every other token's target:
        -1 where rejected) or (-1, None) when those are too many."""
        if cid < 0 or not vt.num_tokens:
            return -1, None
        trie = vt.trie()
        ends = native.walk_ends(self.runtime, trie, cid)  # per trie slot
        targets, counts = np.unique(ends, return_counts=True)
        usual = int(targets[int(np.argmax(counts))])
        if usual < 0:
            return -1, None
        odd = np.flatnonzero(ends != usual)
        # tokens without bytes (specials, padding) are not in the trie: rejected unless EOS,
        # which the matcher decides before any walk
        no_bytes = np.ones(vt.vocab_size, dtype=bool)
        no_bytes[trie.slot_ids] = False
        no_bytes[vt.eos_ids] = False
        empty = np.flatnonzero(no_bytes)
        if odd.size + empty.size > _FREE_MAX_JUMPS:
            return -1, None
        jumps = dict(zip(trie.slot_ids[odd].tolist(), ends[odd].tolist()))
        jumps.update(dict.fromkeys(empty.tolist(), -1))
        return usual, jumps

    def budget_table(self, vt: VocabTable) -> BudgetTable:
        """The :class:`~structgen.masks.budget.BudgetTable` of this grammar and vocabulary ``vt``
        (built on first use)."""
        got = self._budget.get(vt.key)
        if got is None:
            with self.lock:
                got = self._budget.get(vt.key)
                if got is None:
                    got = self._budget[vt.key] = BudgetTable(self, vt)
        return got

    def cached_mask(self, cid: int, vt: VocabTable) -> NDArray[np.uint32] | None:
        """The mask of configuration ``cid`` if cached (counted as a hit), else None."""
        m = self.mask_cache.get((vt.key, cid))
        if m is not None:
            self.stats["mask_hits"] += 1
        return m

    @property
    def mask_cache_bytes(self) -> int:
        """Bytes held by the token-mask cache."""
        return self.mask_cache.bytes

    # -- context-independent split (masks shared by every stack with the same top) -------
    def _split_mask(self, cid: int, vt: VocabTable) -> NDArray[np.uint32] | None:
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
        stacks = self.runtime.stacks(cid)
        if not stacks:
            return None
        if len(stacks) == 1 and int(self.runtime.tab.frames[stacks[0], 0]) == ROOT:
            return None
        if len(stacks) > _SPLIT_COLD_MAX and self.native:
            cold = 0
            for sid in stacks:
                # a stack topped by a counted rule's shared class pays its walk once for
                # every position of the class (each character of a long maxLength string)
                if (self._context_independent(sid, vt, peek=True) is None
                        and not self.horizon.shared_count(int(self.runtime.tab.frames[sid, 1]), vt.max_len)):
                    cold += 1
                    if cold > _SPLIT_COLD_MAX:
                        # one walk of the whole configuration visits the trie once, where the
                        # split would walk it once per stack: faster unless most are cached
                        return None
        words = np.zeros(vt.num_words, dtype=np.uint32)
        pending: list[tuple[int, NDArray[np.int64]]] = []
        for sid in stacks:
            got = self._context_independent(sid, vt)
            assert got is not None
            certain, uncertain = got
            words |= certain
            if uncertain.size:
                pending.append((sid, uncertain))
        for sid, ids in pending:
            single = self.runtime.closure_config(sid)
            key = self._pending_key(sid, vt)
            if key is None:
                self._walk_pending(single, ids, vt, words)
                continue
            # the stack's class (every position of a long counted string over the same
            # frames) has one answer for these tokens: walked once, from the real stack
            got_words = self.pending_cache.get(key)
            if got_words is None:
                got_words = np.zeros(vt.num_words, dtype=np.uint32)
                self._walk_pending(single, ids, vt, got_words)
                self.pending_cache.put(key, got_words, got_words.nbytes)
            words |= got_words
        if self.runtime.is_accepting(cid) and vt.eos_ids.size:
            set_bits(words, vt.eos_ids)
        return words

    def _walk_pending(self, single: int, ids: NDArray[np.int64], vt: VocabTable,
                      words: NDArray[np.uint32]) -> None:
        """OR into ``words`` the tokens among ``ids`` that configuration ``single`` accepts."""
        if ids.size > _WALK_IDS_MAX:
            self._allowed_into(single, vt, words)  # a trie walk prunes better
        elif self.native:
            native.walk_ids(self.runtime, vt.trie(), single, False, ids, words)
        else:
            ids = ids[((words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1) == 0]
            if ids.size:
                ok = self._walk_ids(single, ids, vt)
                if ok.size:
                    set_bits(words, ok)

    def _pending_key(self, sid: int, vt: VocabTable) -> tuple[str, tuple[int, ...]] | None:
        """The key under which the context-dependent tokens of stack ``sid`` are filed: its
        whole chain of frames with counted-rule positions replaced by their class
        (:meth:`~structgen.masks.horizon.HorizonClasses.counted_rep`), which behaves alike on
        every token; None where no frame is such a position (nothing to share) or the stack
        is deeper than ``_PENDING_DEPTH``."""
        fr = self.runtime.tab.frames
        chain: list[int] = []
        shared = False
        s = sid
        while s != ROOT:
            if len(chain) >= _PENDING_DEPTH:
                return None
            g = int(fr[s, 1])
            if self.horizon.shared_count(g, vt.max_len):
                shared = True
                g = self.horizon.counted_rep(g, vt.max_len)
            chain.append(g)
            s = int(fr[s, 0])
        return (vt.key, tuple(chain)) if shared else None

    def _context_independent(self, sid: int, vt: VocabTable,
                             peek: bool = False) -> _Split | None:
        """(certain words, undecided ids) of stack ``sid`` from its shallowest rooted top
        (at most ``_SPLIT_DEPTH`` frames) that leaves at most ``_WALK_IDS_MAX`` tokens
        undecided; a top that is the whole stack decides every token. With ``peek``, only
        what the cache holds (no walk, no horizon query): None where a walk is missing."""
        chain: list[int] = []  # rule states, top first
        fr = self.runtime.tab.frames
        s = sid
        while True:
            parent, g = int(fr[s, 0]), int(fr[s, 1])
            chain.append(g)
            exact = parent == ROOT
            if peek:
                got = self._split_peek(tuple(chain), exact, vt)
                if got is None:
                    return None
            else:
                got = self._rooted_split(tuple(chain), exact, vt)
            if exact or got[1].size <= _WALK_IDS_MAX or len(chain) >= _SPLIT_DEPTH:
                return got
            s = parent

    def _split_peek(self, chain: tuple[int, ...], exact: bool,
                    vt: VocabTable) -> _Split | None:
        """The cached rooted walk of ``chain`` (filed under the chain itself or under its
        known horizon classes), or None; the LRU order is left as it is."""
        got = self.ci_cache.peek((vt.key, chain, exact))
        if got is None:
            canon = tuple(self.horizon.known_rep(g, vt.max_len) for g in chain)
            got = self.ci_cache.peek((vt.key, canon, exact))
        return got

    def _rooted_split(self, chain: tuple[int, ...], exact: bool,
                      vt: VocabTable) -> _Split:
        """The rooted walk of the top frames ``chain`` (rule states, top first): certain
        words and undecided ids (cached)."""
        key = (vt.key, chain, exact)
        got = self.ci_cache.get(key)
        if got is not None:
            self.stats["ci_hits"] += 1
            return got
        # a chain whose frames behave like already-walked ones on every token (a counted
        # string's character positions far from its bounds) shares their walk
        canon = tuple(self.horizon.rep(g, vt.max_len) for g in chain)
        if canon != chain:
            got = self.ci_cache.get((vt.key, canon, exact))
            if got is not None:
                self.stats["ci_hits"] += 1
                return got
            key = (vt.key, canon, exact)  # filed under the class; walked from the real frames
        self.stats["ci_misses"] += 1
        empty = np.zeros(0, dtype=np.int64)
        if self.native and len(chain) == 1 and self.rules[self.runtime.rule_of(chain[0])].leaf:
            # one call-free frame: walk the rule's own DFA states, no stacks or configurations
            w = np.zeros(vt.num_words, dtype=np.uint32)
            unc = self._native_walk(True, chain[0], vt, w, split=not exact)
            got = (w, unc.copy())
        else:
            s = self.runtime.stack_of_chain(np.array(chain[::-1], dtype=np.int64))
            rooted = self.runtime.closure_config(s)
            if rooted < 0:
                got = (np.zeros(vt.num_words, dtype=np.uint32), empty)
            elif self.native:
                w = np.zeros(vt.num_words, dtype=np.uint32)
                unc = self._native_walk(False, rooted, vt, w, split=not exact)
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
        self.ci_cache.put(key, got, got[0].nbytes + got[1].nbytes)
        return got

    def _trie_walk(self, cid: int, vt: VocabTable,
                   split: bool = True) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Level-by-level walk of the vocabulary's byte trie from ``cid``, expanding only
        children of live nodes: (tokens accepted, tokens that depend on the context). With
        ``split`` (a rooted walk, see :meth:`_split_mask`), a node reached in an accepting
        configuration is not expanded further and its descendants are context-dependent;
        without it the second array is empty."""
        nodes = np.zeros(1, dtype=np.int64)
        states = np.array([cid], dtype=np.int32)
        taint = np.zeros(0, dtype=np.int64)  # previous-level nodes whose subtrees are uncertain
        certain: list[NDArray[np.int64]] = []
        uncertain: list[NDArray[np.int64]] = []
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
                    nxt = self.runtime.trans[par_state, lv.byte[child]]
                    keep = nxt >= 0
                    live = child[keep]
                    st = nxt[keep]
                    k = lv.tok_count[live]
                    nk = int(k.sum())
                    if nk:
                        certain.append(lv.tok_ids[_expand(lv.tok_start[live], k, nk)])
                    acc = self.runtime.accepting[st] if split else None
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

    def _walk_ids(self, cid: int, ids: NDArray[np.int64], vt: VocabTable) -> NDArray[np.int64]:
        """The token ids among ``ids`` (non-empty tokens) accepted from configuration ``cid``."""
        return self._walk_flat(cid, np.searchsorted(vt.flat_ids, ids), vt)

    def _walk_flat(self, cid: int, act: NDArray[np.int64], vt: VocabTable) -> NDArray[np.int64]:
        """Token ids of the flat vocabulary rows ``act`` whose bytes are consumed from ``cid``
        (all tokens walked in parallel, one byte column at a time)."""
        lens = vt.flat_lens
        mat = vt.matrix
        st = np.full(act.size, cid, dtype=np.int32)
        found: list[NDArray[np.int64]] = []
        for j in range(vt.max_len):
            fin = lens[act] == j
            if fin.any():
                found.append(vt.flat_ids[act[fin]])
                act = act[~fin]
                st = st[~fin]
            if act.size == 0:
                break
            self._fill_rows(st)
            nxt = self.runtime.trans[st, mat[act, j]]
            keep = nxt >= 0
            act = act[keep]
            st = nxt[keep]
        if act.size:  # tokens of the maximum length, fully consumed
            found.append(vt.flat_ids[act])
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def _fill_rows(self, states: NDArray[np.int32]) -> None:
        """Make sure the transition rows of every configuration in ``states`` are known."""
        unknown = self.runtime.tab.row_done[states] == 0
        if unknown.any():
            for c in np.unique(states[unknown]).tolist():
                self.runtime.fill_row(int(c))

    def _allowed_tokens(self, cid: int, vt: VocabTable) -> NDArray[np.int64]:
        """Token ids (original numbering) whose bytes can be consumed from ``cid``.

        Two vectorised strategies: where most bytes loop back to ``cid`` (string bodies and
        the like) the tokens made only of looping bytes are allowed outright and only the
        rest are walked byte by byte; elsewhere a level-by-level walk of the vocabulary's
        byte trie expands only children of live nodes, so restrictive states prune at once.
        """
        if cid < 0 or not self.runtime.tab.configs[cid, 1]:
            return np.zeros(0, dtype=np.int64)
        self.runtime.fill_row(cid)
        loops = self.runtime.trans[cid] == cid
        if int(loops.sum()) >= 32:
            return self._allowed_loop_split(cid, vt, loops)
        return self._allowed_trie(cid, vt)

    def _allowed_into(self, cid: int, vt: VocabTable, words: NDArray[np.uint32]) -> None:
        """OR the tokens allowed from ``cid`` (EOS aside) into packed ``words``: the compiled
        walks when available, else :meth:`_allowed_tokens`."""
        if not self.native:
            ok = self._allowed_tokens(cid, vt)
            if ok.size:
                set_bits(words, ok)
        elif cid >= 0 and self.runtime.tab.configs[cid, 1]:
            self._native_walk(False, cid, vt, words, split=False)

    def _native_walk(self, gmode: bool, start: int, vt: VocabTable, words: NDArray[np.uint32],
                     split: bool) -> NDArray[np.int64]:
        """Compiled walk from ``start`` (a configuration, or with ``gmode`` a rule state of a
        call-free rule), first byte by first byte: where the state after a first byte can
        read the vocabulary's text slice whole, the slice's tokens with that first byte are
        accepted at once and only the others are walked (:func:`structgen.masks.trie.walk_sliced`).
        Returns the undecided ids of a ``split`` walk."""
        sl = vt.text_slice()
        if sl is not None:
            return native.walk_sliced(self.runtime, vt.trie(), sl, start, gmode, split, words)
        if gmode:
            self.runtime.expand(start)
            trans = self.runtime.tab.state_trans
        else:
            self.runtime.fill_row(start)
            trans = self.runtime.tab.trans
        loops = trans[start] == start
        if int(loops.sum()) >= 32:
            return native.walk_loop_split(self.runtime, vt.trie(), start, gmode, loops, words, split)
        return native.walk_trie(self.runtime, vt.trie(), start, gmode, split, words)

    def _allowed_loop_split(self, cid: int, vt: VocabTable, loops: NDArray[np.bool_]) -> NDArray[np.int64]:
        words = np.packbits(~loops, bitorder="little").view(np.uint64)  # [4] non-loop bytes
        impure = (vt.byte_bits & words).any(axis=1)  # [N] token has a non-looping byte
        return np.concatenate([vt.flat_ids[~impure],
                               self._walk_flat(cid, np.nonzero(impure)[0], vt)])

    def _allowed_trie(self, cid: int, vt: VocabTable) -> NDArray[np.int64]:
        return self._trie_walk(cid, vt, split=False)[0]

    # -- introspection -------------------------------------------------------------
    def memory_bytes(self) -> int:
        """Approximate bytes held by the runtime tables and the mask caches."""
        return int(self.runtime.tab.nbytes() + self.mask_cache.bytes + self.ci_cache.bytes
                   + self.pending_cache.bytes
                   + self.horizon.memory_bytes())


class FreeState:
    """What a matcher needs in a *free* configuration (:meth:`Engine.free_state`): its mask
    as a short list of forbidden token ids, and its token steps as a usual target plus
    exceptions.

    ``forbidden``: int64 ids (ascending, read-only) the mask forbids, or None when they are
    more than :data:`FREE_MAX_FORBIDDEN` (not a free configuration); ``usual``: the
    configuration every token not in ``jumps`` leads to; ``jumps``: token id -> target
    configuration (-1: rejected) for the others, EOS aside, or None (no step shortcut);
    ``visits``: how often its mask was asked for while it has no ``jumps`` yet (-1: no
    more to come; a configuration met once, as each position of a counted string is, never
    pays for the walk that finds them); ``nbytes``: about what it holds (the engine keeps
    them within half its mask-cache budget)."""

    __slots__ = ("forbidden", "usual", "jumps", "visits", "nbytes")

    def __init__(self, forbidden: NDArray[np.int64] | None, usual: int, jumps: dict[int, int] | None,
                 visits: int = -1) -> None:
        self.forbidden = forbidden
        self.usual = usual
        self.jumps = jumps
        self.visits = visits
        # roughly what it holds: the array, and a dict entry plus two ints per jump
        self.nbytes = 100 + (0 if forbidden is None else forbidden.nbytes) + 100 * len(jumps or ())


_NOT_FREE = FreeState(None, -1, None)



def _expand(starts: NDArray[np.int64], counts: NDArray[np.int64], total: int) -> NDArray[np.int64]:
    """Concatenate the integer ranges ``[starts[i], starts[i] + counts[i])``."""
    ends = np.cumsum(counts)
    offs = np.repeat(starts - (ends - counts), counts)
    return offs + np.arange(total, dtype=np.int64)
