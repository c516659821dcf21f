"""Log probabilities: Goose's, read from its verify passes, equal the autoregressive loop's, read from its own.

The tiny random-weight model in float32 (SmolLM2 for the CLI, which loads it by name). The reference is
:class:`AutoregressiveDecoder` asked for log probabilities in this process; Goose (the default sources and
topology, and a prediction so that long paths and their bonus tokens are accepted) and the batched engine must
give the same tokens and the same log probabilities within 1e-4, greedy and seeded sampling alike.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from goose import cli
from goose.cycle.decoder import AutoregressiveDecoder, GenerationResult, GooseDecoder
from goose.cycle.logprobs import TokenLogprob
from tests.helpers import CPU_CURVE, assert_lossless, assert_same_logprobs

PROMPT = "Repeat exactly: the quick brown fox jumps over the lazy dog near the river bank, then runs home."
OTHER = "Name three rivers."
TOKENS = 20


@pytest.fixture(scope="module")
def decoders(tiny) -> tuple[AutoregressiveDecoder, GooseDecoder]:
    model, tokenizer = tiny
    # the CPU-like curve, pinned: trees are laid whatever this machine measured, so the drafting is checked too
    return AutoregressiveDecoder(model, tokenizer), GooseDecoder(model, tokenizer, cost_curve=CPU_CURVE,
                                                                 pinned_costs=True)


@pytest.fixture(scope="module")
def reference(decoders) -> GenerationResult:
    """The greedy autoregressive run of PROMPT with 3 alternatives per token."""
    return decoders[0].generate(PROMPT, TOKENS, logprobs=3)


def batched(goose: GooseDecoder, requests: list[tuple[str, int, dict[str, Any]]]) -> list[GenerationResult]:
    """The results of ``requests`` (prompt, tokens, options) decoded together in one batch session."""
    session = goose.batch(len(requests))
    ids = [session.submit(goose.request(prompt, tokens, **options)) for prompt, tokens, options in requests]
    results = {event.request_id: event.result for event in session.run() if event.result is not None}
    return [results[request_id] for request_id in ids]


def test_goose_and_batched_logprobs_equal_the_autoregressive_loops_greedy(decoders, reference) -> None:
    ar, goose = decoders
    assert reference.logprobs is not None and len(reference.logprobs) == len(reference.new_token_ids) > 10
    for entry in reference.logprobs:  # greedy: the chosen token is the row's most likely one
        assert entry.top[0] == (entry.token_id, entry.logprob) and entry.logprob <= 0.0
        assert [logprob for _, logprob in entry.top] == sorted((logprob for _, logprob in entry.top), reverse=True)
    # a prediction of the output makes Goose accept long paths: the anchor's, the nodes' and the bonus rows all count
    chunks = list(goose.stream(PROMPT, TOKENS, logprobs=3, prediction=list(reference.new_token_ids)))
    result = goose.last_result
    assert result is not None
    assert_lossless(result, reference)
    assert max(result.stats.accepted_lengths) > 2  # paths of several tokens were verified in one pass
    assert_same_logprobs(result.logprobs, reference.logprobs)
    assert [len(chunk.logprobs) for chunk in chunks] == [len(chunk.token_ids) for chunk in chunks]
    assert [entry for chunk in chunks for entry in chunk.logprobs] == result.logprobs
    together = batched(goose, [(PROMPT, TOKENS, {"logprobs": 3, "prediction": list(reference.new_token_ids)}),
                               (OTHER, 6, {"logprobs": 3})])
    assert_same_logprobs(together[0].logprobs, reference.logprobs)
    assert_same_logprobs(together[1].logprobs, ar.generate(OTHER, 6, logprobs=3).logprobs)
    plain = goose.generate(PROMPT, 2)  # off by default
    assert plain.logprobs is None and "logprobs" not in plain.to_dict()


def test_goose_and_batched_logprobs_equal_the_autoregressive_loops_sampled(decoders) -> None:
    ar, goose = decoders
    sampling = {"temperature": 0.8, "seed": 11}
    expected = ar.generate(PROMPT, 12, logprobs=0, **sampling)
    result = goose.generate(PROMPT, 12, logprobs=0, **sampling)
    # tokens and no fault: 12 tokens sampled from the tiny model's flat distribution draft nothing to test
    assert result.new_token_ids == expected.new_token_ids and not result.stats.faults
    assert all(entry.top == () for entry in result.logprobs)
    assert_same_logprobs(result.logprobs, expected.logprobs)
    together = batched(goose, [(PROMPT, 12, {"logprobs": 0, **sampling}), (OTHER, 4, {"logprobs": 0, **sampling})])
    assert together[0].new_token_ids == expected.new_token_ids and not together[0].stats.faults
    assert_same_logprobs(together[0].logprobs, expected.logprobs)


@pytest.mark.parametrize("value", [-1, 21, 2.5, True, "3"])
def test_bad_logprobs_option_is_a_value_error_naming_it(decoders, value: Any) -> None:
    with pytest.raises(ValueError, match="logprobs must be"):
        decoders[1].generate(PROMPT, 4, logprobs=value)


def test_goose_generate_logprobs_json(smollm2, capsys) -> None:
    reference = AutoregressiveDecoder(*smollm2).generate(PROMPT, 8, logprobs=3)
    assert cli.main(["generate", PROMPT, "--max-new-tokens", "8", "--logprobs", "3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    got = [TokenLogprob(e["token_id"], e["logprob"], tuple((t["token_id"], t["logprob"]) for t in e["top_logprobs"]))
           for e in report["logprobs"]]
    assert_same_logprobs(got, reference.logprobs)
    tokenizer = smollm2[1]
    assert [entry["token"] for entry in report["logprobs"]] == [tokenizer.decode([t]) for t in report["new_token_ids"]]
    assert all(len(entry["top_logprobs"]) == 3 and "token" in entry["top_logprobs"][0] for entry in report["logprobs"])


def test_server_places_tokens_in_the_text_and_shows_partial_characters_as_bytes(smollm2) -> None:
    """A character split over tokens: each piece shows as OpenAI's bytes:\\x.. with its own raw bytes, and goes
    out with the text that completes it; a stop string drops the tokens whose text starts after it."""
    from goose.serve.logprobs import LogprobPlacer, TokenTexts

    tokenizer = smollm2[1]
    ids = tokenizer.encode("Geese 🦢 fly.", add_special_tokens=False)
    texts = TokenTexts(tokenizer)
    shown = [texts(token) for token in ids]
    assert b"".join(bytes(text.bytes) for text in shown).decode() == "Geese 🦢 fly."
    assert any(text.token.startswith("bytes:\\x") for text in shown)
    entries = [TokenLogprob(token, -0.5, ()) for token in ids]
    placer = LogprobPlacer(texts)
    swan = next(i for i, text in enumerate(shown) if text.token.startswith("bytes:"))
    placer.add(entries[: swan + 1])  # the text so far ends inside the swan: its first piece waits for the rest
    assert [entry.text for entry in placer.release(len("Geese"))] == shown[:2]
    placer.add(entries[swan + 1 :])
    sent = placer.release(len("Geese 🦢"), cut=True)  # a stop string " fly" cuts the text after the swan
    assert [entry.text for entry in sent] == shown[2:-2]
    assert [entry.offset for entry in placer.sent] == [0, 2, 5, 5, 5][: len(placer.sent)]
    assert placer.release(100, ended=True) == []  # " fly" and "." were dropped with their text
