"""Lark grammar text -> structgen grammar IR (and a compiled grammar).

Semantics
---------
A Lark grammar is read *scannerless*, exactly as
``lark.Lark(text, parser="earley", lexer="dynamic_complete", start=start)`` reads it: a
string is accepted iff that Lark parser parses it completely. Concretely:

* **Terminals** are regular languages. String literals become literal bytes (UTF-8);
  ``"..."i`` matches case-insensitively with Python ``re``'s case equivalence (so
  ``"like"i`` also matches ``LIKE`` spelled with the Kelvin sign, as Lark does).
  ``/regex/flags`` goes through :func:`structgen.frontends.regex.compile_regex` (Python dialect,
  Lark's flags). ``"a".."z"`` is a code-point range. Terminals that use other terminals
  are inlined (no ``%ignore`` inside a terminal). Terminal priorities are ignored.
* **Rules** become IR rules over :class:`~structgen.grammar.ir.Ref`. EBNF operators map to IR
  repetition directly (``x*`` -> ``star``, ``x+`` -> ``plus``, ``x?``/``[x]`` -> ``opt``,
  ``x ~ n`` / ``x ~ n..m`` -> ``rep``), so repetitions never become recursive rules.
  Left recursion is removed without changing the language: immediate left recursion
  (``a: a x | y``) becomes ``y x*``, and left recursion through other rules is first
  made immediate by substituting leading rule references (Paull's algorithm), after
  making the grammar empty-free when left recursion hides behind rules that can match
  the empty string (``a: b a x`` with ``b`` nullable). So every context-free Lark
  grammar converts; only an excessive size increase raises GrammarError.
* ``%ignore`` terminals may occur at the beginning and end of the input and between any
  two terminals of the rule level, *as Lark munches them*: at a token boundary Lark tries
  the next token right there and after each ignore match, and an ignore match is the
  longest one (its regex's first match). For the usual ignore terminals (whitespace runs,
  line and block comments: every character that extends a match keeps it a match) that
  is a one-byte lookahead condition, which structgen builds into the text before each
  terminal occurrence and at the end of the start rule (see :class:`_Ignore`); so a
  comment can never be cut short and its tail read as tokens. Each boundary gets exactly
  one such piece, which adds no ambiguity of its own.
* Things that do not change the language are ignored: rule and terminal priorities,
  ``?rule`` inlining, ``_rule``/``_TERM`` filtering, ``!rule``, aliases (``-> name``).
  Templates are expanded (one IR rule per distinct instantiation); ``%import`` of Lark's
  own grammars (``common``, ``unicode``, ...) is resolved through Lark, as are
  ``%override`` and ``%extend``. ``%import`` reads nothing else but structgen's packaged
  grammars, the folders the caller allows (``import_paths``) and, for relative imports, the
  folder of the grammar file (``grammar_path``); never the working folder.

Errors (all :class:`~structgen.errors.GrammarError` or a subclass):
grammar syntax errors -> :class:`~structgen.errors.GrammarSyntaxError` with line, column
and a caret line; undefined or duplicate names -> the line where the name is used or
defined (when it can be found in the text); ``%declare`` (a terminal fed by an external
lexer cannot be enforced scannerless); an ``%import`` outside the allowed places (relative
``%import`` in grammar text without a file); an unsupported regex (the
:class:`~structgen.errors.RegexError` is wrapped, naming the terminal); repetition
counts above :data:`MAX_REPEAT`; grammars that expand above :data:`MAX_EXPANDED_SIZE`.

Where structgen deliberately differs from Lark
----------------------------------------------
* Lark's dynamic lexer finds a regex terminal's possible lengths with Python's
  leftmost-first backtracking (the first match, then re-matching its prefixes). That
  misses lengths a regex could match when it prefers a shorter match: lazy quantifiers
  (``/a+?/`` only ever matches ``a``), anchors (``^``/``$`` refer to the whole input, not
  the token) and alternations whose earlier branch is a prefix of a later one
  (``/a|ab/`` never matches ``ab``). Lazy quantifiers and anchors in a terminal raise
  :class:`GrammarError`; for prefix-ordered alternations structgen uses the regex's full
  (declarative) language, a superset of what Lark finds. (Lark itself sorts the
  alternatives of a *composite* terminal longest-first, so ``"a" | "ab"`` is fine.)
* An ``%ignore`` terminal for which "longest match" is not a one-byte lookahead (some
  character extends a match into a non-match, e.g. ``/a(bc)?/``) makes structgen fall
  back to allowing any sequence of ignore matches at a boundary (``star``), a superset of
  what Lark allows.
* Lark's ``common.ESCAPED_STRING`` and ``common.C_COMMENT`` are written with a lazy
  quantifier (and a lookbehind); under Lark's dynamic lexer they match exactly
  ``"(?:[^"\\\\\\n]|\\\\[^\\n])*"`` and ``/\\*(?:[^*]|\\*+[^*/])*\\*+/``, which is what
  structgen uses for them.
* Extensions (grammars Lark rejects but whose meaning is clear): terminals that can match
  the empty string (Lark: "Dynamic Earley doesn't allow zero-width regexps") and the
  empty literal ``""``. Lark's purely structural checks that do not concern the language
  (duplicate alternatives ``a: b | b``, aliases on ``_rule``s) are not repeated; every
  other grammar error Lark reports is an error here too.
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, cast

from structgen import grammars
from structgen.config import CompileOptions
from structgen.errors import GrammarError, RegexError
from structgen.frontends import regex as rx
from structgen.frontends.lark_loader import (
    definition_lines,
    directive_line,
    grammar_error,
    import_folders,
    lark_import_loader,
    load_lark_grammar,
    locate,
    token_position,
)
from structgen.grammar import fsa, ir
from structgen.grammar.compiled import CompiledGrammar
from structgen.grammar.compiler import compile_grammar
from structgen.grammar.gcpause import gc_paused
from structgen.grammar.passes import eliminate_left_recursion, expanded_size, nullable

if TYPE_CHECKING:  # pragma: no cover - lark itself is imported when a grammar is read
    from lark.grammar import Symbol
    from lark.lexer import Token as LarkToken
    from lark.load_grammar import Grammar
    from lark.tree import Tree

__all__ = [
    "MAX_REPEAT", "MAX_EXPANDED_SIZE", "lark_to_grammar", "compile_lark",
    "builtin_grammar", "list_builtin_grammars", "lark_import_loader",
]

MAX_REPEAT = 10_000
"""Largest count accepted in ``x ~ n`` / ``x ~ n..m`` (larger raises GrammarError)."""

MAX_EXPANDED_SIZE = 2_000_000
"""Largest grammar size (IR nodes with every bounded repetition expanded) accepted."""

_MAX_TEMPLATE_INSTANCES = 10_000

# The composite terminals of lark's common.lark whose regexes use lazy quantifiers, by
# the raw literals they flatten to, and what they match under the dynamic lexer.
_KNOWN_LAZY = {
    ('"\\""', "/.*?/", "/(?<!\\\\)(\\\\\\\\)*?/", '"\\""'): r'"(?:[^"\\\n]|\\[^\n])*"',
    ('"/*"', "/(.|\\n)*?/", '"*/"'): r"/\*(?:[^*]|\*+[^*/])*\*+/",
}


# ---------------------------------------------------------------------------
# Conversion
# ---------------------------------------------------------------------------

def _regex_nodes(node: rx.RegexNode) -> Iterator[rx.RegexNode]:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (rx.Concat, rx.Alternation)):
            stack.extend(n.items)
        elif isinstance(n, (rx.Quantified, rx.Group)):
            stack.append(n.item)


class _Converter:
    """Turns Lark's loaded grammar (rule and terminal trees) into IR rules."""

    def __init__(self, grammar: Grammar, text: str) -> None:
        from lark.grammar import NonTerminal, Terminal
        from lark.lexer import Token
        from lark.tree import Tree

        self.Tree, self.Token, self.NonTerminal, self.Terminal = Tree, Token, NonTerminal, Terminal
        self.text = text
        self.term_trees: dict[str, Tree | None] = {}
        for name, (tree, _prio) in grammar.term_defs:
            self.term_trees[name] = tree
        self.rule_trees: dict[str, Tree | None] = {}
        self.templates: dict[str, tuple[tuple[str, ...], Tree]] = {}
        for name, params, tree, _opts in grammar.rule_defs:
            if params:
                self.templates[name] = (tuple(params), tree)
            else:
                self.rule_trees[name] = tree
        declared = sorted([n for n, t in self.term_trees.items() if t is None]
                          + [n for n, t in self.rule_trees.items() if t is None])
        if declared:
            line, col = directive_line(text, "%declare")
            raise grammar_error(GrammarError, f"%declare'd symbols {', '.join(declared)} need an external "
                                "lexer or postlexer and cannot be enforced scannerless", text, line, col)
        self.terms: dict[str, ir.Expr] = {}        # terminal name -> regular expr
        self.term_busy: set[str] = set()
        self.rules: dict[str, ir.Expr] = {}
        self.pending: list[tuple[str, object, dict[str, tuple[ir.Expr, str]]]] = []
        self.instances: dict[tuple[str, tuple[ir.Expr, ...]], str] = {}
        self.ignore = _Ignore([self.terminal(n) for n in grammar.ignore])

    # -- terminals ------------------------------------------------------------

    def terminal(self, name: str) -> ir.Expr:
        got = self.terms.get(name)
        if got is not None:
            return got
        tree = self.term_trees.get(name)
        if tree is None:
            line, col = locate(self.text, name)
            raise grammar_error(GrammarError, f"terminal {name!r} is not defined", self.text, line, col)
        if name in self.term_busy:
            raise GrammarError(f"recursion in terminal {name!r}")
        self.term_busy.add(name)
        try:
            e = self.term_tree(tree, f"terminal {name}")
        finally:
            self.term_busy.discard(name)
        self.terms[name] = e
        return e

    def term_tree(self, t: object, where: str) -> ir.Expr:
        Tree, Token = self.Tree, self.Token
        if isinstance(t, self.Terminal):
            return self.terminal(t.name)
        if isinstance(t, self.NonTerminal):
            raise GrammarError(f"rule {t.name!r} used inside {where} "
                               "(terminals may only use terminals)")
        if isinstance(t, Token):
            raise GrammarError(f"unexpected token {t!r} in {where}")
        if not isinstance(t, Tree):
            raise GrammarError(f"unexpected {type(t).__name__} in {where}")
        d = t.data
        if d == "expansions":
            return ir.alt(*(self.term_tree(c, where) for c in t.children))
        if d == "expansion":
            sig = self._literal_signature(t)
            if sig is not None and sig in _KNOWN_LAZY:
                return self.regex(_KNOWN_LAZY[sig], "", where, None, check=False)
            return ir.seq(*(self.term_tree(c, where) for c in t.children))
        if d == "value":
            return self.term_tree(t.children[0], where)
        if d == "literal":
            return self.literal(cast("LarkToken", t.children[0]), where)
        if d == "range":
            return self.char_range(t.children[0], t.children[1], where)
        if d == "maybe":
            return ir.opt(self.term_tree(t.children[0], where))
        if d == "expr":
            return self.repeat(self.term_tree(t.children[0], where), t.children[1:], where)
        if d == "alias":
            raise GrammarError(f"aliases (->) are not allowed in terminals (in {where})")
        if d == "template_usage":
            raise GrammarError(f"templates cannot be used inside terminals (in {where})")
        raise GrammarError(f"unsupported construct {d!r} in {where}")

    def _literal_signature(self, t: object) -> tuple[str, ...] | None:
        """Raw literal texts of an expansion made only of (nested) literals, else None."""
        out: list[str] = []
        stack = [t]
        while stack:
            x = stack.pop()
            if isinstance(x, self.Tree):
                if x.data in ("expansion", "value") or (x.data == "expansions" and len(x.children) == 1):
                    stack.extend(reversed(x.children))
                    continue
                if x.data == "literal":
                    out.append(str(x.children[0]))
                    continue
            return None
        return tuple(out)

    def literal(self, tok: LarkToken, where: str) -> ir.Expr:
        from lark.exceptions import LarkError
        from lark.lexer import PatternStr
        from lark.load_grammar import _literal_to_pattern

        raw = str(tok)
        line, col = token_position(tok)
        if tok.type == "STRING" and raw.rstrip("i") == '""':
            return ir.EMPTY  # extension: Lark rejects empty literals
        try:
            pat = _literal_to_pattern(tok)
        except (LarkError, AssertionError, SyntaxError, ValueError) as exc:
            msg = str(exc.args[0]) if exc.args else str(exc)
            raise grammar_error(GrammarError, f"bad literal {raw} in {where}: {msg}", self.text,
                                line, col) from exc
        flags = "".join(pat.flags)
        if isinstance(pat, PatternStr):
            value = pat.value
            if "i" in flags:
                return self.regex(re.escape(value), "i", where, tok, check=False)
            try:
                return ir.lit(value)
            except UnicodeEncodeError as exc:
                raise grammar_error(GrammarError, f"literal {raw} in {where} is not valid Unicode text",
                                    self.text, line, col) from exc
        return self.regex(pat.value, flags, where, tok, check=True)

    def regex(self, pattern: str, flags: str, where: str, tok: object, *, check: bool) -> ir.Expr:
        line, col = token_position(tok)
        try:
            if check:
                node = rx.parse_regex(pattern, dialect="python", flags=flags)
                for n in _regex_nodes(node):
                    if isinstance(n, rx.Anchor):
                        raise grammar_error(
                            GrammarError, f"regex {tok} in {where} uses an anchor; under Lark's "
                            "dynamic lexer anchors refer to the whole input, not the token, "
                            "which structgen cannot express", self.text, line, col)
                    if isinstance(n, rx.Quantified) and not n.greedy and n.min != n.max:
                        raise grammar_error(
                            GrammarError, f"regex {tok} in {where} uses a lazy quantifier; "
                            "Lark's dynamic lexer then matches only some lengths, which "
                            "structgen cannot express (use a greedy pattern)", self.text, line, col)
            return rx.compile_regex(pattern, dialect="python", flags=flags, encoding="utf8")
        except RegexError as exc:
            if col is not None and exc.position is not None and tok is not None:
                raw = str(tok)
                if raw[1:raw.rindex("/")] == pattern:  # no escape rewriting: point at the spot
                    col += 1 + exc.position
            raise grammar_error(GrammarError, f"unsupported regex {tok if tok is not None else pattern} in "
                                f"{where}: {exc.message}", self.text, line, col) from exc

    def char_range(self, a: object, b: object, where: str) -> ir.Expr:
        from lark.exceptions import LarkError
        from lark.load_grammar import eval_escaping

        try:
            lo, hi = eval_escaping(str(a)[1:-1]), eval_escaping(str(b)[1:-1])
        except (LarkError, SyntaxError, ValueError) as exc:
            raise grammar_error(GrammarError, f"bad range {a}..{b} in {where}", self.text,
                                *token_position(a)) from exc
        if len(lo) != 1 or len(hi) != 1 or ord(lo) > ord(hi):
            raise grammar_error(GrammarError, f"bad range {a}..{b} in {where}: endpoints must be single "
                                "characters in order", self.text, *token_position(a))
        return rx.char_class_expr([(ord(lo), ord(hi))])

    def repeat(self, item: ir.Expr, args: list[object], where: str) -> ir.Expr:
        op = str(args[0])
        if op == "?":
            return ir.opt(item)
        if op == "*":
            return ir.star(item)
        if op == "+":
            return ir.plus(item)
        if op == "~":
            nums = [int(str(x)) for x in args[1:]]
            lo, hi = (nums[0], nums[0]) if len(nums) == 1 else (nums[0], nums[1])
            line, col = token_position(args[1])
            if hi < lo:
                raise grammar_error(GrammarError, f"bad repetition range {lo}..{hi} in {where}",
                                    self.text, line, col)
            if hi > MAX_REPEAT:
                raise grammar_error(GrammarError, f"repetition count {hi} in {where} exceeds the limit "
                                    f"{MAX_REPEAT}", self.text, line, col)
            return ir.rep(item, lo, hi)
        raise GrammarError(f"unknown operator {op!r} in {where}")

    # -- rules ----------------------------------------------------------------

    def rule_ref(self, name: str) -> ir.Expr:
        if name not in self.rules:
            tree = self.rule_trees.get(name)
            if tree is None:
                line, col = locate(self.text, name)
                if name in self.templates:
                    raise grammar_error(GrammarError, f"template {name!r} used without arguments",
                                        self.text, line, col)
                raise grammar_error(GrammarError, f"rule {name!r} is not defined", self.text, line, col)
            self.rules[name] = ir.NEVER  # placeholder until converted
            self.pending.append((name, tree, {}))
        return ir.Ref(name)

    def token(self, e: ir.Expr) -> ir.Expr:
        """A terminal occurrence at the rule level: the ignored text before it, then it."""
        return self.ignore.before(e)

    def rule_tree(self, t: object, where: str, env: dict[str, tuple[ir.Expr, str]]) -> ir.Expr:
        Tree = self.Tree
        if isinstance(t, self.NonTerminal):
            if t.name in env:
                return env[t.name][0]
            return self.rule_ref(t.name)
        if isinstance(t, self.Terminal):
            return self.token(self.terminal(t.name))
        if not isinstance(t, Tree):
            raise GrammarError(f"unexpected {type(t).__name__} in rule {where!r}")
        d = t.data
        if d == "expansions":
            return ir.alt(*(self.rule_tree(c, where, env) for c in t.children))
        if d == "expansion":
            return ir.seq(*(self.rule_tree(c, where, env) for c in t.children))
        if d == "alias":
            return self.rule_tree(t.children[0], where, env)
        if d == "value":
            return self.rule_tree(t.children[0], where, env)
        if d == "literal":
            return self.token(self.literal(cast("LarkToken", t.children[0]), f"rule {where!r}"))
        if d == "range":
            return self.token(self.char_range(t.children[0], t.children[1], f"rule {where!r}"))
        if d == "maybe":
            return ir.opt(self.rule_tree(t.children[0], where, env))
        if d == "expr":
            return self.repeat(self.rule_tree(t.children[0], where, env), t.children[1:], f"rule {where!r}")
        if d == "template_usage":
            return self.template(t, where, env)
        raise GrammarError(f"unsupported construct {d!r} in rule {where!r}")

    def _display(self, t: object, env: dict[str, tuple[ir.Expr, str]]) -> str:
        if isinstance(t, (self.NonTerminal, self.Terminal)):
            return env[t.name][1] if t.name in env else t.name
        if isinstance(t, self.Tree):
            if t.data == "literal":
                return str(t.children[0])
            if t.data == "template_usage":
                return (self._display(t.children[0], env) + "{"
                        + ",".join(self._display(c, env) for c in t.children[1:]) + "}")
            return ",".join(self._display(c, env) for c in t.children)
        return str(t)

    def template(self, t: Tree, where: str, env: dict[str, tuple[ir.Expr, str]]) -> ir.Expr:
        head = cast("Symbol", t.children[0])  # the template's name
        name = head.name
        if name in env:
            raise GrammarError(f"template parameter {name!r} used as a template in {where!r} "
                               "(higher-order templates are not supported)")
        if name not in self.templates:
            line, col = locate(self.text, name)
            raise grammar_error(GrammarError, f"template {name!r} is not defined", self.text, line, col)
        params, tree = self.templates[name]
        args = t.children[1:]
        if len(args) != len(params):
            line, col = locate(self.text, name)
            raise grammar_error(GrammarError, f"template {name!r} takes {len(params)} arguments, "
                                f"got {len(args)}", self.text, line, col)
        arg_exprs = tuple(self.rule_tree(a, where, env) for a in args)
        key = (name, arg_exprs)
        inst = self.instances.get(key)
        if inst is None:
            if len(self.instances) >= _MAX_TEMPLATE_INSTANCES:
                raise GrammarError(f"more than {_MAX_TEMPLATE_INSTANCES} template instances "
                                   f"(runaway expansion of {name!r}?)")
            inst = f"{name}{{{','.join(self._display(a, env) for a in args)}}}"
            base, k = inst, 1
            while inst in self.rules or inst in self.rule_trees:
                k += 1
                inst = f"{base}#{k}"
            self.instances[key] = inst
            self.rules[inst] = ir.NEVER
            new_env = {p: (e, self._display(a, env)) for p, e, a in zip(params, arg_exprs, args)}
            self.pending.append((inst, tree, new_env))
        return ir.Ref(inst)

    def convert(self, start: str) -> dict[str, ir.Expr]:
        if start not in self.rule_trees:
            known = ", ".join(sorted(self.rule_trees)) or "none"
            if start in self.templates:
                raise GrammarError(f"start rule {start!r} is a template")
            raise GrammarError(f"start rule {start!r} is not defined (rules: {known})")
        self.rule_ref(start)
        while self.pending:
            name, tree, env = self.pending.pop()
            self.rules[name] = self.rule_tree(tree, name, env)
        return self.rules


