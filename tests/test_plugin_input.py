"""What a newcomer's first run asks for (issue 63): a typo or a bad value is refused with a message that says what
was meant, through the public doors (GooseConfig, GooseDecoder, ``goose generate``), never silently honoured.

Options checked through a source's registered options model; token ids that are not integers refused at the
plugin boundary (a fault, the output unchanged), never rounded; "did you mean" for the names a run is built from.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from pydantic import BaseModel, Field, ValidationError

import goose
from goose import plugins
from goose.config import GooseConfig, first_error
from goose.contract.candidates import DecodeContext, Draft
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
from goose_bench.methods import resolve_methods
from tests.helpers import assert_lossless

GOOSE = Path(sys.executable).with_name("goose")
PROMPT = "List the numbers from 1 to 20, separated by commas."
NEW_TOKENS = 24
CONTEXT_MATCH_OPTIONS = "ngram_sizes, max_continuation, occurrence, depth_prior, depth_edges, depth_memory"


# --- options: declared as a model, unknown keys refused with the known ones ---

@pytest.mark.parametrize(("options", "message"), [
    ({"context_match": {"max_ngram": 3}},
     f"source_options.context_match: unknown option 'max_ngram' (known: {CONTEXT_MATCH_OPTIONS}, "),
    ({"context_match": {"ngram_size": [3]}},
     f"source_options.context_match: unknown option 'ngram_size' (did you mean 'ngram_sizes'? known: "
     f"{CONTEXT_MATCH_OPTIONS}, "),
    ({"context_match": {"max_continuation": 0}},
     "source_options.context_match.max_continuation: Input should be greater than or equal to 1"),
    # a source the config does not draft from: its options are still a typo worth naming
    ({"bigram_transition": {"unigram": True}}, "source_options.bigram_transition: unknown option 'unigram' "
                                               "(did you mean 'unigram_only'? known: "),
    ({"context_mtch": {"max_continuation": 4}},
     "source_options: unknown source 'context_mtch' (did you mean 'context_match'?); registered sources: "),
])
def test_a_built_in_sources_options_are_checked_by_its_model(tiny, options: dict, message: str) -> None:
    model, tokenizer = tiny
    with pytest.raises(plugins.PluginError) as refused:
        GooseDecoder(model, tokenizer, GooseConfig(sources=["context_match"], source_options=options))
    assert message in str(refused.value)


def test_every_built_in_source_declares_its_options_model() -> None:
    for name in ("context_match", "bigram_transition", "rest", "lookahead", "suffix_memory", "prediction"):
        declared = plugins.registry().source(name).options
        assert declared is not None and issubclass(declared, BaseModel), name


class LenientOptions(BaseModel):  # pydantic's default, extra="ignore": Goose refuses unknown keys all the same
    depth: int = Field(default=2, ge=1)


class Counting:
    """Drafts nothing; remembers the options it was made with."""

    seen: ClassVar[list[dict]] = []

    def __init__(self, config: GooseConfig) -> None:
        Counting.seen.append(dict(config.options_for(type(self).name)))

    name = "counting"

    @goose.hookimpl
    def goose_propose(self, context: DecodeContext) -> Draft | None:
        return None


class Unmodelled(Counting):
    name = "unmodelled"


@pytest.fixture
def option_plugins() -> Iterator[None]:
    registrations = [*plugins.register(plugins.SourcePlugin("counting", Counting, options=LenientOptions), "tests"),
                     *plugins.register(plugins.SourcePlugin("unmodelled", Unmodelled), "tests")]
    Counting.seen.clear()
    yield
    plugins.unregister(registrations)


def test_a_plugins_options_model_refuses_unknown_keys_before_it_is_made(tiny, option_plugins) -> None:
    model, tokenizer = tiny
    with pytest.raises(plugins.PluginError, match=r"^source_options\.counting: unknown option 'deepth' \(did you mean "
                                                  r"'depth'\? known: depth\)$"):
        GooseDecoder(model, tokenizer, GooseConfig(sources=["counting"], source_options={"counting": {"deepth": 3}}))
    with pytest.raises(plugins.PluginError, match=r"source_options\.counting\.depth: Input should be greater than"):
        GooseDecoder(model, tokenizer, GooseConfig(sources=["counting"], source_options={"counting": {"depth": 0}}))
    assert Counting.seen == []  # refused before the constructor ran
    GooseDecoder(model, tokenizer, GooseConfig(sources=["counting"], source_options={"counting": {"depth": 3}}))
    assert Counting.seen == [{"depth": 3}]
    # no model declared: Goose cannot know the keys, so they reach the constructor as today
    GooseDecoder(model, tokenizer, GooseConfig(sources=["unmodelled"], source_options={"unmodelled": {"any": 1}}))
    assert Counting.seen[-1] == {"any": 1}


def test_an_options_model_must_be_a_pydantic_model() -> None:
    with pytest.raises(plugins.PluginError, match=r"source 'dicty': options must be a pydantic BaseModel subclass"):
        plugins.register(plugins.SourcePlugin("dicty", Counting, options={"depth": 2}), "tests")
    assert "dicty" not in plugins.registry().sources


def test_a_short_name_is_unique_and_options_beside_another_source_are_checked() -> None:
    known = plugins.registry().sources
    assert (known["context_match"].short_name, known["suffix_memory"].beside) == (
        "cm", {"context_match": {"search_current": False}})
    with pytest.raises(plugins.PluginError, match=r"source 'copycat': the short name 'cm' is taken"):
        plugins.register(plugins.SourcePlugin("copycat", Counting, short_name="cm"), "tests")
    with pytest.raises(plugins.PluginError, match=r"source_options\.beside_cm: unknown option 'deepth'"):
        plugins.register(plugins.SourcePlugin("beside_cm", Counting, options=LenientOptions,
                                              beside={"context_match": {"deepth": 2}}), "tests")
    assert "copycat" not in known and "beside_cm" not in known


# --- token ids that are not integers: a fault, never rounded ---

class Oracle:
    """Drafts the next tokens of plain decoding's output (``reference``), in the form ``shape`` says: integers it
    would have accepted, so a refusal is the ids' type and nothing else; floats that round down to them."""

    reference: ClassVar[list[int]] = []
    shape: ClassVar[str] = "int32"

    def __init__(self, config: GooseConfig) -> None:
        pass

    @goose.hookimpl
    def goose_propose(self, context: DecodeContext) -> Draft | None:
        done = context.tokens.shape[0] - context.prompt_length  # generated so far, the anchor the last
        ahead = np.asarray(Oracle.reference[done:done + 4])
        if not ahead.size:
            return None
        if Oracle.shape == "int32":
            return Draft.chain(ahead.astype(np.int32))
        if Oracle.shape == "uint16 draft":
            return Draft(ahead.astype(np.uint16), np.arange(-1, ahead.size - 1))
        if Oracle.shape == "float chain":
            return Draft.chain((ahead + 0.7).tolist())  # [1.5, 2.7]-style: int() would give the right ids
        if Oracle.shape == "float draft":
            return Draft(ahead + 0.7, np.arange(-1, ahead.size - 1))
        return Draft.chain(np.ones(ahead.size, dtype=bool))  # "bool chain"


