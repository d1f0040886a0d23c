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


# ---------------------------------------------------------------------------------------------
# the other built-in tool formats: real chat templates of their families (llama.cpp's copies of
# the models' templates, read out of the llama-cpp-python sdist by `structgen models pull`)

# (chat template alias, tokenizer alias, tool format the template writes)
FAMILIES = [("llama3.1-template", "llama3", "llama3"), ("mistral-nemo-template", "mistral", "mistral")]
# Mistral's templates take 9-character call ids only; an id of that form passes through as it is
NINE = "a1B2c3D4e"


def _with_ids(messages: list[dict], call_id: str) -> list[dict]:
    out = json.loads(json.dumps(messages))
    for m in out:
        for c in m.get("tool_calls") or []:
            c["id"] = call_id
        if "tool_call_id" in m:
            m["tool_call_id"] = call_id
    return out


@pytest.fixture(scope="module")
def family_tokenizer(tokenizer_by_alias):
    """``family_tokenizer(template_alias, tokenizer_alias)``: a copy of the tokenizer carrying the
    family's real chat template, or the test is skipped when either asset is not cached."""
    import copy

    from structgen.assets.store import load_chat_template
    from structgen.errors import AssetError

    def get(template_alias: str, tokenizer_alias: str):
        try:
            template = load_chat_template(template_alias)
        except AssetError as exc:
            pytest.skip(f"chat template {template_alias!r} unavailable: {exc}")
        tok = copy.deepcopy(tokenizer_by_alias(tokenizer_alias))
        tok.chat_template = template
        return tok
    return get


@pytest.mark.assets
@pytest.mark.parametrize("template_alias,tokenizer_alias,fmt", FAMILIES)
def test_tool_round_trip_renders_as_each_family_template_does(family_tokenizer, template_alias: str,
                                                               tokenizer_alias: str, fmt: str) -> None:
    from structgen.calls.formats import detect_tool_format

    tok = family_tokenizer(template_alias, tokenizer_alias)
    assert detect_tool_format(tok) == fmt
    lm = SimpleNamespace(tokenizer=tok)
    ours = prompt_ids(lm, None, _request(_with_ids(OPENAI_MESSAGES, NINE)).message_dicts(), TOOLS)
    text = tok.apply_chat_template(_with_ids(HF_MESSAGES, NINE), tools=TOOLS, add_generation_prompt=True,
                                   tokenize=False)
    assert ours == tok.encode(text, add_special_tokens=False)
    rendered = tok.decode(ours)
    assert '{"temp_c": 3, "sky": "snow"}' in rendered.replace('\\"', '"')     # the tool's answer
    assert '"get_weather"' in rendered and '"city": "Oslo"' in rendered        # the call made


@pytest.mark.assets
def test_openai_call_ids_reach_a_mistral_template_as_nine_characters(family_tokenizer) -> None:
    """OpenAI's ids (``call_...``) would make Mistral's template refuse the conversation: each
    reaches it as 9 letters or digits, the same for a call and its result, different ids apart."""
    tok = family_tokenizer("mistral-nemo-template", "mistral")
    lm = SimpleNamespace(tokenizer=tok)
    two_calls = json.loads(json.dumps(OPENAI_MESSAGES))
    two_calls[2]["tool_calls"].append({"id": "call_2", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Bergen"}'}})
    two_calls.append({"role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": '"rain"'})
    rendered = tok.decode(prompt_ids(lm, None, _request(two_calls).message_dicts(), TOOLS))
    call_ids = re.findall(r'"id": "([^"]*)"', rendered)
    result_ids = re.findall(r'"call_id": "([^"]*)"', rendered)
    assert len(call_ids) == 2 and all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in call_ids)
    assert result_ids == call_ids and call_ids[0] != call_ids[1]


def test_the_calls_a_template_shows_are_calls_its_format_accepts() -> None:
    """What the model reads of its past calls (each template's spelling, as rendered above) is
    a call the grammar of its tool format lets it write."""
    from structgen.calls.plan import plan_output

    llama = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    mistral = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    for fmt, text in (("llama3", llama), ("mistral", mistral)):
        for choice in ("auto", "required"):
            plan = plan_output(tools=TOOLS, tool_choice=choice, tool_format=fmt)
            assert plan.grammar.accepts(text), (fmt, choice)


# ---------------------------------------------------------------------------------------------
# the GGUF path: structgen renders a GGUF's own template itself, and must render what transformers
# renders (its ``tojson`` keeps key order and does not escape HTML; ``strftime_now``; ``break``)

TRICKY_TOOLS = [{"type": "function", "function": {
    "name": "search", "description": "Find <b>items</b> & prices in €, 'quoted'.",
    "parameters": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}},
                   "required": ["zeta"]}}}]


@pytest.mark.assets
@pytest.mark.parametrize("template_alias,tokenizer_alias", [(a, t) for a, t, _ in FAMILIES] + [("qwen", "")])
def test_gguf_renderer_renders_real_templates_as_transformers(
        family_tokenizer, qwen_tokenizer, template_alias: str, tokenizer_alias: str) -> None:
    from structgen.generation.prompts import render_chat_template

    tok = qwen_tokenizer if template_alias == "qwen" else family_tokenizer(template_alias, tokenizer_alias)
    call = {"id": NINE, "type": "function",
            "function": {"name": "search", "arguments": {"zeta": "Ø <x>", "alpha": 2}}}
    conversations = [
        _with_ids(HF_MESSAGES, NINE),
        [{"role": "user", "content": "Prices of <b>tea</b> & ☕?"},
         {"role": "assistant", "content": "", "tool_calls": [call]},
         {"role": "tool", "tool_call_id": NINE, "name": "search", "content": '{"b": 1, "a": "€"}'}],
    ]
    for messages in conversations:
        for tools in (TOOLS, TRICKY_TOOLS):
            want = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
            got = render_chat_template(tok.chat_template, messages, add_generation_prompt=True, tools=tools,
                                       bos_token=tok.bos_token or "", eos_token=tok.eos_token or "")
            assert got == want


def test_gguf_renderer_gives_templates_transformers_helpers() -> None:
    from structgen.generation.prompts import render_chat_template

    template = ("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
                "{{ m | tojson }}{% endfor %}|{{ strftime_now('%Y') }}")
    got = render_chat_template(template, [{"role": "user", "content": "<&>é"}, {"role": "x"}],
                               add_generation_prompt=False)
    assert got.split("|")[0] == '{"role": "user", "content": "<&>é"}'
    assert re.fullmatch(r"\d{4}", got.split("|")[1])
    with pytest.raises(ConfigError, match="refused the messages: no"):
        render_chat_template("{{ raise_exception('no') }}", [], add_generation_prompt=False)
