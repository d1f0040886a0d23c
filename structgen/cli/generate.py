"""``structgen generate``: constrained (speculative) generation for one prompt or a JSON Lines file
of prompts; one JSON line per result, exit 1 when any output is invalid or incomplete.

Files written (``--out``/``--values-out``/``--metrics-out``) go through
:mod:`structgen.atomic_files`: an existing file is replaced only when the run succeeded; a failed or
interrupted run keeps what it finished in ``OUT.partial``. Ctrl-C never cuts a micro-batch's result
lines short: the run stops, says how many requests finished and where their results are, and exits
130."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO, cast

import torch
from transformers.utils import logging as hf_logging

import structgen
from structgen.assets.store import resolve_model
from structgen.atomic_files import AtomicOutput, abort_all, check_distinct
from structgen.calls.formats import normalize_tools, tool_choice_name
from structgen.cli._common import (
    EXIT_INVALID,
    EXIT_OK,
    _isatty,
    _load_settings,
    _note,
    _text,
    _Usage,
)
from structgen.cli._constraints import _Constraint, _main_constraint, _schema_constraint
from structgen.config import GenerationOptions, SpecConfig
from structgen.errors import AssetError, ConfigError, StructgenError
from structgen.frontends.constraint import schema_from
from structgen.generation.api import DEFAULT_MODEL, GenerationResult, prompt_ids
from structgen.generation.loop import check_budget
from structgen.generation.model import CausalLM, check_context, load_model, vocabulary_for
from structgen.json_types import JsonValue
from structgen.masks.matcher import Matcher
from structgen.metrics import Metrics, serve_metrics
from structgen.settings import Settings, with_overrides
from structgen.validation import Document

__all__ = ["run"]

#: A chat conversation of one ``--prompts`` line: ``{"role": ..., "content": ...}`` objects.
Messages = list[dict[str, str]]
#: The tool/reasoning keywords of :func:`structgen.generate` (see :func:`_tool_options`).
ToolMode = dict[str, object]


@dataclass
class _Request:
    index: int
    prompt: str | None
    messages: Messages | None
    constraint: _Constraint
    id: JsonValue = None
    where: str = "--prompt"  # FILE:LINE of the request in --prompts, for error messages


def _check_messages(value: JsonValue) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str) for m in value))


def _read_requests(args: argparse.Namespace, main: _Constraint | None, settings: Settings,
                   schema_files: list[str] | None = None) -> list[_Request]:
    """The requests of ``--prompt`` or of the ``--prompts`` JSON Lines file (checked here, before
    any model is loaded: a bad line is a usage error naming FILE:LINE). The schema files the
    prompts file names are appended to ``schema_files``."""
    if args.prompt is not None:
        if main is None:
            raise _Usage("give one of --schema, --pydantic, --grammar or --regex")
        if not args.prompt:
            raise _Usage("--prompt is empty")
        return [_Request(0, args.prompt, None, main)]
    return _read_prompts_file(args.prompts, main, settings, [] if schema_files is None else schema_files)


def _read_prompts_file(name: str, main: _Constraint | None, settings: Settings,
                       schema_files: list[str]) -> list[_Request]:
    """The requests of a JSON Lines prompts file; appends the schema files its lines name to
    ``schema_files`` (inputs an output must not overwrite)."""
    try:
        raw = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except OSError as e:
        raise _Usage(f"cannot read {name}: {e.strerror or e}") from None
    base = Path(name).resolve().parent if name != "-" else Path.cwd()
    cache: dict[str, _Constraint] = {}
    requests: list[_Request] = []
    for lineno, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            item = json.loads(line)
        except (ValueError, UnicodeDecodeError) as e:
            raise _Usage(f"{where}: not a JSON object: {e}") from None
        if not isinstance(item, dict):
            raise _Usage(f"{where}: each line must be a JSON object with a \"prompt\" or \"messages\"")
        prompt, messages = item.get("prompt"), item.get("messages")
        if (prompt is None) == (messages is None):
            raise _Usage(f"{where}: give exactly one of \"prompt\" and \"messages\"")
        if prompt is not None and not (isinstance(prompt, str) and prompt):
            raise _Usage(f"{where}: \"prompt\" must be a non-empty string")
        if messages is not None and not _check_messages(messages):
            raise _Usage(f"{where}: \"messages\" must be a non-empty list of "
                         "{\"role\": ..., \"content\": ...} objects")
        constraint = main
        if "schema" in item:
            spec = item["schema"]
            if isinstance(spec, str):  # a schema file, relative to the prompts file
                path = Path(spec) if Path(spec).is_absolute() else base / spec
                key = "file:" + str(path)
                if key not in cache:
                    schema_files.append(str(path))
                    try:
                        schema = schema_from(path)
                    except StructgenError as e:
                        raise _Usage(f"{where}: {_text(e)}") from None
                    cache[key] = _schema_constraint(schema, f"{where}: {spec}", settings)
            elif isinstance(spec, (dict, bool)):
                key = "inline:" + json.dumps(spec, sort_keys=True)
                if key not in cache:
                    cache[key] = _schema_constraint(spec, f"{where}: schema", settings)
            else:
                raise _Usage(f"{where}: \"schema\" must be a JSON Schema object or a file name")
            constraint = cache[key]
        if constraint is None:
            raise _Usage(f"{where}: no constraint: give --schema, --pydantic, --grammar or --regex, "
                         "or a \"schema\" field on every line")
        requests.append(_Request(len(requests), prompt, messages, constraint, item.get("id"), where))
    if not requests:
        raise _Usage(f"no prompts in {name}")
    return requests


def _check_output(req: _Request, res: GenerationResult) -> tuple[bool, JsonValue, list[str]]:
    """(valid, parsed value, errors) of one result, by an oracle other than the grammar where
    there is one: jsonschema (with formats) and pydantic for JSON; the compiled grammar for
    Lark grammars and regexes."""
    if res.finish_reason not in ("stop", "budget_close"):
        return False, None, [f"incomplete: finish_reason={res.finish_reason} (max_new_tokens reached)"]
    c = req.constraint
    if c.compiled is None:  # free text around tool calls: the calls are checked by generate
        return True, None, []
    if not c.is_json:
        ok = bool(c.compiled.accepts(res.text))
        return ok, None, [] if ok else ["the output is not a sentence of the grammar"]
    try:
        value = json.loads(res.text)
    except ValueError as e:
        return False, None, [f"not JSON: {e}"]
    assert c.validator is not None  # every JSON kind has one (_schema_constraint)
    result = c.validator.validate(Document(1, value), "<output>")
    errors = [f"{e.path}: {e.message}" for e in result.errors]
    if c.pydantic is not None and not errors:
        try:
            c.pydantic.model_validate_json(res.text)
        except Exception as e:  # noqa: BLE001 - pydantic's ValidationError
            errors.append(f"pydantic: {' '.join(str(e).split())}")
    return not errors, value, errors


class _Progress:
    """A one-line progress bar on ``stream``, drawn only when it is a terminal."""

    def __init__(self, total: int, stream: TextIO, prog: str) -> None:
        self.total = total
        self.stream = stream
        self.prog = prog
        self.enabled = _isatty(stream)
        self.t0 = time.perf_counter()

    def update(self, done: int, tokens: int) -> None:
        if not self.enabled:
            return
        width = 30
        fill = round(width * done / self.total) if self.total else width
        rate = tokens / max(time.perf_counter() - self.t0, 1e-9)
        self.stream.write(f"\r{self.prog}: [{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} "
                          f"requests, {rate:.1f} tokens/s")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def _chunks(requests: list[_Request], size: int) -> list[list[_Request]]:
    """Micro-batches of at most ``size`` consecutive requests of one kind (prompt / messages)."""
    out: list[list[_Request]] = []
    for r in requests:
        if out and len(out[-1]) < size and (out[-1][0].prompt is None) == (r.prompt is None):
            out[-1].append(r)
        else:
            out.append([r])
    return out


def run(args: argparse.Namespace) -> int:
    """Every check that needs no model runs first (options, constraints, prompts, output paths);
    the outputs are written through temporary files renamed into place at the end, so a run that
    fails never destroys an existing file (what was finished is kept as ``OUT.partial``)."""
    prog = "structgen generate"
    settings = _load_settings(args.config)
    gen = settings.generation
    cfg = settings.speculative_decoding
    try:
        if args.temperature is not None:
            cfg = replace(cfg, temperature=args.temperature)
        if args.batch_size is not None:
            cfg = replace(cfg, batch_size=args.batch_size)
        if args.max_new_tokens is not None:
            gen = replace(gen, max_new_tokens=args.max_new_tokens)
        if args.on_budget is not None:
            gen = replace(gen, on_budget=args.on_budget)
        if args.seed is not None:
            gen = replace(gen, seed=args.seed)
        if getattr(args, "threads", None) is not None:
            gen = replace(gen, threads=args.threads)
        if args.strict is not None:
            settings = replace(settings, json_schema=replace(settings.json_schema, strict=args.strict))
        over = {k: getattr(args, k, None) for k in ("tools", "tool_choice", "parallel_tool_calls",
                                                    "tool_format", "reasoning", "thinking_budget")}
        over = {k: v for k, v in over.items() if v is not None}
        if over:
            gen = with_overrides(replace(settings, generation=gen), "generation", **over).generation
    except ConfigError as e:
        raise _Usage(f"--{(e.key or '').replace('_', '-')}: {e}") from None
    speculative = gen.speculative and not args.no_speculative
    if args.metrics_out and Path(args.metrics_out).suffix not in (".json", ".prom"):
        raise _Usage(f"--metrics-out {args.metrics_out}: the name must end in .json or .prom")

    main = _main_constraint(args, settings)
    wants_tools = gen.tools or gen.reasoning or gen.thinking_budget is not None or gen.tool_choice != "auto"
    tool_mode = _tool_options(gen) if wants_tools else None
    if tool_mode is not None and main is None:
        main = _Constraint("text", None)  # free text (the tool calls are the grammar's)
    schema_files: list[str] = []
    requests = _read_requests(args, main, settings, schema_files)
    outputs = [("--out", args.out), ("--values-out", args.values_out), ("--metrics-out", args.metrics_out)]
    try:
        check_distinct([("--prompts", args.prompts), ("--schema", args.schema), ("--tools", gen.tools),
                        ("--grammar", args.grammar), ("--config", args.config),
                        *(("a schema of --prompts", f) for f in schema_files)], outputs)
    except ConfigError as e:
        raise _Usage(str(e)) from None

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    model_name = args.model or gen.model or DEFAULT_MODEL
    try:
        model_path = resolve_model(model_name)
    except AssetError as e:
        raise _Usage(str(e)) from None

    opened: list[AtomicOutput] = []
    finished = [0]  # requests whose lines are written, for the Ctrl-C message
    try:
        files: dict[str, AtomicOutput] = {}
        for flag, path in outputs:  # opened now: an unwritable folder fails before any work
            if path:
                try:
                    files[flag] = AtomicOutput(path)
                except OSError as e:
                    raise _Usage(f"{flag}: cannot write {path}: {e.strerror or e}") from None
                opened.append(files[flag])
        if not _isatty(sys.stderr):  # transformers draws its own loading bars otherwise
            hf_logging.disable_progress_bar()
        try:
            lm = load_model(str(model_path), dtype=getattr(args, "dtype", "float32"), threads=gen.threads)
        except Exception as e:  # noqa: BLE001 - transformers' many load errors
            raise _Usage(f"cannot load model {model_name}: {type(e).__name__}: {e}") from None
        if gen.threads is not None and not getattr(lm.model, "is_gguf_model", False):
            torch.set_num_threads(gen.threads)
        _check_contexts(lm, requests, gen.max_new_tokens, gen.on_budget)
        rc = _generate_all(args, prog, lm, requests, cfg, gen.max_new_tokens, gen.seed, speculative,
                           settings, files, finished, on_budget=gen.on_budget, tool_mode=tool_mode)
        for o in opened:
            o.commit()
        return rc
    except BaseException as e:
        notes = abort_all(opened)
        if isinstance(e, KeyboardInterrupt):
            where = "" if not finished[0] else \
                "; their result lines are on stdout" if "--out" not in files else \
                f"; their result lines are in {files['--out'].partial_path or args.out}"
            print(f"{prog}: interrupted: {finished[0]} of {len(requests)} request(s) finished{where}",
                  file=sys.stderr)
        for note in notes:
            _note(prog, note)
        raise


def _tool_options(gen: GenerationOptions) -> ToolMode:
    """The tool/reasoning keywords of :func:`structgen.generate` from the generation options;
    the tools file is read here (a usage error names it)."""
    tools = None
    if gen.tools:
        try:
            data = json.loads(Path(gen.tools).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise _Usage(f"--tools {gen.tools}: cannot read a JSON list of tools: {e}") from None
        tools = data.get("tools") if isinstance(data, dict) else data
        if not isinstance(tools, list) or not tools:
            raise _Usage(f"--tools {gen.tools}: expected a non-empty JSON list of tool specs")
        try:
            normalized = normalize_tools(tools)
            choice: str | dict[str, str] = gen.tool_choice
            if gen.tool_choice not in ("auto", "required", "none"):
                choice = {"name": gen.tool_choice}
            tool_choice_name(choice, normalized)
        except StructgenError as e:
            raise _Usage(f"--tools {gen.tools}: {_text(e)}") from None
    elif gen.tool_choice != "auto":
        raise _Usage("--tool-choice needs --tools")
    else:
        choice = "auto"
    return {"tools": tools, "tool_choice": choice, "parallel_tool_calls": gen.parallel_tool_calls,
            "tool_format": gen.tool_format, "reasoning": gen.reasoning,
            "thinking_budget": gen.thinking_budget}


def _tool_call_kw(kw: dict[str, object], req: _Request, tool_mode: ToolMode) -> dict[str, object]:
    """:func:`structgen.generate` keywords for one request with tools and/or reasoning."""
    out = {k: v for k, v in kw.items() if k not in ("grammar", "prompt", "messages")}
    c = req.constraint
    if c.compiled is not None:
        if not c.is_json:
            raise _Usage("--reasoning and --tools take a JSON Schema (--schema, --pydantic, or \"schema\" "
                         "lines) or no constraint, not --grammar/--regex")
        out["schema"] = c.schema
    if req.prompt is not None:
        out["prompt"] = req.prompt
    else:
        out["messages"] = req.messages
    out.update(tool_mode)
    return out


@contextmanager
def _interrupt_deferred() -> Iterator[None]:
    """Ctrl-C (SIGINT) during the block takes effect at its end, so the block finishes whole. Only
    where Python's own SIGINT handler is in place, in the main thread; elsewhere, no change."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _check_contexts(lm: CausalLM, requests: list[_Request], max_new_tokens: int,
                    on_budget: str = "close") -> None:
    """Every request's prompt plus ``max_new_tokens`` within the model's context, and (with
    ``on_budget="close"``) ``max_new_tokens`` at least its constraint's shortest output, checked
    before anything is generated (an error names the request's FILE:LINE)."""
    vocab = vocabulary_for(lm) if on_budget == "close" else None
    for req in requests:
        try:
            ids = prompt_ids(lm, req.prompt, req.messages)
            check_context(lm, len(ids), max_new_tokens)
            if vocab is not None and req.constraint.compiled is not None:  # (tools: generate checks)
                check_budget(Matcher(req.constraint.compiled, vocab), max_new_tokens)
        except StructgenError as e:
            raise _Usage(f"{req.where}: {_text(e)}") from None


