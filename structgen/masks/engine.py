"""Shared runtime of a compiled grammar: a lazily determinised pushdown automaton.

A *stack* is an interned chain of frames ``(parent, rule state)``; the top frame's rule
state is where that rule's DFA currently is, lower frames hold return states. A
*configuration* is the set of stacks the parse may be in (more than one when the grammar
is ambiguous or a call and a byte edge compete), closed under calls and returns, keeping
only stacks whose top state has byte edges; plus a flag saying whether the whole input
may end here.

Rule states ``(rule, DFA state)``, stacks and configurations are interned to small
integers in flat arrays, and the byte transition function between configurations is
tabulated in ``trans`` (int32 ``[capacity, 256]``: -2 unknown, -1 dead), filled one row at a
time on first use. All of that runs in compiled code (:mod:`structgen.grammar._pda_kernels`);
Python only reads a rule's DFA state the first time the kernels meet it (:meth:`Engine._expand`).
Everything a matcher needs is then integer lookups: stepping a token is one lookup per
byte, and a token mask over the whole vocabulary is a walk of the vocabulary's byte trie
through ``trans`` (:meth:`Engine.token_mask`), cached per configuration.

One Engine is shared by every matcher of a grammar; a lock guards growth of the tables.

Memory is bounded. The lazily built tables (rule states, stacks, configurations and their
transition rows) are *flushed* when they would outgrow the engine's ``table_budget`` (bytes,
default :data:`DEFAULT_TABLE_BYTES`), or the tables of all engines together would outgrow
:data:`PROCESS_TABLE_BYTES`: everything is dropped and rebuilt on demand, as RE2's and Rust
regex's lazy DFAs clear their state cache when it is full, so answers stay exact (a flush
costs time, never correctness). Configurations still in use -- the start, the one a walk
is at, and every live matcher's history -- are carried over by content (their stacks of
rule states, keyed by NFA state sets) and given new ids: each flush starts a new
*epoch*, and a matcher translates its history to the current epoch before its next step.
Flushes happen only at safe points (a walk about to compute a new transition, a mask about
to be computed), once the tables are past half the budget, so that their growth (by
doubling) stays within it. The token-mask caches are byte-bounded LRUs (``mask_cache_bytes``, default
:data:`DEFAULT_MASK_CACHE_BYTES`, plus half that for split walks), emptied by a flush too.
:func:`set_memory_budget` changes the defaults.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from structgen.grammar import _pda_kernels as K
from structgen.grammar.gcpause import gc_paused
from structgen.masks import trie as native

if TYPE_CHECKING:  # pragma: no cover
    from structgen.grammar.compiled import CompiledGrammar

__all__ = ["Engine", "VocabTable", "DEAD", "UNKNOWN", "STALE", "set_memory_budget",
           "DEFAULT_TABLE_BYTES", "DEFAULT_MASK_CACHE_BYTES", "PROCESS_TABLE_BYTES"]

DEAD = K.DEAD
UNKNOWN = K.UNKNOWN
STALE = -7  # walk: the tables were flushed by another thread meanwhile; redo it under the lock


def _env_bytes(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return max(int(raw), 0) if raw.strip() else default
    except ValueError:
        return default


#: Per-engine budget of the lazily built tables (bytes; ``STRUCTGEN_TABLE_BYTES``).
DEFAULT_TABLE_BYTES = _env_bytes("STRUCTGEN_TABLE_BYTES", 256 << 20)
#: Per-engine budget of the token-mask cache (bytes; ``STRUCTGEN_MASK_CACHE_BYTES``); the
#: split-walk cache gets half as much again.
DEFAULT_MASK_CACHE_BYTES = _env_bytes("STRUCTGEN_MASK_CACHE_BYTES", 32 << 20)
#: Budget of the tables of all engines of the process together (``STRUCTGEN_PROCESS_TABLE_BYTES``):
#: past it, an engine that grows flushes its own tables if they hold at least a sixteenth of it.
PROCESS_TABLE_BYTES = _env_bytes("STRUCTGEN_PROCESS_TABLE_BYTES", 1 << 30)

_PROCESS_LOCK = threading.Lock()
_process_bytes = [0]  # table bytes of every live engine


def set_memory_budget(*, table_bytes: int | None = None, mask_cache_bytes: int | None = None,
                      process_table_bytes: int | None = None) -> None:
    """Change the memory budgets (bytes) of engines created from now on (``table_bytes``,
    ``mask_cache_bytes``) and of the whole process (``process_table_bytes``, effective at
    once). An existing engine's budgets are its attributes ``table_budget`` and
    ``mask_cache.limit``."""
    global DEFAULT_TABLE_BYTES, DEFAULT_MASK_CACHE_BYTES, PROCESS_TABLE_BYTES
    for name, v in (("table_bytes", table_bytes), ("mask_cache_bytes", mask_cache_bytes),
                    ("process_table_bytes", process_table_bytes)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            from structgen.errors import ConfigError

            raise ConfigError(f"{name} must be an integer >= 0, not {v!r}", key=name)
    if table_bytes is not None:
        DEFAULT_TABLE_BYTES = table_bytes
    if mask_cache_bytes is not None:
        DEFAULT_MASK_CACHE_BYTES = mask_cache_bytes
    if process_table_bytes is not None:
        PROCESS_TABLE_BYTES = process_table_bytes


def _account(delta: int) -> None:
    with _PROCESS_LOCK:
        _process_bytes[0] += delta


ROOT = 0  # the empty stack
_WALK_IDS_MAX = 4096  # above this many context-dependent tokens, walk the trie instead
_SPLIT_DEPTH = 6  # most stack frames a rooted split walk takes
_SPLIT_COLD_MAX = 1  # stacks of a configuration whose split walks may be missing from the cache
_HORIZON_BUDGET = 4  # pair checks one horizon query may do, per unit of depth
_HORIZON_HOPS = 64  # predecessors followed back to a state whose class is known
_HORIZON_MEMO = 500_000  # memoised state pairs kept per engine


class _HorizonAbort(Exception):
    pass


def _grown(a: np.ndarray, rows: int, fill: Any) -> np.ndarray:
    """``a`` with ``rows`` rows, the new ones set to ``fill`` (left unwritten when ``fill`` is
    None: rows the kernels initialise when they intern the row's state, so that fresh pages
    are first touched as rows come into use, not all at once here)."""
    b = np.empty((rows,) + a.shape[1:], dtype=a.dtype)
    b[: a.shape[0]] = a
    if fill is not None:
        b[a.shape[0]:] = fill
    return b


def _row_shape(row: np.ndarray) -> tuple[bytes, tuple[int, ...]]:
    """(rank of each byte's target among the row's distinct targets in first-occurrence
    order, as bytes; those targets) of a transition row (int32 ``[256]``)."""
    if native.available():
        lab = np.empty(256, dtype=np.uint8)
        tg = np.empty(256, dtype=np.int32)
        n = native.row_shape(row, lab, tg)
        return lab.tobytes(), tuple(tg[:n].tolist())
    uniq, first, inv = np.unique(row, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inv.reshape(-1)].astype(np.uint8).tobytes(), tuple(int(t) for t in uniq[order].tolist())


def _rule_arrays(rules: tuple[Any, ...]) -> dict[str, np.ndarray]:
    """The fixed rule part of the kernel tables (see :mod:`structgen.grammar._pda_kernels`)."""
    nr = len(rules)
    kind = np.zeros(nr, dtype=np.int8)
    base = np.zeros(nr, dtype=np.int64)
    aux = np.full(nr, -1, dtype=np.int64)
    cls = np.zeros((nr, 256), dtype=np.int32)
    ncls = np.zeros(nr, dtype=np.int32)
    end = np.full(nr, -1, dtype=np.int32)
    lo = np.zeros(nr, dtype=np.int64)
    hi = np.zeros(nr, dtype=np.int64)
    eo_l, eps_l, do_l, edg_l, co_l, cal_l, imp_l = [], [], [], [], [], [], []
    tb_l: list[np.ndarray] = []
    acc_l: list[np.ndarray] = []
    nx = 0  # NFA states so far
    ne = nd = nc = 0  # epsilon / edge / call entries so far
    nt = 0  # table rows so far

    def table(t: np.ndarray, a: np.ndarray) -> int:
        nonlocal nt
        at = nt
        tb_l.append(np.asarray(t, dtype=np.int32))
        acc_l.append(np.asarray(a, dtype=np.uint8))
        nt += t.shape[0]
        return at

    for r, rule in enumerate(rules):
        if hasattr(rule, "csr"):  # LazyRule
            eo, eps, do, edges, co, calls, imp = rule.csr()
            kind[r] = K.LAZY
            base[r] = nx
            cls[r] = rule._class_of
            ncls[r] = rule._nclass
            end[r] = nx + rule._end
            eo_l.append(eo[:-1] + ne)
            eps_l.append(eps + nx)
            do_l.append(do[:-1] + nd)
            e2 = edges.copy()
            e2[:, 2] += nx
            edg_l.append(e2)
            co_l.append(co[:-1] + nc)
            c2 = calls.copy()
            c2[:, 1] += nx
            cal_l.append(c2)
            imp_l.append(imp)
            nx += imp.shape[0]
            ne += eps.shape[0]
            nd += edges.shape[0]
            nc += calls.shape[0]
        elif hasattr(rule, "lo"):  # CountedRule
            kind[r] = K.COUNTED
            base[r] = table(rule._trans, rule._accept)
            lo[r], hi[r] = rule.lo, rule.hi
        elif hasattr(rule, "_trans"):  # DfaRule
            kind[r] = K.TABLE
            base[r] = table(rule._trans, rule._accept)
        else:  # ProductRule
            kind[r] = K.PRODUCT
            base[r] = table(rule._a.trans, rule._a.accept)
            aux[r] = table(rule._b.trans, rule._b.accept)

    def cat(parts: list[np.ndarray], tail: int | None, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        out = np.concatenate(parts) if parts else np.zeros(shape, dtype=dtype)
        if tail is not None:
            out = np.concatenate([out, np.array([tail], dtype=out.dtype)])
        return np.ascontiguousarray(out.astype(dtype, copy=False))

    return {
        "rkind": kind, "rbase": base, "raux": aux, "rcls": cls, "rncls": ncls, "rend": end,
        "rstart": np.full(nr, -1, dtype=np.int32), "rlo": lo, "rhi": hi,
        "xepso": cat(eo_l, ne, (0,), np.int32), "xeps": cat(eps_l, None, (0,), np.int32),
        "xedgo": cat(do_l, nd, (0,), np.int32), "xedg": cat(edg_l, None, (0, 3), np.int32),
        "xcalo": cat(co_l, nc, (0,), np.int32), "xcal": cat(cal_l, None, (0, 2), np.int32),
        "ximp": cat(imp_l, None, (0,), np.uint8),
        "tb": cat(tb_l, None, (0, 256), np.int32), "tbacc": cat(acc_l, None, (0,), np.uint8),
    }


class _Tables:
    """The arrays behind :mod:`structgen.grammar._pda_kernels` (layout in its docstring) and their
    growth. ``T`` is the tuple the kernels take; it is rebuilt whenever an array grows."""

    # (name, initial rows, fill, extra dims, dtype): row-indexed tables grow together per group
    _GROUPS = {
        "g": (K.M_NG, 256, [("g_row", UNKNOWN, (256,), np.int32), ("g_flag", 0, (), np.uint8),
                            ("g_call", 0, (2,), np.int32), ("g_rule", -1, (), np.int32),
                            ("g_key", 0, (2,), np.int32), ("g_pred", -1, (), np.int32),
                            ("g_acc", False, (), bool), ("g_ls", 0, (4,), np.uint64),
                            ("g_lk", 0, (), np.uint8), ("gsl", -1, (8,), np.int8),
                            ("gu8", -1, (), np.int8)]),
        "fr": (K.M_NFR, 1024, [("fr", -1, (2,), np.int32), ("cl", 0, (3,), np.int32),
                               ("cl_cfg", UNKNOWN, (), np.int32)]),
        "cf": (K.M_NCF, 256, [("cf", 0, (3,), np.int32), ("trans", UNKNOWN, (256,), np.int32),
                              ("accepting", False, (), bool), ("loopset", 0, (4,), np.uint64),
                              ("loopok", 0, (4,), np.uint64), ("rowdone", 0, (), np.uint8),
                              ("csl", -1, (8,), np.int8), ("cu8", -1, (), np.int8)]),
    }
    # the 1 KiB rows of rule states and configurations, written whole when each is interned
    # (_pda_kernels._state, _config): grown without a fill
    _LAZY_ROWS = frozenset({"g_row", "trans"})
    # data arrays (name, used-counter slot, initial size, columns)
    _DATA = [("calls", K.M_NCALL, 256, (2,)), ("cl_d", K.M_NCLD, 4096, ()), ("cf_d", K.M_NCFD, 4096, ()),
             ("ec_d", K.M_NECD, 4096, ()), ("gs_d", K.M_NGSD, 4096, ())]
    _HASHES = {"g": "gs", "fr": "fr_h", "cf": "cf_h"}

    def __init__(self, rules: tuple[Any, ...]) -> None:
        self.meta = np.zeros(16, dtype=np.int64)
        for k, v in _rule_arrays(rules).items():
            setattr(self, k, v)
        self.xec = np.zeros((self.ximp.shape[0], 2), dtype=np.int32)
        self.xec[:, 1] = -1
        for grp, (_slot, rows, cols) in self._GROUPS.items():
            for name, fill, dims, dt in cols:
                setattr(self, name, np.full((rows,) + dims, fill, dtype=dt))
            self._new_hash(grp, 2 * rows)
        self.cl[:, 1] = -1
        for name, _slot, size, dims in self._DATA:
            setattr(self, name, np.zeros((size,) + dims, dtype=np.int32))
        self.meta[K.M_NFR] = 1
        self._pack()

    def _new_hash(self, grp: str, size: int) -> None:
        h = self._HASHES[grp]
        setattr(self, h + "k", np.full(size, -1, dtype=np.int64))
        setattr(self, h + "v", np.zeros(size, dtype=np.int32))

    # kernel field name -> attribute, where they differ
    _ATTR = {"ecd": "ec_d", "grow": "g_row", "gflag": "g_flag", "gcall": "g_call", "grule": "g_rule",
             "gkey": "g_key", "gsd": "gs_d", "gshk": "gsk", "gshv": "gsv", "gpred": "g_pred", "gacc": "g_acc",
             "gls": "g_ls", "glk": "g_lk", "frhk": "fr_hk", "frhv": "fr_hv", "cld": "cl_d", "clcfg": "cl_cfg",
             "cfd": "cf_d", "cfhk": "cf_hk", "cfhv": "cf_hv", "acc": "accepting", "ls": "loopset",
             "lk": "loopok", "rdone": "rowdone"}

    def arrays(self) -> list[np.ndarray]:
        return [getattr(self, self._ATTR.get(f, f)) for f in K.FIELD_NAMES]

    def _pack(self) -> None:
        self.T = K.make_tables(*self.arrays())

    def grow(self) -> None:
        """After NEED_GROW: double every row table that is at least 7/8 full (the one a
        kernel found full among them; a table's hash index has twice its rows, so it stays
        at most half full), and every data array short of the room a kernel asked for."""
        m = self.meta
        want = int(m[K.M_WANT])
        for name, slot, _size, _dims in self._DATA:
            a = getattr(self, name)
            used = int(m[slot])
            if used + want > a.shape[0] or 2 * used >= a.shape[0]:
                setattr(self, name, _grown(a, max(2 * a.shape[0], 2 * (used + want)), 0))
        m[K.M_WANT] = 0
        for grp, (slot, _rows, cols) in self._GROUPS.items():
            n = int(m[slot])
            cap = getattr(self, cols[0][0]).shape[0]
            if 8 * n < 7 * cap:
                continue
            cap *= 2
            for name, fill, _dims, _dt in cols:
                lazy = name in self._LAZY_ROWS
                setattr(self, name, _grown(getattr(self, name), cap, None if lazy else fill))
            self._new_hash(grp, 2 * cap)
            if grp == "fr":
                K.rehash_frames(self.fr, n, self.fr_hk, self.fr_hv)
            elif grp == "cf":
                K.rehash_seqs(self.cf[:, 2].copy(), self.cf[:, :2].copy(), self.cf_d, n, self.cf_hk,
                              self.cf_hv)
            else:
                K.rehash_seqs(self.g_rule.copy(), self.g_key, self.gs_d, n, self.gsk, self.gsv)
        self._pack()

    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays()))


class Engine:
    """Runtime tables for one compiled grammar (thread-safe, grows lazily)."""

    def __init__(self, grammar: CompiledGrammar, *, mask_cache_bytes: int | None = None,
                 table_bytes: int | None = None) -> None:
        self.grammar = grammar
        self.rules = grammar.rules
        self.lock = threading.RLock()
        self.native = native.available()  # compiled trie walks (structgen.masks.trie) when numba is present
        with gc_paused():
            self.tab = _Tables(self.rules)
        #: flush the tables past this many bytes (see the module docstring)
        self.table_budget = DEFAULT_TABLE_BYTES if table_bytes is None else int(table_bytes)
        self.epoch = 0  # flushes so far: configuration ids are valid within one epoch
        self.flushes = 0
        self._fresh_bytes = self._table_bytes = self.tab.nbytes()
        self._acct = [self._table_bytes]  # this engine's share of the process total
        _account(self._table_bytes)
        weakref.finalize(self, _account_release, self._acct)
        # matchers whose histories hold configuration ids (translated after a flush)
        self._holders: weakref.WeakSet[Any] = weakref.WeakSet()
        # per past epoch: configuration id -> content, for the histories not yet translated
        self._described: dict[int, dict[int, Any]] = {}
        if mask_cache_bytes is None:
            mask_cache_bytes = DEFAULT_MASK_CACHE_BYTES
        # bounded-horizon equivalence of rule states (:meth:`_horizon_rep`); states are
        # rule-state ids of the kernel tables
        self._hshape: dict[int, tuple[bytes, tuple[int, ...], tuple[tuple[int, int], ...], bool]] = {}
        self._hstat: dict[int, list[int]] = {}  # rule -> [work, shared]; work -1 = off
        self._hrep_of: dict[tuple[int, int], int] = {}  # (depth, state) -> representative
        self._hpair: dict[tuple[int, int], int] = {}  # (p, q) -> depth verified equal
        self._hfail: dict[tuple[int, int], int] = {}  # (p, q) -> depth they differ at
        self._nullable: dict[int, bool] = {}  # rule start state -> may return without a byte
        # masks: (vocab key, config) -> packed uint32 words
        self.mask_cache = _ByteLru(mask_cache_bytes)
        self.stats = {"mask_hits": 0, "mask_misses": 0, "ci_hits": 0, "ci_misses": 0}
        # rooted split walks per (vocab, top frames, exact): packed words of the tokens
        # accepted whatever lies below, and the ids of the tokens that depend on it
        self.ci_cache = _ByteLru(mask_cache_bytes // 2)
        with self.lock:
            g0 = self._run(K.start_state, grammar.root)
            self.start = self._closure_config(self._frame(ROOT, g0))

    def _run(self, fn: Any, *args: Any) -> int:
        """Call a table kernel until it stops asking for room (hold the lock)."""
        while True:
            r = int(fn(self.tab.T, *args))
            if r != K.NEED_GROW:
                return r
            self._grow()

    def _service(self, status: int) -> None:
        """Deal with a resumable kernel's NEED_GROW (the caller then resumes it)."""
        if status != K.NEED_GROW:  # pragma: no cover - a kernel bug
            raise RuntimeError(f"unexpected kernel status {status}")
        self._grow()

    def _grow(self) -> None:
        self.tab.grow()
        n = self.tab.nbytes()
        _account(n - self._acct[0])
        self._acct[0] = self._table_bytes = n

    # -- memory budget: flushing the tables ------------------------------------------------
    def over_budget(self) -> bool:
        """Whether the tables should be flushed at the next safe point: grown since the last
        flush and past half the engine's budget (or the process total past half of
        :data:`PROCESS_TABLE_BYTES`), since tables grow by doubling."""
        n = self._table_bytes
        # past half the budget: the next doubling of a table could cross it
        if n <= self._fresh_bytes:
            return False
        if 2 * n > self.table_budget:
            return True
        # the process total: only an engine holding a sizeable share flushes for it (flushing
        # a small engine frees next to nothing and, with many grammars alive, would make every
        # engine flush at each growth)
        return 2 * _process_bytes[0] > PROCESS_TABLE_BYTES and 16 * n >= PROCESS_TABLE_BYTES

    def register(self, holder: Any) -> None:
        """Track ``holder`` (a matcher: ``_hist`` a list of configuration ids valid in epoch
        ``_epoch``) so that a flush keeps what it needs to translate them."""
        self._holders.add(holder)

    def _describe(self, cid: int) -> tuple[bool, tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]]:
        """Configuration ``cid`` by content, independent of table ids: (accepting, stacks),
        each stack its frames bottom first, each frame (rule, rule-state key)."""
        tab = self.tab
        st, n, acc = (int(x) for x in tab.cf[cid])
        stacks = []
        fr, g_rule, g_key, gs_d = tab.fr, tab.g_rule, tab.g_key, tab.gs_d
        for s in tab.cf_d[st:st + n].tolist():
            chain = []
            while s != ROOT:
                parent, g = int(fr[s, 0]), int(fr[s, 1])
                k0, kn = int(g_key[g, 0]), int(g_key[g, 1])
                chain.append((int(g_rule[g]), tuple(gs_d[k0:k0 + kn].tolist())))
                s = parent
            stacks.append(tuple(reversed(chain)))
        return bool(acc), tuple(stacks)

    def _intern_described(self, desc: tuple[bool, tuple[Any, ...]]) -> int:
        """The configuration id of a :meth:`_describe` result in the current tables."""
        acc, stacks = desc
        sids = set()
        for chain in stacks:
            s = ROOT
            for r, key in chain:
                g = self._run(K.state, r, np.array(key, dtype=np.int32), len(key))
                s = self._run(K.frame, s, g)
            sids.add(s)
        buf = np.array(sorted(sids), dtype=np.int32)
        return self._run(K.config, buf, len(buf), acc)

    def _flush(self, pins: tuple[int, ...] = ()) -> tuple[int, ...]:
        """Drop every lazily built table and cache (hold the lock); returns the ids of the
        configurations ``pins`` in the new tables. The start configuration is carried over;
        live matchers' histories are described, to be translated by each matcher
        (:meth:`translate`) before its next step."""
        old_epoch = self.epoch
        self.epoch = old_epoch + 1  # first: a step racing with this flush sees it
        self.flushes += 1
        keep = {c for c in pins if c >= 0}
        keep.add(self.start)
        desc: dict[int, Any] = {}
        live_epochs = set()
        for h in list(self._holders):
            ep = h._epoch
            live_epochs.add(ep)
            if ep == old_epoch:
                for c in list(h._hist):
                    if c >= 0 and c not in desc:
                        desc[c] = self._describe(c)
        for c in keep:
            if c not in desc:
                desc[c] = self._describe(c)
        self._described = {e: d for e, d in self._described.items() if e in live_epochs}
        self._described[old_epoch] = desc
        with gc_paused():
            self.tab = _Tables(self.rules)
        n = self.tab.nbytes()
        _account(n - self._acct[0])
        self._acct[0] = self._table_bytes = self._fresh_bytes = n
        self.mask_cache.clear()
        self.ci_cache.clear()
        for memo in (self._hshape, self._hstat, self._hrep_of, self._hpair, self._hfail, self._nullable):
            memo.clear()
        self.start = self._intern_described(desc[self.start])
        return tuple(self._intern_described(desc[c]) if c >= 0 else c for c in pins)

    def translate(self, epoch: int, ids: list[int]) -> list[int]:
        """``ids`` (configuration ids of ``epoch``, negatives kept) in the current epoch
        (hold the lock). Raises KeyError for an id a flush did not describe."""
        if epoch == self.epoch:
            return list(ids)
        desc = self._described[epoch]
        memo: dict[int, int] = {}
        out = []
        for c in ids:
            if c < 0:
                out.append(c)
                continue
            got = memo.get(c)
            if got is None:
                got = memo[c] = self._intern_described(desc[c])
            out.append(got)
        return out

    # -- rule states, stacks and configurations -------------------------------------------
    def _expand(self, g: int) -> None:
        if not self.tab.g_flag[g] & K.EXPANDED:
            self._run(K.expand, g)

    def _frame(self, parent: int, g: int) -> int:
        return self._run(K.frame, parent, g)

    def _closure_config(self, sid: int) -> int:
        return self._run(K.closure_config, sid)

    def _stacks(self, cid: int) -> list[int]:
        cf = self.tab.cf
        st, n = int(cf[cid, 0]), int(cf[cid, 1])
        return self.tab.cf_d[st:st + n].tolist()

    def rule_of(self, g: int) -> int:
        return int(self.tab.g_rule[g])

    @property
    def trans(self) -> np.ndarray:
        return self.tab.trans

    @property
    def accepting(self) -> np.ndarray:
        return self.tab.accepting

    @property
    def num_configs(self) -> int:
        return int(self.tab.meta[K.M_NCF])

    @property
    def num_rule_states(self) -> int:
        return int(self.tab.meta[K.M_NG])

    def is_accepting(self, cid: int) -> bool:
        acc = self.tab.accepting
        return 0 <= cid < acc.shape[0] and bool(acc[cid])

    def fill_row(self, cid: int) -> None:
        """Compute ``trans[cid, :]`` (all 256 bytes) if not yet known (entries are otherwise
        computed one at a time, on first use)."""
        if self.tab.rowdone[cid]:
            return
        with self.lock:
            self._run(K.fill_row, cid)

    def step(self, cid: int, b: int) -> int:
        v = int(self.tab.trans[cid, b])
        if v == UNKNOWN:
            with self.lock:
                v = self._run(K.succ, cid, b)
        return v

    def walk(self, cid: int, data: bytes, epoch: int | None = None) -> int:
        """Configuration after consuming ``data`` from ``cid`` (DEAD if rejected); ``epoch``:
        the epoch ``cid`` belongs to (default: the current one).

        May flush the tables (over budget) before computing a new transition; the result
        is then an id of the new epoch. Returns STALE when another thread flushed them
        (``cid`` belongs to an older epoch): the caller redoes the walk from its translated
        state holding :attr:`lock`, under which no other thread can flush."""
        # the matchers' hot path: the loop of _walk, without building its tuple
        ep = self.epoch if epoch is None else epoch
        trans = self.tab.trans
        if self.epoch != ep:
            return STALE
        for b in data:
            if cid < 0:
                return DEAD
            v = trans[cid, b]
            if v == UNKNOWN:
                with self.lock:
                    if self.epoch != ep:
                        return STALE
                    if self._table_bytes > self._fresh_bytes and self.over_budget():
                        (cid,) = self._flush((cid,))
                        ep = self.epoch
                    v = self._run(K.succ, cid, b)
                trans = self.tab.trans
            cid = int(v)
        return STALE if self.epoch != ep else cid

    def _walk(self, cid: int, data: bytes, ep: int) -> tuple[int, int]:
        """:meth:`walk` and the epoch its result belongs to."""
        trans = self.tab.trans
        if self.epoch != ep:
            return STALE, ep
        for b in data:
            if cid < 0:
                return DEAD, ep
            v = trans[cid, b]
            if v == UNKNOWN:
                with self.lock:
                    if self.epoch != ep:
                        return STALE, ep
                    if self._table_bytes > self._fresh_bytes and self.over_budget():
                        (cid,) = self._flush((cid,))
                        ep = self.epoch
                    v = self._run(K.succ, cid, b)
                trans = self.tab.trans
            cid = int(v)
        if self.epoch != ep:
            return STALE, ep
        return cid, ep

    def run_from_start(self, data: bytes) -> tuple[bool, bool]:
        """(``data`` is a viable prefix, ``data`` is accepted) from the start configuration,
        exact across flushes (redone holding the lock if another thread flushed)."""
        ep = self.epoch
        c, ep = self._walk(self.start, data, ep)
        if c != STALE:
            got = (c >= 0, self.is_accepting(c))
            if self.epoch == ep:
                return got
        with self.lock:
            c, _ = self._walk(self.start, data, self.epoch)
            return c >= 0, self.is_accepting(c)

    def live_bytes(self, cid: int) -> np.ndarray:
        """Byte values that keep the parse alive from ``cid`` (int array)."""
        self.fill_row(cid)
        return np.nonzero(self.tab.trans[cid] >= 0)[0]

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
                row = self.tab.trans[c]
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
        with self.lock:
            if self._table_bytes > self._fresh_bytes and self.over_budget():
                (cid,) = self._flush((cid,))
                key = (vt.key, cid)
            m = self._split_mask(cid, vt)
            if m is None:
                m = np.zeros(vt.num_words, dtype=np.uint32)
                self._allowed_into(cid, vt, m)
                if self.is_accepting(cid) and vt.eos_ids.size:
                    _set_bits(m, vt.eos_ids)
            self.mask_cache.put(key, m, m.nbytes)
        return m

    def cached_mask(self, cid: int, vt: VocabTable) -> np.ndarray | None:
        """The mask of configuration ``cid`` if cached (counted as a hit), else None."""
        m = self.mask_cache.get((vt.key, cid))
        if m is not None:
            self.stats["mask_hits"] += 1
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
        stacks = self._stacks(cid)
        if not stacks:
            return None
        if len(stacks) == 1 and int(self.tab.fr[stacks[0], 0]) == ROOT:
            return None
        if len(stacks) > _SPLIT_COLD_MAX and self.native:
            cold = 0
            for sid in stacks:
                if self._context_independent(sid, vt, peek=True) is None:
                    cold += 1
                    if cold > _SPLIT_COLD_MAX:
                        # one walk of the whole configuration visits the trie once, where the
                        # split would walk it once per stack: faster unless most are cached
                        return None
        words = np.zeros(vt.num_words, dtype=np.uint32)
        pending: list[tuple[int, np.ndarray]] = []
        for sid in stacks:
            got = self._context_independent(sid, vt)
            assert got is not None
            certain, uncertain = got
            words |= certain
            if uncertain.size:
                pending.append((self._closure_config(sid), uncertain))
        for single, ids in pending:
            if ids.size > _WALK_IDS_MAX:
                self._allowed_into(single, vt, words)  # a trie walk prunes better
            elif self.native:
                native.walk_ids(self, vt.trie(), single, False, ids, words)
            else:
                ids = ids[((words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1) == 0]
                if ids.size:
                    ok = self._walk_ids(single, ids, vt)
                    if ok.size:
                        _set_bits(words, ok)
        if self.is_accepting(cid) and vt.eos_ids.size:
            _set_bits(words, vt.eos_ids)
        return words

    def _context_independent(self, sid: int, vt: VocabTable,
                             peek: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
        """(certain words, undecided ids) of stack ``sid`` from its shallowest rooted top
        (at most ``_SPLIT_DEPTH`` frames) that leaves at most ``_WALK_IDS_MAX`` tokens
        undecided; a top that is the whole stack decides every token. With ``peek``, only
        what the cache holds (no walk, no horizon query): None where a walk is missing."""
        chain: list[int] = []  # rule states, top first
        fr = self.tab.fr
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
                    vt: VocabTable) -> tuple[np.ndarray, np.ndarray] | None:
        """The cached rooted walk of ``chain`` (filed under the chain itself or under its
        known horizon classes), or None; the LRU order is left as it is."""
        got = self.ci_cache.peek((vt.key, chain, exact))
        if got is None:
            canon = tuple(self._hrep_of.get((vt.max_len, g), g) for g in chain)
            got = self.ci_cache.peek((vt.key, canon, exact))
        return got

    def _rooted_split(self, chain: tuple[int, ...], exact: bool,
                      vt: VocabTable) -> tuple[np.ndarray, np.ndarray]:
        """The rooted walk of the top frames ``chain`` (rule states, top first): certain
        words and undecided ids (cached)."""
        key = (vt.key, chain, exact)
        got = self.ci_cache.get(key)
        if got is not None:
            self.stats["ci_hits"] += 1
            return got
        # a chain whose frames behave like already-walked ones on every token (a counted
        # string's character positions far from its bounds) shares their walk
        canon = tuple(self._horizon_rep(g, vt.max_len) for g in chain)
        if canon != chain:
            got = self.ci_cache.get((vt.key, canon, exact))
            if got is not None:
                self.stats["ci_hits"] += 1
                return got
            key = (vt.key, canon, exact)  # filed under the class; walked from the real frames
        self.stats["ci_misses"] += 1
        empty = np.zeros(0, dtype=np.int64)
        if self.native and len(chain) == 1 and self.rules[self.rule_of(chain[0])].leaf:
            # one call-free frame: walk the rule's own DFA states, no stacks or configurations
            w = np.zeros(vt.num_words, dtype=np.uint32)
            unc = self._native_walk(True, chain[0], vt, w, split=not exact)
            got = (w, unc.copy())
        else:
            s = self._run(K.stack_of_chain, np.array(chain[::-1], dtype=np.int64), len(chain))
            rooted = self._closure_config(s)
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

    # -- bounded-horizon equivalence of rule states ------------------------------------
    def _horizon_rep(self, q: int, depth: int) -> int:
        """A rule state of the same rule as ``q`` that behaves like ``q`` on every input of
        at most ``depth`` symbols (bytes or calls), or ``q`` itself.

        Such states are interchangeable for any token of at most ``depth`` bytes as long as
        every call consumes at least one byte: walking the token from either visits states
        with the same acceptance, the same byte partition and the same callees, so rooted
        split walks (and masks) from them are equal. A counted string (``maxLength``) is a
        chain of one state per character: every position at least ``depth`` characters
        away from its bounds falls in one class, so the vocabulary is walked once for them,
        not once per character.

        The class is found by going back along recorded predecessors (the state each state
        was first reached from) while each consecutive pair is equivalent (transitivity),
        to a state whose representative is known, or else the furthest one, which becomes
        the representative. Pairs are compared structurally (:meth:`_heq`), memoising how
        deep each pair was verified; a pair is verified ``depth`` deeper than asked, so
        going along a chain re-verifies only every ``depth`` states (constant amortised work
        per state). A rule whose queries cost much more than the walks they share is not
        tried again."""
        r = self.rule_of(q)
        stat = self._hstat.get(r)
        if stat is None:
            stat = self._hstat[r] = [0, 0]  # [work spent, walks shared]; work -1 = off
        tab = self.tab
        if tab.rkind[r] == K.COUNTED:
            # (c, s) of item{lo,hi}: within `depth` bytes at most `depth` more items end, so c
            # matters only through c + k >= lo and c + k < hi for k <= depth: every c in
            # [lo, hi - depth - 1] behaves alike, and (lo, s) stands for them
            st = int(tab.g_key[q, 0])
            c, s = int(tab.gs_d[st]), int(tab.gs_d[st + 1])
            lo, hi = int(tab.rlo[r]), int(tab.rhi[r])
            if c == lo or c < lo or c + depth >= hi or lo + depth >= hi:
                return q
            stat[1] += 1
            return self._run(K.state, r, np.array([lo, s], dtype=np.int32), 2)
        if stat[0] < 0:
            return q
        got = self._hrep_of.get((depth, q))
        if got is not None:
            return got
        start = _HORIZON_BUDGET * max(depth, 1)
        budget = [start]
        path = [q]
        rep = None
        pred = self.tab.g_pred
        try:
            x = q
            for _ in range(_HORIZON_HOPS):
                p = int(pred[x])
                if p < 0 or p in path or not self._heq(p, x, depth, depth, budget):
                    break
                rep = self._hrep_of.get((depth, p))
                if rep is not None:
                    break
                path.append(p)
                x = p
                pred = self.tab.g_pred  # the tables may have grown
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
            self._hrep_of[(depth, x)] = rep
        return rep

    def _may_skip(self, g: int) -> bool:
        """Whether a call of the rule starting at rule state ``g`` may return without
        consuming a byte."""
        got = self._nullable.get(g)
        if got is None:
            s = self._frame(ROOT, g)
            self._run(K.closure, s)
            got = self._nullable[g] = bool(self.tab.cl[s, 2])
        return got

    def _hlocal(self, q: int) -> tuple[bytes, tuple[int, ...], tuple[tuple[int, int], ...], bool]:
        """(byte labels in first-occurrence order, targets in that order (-1 dead), calls,
        accepting) of rule state ``q``; raises :class:`_HorizonAbort` at a call of a rule
        that may consume nothing."""
        got = self._hshape.get(q)
        if got is None:
            self._expand(q)
            tab = self.tab
            row = tab.g_row[q]
            c0, n = tab.g_call[q].tolist()
            calls = tuple((int(a), int(b)) for a, b in tab.calls[c0:c0 + n].tolist())
            acc = bool(tab.g_flag[q] & K.ACCEPT)
            for callee, _q2 in calls:
                if self._may_skip(callee):
                    raise _HorizonAbort  # a call that may consume nothing: no byte bound
            got = (*_row_shape(row), calls, acc)
            self._hshape[q] = got
        return got

    def _heq(self, p: int, q: int, need: int, slack: int, budget: list[int]) -> bool:
        """Whether rule states ``p`` and ``q`` (of one rule) agree on every input of at most
        ``need`` symbols. A pair not yet verified that deep is verified ``need + slack``
        deep (memoised per pair; differences memoised with the depth they show at)."""
        if p == q:
            return True
        key = (p, q)
        if self._hpair.get(key, -1) >= need:
            return True
        f = self._hfail.get(key)
        if f is not None and f <= need:
            return False
        need += slack
        budget[0] -= 1
        if budget[0] < 0:
            raise _HorizonAbort
        lp, tp, cp, ap = self._hlocal(p)
        lq, tq, cq, aq = self._hlocal(q)
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
                if not self._heq(a, b, need - 1, 0, budget):
                    fail = self._hfail[(a, b)] + 1
                    break
        if fail is not None:
            # a valid upper bound on the depth they differ at (exact where slack is 0)
            self._hfail[key] = min(fail, self._hfail.get(key, fail))
            if slack and fail > need - slack:  # they differ only deeper than asked: ask exactly
                return self._heq(p, q, need - slack, 0, budget)
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
        unknown = self.tab.rowdone[states] == 0
        if unknown.any():
            for c in np.unique(states[unknown]).tolist():
                self.fill_row(int(c))

    def _allowed_tokens(self, cid: int, vt: VocabTable) -> np.ndarray:
        """Token ids (original numbering) whose bytes can be consumed from ``cid``.

        Two vectorised strategies: where most bytes loop back to ``cid`` (string bodies and
        the like) the tokens made only of looping bytes are allowed outright and only the
        rest are walked byte by byte; elsewhere a level-by-level walk of the vocabulary's
        byte trie expands only children of live nodes, so restrictive states prune at once.
        """
        if cid < 0 or not self.tab.cf[cid, 1]:
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
        elif cid >= 0 and self.tab.cf[cid, 1]:
            self._native_walk(False, cid, vt, words, split=False)

    def _native_walk(self, gmode: bool, start: int, vt: VocabTable, words: np.ndarray,
                     split: bool) -> np.ndarray:
        """Compiled walk from ``start`` (a configuration, or with ``gmode`` a rule state of a
        call-free rule), first byte by first byte: where the state after a first byte can
        read the vocabulary's text slice whole, the slice's tokens with that first byte are
        accepted at once and only the others are walked (:func:`structgen.masks.trie.walk_sliced`).
        Returns the undecided ids of a ``split`` walk."""
        sl = vt.text_slice()
        if sl is not None:
            return native.walk_sliced(self, vt.trie(), sl, start, gmode, split, words)
        if gmode:
            self._expand(start)
            trans = self.tab.g_row
        else:
            self.fill_row(start)
            trans = self.tab.trans
        loops = trans[start] == start
        if int(loops.sum()) >= 32:
            return native.walk_loop_split(self, vt.trie(), start, gmode, loops, words, split)
        return native.walk_trie(self, vt.trie(), start, gmode, split, words)

    def _allowed_loop_split(self, cid: int, vt: VocabTable, loops: np.ndarray) -> np.ndarray:
        words = np.packbits(~loops, bitorder="little").view(np.uint64)  # [4] non-loop bytes
        impure = (vt.byte_bits & words).any(axis=1)  # [N] token has a non-looping byte
        return np.concatenate([vt.flat_ids[~impure],
                               self._walk_flat(cid, np.nonzero(impure)[0], vt)])

    def _allowed_trie(self, cid: int, vt: VocabTable) -> np.ndarray:
        return self._trie_walk(cid, vt, split=False)[0]

    # -- introspection -------------------------------------------------------------
    def memory_bytes(self) -> int:
        """Approximate bytes held by the runtime tables and the mask caches."""
        return int(self.tab.nbytes() + self.mask_cache.bytes + self.ci_cache.bytes
                   + 100 * (len(self._hshape) + len(self._hrep_of) + len(self._hpair) + len(self._hfail)))


class _ByteLru:
    """An LRU map bounded by the bytes of its values (the caller states each value's size;
    the newest entry always stays). Callers hold the engine lock around :meth:`put`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._d: OrderedDict[Any, tuple[Any, int]] = OrderedDict()

    def peek(self, key: Any) -> Any:
        """The value of ``key`` or None, without making it the most recently used."""
        hit = self._d.get(key)
        return None if hit is None else hit[0]

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

    def clear(self) -> None:
        self._d.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._d)

    def __iter__(self) -> Any:
        return iter(self._d)


def _account_release(acct: list[int]) -> None:
    """An engine was collected: its tables leave the process total."""
    _account(-acct[0])
    acct[0] = 0


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


def _json_text_automaton() -> np.ndarray:
    """The bytes of JSON string content without escapes: complete, well-formed UTF-8
    characters other than ``"``, ``\\`` and the C0 controls (int8 ``[8, 256]``: state 0 =
    between characters, -1 = no edge): UTF-8 (:data:`structgen.grammar._pda_kernels.UTF8`) less
    those ASCII bytes."""
    pd = K.UTF8.copy()
    pd[0, 0x00:0x20] = -1
    pd[0, 0x22] = pd[0, 0x5C] = -1
    return pd


_SLICE_DEPTH = 24  # the text slice: tokens of at most this many bytes
_SLICE_BUDGET = 512  # (state, slice state) pairs one slice check may visit
_SLICE_WIDTH = 48  # ... and at one depth
_SLICE_NODES = 24  # descendants a trie node needs for a slice check
_SLICE_LOCK = threading.Lock()


class _Slice:
    """The text slice of a vocabulary: the tokens of at most ``depth`` bytes that are plain
    JSON text (``pd``, :func:`_json_text_automaton`; the last character may be cut), as
    ``sids`` in the order of the full trie's slots (``sps[k]``: how many of them precede
    slot ``k``, so a subtree's slice tokens are one range), and ``trie``, the trie of every
    *other* token (``cnode``: the node of each full-trie node's path in it, or -1). From a
    state that can read every plain text of up to ``depth`` bytes
    (:func:`structgen.grammar._pda_kernels.slice_from`), a node's slice tokens are all accepted,
    and only its subtree in ``trie`` needs a walk
    (:func:`structgen.grammar._pda_kernels.walk_sliced`); ``ktrie`` / ``knode``: the same without
    the tokens of plain text then a control byte, for states that reject those."""

    __slots__ = ("depth", "pd", "sps", "sids", "trie", "cnode", "ktrie", "knode", "size")

    def __init__(self, depth: int, pd: np.ndarray, sps: np.ndarray, sids: np.ndarray, trie: native.Trie,
                 cnode: np.ndarray, ktrie: native.Trie, knode: np.ndarray) -> None:
        self.depth, self.pd, self.sps, self.sids, self.trie = depth, pd, sps, sids, trie
        self.cnode, self.ktrie, self.knode, self.size = cnode, ktrie, knode, int(sids.size)


_TEXT_PD = _json_text_automaton()


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
        self._slice: _Slice | bool | None = None

    def trie(self) -> native.Trie:
        """The depth-first trie for the compiled walks (built on first use, shared per vocabulary)."""
        if self._trie is None:
            self._trie = native.trie_for(self.key, self.token_bytes, self.vocab_size)
        return self._trie

    def text_slice(self) -> _Slice | None:
        """The vocabulary's text slice (see :class:`_Slice`), built on first use (once per
        vocabulary, shared); None without compiled walks or when the slice would be small."""
        if self._slice is None:
            with _SLICE_LOCK:
                if self._slice is None:
                    self._slice = self._build_slice() or False
        return self._slice or None

    def _build_slice(self) -> _Slice | None:
        if not self.num_tokens or not native.available():
            return None
        pd = _TEXT_PD
        # run the slice automaton over every token (column by column): in the slice iff
        # no edge is missing (a token may end inside a character: a slice check reads every
        # path of the automaton, complete characters or not)
        # it ends in state 0 without a missing edge; ``killed``: plain text of fewer than
        # ``depth`` bytes, then a C0 control byte
        st = np.zeros(self.num_tokens, dtype=np.int64)
        killed = np.zeros(self.num_tokens, dtype=bool)
        for j in range(self.max_len):
            act = np.nonzero((self.flat_lens > j) & (st >= 0))[0]
            col = self.matrix[act, j]
            nxt = pd[st[act], col]
            if j < _SLICE_DEPTH - 1:
                killed[act[(nxt < 0) & (st[act] == 0) & (col < 0x20)]] = True
            st[act] = nxt
        sel = (st >= 0) & (self.flat_lens <= _SLICE_DEPTH)
        if int(sel.sum()) < self.num_tokens // 4:
            return None  # too small a slice to pay for a second trie
        ids = self.flat_ids[sel]
        inside = np.zeros(self.vocab_size, dtype=bool)
        inside[ids] = True
        rest = list(self.token_bytes)
        for t in ids.tolist():
            rest[t] = None
        full = self.trie()
        trie = native.trie_for((self.key, "text-slice", _SLICE_DEPTH), rest, self.vocab_size)
        for t in self.flat_ids[killed].tolist():
            rest[t] = None
        ktrie = native.trie_for((self.key, "text-slice-killed", _SLICE_DEPTH), rest, self.vocab_size)
        in_slot = inside[full.slot_ids]
        sps = np.zeros(in_slot.size + 1, dtype=np.int64)
        np.cumsum(in_slot, out=sps[1:])
        sids = np.ascontiguousarray(full.slot_ids[in_slot], dtype=np.int64)
        return _Slice(_SLICE_DEPTH, pd, sps, sids, trie, native.match_nodes(full, trie), ktrie,
                      native.match_nodes(full, ktrie))

