"""Streaming tool calls (:class:`~structgen.calls.plan.CallStream`): for outputs in
every built-in format, cut into deltas at every place (and token by token), the streamed
content joined equals the content :meth:`OutputPlan.split` gives for the whole output, and each
streamed call (id and name once, then its arguments in pieces) joined equals the call split()
finds; the oracle for the arguments is ``json.loads`` of the whole output's call text."""

from __future__ import annotations

import json

import pytest

from structgen.calls.plan import CallStream, plan_output

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "array"}},
        "required": ["city"]}}}
TIME = {"type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, TIME]

A1 = '{"city":"Pa}ris \\"x\\" ]","days":[1,{"n":2}]}'
A2 = '{}'


def _call(fmt: str, name: str, args: str) -> str:
    key = "parameters" if fmt == "llama3" else "arguments"
    return f'{{"name": "{name}", "{key}": {args}}}'


OUTPUTS = {
    "hermes": [
        "Sure, let me check. " + "<tool_call>\n" + _call("hermes", "get_weather", A1) + "\n</tool_call>",
        "<tool_call>\n" + _call("hermes", "get_weather", A1) + "\n</tool_call>\n<tool_call>\n"
        + _call("hermes", "get_time", A2) + "\n</tool_call>",
        "No call needed: <tool is a word, < and <tool_ too.  ",
        "  Text before " + "<tool_call>\n" + _call("hermes", "get_time", A2) + "\n</tool_call> and after.",
    ],
    "llama3": [
        _call("llama3", "get_weather", A1) + "; " + _call("llama3", "get_time", A2),
        "<|python_tag|>" + _call("llama3", "get_time", A2),
        "Plain answer with {braces} inside.",
        " {not a call: it starts with a space}",
    ],
    "mistral": [
        "[TOOL_CALLS][" + _call("mistral", "get_weather", A1) + ", " + _call("mistral", "get_time", A2) + "]",
        "Let me see. [TOOL_CALLS][" + _call("mistral", "get_time", A2) + "]",
        "Only text, with [TOOL and [brackets].",
    ],
}


def _stream(plan, pieces: list[str]):
    s = CallStream.for_plan(plan)
    assert s is not None
    events = []
    for p in pieces:
        events += s.feed(p)
    events += s.feed("", final=True)
    content = "".join(e[1] for e in events if e[0] == "content")
    calls: dict[int, list] = {}
    for e in events:
        if e[0] == "call":
            assert e[1] not in calls and e[1] == len(calls)  # ids and names once, in order
            calls[e[1]] = [e[2], e[3], ""]
        elif e[0] == "arguments":
            calls[e[1]][2] += e[2]
    return content, [calls[k] for k in sorted(calls)]


@pytest.mark.parametrize("fmt", sorted(OUTPUTS))
def test_stream_joined_equals_the_split_of_the_whole_output(fmt: str) -> None:
    plan = plan_output(tools=TOOLS, tool_format=fmt)
    for text in OUTPUTS[fmt]:
        _, want_text, want_calls, errors = plan.split(text)
        assert not errors, errors
        want = [(c.name, c.openai()["function"]["arguments"]) for c in want_calls]
        assert all(json.loads(a) == c.arguments for (_, a), c in zip(want, want_calls))
        cuts = [[text]] + [[text[:i], text[i:]] for i in range(1, len(text))] + [list(text)]
        for pieces in cuts:
            content, calls = _stream(plan, pieces)
            assert content == want_text, (text, pieces)
            assert [(n, a) for _, n, a in calls] == want, (text, pieces)
            assert all(cid.startswith("call_") for cid, _, _ in calls)


def test_arguments_are_the_text_the_model_wrote() -> None:
    plan = plan_output(tools=TOOLS, tool_format="hermes")
    text = "<tool_call>\n" + _call("hermes", "get_weather", A1) + "\n</tool_call>"
    (call,) = plan.split(text)[2]
    assert call.openai()["function"]["arguments"] == A1


def test_no_stream_for_reasoning_or_custom_formats() -> None:
    assert CallStream.for_plan(plan_output(tools=TOOLS, reasoning=True)) is None
    assert CallStream.for_plan(plan_output(schema={"type": "object"})) is None


def _output_stream(plan, pieces: list[str]):
    from structgen.calls.plan import OutputStream

    s = OutputStream(plan)
    events = []
    for p in pieces:
        events += s.feed(p)
    events += s.feed("", final=True)
    kinds = {"reasoning": "", "content": ""}
    calls: dict[int, list] = {}
    for e in events:
        if e[0] in kinds:
            assert e[1], e  # no empty events
            kinds[e[0]] += e[1]
        elif e[0] == "call":
            assert e[1] not in calls and e[1] == len(calls)
            calls[e[1]] = [e[2], e[3], ""]
        else:
            calls[e[1]][2] += e[2]
    assert [cid for cid, _, _ in (calls[k] for k in sorted(calls))] == s.call_ids()
    return kinds["reasoning"], kinds["content"], [(n, a) for _, n, a in (calls[k] for k in sorted(calls))]


THOUGHTS = ["<think>\nWhich tool? The </thin one.\n</think>\n\n", "<think>x</think>", "<think> </think> "]


@pytest.mark.parametrize("fmt", [None, *sorted(OUTPUTS)])
def test_output_stream_with_reasoning_equals_the_split(fmt: str | None) -> None:
    """Reasoning, then the answer (calls in each built-in format, or any text): the joined
    events at every cut equal split() of the whole output; and the same plans without
    reasoning, and a format read only whole (its events come at the end)."""
    from structgen.calls.formats import TaggedFormat

    answers = OUTPUTS[fmt] if fmt else ["The answer is 42.  ", "", "  {\"x\": 1}"]
    plans = [plan_output(tools=TOOLS if fmt else None, tool_format=fmt, reasoning=True)]
    texts = [t + a for t in THOUGHTS for a in answers[:2]]
    if fmt:
        plans.append(plan_output(tools=TOOLS, tool_format=fmt))
    if fmt == "hermes":  # a format of the user's: read only once complete
        plans.append(plan_output(tools=TOOLS, reasoning=True, tool_format=TaggedFormat(
            "block", "<tool_call>", "</tool_call>", padding="\n")))
    for plan in plans:
        for text in (texts if plan.reasoning else answers):
            thought, want_text, want_calls, errors = plan.split(text)
            assert not errors, errors
            want = [(c.name, c.openai()["function"]["arguments"]) for c in want_calls]
            cuts = [[text]] + [[text[:i], text[i:]] for i in range(1, len(text))] + [list(text)]
            for pieces in cuts:
                got = _output_stream(plan, pieces)
                assert got[0] == (thought or ""), (text, pieces)
                assert got[1] == want_text, (text, pieces)
                if isinstance(plan.format, TaggedFormat) and plan.format.name == "block":
                    assert [(n, json.loads(a)) for n, a in got[2]] == \
                        [(c.name, c.arguments) for c in want_calls]
                else:
                    assert got[2] == want, (text, pieces)


def test_output_stream_holds_back_a_partial_end_marker() -> None:
    plan = plan_output(schema={"type": "object"}, reasoning=True)
    from structgen.calls.plan import OutputStream

    s = OutputStream(plan)
    assert s.feed("<think>Hmm </") == [("reasoning", "Hmm")]
    assert s.feed("thi") == []
    assert s.feed("nk>") == []
    assert s.feed(' {"a": 1}') == [("content", '{"a": 1}')]
