"""Rewrites of grammar IR before it becomes automata, each written once: inlining support
(expression sizes, reference counts), merging rules with equal bodies, sharing repeated
sub-expressions as rules, hoisting names, and left-recursion removal.

Every pass is a pure function of its inputs except where stated (the rule dictionaries
they are given are updated in place, as documented per function). Passes recurse over
expression nesting only where noted; the rest walk the expression DAG iteratively, each
shared node once.
"""

from __future__ import annotations

from collections.abc import Iterator

from structgen.errors import GrammarError
from structgen.grammar import ir
from structgen.grammar.graphs import strongly_connected_components

__all__ = ["Counted", "count_refs", "eliminate_left_recursion", "expanded_size", "expr_size",
           "hoisted_name", "merge_equal_rules", "nullable", "nullable_rules", "prefixed_grammar",
           "remove_immediate_left_recursion", "share_common"]

SHARE_MIN = 24           # repeated sub-expressions of at least this size become shared rules
_MAX_LEFT_EXPANSION = 1_000  # steps of distributing one rule's leading branches


class Counted(ir.Repeat):
    """A bounded repetition the compiler builds as a
    :class:`~structgen.grammar.compiled.CountedRule` call (the item is closed and
    prefix-free); elsewhere (inside an intersection operand) it unrolls as the
    :class:`~structgen.grammar.ir.Repeat` it is."""

    __slots__ = ()

    def __init__(self, item: ir.Expr, min: int, max: int | None) -> None:
        super().__init__(item, min, max)
        object.__setattr__(self, "_sz", 2)  # a call of its counted rule


def merge_equal_rules(start: str, reach: set[str], rules: dict[str, ir.Expr],
                       origin: dict[str, str]) -> bool:
    """Merge reachable rules with structurally equal bodies into one (references to the
    others are renamed; repeated while merging makes more bodies equal). ``reach`` and
    ``rules`` are updated in place; returns whether anything was merged."""
    merged = False
    for _ in range(8):
        canon: dict[ir.Expr, str] = {}
        alias: dict[str, str] = {}
        for n in [start] + sorted(reach - {start}):
            c = canon.setdefault(rules[n], n)
            if c != n:
                alias[n] = c
        if not alias:
            break
        merged = True
        for n, c in alias.items():
            reach.discard(n)
            origin.setdefault(c, origin.get(n, n))
        memo: dict[int, ir.Expr] = {}
        for n in reach:
            rules[n] = _rename_refs(rules[n], alias, memo)
    return merged


def _rename_refs(e: ir.Expr, alias: dict[str, str], memo: dict[int, ir.Expr]) -> ir.Expr:
    """``e`` with every ``Ref(a)`` for ``a`` in ``alias`` replaced by ``Ref(alias[a])``."""
    got = memo.get(id(e))
    if got is not None:
        return got
    out: ir.Expr = e
    if alias.keys().isdisjoint(e.refs()):
        pass  # nothing to rename below
    elif isinstance(e, ir.Ref):
        if e.name in alias:
            out = ir.Ref(alias[e.name])
    elif isinstance(e, (ir.Seq, ir.Alt)):
        items = tuple(_rename_refs(x, alias, memo) for x in e.items)
        if any(a is not b for a, b in zip(items, e.items)):
            out = type(e)(items)
    elif isinstance(e, ir.Repeat):
        item = _rename_refs(e.item, alias, memo)
        if item is not e.item:
            out = ir.Repeat(item, e.min, e.max)
    elif isinstance(e, (ir.And, ir.Diff)):
        left, right = _rename_refs(e.left, alias, memo), _rename_refs(e.right, alias, memo)
        if left is not e.left or right is not e.right:
            out = type(e)(left, right)
    memo[id(e)] = out
    return out


def expr_size(e: ir.Expr) -> int:
    """Rough NFA size of an expression (for inlining decisions): 1 per node, a repetition's
    item times its bound (at most 10,000), an intersection's operands multiplied, a counted
    repetition 2 (a call of its rule). Set on each node when it is made."""
    return e._sz


def hoisted_name(prefix: str, e: ir.Expr, hoisted: dict[ir.Expr, str], rules: dict[str, ir.Expr]) -> str:
    """A fresh rule name for the hoisted sub-expression ``e``, recorded in ``hoisted``."""
    name = f"{prefix}{len(hoisted)}"
    while name in rules:
        name += "_"
    hoisted[e] = name
    return name