# ---------------------------------------------------------------------------
# %ignore: Lark's greedy munching, exactly
# ---------------------------------------------------------------------------

_MAX_IGNORE_NFA = 20_000
_MAX_IGNORE_DFA = 2_000
_MAX_IGNORE_CLASSES = 6


def _utf8_len(lead: int) -> int:
    return 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


def _follow_bytes(trans: list[list[tuple[int, int, int]]], q: int) -> frozenset[int]:
    return frozenset(b for lo, hi, _t in trans[q] for b in range(lo, hi + 1))


def _extension_closed(trans: list[list[tuple[int, int, int]]], accept: set[int]) -> bool:
    """From every accepting state, does every character that keeps the match alive end in
    an accepting state? Then a match is maximal iff the next byte cannot continue it."""
    for q in accept:
        for lo, hi, t in trans[q]:
            for b in range(lo, hi + 1):
                if b >= 0x80 and b < 0xC0:
                    return False  # a continuation byte right after a complete match
                cur = {t}
                for _ in range(_utf8_len(b) - 1):
                    cur = {r for s in cur for a, z, r in trans[s] if z >= 0x80 and a <= 0xBF}
                if any(s not in accept for s in cur):
                    return False
    return True


def _first_bytes(e: ir.Expr) -> frozenset[int]:
    """Over-approximation of the bytes a non-empty string of ``e`` can start with."""
    if isinstance(e, ir.ByteSet):
        return frozenset(b for lo, hi in e.ranges for b in range(lo, hi + 1))
    if isinstance(e, ir.Seq):
        out: set[int] = set()
        for it in e.items:
            out |= _first_bytes(it)
            if not nullable(it, {}):
                break
        return frozenset(out)
    if isinstance(e, ir.Alt):
        return frozenset().union(*(_first_bytes(x) for x in e.items))
    if isinstance(e, ir.Repeat):
        return _first_bytes(e.item) if e.max != 0 else frozenset()
    if isinstance(e, ir.Dfa):
        return frozenset(b for lo, hi, _t in e.trans[e.start] for b in range(lo, hi + 1))
    if isinstance(e, (ir.And, ir.Diff)):
        return _first_bytes(e.left)
    return frozenset(range(256))


