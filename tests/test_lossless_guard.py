"""The lossless assertion sees a dead source, in every lossless test family.

A source that raises is skipped by the plugin boundary and a plain step is lossless too, so a test that compares
tokens only stays green with a broken source. Here a source registered through goose's public plugin API drafts
(copies what followed the anchor's latest earlier occurrence) for a few cycles and then raises on every call, or
drafts nothing at all, inside each family's real code path (greedy, sampled, batched, structured, scale, int8,
llama.cpp, goose serve's app, Hugging Face's generate); the output still equals the reference, and
``assert_lossless`` (over the wire: ``assert_served_lossless``) must fail, naming the fault or the missing drafts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from starlette.testclient import TestClient

import goose
import goose.hf
from goose import cpu, llama_model, models, plugins
from goose.config import GooseConfig
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
from goose.models import encode_prompt
from goose.serve.app import create_app
from goose.serve.engine import Engine
from tests.helpers import CPU_CURVE, SCHEMA, assert_lossless, assert_served_lossless, lossless_prompts

TOKENS = 24
DRAFTING_CYCLES = 3  # the faulty source drafts this many times, then raises on every call


class FaultyCopy:
    """Drafts the 8 tokens that followed the anchor's latest earlier occurrence, then, from its fourth call, raises."""

    def __init__(self, config: goose.GooseConfig) -> None:
        self.calls = 0

    @goose.hookimpl
    def goose_propose(self, context: goose.DecodeContext) -> goose.Draft | None:
        self.calls += 1
        if self.calls > DRAFTING_CYCLES:
            raise RuntimeError("the faulty source broke")
        earlier = np.flatnonzero(context.tokens[:-1] == context.anchor)
        copied = context.tokens[earlier[-1] + 1 : earlier[-1] + 9] if earlier.size else context.tokens[:0]
        return goose.Draft.chain(copied.copy()) if copied.size else None


class Dead:
    """Never drafts: every proposal is None (a source that is loaded, called and useless)."""

    def __init__(self, config: goose.GooseConfig) -> None:
        pass

    @goose.hookimpl
    def goose_propose(self, context: goose.DecodeContext) -> goose.Draft | None:
        return None


@pytest.fixture(scope="module", autouse=True)
def guard_sources() -> Iterator[None]:
    registrations = goose.register(plugins.SourcePlugin("faulty_copy", FaultyCopy, initial_acceptance=0.5))
    registrations += goose.register(plugins.SourcePlugin("dead", Dead, initial_acceptance=0.5))
    try:
        yield
    finally:
        plugins.unregister(registrations)


def _llama_gguf() -> tuple[Any, Any]:
    """SmolLM2's GGUF file on llama.cpp, skipped as test_llama_engine is where the build cannot run here."""
    refused = cpu.refusal("llama-cpp-python", llama_model.cpu_flags_file(), "make llama-setup")
    if refused:
        pytest.skip(refused)
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: `make llama-setup` builds it")
    return models.load_gguf("smollm2-135m", threads=int(os.environ.get("GOOSE_TEST_THREADS", "2")))


# family -> (the model's fixture, generation options); "batched" decodes two prompts together
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "greedy": ("tiny", {}),
    "sampled": ("tiny", {"temperature": 0.8, "top_p": 0.9, "seed": 5}),
    "batched": ("tiny", {}),
    "structured": ("tiny", {"json_schema": SCHEMA}),
    "scale": ("qwen15b", {}),
    "int8": ("smollm2_int8", {}),
    "llama.cpp": ("gguf", {}),
}
SLOW = pytest.mark.slow
PARAMS = [pytest.param("greedy"), pytest.param("sampled"), pytest.param("batched"), pytest.param("structured"),
          pytest.param("scale", marks=[SLOW, pytest.mark.xdist_group("qwen")]),  # the 1.5B model's worker
          pytest.param("int8", marks=SLOW), pytest.param("llama.cpp", marks=SLOW)]


