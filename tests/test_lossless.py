"""The contract: in float32, Goose's output is token-identical to the autoregressive greedy loop.

Real models, real prompts from ../shared/data, 128 new tokens each, every built-in topology (and the
spine topology's optimal split).
The autoregressive reference runs once per prompt and every topology is compared against it.
"""

from __future__ import annotations

import pytest

from goose.config import GooseConfig
from goose.decoder import AutoregressiveDecoder, GooseDecoder
from tests.conftest import dataset_prompts

TOPOLOGIES = ["spine", "chain", "isotropic", "transition_tree"]
# every topology with its defaults, and the spine with the optimal split of each budget
CONFIGS = {**{name: GooseConfig(topology=name) for name in TOPOLOGIES},
           "spine, optimal split": GooseConfig(spine_split="optimal")}
NEW_TOKENS = 128

SMOLLM2_PROMPTS = dataset_prompts("humaneval", 3) + dataset_prompts("gsm8k", 3) + dataset_prompts("mt_bench", 3)
GEMMA3_PROMPTS = dataset_prompts("humaneval", 2) + dataset_prompts("gsm8k", 1) + dataset_prompts("mt_bench", 1)


def first_difference(result, reference) -> str:
    pairs = zip(result.new_token_ids, reference.new_token_ids, strict=False)
    index = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
    return f"first differing token at {index}" if index is not None else "lengths differ"


def assert_all_topologies_lossless(model, tokenizer, prompt: str, chat: bool) -> None:
    reference = AutoregressiveDecoder(model, tokenizer, chat=chat).generate(prompt, NEW_TOKENS)
    assert reference.stats.new_tokens > 0
    for name, config in CONFIGS.items():
        decoder = GooseDecoder(model, tokenizer, config, chat=chat)
        result = decoder.generate(prompt, NEW_TOKENS)
        assert result.new_token_ids == reference.new_token_ids, f"{name}: {first_difference(result, reference)}"


@pytest.mark.slow
@pytest.mark.parametrize("prompt", SMOLLM2_PROMPTS, ids=[f"p{i}" for i in range(len(SMOLLM2_PROMPTS))])
def test_smollm2_float32_identical_to_autoregressive(smollm2, prompt: str) -> None:
    model, tokenizer = smollm2
    assert_all_topologies_lossless(model, tokenizer, prompt, chat=True)


@pytest.mark.slow
@pytest.mark.parametrize("prompt", GEMMA3_PROMPTS, ids=[f"p{i}" for i in range(len(GEMMA3_PROMPTS))])
def test_gemma3_float32_identical_to_autoregressive(gemma3, prompt: str) -> None:
    model, tokenizer = gemma3
    assert_all_topologies_lossless(model, tokenizer, prompt, chat=False)


@pytest.mark.slow
def test_gemma3_context_grows_past_the_sliding_window(gemma3) -> None:
    """A ~450-token prompt plus 128 new tokens crosses Gemma 3's 512-token sliding window mid-generation."""
    model, tokenizer = gemma3
    prompt = dataset_prompts("humaneval", 40)[32]  # a long HumanEval prompt
    while len(tokenizer.encode(prompt)) < 450:
        prompt = prompt + "\n" + prompt
    prompt = tokenizer.decode(tokenizer.encode(prompt, add_special_tokens=False)[:450])
    length = len(tokenizer.encode(prompt))
    assert length < 512 < length + NEW_TOKENS
    reference = AutoregressiveDecoder(model, tokenizer, chat=False).generate(prompt, NEW_TOKENS)
    result = GooseDecoder(model, tokenizer, GooseConfig(), chat=False).generate(prompt, NEW_TOKENS)
    assert len(result.prompt_ids) + len(result.new_token_ids) > 512
    assert result.new_token_ids == reference.new_token_ids
