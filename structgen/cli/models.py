"""``structgen models``: model, tokenizer and chat template aliases and the cache (list, pull, path,
verify)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from structgen.assets import pull, store
from structgen.cli._common import EXIT_INVALID, EXIT_OK, _err, _Usage
from structgen.errors import AssetError

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """List, pull, locate or verify model and tokenizer aliases (see the module docstring)."""
    action = args.action or "list"
    known = set(pull.TOKENIZERS) | set(pull.MODELS) | set(pull.CHAT_TEMPLATES)
    if action == "list":
        rows = pull.list_aliases()
        if args.json:
            for r in rows:
                # "cached": usable as it is; a damaged entry is not (its "state" says why)
                print(json.dumps({"alias": r.alias, "kind": r.kind,
                                  "cached": bool(r.cached) and r.extra.get("state") != "damaged",
                                  "state": r.extra.get("state"), "problems": r.extra.get("problems", []),
                                  "path": str(r.path), "download_mb": r.download_mb,
                                  "licence": r.licence, "distribution": r.distribution,
                                  "description": r.description,
                                  **{k: v for k, v in r.extra.items() if k not in ("state", "problems")}},
                                 default=str))
            return EXIT_OK
        print(f"cache: {pull.cache_dir()}")
        for r in rows:
            mark = " (default)" if r.extra.get("default") else ""
            state = {"ok": "cached", "damaged": "damaged"}.get(r.extra.get("state", ""), "not cached")
            licence = r.licence.split(" (")[0]
            print(f"{r.kind:13} {r.alias + mark:24} {state:10} {r.download_mb:8.1f} MB  {licence:26} "
                  f"{r.path if r.cached else '-'}")
            for problem in r.extra.get("problems", []):
                print(f"{'':13} {'':24} damaged: {problem}  (`structgen models pull {r.alias}` rebuilds it)")
        return EXIT_OK
    if action == "verify":
        return _models_verify(args.aliases, known)
    aliases = args.aliases
    if not aliases:
        raise _Usage(f"models {action}: give an alias (see `structgen models`)")
    for a in aliases:
        if a not in known:
            raise _Usage(f"unknown alias {a!r}; known aliases: {', '.join(sorted(known))}")
    status = EXIT_OK
    for a in aliases:
        try:
            if action == "pull":
                t0 = time.perf_counter()
                path = pull.pull(a, force=args.force)
                print(f"{a}: {path} ({time.perf_counter() - t0:.1f} s)")
            else:
                fn = (store.tokenizer_path if a in pull.TOKENIZERS else
                      store.chat_template_path if a in pull.CHAT_TEMPLATES else store.model_path)
                print(fn(a))
        except AssetError as e:
            _err(f"structgen models {action}", str(e))
            status = EXIT_INVALID
    return status


def _models_verify(aliases: list[str], known: set[str]) -> int:
    """``models verify [ALIAS...]``: hash every file of each entry (all cached entries by
    default) against its manifest; one line per entry, exit 1 when any is damaged or missing."""
    for a in aliases:
        if a not in known:
            raise _Usage(f"unknown alias {a!r}; known aliases: {', '.join(sorted(known))}")
    if not aliases:
        aliases = pull.cached_aliases()
        if not aliases:
            print(f"structgen models verify: nothing cached in {pull.cache_dir()}", file=sys.stderr)
            return EXIT_OK
    status = EXIT_OK
    for a in aliases:
        problems = pull.verify(a)
        if problems is None:
            print(f"{a}: not cached")
            status = EXIT_INVALID
        elif problems:
            for problem in problems:
                print(f"{a}: damaged: {problem}")
            status = EXIT_INVALID
        else:
            print(f"{a}: ok")
    if status != EXIT_OK:
        print("structgen models verify: `structgen models pull ALIAS` rebuilds a damaged entry",
              file=sys.stderr)
    return status
