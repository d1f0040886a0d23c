"""The byte-level runtime of a compiled grammar: a lazily determinised pushdown automaton.

A *stack* is an interned chain of frames ``(parent, rule state)``; the top frame's rule
state is where that rule's DFA currently is, lower frames hold return states. A
*configuration* is the set of stacks the parse may be in (more than one when the grammar
is ambiguous or a call and a byte edge compete), closed under calls and returns, keeping
only stacks whose top state has byte edges; plus a flag saying whether the whole input
may end here.

Rule states ``(rule, DFA state)``, stacks and configurations are interned to small
integers in flat arrays, and the byte transition function between configurations is
tabulated in ``trans`` (int32 ``[capacity, 256]``: -2 unknown, -1 dead), filled one entry or
one row at a time on first use. All of that runs in compiled code
(:mod:`structgen.grammar._runtime_kernels`, :mod:`structgen.grammar._stack_kernels`); Python
only drives it. Stepping a byte string is one table lookup per byte. The runtime knows no
tokenizer: token masks are walks of a vocabulary's byte trie through ``trans``, done by
:mod:`structgen.masks.engine`, which keeps its per-grammar state in the runtime's
:attr:`Runtime.masks` slot and clears it through :attr:`Runtime.on_flush`.

One Runtime is shared by every matcher of a grammar (:attr:`CompiledGrammar.engine
<structgen.grammar.compiled.CompiledGrammar.engine>`); a lock guards growth of the tables.

Memory is bounded. The lazily built tables (rule states, stacks, configurations and their
transition rows) are *flushed* when they would outgrow the runtime's ``table_budget`` (bytes,
default :data:`DEFAULT_TABLE_BYTES`), or the tables of all runtimes together would outgrow
:data:`PROCESS_TABLE_BYTES`: everything is dropped and rebuilt on demand, as RE2's and Rust
regex's lazy DFAs clear their state cache when it is full, so answers stay exact (a flush
costs time, never correctness). Configurations still in use -- the start, the one a walk
is at, and every live matcher's history -- are carried over by content (their stacks of
rule states, keyed by NFA state sets) and given new ids: each flush starts a new
*epoch*, and a matcher translates its history to the current epoch before its next step.
Flushes happen only at safe points (a walk about to compute a new transition, a mask about
to be computed), once the tables are past half the budget, so that their growth (by
doubling) stays within it. :func:`set_table_budget` changes the defaults.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, SupportsInt, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from structgen.errors import ConfigError
from structgen.grammar import _runtime_kernels as K
from structgen.grammar import _stack_kernels as S
from structgen.grammar.fsa import joined_nfa_arrays
from structgen.grammar.gcpause import gc_paused
from structgen.grammar.growth import SPARE_MIN_BYTES, Reservations, Spares

if TYPE_CHECKING:  # pragma: no cover
    from structgen.grammar.compiled import CompiledGrammar, Rule
    from structgen.grammar.completion import CompletionLengths

__all__ = ["Runtime", "RuntimeTables", "DEAD", "UNKNOWN", "STALE", "ROOT", "NEED_GROW", "COUNTED", "ACCEPT",
           "set_table_budget", "check_budget", "env_bytes", "warm_kernels", "DEFAULT_TABLE_BYTES",
           "PROCESS_TABLE_BYTES"]

DEAD = K.DEAD
UNKNOWN = K.UNKNOWN
NEED_GROW = K.NEED_GROW
COUNTED = K.COUNTED  # rule kind of a counted repetition (RuntimeTables.rkind)
ACCEPT = K.ACCEPT  # rule-state flag: the rule may return here (RuntimeTables.g_flag)
STALE = -7  # walk: the tables were flushed by another thread meanwhile; redo it under the lock
ROOT = 0  # the empty stack

_G = TypeVar("_G", bound=np.generic)

#: A configuration by content (:meth:`Runtime.describe`): (accepting, its stacks, each the
#: frames bottom first, each frame (rule, rule-state key)).
Described: TypeAlias = tuple[bool, tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]]


class HistoryHolder(Protocol):
    """What :meth:`Runtime.register` tracks (a matcher): configuration ids ``_hist``, valid in
    epoch ``_epoch``."""

    _hist: list[int]
    _epoch: int


def env_bytes(name: str, default: int) -> int:
    """The byte count in environment variable ``name`` (clamped at 0), or ``default`` when it
    is unset or not an integer."""
    raw = os.environ.get(name, "")
    try:
        return max(int(raw), 0) if raw.strip() else default
    except ValueError:
        return default


#: Per-runtime budget of the lazily built tables (bytes; ``STRUCTGEN_TABLE_BYTES``).
DEFAULT_TABLE_BYTES = env_bytes("STRUCTGEN_TABLE_BYTES", 256 << 20)
#: Budget of the tables of all runtimes of the process together (``STRUCTGEN_PROCESS_TABLE_BYTES``):
#: past it, a runtime that grows flushes its own tables if they hold at least a sixteenth of it.
PROCESS_TABLE_BYTES = env_bytes("STRUCTGEN_PROCESS_TABLE_BYTES", 1 << 30)

_PROCESS_LOCK = threading.Lock()
_process_bytes = [0]  # table bytes of every live runtime


def set_table_budget(*, table_bytes: int | None = None, process_table_bytes: int | None = None) -> None:
    """Change the table budget (bytes) of runtimes created from now on (``table_bytes``) and of
    the whole process (``process_table_bytes``, effective at once). An existing runtime's
    budget is its attribute ``table_budget``. Raises :class:`~structgen.errors.ConfigError`
    for a value that is not an integer >= 0 (nothing is changed then)."""
    global DEFAULT_TABLE_BYTES, PROCESS_TABLE_BYTES
    check_budget(table_bytes=table_bytes, process_table_bytes=process_table_bytes)
    if table_bytes is not None:
        DEFAULT_TABLE_BYTES = table_bytes
    if process_table_bytes is not None:
        PROCESS_TABLE_BYTES = process_table_bytes


def check_budget(**values: int | None) -> None:
    """Raise :class:`~structgen.errors.ConfigError` for the first of ``values`` (name = bytes)
    that is neither None nor an integer >= 0."""
    for name, v in values.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ConfigError(f"{name} must be an integer >= 0, not {v!r}", key=name)


def _account(delta: int) -> None:
    with _PROCESS_LOCK:
        _process_bytes[0] += delta


def _grown(a: NDArray[_G], rows: int, fill: int | None, into: NDArray[_G] | None = None) -> NDArray[_G]:
    """``a`` with ``rows`` rows, the new ones set to ``fill`` (left unwritten when ``fill`` is
    None: rows the kernels initialise when they intern the row's state, so that fresh pages
    are first touched as rows come into use, not all at once here). ``into``: an array of
    that shape made ahead (:class:`~structgen.grammar.growth.Spares`), already filled."""
    b = np.empty((rows,) + a.shape[1:], dtype=a.dtype) if into is None else into
    b[: a.shape[0]] = a
    if fill is not None and into is None:
        b[a.shape[0]:] = fill
    return b


def _rule_arrays(rules: tuple[Rule, ...]) -> dict[str, NDArray[np.generic]]:
    """The fixed rule part of the kernel tables (see :mod:`structgen.grammar._runtime_kernels`)."""
    nr = len(rules)
    kind = np.zeros(nr, dtype=np.int8)
    base = np.zeros(nr, dtype=np.int64)
    aux = np.full(nr, -1, dtype=np.int64)
    cls = np.zeros((nr, 256), dtype=np.int32)
    ncls = np.zeros(nr, dtype=np.int32)
    end = np.full(nr, -1, dtype=np.int32)
    lo = np.zeros(nr, dtype=np.int64)
    hi = np.zeros(nr, dtype=np.int64)
    tb_l: list[npt.ArrayLike] = []
    acc_l: list[npt.ArrayLike] = []
    nx = 0  # NFA states so far
    nt = 0  # table rows so far

    def table(t: NDArray[np.int32], a: NDArray[np.bool_]) -> int:
        nonlocal nt
        at = nt
        tb_l.append(np.asarray(t, dtype=np.int32))
        acc_l.append(np.asarray(a, dtype=np.uint8))
        nt += t.shape[0]
        return at

    lazy = [rule for rule in rules if rule.kind == "lazy"]
    for r, rule in enumerate(rules):
        if rule.kind == "lazy":
            kind[r] = K.LAZY
            base[r] = nx
            ncls[r] = rule._nclass
            cls[r] = rule._class_of
            end[r] = nx + rule._end
            nx += rule.csr().important.shape[0]
        elif rule.kind == "counted":
            kind[r] = K.COUNTED
            base[r] = table(rule._trans, rule._accept)
            lo[r], hi[r] = rule.lo, rule.hi
        elif rule.kind == "dfa":
            kind[r] = K.TABLE
            base[r] = table(rule._trans, rule._accept)
        else:  # ProductRule
            kind[r] = K.PRODUCT
            base[r] = table(rule._a.trans, rule._a.accept)
            aux[r] = table(rule._b.trans, rule._b.accept)

    def cat(parts: Sequence[npt.ArrayLike], shape: tuple[int, ...], dtype: type[_G]) -> NDArray[_G]:
        if len(parts) == 1:  # the kernels only read these tables: one rule's own array will do
            one = np.ascontiguousarray(parts[0], dtype=dtype)
            return one if one.flags.writeable else one.copy()  # (the kernels' types are writable)
        out = np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(shape, dtype=dtype)
        return np.ascontiguousarray(out)

    # every lazy rule's NFA in one set of arrays, states numbered on from rule to rule
    eo, eps, do, edges, co, calls, important = joined_nfa_arrays([rule.csr() for rule in lazy])
    return {
        "rule_kind": kind, "rule_base": base, "rule_aux": aux, "rule_class": cls, "rule_nclasses": ncls,
        "rule_end": end, "rule_start": np.full(nr, -1, dtype=np.int32), "rule_lo": lo, "rule_hi": hi,
        "nfa_eps_off": eo, "nfa_eps": eps, "nfa_edge_off": do, "nfa_edges": edges,
        "nfa_call_off": co, "nfa_calls": calls, "nfa_important": important,
        "table_trans": cat(tb_l, (0, 256), np.int32), "table_accept": cat(acc_l, (0,), np.uint8),
    }


class RuntimeTables:
    """The arrays behind the runtime kernels (layout in :mod:`structgen.grammar._runtime_kernels`)
    and their growth. ``T`` is the compiled object the kernels take; it is rebuilt whenever an
    array grows."""

    # (name, initial rows, fill, extra dims, dtype): row-indexed tables grow together per group
    _GROUPS = {
        "state": (K.N_STATES, 256, [
            ("state_trans", UNKNOWN, (256,), np.int32), ("state_flags", 0, (), np.uint8),
            ("state_calls", 0, (2,), np.int32), ("state_rule", -1, (), np.int32),
            ("state_key", 0, (2,), np.int32), ("state_pred", -1, (), np.int32),
            ("state_accepting", False, (), bool), ("state_loop_bytes", 0, (4,), np.uint64),
            ("state_loops_known", 0, (), np.uint8), ("state_slice_memo", -1, (8,), np.int8),
            ("state_utf8_memo", -1, (), np.int8)]),
        "frame": (K.N_FRAMES, 1024, [
            ("frames", -1, (2,), np.int32), ("closures", 0, (3,), np.int32),
            ("stack_config", UNKNOWN, (), np.int32)]),
        "config": (K.N_CONFIGS, 256, [
            ("configs", 0, (3,), np.int32), ("trans", UNKNOWN, (256,), np.int32),
            ("accepting", False, (), bool), ("loop_bytes", 0, (4,), np.uint64),
            ("loop_known", 0, (4,), np.uint64), ("row_done", 0, (), np.uint8),
            ("slice_memo", -1, (8,), np.int8), ("utf8_memo", -1, (), np.int8)]),
    }
    # the 1 KiB rows of rule states and configurations, written whole when each is interned
    # (the kernels' state and config interning): grown without a fill
    _LAZY_ROWS = frozenset({"state_trans", "trans"})
    # data arrays (name, used-counter slot, initial size, columns)
    _DATA = [("call_targets", K.N_CALLS, 256, (2,)), ("closure_data", K.N_CLOSURE_DATA, 4096, ()),
             ("config_data", K.N_CONFIG_DATA, 4096, ()), ("nfa_closure_data", K.N_NFA_CLOSURE_DATA, 4096, ()),
             ("state_key_data", K.N_STATE_KEY_DATA, 4096, ())]
    # each group's open-addressing index: <prefix>_hash_keys, <prefix>_hash_ids
    _HASHES = {"state": "state", "frame": "frame", "config": "config"}

    # the arrays: the kernels' fields (:data:`~structgen.grammar._runtime_kernels.FIELD_NAMES`)
    counters: NDArray[np.int64]
    rule_kind: NDArray[np.int8]
    rule_base: NDArray[np.int64]
    rule_aux: NDArray[np.int64]
    rule_class: NDArray[np.int32]
    rule_nclasses: NDArray[np.int32]
    rule_end: NDArray[np.int32]
    rule_start: NDArray[np.int32]
    rule_lo: NDArray[np.int64]
    rule_hi: NDArray[np.int64]
    nfa_eps_off: NDArray[np.int32]
    nfa_eps: NDArray[np.int32]
    nfa_edge_off: NDArray[np.int32]
    nfa_edges: NDArray[np.int32]
    nfa_call_off: NDArray[np.int32]
    nfa_calls: NDArray[np.int32]
    nfa_important: NDArray[np.uint8]
    nfa_closure: NDArray[np.int32]
    nfa_closure_data: NDArray[np.int32]
    table_trans: NDArray[np.int32]
    table_accept: NDArray[np.uint8]
    state_trans: NDArray[np.int32]
    state_flags: NDArray[np.uint8]
    state_calls: NDArray[np.int32]
    call_targets: NDArray[np.int32]
    state_rule: NDArray[np.int32]
    state_key: NDArray[np.int32]
    state_key_data: NDArray[np.int32]
    state_hash_keys: NDArray[np.int64]
    state_hash_ids: NDArray[np.int32]
    state_pred: NDArray[np.int32]
    state_accepting: NDArray[np.bool_]
    state_loop_bytes: NDArray[np.uint64]
    state_loops_known: NDArray[np.uint8]
    state_slice_memo: NDArray[np.int8]
    state_utf8_memo: NDArray[np.int8]
    frames: NDArray[np.int32]
    frame_hash_keys: NDArray[np.int64]
    frame_hash_ids: NDArray[np.int32]
    closures: NDArray[np.int32]
    closure_data: NDArray[np.int32]
    stack_config: NDArray[np.int32]
    configs: NDArray[np.int32]
    config_data: NDArray[np.int32]
    config_hash_keys: NDArray[np.int64]
    config_hash_ids: NDArray[np.int32]
    trans: NDArray[np.int32]
    accepting: NDArray[np.bool_]
    loop_bytes: NDArray[np.uint64]
    loop_known: NDArray[np.uint64]
    row_done: NDArray[np.uint8]
    slice_memo: NDArray[np.int8]
    utf8_memo: NDArray[np.int8]
    T: K.Tables  # the compiled object holding them all

    def __init__(self, rules: tuple[Rule, ...], budget_bytes: int = 0) -> None:
        """``budget_bytes``: the runtime's table budget, up to which a lazily written table may
        reserve address space (:func:`~structgen.grammar.growth.reserve`); 0: none."""
        self.counters = np.zeros(16, dtype=np.int64)
        self.reservations = Reservations(budget_bytes)
        for k, v in _rule_arrays(rules).items():
            setattr(self, k, v)
        self.nfa_closure = np.zeros((self.nfa_important.shape[0], 2), dtype=np.int32)
        self.nfa_closure[:, 1] = -1
        for grp, (_slot, rows, cols) in self._GROUPS.items():
            for name, fill, dims, dt in cols:
                if name in self._LAZY_ROWS:  # rows written whole when interned: no fill
                    setattr(self, name, np.empty((rows,) + dims, dtype=dt))
                else:
                    setattr(self, name, np.full((rows,) + dims, fill, dtype=dt))
            self._new_hash(grp, 2 * rows)
        self.closures[:, 1] = -1
        for name, _slot, size, dims in self._DATA:
            setattr(self, name, np.zeros((size,) + dims, dtype=np.int32))
        self.counters[K.N_FRAMES] = 1
        self.spares = Spares()
        self._set_triggers()
        self._pack()

    def _set_triggers(self) -> None:
        """Per group: the row count at which :meth:`prepare_growth` makes room for its next
        doubling (half its rows: one walk may intern thousands of rows, and the room, faulted
        in on another core, must be ready before the 7/8 that doubles it), when that room is
        big enough to be worth it."""
        self._triggers: list[tuple[int, int, str]] = []
        for grp, (slot, _rows, cols) in self._GROUPS.items():
            cap = getattr(self, cols[0][0]).shape[0]
            if 2 * sum(getattr(self, c[0]).nbytes for c in cols if not self._reserved_at(c[0], 2 * cap)) \
                    >= SPARE_MIN_BYTES:
                self._triggers.append((slot, cap // 2, grp))

    def _reserved_at(self, name: str, cap: int) -> bool:
        """Whether a doubling to ``cap`` rows takes table ``name`` as a wider view of its
        reservation (:class:`~structgen.grammar.growth.Reservations`), not a copy."""
        return name in self._LAZY_ROWS and self.reservations.covers(name, getattr(self, name), cap)

    def prepare_growth(self) -> None:
        """Make room ahead, on a background thread, for the next doubling of every group of
        tables at least half full (cheap to call often: a few counter reads)."""
        if not self._triggers:
            return
        item = self.counters.item
        due = [t for t in self._triggers if item(t[0]) >= t[1]]
        if not due:
            return
        for t in due:
            cols = self._GROUPS[t[2]][2]
            cap = 2 * getattr(self, cols[0][0]).shape[0]
            wanted = [(name, (cap,) + dims, np.dtype(dt), None if name in self._LAZY_ROWS else fill)
                      for name, fill, dims, dt in cols if not self._reserved_at(name, cap)]
            if self.spares.prepare(t[2], wanted):
                self._triggers.remove(t)

    def _new_hash(self, grp: str, size: int) -> None:
        h = self._HASHES[grp]
        setattr(self, h + "_hash_keys", np.full(size, -1, dtype=np.int64))
        setattr(self, h + "_hash_ids", np.zeros(size, dtype=np.int32))

    def arrays(self) -> list[NDArray[np.generic]]:
        """Every table array, in the order of the kernels' fields."""
        return [getattr(self, f) for f in K.FIELD_NAMES]

    def _pack(self) -> None:
        self.T = K.make_tables(*self.arrays())

    def grow(self) -> None:
        """After NEED_GROW: double every row table that is at least 7/8 full (the one a
        kernel found full among them; a table's hash index has twice its rows, so it stays
        at most half full), and every data array short of the room a kernel asked for."""
        m = self.counters
        want = int(m[K.WANT_ROOM])
        for name, slot, _size, _dims in self._DATA:
            a = getattr(self, name)
            used = int(m[slot])
            if used + want > a.shape[0] or 2 * used >= a.shape[0]:
                setattr(self, name, _grown(a, max(2 * a.shape[0], 2 * (used + want)), 0))
        m[K.WANT_ROOM] = 0
        for grp, (slot, _rows, cols) in self._GROUPS.items():
            n = int(m[slot])
            cap = getattr(self, cols[0][0]).shape[0]
            if 8 * n < 7 * cap:
                continue
            cap *= 2
            self.spares.wait(grp)
            for name, fill, dims, dt in cols:
                lazy = name in self._LAZY_ROWS
                view = self.reservations.widen(name, getattr(self, name), cap) if lazy else None
                if view is not None:
                    setattr(self, name, view)
                    continue
                spare = self.spares.take(name, (cap,) + dims, np.dtype(dt))
                setattr(self, name, _grown(getattr(self, name), cap, None if lazy else fill, spare))
            self._new_hash(grp, 2 * cap)
            if grp == "frame":
                K.rehash_frames(self.frames, n, self.frame_hash_keys, self.frame_hash_ids)
            elif grp == "config":
                K.rehash_seqs(self.configs[:, 2].copy(), self.configs[:, :2].copy(), self.config_data, n,
                              self.config_hash_keys, self.config_hash_ids)
            else:
                K.rehash_seqs(self.state_rule.copy(), self.state_key, self.state_key_data, n,
                              self.state_hash_keys, self.state_hash_ids)
        self._set_triggers()
        self._pack()

    def nbytes(self) -> int:
        """Bytes held by the table arrays and the room made ahead for their growth."""
        return int(sum(a.nbytes for a in self.arrays())) + self.spares.nbytes()


