"""``structgen serve``: the OpenAI-compatible HTTP server (:mod:`structgen.serving`).

Loads the model (alias or folder), builds the continuous-batching engine from the YAML
configuration (``speculative_decoding``, ``generation``: ``max_new_tokens`` is the default
``max_tokens``, ``speculative``; ``json_schema`` and ``compile`` limits) and serves it with
uvicorn on ``--host:--port`` (loopback by default) until SIGINT / SIGTERM, then drains.
``--tool-format`` (else ``generation.tool_format``, else detected from the model) is the call
format of requests with tools.

The connection flags bound what one client can hold: ``--header-timeout`` and
``--body-timeout`` (a request must arrive in time), ``--keep-alive-timeout`` (an idle
connection is closed), ``--max-connections`` (beyond: 503). ``--allowed-hosts`` is the
``Host`` allow-list (DNS rebinding); by default the loopback names and ``--host`` itself, or
any name when ``--host`` is a wildcard address (0.0.0.0, ::). See docs/security.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace

import torch
from fastapi import FastAPI
from transformers.utils import logging as hf_logging

from structgen.assets.store import is_gguf_path, resolve_model
from structgen.calls.formats import tool_format
from structgen.cli._common import API_KEY_ENV, EXIT_OK, _load_settings, _Usage
from structgen.config import GenerationOptions
from structgen.errors import AssetError, ConfigError
from structgen.generation.api import DEFAULT_MODEL
from structgen.generation.llamacpp import LlamaCppLM, load_gguf
from structgen.generation.model import CausalLM, as_causal_lm, load_model
from structgen.metrics import Metrics, process_metrics
from structgen.serving.app import create_app, default_allowed_hosts, run_server
from structgen.serving.engine import ChoiceResult, Engine

__all__ = ["API_KEY_ENV", "build_app", "run"]

def _allowed_hosts(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``Host`` allow-list: ``--allowed-hosts`` (comma-separated) when given, else the
    default for the bind address (:func:`structgen.serving.app.default_allowed_hosts`)."""
    if args.allowed_hosts is None:
        return default_allowed_hosts(args.host)
    hosts = tuple(h.strip() for h in args.allowed_hosts.split(",") if h.strip())
    if not hosts:
        raise _Usage("--allowed-hosts: give at least one host name, or * for any")
    return hosts


def _tool_format(args: argparse.Namespace, gen: GenerationOptions) -> str | None:
    """The call format of requests with tools: ``--tool-format``, else ``generation.tool_format``
    of ``--config``, else None (detected from the model); an unknown name is a usage error."""
    name = getattr(args, "tool_format", None) or gen.tool_format
    if name is None:
        return None
    try:
        return tool_format(name).name if isinstance(name, str) else name
    except ConfigError as e:
        raise _Usage(f"--tool-format: {e}") from None


def _observer(metrics: Metrics) -> Callable[[ChoiceResult], None]:
    """Feed every finished (not cancelled) sequence to the run metrics, with the engine's
    verdict on its validity (:mod:`structgen.serving.validity`; plain text is not judged)."""

    def observe(res: ChoiceResult) -> None:
        if res.reason in ("cancelled", "error"):
            return
        verdict = getattr(res, "validity", None)
        metrics.observe(SimpleNamespace(tokens=res.tokens, stats=res.stats, finish_reason=res.reason),
                        valid=None if verdict is None else verdict == "valid",
                        constrained=verdict is not None)

    return observe


def build_app(args: argparse.Namespace) -> FastAPI:
    """The FastAPI app for parsed ``structgen serve`` arguments (model loaded, engine built)."""
    settings = _load_settings(args.config)
    gen = settings.generation
    cfg = settings.speculative_decoding
    try:
        if args.temperature is not None:
            cfg = replace(cfg, temperature=args.temperature)
    except ConfigError as e:
        raise _Usage(f"--temperature: {e}") from None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    model_name = args.model or gen.model or DEFAULT_MODEL
    try:
        model_path = resolve_model(model_name)
    except AssetError as e:
        raise _Usage(str(e)) from None
    hf_logging.disable_progress_bar()
    if args.prefix_cache_mb < 0:
        raise _Usage("--prefix-cache-mb must be 0 (off) or more")
    lm: CausalLM | LlamaCppLM
    try:
        if is_gguf_path(model_path):  # llama.cpp backend: its threads, context and prefix cache
            # ggml's tiled K-quant kernel (8+ columns) rounds unlike the dot-product kernel, so
            # with it on every batched step is split into decodes of at most 7 positions; off,
            # a 16-row step is one decode, 1.8x faster, and a prefill 1.2x slower (measured,
            # docs/guides/llamacpp.md). A server steps batches: off unless the user says.
            os.environ.setdefault("GGML_CPU_TILED_MM", "0")
            lm = load_gguf(model_path, n_threads=args.threads, n_ctx=args.ctx_size)
            lm.prefix_cache.max_bytes = args.prefix_cache_mb << 20
        else:
            if args.threads:
                torch.set_num_threads(args.threads)
            lm = load_model(str(model_path), dtype=args.dtype)
    except AssetError as e:
        raise _Usage(f"cannot load model {model_name}: {e}") from None
    except Exception as e:  # noqa: BLE001 - transformers' and llama.cpp's many load errors
        raise _Usage(f"cannot load model {model_name}: {type(e).__name__}: {e}") from None
    metrics = process_metrics()
    engine = Engine(as_causal_lm(lm) if isinstance(lm, LlamaCppLM) else lm,
                    cfg=cfg, speculative=gen.speculative and not args.no_speculative,
                    max_running=args.max_running, max_queued=args.max_queued,
                    default_max_tokens=gen.max_new_tokens, request_timeout_s=args.request_timeout,
                    prepare_timeout_s=args.prepare_timeout, compile_processes=args.compile_processes,
                    json_options=settings.json_schema,
                    compile_options=settings.compile,
                    on_result=_observer(metrics), tool_format=_tool_format(args, gen))
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    name = args.served_model_name or model_name
    return create_app(engine, model_name=name, api_key=api_key, max_body_bytes=args.max_body_bytes,
                      metrics=metrics, allowed_hosts=_allowed_hosts(args), body_timeout_s=args.body_timeout)


def run(args: argparse.Namespace) -> int:
    """Run ``structgen serve`` until SIGINT / SIGTERM."""
    hosts = _allowed_hosts(args)  # a bad --allowed-hosts is a usage error before the model loads
    app = build_app(args)
    where = f"http://{'[' + args.host + ']' if ':' in args.host else args.host}:{args.port}"
    print(f"structgen serve: model {app.state.engine.lm.model.name_or_path or args.model} on {where}/v1 "
          f"({'API key required' if args.api_key or os.environ.get(API_KEY_ENV) else 'no API key'}; "
          f"Host {'any' if '*' in hosts else ', '.join(hosts)})",
          file=sys.stderr, flush=True)
    run_server(app, host=args.host, port=args.port, log_level=args.log_level,
               keep_alive_s=args.keep_alive_timeout, max_connections=args.max_connections,
               header_timeout_s=args.header_timeout)
    return EXIT_OK
