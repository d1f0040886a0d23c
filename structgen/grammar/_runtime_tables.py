"""The runtime tables as one object a kernel takes (layout: :mod:`structgen.grammar._runtime_kernels`,
which builds it with ``make_tables``).

:data:`FIELD_NAMES` are the arrays, in order; :func:`field_types` their numba types (the fields
of the compiled structref); :class:`Tables` is how the kernels and their callers see the
bundle, compiled or a plain namespace object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from structgen.grammar._jit import B1, I8, I32, I64, U8, U64

if TYPE_CHECKING:
    from numba.types import Type as NumbaType

__all__ = ["FIELD_NAMES", "Tables", "field_types"]


def field_types() -> list[tuple[str, NumbaType]]:
    """The table fields, in order (see RuntimeTables in structgen/grammar/runtime.py): name,
    numba type."""
    from numba import types as nt

    i8, i32, i64, u8, u64, b1 = nt.int8, nt.int32, nt.int64, nt.uint8, nt.uint64, nt.boolean

    def v(t: NumbaType) -> NumbaType:  # C-contiguous 1-d
        return t[::1]

    def m(t: NumbaType) -> NumbaType:  # C-contiguous 2-d
        return t[:, ::1]

    return [
        ("counters", v(i64)), ("rule_kind", v(i8)), ("rule_base", v(i64)), ("rule_aux", v(i64)),
        ("rule_class", m(i32)), ("rule_nclasses", v(i32)), ("rule_end", v(i32)), ("rule_start", v(i32)),
        ("rule_lo", v(i64)), ("rule_hi", v(i64)), ("nfa_eps_off", v(i32)), ("nfa_eps", v(i32)),
        ("nfa_edge_off", v(i32)), ("nfa_edges", m(i32)), ("nfa_call_off", v(i32)), ("nfa_calls", m(i32)),
        ("nfa_important", v(u8)), ("nfa_closure", m(i32)), ("nfa_closure_data", v(i32)),
        ("table_trans", m(i32)), ("table_accept", v(u8)), ("state_trans", m(i32)), ("state_flags", v(u8)),
        ("state_calls", m(i32)), ("call_targets", m(i32)), ("state_rule", v(i32)), ("state_key", m(i32)),
        ("state_key_data", v(i32)), ("state_hash_keys", v(i64)), ("state_hash_ids", v(i32)),
        ("state_pred", v(i32)), ("state_accepting", v(b1)), ("state_loop_bytes", m(u64)),
        ("state_loops_known", v(u8)), ("state_slice_memo", m(i8)), ("state_utf8_memo", v(i8)),
        ("frames", m(i32)), ("frame_hash_keys", v(i64)), ("frame_hash_ids", v(i32)), ("closures", m(i32)),
        ("closure_data", v(i32)), ("stack_config", v(i32)), ("configs", m(i32)), ("config_data", v(i32)),
        ("config_hash_keys", v(i64)), ("config_hash_ids", v(i32)), ("trans", m(i32)), ("accepting", v(b1)),
        ("loop_bytes", m(u64)), ("loop_known", m(u64)), ("row_done", v(u8)), ("slice_memo", m(i8)),
        ("utf8_memo", v(i8)),
    ]


FIELD_NAMES = ["counters", "rule_kind", "rule_base", "rule_aux", "rule_class", "rule_nclasses", "rule_end",
               "rule_start", "rule_lo", "rule_hi", "nfa_eps_off", "nfa_eps", "nfa_edge_off", "nfa_edges",
               "nfa_call_off", "nfa_calls", "nfa_important", "nfa_closure", "nfa_closure_data",
               "table_trans", "table_accept", "state_trans", "state_flags", "state_calls", "call_targets",
               "state_rule", "state_key", "state_key_data", "state_hash_keys", "state_hash_ids",
               "state_pred", "state_accepting", "state_loop_bytes", "state_loops_known",
               "state_slice_memo", "state_utf8_memo", "frames", "frame_hash_keys", "frame_hash_ids",
               "closures", "closure_data", "stack_config", "configs", "config_data", "config_hash_keys",
               "config_hash_ids", "trans", "accepting", "loop_bytes", "loop_known", "row_done",
               "slice_memo", "utf8_memo"]

class Tables(Protocol):
    """The runtime tables as the kernels see them (the compiled :class:`Tab`, or its plain
    Python stand-in): one array per name of :data:`FIELD_NAMES`."""

    counters: I64
    rule_kind: I8
    rule_base: I64
    rule_aux: I64
    rule_class: I32
    rule_nclasses: I32
    rule_end: I32
    rule_start: I32
    rule_lo: I64
    rule_hi: I64
    nfa_eps_off: I32
    nfa_eps: I32
    nfa_edge_off: I32
    nfa_edges: I32
    nfa_call_off: I32
    nfa_calls: I32
    nfa_important: U8
    nfa_closure: I32
    nfa_closure_data: I32
    table_trans: I32
    table_accept: U8
    state_trans: I32
    state_flags: U8
    state_calls: I32
    call_targets: I32
    state_rule: I32
    state_key: I32
    state_key_data: I32
    state_hash_keys: I64
    state_hash_ids: I32
    state_pred: I32
    state_accepting: B1
    state_loop_bytes: U64
    state_loops_known: U8
    state_slice_memo: I8
    state_utf8_memo: I8
    frames: I32
    frame_hash_keys: I64
    frame_hash_ids: I32
    closures: I32
    closure_data: I32
    stack_config: I32
    configs: I32
    config_data: I32
    config_hash_keys: I64
    config_hash_ids: I32
    trans: I32
    accepting: B1
    loop_bytes: U64
    loop_known: U64
    row_done: U8
    slice_memo: I8
    utf8_memo: I8
