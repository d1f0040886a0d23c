"""Lowering normalised JSON Schema languages (:mod:`structgen.frontends.json_schema.algebra`) to IR.

One IR rule is made per (node, key-order context); children are rule references, so
recursive schemas become recursive rules and everything else is inlined by the
automaton. Strings and numbers lower to regular IR (``ir.and_``/``ir.diff`` only appear
there). Objects and arrays lower to sequences: declared keys in canonical order, then
the remaining keys in any order; counters (``minProperties``, ``contains``, required keys
that are not declared, ...) become small acyclic state machines, one rule per state.

Soundness under negation: every lowering takes a *polarity*. At ``+`` the produced
language is a subset of the schema's (formats and numeric forms may be narrowed); at
``-`` it is a superset, so ``not x`` lowered as ``universe - lower(x, -)`` stays a
subset. For numbers the universe under negation is :data:`SAFE_NUMBER` (integer literals,
and plain decimals with at most 15 digits, where decimal and binary comparisons agree),
so ``not`` over numbers never accepts an exponent form or a long fraction. Numbers are lowered by
:class:`~structgen.frontends.json_schema.number_lowering.NumberLowering` (with the canonical
spellings generation uses).

Escapes: every string language (values, patterns, formats, ``enum``/``const`` strings,
declared and other property names) describes decoded values and goes through
:mod:`structgen.frontends.json_escape`, so any JSON spelling of an accepted value is accepted
(``\\u0041``, ``\\/``, surrogate pairs, either hex case).

Duplicate keys: declared keys appear at most once by construction. Other keys are not
checked for duplicates, except where a lower bound of 2 or more counts keys
(``minProperties``, pattern counts): there literal names appear at most once and at most
one non-literal key is written, so a parser that drops duplicates never sees too few.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from itertools import product
from typing import Any

from structgen import limits
from structgen.config import JsonSchemaOptions
from structgen.errors import CompileLimitError, CompileTimeoutError, SchemaError
from structgen.frontends import json_escape
from structgen.frontends.json_schema.algebra import Normalizer
from structgen.frontends.json_schema.document import Loc, SchemaDoc
from structgen.frontends.json_schema.formulas import (
    SF,
    ST,
    lits_of,
    s_and,
    s_atoms,
    s_eval_assign,
    s_lits,
    s_member,
    s_not,
    s_or,
)
from structgen.frontends.json_schema.number_lowering import NumberLowering, number_spellings, trie
from structgen.frontends.json_schema.patterns import CONTENT_ENCODING, Pattern, compile_pattern
from structgen.frontends.json_schema.records import (
    ARR_TOP,
    BOTTOM,
    FALSE,
    OBJ_TOP,
    TOP,
    TRUE,
    TS,
    Arr,
    Obj,
    n_and,
    n_not,
)
from structgen.frontends.json_schema.strict import Closer
from structgen.grammar import checks, ir
from structgen.grammar.graphs import reachable

__all__ = ["Lowering", "number_spellings"]

MAX_DP_STATES = 4000
MAX_KEY_ATOMS = 8
MAX_UNIQUE_DOMAIN = 10

Ctx = tuple[Loc, ...]


def _regex():  # imported lazily: building its Unicode tables costs a little
    from structgen.frontends import regex
    return regex


class Lowering(NumberLowering):
    """Builds the IR grammar for one schema document."""

    def __init__(self, norm: Normalizer, doc: SchemaDoc, options: JsonSchemaOptions, *,
                 deadline: float | None = None) -> None:
        self.norm = norm
        self.doc = doc
        self.opt = options
        self.escapes = options.string_escapes or "all"  # JSON spellings of string characters
        # formats an automaton cannot decide are checked per value (validation) or narrowed
        self.value_checks = options.value_checks is not False
        self.deadline = deadline  # limits.now() value; CompileTimeoutError past it
        self.opt_timeout = (deadline - limits.now()) if deadline is not None else 0.0
        norm.deadline, norm.time_limit = deadline, self.opt_timeout  # normalising counts too
        # patterns are read in one dialect: the normaliser's pattern atoms must equal ours
        norm.regex_dialect = self.regex_dialect = options.regex_dialect
        # the language lowered at each instance position (strict mode closes it: strict.py)
        self.language = Closer(norm).language if options.strict else norm.normalize
        self.rules: dict[str, ir.Expr] = {}
        self._memo: dict[tuple[Any, Ctx], str] = {}
        self._queue: list[tuple[str, Any, Ctx]] = []
        self._count = 0
        # error locations (never used to build the grammar): rule name -> schema pointer, and
        # the keyword a rule or an IR expression was made for (the pointer of an expression
        # is that of the rule it is used in: string and number languages are shared)
        self.rule_where: dict[str, str] = {"root": "#"}
        self.rule_kw: dict[str, str] = {}
        self.expr_kw: dict[ir.Expr, str] = {}
        self._key_kw: str | None = None  # set while property names are lowered
        if options.whitespace == "flexible":
            self.ws = ir.rep(ir.byteset([9, 10, 13, 32]), 0, options.max_whitespace)
        else:
            self.ws = ir.EMPTY
        self.comma = ir.seq(ir.lit(","), self.ws)
        self.colon = ir.seq(self.ws, ir.lit(":"), self.ws)
        self._cache: dict[Any, Any] = {}

    # -- shared leaf languages -------------------------------------------------------
    def any_char(self) -> ir.Expr:
        """One string character in any spelling ``escapes`` allows (cached)."""
        e = self._cache.get("char")
        if e is None:
            e = self._cache["char"] = _regex().any_char_expr(CONTENT_ENCODING[self.escapes])
        return e

    def str_content_any(self, capped: bool) -> ir.Expr:
        """Any string content; at most ``max_string_length`` characters when ``capped``."""
        cap = self.opt.max_string_length if capped else None
        return ir.rep(self.any_char(), 0, cap)

    def any_value(self) -> ir.Expr:
        """A reference to rule ``any``: every JSON value (the rules are made on first use)."""
        if "any" not in self.rules:
            ws, comma = self.ws, self.comma
            string = ir.seq(ir.lit('"'), self.str_content_any(True), ir.lit('"'))
            self.rules["any"] = ir.alt(ir.lit("null"), ir.lit("true"), ir.lit("false"),
                                       self.number_any(), string, ir.ref("any_arr"), ir.ref("any_obj"))
            item = ir.seq(ir.ref("any"), ws)
            items = ir.opt(ir.seq(item, ir.star(ir.seq(comma, item))))
            self.rules["any_arr"] = ir.seq(ir.lit("["), ws, items, ir.lit("]"))
            pair = ir.seq(string, self.colon, ir.ref("any"), ws)
            pairs = ir.opt(ir.seq(pair, ir.star(ir.seq(comma, pair))))
            self.rules["any_obj"] = ir.seq(ir.lit("{"), ws, pairs, ir.lit("}"))
        return ir.ref("any")

    # -- error locations ------------------------------------------------------------------
    def note(self, e: ir.Expr, keyword: str) -> ir.Expr:
        """Record ``keyword`` as the one ``e`` was made for (automaton errors name it)."""
        if e is not ir.NEVER and e is not ir.EMPTY:
            self.expr_kw.setdefault(e, self._key_kw or keyword)
        return e

    def node_pointer(self, node: Any) -> str | None:
        """The schema location a node stands for: its own for a reference, the shortest one
        among its parts for a Boolean combination (``#/properties/a`` for the meet of
        ``#/properties/a`` and ``#/allOf/0/properties/a``), None for other nodes."""
        tag = node[0]
        if tag == "ref":
            return self.doc.pointer(node[1])
        if tag == "not":
            return self.node_pointer(node[1])
        if tag in ("and", "or"):
            ptrs = [p for p in (self.node_pointer(m) for m in node[1]) if p is not None]
            return min(ptrs, key=lambda p: (len(p), p)) if ptrs else None
        return None

    def check_deadline(self, keyword: str | None = None) -> None:
        """Raise CompileTimeoutError past the deadline, naming the schema location and
        ``keyword`` (else the normaliser's) being lowered."""
        limits.check()  # the request was cancelled: stop here
        if self.deadline is not None and limits.now() > self.deadline:
            where = self.norm.where()
            kw = keyword or self.norm.keyword()
            what = f"keyword {kw!r} of the schema at {where}" if kw else f"the schema at {where}"
            limit = round(self.opt_timeout, 2)
            raise CompileTimeoutError(f"grammar compilation exceeded its time limit of {limit:g} s "
                                      f"while lowering {what} (CompileOptions.timeout_s)",
                                      pointer=where, keyword=kw)

    # -- driver -------------------------------------------------------------------------
    def new_rule(self, hint: str = "s") -> str:
        """A fresh rule name (``hint`` + a counter) tied to the current schema location.
        Raises CompileLimitError past 200,000 rules."""
        self._count += 1
        if self._count > 200_000:
            raise CompileLimitError("JSON schema lowering produced more than 200000 rules",
                                    pointer=self.norm.where())
        name = f"{hint}{self._count}"
        self.rule_where[name] = self.norm.where()
        return name

    def node_ref(self, node: Any, ctx: Ctx) -> ir.Expr:
        """A reference to the rule of ``node`` in context ``ctx`` (made and queued once)."""
        if node == TRUE:
            return self.any_value()
        if node == FALSE:
            return ir.NEVER
        key = (node, ctx)
        name = self._memo.get(key)
        if name is None:
            name = self.new_rule()
            ptr = self.node_pointer(node)
            if ptr is not None:
                self.rule_where[name] = ptr
            self._memo[key] = name
            self._queue.append((name, node, ctx))
        return ir.ref(name)

    def build(self, root: Any, ctx: Ctx) -> ir.Grammar:
        """The grammar of the schema whose root node is ``root``: lowers every queued rule,
        then drops rules the root cannot reach. Raises SchemaError for a root that accepts nothing."""
        ts = self.language(root)
        if self.norm.ts_empty(ts, 2):
            raise SchemaError("schema is unsatisfiable: no JSON value is valid", pointer="#")
        body = self.lower_ts(ts, ctx)
        if body == ir.NEVER:
            raise SchemaError("schema is unsatisfiable: no JSON value is valid", pointer="#")
        self.rules["root"] = ir.seq(self.ws, body, self.ws)
        while self._queue:
            name, node, cctx = self._queue.pop()
            self.norm.enter(self.rule_where[name])
            try:
                self.rules[name] = self.lower_ts(self.language(node), cctx)
            finally:
                self.norm.leave()
        # drop rules the root cannot reach (dead branches)
        return ir.Grammar(_reachable(self.rules, "root"), "root")

    # -- typed sets -------------------------------------------------------------------------
    def lower_ts(self, ts: TS, ctx: Ctx) -> ir.Expr:
        """The IR of language ``ts`` in context ``ctx``: one alternative per JSON type present."""
        self.check_deadline()
        if ts == TOP:
            return self.any_value()
        if ts == BOTTOM:
            return ir.NEVER
        alts: list[ir.Expr] = []
        if ts.null:
            alts.append(ir.lit("null"))
        for b in sorted(ts.bools):
            alts.append(ir.lit("true" if b else "false"))
        if ts.num != SF:
            alts.append(self.lower_num(ts.num, True))
        if ts.str != SF:
            alts.append(ir.seq(ir.lit('"'), self.lower_str(ts.str, True), ir.lit('"')))
        for a in ts.arr:
            alts.append(self.lower_arr(a, ctx))
        for o in ts.obj:
            alts.append(self.lower_obj(o, ctx))
        return ir.alt(*alts)

    # -- strings ------------------------------------------------------------------------------
    def str_lit(self, s: str) -> ir.Expr:
        """String ``s`` as JSON string content in the spellings ``escapes`` allows."""
        return json_escape.json_literal(s, self.escapes)

    def lower_str(self, f: tuple, pos: bool) -> ir.Expr:
        """String content (between the quotes). ``pos``: subset (True) / superset (False)."""
        key = ("str", f, pos, self.value_checks)
        got = self._cache.get(key)
        if got is not None:
            return got
        tag = f[0]
        if tag == "T":
            e = self.str_content_any(pos)
        elif tag == "F":
            e = ir.NEVER
        elif tag == "lits":
            e = trie((tuple(s) for s in sorted(f[1])),
                      lambda ch: json_escape.json_class(((ord(ch), ord(ch)),), self.escapes))
            self.note(e, "enum")
        elif tag == "c":
            _, lo, hi, pats, fmts = f
            parts: list[ir.Expr] = []
            if pos and hi is None and self.opt.max_string_length is not None:
                hi = max(lo, self.opt.max_string_length)  # the global cap never empties a schema
            if hi is not None and lo > hi:
                parts.append(ir.NEVER)
            elif (lo > 0 or hi is not None) and not (pos and self.formats_imply_length(fmts, lo, hi)):
                parts.append(self.note(ir.rep(self.any_char(), lo, hi),
                                       "maxLength" if f[2] is not None else "minLength"))
            for p in sorted(pats):
                parts.append(self.note(self.pattern(p), "pattern"))
            markers: list[int] = []
            for fm in sorted(fmts) if pos else ():
                content, marker = self.format(fm)
                parts += [self.note(content, "format")] if content is not None else []
                markers += [marker] if marker is not None else []
            if not parts:
                e = self.str_content_any(pos)
            else:
                e = parts[0]
                for p in parts[1:]:
                    # an intersection is named after what is intersected (pattern, format)
                    e = self.note(ir.and_(e, p), self.expr_kw.get(p, "pattern"))
            if markers:
                # the string's value is checked when it completes (structgen.grammar.checks)
                e = self.note(checks.checked(e, tuple(sorted(markers))), "format")
        elif tag == "and":
            # markers must end the whole string: the branches of an intersection get the
            # formats' safe subsets instead (a narrowing, never an over-acceptance)
            outer, self.value_checks = self.value_checks, False
            try:
                items = [self.lower_str(x, pos) for x in sorted(f[1], key=repr)]
            finally:
                self.value_checks = outer
            e = items[0]
            for x in items[1:]:
                e = self.note(ir.and_(e, x), self.expr_kw.get(x, "allOf"))
        elif tag == "or":
            e = self.note(ir.alt(*(self.lower_str(x, pos) for x in sorted(f[1], key=repr))), "anyOf")
        else:
            e = self.note(ir.diff(self.str_content_any(pos), self.lower_str(f[1], not pos)), "not")
        self._cache[key] = e
        return e

    def formats_imply_length(self, fmts: frozenset, lo: int, hi: int | None) -> bool:
        """Do the formats alone keep every string's length within [lo, hi]
        (:func:`formats.formats_imply_length`)? Never for a format checked per value: its
        superset may be longer than its safe subset."""
        from structgen.frontends.json_schema import formats
        return not (self.value_checks and any(formats.checked_format(n, self.doc.drafts[0]) for n in fmts)) \
            and formats.formats_imply_length(fmts, lo, hi)

    def pattern(self, p: Pattern) -> ir.Expr:
        """The content language of pattern ``p`` (searched anywhere, in its dialect)."""
        return compile_pattern(p.source, self.escapes, p.dialect)

    def format(self, name: str) -> tuple[ir.Expr | None, int | None]:
        """Format ``name``'s content language in the spellings ``escapes`` allows (None: any
        string) and the marker of its value check (None: the automaton is exact). Value
        checks off, a format that needs one gets its safe subset (:func:`formats.checked_format`)."""
        from structgen.frontends.json_schema import formats
        checked = formats.checked_format(name, self.doc.drafts[0]) if self.value_checks else None
        e = formats.format_expr(name, self.doc.drafts[0]) if checked is None else checked[0]
        if e is None and checked is None:  # pragma: no cover - filtered by the normaliser
            raise SchemaError(f"format {name!r} has no grammar", keyword="format")
        # format languages describe decoded values
        content = None if e is None else json_escape.json_content(e, self.escapes)
        return content, None if checked is None else checked[1]

    # -- literal values (uniqueItems domains) ------------------------------------------------------
    def value_lit(self, key: tuple) -> ir.Expr:
        """The canonical JSON text of the value with :func:`value_key` key ``key``."""
        tag = key[0]
        if tag == "z":
            return ir.lit("null")
        if tag == "b":
            return ir.lit("true" if key[1] else "false")
        if tag == "n":
            return ir.alt(*(ir.lit(t) for t in self.spellings(key[1])))
        if tag == "s":
            return ir.seq(ir.lit('"'), self.str_lit(key[1]), ir.lit('"'))
        raise AssertionError(tag)

    # -- arrays ---------------------------------------------------------------------------------
    def lower_arr(self, r: Arr, ctx: Ctx) -> ir.Expr:
        """The IR of the arrays of record ``r`` in context ``ctx``."""
        if r == ARR_TOP:
            self.any_value()
            return ir.ref("any_arr")
        ws, comma = self.ws, self.comma
        if r.unique and (r.max_items is None or r.max_items > 1):
            return self.lower_unique(r, ctx)
        P = max(len(r.prefix), self.doc_prefix_len(ctx))
        if r.max_items is not None:
            P = min(P, r.max_items)
        item_refs = [self.node_ref(r.item(i), self.doc_item_ctx(ctx, i)) for i in range(P)]
        rest_ctx = self.doc_item_ctx(ctx, P)
        contains = [(c, lo, hi, st) for c, lo, hi, st in r.contains if lo > 0 or hi is not None]
        count_kw = "maxItems" if r.max_items is not None else "minItems" if r.min_items > 1 else "items"
        if not contains:
            rest = self.node_ref(r.rest, rest_ctx)
            lo = max(0, r.min_items - P)
            hi = None if r.max_items is None else r.max_items - P
            if P == 0:
                if hi == 0 or rest == ir.NEVER:
                    tail = ir.EMPTY if lo == 0 else ir.NEVER
                else:
                    first = ir.seq(rest, ws)
                    more = ir.rep(ir.seq(comma, rest, ws), max(lo - 1, 0), None if hi is None else hi - 1)
                    self.note(more, count_kw)
                    tail = ir.seq(first, more) if lo >= 1 else ir.opt(ir.seq(first, more))
            else:
                tail = self.note(ir.rep(ir.seq(comma, rest, ws), lo, hi), count_kw) if rest != ir.NEVER else (
                    ir.EMPTY if lo == 0 else ir.NEVER)
            for i in range(P - 1, -1, -1):
                elem = ir.seq(comma if i > 0 else ir.EMPTY, item_refs[i], ws, tail)
                tail = elem if i < r.min_items else ir.opt(elem)
            return self.note(ir.seq(ir.lit("["), ws, tail, ir.lit("]")), "prefixItems" if P else "items")
        # counting automaton over (items so far, contains counters)
        caps = [max(lo, (hi + 1) if hi is not None else 0) for _c, lo, hi, _s in contains]
        n_cap = max(P, r.min_items, (r.max_items + 1) if r.max_items is not None else 0, 1)

        def variants(n: int) -> list[tuple[Any, tuple[int, ...]]]:
            base = r.item(n) if n < P else r.rest
            act = [j for j, (_c, _lo, _hi, st) in enumerate(contains) if st <= n]
            out = []
            for bits in product((False, True), repeat=len(act)):
                node = base
                inc = [0] * len(contains)
                for j, b in zip(act, bits):
                    node = n_and(node, contains[j][0] if b else n_not(contains[j][0]))
                    inc[j] = 1 if b else 0
                if node != FALSE and not self.norm.is_empty(node, 1):
                    out.append((node, tuple(inc)))
            return out

        var_cache: dict[int, list] = {}

        def trans(state: tuple) -> list[tuple[ir.Expr, tuple]]:
            n, counts = state
            if r.max_items is not None and n >= r.max_items:
                return []
            key = min(n, P)
            if key not in var_cache:
                var_cache[key] = variants(n if n < P else P)
            out = []
            sep = comma if n > 0 else ir.EMPTY
            ictx = self.doc_item_ctx(ctx, n) if n < P else rest_ctx
            for node, inc in var_cache[key]:
                nxt = (min(n + 1, n_cap), tuple(min(c + i, cap) for c, i, cap in zip(counts, inc, caps)))
                out.append((ir.seq(sep, self.node_ref(node, ictx), ws), nxt))
            return out

        def accept(state: tuple) -> bool:
            n, counts = state
            if n < r.min_items or (r.max_items is not None and n > r.max_items):
                return False
            return all(lo <= c and (hi is None or c <= hi)
                       for c, (_n, lo, hi, _s) in zip(counts, contains))

        body = self.state_machine((0, tuple(0 for _ in contains)), trans, accept, "contains")
        return self.note(ir.seq(ir.lit("["), ws, body, ir.lit("]")), "contains")

    def finite_domain(self, node: Any) -> list[tuple] | None:
        """The value keys of a finite node language (scalars only), or None."""
        if node == FALSE:
            return []
        if node == TRUE:
            return None
        ts = self.norm.normalize(node)
        if ts.arr or ts.obj:
            return None
        out: list[tuple] = []
        if ts.null:
            out.append(("z",))
        out += [("b", b) for b in sorted(ts.bools)]
        if ts.num != SF:
            if ts.num[0] != "lits":
                return None
            out += [("n", v) for v in sorted(ts.num[1])]
        if ts.str != SF:
            if ts.str[0] != "lits":
                return None
            out += [("s", v) for v in sorted(ts.str[1])]
        return out

    def lower_unique(self, r: Arr, ctx: Ctx) -> ir.Expr:
        """The IR of the arrays of record ``r`` with ``uniqueItems``: exact when the items
        come from a small finite set of scalars, else UnsupportedFeatureError."""
        ws, comma = self.ws, self.comma
        if r.contains:
            self.norm.unsupported("uniqueItems", self.norm.where(),
                                  "uniqueItems together with contains is not supported")
            return self.lower_arr(Arr(r.prefix, r.rest, r.min_items, r.max_items, r.contains), ctx)
        P = len(r.prefix)
        limit = r.max_items
        domains = [self.finite_domain(r.item(i)) for i in range(P if limit is None else min(P, limit))]
        rest_dom: list[tuple] | None = []
        if limit is None or limit > P:
            rest_dom = self.finite_domain(r.rest)
        if any(d is None for d in domains) or rest_dom is None or \
                len({v for d in domains for v in d} | set(rest_dom)) > MAX_UNIQUE_DOMAIN:  # type: ignore[union-attr]
            self.norm.unsupported("uniqueItems", self.norm.where(),
                                  "uniqueItems is only enforced for items drawn from a small finite "
                                  "set of scalar values")
            return self.lower_arr(Arr(r.prefix, r.rest, r.min_items, r.max_items, ()), ctx)

        def trans(state: tuple) -> list[tuple[ir.Expr, tuple]]:
            n, used = state
            if limit is not None and n >= limit:
                return []
            dom = domains[n] if n < P else rest_dom
            sep = comma if n > 0 else ir.EMPTY
            return [(ir.seq(sep, self.value_lit(v), ws), (n + 1, used | {v}))
                    for v in dom if v not in used]  # type: ignore[union-attr]

        def accept(state: tuple) -> bool:
            return state[0] >= r.min_items

        body = self.state_machine((0, frozenset()), trans, accept, "uniqueItems")
        return self.note(ir.seq(ir.lit("["), ws, body, ir.lit("]")), "uniqueItems")

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

        def value_of(member: Callable[[tuple], bool]) -> tuple[Any, tuple[int, ...]]:
            v = n_and(*(s for k, s in r.props if member(k)))
            ex = tuple(j for j, e in enumerate(exists) if member(e[0]))
            return v, ex

        # declared slots
        slots: list[tuple[str, Any, bool, tuple[int, ...]]] = []
        for p in declared:
            v, ex = value_of(lambda k, p=p: s_member(k, p))
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
        lit_regions: list[tuple[str, Any, bool, tuple[int, ...]]] = []
        for l in sorted(specials):
            v, ex = value_of(lambda k, l=l: s_member(k, l))
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
        pat_atom = {p: ("c", 0, None, frozenset((Pattern(p, self.regex_dialect),)), frozenset())
                    for p in ctx_pats}
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
            v, ex = value_of(lambda k, sigma=sigma: s_eval_assign(k, sigma))
            if v == FALSE:
                continue
            kf = s_and(*(a if b else s_not(a) for a, b in sigma.items()), exclude)
            if kf == SF:
                continue
            cctx = self.doc_child_ctx(ctx, None, tuple(sigma[pat_atom[p]] for p in ctx_pats))
            groups.setdefault((v, ex, cctx), []).append(kf)
        regions: list[tuple[ir.Expr, Any, Ctx, tuple[int, ...]]] = []
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

        def pair(key: ir.Expr, node: Any, cctx: Ctx) -> ir.Expr:
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
                if len(slots) > 1 and not _small(tail):
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

        def split(v: Any, ex: tuple[int, ...]) -> list[tuple[Any, tuple[int, ...]]]:
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
        rest_vars: list[tuple[ir.Expr, Any, tuple[int, ...], Ctx, str | None]] = []
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
    def state_machine(self, start: Hashable, trans: Callable[[Any], list[tuple[ir.Expr, Any]]],
                      accept: Callable[[Any], bool], keyword: str | None = None) -> ir.Expr:
        """``keyword``: the schema keyword that needs the counting (error messages)."""
        edges: dict[Any, list[tuple[ir.Expr, Any]]] = {}
        order: list[Any] = []
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
        preds: dict[Any, set] = {s: set() for s in edges}
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
        indeg: dict[Any, int] = {s: 0 for s in edges}
        for s, out in edges.items():
            for _e, t in out:
                if t != s and t in live:
                    indeg[t] += 1
        # topological order of the DAG without self-loops (reverse post-order)
        topo: list[Any] = []
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
        expr: dict[Any, ir.Expr] = {}
        for s in topo:  # successors first
            loops = [e for e, t in edges[s] if t == s]
            outs = [ir.seq(e, expr[t]) for e, t in edges[s] if t != s and t in live]
            if accept(s):
                outs.append(ir.EMPTY)
            body = ir.seq(ir.star(ir.alt(*loops)) if loops else ir.EMPTY, ir.alt(*outs))
            if indeg[s] > 1 and not _small(body):
                name = self.new_rule("q")
                if keyword is not None:
                    self.rule_kw[name] = keyword
                self.rules[name] = body
                body = ir.ref(name)
            expr[s] = body
        return expr[start]

    # -- cached document queries ---------------------------------------------------------------------
    def _doc_query(self, tag: str, query: Callable[..., Any], *args: Any) -> Any:
        """``query(*args)`` (a :class:`SchemaDoc` method), cached by ``(tag, *args)``."""
        key = (tag, *args)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = query(*args)
        return got

    def doc_declared(self, ctx: Ctx) -> list[str]:
        """The property names declared in key-order context ``ctx``, in canonical order (cached)."""
        return self._doc_query("decl", self.doc.declared_names, ctx)

    def doc_patterns(self, ctx: Ctx) -> list[str]:
        """The ``patternProperties`` patterns that apply in context ``ctx`` (cached)."""
        return self._doc_query("pats", self.doc.ctx_patterns, ctx)

    def doc_child_ctx(self, ctx: Ctx, name: str | None, bits: tuple[bool, ...] | None) -> Ctx:
        """The context of the value of key ``name`` (None: an undeclared key whose matches
        against :meth:`doc_patterns` are ``bits``) in context ``ctx`` (cached)."""
        key = ("child", ctx, name, bits)
        got = self._cache.get(key)
        if got is None:
            pats = self.doc_patterns(ctx)
            if bits is not None:
                matches = dict(zip(pats, bits))
            else:  # a declared name: which patterns match it, in the schema's dialect
                matches = {p: name is not None and Pattern(p, self.regex_dialect).search(name) for p in pats}
            got = self._cache[key] = self.doc.child_ctx(ctx, name, matches)
        return got

    def doc_item_ctx(self, ctx: Ctx, i: int) -> Ctx:
        """The context of array item ``i`` in context ``ctx`` (cached)."""
        return self._doc_query("item", self.doc.item_ctx, ctx, i)

    def doc_prefix_len(self, ctx: Ctx) -> int:
        """How many array items context ``ctx`` gives their own context (cached)."""
        return self._doc_query("plen", self.doc.prefix_len, ctx)


def _small(e: ir.Expr, budget: int = 24) -> bool:
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


def _reachable(rules: dict[str, ir.Expr], start: str) -> dict[str, ir.Expr]:
    # ``refs()`` is cached on every node it visits, and the automaton compiler asks the
    # same nodes again: one walk of the expression DAG serves both
    seen = reachable(start, lambda name: rules[name].refs())
    return {n: rules[n] for n in rules if n in seen}

