"""What goose-bench's tests share, built through Goose's public API alone, as goose-bench itself is (its fixtures
live in conftest.py). Nothing here comes from Goose's own test package: goose-bench's tests stand on their own."""

from __future__ import annotations

import os
from typing import Any

import torch

from goose import models
from goose.planning.cost import CostCurve
from goose_bench.prompts import PACKAGED_DATA, load_samples

# GOOSE_TEST_DEVICE=cuda runs the model tests on a GPU, as Goose's own tests do
DEVICE = os.environ.get("GOOSE_TEST_DEVICE", "cpu")

# A 2-core CPU's verify cost curve (width costs), pinned so that the automatic budget lays the same trees on every
# machine and at any load: small trees, long chains once a source is trusted.
CPU_CURVE = CostCurve((1, 2, 4, 8, 16, 32, 64, 128), (0.020, 0.022, 0.026, 0.034, 0.050, 0.080, 0.140, 0.260))

# The tiny random-weight models: two layers of SmolLM2's shape, scaled down (grouped-query attention, tied
# embeddings), weights drawn at 0.1 (not transformers' 0.02) so that the output depends on the context yet loops,
# and the sources' drafts are sometimes accepted, sometimes not. Gemma 3's first layer slides a 32-token window.
TINY_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 2048, "tie_word_embeddings": True,
              "initializer_range": 0.1}
TINY_KINDS = {"llama": ("llama", {}),
              "gemma3": ("gemma3_text", {"sliding_window": 32, "query_pre_attn_scalar": 16,
                                         "layer_types": ["sliding_attention", "full_attention"]})}


def tiny_model(kind: str = "llama") -> tuple[Any, Any]:
    """A 2-layer random-weight causal LM (``kind``: llama or gemma3) in float32 with the embedded SmolLM2's tokenizer
    and vocabulary, built here from seed 0: nothing is downloaded. (model, tokenizer)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    model_type, layout = TINY_KINDS[kind]
    tokenizer = AutoTokenizer.from_pretrained(models.pretrained_location(models.DEFAULT_MODEL))
    special = {f"{token}_token_id": getattr(tokenizer, f"{token}_token_id") for token in ("bos", "eos", "pad")}
    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), **TINY_SHAPE, **special, **layout)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    model.config._name_or_path = f"tiny-random-{kind}-0"  # its name keys the cost-curve cache and the target's memo
    return model.eval().requires_grad_(False), tokenizer


def first_turns(dataset: str, limit: int) -> list[str]:
    """The first turns of a shipped benchmark's first ``limit`` prompts, as text."""
    return [sample.turns[0] for sample in load_samples(dataset, PACKAGED_DATA, limit)]
