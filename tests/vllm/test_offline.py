"""Offline vLLM with GooseProposer: float32 greedy output equals vLLM without speculation, alone and batched."""

from __future__ import annotations

import pytest

from tests.vllm.conftest import MAX_NUM_SEQS, generate, goose_speculation, spec_counters, start_llm, stop


@pytest.fixture(scope="module")
def goose_llm(model_path: str, reference: list[list[int]]):
    llm = start_llm(model_path, goose_speculation())
    yield llm
    stop(llm)


def test_one_request_at_a_time_equals_no_speculation(goose_llm, prompts, reference):
    before = spec_counters(goose_llm)
    outputs = [generate(goose_llm, [ids])[0] for ids in prompts]
    after = spec_counters(goose_llm)
    for index, (output, expected) in enumerate(zip(outputs, reference, strict=True)):
        assert output == expected, f"prompt {index}: GooseProposer output differs from vLLM without speculation"
    # the proposer really drafted and vLLM really accepted some of it (otherwise the equality is trivial)
    assert after["drafts"] > before.get("drafts", 0)
    assert after["accepted_tokens"] > before.get("accepted_tokens", 0)


def test_continuous_batching_equals_no_speculation(goose_llm, prompts, reference):
    assert len(prompts) > MAX_NUM_SEQS  # four decode together; the rest join as rows free up (rows move)
    before = spec_counters(goose_llm)
    outputs = generate(goose_llm, prompts)
    after = spec_counters(goose_llm)
    for index, (output, expected) in enumerate(zip(outputs, reference, strict=True)):
        assert output == expected, f"prompt {index}: batched GooseProposer output differs from no speculation"
    assert after["accepted_tokens"] > before.get("accepted_tokens", 0)
