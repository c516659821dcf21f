"""The one-pass readout equals argmax and topk (real logits of both models, crafted ties), read in one transfer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from goose.cycle.readout import BLOCK, greedy, greedy_and_top_k, read
from tests.helpers import dataset_prompts


def check_against_reference(logits: torch.Tensor, k: int) -> None:
    argmax, indices, values = greedy_and_top_k(logits, k)
    reference = logits.topk(min(k, logits.shape[-1]), dim=-1)
    assert torch.equal(argmax, logits.argmax(dim=-1))
    assert torch.equal(greedy(logits), logits.argmax(dim=-1))
    assert torch.equal(values, reference.values)  # the same k values, in order
    assert torch.equal(logits.gather(1, indices), values)  # each index holds its value
    assert all(len(set(row)) == len(row) for row in indices.tolist())  # no index twice


@pytest.mark.parametrize("fixture", ["smollm2", "gemma3"])
def test_readout_of_real_logits(request, fixture):
    """The last 24 rows of a real forward, read in float32 and in bfloat16."""
    model, tokenizer = request.getfixturevalue(fixture)
    ids = tokenizer(dataset_prompts("humaneval", 1)[0])["input_ids"][:64]
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids], device=model.device)).logits[0, -24:]
    for dtype in (torch.float32, torch.bfloat16):
        check_against_reference(logits.to(dtype), 10)


def test_ties_take_the_first_occurrence():
    vocab = 64 * BLOCK
    logits = torch.zeros(4, vocab, dtype=torch.bfloat16)
    logits[0, [7, 5 * BLOCK, vocab - 1]] = 3.0  # tie across blocks: the first wins
    logits[1, [BLOCK + 3, BLOCK + 9]] = 2.0  # tie inside one block
    logits[2, vocab - 1] = 1.0  # the very last id
    # row 3: all equal, the argmax is id 0
    argmax, _, values = greedy_and_top_k(logits, 10)
    assert argmax.tolist() == [7, BLOCK + 3, vocab - 1, 0] == logits.argmax(dim=-1).tolist()
    assert values[0, :3].tolist() == [3.0, 3.0, 3.0]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(0, 5),
    vocab=st.sampled_from([7, 40 * BLOCK, 40 * BLOCK + 1, 64 * BLOCK - 3, 100_003]),
    k=st.integers(1, 12),
    seed=st.integers(0, 2**16),
    bf16=st.booleans(),
)
def test_random_logits_any_vocabulary(rows, vocab, k, seed, bf16):
    """Vocabularies with and without a short last block; bfloat16 makes ties common."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator)
    check_against_reference(logits.bfloat16() if bf16 else logits, k)


@settings(max_examples=30, deadline=None)
@given(
    tree_rows=st.integers(1, 6),
    extra_rows=st.integers(0, 4),
    vocab=st.sampled_from([7, 40 * BLOCK + 1, 262_144]),
    k=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
def test_one_read_carries_argmax_and_top_k_to_the_host(tree_rows, extra_rows, vocab, k, seed):
    """``read``'s host arrays equal the device results: ids exact, scores the softmax of the kept logits."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(tree_rows + extra_rows, vocab, generator=generator)
    readout = read(logits, tree_rows, k)
    assert readout.predictions.tolist() == logits.argmax(dim=-1).tolist()
    _, indices, values = greedy_and_top_k(logits[:tree_rows], k)
    assert readout.top_tokens.tolist() == indices.tolist()
    assert np.allclose(readout.top_scores, torch.softmax(values, dim=-1).numpy(), atol=1e-6)
    assert readout.top_tokens.dtype == np.int64 and readout.top_scores.dtype == np.float32
