"""The grammar core: IR, passes, automata, the compiler and the byte-level runtime.

Tokenizer-agnostic; never imports torch, transformers or pydantic."""