class Runtime:
    """The byte-level runtime of one compiled grammar (thread-safe, grows lazily).

    Configuration ids are valid within one :attr:`epoch` (a flush renumbers them, see the
    module docstring). ``masks`` is a slot for the token-mask layer
    (:mod:`structgen.masks.engine`), which this module never imports; ``on_flush`` holds
    callables run (holding :attr:`lock`) after every flush, before the start configuration
    is interned again, so that state keyed by table ids is dropped with the tables.
    """

    def __init__(self, grammar: CompiledGrammar, *, table_bytes: int | None = None) -> None:
        self.grammar = grammar
        self.rules = grammar.rules
        self.lock = threading.RLock()
        #: flush the tables past this many bytes (see the module docstring)
        self.table_budget = DEFAULT_TABLE_BYTES if table_bytes is None else int(table_bytes)
        with gc_paused():
            self.tab = RuntimeTables(self.rules, self.table_budget)
        self.epoch = 0  # flushes so far: configuration ids are valid within one epoch
        self.flushes = 0
        self._fresh_bytes = self._table_bytes = self.tab.nbytes()
        self._acct = [self._table_bytes]  # this runtime's share of the process total
        _account(self._table_bytes)
        weakref.finalize(self, _account_release, self._acct)
        # matchers whose histories hold configuration ids (translated after a flush)
        self._holders: weakref.WeakSet[HistoryHolder] = weakref.WeakSet()
        # per past epoch: configuration id -> content, for the histories not yet translated
        self._described: dict[int, dict[int, Described]] = {}
        self.masks: object = None  # the token-mask engine of this grammar, set by structgen.masks
        self.on_flush: list[Callable[[], None]] = []
        #: shortest-completion lengths, set by :func:`structgen.grammar.completion.completion_lengths`
        self.completion_lengths: CompletionLengths | None = None
        with self.lock:
            g0 = self.run_kernel(K.start_state, grammar.root)
            self.start = self.closure_config(self.frame(ROOT, g0))

    def run_kernel(self, fn: Callable[..., SupportsInt], *args: object) -> int:
        """``fn(tables, *args)`` (a table kernel), called again after growing the tables for
        as long as it answers NEED_GROW (hold :attr:`lock`)."""
        while True:
            r = int(fn(self.tab.T, *args))
            if r != K.NEED_GROW:
                return r
            self._grow()

    def service(self, status: int) -> None:
        """Grow the tables after a resumable kernel answered ``status`` (NEED_GROW; the caller
        then resumes it). Hold :attr:`lock`."""
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

    def register(self, holder: HistoryHolder) -> None:
        """Track ``holder`` (a matcher: ``_hist`` a list of configuration ids valid in epoch
        ``_epoch``) so that a flush keeps what it needs to translate them."""
        self._holders.add(holder)

    def describe(self, cid: int) -> Described:
        """Configuration ``cid`` by content, independent of table ids: (accepting, stacks),
        each stack its frames bottom first, each frame (rule, rule-state key)."""
        tab = self.tab
        st, n, acc = (int(x) for x in tab.configs[cid])
        stacks = []
        fr, g_rule, g_key, gs_d = tab.frames, tab.state_rule, tab.state_key, tab.state_key_data
        for s in tab.config_data[st:st + n].tolist():
            chain = []
            while s != ROOT:
                parent, g = int(fr[s, 0]), int(fr[s, 1])
                k0, kn = int(g_key[g, 0]), int(g_key[g, 1])
                chain.append((int(g_rule[g]), tuple(gs_d[k0:k0 + kn].tolist())))
                s = parent
            stacks.append(tuple(reversed(chain)))
        return bool(acc), tuple(stacks)

    def intern_described(self, desc: Described) -> int:
        """The configuration id of a :meth:`describe` result in the current tables."""
        acc, stacks = desc
        sids = set()
        for chain in stacks:
            s = ROOT
            for r, key in chain:
                g = self.run_kernel(K.state, r, np.array(key, dtype=np.int32), len(key))
                s = self.run_kernel(S.frame, s, g)
            sids.add(s)
        buf = np.array(sorted(sids), dtype=np.int32)
        return self.run_kernel(S.config, buf, len(buf), acc)

    def flush(self, pins: tuple[int, ...] = ()) -> tuple[int, ...]:
        """Drop every lazily built table and cache (hold the lock); returns the ids of the
        configurations ``pins`` in the new tables. The start configuration is carried over;
        live matchers' histories are described, to be translated by each matcher
        (:meth:`translate`) before its next step. Runs the :attr:`on_flush` hooks."""
        old_epoch = self.epoch
        self.epoch = old_epoch + 1  # first: a step racing with this flush sees it
        self.flushes += 1
        keep = {c for c in pins if c >= 0}
        keep.add(self.start)
        desc: dict[int, Described] = {}
        live_epochs = set()
        for h in list(self._holders):
            ep = h._epoch
            live_epochs.add(ep)
            if ep == old_epoch:
                for c in list(h._hist):
                    if c >= 0 and c not in desc:
                        desc[c] = self.describe(c)
        for c in keep:
            if c not in desc:
                desc[c] = self.describe(c)
        self._described = {e: d for e, d in self._described.items() if e in live_epochs}
        self._described[old_epoch] = desc
        with gc_paused():
            self.tab = RuntimeTables(self.rules, self.table_budget)
        n = self.tab.nbytes()
        _account(n - self._acct[0])
        self._acct[0] = self._table_bytes = self._fresh_bytes = n
        for hook in self.on_flush:
            hook()
        self.start = self.intern_described(desc[self.start])
        return tuple(self.intern_described(desc[c]) if c >= 0 else c for c in pins)

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
                got = memo[c] = self.intern_described(desc[c])
            out.append(got)
        return out

    # -- rule states, stacks and configurations -------------------------------------------
    def expand(self, g: int) -> None:
        """Compute rule state ``g``'s transitions, calls and flags if not yet known (hold :attr:`lock`)."""
        if not self.tab.state_flags[g] & K.EXPANDED:
            self.run_kernel(K.expand, g)

    def frame(self, parent: int, g: int) -> int:
        """The stack id of frame (``parent`` stack, rule state ``g``), interned (hold :attr:`lock`)."""
        return self.run_kernel(S.frame, parent, g)

    def closure_config(self, sid: int) -> int:
        """The configuration of stack ``sid``'s closure under calls and returns (DEAD when
        empty), interned (hold :attr:`lock`)."""
        return self.run_kernel(S.closure_config, sid)

    def intern_state(self, rule: int, key: NDArray[np.int32]) -> int:
        """The rule-state id of rule ``rule``'s state with key ``key`` (int32; its layout
        depends on the rule kind, see :mod:`structgen.grammar._runtime_kernels`), interned
        but not expanded (hold :attr:`lock`)."""
        return self.run_kernel(K.state, rule, key, len(key))

    def stack_of_chain(self, chain: NDArray[np.int64]) -> int:
        """The stack of rule states ``chain`` (int64, bottom first) above the empty stack,
        interned (hold :attr:`lock`)."""
        return self.run_kernel(S.stack_of_chain, chain, len(chain))

    def closure_accepts(self, sid: int) -> bool:
        """Whether stack ``sid`` may return to the empty stack without consuming a byte (its
        closure is computed first; hold :attr:`lock`)."""
        self.run_kernel(S.closure, sid)
        return bool(self.tab.closures[sid, 2])

    def stacks(self, cid: int) -> list[int]:
        """The stack ids of configuration ``cid``."""
        cf = self.tab.configs
        st, n = int(cf[cid, 0]), int(cf[cid, 1])
        ids: list[int] = self.tab.config_data[st:st + n].tolist()
        return ids

    def rule_of(self, g: int) -> int:
        """The rule index of rule state ``g``."""
        return int(self.tab.state_rule[g])

    @property
    def trans(self) -> NDArray[np.int32]:
        """The byte transitions of the configurations (int32 ``[capacity, 256]``; -2 unknown,
        -1 dead). Replaced when the tables grow or flush: read it afresh after either."""
        return self.tab.trans

    @property
    def accepting(self) -> NDArray[np.bool_]:
        """Whether each configuration may end the input (bool ``[capacity]``)."""
        return self.tab.accepting

    @property
    def num_configs(self) -> int:
        """Configurations interned in the current epoch."""
        return int(self.tab.counters[K.N_CONFIGS])

    @property
    def num_rule_states(self) -> int:
        """Rule states interned in the current epoch."""
        return int(self.tab.counters[K.N_STATES])

    def is_accepting(self, cid: int) -> bool:
        """Whether configuration ``cid`` (False for a negative id) may end the input."""
        acc = self.tab.accepting
        return 0 <= cid < acc.shape[0] and bool(acc[cid])

    def fill_row(self, cid: int) -> None:
        """Compute ``trans[cid, :]`` (all 256 bytes) if not yet known (entries are otherwise
        computed one at a time, on first use)."""
        if self.tab.row_done[cid]:
            return
        with self.lock:
            self.run_kernel(S.fill_row, cid)

    def step(self, cid: int, b: int) -> int:
        """The configuration after byte ``b`` from ``cid`` (DEAD if rejected); never flushes."""
        v = int(self.tab.trans[cid, b])
        if v == UNKNOWN:
            with self.lock:
                v = self.run_kernel(S.succ, cid, b)
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
        item = self.tab.trans.item  # Python ints, not numpy scalars: cheaper to compare
        if self.epoch != ep:
            return STALE
        for b in data:
            if cid < 0:
                return DEAD
            v = item(cid, b)
            if v == UNKNOWN:
                with self.lock:
                    if self.epoch != ep:
                        return STALE
                    if self._table_bytes > self._fresh_bytes and self.over_budget():
                        (cid,) = self.flush((cid,))
                        ep = self.epoch
                    v = int(self.run_kernel(S.succ, cid, b))
                item = self.tab.trans.item
            cid = v
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
                        (cid,) = self.flush((cid,))
                        ep = self.epoch
                    v = self.run_kernel(S.succ, cid, b)
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

    def live_bytes(self, cid: int) -> NDArray[np.intp]:
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

    def memory_bytes(self) -> int:
        """Bytes held by the runtime's tables."""
        return int(self.tab.nbytes())


