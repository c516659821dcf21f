"""The prefill harvest: none with the automatic budget (the first token waits for no row), lossless at any size."""

from __future__ import annotations

import numpy as np
import pytest

from goose.config import GooseConfig
from goose.cycle.decoder import GooseDecoder
from goose.planning.cost import harvest_rows
from tests.helpers import dataset_prompts


def test_harvest_rows_follow_the_setting():
    assert harvest_rows(None, 300) == 299  # all: every prompt position before the last
    assert harvest_rows(40, 300) == 40
    assert harvest_rows(400, 300) == 299  # never past the prompt
    assert harvest_rows(0, 300) == 0
    assert harvest_rows("auto", 4096) == 0  # the automatic budget: the first token waits for no harvested row
    assert harvest_rows("auto", 4096, priced=False) == 4095  # a fixed budget: every row, as the paper
    with pytest.raises(ValueError, match="prefill_harvest"):
        GooseConfig(prefill_harvest=-1)


@pytest.mark.parametrize("harvest", [0, "auto", None])
def test_any_harvest_is_lossless(tiny, ar_reference, harvest):
    """How many prompt rows feed the bigram table changes the trees, never the output."""
    model, tokenizer = tiny
    prompt = dataset_prompts("humaneval", 1)[0]
    reference = ar_reference(model, tokenizer, prompt, 32)
    decoder = GooseDecoder(model, tokenizer, GooseConfig(prefill_harvest=harvest))
    result = decoder.generate(prompt, 32)
    assert result.new_token_ids == reference.new_token_ids


def test_first_token_streams_before_the_sources_read_the_prompt(tiny):
    """Time to first token is the prefill's alone: the harvest and the sources' prefill wait for the next step."""
    model, tokenizer = tiny
    decoder = GooseDecoder(model, tokenizer, GooseConfig())
    read = []
    original = decoder.sources.prefill
    decoder.sources.prefill = lambda *args: (read.append(True), original(*args))  # records the call, runs it
    chunks = decoder.stream(dataset_prompts("humaneval", 1)[0], 16)
    first = next(chunks)
    assert len(first.token_ids) == 1 and read == []
    second = next(chunks)
    assert read == [True] and second.token_ids
    chunks.close()


def test_the_automatic_budget_harvests_no_prompt_row(tiny):
    """With the automatic budget the prefill computes the last row's logits alone, as plain decoding's does: the
    bigram table learns nothing from the prompt before the first cycle."""
    model, tokenizer = tiny
    decoder = GooseDecoder(model, tokenizer, GooseConfig())
    prompt = dataset_prompts("mbpp", 1)[0]
    ids = decoder.encode(prompt)
    decoder.generate(prompt, 1)
    table = decoder.sources.instances["bigram_transition"].table  # made when the first harvest comes
    assert table is None or not (table.unigram_tokens[np.asarray(ids[:-1])] >= 0).any()


def test_a_fixed_budget_harvests_every_prompt_row(tiny):
    """With a fixed budget (the paper's setting, nothing priced) the automatic harvest is every prompt row but the
    last: the bigram table knows every prompt token's successors, as the paper's code does."""
    model, tokenizer = tiny
    decoder = GooseDecoder(model, tokenizer, GooseConfig(budget=60))
    prompt = "\n".join(dataset_prompts("humaneval", 3))  # longer than the automatic harvest's floor
    ids = decoder.encode(prompt)
    assert harvest_rows("auto", len(ids)) == 0  # priced: none
    decoder.generate(prompt, 2)
    table = decoder.sources.instances["bigram_transition"].table
    assert (table.unigram_tokens[np.asarray(ids[:-1])] >= 0).any(axis=1).all()
