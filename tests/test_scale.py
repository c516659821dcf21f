"""Goose at the size people run: Qwen2.5-Coder-1.5B-Instruct through every way in, float32, token for token.

One worker holds the model (7 GB in float32, dequantized once into the cache by ``make models``' packages);
short outputs keep the suite's time: a pass of this model costs what some twenty of SmolLM2's do.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx
import pytest
import torch

import goose
from goose import AutoregressiveDecoder, GooseDecoder
from tests.helpers import (
    CPU_CURVE,
    assert_lossless,
    assert_served_lossless,
    dataset_prompts,
    free_port,
    start_server,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("qwen")]

TOKENS = 32
PROMPTS = dataset_prompts("humaneval", 1) + dataset_prompts("mbpp", 1)
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "tests": {"type": "integer"}},
          "required": ["name", "tests"], "additionalProperties": False}


@pytest.mark.parametrize("index", range(len(PROMPTS)), ids=["humaneval", "mbpp"])
def test_greedy_goose_equals_autoregressive(qwen15b, ar_reference, index: int) -> None:
    """The automatic budget on each prompt, and one other setting a prompt: the paper's fixed 60 nodes where every
    row of a tree is nearly free, then the multi_spine shape (the chain is the tiny and SmolLM2 suites')."""
    model, tokenizer = qwen15b
    reference = ar_reference(model, tokenizer, PROMPTS[index], TOKENS)
    for options in ({}, ({"budget": 60}, {"topology": "multi_spine"})[index]):
        result = GooseDecoder(model, tokenizer, **options).generate(PROMPTS[index], TOKENS)
        assert_lossless(result, reference, label=options)
        assert result.stats.verify_steps < len(reference.new_token_ids)  # drafting paid: fewer passes than tokens


def test_seeded_sampling_equals_the_seeded_sampler(qwen15b, ar_reference) -> None:
    model, tokenizer = qwen15b
    sampling = {"temperature": 0.7, "top_p": 0.9, "seed": 11}
    goose_decoder = GooseDecoder(model, tokenizer, cost_curve=CPU_CURVE, pinned_costs=True)  # a tree every cycle
    kept = 0
    for index, prompt in enumerate(PROMPTS):  # the mbpp prompt alone kept 1 of its 4 tested draft tokens (measured)
        reference = ar_reference(model, tokenizer, prompt, 24, **sampling)
        result = goose_decoder.generate(prompt, 24, **sampling)
        kept += assert_lossless(result, reference, accepted=False, label=f"prompt {index}")[1]  # drafted, tested
    assert kept > 0, "no draft token accepted in either sampled run"


def test_batch_rows_equal_their_own_runs(qwen15b, ar_reference) -> None:
    model, tokenizer = qwen15b
    results = GooseDecoder(model, tokenizer).generate_batch(PROMPTS, 24)
    assert_lossless(results, [ar_reference(model, tokenizer, prompt, 24) for prompt in PROMPTS])


def test_hugging_face_generate_door(qwen15b, ar_reference) -> None:
    model, tokenizer = qwen15b
    reference = ar_reference(model, tokenizer, PROMPTS[0], 24)
    ids = torch.tensor([reference.prompt_ids])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                         custom_generate=goose.hf.generate)
    assert out[0, len(reference.prompt_ids) :].tolist() == reference.new_token_ids
    assert_lossless(goose.hf.last_result(model), reference)  # the Goose run behind it: drafted, tested, no fault


def test_json_schema_output_equals_constrained_autoregressive(qwen15b) -> None:
    model, tokenizer = qwen15b
    prompt = "Describe the function add(a, b) as JSON with its name and how many tests it needs."
    reference = AutoregressiveDecoder(model, tokenizer).generate(prompt, 40, json_schema=SCHEMA)
    result = GooseDecoder(model, tokenizer, cost_curve=CPU_CURVE, pinned_costs=True).generate(prompt, 40,
                                                                                            json_schema=SCHEMA)
    assert_lossless(result, reference, accepted=False)
    document = json.loads(result.text)
    assert set(document) == {"name", "tests"} and isinstance(document["tests"], int)


def test_the_output_as_prediction_is_verified_in_long_runs(qwen15b, ar_reference) -> None:
    model, tokenizer = qwen15b
    reference = ar_reference(model, tokenizer, PROMPTS[0], TOKENS)
    result = GooseDecoder(model, tokenizer).generate(PROMPTS[0], TOKENS, prediction=reference.new_token_ids)
    assert_lossless(result, reference)
    assert result.stats.verify_steps <= 4  # the whole prediction rides in a handful of passes


def test_goose_serve_answers_as_the_decoder_does(qwen15b, ar_reference, tmp_path: Path) -> None:
    """``goose serve`` with the 1.5B model in float32: a chat request's text is the greedy decoding's."""
    model, tokenizer = qwen15b
    reference = ar_reference(model, tokenizer, PROMPTS[1], 24)
    port = free_port()
    command = [sys.executable, "-m", "goose", "serve", "--model", "qwen2.5-coder-1.5b", "--dtype", "float32",
               "--device", "cpu", "--threads", os.environ.get("GOOSE_TEST_THREADS", "1"), "--port", str(port)]
    server = start_server(command, port, tmp_path / "serve.log")
    try:
        response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=600, json={
            "model": "qwen2.5-coder-1.5b", "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": PROMPTS[1]}]})
        assert response.status_code == 200, response.text
        assert_served_lossless(response.json(), response.json()["choices"][0]["message"]["content"], reference)
    finally:
        server.stop()
