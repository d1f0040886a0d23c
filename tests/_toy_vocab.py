"""A duck-typed vocabulary for tests: explicit token bytes, no tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ToyVocab:
    token_bytes: list
    eos_token_ids: tuple = ()
    vocab_size: int = 0
    content_hash: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.vocab_size:
            self.vocab_size = len(self.token_bytes)
