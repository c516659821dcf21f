"""The contract: in float32, Goose's output is token-identical to the autoregressive greedy loop.

Real models, real prompts from ../shared/data, 128 new tokens each, every built-in topology (and the
spine topology's optimal split).
The autoregressive reference runs once per prompt. The default topology is compared against it on
every prompt, and the other four configurations two at a time, in turn, so each of them meets
several prompts of every model without every prompt paying for all five.
"""

from __future__ import annotations

import pytest

from goose.config import GooseConfig
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
from tests.conftest import dataset_prompts

TOPOLOGIES = ["spine", "chain", "isotropic", "transition_tree"]
# every topology with its defaults, and the spine with the optimal split of each budget
CONFIGS = {**{name: GooseConfig(topology=name) for name in TOPOLOGIES},
           "spine, optimal split": GooseConfig(spine_split="optimal")}
OTHERS = [name for name in CONFIGS if name != "spine"]
NEW_TOKENS = 128

SMOLLM2_PROMPTS = dataset_prompts("humaneval", 3) + dataset_prompts("gsm8k", 3) + dataset_prompts("mt_bench", 3)
GEMMA3_PROMPTS = dataset_prompts("humaneval", 2) + dataset_prompts("gsm8k", 1) + dataset_prompts("mt_bench", 1)


def first_difference(result, reference) -> str:
    pairs = zip(result.new_token_ids, reference.new_token_ids, strict=False)
    index = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
    return f"first differing token at {index}" if index is not None else "lengths differ"


def configs_for(index: int) -> list[str]:
    """The spine (the default) and two of the other four configurations, the pair turning with ``index``."""
    return ["spine", OTHERS[(2 * index) % len(OTHERS)], OTHERS[(2 * index + 1) % len(OTHERS)]]


def test_every_configuration_meets_several_prompts_of_each_model() -> None:
    for prompts in (SMOLLM2_PROMPTS, GEMMA3_PROMPTS):
        met = [name for index in range(len(prompts)) for name in configs_for(index)]
        assert all(met.count(name) >= 2 for name in CONFIGS), met


def assert_topologies_lossless(model, tokenizer, prompt: str, chat: bool, index: int) -> None:
    reference = AutoregressiveDecoder(model, tokenizer, chat=chat).generate(prompt, NEW_TOKENS)
    assert reference.stats.new_tokens > 0
    for name in configs_for(index):
        decoder = GooseDecoder(model, tokenizer, CONFIGS[name], chat=chat)
        result = decoder.generate(prompt, NEW_TOKENS)
        assert result.new_token_ids == reference.new_token_ids, f"{name}: {first_difference(result, reference)}"


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(SMOLLM2_PROMPTS)), ids=[f"p{i}" for i in range(len(SMOLLM2_PROMPTS))])
def test_smollm2_float32_identical_to_autoregressive(smollm2, index: int) -> None:
    model, tokenizer = smollm2
    assert_topologies_lossless(model, tokenizer, SMOLLM2_PROMPTS[index], chat=True, index=index)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(GEMMA3_PROMPTS)), ids=[f"p{i}" for i in range(len(GEMMA3_PROMPTS))])
def test_gemma3_float32_identical_to_autoregressive(gemma3, index: int) -> None:
    model, tokenizer = gemma3
    assert_topologies_lossless(model, tokenizer, GEMMA3_PROMPTS[index], chat=False, index=index)


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
