"""The conversation a chat request carries reaches the chat template whole: assistant
``tool_calls``, tool messages' ``tool_call_id`` and ``name``, text parts, and ``developer``
instructions (issue 39, items 1 and 2).

Oracle: the model's own chat template rendered by ``tokenizer.apply_chat_template`` on the
same conversation written in Hugging Face's documented message format (tool-call arguments as
a mapping), independently of structgen's conversion; the template is the default model's
(Qwen2.5-Coder), cached by the set-up.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from structgen.errors import ConfigError
from structgen.generation.api import prompt_ids
from structgen.serving.protocol import ChatCompletionRequest

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

OPENAI_MESSAGES = [
    {"role": "developer", "content": "Answer in one short sentence."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Oslo?"}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
     "content": '{"temp_c": 3, "sky": "snow"}'},
]

# the same conversation as Hugging Face's chat templates document it
HF_MESSAGES = [
    {"role": "system", "content": "Answer in one short sentence."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
     "content": '{"temp_c": 3, "sky": "snow"}'},
]


@pytest.fixture(scope="module")
def qwen_tokenizer(model_dir_by_alias):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir_by_alias("qwen2.5-coder-0.5b")))
    assert tok.chat_template and "tool_calls" in tok.chat_template
    return tok


def _request(messages: list[dict]) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": messages, "tools": TOOLS})


def test_tool_round_trip_renders_as_the_template_does(qwen_tokenizer) -> None:
    lm = SimpleNamespace(tokenizer=qwen_tokenizer)
    ours = prompt_ids(lm, None, _request(OPENAI_MESSAGES).message_dicts(), TOOLS)
    text = qwen_tokenizer.apply_chat_template(HF_MESSAGES, tools=TOOLS, add_generation_prompt=True,
                                              tokenize=False)
    assert ours == qwen_tokenizer.encode(text, add_special_tokens=False)
    rendered = qwen_tokenizer.decode(ours)
    assert '"name": "get_weather", "arguments": {"city": "Oslo"}' in rendered   # the call the model made
    assert '{"temp_c": 3, "sky": "snow"}' in rendered                          # the tool's answer
    assert "Answer in one short sentence." in rendered                         # developer -> system


def test_developer_instructions_reach_a_template_without_that_role(qwen_tokenizer) -> None:
    lm = SimpleNamespace(tokenizer=qwen_tokenizer)
    msgs = [{"role": "developer", "content": "Reply in French."}, {"role": "user", "content": "Hi"}]
    rendered = qwen_tokenizer.decode(prompt_ids(lm, None, _request(msgs).message_dicts()))
    assert "<|im_start|>system\nReply in French.<|im_end|>" in rendered


@pytest.mark.parametrize("bad,where", [
    ({"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
     r"messages\[1\]: tool_calls belong to an assistant message"),
    ({"role": "assistant", "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]},
     r"messages\[1\]\.tool_calls\[0\]"),
    ({"role": "assistant",
      "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]},
     r"messages\[1\]\.tool_calls\[0\]\.function\.arguments: not JSON"),
])
def test_malformed_tool_history_is_a_typed_error_naming_the_message(bad: dict, where: str) -> None:
    with pytest.raises(ConfigError, match=where):
        _request([{"role": "user", "content": "hi"}, bad]).message_dicts()


def test_arguments_given_as_a_mapping_pass_through() -> None:
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                  "function": {"name": "f", "arguments": {"a": 1}}}]}]
    call = _request(msgs).message_dicts()[1]["tool_calls"][0]
    assert call == {"type": "function", "id": "c", "function": {"name": "f", "arguments": {"a": 1}}}
    assert json.dumps(call["function"]["arguments"]) == '{"a": 1}'


def test_python_api_converts_tool_history_like_the_server() -> None:
    """``generate``/``stream`` take the same OpenAI-style conversation as the server: the same
    template dicts come out (arguments as a mapping, never JSON text the template would encode
    a second time), and malformed messages are errors naming ``messages[i]``."""
    from structgen.generation.call_options import check_requests as _check_requests
    from structgen.generation.messages import template_messages_of

    served = ChatCompletionRequest.model_validate({"messages": OPENAI_MESSAGES}).message_dicts()
    assert template_messages_of(OPENAI_MESSAGES) == served
    assert _check_requests([OPENAI_MESSAGES], False, "messages") == [served]
    assert served[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert served[2]["content"] == ""
    for bad, where in (([{"role": "wizard", "content": "x"}], "messages[0]"),
                       ([{"role": "user", "content": "x"}, {"role": "user", "tool_calls": [{}]}],
                        "messages[1]"),
                       ([{"role": "assistant", "content": None, "tool_calls": [
                           {"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}],
                        "messages[0].tool_calls[0].function.arguments")):
        with pytest.raises(ConfigError, match=re.escape(where)):
            template_messages_of(bad)