class _Ignore:
    """The text Lark lets through at a token boundary, for a given list of %ignore terminals.

    Lark (dynamic lexer) scans the next token at the boundary itself and at every position
    reached by matching an ignore terminal there, repeatedly; each ignore match is the
    regex's first match, i.e. (for the usual greedy patterns) the longest. When every
    ignore terminal is *extension-closed* (see :func:`_extension_closed`: whitespace runs,
    line and block comments) "longest" is a one-byte lookahead condition: the byte after
    an ignore match must not be one that could continue it. Each ignore terminal's DFA is
    split by the follow set of its accepting states into classes; then the boundary before
    a token T is the least solution of

        K0 = T  | sum_c P_c K_c           (nothing ignored yet: no constraint)
        Kc = T' | sum_d P_d' K_d          (after a maximal match of class c)

    where ``X'`` is X restricted to strings whose first byte cannot continue class c,
    solved with Arden's lemma. If some ignore terminal is not extension-closed the
    declarative ``star(alt(ignores)) T`` is used instead (documented difference).
    """

    def __init__(self, exprs: list[ir.Expr]) -> None:
        self.exprs = exprs
        self.cache: dict[ir.Expr | None, ir.Expr] = {}
        self.classes: list[tuple[ir.Dfa, frozenset[int], frozenset[int]]] | None = None
        self.star = ir.star(ir.alt(*exprs)) if exprs else ir.EMPTY
        if exprs:
            self.classes = self._classes()

    def _classes(self) -> list[tuple[ir.Dfa, frozenset[int], frozenset[int]]] | None:
        out: list[tuple[ir.Dfa, frozenset[int], frozenset[int]]] = []
        for e in self.exprs:
            got = fsa.regular_expr_dfa(e, max_nfa=_MAX_IGNORE_NFA, max_dfa=_MAX_IGNORE_DFA)
            if got is None:
                return None
            trans, accept = got
            accept = {q for q in accept if q != 0}  # zero-width ignores change nothing
            if not accept:
                continue
            if not _extension_closed(trans, accept):
                return None
            groups: dict[frozenset[int], set[int]] = {}
            for q in accept:
                groups.setdefault(_follow_bytes(trans, q), set()).add(q)
            for follow, qs in groups.items():
                dfa = ir.Dfa(0, qs, trans)
                out.append((dfa, follow, _first_bytes(dfa)))
        if len(out) > _MAX_IGNORE_CLASSES:
            return None
        return out

    @staticmethod
    def _restrict_dfa(d: ir.Dfa, allowed: frozenset[int]) -> ir.Expr:
        start_edges = [(b, b, t) for lo, hi, t in d.trans[d.start] for b in range(lo, hi + 1) if b in allowed]
        if not start_edges:
            return ir.NEVER
        return ir.Dfa(len(d.trans), d.accept, list(d.trans) + [start_edges])

    @staticmethod
    def _restrict(e: ir.Expr, allowed: frozenset[int]) -> ir.Expr:
        first = _first_bytes(e)
        if first <= allowed and not nullable(e, {}):
            return e
        if not (first & allowed):
            return ir.NEVER
        return ir.and_(e, ir.seq(ir.byteset(sorted(allowed)), ir.star(ir.ANY_BYTE)))

    def before(self, token: ir.Expr | None) -> ir.Expr:
        """Ignored text then ``token`` (None: the end of the input)."""
        if not self.exprs:
            return token if token is not None else ir.EMPTY
        got = self.cache.get(token)
        if got is not None:
            return got
        if self.classes is None:
            r = ir.seq(self.star, token) if token is not None else self.star
        else:
            r = self._solve(token)
        self.cache[token] = r
        return r

    def _solve(self, token: ir.Expr | None) -> ir.Expr:
        classes = self.classes or []
        m = len(classes)
        everything = frozenset(range(256))
        allowed = [everything - follow for _d, follow, _f in classes]
        a: list[ir.Expr] = [token if token is not None else ir.EMPTY]
        for c in range(m):
            a.append(self._restrict(token, allowed[c]) if token is not None else ir.EMPTY)
        b = [[ir.NEVER] * (m + 1) for _ in range(m + 1)]
        for j, (d, _follow, first) in enumerate(classes):
            b[0][j + 1] = d
            for c in range(m):
                b[c + 1][j + 1] = d if first <= allowed[c] else self._restrict_dfa(d, allowed[c])
        for i in range(m, 0, -1):  # eliminate K_i (Arden: K = X K | Y  =>  K = X* Y)
            loop = ir.star(b[i][i])
            ai = ir.seq(loop, a[i])
            bi = [ir.seq(loop, b[i][j]) for j in range(i)]
            for k in range(i):
                if b[k][i] == ir.NEVER:
                    continue
                a[k] = ir.alt(a[k], ir.seq(b[k][i], ai))
                for j in range(i):
                    if bi[j] != ir.NEVER:
                        b[k][j] = ir.alt(b[k][j], ir.seq(b[k][i], bi[j]))
                b[k][i] = ir.NEVER
        return ir.seq(ir.star(b[0][0]), a[0])


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------

