"""Structured outputs (json_schema / json_object): valid JSON, token for token what constrained autoregressive
decoding gives, greedy and seeded, alone and batched, with the drafts the grammar forbids cut before the pass."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch

from goose.config import GooseConfig
from goose.contract.tree import TreeBuilder
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
from goose.grammar import Constraint, GrammarCompiler, GrammarError, schema_text
from tests.helpers import PROMPT, SCHEMA, assert_lossless, assert_same_logprobs

MAX_NEW = 48


def _valid(text: str) -> dict[str, Any]:
    document = json.loads(text)
    jsonschema.validate(document, SCHEMA)
    return document


@pytest.fixture(scope="module")
def reference(smollm2, ar_reference) -> Any:
    """Constrained greedy autoregressive decoding of PROMPT (the reference every greedy run must equal)."""
    result = ar_reference(*smollm2, PROMPT, MAX_NEW, json_schema=SCHEMA)
    assert result.stop_reason == "eos", result.text  # the schema's JSON is complete within MAX_NEW tokens
    _valid(result.text)
    return result


@pytest.fixture(scope="module")
def reference_logprobs(smollm2, reference) -> Any:
    """The constrained autoregressive run's log probabilities (2 alternatives), from its own masked logits."""
    result = AutoregressiveDecoder(*smollm2).generate(PROMPT, MAX_NEW, json_schema=SCHEMA, logprobs=2)
    assert result.new_token_ids == reference.new_token_ids
    return result.logprobs


@pytest.mark.slow  # SmolLM2 writing the schema's JSON to its end: a real model's text
@pytest.mark.parametrize("topology", ["spine", "chain", "multi_spine"])
def test_json_schema_greedy_equals_constrained_autoregressive(smollm2, reference, reference_logprobs,
                                                              topology: str) -> None:
    goose = GooseDecoder(*smollm2, GooseConfig(topology=topology, budget=12))  # small trees: cheap passes
    result = goose.generate(PROMPT, MAX_NEW, json_schema=SCHEMA, logprobs=2)
    assert_lossless(result, reference, label=topology)
    # log probabilities of a constrained request: the grammar-restricted distribution, as the AR loop reads it
    assert_same_logprobs(result.logprobs, reference_logprobs)
    # where the grammar allows one token only: log probability 0, and no (impossible) alternative listed
    assert any(entry.logprob == 0.0 and len(entry.top) == 1 for entry in result.logprobs)
    assert result.stop_reason == "eos"
    _valid(result.text)
    stats = result.to_dict()
    assert stats["grammar_cut_tokens"] > 0  # context match drafted prose inside the JSON: cut, never verified
    assert stats["grammar_s"] > 0
    assert stats["tau"] > 1.0


@pytest.mark.slow
def test_json_schema_seeded_sampling_equals_the_constrained_sampler(smollm2, ar_reference) -> None:
    options = {"json_schema": SCHEMA, "temperature": 0.7, "seed": 11}
    expected = ar_reference(*smollm2, PROMPT, 24, **options)
    result = GooseDecoder(*smollm2, GooseConfig(budget=12)).generate(PROMPT, 24, **options)
    assert_lossless(result, expected, accepted=False)  # drafted and tested; 24 sampled tokens may keep none
    assert result.seed == 11
    if result.stop_reason == "eos":  # a finished output follows the schema (a cut one may stop mid-string)
        _valid(result.text)


@pytest.mark.slow
def test_batched_json_schema_and_json_object(smollm2, reference) -> None:
    """Through BatchSession (the server's path): a constrained row equals the single-request reference, and a
    JSON-mode row next to it gives a JSON object."""
    decoder = GooseDecoder(*smollm2, GooseConfig(budget=8))
    session = decoder.batch(2)
    schema_id = session.submit(decoder.request(PROMPT, MAX_NEW, json_schema=json.dumps(SCHEMA)))
    object_id = session.submit(decoder.request("Give a cat's name and color as a short JSON object.", 32,
                                               json_object=True))
    results = {event.request_id: event.result for event in session.run() if event.result is not None}
    assert_lossless(results[schema_id], reference, accepted=False)
    assert results[schema_id].stats.grammar_cut_tokens > 0
    assert results[object_id].stop_reason == "eos", results[object_id].text
    assert isinstance(json.loads(results[object_id].text), dict)


def test_drafts_the_grammar_forbids_are_cut_with_their_subtrees(tiny) -> None:
    """At `{"name": "` a name drafted in lower case stays (with its masks), one with a space or a capital goes
    (its whole subtree with it); each kept row's mask allows exactly what the grammar allows there."""
    tokenizer = tiny[1]
    compiler = GrammarCompiler.of(tokenizer, tiny[0].config.vocab_size)
    constraint = Constraint(compiler, schema_text(SCHEMA, False), [tokenizer.eos_token_id])
    prefix = tokenizer.encode('{"name": "', add_special_tokens=False)
    constraint.advance(prefix)  # the anchor (the last token) is output already: the grammar has consumed it
    encode = lambda text: np.asarray(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    builder = TreeBuilder(prefix[-1], ("a", "b"), capacity=32)
    good = builder.add_chain(0, encode("bob_smith\","), 0)
    bad = builder.add_chain(0, encode("Bob Smith\","), 1)
    tree = builder.build()
    pruned, masks = constraint.plan(tree)
    assert constraint.cut_tokens == len(bad) == tree.size - pruned.size
    assert pruned.tokens.tolist() == tree.tokens[: 1 + len(good)].tolist()
    assert masks.shape == (pruned.size, compiler.words)
    allowed = np.unpackbits(masks.view(np.uint8), axis=1, bitorder="little")
    for node in range(pruned.size - 1):  # every kept draft token is allowed by its parent's row
        assert allowed[int(pruned.parents[node + 1]), int(pruned.tokens[node + 1])]
    assert not allowed[0, int(tree.tokens[1 + len(good)])]  # "Bob" is not
    # the rows are masked alike on the host path (contiguous CPU rows) and the device path (any other rows)
    logits = torch.randn(compiler.vocab_size, pruned.size).t()  # not contiguous: the device path
    host = logits.contiguous()
    constraint.apply(logits, masks)
    constraint.apply(host, masks)
    assert torch.equal(logits, host)
    assert torch.equal(torch.isfinite(host), torch.from_numpy(allowed[:, : compiler.vocab_size].astype(bool)))


@pytest.mark.parametrize(("options", "message"), [
    ({"json_schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}}, "unclosed group"),
    ({"json_schema": {"type": "wibble"}}, "wibble"),
    ({"json_schema": "{not json"}, "not valid JSON"),
    ({"json_schema": SCHEMA, "json_object": True}, "not both"),
    ({"json_schema": SCHEMA, "eos_token_ids": []}, "end-of-sequence"),
])
def test_bad_structured_requests_are_clear_value_errors(tiny, options: dict[str, Any], message: str) -> None:
    with pytest.raises(GrammarError, match=r"json_schema|json_object|end-of-sequence") as raised:
        GooseDecoder(*tiny).generate("hi", 4, **options)
    assert isinstance(raised.value, ValueError) and message in str(raised.value)
