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
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from structgen.cli._common import EXIT_OK, _load_settings, _Usage
from structgen.errors import AssetError, ConfigError

#: Environment variable read for the API key when ``--api-key`` is not given.
API_KEY_ENV = "STRUCTGEN_API_KEY"


def _seconds(text: str) -> float:
    """argparse type: a finite number of seconds above 0 (at most a day)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if not 0 < value <= 86400:  # also false for NaN
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds above 0 and at most 86400")
    return value


def _allowed_hosts(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``Host`` allow-list: ``--allowed-hosts`` (comma-separated) when given, else the
    default for the bind address (:func:`structgen.serving.app.default_allowed_hosts`)."""
    from structgen.serving.app import default_allowed_hosts

    if args.allowed_hosts is None:
        return default_allowed_hosts(args.host)
    hosts = tuple(h.strip() for h in args.allowed_hosts.split(",") if h.strip())
    if not hosts:
        raise _Usage("--allowed-hosts: give at least one host name, or * for any")
    return hosts


def _tool_format(args: argparse.Namespace, gen: Any) -> str | None:
    """The call format of requests with tools: ``--tool-format``, else ``generation.tool_format``
    of ``--config``, else None (detected from the model); an unknown name is a usage error."""
    from structgen.calls.formats import tool_format

    name = getattr(args, "tool_format", None) or gen.tool_format
    if name is None:
        return None
    try:
        return tool_format(name).name if isinstance(name, str) else name
    except ConfigError as e:
        raise _Usage(f"--tool-format: {e}") from None


def _observer(metrics: Any) -> Any:
    """Feed every finished (not cancelled) sequence to the run metrics, with the engine's
    verdict on its validity (:mod:`structgen.serving.validity`; plain text is not judged)."""

    def observe(res: Any) -> None:
        if res.reason in ("cancelled", "error"):
            return
        verdict = getattr(res, "validity", None)
        metrics.observe(SimpleNamespace(tokens=res.tokens, stats=res.stats, finish_reason=res.reason),
                        valid=None if verdict is None else verdict == "valid",
                        constrained=verdict is not None)

    return observe


