"""Bad input gets a clear one-line error and a non-zero exit; a faulty plugin is skipped, output unchanged."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pytest

import goose
from goose import cli, plugins
from goose.boundary import SourceSet
from goose.config import GooseConfig
from goose.contract.candidates import DecodeContext
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
from goose.topologies.spine import SpineTopology


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", ""], "empty prompt"),
        (["generate", "hi", "--max-new-tokens", "0"], "max_new_tokens must be positive"),
        (["generate", "hi", "--temperature", "-0.5"], "temperature: Input should be greater than or equal to 0"),
        (["generate", "hi", "--temperature", "nan"], "temperature: Input should be a finite number"),
        (["generate", "hi", "--temperature", "0.7", "--top-p", "0"], "top_p: Input should be greater than 0"),
        (["generate", "hi", "--top-p", "1.5"], "top_p: Input should be less than or equal to 1"),
        (["generate", "hi", "--top-k", "-1"], "top_k: Input should be greater than or equal to 0"),
        (["generate", "hi", "--seed", "-3"], "seed: Input should be greater than or equal to 0"),
        (["generate", "hi", "--model", "no-such-model"], "unknown model"),
        (["generate", "hi", "--sources", "context_match,nope"], "unknown source 'nope'"),
        (["generate", "hi", "--topology", "nope"], "unknown topology 'nope'"),
        (["generate", "hi", "--budget", "0"], "budget must be >= 1"),
        (["generate", "hi", "--budget", "many"], "--budget must be an integer or 'auto'"),
        (["generate", "hi", "--disable", "context_match", "--disable", "bigram_transition"],
         "every source is disabled"),
        (["generate", "hi", "--dtype", "int3"], "dtype"),
        (["generate", "hi", "--prediction", "/no/such/file.py"], "--prediction: cannot read /no/such/file.py"),
        (["generate", "hi", "--prediction", "/dev/null"], "--prediction: /dev/null is empty"),
        (["generate", "-", "--prediction", "-"], "cannot both come from stdin"),
        (["generate", "hi", "--json-schema", "/no/such.json"], "--json-schema: cannot read /no/such.json"),
        (["generate", "hi", "--json-schema", "/dev/null"], "--json-schema: /dev/null is not JSON"),
        (["generate", "hi", "--json-schema", "/dev/null", "--json-object"], "--json-schema or --json-object"),
        (["generate"], "give a prompt or --prompts FILE"),
        (["generate", "hi", "--prompts", "/dev/null"], "give a prompt or --prompts FILE"),
        (["generate", "hi", "--max-batch", "2"], "--max-batch goes with --prompts"),
        (["generate", "--prompts", "/no/such.jsonl"], "--prompts: cannot read /no/such.jsonl"),
        (["generate", "--prompts", "/dev/null"], "--prompts: /dev/null holds no prompt"),
        (["generate", "--prompts", "/dev/null", "--max-batch", "0"], "--max-batch must be at least 1"),
        (["generate", "hi", "--logprobs", "3"], "--logprobs goes with --json"),
        (["generate", "hi", "--logprobs", "21", "--json"], "--logprobs must be from 0 to 20"),
    ],
)
def test_cli_errors_are_one_line(argv: list[str], message: str, capsys) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("goose: error:") and message in err
    assert "\n" not in err and "Traceback" not in err


@pytest.mark.parametrize(("line", "message"), [
    ("not json", "line 2 is not JSON"),
    ('["a list"]', "line 2 needs a 'prompt' string"),
    ('{"prompt": 3}', "line 2 needs a 'prompt' string"),
    ('{"prompt": "  "}', "line 2: empty prompt"),
    ('{"prompt": "hi", "max_new_tokens": 0}', "line 2: max_new_tokens must be positive"),
    ('{"prompt": "hi", "max_new_tokens": "many"}', "line 2: 'max_new_tokens' must be int"),
    ('{"prompt": "hi", "temperature": 2}', "line 2: unknown field 'temperature'"),
])
def test_bad_prompts_files_name_the_line(tmp_path, line: str, message: str, capsys) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "a good first line"}\n' + line + "\n")
    assert cli.main(["generate", "--prompts", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("goose: error: --prompts:") and message in err and "\n" not in err


def test_prompt_longer_than_the_context(capsys) -> None:
    long_prompt = "word " * 9000  # SmolLM2's context is 8192 positions
    assert cli.main(["generate", long_prompt, "--max-new-tokens", "4", "--no-chat"]) == 2
    err = capsys.readouterr().err
    assert "does not fit the model's context of 8192" in err


def test_decoder_api_errors(smollm2) -> None:
    model, tokenizer = smollm2
    decoder = GooseDecoder(model, tokenizer)
    with pytest.raises(ValueError, match="empty prompt"):
        decoder.generate("   ", 8)
    with pytest.raises(ValueError, match="empty prompt"):
        decoder.generate([], 8)
    with pytest.raises(ValueError, match="max_new_tokens must be positive"):
        decoder.generate("hi", 0)
    with pytest.raises(ValueError, match="prompt token ids"):
        decoder.generate([1, 10**9], 8)
    with pytest.raises(plugins.PluginError, match="unknown source"):
        GooseDecoder(model, tokenizer, GooseConfig(sources=["nope"]))


class RaisingSource:
    def __init__(self, config: GooseConfig) -> None:
        self.calls = 0

    @goose.hookimpl
    def goose_propose(self, context):
        self.calls += 1
        raise RuntimeError("boom")

    @goose.hookimpl
    def goose_observe(self, outcome):
        raise ValueError("cannot learn")


class GarbageSource:
    def __init__(self, config: GooseConfig) -> None:
        pass

    @goose.hookimpl
    def goose_propose(self, context):
        return goose.Draft.chain([context.vocab_size + 5, -3], 0.9)  # ids outside the vocabulary

    @goose.hookimpl
    def goose_successors(self, previous, tokens, k):
        return np.full((tokens.shape[0], k), 10**9), np.ones((tokens.shape[0], k))

    @goose.hookimpl
    def goose_auxiliary_rows(self, context):
        return goose.AuxiliaryRows(np.array([1, 2]), np.array([0, 1]), np.ones((2, 2), dtype=bool))  # offset 0


class WrongTypeSource:
    def __init__(self, config: GooseConfig) -> None:
        pass

    @goose.hookimpl
    def goose_propose(self, context):
        return [1, 2, 3]  # not a Draft

    @goose.hookimpl
    def goose_successors(self, previous, tokens, k):
        return "no successors"

    @goose.hookimpl
    def goose_auxiliary_rows(self, context):
        return {"tokens": [1]}  # not AuxiliaryRows


class BadEstimateSource:
    def __init__(self, config: GooseConfig) -> None:
        pass

    @goose.hookimpl
    def goose_propose(self, context):
        return goose.Draft.chain([context.anchor], depth_acceptance="high")  # not a sequence of probabilities


class FaultyPlugins:
    @goose.hookimpl
    def goose_register_sources(self, register) -> None:
        # claims of trust that would give them the spine and the branches if they drafted
        register("raising", RaisingSource, initial_acceptance=0.99)
        register("garbage", GarbageSource, initial_acceptance=0.98)
        register("wrong_type", WrongTypeSource, initial_acceptance=0.97)
        register("bad_estimate", BadEstimateSource, initial_acceptance=0.96)


@pytest.fixture
def faulty_plugins() -> Iterator[None]:
    registrations = plugins.register(FaultyPlugins(), origin="tests")
    yield
    plugins.unregister(registrations)


def decode_beside_ar(model_and_tokenizer, config: GooseConfig, prompt: str, max_new_tokens: int, caplog):
    """Goose under ``config`` and plain greedy on ``prompt``; asserts they agree token for token.

    Returns the decoder, its result and the plugin warnings logged while decoding.
    """
    model, tokenizer = model_and_tokenizer
    reference = AutoregressiveDecoder(model, tokenizer).generate(prompt, max_new_tokens)
    with caplog.at_level(logging.WARNING, logger="goose.plugins"):
        decoder = GooseDecoder(model, tokenizer, config)
        result = decoder.generate(prompt, max_new_tokens)
    assert result.new_token_ids == reference.new_token_ids
    return decoder, result, [r.getMessage() for r in caplog.records]


def test_faulty_plugins_are_skipped_and_output_is_unchanged(smollm2, caplog, faulty_plugins) -> None:
    # a fixed budget lays a tree every cycle, so every source is asked every cycle (the automatic one may rest
    # a row where no tree pays, and which cycles do follows the machine's curve and the trust in each source)
    config = GooseConfig(sources=["raising", "context_match", "garbage", "bigram_transition", "wrong_type",
                                  "bad_estimate"], budget=8)
    decoder, result, warnings = decode_beside_ar(
        smollm2, config, "List the numbers from 1 to 20, separated by commas.", 48, caplog)
    assert decoder.sources.instances["raising"].calls == result.stats.verify_steps  # asked every cycle
    for name in ("raising", "garbage", "wrong_type", "bad_estimate"):
        assert sum(f"source {name!r} skipped in goose_propose" in w for w in warnings) == 1, warnings
    for name in ("garbage", "wrong_type"):
        assert sum(f"source {name!r} skipped in goose_auxiliary_rows" in w for w in warnings) == 1, warnings
    # the planner asks the most trusted brancher, which answers garbage every time
    assert sum("source 'garbage' skipped in goose_successors" in w for w in warnings) == 1, warnings
    assert sum("'raising' skipped in goose_observe" in w for w in warnings) == 1, warnings
    assert decoder.sources.faults.counts[("raising", "goose_propose")] == result.stats.verify_steps  # counted
    assert result.stats.source_tested["context_match"] > 0  # the healthy sources still drafted


def test_test_plugins_do_not_outlive_their_test() -> None:
    assert not {"raising", "garbage", "wrong_type", "bad_estimate"} & set(plugins.registry().sources)


class WrongHintSpine(SpineTopology):
    """The paper's spine tree with a broken budget hint: too few spine lengths, then an exception."""

    calls = 0

    @goose.hookimpl
    def goose_spine_lengths(self, pool, budgets, config):
        WrongHintSpine.calls += 1
        if WrongHintSpine.calls % 2:
            return (1, 2)
        raise ValueError("no hint today")