def runs_with(request: pytest.FixtureRequest, ar_reference: Any, family: str, source: str
              ) -> list[tuple[Any, list[int]]]:
    """(Goose's result, the autoregressive reference's tokens) of each request of ``family`` drafted by ``source``
    alone, through the family's own code path."""
    fixture, options = FAMILIES[family]
    model, tokenizer = _llama_gguf() if fixture == "gguf" else request.getfixturevalue(fixture)
    prompts = lossless_prompts("smollm2")[:2 if family == "batched" else 1]
    goose_decoder = GooseDecoder(model, tokenizer, GooseConfig(sources=[source]), cost_curve=CPU_CURVE,
                                 pinned_costs=True)
    if family == "batched":
        results = goose_decoder.generate_batch(prompts, TOKENS, **options)
    else:
        results = [goose_decoder.generate(prompts[0], TOKENS, **options)]
    if fixture == "gguf":  # llama.cpp's own loop on the same file (no torch parameters to key a shared reference)
        ar = AutoregressiveDecoder(model, tokenizer)
        references = [ar.generate(prompt, TOKENS, **options).new_token_ids for prompt in prompts]
    else:
        references = [ar_reference(model, tokenizer, prompt, TOKENS, **options).new_token_ids for prompt in prompts]
    return list(zip(results, references, strict=True))


@pytest.mark.parametrize("family", PARAMS)
def test_a_source_that_raises_fails_the_lossless_assertion(request, ar_reference, family: str) -> None:
    for result, reference in runs_with(request, ar_reference, family, "faulty_copy"):
        # the output is the reference's (the fault cost drafts, not tokens): only the fault check can see it
        assert result.new_token_ids == reference
        assert result.stats.faults["faulty_copy"]["count"] > 0
        with pytest.raises(AssertionError, match=r"plugin fault .*faulty_copy .*the faulty source broke"):
            assert_lossless(result, reference, accepted=False)


@pytest.mark.parametrize("family", PARAMS)
def test_a_source_that_drafts_nothing_fails_the_lossless_assertion(request, ar_reference, family: str) -> None:
    for result, reference in runs_with(request, ar_reference, family, "dead"):
        assert result.new_token_ids == reference
        assert not result.stats.faults
        with pytest.raises(AssertionError, match="no source drafted a token"):
            assert_lossless(result, reference, accepted=False)


# each source, and what the lossless assertion must say of a run it drafted (or did not)
BROKEN = [("faulty_copy", r"plugin fault .*faulty_copy .*the faulty source broke"),
          ("dead", "no source drafted a token")]


@pytest.mark.parametrize(("source", "message"), BROKEN)
def test_a_served_request_with_a_broken_source_fails_the_wire_check(tiny, ar_reference, source: str,
                                                                     message: str) -> None:
    """goose serve's app and engine in this process (where the two sources are registered), a greedy completion: its
    text is the reference's, and only the ``goose`` statistics' faults or drafting can tell."""
    model, tokenizer = tiny
    prompt = lossless_prompts("smollm2")[0]
    reference = ar_reference(model, tokenizer, encode_prompt(tokenizer, prompt, chat=False), TOKENS, chat=False)
    engine = Engine(model, tokenizer, GooseConfig(sources=[source], budget=8))  # a tree every cycle
    with TestClient(create_app(engine, "tiny"), base_url="http://127.0.0.1:8000") as client:  # starts, stops it
        response = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": TOKENS})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["choices"][0]["text"] == reference.text
    assert (body["goose"]["faults"].get(source, {}).get("count", 0) > 0) == (source == "faulty_copy")
    with pytest.raises(AssertionError, match=message):
        assert_served_lossless(body, body["choices"][0]["text"], reference, accepted=False)


@pytest.mark.parametrize(("source", "message"), BROKEN)
def test_a_hugging_face_generate_with_a_broken_source_fails_the_lossless_assertion(tiny, ar_reference, source: str,
                                                                                   message: str) -> None:
    """``model.generate(custom_generate=goose.hf.generate)``: its output is plain decoding's, and only the run that
    ``goose.hf.last_result`` hands back can tell."""
    model, tokenizer = tiny
    reference = ar_reference(model, tokenizer, lossless_prompts("smollm2")[0], TOKENS)
    ids = torch.tensor([reference.prompt_ids])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=TOKENS, do_sample=False,
                         custom_generate=goose.hf.generate, goose_config={"sources": [source], "budget": 8})
    assert out[0, ids.shape[1] :].tolist() == reference.new_token_ids
    with pytest.raises(AssertionError, match=message):
        assert_lossless(goose.hf.last_result(model), reference, accepted=False)
