"""The contract: in float32, Goose's output is token-identical to the autoregressive greedy loop.

Real models, real prompts (the benchmark prompts goose ships), 48 new tokens each on SmolLM2 and 64 on Gemma 3 (some
15-25 verify passes a run), every built-in topology (and the spine with the paper's spine-ratio tiers); the fast
suite runs every configuration on the tiny random-weight models instead.
The autoregressive reference runs once per prompt and test run (the ``ar_reference`` fixture; other
test files reuse it). The default
topology is compared against it on every prompt, and the other four configurations two at a time, in
turn, so each of them meets several prompts of every model without every prompt paying for all five.
"""

from __future__ import annotations

import pytest

from goose.config import GooseConfig
from goose.cycle.decoder import GooseDecoder
from tests.helpers import (
    CPU_CURVE,
    GEMMA3_TOKENS,
    PROMPT_BEFORE_WINDOW,
    SMOLLM2_TOKENS,
    WINDOW_TOKENS,
    assert_lossless,
    dataset_prompts,
    lossless_prompts,
)

TOPOLOGIES = ["spine", "chain", "isotropic", "transition_tree"]
# every topology with its defaults (the spine splits each budget optimally), and the spine with the paper's tiers
CONFIGS = {**{name: GooseConfig(topology=name) for name in TOPOLOGIES},
           "spine, tiers": GooseConfig(topology_options={"spine": {"split": "tiers"}})}
OTHERS = [name for name in CONFIGS if name != "spine"]
# two prompts of each dataset (the suite's others serve test_batch and test_int8)
SMOLLM2_PROMPTS = [lossless_prompts("smollm2")[i] for i in (0, 1, 3, 4, 6, 7)]
GEMMA3_PROMPTS = lossless_prompts("gemma3")


def configs_for(index: int) -> list[str]:
    """The spine (the default) and two of the other four configurations, the pair turning with ``index``: over
    6 SmolLM2 prompts each of the four runs 3 times, over 3 Gemma 3 prompts once or twice."""
    return ["spine", OTHERS[(2 * index) % len(OTHERS)], OTHERS[(2 * index + 1) % len(OTHERS)]]


def assert_topologies_lossless(ar_reference, model, tokenizer, prompt: str, chat: bool, names: list[str],
                               tokens: int) -> None:
    """Every configuration in ``names`` gives the autoregressive output, drafting; at least one had a draft accepted."""
    reference = ar_reference(model, tokenizer, prompt, tokens, chat=chat)
    assert reference.new_token_ids
    accepted = 0
    for name in names:
        # budgeted on a fixed CPU-like curve: whether drafts are laid must not hang on this machine's load
        decoder = GooseDecoder(model, tokenizer, CONFIGS[name], chat=chat, cost_curve=CPU_CURVE, pinned_costs=True)
        result = decoder.generate(prompt, tokens)
        accepted += assert_lossless(result, reference, accepted=False, label=name)[1]
    assert accepted > 0, "no configuration had a draft token accepted"


@pytest.mark.parametrize("index", range(3), ids=[f"p{i}" for i in range(3)])
def test_tiny_model_every_topology_identical_to_autoregressive(tiny, ar_reference, index: int) -> None:
    """The fast suite's lossless check: every configuration on the tiny random-weight model, whose loops the
    sources draft (a HumanEval, a GSM8K and an MT-Bench prompt)."""
    model, tokenizer = tiny
    assert_topologies_lossless(ar_reference, model, tokenizer, SMOLLM2_PROMPTS[2 * index], chat=True,
                               names=list(CONFIGS), tokens=SMOLLM2_TOKENS)


def test_tiny_gemma3_context_grows_past_the_sliding_window(tiny_gemma3, ar_reference) -> None:
    """A 24-token prompt plus 48 new tokens crosses the tiny Gemma 3's 32-token window mid-generation."""
    model, tokenizer = tiny_gemma3
    prompt = tokenizer.decode(tokenizer.encode(SMOLLM2_PROMPTS[0], add_special_tokens=False)[:24])
    reference = ar_reference(model, tokenizer, prompt, WINDOW_TOKENS, chat=False)
    decoder = GooseDecoder(model, tokenizer, GooseConfig(), chat=False, cost_curve=CPU_CURVE, pinned_costs=True)
    result = decoder.generate(prompt, WINDOW_TOKENS)
    assert len(result.prompt_ids) < 32 < len(result.prompt_ids) + len(result.new_token_ids) - 8
    assert_lossless(result, reference)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(SMOLLM2_PROMPTS)), ids=[f"p{i}" for i in range(len(SMOLLM2_PROMPTS))])
def test_smollm2_float32_identical_to_autoregressive(smollm2, ar_reference, index: int) -> None:
    model, tokenizer = smollm2
    assert_topologies_lossless(ar_reference, model, tokenizer, SMOLLM2_PROMPTS[index], chat=True,
                               names=configs_for(index), tokens=SMOLLM2_TOKENS)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(GEMMA3_PROMPTS)), ids=[f"p{i}" for i in range(len(GEMMA3_PROMPTS))])
def test_gemma3_float32_identical_to_autoregressive(gemma3, ar_reference, index: int) -> None:
    model, tokenizer = gemma3
    assert_topologies_lossless(ar_reference, model, tokenizer, GEMMA3_PROMPTS[index], chat=False,
                               names=configs_for(index), tokens=GEMMA3_TOKENS)


@pytest.mark.slow
def test_gemma3_context_grows_past_the_sliding_window(gemma3, ar_reference) -> None:
    """A 488-token prompt plus 48 new tokens crosses Gemma 3's 512-token sliding window mid-generation
    (a long prompt and few new tokens: the prefill is one pass, each new token is not)."""
    model, tokenizer = gemma3
    prompt = dataset_prompts("humaneval", 40)[32]  # a long HumanEval prompt
    while len(tokenizer.encode(prompt)) < PROMPT_BEFORE_WINDOW:
        prompt = prompt + "\n" + prompt
    prompt = tokenizer.decode(tokenizer.encode(prompt, add_special_tokens=False)[:PROMPT_BEFORE_WINDOW])
    length = len(tokenizer.encode(prompt))
    assert length + WINDOW_TOKENS // 4 < 512 < length + WINDOW_TOKENS - WINDOW_TOKENS // 4
    reference = ar_reference(model, tokenizer, prompt, WINDOW_TOKENS, chat=False)
    decoder = GooseDecoder(model, tokenizer, GooseConfig(), chat=False, cost_curve=CPU_CURVE, pinned_costs=True)
    result = decoder.generate(prompt, WINDOW_TOKENS)
    assert len(result.prompt_ids) + len(result.new_token_ids) > 512 + WINDOW_TOKENS // 4
    assert_lossless(result, reference)  # past the window too, drafts were accepted
