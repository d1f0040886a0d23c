"""The step machine's contract with its drivers: the shared-prefix hint and the drafting policy.

* :func:`structgen.generation.api.conversation_prefix` counts the prompt tokens the
  conversation before the last message renders to, and every driver (``generate`` alone and
  batched, ``stream``, the serving engine) hands that count to the model's prefill.
* The prompt-lookup drafter owns what closes a copied value (:data:`PromptLookupDrafter.CLOSERS`);
  the generic step machine holds no such policy.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import structgen
from structgen.generation.api import conversation_prefix

ROOT = Path(__file__).resolve().parent.parent


class _Tok:
    """A tokenizer of one token per byte with a tiny chat template."""

    def __init__(self, template: bool = True, fail: bool = False) -> None:
        self.chat_template = "yes" if template else None
        self.fail = fail
        self.calls: list[dict[str, Any]] = []

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool, tokenize: bool,
                            **kw: Any) -> str:
        self.calls.append({"n": len(messages), "gen": add_generation_prompt, **kw})
        if self.fail and len(messages) == 1:
            raise ValueError("this template needs a user message")
        tools = f"<tools {kw['tools']}>" if kw.get("tools") else ""
        text = tools + "".join(f"<{m['role']}>{m['content']}</>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())


class _LM:
    def __init__(self, tok: _Tok) -> None:
        self.tokenizer = tok


CONV = [{"role": "system", "content": "You extract."}, {"role": "user", "content": "Bob is 41."}]


def test_conversation_prefix_is_the_rendering_of_the_earlier_messages() -> None:
    from structgen.generation.api import prompt_ids

    lm = _LM(_Tok())
    ids = prompt_ids(lm, None, CONV)
    n = conversation_prefix(lm, CONV, None, ids)
    assert bytes(ids[:n]) == b"<system>You extract.</>"
    assert lm.tokenizer.calls[-1] == {"n": 1, "gen": False}
    # the same tools in both renderings
    ids = prompt_ids(lm, None, CONV, [{"name": "f"}])
    n = conversation_prefix(lm, CONV, [{"name": "f"}], ids)
    assert bytes(ids[:n]).startswith(b"<tools") and bytes(ids[:n]).endswith(b"You extract.</>")
    # only what the prompt really shares counts
    assert conversation_prefix(lm, CONV, None, list(b"<system>You ex")) == len(b"<system>You ex")


def test_conversation_prefix_is_zero_without_earlier_messages_or_rendering() -> None:
    lm = _LM(_Tok())
    ids = list(b"<user>hi</><assistant>")
    assert conversation_prefix(lm, None, None, ids) == 0
    assert conversation_prefix(lm, CONV[1:], None, ids) == 0
    assert conversation_prefix(_LM(_Tok(fail=True)), CONV, None, ids) == 0


def test_conversation_prefix_without_a_chat_template() -> None:
    from structgen.generation.api import prompt_ids

    lm = _LM(_Tok(template=False))
    ids = prompt_ids(lm, None, CONV)
    n = conversation_prefix(lm, CONV, None, ids)
    assert bytes(ids[:n]) == b"system: You extract.\n"


def test_the_step_machine_holds_no_json_drafting_policy() -> None:
    """No byte literal of JSON punctuation in the generic loop: the drafters own that policy."""
    from structgen.generation.drafters import PromptLookupDrafter

    assert b"}" in PromptLookupDrafter.CLOSERS
    for name in ("step.py", "loop.py"):
        tree = ast.parse((ROOT / "structgen" / "generation" / name).read_text(encoding="utf-8"))
        found = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                 and isinstance(n.value, bytes) and any(c in n.value for c in b'",}]')]
        assert not found, (name, found)


# --------------------------------------------------------------------------------------------
# the hint reaches the model's prefill (a tiny random model, GPT-2's tokenizer: no chat template)

@pytest.fixture(scope="module")
def tiny_lm(tokenizer_by_alias: Any) -> Any:
    from test_batch import _tiny  # tests/ is on sys.path (rootdir conftest)

    return _tiny(tokenizer_by_alias("gpt2"))


SCHEMA = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
CONV2 = [{"role": "system", "content": "Extract the age as JSON."}, {"role": "user", "content": "Bob is 41."}]


def _expected(lm: Any, messages: list[dict]) -> int:
    from structgen.generation.api import prompt_ids

    n = conversation_prefix(lm, messages, None, prompt_ids(lm, None, messages))
    assert n > 0
    return n


@pytest.mark.assets
def test_generate_and_stream_pass_the_shared_prefix(tiny_lm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from structgen.generation.model import BatchKV, CausalLM

    seen: list[Any] = []
    plain_prefill, batch_prefill = CausalLM.prefill, BatchKV.prefill

    def spy(self: Any, ids: list[int], *, shared_prefix: int = 0) -> None:
        seen.append(shared_prefix)
        plain_prefill(self, ids, shared_prefix=shared_prefix)

    def batch_spy(self: Any, prompts: list[list[int]], shared: list[int] | None = None) -> None:
        seen.append(list(shared or []))
        batch_prefill(self, prompts, shared)

    monkeypatch.setattr(CausalLM, "prefill", spy)
    monkeypatch.setattr(BatchKV, "prefill", batch_spy)
    n = _expected(tiny_lm, CONV2)
    one = structgen.generate(tiny_lm, schema=SCHEMA, messages=CONV2, max_new_tokens=12)
    assert seen == [n]
    seen.clear()
    text = "".join(structgen.stream(tiny_lm, schema=SCHEMA, messages=CONV2, max_new_tokens=12))
    assert seen == [n] and text == one.text
    seen.clear()
    many = structgen.generate(tiny_lm, schema=SCHEMA, messages=[CONV2, CONV2[1:]], max_new_tokens=12)
    assert seen == [[n, 0]]
    assert many[0].tokens == one.tokens
    seen.clear()
    structgen.generate(tiny_lm, schema=SCHEMA, prompt="Bob is 41.", max_new_tokens=12)
    assert seen == [0]


@pytest.mark.assets
def test_the_engine_passes_the_shared_prefix(tiny_lm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from structgen.generation.model import BatchKV
    from structgen.serving.engine import Constraint, Engine, EngineRequest

    seen: list[Any] = []
    batch_prefill = BatchKV.prefill

    def batch_spy(self: Any, prompts: list[list[int]], shared: list[int] | None = None) -> None:
        seen.append(list(shared or []))
        batch_prefill(self, prompts, shared)

    monkeypatch.setattr(BatchKV, "prefill", batch_spy)
    n = _expected(tiny_lm, CONV2)
    alone = structgen.generate(tiny_lm, schema=SCHEMA, messages=CONV2, max_new_tokens=12)
    engine = Engine(tiny_lm, max_running=2).start()
    try:
        req = EngineRequest(Constraint("json", SCHEMA), messages=CONV2, max_tokens=12)
        [res] = engine.submit_sync(req).wait(timeout=120)
    finally:
        engine.close()
    assert seen and seen[0] == [n]
    assert res.tokens == alone.tokens