class WrongHintPlugin:
    @goose.hookimpl
    def goose_register_topologies(self, register) -> None:
        register("wrong_hint_spine", WrongHintSpine)


def test_a_faulty_budget_hint_is_skipped_and_output_is_unchanged(smollm2, caplog) -> None:
    registrations = plugins.register(WrongHintPlugin(), origin="tests")
    # the output repeats the prompt, so every cycle has a draft whatever budget the cost curve picks; short
    # drafts make it several cycles (a large budget once took the whole answer in one, and the hint was asked once)
    prompt = "Count in words: one, two, three, one, two, three, one, two, three, one, two, three, one,"
    config = GooseConfig(topology="wrong_hint_spine", budget="auto",
                         source_options={"context_match": {"max_continuation": 4}})
    _, _, warnings = decode_beside_ar(smollm2, config, prompt, 40, caplog)
    plugins.unregister(registrations)
    assert WrongHintSpine.calls > 1  # asked on every cycle with a draft, and survived each answer
    assert sum("topology 'wrong_hint_spine' skipped in goose_spine_lengths" in w for w in warnings) == 1, warnings


class Echo:
    """A source answering whatever the test sets in ``Echo.answer`` (a successor table)."""

    answer: object = None

    def __init__(self, config: GooseConfig) -> None:
        pass

    @goose.hookimpl
    def goose_successors(self, previous, tokens, k):
        return Echo.answer


