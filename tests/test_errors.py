"""Bad input gets a clear one-line error and a non-zero exit; a faulty plugin is skipped, output unchanged."""

from __future__ import annotations

import logging

import pytest
import torch

import goose
from goose import cli, plugins
from goose.config import GooseConfig
from goose.decoder import AutoregressiveDecoder, GooseDecoder
from goose.topologies.spine import SpineTopology


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", ""], "empty prompt"),
        (["generate", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be positive"),
        (["generate", "hi", "--model", "no-such-model"], "unknown model"),
        (["generate", "hi", "--sources", "context_match,nope"], "unknown source 'nope'"),
        (["generate", "hi", "--topology", "nope"], "unknown topology 'nope'"),
        (["generate", "hi", "--budget", "0"], "budget must be >= 1"),
        (["generate", "hi", "--budget", "many"], "--budget must be an integer or 'auto'"),
        (["generate", "hi", "--disable", "context_match", "--disable", "bigram_transition"],
         "every source is disabled"),
        (["generate", "hi", "--dtype", "int3"], "dtype"),
    ],
)
def test_cli_errors_are_one_line(argv: list[str], message: str, capsys) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("goose: error:") and message in err
    assert "\n" not in err and "Traceback" not in err


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
    def goose_acceptance(self) -> float:
        return 0.99  # claims to be the most trusted, so it would get the spine if it drafted


class GarbageSource:
    def __init__(self, config: GooseConfig) -> None:
        pass

    @goose.hookimpl
    def goose_propose(self, context):
        return goose.Draft.chain([context.vocab_size + 5, -3], 0.9)  # ids outside the vocabulary

    @goose.hookimpl
    def goose_successors(self, previous, tokens, k):
        return torch.full((tokens.shape[0], k), 10**9), torch.ones(tokens.shape[0], k)

    @goose.hookimpl
    def goose_acceptance(self) -> float:
        return 0.98  # the most trusted brancher: the planner asks it for every branch


class WrongTypeSource:
    def __init__(self, config: GooseConfig) -> None:
        pass

    @goose.hookimpl
    def goose_acceptance(self):
        return "not a number"  # treated as 0: ranked last

    @goose.hookimpl
    def goose_propose(self, context):
        return [1, 2, 3]  # not a Draft


class FaultyPlugins:
    @goose.hookimpl
    def goose_register_sources(self, register) -> None:
        register("raising", RaisingSource)
        register("garbage", GarbageSource)
        register("wrong_type", WrongTypeSource)


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


def test_faulty_plugins_are_skipped_and_output_is_unchanged(smollm2, caplog) -> None:
    plugins.register(FaultyPlugins(), origin="tests")
    config = GooseConfig(sources=["raising", "context_match", "garbage", "bigram_transition", "wrong_type"])
    decoder, result, warnings = decode_beside_ar(
        smollm2, config, "List the numbers from 1 to 20, separated by commas.", 48, caplog)
    assert decoder.sources.instances["raising"].calls == result.stats.verify_steps  # asked every cycle
    for name in ("raising", "garbage", "wrong_type"):
        assert sum(f"source {name!r} skipped in goose_propose" in w for w in warnings) == 1, warnings
    assert any("'garbage' skipped in goose_successors" in w for w in warnings)
    assert result.stats.source_reached["context_match"] > 0  # the healthy sources still drafted


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
    plugins.register(WrongHintPlugin(), origin="tests")
    prompt = "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox"
    _, _, warnings = decode_beside_ar(smollm2, GooseConfig(topology="wrong_hint_spine", budget="auto"), prompt, 40,
                                      caplog)
    assert WrongHintSpine.calls > 1  # asked on every cycle with a draft, and survived each answer
    assert sum("skipped in goose_spine_lengths" in w for w in warnings) == 1, warnings