def _generate_all(args: argparse.Namespace, prog: str, lm: CausalLM, requests: list[_Request],
                  cfg: SpecConfig, max_new_tokens: int, seed: int | None, speculative: bool,
                  settings: Settings, files: dict[str, AtomicOutput], finished: list[int],
                  on_budget: str = "close", tool_mode: ToolMode | None = None) -> int:
    """Generate every request, writing each micro-batch's result lines as soon as it is done
    to ``files["--out"]`` (an AtomicOutput; stdout without one) and ``files["--values-out"]``,
    and the run metrics to ``files["--metrics-out"]`` at the end (the caller commits them).
    ``finished[0]`` counts the requests whose lines are written (Ctrl-C waits for a micro-batch's
    lines to be written whole). With ``tool_mode`` (tools and/or reasoning) each request runs
    alone and its line also holds ``tool_calls`` and ``reasoning``."""
    metrics = Metrics(thresholds=settings.monitoring)
    server = None
    if args.metrics_port is not None:
        try:
            server = serve_metrics(metrics, port=args.metrics_port)
        except OSError as e:
            raise _Usage(f"--metrics-port {args.metrics_port}: {e.strerror or e}") from None
        _note(prog, f"metrics at http://127.0.0.1:{server.port}/metrics")
    progress = _Progress(len(requests), sys.stderr, prog)
    failed = done = tokens = 0
    out: AtomicOutput | TextIO = files.get("--out", sys.stdout)
    values_out = files.get("--values-out")
    # looked up on each run, so that a test may replace structgen.generate
    generate: Callable[..., object] = structgen.generate
    metrics.mark_start()
    try:
        for chunk in _chunks(requests, 1 if tool_mode is not None else cfg.batch_size):
            kw: dict[str, object] = {"grammar": [r.constraint.compiled for r in chunk],
                                  "max_new_tokens": max_new_tokens, "speculative": speculative,
                                  "on_budget": on_budget,
                                  "config": cfg, "seed": None if seed is None else seed + chunk[0].index}
            if chunk[0].prompt is not None:
                kw["prompt"] = [r.prompt for r in chunk]
            else:
                kw["messages"] = [r.messages for r in chunk]
            if tool_mode is not None:
                kw = _tool_call_kw(kw, chunk[0], tool_mode)
            try:
                got = generate(lm, **kw)
                results = cast("list[GenerationResult]", [got] if tool_mode is not None else got)
            except StructgenError as e:
                where = chunk[e.request_index].where if e.request_index is not None else None
                raise _Usage(f"{where}: {_text(e)}" if where else _text(e)) from None
            with _interrupt_deferred():
                for req, res in zip(chunk, results):
                    valid, value, errors = _check_output(req, res)
                    if res.error and tool_mode is not None:
                        valid, errors = False, errors + [res.error]
                    metrics.observe(res, valid=valid)
                    failed += not valid
                    line: dict[str, object] = {"index": req.index}
                    if req.id is not None:
                        line["id"] = req.id
                    line.update({"text": res.text, "value": value, "finish_reason": res.finish_reason,
                                 "valid": valid, "errors": errors, "num_tokens": len(res.tokens),
                                 "stats": res.stats.as_dict() if hasattr(res.stats, "as_dict") else None})
                    if tool_mode is not None:
                        line["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments}
                                              for c in res.tool_calls]
                        line["reasoning"] = res.reasoning
                    out.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
                    if values_out is not None:
                        # the output text itself (compact JSON is one line); a cut-short output is
                        # written as is, so that a validator reports it
                        values_out.write(res.text.replace("\n", " ") + "\n")
                    tokens += len(res.tokens)
                out.flush()  # a crash keeps the finished micro-batches (in OUT.partial)
                if values_out is not None:
                    values_out.flush()
                done += len(chunk)
                finished[0] = done
            progress.update(done, tokens)
    finally:
        progress.close()
        if server is not None:
            server.close()
    d = metrics.as_dict()
    acc = d["draft"]["acceptance"]
    tpp = d["tokens_per_pass"]
    print(f"{prog}: {done} request(s): {d['requests']['valid']} valid, {d['requests']['invalid']} "
          f"invalid, {d['requests']['incomplete']} incomplete; "
          f"{'-' if tpp is None else f'{tpp:.2f}'} tokens/pass, draft acceptance "
          f"{'-' if acc is None else f'{acc:.1%}'}", file=sys.stderr)
    for a in d["alerts"]:
        print(f"{prog}: warning: {a['message']}", file=sys.stderr)
    if "--metrics-out" in files:
        files["--metrics-out"].write(metrics.render(args.metrics_out))
    return EXIT_INVALID if failed else EXIT_OK