@pytest.mark.parametrize("answer", [
    "no successors",  # not a pair of arrays
    (np.full((2, 3), 5),),  # one array
    (np.full((1, 3), 5), np.ones((1, 3))),  # one row for two queries
    (np.full((2, 3), 10**9), np.ones((2, 3))),  # ids outside the vocabulary
    (np.full((2, 3), 1.5), np.ones((2, 3))),  # float ids
    (np.full((2, 3), 5), np.ones((2, 2))),  # shapes disagree
])
def test_malformed_successors_read_as_nothing_known(answer: object, caplog) -> None:
    registrations = plugins.register(plugins.SourcePlugin("echo", Echo), origin="tests")
    try:
        sources = SourceSet(["echo"], GooseConfig(sources=["echo"]), vocab_size=100)
        Echo.answer = answer
        pool, _ = sources.propose(DecodeContext(np.array([1, 2]), 2, 100, frozenset()))
        with caplog.at_level(logging.WARNING, logger="goose.plugins"):
            found, scores = pool.branching[0].successors(np.array([1, 2]), np.array([2, 3]), 4)
    finally:
        plugins.unregister(registrations)
    assert found.tolist() == [[-1] * 4] * 2 and scores.tolist() == [[0.0] * 4] * 2
    assert "'echo' skipped in goose_successors" in caplog.text


def test_good_successors_are_padded_and_their_scores_clamped() -> None:
    registrations = plugins.register(plugins.SourcePlugin("echo", Echo), origin="tests")
    try:
        sources = SourceSet(["echo"], GooseConfig(sources=["echo"]), vocab_size=100)
        Echo.answer = (np.array([[7, -1], [8, 9]]), np.array([[2.0, 0.5], [np.nan, -1.0]]))
        pool, _ = sources.propose(DecodeContext(np.array([1, 2]), 2, 100, frozenset()))
        found, scores = pool.branching[0].successors(np.array([1, 2]), np.array([2, 3]), 3)
    finally:
        plugins.unregister(registrations)
    assert found.tolist() == [[7, -1, -1], [8, 9, -1]]
    assert scores.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]  # clamped; NaN, negative and unknown count 0
