"""The ``structgen`` command line (also ``python -m structgen``).

Subcommands:

* ``validate --schema S.json FILE... | -``: check JSON / JSON Lines instances against a schema
  (jsonschema with formats, plus the compiled grammar). Never imports torch.
* ``compile SCHEMA``: compile a JSON Schema (or a ``.lark`` grammar) and report time, sizes and
  unsupported keywords with their JSON pointers; ``--explain`` prints the IR grammar.
* ``demo``: the main job: compile the example schemas, validate their samples and (once
  ``structgen.generate`` exists) generate with the default model.
* ``generate --model M (--schema S.json | --pydantic mod:Class | --grammar G.lark | --regex RE)
  (--prompt TEXT | --prompts FILE.jsonl) [--config spec.yaml] [--out OUT.jsonl]
  [--metrics-out FILE.json|.prom] [--metrics-port PORT]``: constrained (speculative) generation;
  one JSON line per result; exit 1 when any output is invalid or incomplete.
* ``models [list | pull [--force] ALIAS... | path ALIAS | verify [ALIAS...]]``: the model/tokenizer
  aliases and the cache (every converted file is hashed into its manifest and checked on load).
* ``bench ARGS...``: the benchmark suite of a source checkout (``benchmarks/bench_suite.py``; not
  in the installed package).
* ``config [--example | --check FILE]``: the documented YAML configuration.
* ``serve --model ALIAS|PATH [--config spec.yaml] [--host 127.0.0.1] [--port 8000]``: the
  OpenAI-compatible HTTP server with continuous batching (:mod:`structgen.serving`).

Exit codes: 0 success / all valid, 1 some instance invalid (or a failed check), 2 usage error,
unreadable input or malformed schema (one-line message on stderr), 130 interrupted (Ctrl-C).

Files written (``generate --out/--values-out/--metrics-out``) go through
:mod:`structgen.atomic_files`: an existing file is replaced only when the run succeeded; a failed or
interrupted run keeps what it finished in ``OUT.partial``.

One module per subcommand: :mod:`.validate`, :mod:`.compile`, :mod:`.demo`, :mod:`.generate`,
:mod:`.models`, :mod:`.config`, :mod:`.serve`, :mod:`.bench`; :mod:`._constraints` turns inputs into
compiled grammars, :mod:`._common` holds the exit codes and message printers.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from structgen import __version__
from structgen.cli._common import API_KEY_ENV, EXIT_INVALID, EXIT_USAGE, _err, _Usage
from structgen.config import positive_int_arg

__all__ = ["main"]

#: subcommand -> the module that runs it (its ``run(args)``), imported only when that command
#: runs: ``structgen --help``, ``compile`` and ``validate`` never load what ``generate`` or
#: ``serve`` need (torch, transformers, the HTTP server).
COMMANDS: dict[str, str] = {
    "validate": "structgen.cli.validate",
    "compile": "structgen.cli.compile",
    "demo": "structgen.cli.demo",
    "generate": "structgen.cli.generate",
    "models": "structgen.cli.models",
    "bench": "structgen.cli.bench",
    "config": "structgen.cli.config",
    "serve": "structgen.cli.serve",
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 2), like every other usage error here."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())} "
                              f"(see `{self.prog} --help`)\n")


def _port(text: str) -> int:
    """argparse type: a TCP port number, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: give a number from 0 to 65535") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {value}: give a number from 0 to 65535")
    return value


def _positive_int(text: str) -> int:
    """argparse type: an integer from 1 to structgen.config.MAX_COUNT."""
    return positive_int_arg(text)