def share_common(names: list[str], rules: dict[str, ir.Expr], hoisted: dict[ir.Expr, str],
                 origin: dict[str, str]) -> None:
    """Hoist sub-expressions of size >= ``SHARE_MIN`` that occur more than once."""
    count: dict[ir.Expr, int] = {}
    stack = [rules[n] for n in names]
    seen_ids: set[int] = set()
    while stack:
        x = stack.pop()
        if isinstance(x, (ir.Seq, ir.Alt, ir.Repeat)) and expr_size(x) >= SHARE_MIN:
            if isinstance(x, Counted):
                count[x] = count.get(x, 0) + 1
                continue  # its item is built once, as the counted rule's table
            c = count.get(x, 0)
            count[x] = c + 1
            if c or id(x) in seen_ids:
                continue  # children already counted for this content
            seen_ids.add(id(x))
            stack.extend(x.items if isinstance(x, (ir.Seq, ir.Alt)) else (x.item,))
    shared = {x for x, c in count.items() if c > 1}
    if not shared:
        return
    done: dict[int, ir.Expr] = {}
    owner = [""]

    def rewrite(e: ir.Expr, top: bool) -> ir.Expr:
        if expr_size(e) < SHARE_MIN:
            return e  # nothing this small is shared, nor anything below it
        got = done.get(id(e))
        if got is not None and not top:
            return got
        if not top and e in shared:
            name = hoisted.get(e)
            if name is None:
                name = hoisted_name("__cse", e, hoisted, rules)
                origin[name] = owner[0]
                rules[name] = rewrite(e, True)
            out: ir.Expr = ir.Ref(name)
        elif isinstance(e, (ir.Seq, ir.Alt)):
            items = tuple(rewrite(x, False) for x in e.items)
            out = e if all(a is b for a, b in zip(items, e.items)) else type(e)(items)
        elif isinstance(e, Counted):
            out = e
        elif isinstance(e, ir.Repeat):
            item = rewrite(e.item, False)
            out = e if item is e.item else ir.Repeat(item, e.min, e.max)
        else:
            out = e
        if not top:
            done[id(e)] = out
        return out

    for n in names:
        owner[0] = origin.get(n, n)
        rules[n] = rewrite(rules[n], True)

def count_refs(e: ir.Expr, counter: dict[str, int]) -> None:
    """Add to ``counter`` how often each rule is referenced in ``e`` (a repetition counts its
    item at most twice: enough to tell rules used once from shared ones)."""
    stack = [e]
    while stack:
        x = stack.pop()
        if not x.refs():
            continue  # (cached per node) nothing to count below
        if isinstance(x, ir.Ref):
            counter[x.name] = counter.get(x.name, 0) + 1
        elif isinstance(x, (ir.Seq, ir.Alt)):
            stack.extend(x.items)
        elif isinstance(x, ir.Repeat):
            k = x.max if x.max is not None else max(x.min, 1)
            for _ in range(min(k, 2)):
                stack.append(x.item)
        elif isinstance(x, (ir.And, ir.Diff)):
            stack.append(x.left)
            stack.append(x.right)


# ---------------------------------------------------------------------------
# Left recursion
# ---------------------------------------------------------------------------

def nullable_rules(rules: dict[str, ir.Expr]) -> dict[str, bool]:
    """Per rule, whether it derives the empty string (least fixpoint over the rules)."""
    null = dict.fromkeys(rules, False)
    changed = True
    while changed:
        changed = False
        for name, e in rules.items():
            if not null[name] and nullable(e, null):
                null[name] = changed = True
    return null


def nullable(e: ir.Expr, null: dict[str, bool]) -> bool:
    """Whether ``e`` matches the empty string, given the rules' nullability ``null`` (a rule
    missing from it counts as not nullable). Recurses over the expression's nesting."""
    if isinstance(e, ir.ByteSet):
        return False
    if isinstance(e, ir.Seq):
        return all(nullable(x, null) for x in e.items)
    if isinstance(e, ir.Alt):
        return any(nullable(x, null) for x in e.items)
    if isinstance(e, ir.Repeat):
        return e.min == 0 or nullable(e.item, null)
    if isinstance(e, ir.Ref):
        return null.get(e.name, False)
    if isinstance(e, ir.And):
        return nullable(e.left, null) and nullable(e.right, null)
    if isinstance(e, ir.Diff):
        return nullable(e.left, null) and not nullable(e.right, null)
    if isinstance(e, ir.Dfa):
        return e.start in e.accept
    raise TypeError(f"unknown IR node {type(e).__name__}")


