"""The package's shape: public names pinned, no oversized module, every module named in the
layout doc, and a grammar core that works without torch, transformers or pydantic.

The import layering itself (stages import only downward, no library module imports
``structgen.cli``) is checked by import-linter, which ``scripts/test.sh`` runs; its
contracts are in pyproject.toml.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import structgen

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "structgen"
MAX_MODULE_LINES = 800

# Every public name of `structgen`: removing or renaming one breaks users, so it is a deliberate change.
PUBLIC_NAMES = [
    "AssetError", "CompileLimitError", "CompileOptions", "CompileTimeoutError", "CompiledGrammar",
    "ConfigError", "ContextLengthError", "GenerationResult", "GrammarError", "GrammarSyntaxError",
    "JsonSchemaOptions", "Matcher", "MatcherUsageError", "ModelValidationError", "PartialJsonReader",
    "RegexError", "RequestCancelledError", "SchemaError",
    "SpecConfig",
    "StreamEvent", "StructgenBackend", "StructgenError", "StructgenLogitsProcessor", "TokenBudgetError",
    "UnsupportedFeatureError",
    "Vocabulary", "VocabularyError", "__version__", "allocate_bitmask", "compile_grammar",
    "compile_json_schema", "compile_lark", "compile_regex", "fill_bitmasks", "generate",
    "generate_model", "stream", "stream_model",
]


def test_public_names_are_pinned():
    assert sorted(structgen.__all__) == sorted(PUBLIC_NAMES)
    for name in PUBLIC_NAMES:
        assert getattr(structgen, name) is not None, name


def test_no_module_over_a_thousand_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
             for p in PACKAGE.rglob("*.py")}
    oversized = {path: n for path, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not oversized, f"modules over {MAX_MODULE_LINES} lines: {oversized}"


def test_layout_doc_names_every_module():
    """docs/design/layout.md is the map a newcomer reads: a top-level module appears in its tree,
    a subpackage's module (in backticks) in that package's row of the table."""
    doc = (ROOT / "docs" / "design" / "layout.md").read_text(encoding="utf-8")
    tree = doc.split("```")[1]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)/` \|(.*)$", doc, re.M)}
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path.name in ("__init__.py", "__main__.py") or rel.parts[0] == "grammars":
            continue
        if len(rel.parts) == 1:
            named = re.search(rf"\b{re.escape(path.stem)}\b", tree) is not None
        else:
            named = f"`{path.stem}`" in rows.get(rel.parts[0], "")
        if not named:
            missing.append(str(rel))
    assert not missing, f"modules missing from docs/design/layout.md: {missing}"


def test_cli_holds_only_command_modules():
    """structgen/cli/ is the command line and nothing else: one public module per subcommand (plus
    private helpers of the commands); library features have homes in the library's own layers,
    and there is no catch-all ``tools`` package."""
    from structgen.cli import _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    modules = {p.stem for p in (PACKAGE / "cli").glob("*.py") if not p.stem.startswith("_")}
    assert modules == set(sub.choices)
    assert not list((PACKAGE / "tools").rglob("*.py"))  # (a stale __pycache__ may linger)


# Compile a JSON schema, a regex and a Lark grammar, then step matchers and fill masks over a
# byte-level vocabulary: the whole grammar core and mask layer, in a fresh interpreter.
_CORE_ONLY = r"""
import json, sys
import numpy as np
from structgen import Matcher, Vocabulary, compile_json_schema, compile_lark, compile_regex

tokens = [bytes([b]) for b in range(256)] + [b'{"', b'":', b'true', b'"a"', b'</s>']
vocab = Vocabulary(tokens, eos_token_ids=(len(tokens) - 1,))
grammars = [
    compile_json_schema({"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}),
    compile_regex(r"[0-9]{2,4}"),
    compile_lark('start: "x" start | "y"'),
]
texts = [b'{"a":true}', b"2024", b"xxy"]
for grammar, text in zip(grammars, texts):
    matcher = Matcher(grammar, vocab)
    mask = np.zeros((1, (vocab.vocab_size + 31) // 32), dtype=np.int32)
    for byte in text:
        matcher.fill_bitmask(mask, 0)
        assert (mask[0, byte // 32] >> (byte % 32)) & 1, (text, byte)
        assert matcher.accept_token(byte)
    assert matcher.is_accepting()
print(json.dumps(sorted(m for m in ("torch", "transformers", "pydantic") if m in sys.modules)))
"""


def test_grammar_core_needs_no_torch_transformers_or_pydantic(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _CORE_ONLY], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