def warm_kernels(tab: RuntimeTables) -> tuple[int, int]:
    """Run every runtime kernel once on ``tab`` (the fresh tables of a small grammar whose root
    rule is rule 0 and reads byte ``b``), so that loading them from numba's disk cache (or
    compiling them, the first time ever) happens here and not inside the first step that needs
    each. Returns (the root rule's start state, its start configuration), for warming the
    kernels built on top (the token walks)."""
    g = int(K.start_state(tab.T, 0))
    K.expand(tab.T, g)
    s = int(S.frame(tab.T, 0, g))
    c = int(S.closure_config(tab.T, s))
    S.closure(tab.T, s)
    S.fill_row(tab.T, c)
    S.succ(tab.T, c, 98)
    S.stack_of_chain(tab.T, np.array([g], dtype=np.int64), 1)
    K.state(tab.T, 0, np.zeros(2, dtype=np.int32), 2)
    hash_keys, hash_ids = np.full(64, -1, np.int64), np.zeros(64, np.int32)
    K.rehash_frames(tab.frames, int(tab.counters[K.N_FRAMES]), hash_keys, hash_ids)
    hash_keys[:] = -1
    K.rehash_seqs(tab.state_rule.copy(), tab.state_key, tab.state_key_data, int(tab.counters[K.N_STATES]),
                  hash_keys, hash_ids)
    return g, c


def _account_release(acct: list[int]) -> None:
    """A runtime was collected: its tables leave the process total."""
    _account(-acct[0])
    acct[0] = 0
