"""The prefill harvest: bounded by the output layer's price, lossless at any size, the first token out first."""

from __future__ import annotations

import numpy as np
import pytest

from goose.config import GooseConfig
from goose.cycle.decoder import GooseDecoder
from goose.planning.cost import HARVEST_CAP, HARVEST_FLOOR, HARVEST_SHARE, harvest_rows, output_layer_weight
from tests.helpers import dataset_prompts


def test_harvest_rows_follow_the_setting():
    assert harvest_rows(None, 300, 0.27) == 299  # all: every prompt position before the last
    assert harvest_rows(40, 300, 0.27) == 40
    assert harvest_rows(400, 300, 0.27) == 299  # never past the prompt
    assert harvest_rows(0, 300, 0.27) == 0
    assert harvest_rows("auto", 4096, 0.5) == int(HARVEST_SHARE * 4096 / 0.5)  # 3% of the prompt's forward
    assert harvest_rows("auto", 300, 0.27) == int(HARVEST_FLOOR / 0.27)  # a short prompt: the floor's worth
    assert harvest_rows("auto", 64, 0.27) == 63  # a prompt shorter than that: every row
    assert harvest_rows("auto", 100_000, 0.25) == HARVEST_CAP
    assert harvest_rows("auto", 1024, 1.7) < harvest_rows("auto", 1024, 0.25)  # a wider vocabulary harvests less
    assert harvest_rows("auto", 1, 0.25) == 0
    assert harvest_rows("auto", 4096, 0.5, priced=False) == 4095  # a fixed budget: every row, as the paper
    with pytest.raises(ValueError, match="prefill_harvest"):
        GooseConfig(prefill_harvest=-1)


def test_output_layer_weight_counts_a_tied_table_once(smollm2):
    model, _ = smollm2
    head = model.get_output_embeddings().weight
    assert head.data_ptr() == model.get_input_embeddings().weight.data_ptr()  # SmolLM2 ties them
    body = sum(p.numel() for p in model.parameters()) - head.numel()
    assert output_layer_weight(model) == pytest.approx(head.numel() / body)
    assert 0.2 < output_layer_weight(model) < 0.35  # a 49k x 576 table against a ~106M-parameter body


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


def test_a_short_prompt_harvests_every_row(smollm2):
    """The automatic harvest's floor: every row of a short prompt but the last feeds the bigram table, so a
    prompt token the output repeats has successors from the first cycle."""
    model, tokenizer = smollm2
    decoder = GooseDecoder(model, tokenizer, GooseConfig())
    prompt = dataset_prompts("mbpp", 1)[0]
    ids = decoder.encode(prompt)
    assert harvest_rows("auto", len(ids), output_layer_weight(model)) == len(ids) - 1
    decoder.generate(prompt, 2)
    table = decoder.sources.instances["bigram_transition"].table
    assert (table.unigram_tokens[np.asarray(ids[:-1])] >= 0).any(axis=1).all()


def test_a_fixed_budget_harvests_every_prompt_row(tiny):
    """With a fixed budget (the paper's setting, nothing priced) the automatic harvest is every prompt row but the
    last: the bigram table knows every prompt token's successors, as the paper's code does."""
    model, tokenizer = tiny
    decoder = GooseDecoder(model, tokenizer, GooseConfig(budget=60))
    prompt = "\n".join(dataset_prompts("humaneval", 3))  # longer than the automatic harvest's floor
    ids = decoder.encode(prompt)
    assert harvest_rows("auto", len(ids), output_layer_weight(model)) < len(ids) - 1  # priced: a share
    decoder.generate(prompt, 2)
    table = decoder.sources.instances["bigram_transition"].table
    assert (table.unigram_tokens[np.asarray(ids[:-1])] >= 0).any(axis=1).all()
