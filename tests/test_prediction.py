"""Predicted Outputs: the prediction drafts, re-syncs after a departure, and never changes the output (float32).

The decoder's tests run on the tiny random-weight model (what they check is the prediction source's bookkeeping);
the CLI's, on the embedded SmolLM2 that it loads by name, is slow."""

from __future__ import annotations

import json

import numpy as np
import pytest

from goose import cli
from goose.config import GooseConfig
from goose.cycle.decoder import GooseDecoder
from tests.helpers import CPU_CURVE, assert_lossless, dataset_prompts

TOKENS = 40


@pytest.fixture(scope="module")
def case(tiny, ar_reference):
    model, tokenizer = tiny
    prompt = dataset_prompts("humaneval", 2)[1]
    return model, tokenizer, prompt, ar_reference(model, tokenizer, prompt, TOKENS)


def _counters(result) -> tuple[int, int, int]:
    stats = result.stats.to_dict()
    return (stats["accepted_prediction_tokens"], stats["rejected_prediction_tokens"],
            result.stats.source_tested.get("prediction", 0))


def test_the_output_itself_as_prediction_is_drafted_whole(case):
    model, tokenizer, prompt, reference = case
    decoder = GooseDecoder(model, tokenizer)
    result = decoder.generate(prompt, TOKENS, prediction=list(reference.new_token_ids))
    assert_lossless(result, reference)
    accepted, rejected, tested = _counters(result)
    assert accepted >= 0.8 * TOKENS and accepted + rejected == tested
    assert result.stats.tau > 4  # a pass now yields several tokens


def test_a_prediction_that_departs_midway_resyncs(case):
    """A stretch of the prediction is replaced (an edit): the output departs there and rejoins after it."""
    model, tokenizer, prompt, reference = case
    ids = list(reference.new_token_ids)
    edited = ids[:12] + tokenizer.encode(" banana split sundae", add_special_tokens=False) + ids[18:]
    decoder = GooseDecoder(model, tokenizer)
    result = decoder.generate(prompt, TOKENS, prediction=edited)
    assert_lossless(result, reference)
    source = decoder.drafter.spare[0].predicting.instances["prediction"]
    assert source.resyncs >= 1
    accepted, rejected, tested = _counters(result)
    # the 12 tokens before the departure and at least 6 after it: drafted again after the departure
    assert accepted >= 18 and rejected >= 1 and accepted + rejected == tested


def test_an_unrelated_prediction_changes_nothing(case):
    model, tokenizer, prompt, reference = case
    decoder = GooseDecoder(model, tokenizer, cost_curve=CPU_CURVE, pinned_costs=True)  # trees whatever the machine
    result = decoder.generate(prompt, TOKENS, prediction="The quick brown fox jumps over the lazy dog. " * 3)
    assert_lossless(result, reference, accepted=False)  # the other sources draft; the prediction may keep nothing
    accepted, rejected, tested = _counters(result)
    assert accepted + rejected == tested
    plain = decoder.generate(prompt, TOKENS)  # the same decoder without a prediction: the prediction source is off
    assert plain.new_token_ids == reference.new_token_ids and _counters(plain)[2] == 0


def test_seeded_sampling_is_the_same_with_a_prediction(case, ar_reference):
    model, tokenizer, prompt, _ = case
    sampled = ar_reference(model, tokenizer, prompt, TOKENS, temperature=0.8, seed=1)
    decoder = GooseDecoder(model, tokenizer, cost_curve=CPU_CURVE, pinned_costs=True)
    for prediction in (list(sampled.new_token_ids), "def f(x):\n    return x\n"):
        result = decoder.generate(prompt, TOKENS, temperature=0.8, seed=1, prediction=prediction)
        assert_lossless(result, sampled, accepted=isinstance(prediction, list))  # the output itself: kept
    assert _counters(result)[0] + _counters(result)[1] == _counters(result)[2]


@pytest.mark.parametrize(("prediction", "message"), [
    ("", "prediction is empty"), ([], "prediction is empty"), ([-1, 5], "prediction token ids"),
    (3.5, "prediction must be text"), ([1] * 9000, "does not fit the model's context"),
])
def test_a_bad_prediction_is_a_clear_error(tiny, prediction, message):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match=message):
        GooseDecoder(model, tokenizer).generate("Hello", 4, prediction=prediction)


def test_a_decoder_without_a_prediction_keeps_its_sources(tiny):
    model, tokenizer = tiny
    decoder = GooseDecoder(model, tokenizer)
    result = decoder.generate("Hello", 4)
    assert "prediction" not in decoder.sources.names and "prediction" not in result.stats.source_tested


