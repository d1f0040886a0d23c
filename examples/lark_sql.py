"""A Lark grammar constrains the output: an SQL SELECT query from ``structgen/grammars/sql.lark``.

    python examples/lark_sql.py [--model ALIAS_OR_FOLDER]

The grammar ships with the package (``structgen.frontends.lark.builtin_grammar("sql")``); any Lark
grammar text works the same way (``grammar=TEXT``, ``start=RULE``). Its ``start`` rule allows
unbounded whitespace after the final ``;``, which a small model may keep emitting instead of
EOS; so this script adds a rule ``statement: query ";"`` and generates from it: the output
ends at the semicolon. Prints the query on stdout (a sentence of the grammar).
"""

from __future__ import annotations

import argparse
import sys

import structgen
from structgen.frontends.lark import builtin_grammar
from structgen.generation.api import DEFAULT_MODEL

TABLES = "CREATE TABLE employees (id INT, name TEXT, dept TEXT, salary INT);"

QUESTION = "Names and salaries of the employees earning more than 50000, highest salary first."


START = "statement"


def sql_grammar() -> str:
    """structgen/grammars/sql.lark plus a start rule for exactly one query ending in ';'."""
    return builtin_grammar("sql") + f'\n{START}: query ";"\n'


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="model alias or local folder")
    ap.add_argument("--max-new-tokens", type=int, default=120)
    args = ap.parse_args(argv)

    sql = sql_grammar()  # Lark text; compiled once and cached
    prompt = f"{TABLES}\n\nWrite one SQL query (no explanation). {QUESTION}"
    r = structgen.generate(args.model, grammar=sql, start=START, max_new_tokens=args.max_new_tokens,
                           messages=[{"role": "user", "content": prompt}])
    print(r.text)
    s = r.stats
    print(f"finish={r.finish_reason} tokens={s.new_tokens} tokens/pass={s.tokens_per_pass:.2f}",
          file=sys.stderr)
    return 0 if r.complete else 1


if __name__ == "__main__":
    sys.exit(main())
