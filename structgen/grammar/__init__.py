"""The grammar core: IR, passes, automata, the compiler and the byte-level runtime.

Modules, bottom to top: :mod:`~structgen.grammar.ir` (the grammar IR and its reference
interpreter), :mod:`~structgen.grammar.passes` (IR rewrites), :mod:`~structgen.grammar.fsa`
(NFA/DFA algorithms, with compiled kernels in ``_fsa_kernels``),
:mod:`~structgen.grammar.compiled` (:class:`CompiledGrammar` and its rule kinds) and
:mod:`~structgen.grammar.compiler` (IR -> compiled grammar, with
:mod:`~structgen.grammar.rule_nfas` its passes over the rules' NFAs).

Tokenizer-agnostic; never imports torch, transformers or pydantic."""
