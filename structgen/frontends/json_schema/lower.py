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
from typing import TypeVar, cast

from structgen import limits
from structgen.config import JsonSchemaOptions
from structgen.errors import CompileLimitError, CompileTimeoutError, SchemaError
from structgen.frontends import json_escape, regex
from structgen.frontends.json_schema import formats
from structgen.frontends.json_schema.algebra import Normalizer
from structgen.frontends.json_schema.document import Loc, SchemaDoc
from structgen.frontends.json_schema.formulas import (
    SF,
)
from structgen.frontends.json_schema.number_lowering import NumberLowering, number_spellings, trie
from structgen.frontends.json_schema.object_lowering import ObjectLowering
from structgen.frontends.json_schema.patterns import CONTENT_ENCODING, Pattern, class_run, compile_pattern
from structgen.frontends.json_schema.records import (
    ARR_TOP,
    BOTTOM,
    FALSE,
    TOP,
    TRUE,
    TS,
    Arr,
    Node,
    n_and,
    n_not,
)
from structgen.frontends.json_schema.strict import Closer
from structgen.grammar import checks, ir
from structgen.grammar.graphs import reachable

__all__ = ["Lowering", "number_spellings"]

MAX_UNIQUE_DOMAIN = 10

Ctx = tuple[Loc, ...]
_T = TypeVar("_T")  # what a cached document query returns


class Lowering(ObjectLowering, NumberLowering):
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
        self._memo: dict[tuple[Node, Ctx], str] = {}
        self._queue: list[tuple[str, Node, Ctx]] = []
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
        if options.whitespace == "spaced":
            self.comma, self.colon = ir.lit(", "), ir.lit(": ")
        else:
            self.comma = ir.seq(ir.lit(","), self.ws)
            self.colon = ir.seq(self.ws, ir.lit(":"), self.ws)
        self._cache: dict[Hashable, ir.Expr] = {}
        self._doc_cache: dict[Hashable, object] = {}  # SchemaDoc query results

    # -- shared leaf languages -------------------------------------------------------
    def any_char(self) -> ir.Expr:
        """One string character in any spelling ``escapes`` allows (cached)."""
        e = self._cache.get("char")
        if e is None:
            e = self._cache["char"] = regex.any_char_expr(CONTENT_ENCODING[self.escapes])
        return e

    def str_content_any(self, capped: bool) -> ir.Expr:
        """Every string content; at most ``max_string_length`` characters when ``capped``."""
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

    def node_pointer(self, node: Node) -> str | None:
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

    def node_ref(self, node: Node, ctx: Ctx) -> ir.Expr:
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

    def build(self, root: Node, ctx: Ctx) -> ir.Grammar:
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
            e = trie((tuple(s) for s in sorted(f[1])), lambda ch: json_escape.json_char(ch, self.escapes))
            self.note(e, "enum")
        elif tag == "c":
            _, lo, hi, pats, fmts = f
            parts: list[ir.Expr] = []
            if pos and hi is None and self.opt.max_string_length is not None:
                hi = max(lo, self.opt.max_string_length)  # the global cap never empties a schema
            pats = sorted(pats)
            run = (class_run(pats[0].source, pats[0].dialect)
                   if len(pats) == 1 and (lo > 0 or hi is not None) else None)
            if run is not None:
                # one class repeated: the length bounds narrow the run (one counted
                # repetition) rather than intersect it as a second automaton
                ranges, plo, phi = run
                lo2, hi2 = max(lo, plo), hi if phi is None else phi if hi is None else min(hi, phi)
                item = regex.char_class_expr(ranges, CONTENT_ENCODING[self.escapes])
                parts.append(self.note(ir.NEVER if hi2 is not None and lo2 > hi2 else ir.rep(item, lo2, hi2),
                                       "pattern"))
                pats = []
            elif hi is not None and lo > hi:
                parts.append(ir.NEVER)
            elif (lo > 0 or hi is not None) and not (pos and self.formats_imply_length(fmts, lo, hi)):
                parts.append(self.note(ir.rep(self.any_char(), lo, hi),
                                       "maxLength" if f[2] is not None else "minLength"))
            for p in pats:
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
        return not (self.value_checks and any(formats.checked_format(n, self.doc.drafts[0]) for n in fmts)) \
            and formats.formats_imply_length(fmts, lo, hi)

    def pattern(self, p: Pattern) -> ir.Expr:
        """The content language of pattern ``p`` (searched anywhere, in its dialect)."""
        return compile_pattern(p.source, self.escapes, p.dialect)

    def format(self, name: str) -> tuple[ir.Expr | None, int | None]:
        """Format ``name``'s content language in the spellings ``escapes`` allows (None: any
        string) and the marker of its value check (None: the automaton is exact). Value
        checks off, a format that needs one gets its safe subset (:func:`formats.checked_format`)."""
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

        def variants(n: int) -> list[tuple[Node, tuple[int, ...]]]:
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

    def finite_domain(self, node: Node) -> list[tuple] | None:
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
                    for v in dom if v not in used]

        def accept(state: tuple) -> bool:
            return state[0] >= r.min_items

        body = self.state_machine((0, frozenset()), trans, accept, "uniqueItems")
        return self.note(ir.seq(ir.lit("["), ws, body, ir.lit("]")), "uniqueItems")

    # -- cached document queries ---------------------------------------------------------------------
    def _doc_query(self, tag: str, query: Callable[..., _T], *args: Hashable) -> _T:
        """``query(*args)`` (a :class:`SchemaDoc` method), cached by ``(tag, *args)``."""
        key = (tag, *args)
        got = self._doc_cache.get(key)
        if got is None:
            got = self._doc_cache[key] = query(*args)
        return cast(_T, got)  # stored by this method under a key naming the query

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
        got = cast("Ctx | None", self._doc_cache.get(key))
        if got is None:
            pats = self.doc_patterns(ctx)
            if bits is not None:
                matches = dict(zip(pats, bits))
            else:  # a declared name: which patterns match it, in the schema's dialect
                matches = {p: name is not None and Pattern(p, self.regex_dialect).search(name) for p in pats}
            got = self._doc_cache[key] = self.doc.child_ctx(ctx, name, matches)
        return got

    def doc_item_ctx(self, ctx: Ctx, i: int) -> Ctx:
        """The context of array item ``i`` in context ``ctx`` (cached)."""
        return self._doc_query("item", self.doc.item_ctx, ctx, i)

    def doc_prefix_len(self, ctx: Ctx) -> int:
        """How many array items context ``ctx`` gives their own context (cached)."""
        return self._doc_query("plen", self.doc.prefix_len, ctx)


def _reachable(rules: dict[str, ir.Expr], start: str) -> dict[str, ir.Expr]:
    # ``refs()`` is cached on every node it visits, and the automaton compiler asks the
    # same nodes again: one walk of the expression DAG serves both
    seen = reachable(start, lambda name: rules[name].refs())
    return {n: rules[n] for n in rules if n in seen}