def _left_refs(e: ir.Expr, null: dict[str, bool], out: set[str]) -> None:
    """Add to ``out`` the rules that can be called before any byte is consumed in ``e``."""
    if isinstance(e, ir.Ref):
        out.add(e.name)
    elif isinstance(e, ir.Seq):
        for x in e.items:
            _left_refs(x, null, out)
            if not nullable(x, null):
                break
    elif isinstance(e, ir.Alt):
        for x in e.items:
            _left_refs(x, null, out)
    elif isinstance(e, ir.Repeat):
        if e.max != 0:
            _left_refs(e.item, null, out)
    elif isinstance(e, (ir.And, ir.Diff)):
        _left_refs(e.left, null, out)
        _left_refs(e.right, null, out)


def _leading_branches(items: tuple[ir.Expr, ...], name: str, null: dict[str, bool],
                      budget: list[int], active: set[tuple[ir.Expr, ...]] | None = None
                      ) -> list[tuple[ir.Expr, ...]]:
    """Distribute leading Seq/Alt/Repeat of ``items`` so that any branch that can start with
    ``Ref(name)`` visibly does; other branches are left intact. The union of the returned
    branches is the language of ``items``."""
    if not items:
        return [()]
    first, rest = items[0], items[1:]
    lead: set[str] = set()
    _left_refs(first, null, lead)
    can_be_empty = nullable(first, null)
    rest_lead: set[str] = set()
    if can_be_empty:
        for x in rest:
            _left_refs(x, null, rest_lead)
            if not nullable(x, null):
                break
    if name not in lead and name not in rest_lead:
        return [items]
    if isinstance(first, ir.Ref) or not isinstance(first, (ir.Seq, ir.Alt, ir.Repeat)):
        return [items]
    if isinstance(first, ir.Repeat) and first.max == 0:
        return [items]
    active = set() if active is None else active
    if items in active:
        # reached again without consuming input (through empty choices): by the least
        # fixpoint this branch adds nothing the others do not already give
        return []
    budget[0] -= 1
    if budget[0] < 0:
        raise GrammarError(f"left recursion of rule {name!r} is too entangled to remove; "
                           "rewrite it with repetition")
    active.add(items)
    try:
        if isinstance(first, ir.Seq):
            return _leading_branches(first.items + rest, name, null, budget, active)
        if isinstance(first, ir.Alt):
            out: list[tuple[ir.Expr, ...]] = []
            for x in first.items:
                out.extend(_leading_branches((x,) + rest, name, null, budget, active))
            return out
        assert isinstance(first, ir.Repeat)
        # item{m,M} = item item{m-1,M-1}   (m >= 1)   |   eps | item item{0,M-1}   (m == 0)
        more = ir.rep(first.item, max(first.min - 1, 0), None if first.max is None else first.max - 1)
        out = _leading_branches((first.item, more) + rest, name, null, budget, active)
        if first.min == 0:
            out = _leading_branches(rest, name, null, budget, active) + out
        return out
    finally:
        active.discard(items)