def _seconds(text: str) -> float:
    """argparse type: a finite number of seconds above 0 (at most a day)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if not 0 < value <= 86400:  # also false for NaN
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds above 0 and at most 86400")
    return value


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="structgen", description="Grammar-constrained generation toolkit.")
    p.add_argument("--version", action="version", version=f"structgen {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    v = sub.add_parser("validate", help="validate JSON / JSON Lines instances against a JSON Schema",
                       description="Validate instances with jsonschema (formats checked) and the "
                       "compiled grammar. A file that parses as one JSON document is one instance; "
                       "otherwise each non-blank line is one (JSON Lines). '-' reads stdin. "
                       "Exit: 0 all valid, 1 some invalid, 2 usage error / unreadable file / "
                       "malformed schema.")
    v.add_argument("--schema", "-s", required=True, metavar="S.json", help="the JSON Schema")
    v.add_argument("files", nargs="+", metavar="FILE", help="instance files; '-' for stdin")
    v.add_argument("--json", action="store_true", help="one JSON object per instance on stdout")
    v.add_argument("--quiet", "-q", action="store_true", help="print nothing; exit code only")
    v.add_argument("--no-grammar", action="store_true",
                   help="skip the compiled-grammar check (jsonschema only)")
    v.add_argument("--remote", action="append", default=[], metavar="URI=FILE",
                   help="let $ref use FILE as the document at URI (repeatable); no other reference "
                   "outside the schema is ever fetched or read")

    c = sub.add_parser("compile", help="compile a JSON Schema or .lark grammar and report its size")
    c.add_argument("input", metavar="SCHEMA.json|GRAMMAR.lark")
    c.add_argument("--explain", action="store_true", help="print the IR grammar")
    c.add_argument("--lenient", action="store_true",
                   help="compile unsupported keywords as documented over-approximations (warnings)")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.add_argument("--remote", action="append", default=[], metavar="URI=FILE",
                   help="let $ref use FILE as the document at URI (repeatable)")
    c.add_argument("--validation", action="store_true",
                   help="compile validation's language (every JSON spelling, open objects) "
                        "instead of generation's")

    d = sub.add_parser("demo", help="the main job: compile, validate and generate for schemas/")
    d.add_argument("--schemas", metavar="DIR", help="folder of NAME.schema.json files (default: schemas/)")
    d.add_argument("--no-generate", action="store_true", help="skip generation")
    d.add_argument("--max-new-tokens", type=_positive_int, default=256)
    d.add_argument("--model", help="model alias or folder (default: structgen's default model)")

    g = sub.add_parser(
        "generate", help="generate constrained output (JSON Lines, one result per line)",
        description="Generate output that matches a JSON Schema, a Pydantic model, a Lark grammar or "
        "a regex, with speculative decoding. One JSON line per result (text, value, finish_reason, "
        "valid, errors, stats) on stdout or --out; a summary and alerts on stderr; a progress bar on "
        "stderr when it is a terminal. Exit: 0 all outputs valid, 1 some output invalid or "
        "incomplete, 2 usage error (missing file, bad schema, bad configuration key, unknown model).")
    g.add_argument("--model", "-m", metavar="M",
                   help="model alias (see `structgen models`) or Hugging Face folder "
                   "(default: generation.model of --config, else qwen2.5-coder-0.5b)")
    g.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "auto"),
                   help="weights of a model loaded by alias or folder (auto: bfloat16 where the "
                   "hardware computes it natively). In bfloat16 on the CPU the forward is made "
                   "row-invariant, so speculative output still equals plain decoding bit for bit")
    what = g.add_mutually_exclusive_group()
    what.add_argument("--schema", "-s", metavar="S.json", help="JSON Schema file")
    what.add_argument("--pydantic", metavar="pkg.module:Class", help="a Pydantic model class")
    what.add_argument("--grammar", "-g", metavar="G.lark", help="Lark grammar file")
    what.add_argument("--regex", metavar="PATTERN", help="a regular expression")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", "-p", metavar="TEXT", help="one prompt")
    src.add_argument("--prompts", metavar="FILE.jsonl",
                     help="JSON Lines: {\"prompt\": ...} or {\"messages\": [...]}, optionally "
                     "\"schema\" (an object, or a file relative to FILE) and \"id\"; '-' for stdin")
    g.add_argument("--config", "-c", metavar="spec.yaml", help="YAML configuration "
                   "(see `structgen config --example`)")
    g.add_argument("--out", "-o", metavar="OUT.jsonl", help="write the result lines here (default stdout)")
    g.add_argument("--values-out", metavar="VALUES.jsonl",
                   help="also write each output alone, one per line (JSON Lines for JSON schemas: "
                   "feed it to `structgen validate`)")
    g.add_argument("--max-new-tokens", type=int, metavar="N")
    g.add_argument("--on-budget", choices=("close", "cut"), default=None,
                   help="close (default): every output ends complete within --max-new-tokens; "
                   "cut: stop at the budget wherever the output is")
    g.add_argument("--temperature", type=float, metavar="T", help="0 = greedy")
    g.add_argument("--seed", type=int, metavar="S", help="request i uses seed S + i")
    g.add_argument("--threads", type=int, metavar="N",
                   help="CPU threads of the model: llama.cpp's for a .gguf model (default: the CPU "
                   "count, at most 8), torch's otherwise (default: generation.threads of --config)")
    g.add_argument("--batch-size", type=int, metavar="B", help="requests per micro-batch")
    g.add_argument("--start", metavar="RULE", help="start rule of the Lark grammar")
    g.add_argument("--no-speculative", action="store_true",
                   help="plain grammar-constrained decoding (the baseline)")
    g.add_argument("--strict", action=argparse.BooleanOptionalAction, default=None,
                   help="JSON objects get only their declared keys and prefixItems arrays no extra "
                   "items (default: on, or json_schema.strict of --config); --no-strict generates "
                   "every value the schema allows")
    g.add_argument("--tools", metavar="TOOLS.json", help="tools the model may call: a JSON list of "
                   "OpenAI function specs (or {\"tools\": [...]}); each result line gets tool_calls "
                   "(default: generation.tools of --config)")
    g.add_argument("--tool-choice", metavar="CHOICE", help="auto (default), required, none, or the "
                   "name of the tool to call")
    g.add_argument("--parallel-tool-calls", action=argparse.BooleanOptionalAction, default=None,
                   help="allow several calls in one output (default: on)")
    g.add_argument("--tool-format", metavar="NAME", help="hermes_json, hermes, json, llama3, mistral "
                   "(default: detected from the model's chat template and tokenizer)")
    g.add_argument("--reasoning", action=argparse.BooleanOptionalAction, default=None,
                   help="free text inside <think>...</think> first, then the constrained answer; "
                   "result lines get reasoning")
    g.add_argument("--thinking-budget", type=int, metavar="N",
                   help="tokens of reasoning after which </think> is forced")
    g.add_argument("--metrics-out", metavar="FILE", help="write the run metrics: .json or .prom "
                   "(Prometheus text format)")
    g.add_argument("--metrics-port", type=_port, metavar="PORT",
                   help="serve /metrics (Prometheus) and /metrics.json on 127.0.0.1:PORT while running "
                   "(0: a free port, printed on stderr)")

    m = sub.add_parser("models", help="list model and tokenizer aliases; fetch one; show where it is",
                       description="`structgen models` lists the aliases and whether they are cached "
                       "(or damaged); `models pull ALIAS...` fetches into the cache and rebuilds a damaged "
                       "entry; `models path ALIAS` prints the cached folder; `models verify [ALIAS...]` "
                       "hashes every cached file against its manifest. Exit: 0 ok, 1 fetch failed / not "
                       "cached / damaged, 2 unknown alias.")
    m.add_argument("action", nargs="?", choices=("list", "pull", "path", "verify"), help="default: list")
    m.add_argument("aliases", nargs="*", metavar="ALIAS")
    m.add_argument("--json", action="store_true", help="list: one JSON object per alias")
    m.add_argument("--force", action="store_true", help="pull: convert again even when cached and intact")

    b = sub.add_parser("bench", help="run the benchmark suite of a source checkout "
                       "(benchmarks/bench_suite.py; every further argument goes to it)")
    b.add_argument("rest", nargs=argparse.REMAINDER)

    k = sub.add_parser("config", help="print the documented default YAML configuration, or check a file",
                       description="Without options: print the documented default configuration. "
                       "--check FILE: load FILE (exit 2 with FILE:LINE on a bad key or value) and print "
                       "the effective settings.")
    k.add_argument("--example", action="store_true", help="print the documented defaults (the default)")
    k.add_argument("--check", metavar="FILE", help="validate a configuration file")

    _add_serve_parser(sub)
    return p


def _add_serve_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
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
    s.add_argument("--port", type=_port, default=8000, help="TCP port (default 8000)")
    s.add_argument("--api-key", metavar="KEY", help=f"require 'Authorization: Bearer KEY' on every route "
                   f"but /health (default: ${API_KEY_ENV}; unset: no key)")
    s.add_argument("--served-model-name", metavar="NAME", help="model id in /v1/models (default: --model)")
    s.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "auto"),
                   help="weights type of a transformers model (a GGUF keeps its own)")
    s.add_argument("--threads", type=_positive_int, metavar="N",
                   help="CPU threads of the model: llama.cpp's for a GGUF (default: the CPU count, at "
                   "most 8), torch's otherwise")
    s.add_argument("--ctx-size", type=_positive_int, metavar="N",
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
    s.add_argument("--max-running", type=_positive_int, default=16, metavar="N",
                   help="sequences in the running batch (default 16)")
    s.add_argument("--max-queued", type=_positive_int, default=256, metavar="N",
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
    s.add_argument("--max-body-bytes", type=_positive_int, default=4 << 20, metavar="N",
                   help="largest request body; beyond: 413 (default 4 MiB)")
    s.add_argument("--allowed-hosts", metavar="HOSTS",
                   help="comma-separated names the Host header may give (*.example.org: its subdomains; "
                   "*: any); beyond: 421. Guards against DNS rebinding (default: localhost, 127.0.0.1, ::1 "
                   "and --host; any when --host is 0.0.0.0 or ::)")
    s.add_argument("--max-connections", type=_positive_int, default=256, metavar="N",
                   help="connections served at once; a request on one more gets 503 (default 256)")
    s.add_argument("--keep-alive-timeout", type=_seconds, default=5.0, metavar="S",
                   help="seconds an idle connection stays open between requests (default 5)")
    s.add_argument("--header-timeout", type=_seconds, default=10.0, metavar="S",
                   help="seconds a client has to send a request line and headers; then the connection "
                   "is closed (default 10)")
    s.add_argument("--body-timeout", type=_seconds, default=30.0, metavar="S",
                   help="seconds a client has to send a request body; beyond: 408 (default 30)")
    s.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    program = argv is None  # this process is the `structgen` program: process-wide choices are ours
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # every further argument belongs to the benchmark suite
        return int(importlib.import_module(COMMANDS["bench"]).run(argv[1:]))
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help/--version (0) or a usage error (2)
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    args.process_wide = program  # may a subcommand make process-wide choices (validate's kernels)?
    try:
        return int(importlib.import_module(COMMANDS[args.command]).run(args))
    except _Usage as e:
        _err(f"structgen {args.command}", str(e), e.keep_lines)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `structgen validate ... | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_INVALID


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