@pytest.fixture
def oracle(tiny) -> Iterator[tuple[object, object]]:
    model, tokenizer = tiny
    reference = AutoregressiveDecoder(model, tokenizer).generate(PROMPT, NEW_TOKENS)
    Oracle.reference = reference.new_token_ids
    registrations = plugins.register(plugins.SourcePlugin("oracle", Oracle, initial_acceptance=0.9), "tests")
    yield tiny, reference
    plugins.unregister(registrations)


def decoded(tiny, shape: str, caplog) -> tuple[object, list[str]]:
    model, tokenizer = tiny
    Oracle.shape = shape
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="goose.plugins"):
        result = GooseDecoder(model, tokenizer, GooseConfig(sources=["oracle"], topology="chain", budget=4)).generate(
            PROMPT, NEW_TOKENS)
    return result, [record.getMessage() for record in caplog.records]


@pytest.mark.parametrize("shape", ["int32", "uint16 draft"])
def test_integer_ids_of_any_numpy_type_are_drafted(oracle, shape: str, caplog) -> None:
    tiny, reference = oracle
    result, warnings = decoded(tiny, shape, caplog)
    assert result.new_token_ids == reference.new_token_ids
    assert warnings == []
    assert result.stats.source_accepted["oracle"] >= NEW_TOKENS // 2  # the oracle is right: most of it is kept


@pytest.mark.parametrize(("shape", "fault"), [
    ("float chain", "source 'oracle' skipped in goose_propose: raised CandidateError: draft tokens must be integer "
                    "token ids, got float64 ["),
    ("float draft", "source 'oracle' skipped in goose_propose: malformed answer: CandidateError: draft tokens must be "
                    "an integer array, got float64 ["),
    ("bool chain", "source 'oracle' skipped in goose_propose: raised CandidateError: draft tokens must be integer "
                   "token ids, got bool [True, True"),
])
def test_non_integer_ids_are_a_fault_not_truncated(oracle, shape: str, fault: str, caplog) -> None:
    tiny, reference = oracle
    result, warnings = decoded(tiny, shape, caplog)
    assert result.new_token_ids == reference.new_token_ids  # lossless: plain steps in its place
    assert len(warnings) == 1 and warnings[0].startswith(fault), warnings  # logged once for the (plugin, hook)
    assert result.stats.source_tested["oracle"] == 0  # truncated, the floats would have been the right ids


# --- did you mean: sources, topologies, config fields, bench methods ---

