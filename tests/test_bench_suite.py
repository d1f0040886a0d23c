"""The benchmark suite (``benchmarks/bench_suite.py``, ``structgen bench``): task data, oracles,
and a smoke run end to end.

Oracles are independent of the code under test: ``jsonschema``, Lark's own Earley parser,
SQLite, Python's ``ast`` and hand-computed BLEU values. The smoke run uses a tiny randomly
initialised model (built in memory) and checks the reports are written, every completed
output validates, and greedy speculative output is token-identical to plain decoding.
"""

from __future__ import annotations

import json
import math
import sqlite3

import jsonschema
import lark
import pytest

from benchmarks import bench_suite as bench
from benchmarks.tasks.suite import SQL_ROWS, SQL_TABLES, all_tasks


def _lark_ok(grammar: str, text: str) -> bool:
    try:
        lark.Lark(grammar, parser="earley", lexer="dynamic_complete").parse(text)
        return True
    except lark.exceptions.LarkError:
        return False


def _grammar(task: dict) -> str:
    from structgen.frontends.lark import builtin_grammar

    return task.get("grammar") or builtin_grammar(task["grammar_name"])


def test_tasks_cover_three_types_and_references_are_valid() -> None:
    from structgen.generation.api import resolve_grammar

    tasks = all_tasks()
    assert {t["type"] for t in tasks} == {"json", "code", "prose"}
    assert len({t["name"] for t in tasks}) == len(tasks)
    con = sqlite3.connect(":memory:")
    con.executescript(SQL_TABLES)
    for table, rows in SQL_ROWS.items():
        con.executemany(f"INSERT INTO {table} VALUES ({','.join('?' * len(rows[0]))})", rows)
    for t in tasks:
        assert t["messages"] and all(m["content"] for m in t["messages"])
        if t["type"] == "json":
            jsonschema.validate(t["answer"], t["schema"])
            text = json.dumps(t["answer"], separators=(",", ":"))
            cg, _ = resolve_grammar(schema=t["schema"])
        else:
            text = t["answer"]
            assert _lark_ok(_grammar(t), text), t["name"]
            cg, _ = resolve_grammar(grammar=_grammar(t))
            if t.get("lang") == "sql":
                assert con.execute(text).fetchall(), t["name"]  # reference runs and returns rows
        assert cg.accepts(text), t["name"]  # the reference is reachable under the constraint


def test_bleu_hand_computed() -> None:
    assert bench.bleu("The cat sat on the mat.", "the cat sat on the mat .") == pytest.approx(100.0)
    assert bench.bleu("dog", "the cat") == 0.0
    assert bench.bleu("", "the cat") == 0.0
    # hyp of 3 words, all n-gram precisions 1 (add-one smoothing where no n-gram exists);
    # brevity penalty exp(1 - 6/3)
    assert bench.bleu("the cat sat", "the cat sat on the mat") == pytest.approx(100 * math.exp(-1))
    # p1 = 2/4, p2 = (1+1)/(3+1), p3 = (0+1)/(2+1), p4 = (0+1)/(1+1); no brevity penalty
    want = 100 * math.exp((math.log(2 / 4) + math.log(2 / 4) + math.log(1 / 3) + math.log(1 / 2)) / 4)
    assert bench.bleu("the cat ran fast", "the cat sat") == pytest.approx(want)


def test_check_output_oracles() -> None:
    tasks = {t["name"]: t for t in all_tasks()}
    sql = tasks["sql_filter"]
    c = bench.check_output(sql, "select name from employees where department='Sales'", True)
    assert c["valid"] and c["quality"] == 1.0 and c["exact"] is False
    c = bench.check_output(sql, "SELECT name FROM employees", True)
    assert c["valid"] and c["quality"] == 0.0
    assert not bench.check_output(sql, "SELECT FROM WHERE", True)["valid"]
    top = tasks["sql_top"]  # ordered reference: row order matters
    assert bench.check_output(top, "SELECT name, salary FROM employees ORDER BY salary ASC LIMIT 3",
                              True)["quality"] == 0.0
    py = tasks["py_range"]
    assert bench.check_output(py, "max(nums)-min(nums)", True)["quality"] == 1.0
    assert bench.check_output(py, "min(nums) - max(nums)", True)["quality"] == 0.0
    js = tasks["person"]
    good = json.dumps(js["answer"], separators=(",", ":"))
    assert bench.check_output(js, good, True) == {"valid": True, "quality": 1.0, "exact": True,
                                                  "complete": True}
    assert not bench.check_output(js, '{"name":"x"}', True)["valid"]
    half = {**js["answer"], "age": 35, "city": "Paris", "languages": ["Spanish", "French"]}
    c = bench.check_output(js, json.dumps(half), True)  # 10 leaves; age, city, languages[1:] differ
    assert c["valid"] and not c["exact"] and c["quality"] == pytest.approx(6 / 10)
    prose = tasks["prose_fix"]
    c = bench.check_output(prose, prose["answer"], True)
    assert c["valid"] and c["quality"] == pytest.approx(100.0)
    assert not bench.check_output(prose, "no capital letter.", True)["valid"]


def test_bad_arguments_exit_2(capsys) -> None:
    assert bench.main(["--types", "poetry"]) == 2
    assert "poetry" in capsys.readouterr().err
    assert bench.main(["--engines", "plain,vllm"]) == 2


@pytest.mark.parametrize("argv", [["--no-such-flag"], ["--repeats", "x"], ["--types", "poetry"],
                                  ["--device", "tpu"]])
def test_usage_errors_are_one_line(argv: list[str], capsys) -> None:
    # found by the CLI fuzz suite: argparse printed its whole usage block above the error
    assert bench.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("structgen bench: error: "), lines


@pytest.mark.assets
@pytest.mark.model
def test_smoke_run_writes_reports(tmp_path, tokenizer_by_alias) -> None:
    tokenizer_by_alias("gpt2")  # skip (not fail) when the tokenizer cannot be fetched
    rc = bench.main(["--smoke", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "suite-tiny-random-cpu.json").read_text())
    md = (tmp_path / "suite-tiny-random-cpu.md").read_text()
    assert rc == 0
    assert "3.8x at 89.1%" in md and "spec==plain" in md and doc["meta"]["versions"]["torch"]
    results = doc["results"]
    assert {r["type"] for r in results} == {"json", "code", "prose"}
    assert {r["engine"] for r in results} == {"plain", "spec"}
    tasks = {t["name"]: t for t in all_tasks()}
    completed = 0
    for r in results:
        if r["engine"] == "spec":
            plain = next(p for p in results if p["engine"] == "plain" and p["task"] == r["task"])
            assert r["tokens"] == plain["tokens"]  # greedy spec == plain, token for token
            assert r["identical_to_plain"] is True
        if r["complete"]:  # every completed output is valid, by the independent oracles
            completed += 1
            t = tasks[r["task"]]
            if t["type"] == "json":
                jsonschema.validate(json.loads(r["text"]), t["schema"])
            else:
                assert _lark_ok(_grammar(t), r["text"]), r
    assert completed >= 2  # the smoke model is biased towards short, completed outputs
    for t in ("json", "code", "prose"):
        s = doc["summary"][t]
        assert s["identical"] == "1/1"
        assert s["engines"]["spec"]["validity"] in (None, 1.0)
    if doc["meta"]["versions"]["matplotlib"] != "not installed":
        assert len(doc["meta"]["plots"]) == 2
        for p in doc["meta"]["plots"]:
            assert (tmp_path / p.split("/")[-1]).stat().st_size > 1000
