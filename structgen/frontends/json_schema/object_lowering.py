"""The object languages of a JSON Schema lowering, and the counting automata behind them.

:class:`ObjectLowering` is a mixin of :class:`~structgen.frontends.json_schema.lower.Lowering`:
:meth:`ObjectLowering.lower_obj` turns an object record into IR (declared keys in canonical
order, then the undeclared keys by property-name region), and
:meth:`ObjectLowering.state_machine` turns the small counting automata that ``minProperties``,
``maxProperties``, ``required`` names outside the declared keys, ``contains`` and
``uniqueItems`` need into IR, sharing the states that are reached more than once as rules.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from itertools import product
from typing import TypeVar

from structgen.errors import CompileLimitError
from structgen.frontends import json_escape
from structgen.frontends.json_schema.algebra import Normalizer
from structgen.frontends.json_schema.document import Loc
from structgen.frontends.json_schema.formulas import (
    SF,
    ST,
    KeyIndex,
    lits_of,
    s_and,
    s_atoms,
    s_eval_assign,
    s_lits,
    s_not,
    s_or,
)
from structgen.frontends.json_schema.patterns import Pattern
from structgen.frontends.json_schema.records import FALSE, OBJ_TOP, Node, Obj, n_and, n_not
from structgen.grammar import ir

__all__ = ["MAX_DP_STATES", "MAX_KEY_ATOMS", "ObjectLowering", "small_expr"]

MAX_DP_STATES = 4000
MAX_KEY_ATOMS = 8

Ctx = tuple[Loc, ...]
_S = TypeVar("_S", bound=Hashable)  # a state of a counting automaton


class ObjectLowering:
    """Objects and counting automata for a :class:`~structgen.frontends.json_schema.lower.Lowering`
    (a mixin: it uses the lowering's normaliser, separators, rules and the methods below)."""

    norm: Normalizer
    escapes: str
    regex_dialect: str
    ws: ir.Expr
    comma: ir.Expr
    colon: ir.Expr
    rules: dict[str, ir.Expr]
    rule_kw: dict[str, str]
    _key_kw: str | None
    any_value: Callable[[], ir.Expr]
    note: Callable[[ir.Expr, str], ir.Expr]
    check_deadline: Callable[[str | None], None]
    new_rule: Callable[[str], str]
    node_ref: Callable[[Node, Ctx], ir.Expr]
    lower_str: Callable[[tuple, bool], ir.Expr]
    doc_declared: Callable[[Ctx], list[str]]
    doc_patterns: Callable[[Ctx], list[str]]
    doc_child_ctx: Callable[[Ctx, str | None, tuple[bool, ...] | None], Ctx]

    # -- objects ------------------------------------------------------------------------------------
    def lower_obj(self, r: Obj, ctx: Ctx) -> ir.Expr:
        """The IR of the objects of record ``r`` in context ``ctx``: declared keys in
        canonical order, then the other keys."""
        if r == OBJ_TOP:
            self.any_value()
            return ir.ref("any_obj")
        ws, comma, colon = self.ws, self.comma, self.colon
        declared = self.doc_declared(ctx)
        dset = set(declared)
        exists = [e for e in r.exists if e[2] > 0 or e[3] is not None]

        def value_of(member: Callable[[tuple], bool]) -> tuple[Node, tuple[int, ...]]:
            v = n_and(*(s for k, s in r.props if member(k)))
            ex = tuple(j for j, e in enumerate(exists) if member(e[0]))
            return v, ex

        prop_keys, exists_keys = KeyIndex(k for k, _s in r.props), KeyIndex(e[0] for e in exists)

        def value_named(name: str) -> tuple[Node, tuple[int, ...]]:  # value_of the key sets holding name
            v = n_and(*(r.props[i][1] for i in prop_keys.holding(name)))
            return v, tuple(exists_keys.holding(name))

        def assigned(sigma: dict[tuple, bool]) -> Callable[[tuple], bool]:  # true under sigma
            return lambda k: s_eval_assign(k, sigma)

        # declared slots
        slots: list[tuple[str, Node, bool, tuple[int, ...]]] = []
        for p in declared:
            v, ex = value_named(p)
            req = p in r.required
            if v == FALSE or self.norm.is_empty(v, 1):
                if req:
                    return ir.NEVER
                continue
            slots.append((p, v, req, ex))
        # literal regions: names mentioned by key sets or required, not declared here
        specials: set[str] = set(r.required)
        for k, _s in r.props:
            specials |= lits_of(k)
        for e in exists:
            specials |= lits_of(e[0])
        specials -= dset
        lit_regions: list[tuple[str, Node, bool, tuple[int, ...]]] = []
        for l in sorted(specials):
            v, ex = value_named(l)
            req = l in r.required
            if v == FALSE or self.norm.is_empty(v, 1):
                if req:
                    return ir.NEVER
                continue
            lit_regions.append((l, v, req, ex))
        # pattern regions
        atoms_d: dict[tuple, None] = {}
        for k, _s in r.props:
            s_atoms(k, atoms_d)
        for e in exists:
            s_atoms(e[0], atoms_d)
        ctx_pats = self.doc_patterns(ctx)
        pat_atom: dict[str, tuple] = {
            p: ("c", 0, None, frozenset((Pattern(p, self.regex_dialect),)), frozenset()) for p in ctx_pats}
        for a in pat_atom.values():
            atoms_d.setdefault(a, None)
        atoms = list(atoms_d)
        if len(atoms) > MAX_KEY_ATOMS:
            raise CompileLimitError(f"object schema combines more than {MAX_KEY_ATOMS} property-name "
                                    f"patterns at {self.norm.where()}", pointer=self.norm.where(),
                                    keyword="patternProperties")
        exclude = s_not(s_lits(dset | specials)) if (dset | specials) else ST
        groups: dict[tuple, list[tuple]] = {}
        for bits in product((False, True), repeat=len(atoms)):
            sigma = dict(zip(atoms, bits))
            v, ex = value_of(assigned(sigma))
            if v == FALSE:
                continue
            kf = s_and(*(a if b else s_not(a) for a, b in sigma.items()), exclude)
            if kf == SF:
                continue
            cctx = self.doc_child_ctx(ctx, None, tuple(sigma[pat_atom[p]] for p in ctx_pats))
            groups.setdefault((v, ex, cctx), []).append(kf)
        regions: list[tuple[ir.Expr, Node, Ctx, tuple[int, ...]]] = []
        # property-name languages: errors name the keyword that made them
        self._key_kw = "patternProperties" if ctx_pats else "additionalProperties"
        try:
            for (v, ex, cctx), kfs in groups.items():
                key = ir.seq(ir.lit('"'), self.lower_str(s_or(*kfs), True), ir.lit('"'))
                if key != ir.NEVER:
                    regions.append((key, v, cctx, ex))
        finally:
            self._key_kw = None

        def key_expr(name: str) -> ir.Expr:
            # Declared property names in every JSON spelling (the escape layer); a name
            # holding a lone surrogate has no spelling that decodes to it and gives NEVER.
            return ir.seq(ir.lit('"'), json_escape.json_literal(name, self.escapes), ir.lit('"'))

        def pair(key: ir.Expr, node: Node, cctx: Ctx) -> ir.Expr:
            return ir.seq(key, colon, self.node_ref(node, cctx), ws)

        req_specials = frozenset(l for l, _v, req, _ex in lit_regions if req)
        simple = (not exists and r.min_props == 0 and r.max_props is None and not req_specials)
        if simple:
            rest_pairs = [pair(k, v, c) for k, v, c, _ex in regions]
            rest_pairs += [pair(key_expr(l), v, self.doc_child_ctx(ctx, l, None))
                           for l, v, _req, _ex in lit_regions]
            # undeclared keys: one alternative per region of the property-name patterns
            rp = self.note(ir.alt(*rest_pairs), "patternProperties" if ctx_pats else "additionalProperties")
            # tails[j]: slots j.. when something came before (each present pair is
            # comma-prefixed); shared as rules so no pair is copied more than twice
            tail = ir.star(ir.seq(comma, rp))
            tails: list[ir.Expr] = [tail]
            pairs: list[ir.Expr] = []
            for p, v, req, _ex in reversed(slots):
                pr = pair(key_expr(p), v, self.doc_child_ctx(ctx, p, None))
                pairs.append(pr)
                tail = ir.seq(ir.seq(comma, pr) if req else ir.opt(ir.seq(comma, pr)), tail)
                if len(slots) > 1 and not small_expr(tail):
                    name = self.new_rule("o")
                    self.rule_kw[name] = "properties"
                    self.rules[name] = tail
                    tail = ir.ref(name)
                tails.append(tail)
            tails.reverse()  # tails[j] covers slots j..
            pairs.reverse()
            # the first present pair has no comma: it is slot j, or a rest pair
            firsts: list[ir.Expr] = []
            for j, (_p, _v, req, _ex) in enumerate(slots):
                firsts.append(ir.seq(pairs[j], tails[j + 1]))
                if req:
                    break
            else:
                firsts.append(ir.opt(ir.seq(rp, tails[len(slots)])))
            t_t = ir.alt(*firsts)
            return self.note(ir.seq(ir.lit("{"), ws, t_t, ir.lit("}")), "properties")

        # general case: a counting automaton
        caps = [max(lo, (hi + 1) if hi is not None else 0) for _k, _s, lo, hi in exists]
        c_cap = max(1, r.min_props, (r.max_props + 1) if r.max_props is not None else 0)

        def split(v: Node, ex: tuple[int, ...]) -> list[tuple[Node, tuple[int, ...]]]:
            out = []
            for bits in product((False, True), repeat=len(ex)):
                node = v
                inc = [0] * len(exists)
                for j, b in zip(ex, bits):
                    node = n_and(node, exists[j][1] if b else n_not(exists[j][1]))
                    inc[j] = 1 if b else 0
                if node != FALSE and (not ex or not self.norm.is_empty(node, 1)):
                    out.append((node, tuple(inc)))
            return out

        slot_vars = [(key_expr(p), split(v, ex), req, self.doc_child_ctx(ctx, p, None))
                     for p, v, req, ex in slots]
        rest_vars: list[tuple[ir.Expr, Node, tuple[int, ...], Ctx, str | None]] = []
        for key, v, cctx, ex in regions:
            for node, inc in split(v, ex):
                rest_vars.append((key, node, inc, cctx, None))
        for l, v, _req, ex in lit_regions:
            lctx = self.doc_child_ctx(ctx, l, None)
            for node, inc in split(v, ex):
                rest_vars.append((key_expr(l), node, inc, lctx, l))

        def bump(c: int, counts: tuple, inc: tuple) -> tuple[int, tuple]:
            return min(c + 1, c_cap), tuple(min(x + i, cap) for x, i, cap in zip(counts, inc, caps))

        # Duplicate keys: JSON parsers keep one of them, so a lower bound of 2 or more
        # (minProperties, or a count of keys matching a pattern) must count distinct names.
        # Then every literal name appears at most once and at most one non-literal key
        # (pattern or additional property) is written: a narrowing, never an invalid object.
        distinct = r.min_props >= 2 or any(lo >= 2 for _k, _s, lo, _hi in exists)

        def machine(distinct: bool) -> ir.Expr:
            def trans(state: tuple) -> list[tuple[ir.Expr, tuple]]:
                phase, c, counts, seen = state
                if r.max_props is not None and c > r.max_props:
                    return []
                sep = comma if c > 0 else ir.EMPTY
                out = []
                if phase < len(slot_vars):
                    key, vs, req, cctx = slot_vars[phase]
                    if not req:
                        out.append((ir.EMPTY, (phase + 1, c, counts, seen)))
                    for node, inc in vs:
                        c2, counts2 = bump(c, counts, inc)
                        out.append((ir.seq(sep, pair(key, node, cctx)), (phase + 1, c2, counts2, seen)))
                    return out
                for key, node, inc, cctx, lit_name in rest_vars:
                    if distinct:
                        # None stands for "the non-literal key"
                        if lit_name in seen:
                            continue
                        seen2 = seen | {lit_name}
                    else:
                        if lit_name is not None and lit_name in seen:
                            continue
                        seen2 = seen | {lit_name} if lit_name in req_specials else seen
                    c2, counts2 = bump(c, counts, inc)
                    out.append((ir.seq(sep, pair(key, node, cctx)), (phase, c2, counts2, seen2)))
                return out

            def accept(state: tuple) -> bool:
                phase, c, counts, seen = state
                if phase < len(slot_vars):
                    return False
                if c < r.min_props or (r.max_props is not None and c > r.max_props):
                    return False
                if not req_specials <= seen:
                    return False
                return all(lo <= x and (hi is None or x <= hi)
                           for x, (_k, _s, lo, hi) in zip(counts, exists))

            return self.state_machine((0, 0, tuple(0 for _ in exists), frozenset()), trans, accept, count_kw)

        count_kw = ("minProperties" if r.min_props else "maxProperties" if r.max_props is not None
                    else "required" if req_specials else "patternProperties" if exists else "properties")

        body = machine(distinct)
        if distinct and body == ir.NEVER and regions and machine(False) != ir.NEVER:
            # only objects with several pattern / additional keys would do
            kw = "minProperties" if r.min_props >= 2 else "patternProperties"
            self.norm.unsupported(kw, self.norm.where(),
                                  f"{kw} needs two or more keys matched by patterns or "
                                  "additionalProperties, which a grammar cannot keep distinct "
                                  "(a duplicated key would count twice)")
            body = machine(False)  # lenient mode: duplicates may count
        return self.note(ir.seq(ir.lit("{"), ws, body, ir.lit("}")), count_kw)

    # -- acyclic state machines (self-loops allowed) -> rules --------------------------------------
    def state_machine(self, start: _S, trans: Callable[[_S], list[tuple[ir.Expr, _S]]],
                      accept: Callable[[_S], bool], keyword: str | None = None) -> ir.Expr:
        """``keyword``: the schema keyword that needs the counting (error messages)."""
        edges: dict[_S, list[tuple[ir.Expr, _S]]] = {}
        order: list[_S] = []
        stack = [start]
        while stack:
            s = stack.pop()
            if s in edges:
                continue
            out = trans(s)
            edges[s] = out
            order.append(s)
            if len(edges) & 63 == 0:
                self.check_deadline(keyword)
            if len(edges) > MAX_DP_STATES:
                raise CompileLimitError(f"counting constraints need more than {MAX_DP_STATES} automaton "
                                        f"states at {self.norm.where()}", pointer=self.norm.where(),
                                        keyword=keyword)
            for _e, t in out:
                if t not in edges:
                    stack.append(t)
        # live states: can reach acceptance
        preds: dict[_S, set[_S]] = {s: set() for s in edges}
        for s, out in edges.items():
            for _e, t in out:
                preds[t].add(s)
        live = {s for s in edges if accept(s)}
        work = list(live)
        while work:
            t = work.pop()
            for s in preds[t]:
                if s not in live:
                    live.add(s)
                    work.append(s)
        if start not in live:
            return ir.NEVER
        indeg: dict[_S, int] = {s: 0 for s in edges}
        for s, out in edges.items():
            for _e, t in out:
                if t != s and t in live:
                    indeg[t] += 1
        # topological order of the DAG without self-loops (reverse post-order)
        topo: list[_S] = []
        seen: set = set()
        for s0 in order:
            if s0 in seen or s0 not in live:
                continue
            st = [(s0, iter([t for _e, t in edges[s0] if t != s0 and t in live]))]
            seen.add(s0)
            while st:
                s, it = st[-1]
                nxt = next(it, None)
                if nxt is None:
                    st.pop()
                    topo.append(s)
                elif nxt not in seen:
                    seen.add(nxt)
                    st.append((nxt, iter([t for _e, t in edges[nxt] if t != nxt and t in live])))
        expr: dict[_S, ir.Expr] = {}
        for s in topo:  # successors first
            loops = [e for e, t in edges[s] if t == s]
            outs = [ir.seq(e, expr[t]) for e, t in edges[s] if t != s and t in live]
            if accept(s):
                outs.append(ir.EMPTY)
            body = ir.seq(ir.star(ir.alt(*loops)) if loops else ir.EMPTY, ir.alt(*outs))
            if indeg[s] > 1 and not small_expr(body):
                name = self.new_rule("q")
                if keyword is not None:
                    self.rule_kw[name] = keyword
                self.rules[name] = body
                body = ir.ref(name)
            expr[s] = body
        return expr[start]


def small_expr(e: ir.Expr, budget: int = 24) -> bool:
    """Is ``e`` a small expression (cheap to duplicate)?"""
    stack = [e]
    n = 0
    while stack:
        x = stack.pop()
        n += 1
        if n > budget:
            return False
        if isinstance(x, (ir.Seq, ir.Alt)):
            stack.extend(x.items)
        elif isinstance(x, ir.Repeat):
            stack.append(x.item)
        elif isinstance(x, (ir.And, ir.Diff)):
            stack += [x.left, x.right]
    return True