def build_app(args: argparse.Namespace) -> Any:
    """The FastAPI app for parsed ``structgen serve`` arguments (model loaded, engine built)."""
    from structgen.metrics import process_metrics
    from structgen.serving.app import create_app
    from structgen.serving.engine import Engine

    settings = _load_settings(args.config)
    gen = settings.generation
    cfg = settings.speculative_decoding
    try:
        if args.temperature is not None:
            cfg = replace(cfg, temperature=args.temperature)
    except ConfigError as e:
        raise _Usage(f"--temperature: {e}") from None
    from structgen.assets.store import is_gguf_path, resolve_model

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from structgen.generation.api import DEFAULT_MODEL

    model_name = args.model or gen.model or DEFAULT_MODEL
    try:
        model_path = resolve_model(model_name)
    except AssetError as e:
        raise _Usage(str(e)) from None
    from transformers.utils import logging as hf_logging

    from structgen.generation.model import load_model

    hf_logging.disable_progress_bar()
    if args.prefix_cache_mb < 0:
        raise _Usage("--prefix-cache-mb must be 0 (off) or more")
    try:
        if is_gguf_path(model_path):  # llama.cpp backend: its threads, context and prefix cache
            # ggml's tiled K-quant kernel (8+ columns) rounds unlike the dot-product kernel, so
            # with it on every batched step is split into decodes of at most 7 positions; off,
            # a 16-row step is one decode, 1.8x faster, and a prefill 1.2x slower (measured,
            # docs/guides/llamacpp.md). A server steps batches: off unless the user says.
            os.environ.setdefault("GGML_CPU_TILED_MM", "0")
            from structgen.generation.llamacpp import load_gguf

            lm = load_gguf(model_path, n_threads=args.threads, n_ctx=args.ctx_size)
            lm.prefix_cache.max_bytes = args.prefix_cache_mb << 20
        else:
            if args.threads:
                import torch

                torch.set_num_threads(args.threads)
            lm = load_model(str(model_path), dtype=args.dtype)
    except AssetError as e:
        raise _Usage(f"cannot load model {model_name}: {e}") from None
    except Exception as e:  # noqa: BLE001 - transformers' and llama.cpp's many load errors
        raise _Usage(f"cannot load model {model_name}: {type(e).__name__}: {e}") from None
    metrics = process_metrics()
    engine = Engine(lm, cfg=cfg, speculative=gen.speculative and not args.no_speculative,
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


def _cmd_serve(args: argparse.Namespace) -> int:
    from structgen.serving.app import run_server

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


def add_parser(sub: Any, port_type: Any, positive_int: Any) -> None:
    """Register ``serve`` on the CLI's subparsers."""
    s = sub.add_parser(
        "serve", help="serve an OpenAI-compatible HTTP API with continuous batching",
        description="Serve /v1/chat/completions, /v1/completions, /v1/models, /health and /metrics "
        "(OpenAI-compatible; response_format json_schema / json_object, plus grammar and regex "
        "extensions). Requests join one continuously refilled batch. Loopback only unless --host "
        "says otherwise. Stops (draining running requests) on Ctrl-C / SIGTERM.")
    s.add_argument("--model", "-m", metavar="ALIAS|PATH",
                   help="model alias (see `structgen models`; an ALIAS-gguf alias runs the GGUF on "
                   "llama.cpp), Hugging Face folder or .gguf file (default: generation.model of "
                   "--config, else smollm2-135m)")
    s.add_argument("--config", "-c", metavar="spec.yaml", help="YAML configuration (see `structgen config`)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=port_type, default=8000, help="TCP port (default 8000)")
    s.add_argument("--api-key", metavar="KEY", help=f"require 'Authorization: Bearer KEY' on every route "
                   f"but /health (default: ${API_KEY_ENV}; unset: no key)")
    s.add_argument("--served-model-name", metavar="NAME", help="model id in /v1/models (default: --model)")
    s.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "auto"),
                   help="weights type of a transformers model (a GGUF keeps its own)")
    s.add_argument("--threads", type=positive_int, metavar="N",
                   help="CPU threads of the model: llama.cpp's for a GGUF (default: the CPU count, at "
                   "most 8), torch's otherwise")
    s.add_argument("--ctx-size", type=positive_int, metavar="N",
                   help="positions per sequence of a GGUF (default: its training context, at most 4096)")
    s.add_argument("--prefix-cache-mb", type=int, default=512, metavar="MB",
                   help="memory for the KV states of prompt prefixes that requests share (system "
                   "prompt, tools), on a GGUF; 0 turns the cache off (default 512)")
    s.add_argument("--temperature", type=float, metavar="T",
                   help="default temperature of requests that give none (default 0: greedy)")
    s.add_argument("--no-speculative", action="store_true", help="plain constrained decoding (baseline)")
    s.add_argument("--tool-format", metavar="NAME",
                   help="how the model writes tool calls: hermes_json, hermes, json, llama3, mistral or "
                   "another registered format (default: generation.tool_format of --config, else "
                   "detected from the model's chat template and tokenizer)")
    s.add_argument("--max-running", type=positive_int, default=16, metavar="N",
                   help="sequences in the running batch (default 16)")
    s.add_argument("--max-queued", type=positive_int, default=256, metavar="N",
                   help="sequences compiling or waiting for the batch; beyond: 429 (default 256)")
    s.add_argument("--request-timeout", type=float, default=600.0, metavar="S",
                   help="seconds a request may run before it ends with finish_reason length (default 600)")
    s.add_argument("--prepare-timeout", type=_seconds, default=30.0, metavar="S",
                   help="seconds from a request's arrival to the end of its preparation (compile, "
                   "token-budget check), waiting included; beyond: 422 for its own work, 429 for waiting "
                   "(default 30)")
    s.add_argument("--compile-processes", type=int, default=2, metavar="N",
                   help="worker processes compiling constraints that are in no cache, so that a slow or "
                   "hostile compile neither holds the server's GIL nor outlives its request (0: compile "
                   "on threads of the server; default 2)")
    s.add_argument("--max-body-bytes", type=positive_int, default=4 << 20, metavar="N",
                   help="largest request body; beyond: 413 (default 4 MiB)")
    s.add_argument("--allowed-hosts", metavar="HOSTS",
                   help="comma-separated names the Host header may give (*.example.org: its subdomains; "
                   "*: any); beyond: 421. Guards against DNS rebinding (default: localhost, 127.0.0.1, ::1 "
                   "and --host; any when --host is 0.0.0.0 or ::)")
    s.add_argument("--max-connections", type=positive_int, default=256, metavar="N",
                   help="connections served at once; a request on one more gets 503 (default 256)")
    s.add_argument("--keep-alive-timeout", type=_seconds, default=5.0, metavar="S",
                   help="seconds an idle connection stays open between requests (default 5)")
    s.add_argument("--header-timeout", type=_seconds, default=10.0, metavar="S",
                   help="seconds a client has to send a request line and headers; then the connection "
                   "is closed (default 10)")
    s.add_argument("--body-timeout", type=_seconds, default=30.0, metavar="S",
                   help="seconds a client has to send a request body; beyond: 408 (default 30)")
    s.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    s.set_defaults(func=_cmd_serve)