def test_a_misspelt_source_or_topology_names_the_nearest(tiny) -> None:
    model, tokenizer = tiny
    with pytest.raises(plugins.PluginError, match=r"^unknown source 'context_mtch' \(did you mean 'context_match'\?\); "
                                                  r"registered sources: bigram_transition, context_match, "):
        GooseDecoder(model, tokenizer, GooseConfig(sources=["context_mtch"]))
    with pytest.raises(plugins.PluginError, match=r"^unknown topology 'spne' \(did you mean 'spine'\?\); registered "
                                                  r"topologies: chain, "):
        GooseDecoder(model, tokenizer, GooseConfig(topology="spne"))
    with pytest.raises(plugins.PluginError, match=r"^unknown source 'zzzz'; registered sources: "):  # nothing near
        GooseDecoder(model, tokenizer, GooseConfig(sources=["zzzz"]))


def test_a_misspelt_config_field_names_the_nearest() -> None:
    with pytest.raises(ValidationError) as refused:
        GooseConfig(budjet=8)
    assert first_error(refused.value) == "budjet: unknown GooseConfig field (did you mean 'budget'?)"
    assert refused.value.errors()[0]["type"] == "extra_forbidden"  # what the server maps to an unknown parameter
    with pytest.raises(ValidationError) as refused:
        GooseConfig().merged({"source_option": {"context_match": {}}})
    assert first_error(refused.value) == "source_option: unknown GooseConfig field (did you mean 'source_options'?)"
    with pytest.raises(ValidationError) as refused:
        GooseConfig.model_validate({"qqqq": 1})
    assert first_error(refused.value).startswith("qqqq: unknown GooseConfig field; fields: temperature, top_p, ")
    with pytest.raises(ValidationError, match="budget must be >= 1"):  # other errors read as before
        GooseConfig(budget=0)


def test_a_misspelt_bench_method_names_the_nearest() -> None:
    with pytest.raises(ValueError, match=r"^unknown method 'gose' \(did you mean 'goose'\?\): not a built-in name"):
        resolve_methods(["gose"])
    with pytest.raises(ValueError, match=r"unknown method 'cm@spne': .*unknown topology 'spne' \(did you mean "
                                         r"'spine'\?\)"):
        resolve_methods(["cm@spne"])


def test_goose_generate_says_did_you_mean() -> None:
    """The real command, as a newcomer types it: refused before any model loads."""
    ran = subprocess.run([str(GOOSE), "generate", "hi", "--sources", "context_mtch,bigram_transition"],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.strip().startswith("goose: error: unknown source 'context_mtch' (did you mean "
                                         "'context_match'?); registered sources: "), ran.stderr
    ran = subprocess.run([str(GOOSE), "generate", "hi", "--config", '{"budjet": 8}'], capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 2 and ran.stderr.strip() == (
        "goose: error: budjet: unknown GooseConfig field (did you mean 'budget'?)"), ran.stderr


# --- a source that drafts from a request's prediction: known by its registration, not by its name ---

class EchoPrediction:
    """Drafts the request's prediction from where the output stands in it (the test passes the reference output);
    counts the predictions it was shown."""

    shown: ClassVar[int] = 0

    def __init__(self, config: GooseConfig) -> None:
        pass

    @goose.hookimpl
    def goose_propose(self, context: DecodeContext) -> Draft | None:
        EchoPrediction.shown += context.prediction is not None
        done = context.tokens.shape[0] - context.prompt_length
        ahead = context.prediction[done:done + 4] if context.prediction is not None else ()
        return Draft.chain(np.asarray(ahead, dtype=np.int64)) if len(ahead) else None


def test_a_third_party_source_that_needs_a_prediction_joins_requests_that_carry_one(tiny) -> None:
    model, tokenizer = tiny
    reference = AutoregressiveDecoder(model, tokenizer).generate(PROMPT, NEW_TOKENS)
    registrations = plugins.register(plugins.SourcePlugin("echo_prediction", EchoPrediction, initial_acceptance=0.9,
                                                          needs_request="prediction"), "tests")
    try:
        decoder = GooseDecoder(model, tokenizer, GooseConfig(sources=["context_match"], topology="chain", budget=4))
        assert decoder.source_names(with_prediction=False) == ("context_match",)
        assert set(decoder.source_names(with_prediction=True)) == {"prediction", "echo_prediction", "context_match"}
        result = decoder.generate(PROMPT, NEW_TOKENS, prediction=reference.new_token_ids)
        assert_lossless(result, reference)
        assert EchoPrediction.shown > 0 and result.stats.source_accepted["prediction"] > 0
        shown = EchoPrediction.shown
        plain = decoder.generate(PROMPT, NEW_TOKENS)  # no prediction: the decoder's own sources alone
        assert "echo_prediction" not in plain.stats.source_tested and EchoPrediction.shown == shown
    finally:
        plugins.unregister(registrations)