def test_bench_sends_the_prediction_only_for_a_method_that_asks(tiny):
    from goose_bench.generators import DecoderGenerator
    from goose_bench.methods import ALL_METHODS

    model, tokenizer = tiny
    prompt_ids = tokenizer.encode("def add(a, b):\n    return a + b\n\nprint(add(1, 2))", add_special_tokens=False)
    prediction = "def add(a, b):\n    return a + b\n"
    outputs = {name: DecoderGenerator(ALL_METHODS[name], model, tokenizer).generate(prompt_ids, 12,
                                                                                      prediction=prediction)
               for name in ("goose", "goose_pred")}
    assert outputs["goose"].new_token_ids == outputs["goose_pred"].new_token_ids
    assert "prediction" in outputs["goose_pred"].stats["source_tested"]
    assert "prediction" not in outputs["goose"].stats["source_tested"]


@pytest.mark.slow
def test_goose_generate_prediction_file(smollm2, ar_reference, tmp_path, capsys):
    """`goose generate --prediction FILE --compare-ar --json`: identical to AR, the prediction's tokens kept."""
    prompt = dataset_prompts("humaneval", 2)[1]
    reference = ar_reference(*smollm2, prompt, TOKENS)
    predicted = tmp_path / "expected.txt"
    predicted.write_text(reference.text)
    assert cli.main(["generate", prompt, "--prediction", str(predicted), "--dtype", "float32", "--compare-ar",
                     "--json", "--max-new-tokens", str(TOKENS)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identical_to_ar"] and report["new_token_ids"] == reference.new_token_ids
    assert report["sources"][0] == "prediction" and report["accepted_prediction_tokens"] >= TOKENS // 2


def _draft(source, output: list[int], prediction_length: int = 100):
    """``source``'s draft after ``output`` (prompt [1, 2, 3]), for the prediction 100, 101, ... ."""
    from goose.contract.candidates import DecodeContext

    prompt = [1, 2, 3]
    prediction = np.arange(100, 100 + prediction_length, dtype=np.int64)
    tokens = np.asarray(prompt + output, dtype=np.int64)
    return source.goose_propose(DecodeContext(tokens, len(prompt), 1000, frozenset(), prediction=prediction))


def test_the_run_followed_since_the_last_departure_is_the_drafts_consensus():
    """The consensus grows with every token followed, drops to 0 at a departure, and is off by option."""
    from sources.prediction import PredictionSource

    source = PredictionSource(GooseConfig())
    assert _draft(source, []).consensus == 0
    assert _draft(source, [100, 101, 102]).consensus == 3
    followed = _draft(source, [100, 101, 102, 103, 104, 105, 106, 107, 108, 109])
    assert followed.consensus == 10 and followed.tokens[0] == 110
    departed = _draft(source, [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 7, 110])  # one token inserted
    assert departed.consensus == 0 and departed.tokens[0] == 111  # re-synced on the last token, no run yet
    quiet = PredictionSource(GooseConfig(source_options={"prediction": {"consensus": False}}))
    assert _draft(quiet, [100, 101, 102, 103]).consensus == 0


def test_a_long_run_is_trusted_by_its_depth_and_a_departure_starts_shallow():
    """The prediction's drafts carry per-depth estimates by run depth: a held run teaches the deep bins at once."""
    from sources.prediction import PredictionSource
    from tests.helpers import make_outcome, own

    source = PredictionSource(GooseConfig())
    first = _draft(source, [100, 101, 102, 103, 104, 105, 106, 107, 108, 109])  # 10 followed: depth 10 onwards
    assert first.depth_acceptance == (0.9,)  # every bin at the prior
    chain = first.tokens[:40].tolist()
    outcome = make_outcome(("prediction",), {"prediction": chain}, {"prediction": 40})  # all 40 held
    source.goose_observe(outcome, own(outcome, "prediction"))
    output = list(range(100, 150))
    held = _draft(source, output)
    assert held.depth_acceptance[0] > 0.97  # a run of 50 tokens (bin 32-64, learnt from the held draft): trusted now
    assert held.scores[0] == held.depth_acceptance[0] and held.consensus == 50
    departed = _draft(source, [*output, 7, 150])  # one token inserted, re-synced on the last one
    assert departed.tokens[0] == 151 and departed.depth_acceptance[0] == 0.9  # a fresh run: the prior bin
    assert max(departed.depth_acceptance) > 0.97  # it deepens into the learnt bins
    plain = PredictionSource(GooseConfig(source_options={"prediction": {"depth_edges": []}}))
    assert _draft(plain, output[:10]).depth_acceptance == ()  # the decoder's one estimate (the old behaviour)