def _left_graph(rules: dict[str, ir.Expr], null: dict[str, bool]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, e in rules.items():
        s: set[str] = set()
        _left_refs(e, null, s)
        graph[name] = {x for x in s if x in rules}
    return graph


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components, each in rule (definition) order."""
    order = {n: i for i, n in enumerate(graph)}
    return strongly_connected_components(graph, graph, key=order.__getitem__)


def _substitute_leading(e: ir.Expr, target: str, body: ir.Expr, null: dict[str, bool]) -> ir.Expr:
    """``e`` with every leading ``Ref(target)`` replaced by ``body`` (same language)."""
    lead: set[str] = set()
    _left_refs(e, null, lead)
    if target not in lead:
        return e
    branches = _leading_branches((e,), target, null, [_MAX_LEFT_EXPANSION])
    return ir.alt(*(ir.seq(body, *br[1:]) if br and br[0] == ir.Ref(target) else ir.seq(*br)
                    for br in branches))


def remove_immediate_left_recursion(name: str, e: ir.Expr, null: dict[str, bool]) -> ir.Expr:
    """``A -> A a | b``  =>  ``A -> b a*`` for rule ``name`` with body ``e`` (same language).

    Branches that start with ``Ref(name)`` only after nested sequences, alternatives,
    repetitions or nullable items (per ``null``, the rules' nullability; ``{}`` treats every
    reference as non-nullable) are first distributed so that they visibly do. Returns ``e``
    itself when it has no leading self-reference. Raises GrammarError when the distribution
    would exceed ``_MAX_LEFT_EXPANSION`` steps."""
    if name not in e.refs():
        return e  # (cached per node) no self-reference at all
    lead: set[str] = set()
    _left_refs(e, null, lead)
    if name not in lead:
        return e
    rec: list[ir.Expr] = []
    base: list[ir.Expr] = []
    found = False
    for br in _leading_branches((e,), name, null, [_MAX_LEFT_EXPANSION]):
        if br and br[0] == ir.Ref(name):
            found = True
            tail = ir.seq(*br[1:])
            if tail != ir.EMPTY:  # A -> A adds nothing
                rec.append(tail)
        else:
            base.append(ir.seq(*br))
    return ir.seq(ir.alt(*base), ir.star(ir.alt(*rec))) if found else e


def _paull(rules: dict[str, ir.Expr], max_size: int) -> tuple[dict[str, ir.Expr], list[str] | None]:
    """Paull's algorithm per left-recursive group; returns the rules and a remaining cycle."""
    null = nullable_rules(rules)  # the rewrites preserve each rule's language
    out = dict(rules)
    for comp in _sccs(_left_graph(rules, null)):
        if len(comp) == 1 and comp[0] not in _left_graph({comp[0]: out[comp[0]]}, null)[comp[0]]:
            continue
        for i, a in enumerate(comp):
            e = out[a]
            for b in comp[:i]:
                e = _substitute_leading(e, b, out[b], null)
            out[a] = remove_immediate_left_recursion(a, e, null)
        if expanded_size({n: out[n] for n in comp}, cap=max_size) > max_size:
            raise GrammarError(f"removing the left recursion of rules {', '.join(comp)} makes the "
                               "grammar too large; rewrite it with repetition")
    return out, _find_cycle(_left_graph(out, nullable_rules(out)))


def _nonempty(e: ir.Expr, null: dict[str, bool]) -> ir.Expr:
    """L(e) without the empty string, for ``e`` whose nullable rule references are already
    written as ``opt(Ref(A+))`` (so nullability is syntactic)."""
    if isinstance(e, (ir.ByteSet, ir.Ref)):
        return e if not nullable(e, null) else ir.NEVER
    if isinstance(e, ir.Seq):
        if not e.items:
            return ir.NEVER
        head, rest = e.items[0], ir.seq(*e.items[1:])
        first = ir.seq(_nonempty(head, null), rest)
        return ir.alt(first, _nonempty(rest, null)) if nullable(head, null) else first
    if isinstance(e, ir.Alt):
        return ir.alt(*(_nonempty(x, null) for x in e.items))
    if isinstance(e, ir.Repeat):
        if e.max == 0:
            return ir.NEVER
        if nullable(e.item, null):  # empty items can pad up to the minimum
            return ir.rep(_nonempty(e.item, null), 1, e.max)
        return e if e.min >= 1 else ir.rep(e.item, 1, e.max)
    if isinstance(e, ir.Dfa):
        if e.start not in e.accept:
            return e
        return ir.Dfa(len(e.trans), e.accept, list(e.trans) + [e.trans[e.start]])
    if isinstance(e, ir.And):
        return ir.and_(_nonempty(e.left, null), e.right)
    if isinstance(e, ir.Diff):
        return ir.diff(_nonempty(e.left, null), e.right)
    raise TypeError(f"unknown IR node {type(e).__name__}")


def _replace_refs(e: ir.Expr, repl: dict[str, ir.Expr]) -> ir.Expr:
    if isinstance(e, ir.Ref):
        return repl.get(e.name, e)
    if isinstance(e, ir.Seq):
        return ir.seq(*(_replace_refs(x, repl) for x in e.items))
    if isinstance(e, ir.Alt):
        return ir.alt(*(_replace_refs(x, repl) for x in e.items))
    if isinstance(e, ir.Repeat):
        return ir.rep(_replace_refs(e.item, repl), e.min, e.max)
    if isinstance(e, ir.And):
        return ir.and_(_replace_refs(e.left, repl), _replace_refs(e.right, repl))
    if isinstance(e, ir.Diff):
        return ir.diff(_replace_refs(e.left, repl), _replace_refs(e.right, repl))
    return e


def _without_empty_rules(rules: dict[str, ir.Expr], start: str) -> dict[str, ir.Expr]:
    """An equivalent grammar in which no rule but ``start`` derives the empty string: each
    nullable rule A gets a rule ``A+`` for its non-empty strings and every reference to A
    becomes ``opt(Ref(A+))``."""
    null = nullable_rules(rules)
    plus = {a: f"{a}+" for a, n in null.items() if n}
    repl = {a: ir.opt(ir.Ref(p)) for a, p in plus.items()}
    null2 = dict.fromkeys(list(rules) + list(plus.values()), False)
    out: dict[str, ir.Expr] = {}
    for a, e in rules.items():
        body = _replace_refs(e, repl)
        if a in plus:
            out[plus[a]] = _nonempty(body, null2)
            if a == start:
                out[a] = ir.opt(ir.Ref(plus[a]))
        else:
            out[a] = body
    return _prune(out, start)


def _prune(rules: dict[str, ir.Expr], start: str) -> dict[str, ir.Expr]:
    keep = {start}
    todo = [start]
    while todo:
        for r in rules[todo.pop()].refs():
            if r not in keep and r in rules:
                keep.add(r)
                todo.append(r)
    return {n: e for n, e in rules.items() if n in keep}


def eliminate_left_recursion(rules: dict[str, ir.Expr], start: str, *, max_size: int) -> dict[str, ir.Expr]:
    """Remove left recursion without changing the language. Within each left-recursive
    group of rules A1..An (in rule order), leading references to earlier rules of the
    group are replaced by their (already rewritten) bodies, then immediate left recursion
    ``A -> A a | b`` becomes ``A -> b a*`` (Paull's algorithm). If left recursion hidden
    behind rules that derive the empty string survives, the grammar is first made
    empty-free (see :func:`_without_empty_rules`) and the algorithm rerun."""
    out, cycle = _paull(rules, max_size)
    if cycle:
        out, cycle = _paull(_without_empty_rules(rules, start), max_size)
    if cycle:  # pragma: no cover - an empty-free grammar has no hidden left recursion
        path = " -> ".join(cycle + [cycle[0]])
        raise GrammarError(f"left recursion through rules {path} could not be removed; "
                           "rewrite it with repetition")
    return out


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(graph, WHITE)
    for root in sorted(graph):
        if color[root] != WHITE:
            continue
        stack: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        path = [root]
        color[root] = GREY
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                color[node] = BLACK
            elif color[nxt] == GREY:
                return path[path.index(nxt):]
            elif color[nxt] == WHITE:
                color[nxt] = GREY
                path.append(nxt)
                stack.append((nxt, iter(sorted(graph[nxt]))))
    return None


# ---------------------------------------------------------------------------
# Size guard
# ---------------------------------------------------------------------------

def expanded_size(rules: dict[str, ir.Expr], *, cap: int) -> int:
    """IR nodes of ``rules`` with every bounded repetition expanded, counted up to just past
    ``cap`` (a size guard: the count stops growing there). Recurses over nesting; shared
    nodes are counted once per occurrence but computed once."""
    memo: dict[int, int] = {}

    def size(e: ir.Expr) -> int:
        k = id(e)
        got = memo.get(k)
        if got is not None:
            return got
        if isinstance(e, (ir.Seq, ir.Alt)):
            r = 1 + sum(size(x) for x in e.items)
        elif isinstance(e, ir.Repeat):
            r = 1 + size(e.item) * max(1, e.max if e.max is not None else e.min)
        elif isinstance(e, (ir.And, ir.Diff)):
            r = 1 + size(e.left) + size(e.right)
        elif isinstance(e, ir.Dfa):
            r = 1 + len(e.trans)
        else:
            r = 1
        r = min(r, cap + 1)
        memo[k] = r
        return r

    total = 0
    for e in rules.values():
        total += size(e)
        if total > cap:
            break
    return total


def prefixed_grammar(grammar: ir.Grammar, prefix: str) -> dict[str, ir.Expr]:
    """The rules of ``grammar`` renamed to ``prefix + name`` (references included), so that
    several grammars can live side by side in one rule set; the start rule becomes
    ``prefix + grammar.start``."""
    alias = {name: prefix + name for name in grammar.rules}
    memo: dict[int, ir.Expr] = {}
    return {alias[name]: _rename_refs(e, alias, memo) for name, e in grammar.rules.items()}