def lark_to_grammar(text: str, *, start: str = "start",
                    import_paths: Sequence[str | os.PathLike[str]] = (),
                    grammar_path: str | os.PathLike[str] | None = None,
                    max_literal_length: int | None = None) -> ir.Grammar:
    """Convert Lark grammar ``text`` into a structgen :class:`~structgen.grammar.ir.Grammar`.

    The grammar's language is the set of strings ``lark.Lark(text, parser="earley",
    lexer="dynamic_complete", start=start)`` parses completely (see the module docstring
    for the exact semantics and the few documented differences). Only rules reachable
    from ``start`` are converted. Raises :class:`~structgen.errors.GrammarSyntaxError` for
    malformed grammar text and :class:`~structgen.errors.GrammarError` for everything
    else that is wrong or unsupported, with a line and column where one is known.
    Cost: about linear in the grammar size (Lark's grammar parser plus a few passes over the
    trees); removing left recursion can enlarge the rules involved, within
    :data:`MAX_EXPANDED_SIZE`.

    ``%import`` reads only Lark's and structgen's packaged grammars, files in the
    ``import_paths`` folders and, for relative imports (``%import .sub.rule``), files below the
    folder of ``grammar_path`` (the file ``text`` was read from; without it grammar text has no
    folder and relative imports are a GrammarError). Never the working folder; an import that
    is refused is a GrammarError with the line and column of the import.

    A string literal or regular expression longer than ``max_literal_length`` characters
    (default: ``CompileOptions.max_literal_length``) is a GrammarError at its line and column,
    raised before Lark parses the text.
    """
    if not isinstance(text, str):
        raise TypeError(f"grammar text must be str, not {type(text).__name__}")
    if not isinstance(start, str) or not start:
        raise GrammarError("start must be a non-empty rule name")
    grammar = load_lark_grammar(text, import_paths=tuple(import_folders(import_paths)),
                                grammar_path=grammar_path, max_literal_length=max_literal_length)
    try:
        conv = _Converter(grammar, text)
        rules = conv.convert(start)
        rules = eliminate_left_recursion(rules, start, max_size=MAX_EXPANDED_SIZE)
        size = expanded_size(rules, cap=MAX_EXPANDED_SIZE)
    except RecursionError as exc:
        raise GrammarError("grammar is nested too deeply to convert") from exc
    if size > MAX_EXPANDED_SIZE:
        raise GrammarError(f"grammar is too large once repetitions are expanded (more than "
                           f"{MAX_EXPANDED_SIZE} IR nodes); reduce the repetition counts")
    root = start
    tail = conv.ignore.before(None)
    if tail != ir.EMPTY:
        used_inside: set[str] = set()
        for e in rules.values():
            _collect_refs(e, used_inside)
        if start in used_inside:
            root = "__top__"
            rules[root] = ir.seq(ir.Ref(start), tail)
        else:
            rules[start] = ir.seq(rules[start], tail)
    return ir.Grammar(rules, root)


