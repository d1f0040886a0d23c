"""Error diagnosis for the JSON Schema front-end: which schema location and keyword.

Only used after compilation has failed, never to build a grammar, and always within a
small time budget of its own (a diagnosis that runs out of time falls back to a coarser
answer). Three questions:

* an unsatisfiable schema: which subschema accepts nothing, and because of which keyword
  (:func:`explain_unsat`);
* an automaton limit or timeout that names an IR rule or intersection: which schema
  location and keyword produced it (:func:`locate_automaton_error`);
* a location without a better answer: the keyword there whose subschema is largest
  (:func:`structural_keyword`).

One more, answered once per compilation because it is cheap: where each compiled rule comes
from (:func:`rule_sources`), for errors raised when the grammar is used rather than built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from structgen import limits
from structgen.errors import CompileLimitError, CompileTimeoutError, StructgenError
from structgen.frontends.json_schema.algebra import Normalizer
from structgen.frontends.json_schema.document import Loc, SchemaDoc, escape_token
from structgen.frontends.json_schema.keywords import (
    OLD_DRAFTS,
    keyword_at,
    node_at,
    structural_keyword,
)
from structgen.frontends.json_schema.patterns import compile_pattern
from structgen.frontends.json_schema.records import FALSE, TRUE
from structgen.grammar import ir
from structgen.grammar.compiled import CompiledGrammar, LazyRule, RuleSource
from structgen.grammar.passes import expr_size
from structgen.json_types import JsonValue

__all__ = ["DIAGNOSIS_BUDGET_S", "explain_unsat", "locate_automaton_error", "rule_sources"]

DIAGNOSIS_BUDGET_S = 2.0
"""Seconds a diagnosis may take (on top of the failed compilation)."""

# keywords in the order the normaliser applies them (algebra.Normalizer._schema)
_APPLY_ORDER = (
    "type", "enum", "const",
    "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf",
    "minLength", "maxLength", "pattern", "format",
    "prefixItems", "items", "additionalItems", "minItems", "maxItems", "contains", "minContains",
    "maxContains", "uniqueItems",
    "properties", "patternProperties", "additionalProperties", "required", "minProperties",
    "maxProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies",
    "$ref", "$dynamicRef", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
    "unevaluatedItems", "unevaluatedProperties",
)


class _Timeout(Exception):
    pass


# ---------------------------------------------------------------------------
# unsatisfiable schemas
# ---------------------------------------------------------------------------

_DEPTH = 3  # emptiness is tested as deep as the lowering does, and one level more


class _PatchedDoc:
    """A document view with one schema node replaced (everything else delegated)."""

    def __init__(self, doc: SchemaDoc, loc: Loc, node: JsonValue) -> None:
        self._doc, self._loc, self._replacement = doc, loc, node

    def node(self, loc: Loc) -> JsonValue:
        return self._replacement if loc == self._loc else self._doc.node(loc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._doc, name)


def _empty(norm: Normalizer, loc: Loc) -> bool:
    """Is the schema at ``loc`` provably empty? (False when that cannot be decided.)"""
    try:
        n = norm.ref_node(loc)
        if n == FALSE:
            return True
        if n == TRUE:
            return False
        return norm.ts_empty(norm.normalize(n), _DEPTH)
    except CompileTimeoutError:
        raise _Timeout() from None
    except StructgenError:
        return False


def _sub(loc: Loc, *path: str | int) -> Loc:
    return Loc(loc.doc, loc.ptr + "".join("/" + escape_token(str(p)) for p in path))


def _must_children(doc: SchemaDoc, loc: Loc) -> list[Loc]:
    """Subschemas that every valid instance of ``loc`` must also satisfy (so one that is
    empty makes ``loc`` empty): ``$ref``, ``allOf``, a single ``anyOf``/``oneOf`` branch,
    required properties, the first ``minItems`` items."""
    node = node_at(doc, loc)
    if not isinstance(node, dict):
        return []
    out: list[Loc] = []
    if "$ref" in node:
        try:
            out.append(doc.resolve(node["$ref"], loc))
        except StructgenError:
            pass
        if doc.draft(loc) in OLD_DRAFTS:
            return out
    for kw in ("allOf", "anyOf", "oneOf"):
        subs = node.get(kw)
        if isinstance(subs, list) and (kw == "allOf" or len(subs) == 1):
            out += [_sub(loc, kw, i) for i in range(len(subs))]
    props, req = node.get("properties"), node.get("required")
    if isinstance(props, dict) and isinstance(req, list):
        out += [_sub(loc, "properties", r) for r in req if isinstance(r, str) and r in props]
    m = node.get("minItems")
    if isinstance(m, int) and not isinstance(m, bool) and m > 0:
        items = node.get("items")
        prefix = node.get("prefixItems") if not isinstance(items, list) else items
        kw = "prefixItems" if not isinstance(items, list) else "items"
        n = len(prefix) if isinstance(prefix, list) else 0
        out += [_sub(loc, kw, i) for i in range(min(m, n))]
        rest = "additionalItems" if isinstance(items, list) else "items"
        if m > n and rest in node:
            out.append(_sub(loc, rest))
    return out


def _satisfiable_without(doc: SchemaDoc, norm: Normalizer, loc: Loc, node: dict, keep: Callable[..., bool],
                         deadline: float) -> bool:
    """Is the schema at ``loc`` (not provably) empty once reduced to the keys ``keep``?"""
    patched = {k: v for k, v in node.items() if keep(k)}
    n2 = Normalizer(_PatchedDoc(doc, loc, patched), formats=norm.formats,  # type: ignore[arg-type]
                    lenient=norm.lenient, max_enum=norm.max_enum,
                    format_supported=norm.format_supported, pattern_check=norm.pattern_check,
                    regex_dialect=norm.regex_dialect)
    n2.deadline = deadline
    return not _empty(n2, loc)


def _unsat_keyword(doc: SchemaDoc, norm: Normalizer, loc: Loc, deadline: float) -> str | None:
    """The keyword that makes the (empty) schema at ``loc`` empty: the last one, in the
    order keywords are applied, whose removal makes it satisfiable; else the first one at
    which the keywords applied so far leave nothing."""
    node = node_at(doc, loc)
    if not isinstance(node, dict):
        return None
    if "$ref" in node and doc.draft(loc) in OLD_DRAFTS:
        return "$ref"
    present = [k for k in _APPLY_ORDER if k in node]
    for k in reversed(present):
        if _satisfiable_without(doc, norm, loc, node, lambda x, k=k: x != k, deadline):
            return k
    for j in range(1, len(present) + 1):
        allowed = set(present[:j])
        if not _satisfiable_without(doc, norm, loc, node,
                                    lambda x, a=allowed: x in a or x not in _APPLY_ORDER, deadline):
            return present[j - 1]
    return None


def explain_unsat(doc: SchemaDoc, norm: Normalizer, budget_s: float = DIAGNOSIS_BUDGET_S
                  ) -> tuple[str, str | None] | None:
    """For a root schema that accepts nothing: the pointer of the deepest subschema that
    must hold and accepts nothing, and the keyword responsible there. None when the
    emptiness cannot be traced (or the budget runs out before any answer)."""
    deadline = limits.now() + budget_s
    saved = norm.deadline, norm.time_limit
    norm.deadline, norm.time_limit = deadline, budget_s
    loc = Loc(0, "")
    try:
        if not _empty(norm, loc):
            return None
        seen = {loc}
        while True:
            nxt = next((c for c in _must_children(doc, loc) if c not in seen and _empty(norm, c)), None)
            if nxt is None:
                break
            seen.add(nxt)
            loc = nxt
    except _Timeout:
        pass
    finally:
        norm.deadline, norm.time_limit = saved
    ptr = doc.pointer(loc)
    try:
        kw = _unsat_keyword(doc, norm, loc, deadline)
    except _Timeout:
        kw = None
    if kw is None:
        node = node_at(doc, loc)
        kw = structural_keyword(doc, ptr) if isinstance(node, dict) else keyword_at(ptr)
    return ptr, kw


# ---------------------------------------------------------------------------
# automaton errors -> schema locations
# ---------------------------------------------------------------------------

_EMBED = 12  # regular sub-automata are embedded up to about this size (compiler._EMBED_MAX)


class _Sizes:
    """Estimated NFA states of IR expressions, as the automaton builds them (rules in
    ``calls`` are calls, other references are inlined; big repetitions call their item)."""

    def __init__(self, rules: Mapping[str, ir.Expr], calls: frozenset[str], deadline: float) -> None:
        self.rules, self.calls, self.deadline = rules, calls, deadline
        self._size = expr_size
        self.memo: dict[int, int] = {}
        self._ticks = 0

    def inlined(self, e: ir.Expr) -> bool:
        return isinstance(e, ir.Ref) and e.name not in self.calls and e.name in self.rules

    def children(self, e: ir.Expr) -> tuple[ir.Expr, ...]:
        if isinstance(e, (ir.Seq, ir.Alt)):
            return e.items
        if isinstance(e, ir.Repeat):
            return (e.item,)
        if self.inlined(e):
            return (self.rules[e.name],)  # type: ignore[attr-defined]
        if isinstance(e, (ir.And, ir.Diff)):
            return (e.left, e.right)
        return ()

    def __call__(self, root: ir.Expr) -> int:
        memo = self.memo
        if id(root) in memo:
            return memo[id(root)]
        active: set[int] = set()
        stack: list[tuple[ir.Expr, bool]] = [(root, False)]
        while stack:
            x, done = stack.pop()
            k = id(x)
            if k in memo:
                continue
            if not done:
                self._ticks += 1
                if self._ticks & 4095 == 0 and limits.now() > self.deadline:
                    raise _Timeout()
                active.add(k)
                stack.append((x, True))
                stack.extend((c, False) for c in self.children(x)
                             if id(c) not in memo and id(c) not in active)
                continue
            active.discard(k)
            kids = [memo.get(id(c), 1) for c in self.children(x)]
            if isinstance(x, ir.ByteSet):
                n = 1
            elif isinstance(x, ir.Seq):
                n = sum(kids)
            elif isinstance(x, ir.Alt):
                n = 1 + sum(1 + c for c in kids)
            elif isinstance(x, ir.Repeat):
                reps = x.max if x.max is not None else max(x.min, 1)
                item = kids[0]
                if reps > 2 and not isinstance(x.item, ir.Ref) and \
                        self._size(x.item) * reps > 2000:
                    item = 2  # the automaton calls a hoisted rule for the item
                n = 2 + (x.min + (x.max - x.min if x.max is not None else 1)) * item
            elif isinstance(x, ir.Ref):
                n = kids[0] if kids else 1
            elif isinstance(x, (ir.And, ir.Diff)):
                n = min(sum(kids), _EMBED)
            else:
                n = _EMBED
            memo[k] = n
        return memo[id(root)]


def _biggest_part(rule: str, rules: Mapping[str, ir.Expr], calls: frozenset[str],
                  rule_where: Mapping[str, str], rule_kw: Mapping[str, str],
                  expr_kw: Mapping[ir.Expr, str], deadline: float) -> tuple[str | None, str | None]:
    """Follow the part of ``rule`` that makes most of its automaton (a child that is at
    least half of its parent), down to where the size is made: a large repetition (a
    length or item bound), a sum of many parts (an object's properties), ... The schema
    location is that of the innermost rule entered, the keyword the last one recorded
    for an expression on the way (or for that rule)."""
    sizes = _Sizes(rules, calls, deadline)
    ptr, kw = rule_where.get(rule), rule_kw.get(rule)
    x: ir.Expr = rules[rule]
    for _ in range(100_000):
        got = expr_kw.get(x)
        if got is not None:
            kw = got
        if sizes.inlined(x):
            name = x.name  # type: ignore[attr-defined]
            if name in rule_where:
                ptr, kw = rule_where[name], rule_kw.get(name)
            x = rules[name]
            continue
        if isinstance(x, (ir.Seq, ir.Alt)):
            kids = x.items
        elif isinstance(x, ir.Repeat):
            kids = (x.item,)
        else:
            break
        if not kids:
            break
        best = max(kids, key=sizes)
        if 2 * sizes(best) < sizes(x):
            break
        x = best
    return ptr, kw


def locate_automaton_error(e: CompileLimitError, doc: SchemaDoc | None, rules: Mapping[str, ir.Expr],
                           rule_where: Mapping[str, str], rule_kw: Mapping[str, str],
                           expr_kw: Mapping[ir.Expr, str],
                           budget_s: float = DIAGNOSIS_BUDGET_S) -> tuple[str | None, str | None]:
    """Schema pointer and keyword for an automaton error on the lowering's grammar.

    An intersection or difference being built names its keyword (``pattern``, ``not``,
    ...); otherwise the largest part of the rule being built is followed to where its
    size comes from. The pointer is the location of the rule (the innermost one inlined).
    """
    rule = getattr(e, "rule", None)
    ptr = rule_where.get(rule) if rule else None
    kw = None
    for x in reversed(getattr(e, "ir_exprs", ())):
        kw = expr_kw.get(x)
        if kw is not None:
            break
    if kw is None and rule is not None and rule in rules:
        try:
            p2, kw = _biggest_part(rule, rules, getattr(e, "ir_calls", frozenset()), rule_where,
                                   rule_kw, expr_kw, limits.now() + budget_s)
            ptr = p2 or ptr
        except _Timeout:
            kw = None
    if kw is None and rule:
        kw = rule_kw.get(rule)
    if kw is None and ptr is not None:
        kw = structural_keyword(doc, ptr)
    return ptr, kw


# ---------------------------------------------------------------------------
# compiled rules -> schema locations (for errors raised while the grammar is used)
# ---------------------------------------------------------------------------

_SOURCE_WALK = 200_000  # IR nodes visited placing the rules, at most (then coarser answers)
_ESCAPES = ("all", "canonical")


def _pattern_sites(doc: SchemaDoc, regex_dialect: str = "ecma262") -> dict[ir.Expr, tuple[str, str]]:
    """Every regular expression of the schema documents -- ``pattern``, ``patternProperties``
    keys, ``propertyNames``' patterns -- by its compiled language (in each escape form, read
    in ``regex_dialect``):
    (pointer of the schema holding it, its keyword). The patterns are the parts of a schema
    whose automata can grow exponentially when determinised."""
    sites: dict[ir.Expr, tuple[str, str]] = {}

    def add(p: object, where: str, kw: str) -> None:
        if not isinstance(p, str):
            return
        for esc in _ESCAPES:
            try:
                sites.setdefault(compile_pattern(p, esc, regex_dialect), (where, kw))
            except StructgenError:
                return

    for loc in list(doc.bases):
        try:
            node = doc.node(loc)
        except StructgenError:
            continue
        if not isinstance(node, dict):
            continue
        where = doc.pointer(loc)
        add(node.get("pattern"), where, "pattern")
        pats = node.get("patternProperties")
        if isinstance(pats, dict):
            for p in pats:
                add(p, where, "patternProperties")
    return sites


class _RuleWalk:
    """Walks rule bodies (following the references the compiler inlined) to find where
    sub-expressions sit: the schema location each inlined rule stands for, and the patterns
    whose languages appear (a pattern searched in a string is spliced into its sequence, so a
    sequence that holds a pattern's items in a row holds the pattern)."""

    def __init__(self, rules: Mapping[str, ir.Expr], called: set[str], rule_where: Mapping[str, str],
                 sites: dict[ir.Expr, tuple[str, str]]) -> None:
        self.rules, self.called, self.rule_where, self.sites = rules, called, rule_where, sites
        # first item -> (the items, the sequence) of each pattern that is a sequence
        self.runs: dict[ir.Expr, list[tuple[tuple[ir.Expr, ...], ir.Expr]]] = {}
        for e in sites:
            if isinstance(e, ir.Seq) and e.items:
                self.runs.setdefault(e.items[0], []).append((e.items, e))
        self.left = _SOURCE_WALK

    def walk(self, rule: str, wanted: set[ir.Expr]) -> tuple[list[tuple[ir.Expr, tuple[str, str]]],
                                                              dict[ir.Expr, str]]:
        """(the patterns found in ``rule``'s body: (language, site)); the pointer of the
        innermost inlined rule each expression of ``wanted`` sits in)."""
        found: list[tuple[ir.Expr, tuple[str, str]]] = []
        placed: dict[ir.Expr, str] = {}
        body = self.rules.get(rule)
        if body is None:
            return found, placed
        seen: set[int] = set()
        stack: list[tuple[ir.Expr, str]] = [(body, self.rule_where.get(rule, "#"))]
        while stack and self.left > 0:
            x, where = stack.pop()
            if id(x) in seen:
                continue
            seen.add(id(x))
            self.left -= 1
            if x in wanted:
                placed.setdefault(x, where)
            site = self.sites.get(x)
            if site is not None:
                found.append((x, site))
                continue
            if isinstance(x, ir.Seq):
                items = x.items
                for i, item in enumerate(items):
                    for run, seq in self.runs.get(item, ()):
                        if items[i:i + len(run)] == run:
                            found.append((seq, self.sites[seq]))
                stack.extend((c, where) for c in items)
            elif isinstance(x, ir.Alt):
                stack.extend((c, where) for c in x.items)
            elif isinstance(x, ir.Repeat):
                stack.append((x.item, where))
            elif isinstance(x, (ir.And, ir.Diff)):
                stack.extend(((x.left, where), (x.right, where)))
            elif isinstance(x, ir.Ref) and x.name not in self.called and x.name in self.rules:
                stack.append((self.rules[x.name], self.rule_where.get(x.name, where)))
        return found, placed


def rule_sources(cg: CompiledGrammar, grammar: ir.Grammar, rule_where: Mapping[str, str],
                 rule_kw: Mapping[str, str], expr_kw: Mapping[ir.Expr, str],
                 doc: SchemaDoc, *, regex_dialect: str = "ecma262") -> tuple[RuleSource, ...]:
    """Per compiled rule of ``cg`` (compiled from the lowering's ``grammar``), its schema
    location and keyword. A rule the compiler made from a sub-expression gets that
    expression's keyword and the location of the rule it sits in; a rule of the grammar gets
    the pattern in its body whose automaton is largest -- patterns are what can make a rule's
    determinised automaton explode -- else its own location and keyword. ``regex_dialect``: how
    the lowering read the schema's patterns (``JsonSchemaOptions.regex_dialect``), so that their
    languages are found in the grammar. Costs one walk of the grammar (at most
    :data:`_SOURCE_WALK` nodes)."""
    sources = cg.rule_sources
    exprs = cg.rule_exprs
    called = {r.name for r in cg.rules if isinstance(r, LazyRule)}
    sites = _pattern_sites(doc, regex_dialect)
    walker = _RuleWalk(grammar.rules, called, rule_where, sites)
    wanted_by_owner: dict[str, set[ir.Expr]] = {}
    for src, e in zip(sources, exprs):
        if e is not None:
            wanted_by_owner.setdefault(src.rule, set()).add(e)
    walks: dict[str, tuple[list[tuple[ir.Expr, tuple[str, str]]], dict[ir.Expr, str]]] = {}
    structural: dict[str, str | None] = {}  # pointer -> its structural keyword (sizes the schema there)
    out = []
    for i, (src, e) in enumerate(zip(sources, exprs)):
        owner = src.rule
        if owner not in walks:
            walks[owner] = walker.walk(owner, wanted_by_owner.get(owner, set())) if (
                sites or owner in wanted_by_owner) else ([], {})
        found, placed = walks[owner]
        ptr, kw = rule_where.get(owner), rule_kw.get(owner)
        if e is not None:
            inner = [(x, site) for x, site in found if x == e or _holds(e, x)]
            if inner:
                ptr, kw = max(inner, key=lambda f: expr_size(f[0]))[1]
            else:
                ptr = placed.get(e, ptr)
            kw = expr_kw.get(e, kw)
        elif isinstance(cg.rules[i], LazyRule) and found:
            ptr, kw = max(found, key=lambda f: expr_size(f[0]))[1]
        ptr = ptr or "#"  # every rule is somewhere in the schema: the root at the coarsest
        if kw is None:
            if ptr not in structural:
                structural[ptr] = structural_keyword(doc, ptr)
            kw = structural[ptr]
        out.append(RuleSource(src.rule, ptr, kw, src.line))
    return tuple(out)


def _holds(e: ir.Expr, part: ir.Expr) -> bool:
    """Is ``part`` one of the operands of intersection/difference ``e`` (or ``e``'s item)?"""
    if isinstance(e, (ir.And, ir.Diff)):
        return part in (e.left, e.right)
    if isinstance(e, ir.Repeat):
        return part == e.item
    return False