def _collect_refs(e: ir.Expr, out: set[str]) -> None:
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, ir.Ref):
            out.add(x.name)
        elif isinstance(x, (ir.Seq, ir.Alt)):
            stack.extend(x.items)
        elif isinstance(x, ir.Repeat):
            stack.append(x.item)
        elif isinstance(x, (ir.And, ir.Diff)):
            stack.extend((x.left, x.right))


#: (text, start, compile options, import folders, grammar file) -> its compiled grammar
_LRU: OrderedDict[tuple[str, str, CompileOptions | None, tuple[str, ...], str | None], CompiledGrammar] = \
    OrderedDict()
_LRU_LOCK = threading.Lock()
_LRU_SIZE = 32


def compile_lark(text: str, *, start: str = "start",
                 compile_options: CompileOptions | None = None,
                 import_paths: Sequence[str | os.PathLike[str]] = (),
                 grammar_path: str | os.PathLike[str] | None = None) -> CompiledGrammar:
    """Compile Lark grammar ``text`` to a :class:`~structgen.grammar.compiled.CompiledGrammar`.

    Equivalent to ``compile_grammar(lark_to_grammar(text, start=start), compile_options)``;
    the result is kept in a small thread-safe LRU cache keyed by ``(text, start, options)`` (and
    the import settings; an imported file edited later is not re-read while the entry is cached).
    ``import_paths`` / ``grammar_path``: where ``%import`` may read, as for :func:`lark_to_grammar`.
    Raises what :func:`lark_to_grammar` and :func:`~structgen.grammar.compiler.compile_grammar`
    raise (GrammarError, CompileLimitError, CompileTimeoutError).
    """
    imports = tuple(import_folders(import_paths))
    where = os.fspath(grammar_path) if grammar_path is not None else None
    key = (text, start, compile_options, imports, where)
    with _LRU_LOCK:
        hit = _LRU.get(key)
        if hit is not None:
            _LRU.move_to_end(key)
            return hit
    limit = (compile_options or CompileOptions()).max_literal_length
    with gc_paused():
        compiled = compile_grammar(lark_to_grammar(text, start=start, import_paths=imports,
                                                   grammar_path=where, max_literal_length=limit),
                                   compile_options)
    # the line of each rule, for the errors of the token-budget check
    lines = definition_lines(text)
    compiled.set_rule_sources(tuple(src._replace(line=lines.get(src.rule, src.line))
                                    for src in compiled.rule_sources))
    with _LRU_LOCK:
        _LRU[key] = compiled
        _LRU.move_to_end(key)
        while len(_LRU) > _LRU_SIZE:
            _LRU.popitem(last=False)
    return compiled


def list_builtin_grammars() -> list[str]:
    """Names (without ``.lark``) of the grammars shipped with structgen, sorted."""
    return grammars.available()


def builtin_grammar(name: str) -> str:
    """Text of the shipped grammar ``name`` (``"json"`` or ``"json.lark"``), read from the
    package data of :mod:`structgen.grammars`. Raises :class:`GrammarError` listing the
    available names."""
    try:
        return grammars.read_grammar(name)
    except FileNotFoundError:
        raise GrammarError(f"no built-in grammar {name!r}; available: "
                           f"{', '.join(grammars.available()) or 'none'}") from None
