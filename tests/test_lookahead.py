"""The lookahead source: its n-gram pool, its Jacobi window, and the window's rows in real verify passes.

The window mechanics are checked on hand-built logits (real tensors, chosen argmaxes); the
layout of the auxiliary rows is checked against a plain forward of the sequence every row is
meant to see, on the real models; losslessness through the real decoder against the
autoregressive loop, in float32.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from pydantic import ValidationError

import goose
from goose import DecodeContext, Draft, DraftTree, GooseConfig, Harvest, PathKind, TreeBuilder, VerifyOutcome
from goose.boundary import SourceSet
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
from goose.cycle.verifier import Verifier
from goose.hookspecs import Register
from goose.plugins import BUILTIN_ORIGIN, register, registry, unregister
from goose.sources.lookahead import LookaheadOptions, LookaheadSource, NgramPool, window_layout
from tests.helpers import GEMMA3_TOKENS, SMOLLM2_TOKENS, dataset_prompts

EOS = 999
VOCAB = 1000


def make_source(**options: object) -> LookaheadSource:
    return LookaheadSource(GooseConfig(source_options={"lookahead": options}))


def make_context(tokens: list[int] | np.ndarray, eos: tuple[int, ...] = (EOS,)) -> DecodeContext:
    array = np.asarray(tokens, dtype=np.int64)
    return DecodeContext(tokens=array, prompt_length=array.shape[0], vocab_size=VOCAB, eos_token_ids=frozenset(eos))


def prefill(source: LookaheadSource, tokens: list[int]) -> None:
    source.goose_prefill(context=make_context(tokens))


def observe(source: LookaheadSource, predictions: list[int] | None, advance: int = 1) -> None:
    """One cycle's outcome for the source: ``advance`` tokens appended, and the target's greedy token at the
    newest level's cells of the window (None: the window did not ride in the pass)."""
    assert source.window is not None
    tree = DraftTree.single(7, ("lookahead",))
    nothing = np.zeros(tree.size, dtype=np.bool_)
    outcome = VerifyOutcome(tree=tree, accepted_nodes=np.zeros(0, dtype=np.int64), new_tokens=[1] * advance,
                            bonus_token=1, reached=nothing, accepted=nothing, path_kind=PathKind.BONUS,
                            harvest=Harvest.empty(1))
    on_window = None
    if predictions is not None:
        on_window = np.zeros(source.window.size, dtype=np.int64)  # older levels' predictions: unused
        on_window[source.window.shape[1] * (source.levels - 1) :] = predictions
    source.goose_observe(outcome=outcome, auxiliary_predictions=on_window)


# --- registration and options -------------------------------------------------------------------


def test_registered_as_a_built_in_source() -> None:
    registration = registry().source("lookahead")
    assert registration.origin == BUILTIN_ORIGIN and registration.factory is LookaheadSource
    assert registration.description


def test_hooks_run_through_the_plugin_boundary(caplog: pytest.LogCaptureFixture) -> None:
    sources = SourceSet(["lookahead"], GooseConfig(), vocab_size=VOCAB)
    prompt = make_context([1, 2, 3, 4, 5, 6, 1])
    sources.reset()
    sources.prefill(prompt, Harvest.empty(1))
    pool, auxiliary = sources.propose(prompt)
    assert pool.drafting[0].draft.tokens.tolist() == [2, 3, 4, 5]
    assert pool.drafting[0].acceptance == pytest.approx(0.3)  # the registered initial estimate
    assert [name for name, _ in auxiliary] == ["lookahead"] and auxiliary[0][1].tokens.shape == (28,)
    assert "skipped" not in caplog.text  # no hook raised or was refused


def test_defaults_are_the_papers_and_bad_options_are_refused() -> None:
    options = LookaheadOptions()
    assert (options.window, options.ngram, options.max_candidates) == (7, 5, 7)
    for bad in ({"window": 0}, {"ngram": 1}, {"max_candidates": 0}, {"pool_cap": 0}, {"typo": 1}):
        with pytest.raises(ValidationError):
            make_source(**bad)


# --- the window's layout ------------------------------------------------------------------------


@pytest.mark.parametrize(("window", "ngram"), [(7, 5), (4, 3), (1, 2), (5, 2), (2, 6)])
def test_window_rows_see_one_token_per_position_up_to_their_own(window: int, ngram: int) -> None:
    offsets, mask = window_layout(window, ngram)
    levels = ngram - 1
    rows = levels * window
    assert offsets.shape == (rows,) and mask.shape == (rows, rows) and mask.dtype == np.bool_
    for level in range(levels):
        for column in range(window):
            row = level * window + column
            assert int(offsets[row]) == level + column + 1
            seen = np.flatnonzero(mask[row])
            # level 0 up to this column (the causal Jacobi row), then this column's levels 1..level
            expected = [column_ for column_ in range(column + 1)] + [lv * window + column for lv in range(1, level + 1)]
            assert seen.tolist() == sorted(expected)
            # together with the anchor (offset 0): exactly one token at each position 1..own offset
            assert sorted(offsets[seen].tolist()) == list(range(1, level + column + 2))


def test_auxiliary_rows_are_the_window_and_validate() -> None:
    source = make_source(window=4, ngram=3)
    prompt = list(range(100, 140))
    prefill(source, prompt)
    rows = source.goose_auxiliary_rows(context=make_context(prompt))
    assert rows.validated(VOCAB).tokens.tolist() == rows.tokens.tolist()
    assert rows.tokens.tolist() == source.window.reshape(-1).tolist()
    assert set(rows.tokens.tolist()) <= set(prompt)  # seeded with prompt tokens
    assert rows.tokens.shape == (8,) and rows.position_offsets.tolist() == [1, 2, 3, 4, 2, 3, 4, 5]
    twin = make_source(window=4, ngram=3)
    prefill(twin, prompt)
    assert np.array_equal(twin.window, source.window)  # reproducible: a fixed seed
    other = make_source(window=4, ngram=3, seed=1)
    prefill(other, prompt)
    assert not np.array_equal(other.window, source.window)


def test_rows_before_any_prefill_start_from_the_context() -> None:
    source = make_source()
    rows = source.goose_auxiliary_rows(context=make_context([5, 6, 7]))
    assert rows.tokens.shape == (28,) and set(rows.tokens.tolist()) <= {5, 6, 7}


# --- the pool ------------------------------------------------------------------------------------


def test_pool_is_seeded_with_every_ngram_of_the_prompt() -> None:
    source = make_source(ngram=3, pool_cap=10)
    prompt = [1, 2, 3, 4, 1, 2, 5, 6, 2, 3, 7]
    prefill(source, prompt)
    expected: dict[int, set[tuple[int, ...]]] = {}
    for i in range(len(prompt) - 2):
        expected.setdefault(prompt[i], set()).add(tuple(prompt[i + 1 : i + 3]))
    assert {key: set(value) for key, value in source.pool.entries.items()} == expected
    # the anchor's n-grams are the draft, merged into a trie: (2, 3) and (2, 5) share the 2
    draft = source.goose_propose(context=make_context([*prompt, 1]), acceptance=0.3)
    assert draft is not None and draft.validated(VOCAB, 0.3).tokens.tolist() == draft.tokens.tolist()
    assert draft.tokens.tolist() == [2, 5, 3] and draft.parents.tolist() == [-1, 0, 0]
    assert source.goose_propose(context=make_context([*prompt, 42]), acceptance=0.3) is None  # no n-gram starts with 42
    assert len(make_source(pool_from_prompt=False, ngram=3).pool) == 0


def test_pool_keeps_the_most_recent_continuations_and_ranks_by_count() -> None:
    pool = NgramPool(cap=3)
    pool.add([[1, 10], [1, 11], [1, 12], [1, 11], [1, 13]])  # 10 is the least recently seen: evicted
    assert list(pool.entries[1]) == [(12,), (11,), (13,)]  # least recently seen first
    assert pool.best(1, 3) == [((11,), 2), ((13,), 1), ((12,), 1)]  # most seen, then most recent
    assert pool.best(1, 1) == [((11,), 2)] and pool.best(2, 5) == []


def test_trie_merges_prefixes_and_splits_the_estimate_by_count() -> None:
    draft = Draft.trie([(5, 6, 7), (5, 6, 8), (9, 1, 2)], [3, 1, 4], acceptance=0.5)
    assert draft is not None
    assert draft.tokens.tolist() == [5, 6, 7, 8, 9, 1, 2]
    assert draft.parents.tolist() == [-1, 0, 1, 1, -1, 4, 5]
    expected = [0.5 * 4 / 8, 0.5, 0.5 * 3 / 4, 0.5 * 1 / 4, 0.5 * 4 / 8, 0.5, 0.5]
    assert np.allclose(draft.scores, expected)
    assert Draft.trie([], [], 0.5) is None


def test_drafts_stop_before_eos_and_keep_at_most_g_candidates() -> None:
    source = make_source(ngram=4, max_candidates=2, pool_cap=5)
    source.pool.add([[3, 4, EOS, 5], [3, 6, 7, 8], [3, 9, 9, 9], [3, EOS, 1, 2]])
    draft = source.goose_propose(context=make_context([1, 3]), acceptance=0.3)
    assert isinstance(draft, Draft)
    # the two most recent: (EOS, 1, 2) drafts nothing, (9, 9, 9) everything
    assert draft.tokens.tolist() == [9, 9, 9]
    source = make_source(ngram=4, max_candidates=4, pool_cap=5)
    source.pool.add([[3, 4, EOS, 5], [3, 6, 7, 8]])
    assert make_source().goose_propose(context=make_context([3]), acceptance=0.3) is None
    assert source.goose_propose(context=make_context([1, 3]), acceptance=0.3).tokens.tolist() == [6, 7, 8, 4]


def test_output_ngrams_join_the_pool_on_request() -> None:
    source = make_source(ngram=3, pool_from_output=True, pool_from_prompt=False)
    prefill(source, [1, 2, 3])
    assert len(source.pool) == 0
    source.goose_propose(context=make_context([1, 2, 3, 4, 5]), acceptance=0.3)
    assert set(source.pool.entries) == {2, 3}  # (2, 3, 4) and (3, 4, 5): the n-grams ending in new tokens
    assert source.goose_propose(context=make_context([1, 2, 3, 4, 5, 3]), acceptance=0.3).tokens.tolist() == [4, 5]


def test_reset_clears_pool_and_window_unless_the_pool_persists() -> None:
    for persist in (False, True):
        source = make_source(ngram=3, persist_pool=persist)
        prefill(source, [1, 2, 3, 4])
        source.goose_reset()
        assert source.window is None
        assert (len(source.pool) > 0) == persist


# --- the window's Jacobi steps ----------------------------------------------------------------------


def test_one_token_advance_moves_levels_down_and_harvests_mature_columns() -> None:
    source = make_source(window=3, ngram=3, pool_from_prompt=False, pool_cap=10)
    prefill(source, list(range(100, 120)))
    start = source.window.copy()  # [2, 3]
    first = [200, 201, 202]
    observe(source, first)
    assert source.window.tolist() == [start[1].tolist(), first]
    assert len(source.pool) == 0  # columns one step old: level 1 was still a random seed
    second = [300, 301, 302]
    observe(source, second)
    assert source.window.tolist() == [first, second]
    # every column's trajectory: seed, first prediction, second prediction
    for column in range(3):
        continuations = [continuation for continuation, _ in source.pool.best(int(start[1, column]), 10)]
        assert (first[column], second[column]) in continuations
    assert len(source.pool) == 3
    assert source.harvested == 3 and source.age.tolist() == [2, 2, 2]


def test_multi_token_advance_slides_the_columns_to_the_new_anchor() -> None:
    source = make_source(window=4, ngram=3, pool_from_prompt=False)
    prompt = list(range(100, 120))
    prefill(source, prompt)
    start = source.window.copy()
    observe(source, [200, 201, 202, 203], advance=3)
    # the anchor moved 3: new cell (l, j) is old cell (l + 1, j + 2); two new columns on the right
    assert source.window[0, :2].tolist() == start[1, 2:].tolist()
    assert source.window[1, :2].tolist() == [202, 203]
    assert set(source.window[:, 2:].reshape(-1).tolist()) <= set(prompt)
    assert source.age.tolist() == [1, 1, 0, 0]
    observe(source, [1, 2, 3, 4], advance=9)  # past the window: all new
    assert source.age.tolist() == [0, 0, 0, 0]
    assert set(source.window.reshape(-1).tolist()) <= set(prompt)


def test_without_realign_the_window_shifts_one_step_whatever_was_accepted() -> None:
    source = make_source(window=4, ngram=3, pool_from_prompt=False, realign=False)
    prefill(source, list(range(100, 120)))
    start = source.window.copy()
    observe(source, [200, 201, 202, 203], advance=3)
    assert source.window.tolist() == [start[1].tolist(), [200, 201, 202, 203]]


def test_missing_rows_keep_the_window_aligned_without_a_step() -> None:
    source = make_source(window=4, ngram=3, pool_from_prompt=False)
    prefill(source, list(range(100, 120)))
    start = source.window.copy()
    observe(source, None, advance=2)
    assert source.window[:, :2].tolist() == start[:, 2:].tolist()
    assert len(source.pool) == 0 and source.age.tolist() == [0, 0, 0, 0]


# --- models: the rows' layout (tiny models), and losslessness (real ones) -------------------------------


def visible_sequence(window: np.ndarray, level: int, column: int) -> list[int]:
    """The tokens cell (level, column) is meant to see after the anchor, in position order (itself last)."""
    return [*window[0, : column + 1].tolist(), *window[1 : level + 1, column].tolist()]


def check_rows_against_plain_forwards(model: torch.nn.Module, prompt_ids: list[int], options: dict) -> None:
    """Every window row's logits equal a plain forward of context + anchor + the sequence it should see;
    the tree's own rows are unchanged by the window riding along."""
    source = make_source(**options)
    source.goose_prefill(context=make_context(prompt_ids))
    rows = source.goose_auxiliary_rows(context=make_context(prompt_ids))
    verifier = Verifier(model)
    *context, anchor = prompt_ids
    builder = TreeBuilder(anchor, ("lookahead",), capacity=4)
    builder.add_chain(0, np.array(prompt_ids[-3:-1]), 0)  # any small tree
    builder.add_children(np.array([0]), np.array([prompt_ids[1]]), 0)
    tree = builder.build()
    verifier.prefill(context)
    together = verifier.verify([tree], [[rows]])[0]
    verifier.reset()
    verifier.prefill(context)
    alone = verifier.verify([tree])[0]
    torch.testing.assert_close(together[: tree.size], alone, atol=2e-4, rtol=1e-4)
    assert torch.equal(together[: tree.size].argmax(-1), alone.argmax(-1))
    width = source.window.shape[1]
    with torch.inference_mode():
        for level in range(source.levels):
            for column in range(width):
                sequence = [*prompt_ids, *visible_sequence(source.window, level, column)]
                plain = model(input_ids=torch.tensor([sequence]), logits_to_keep=1).logits[0, -1]
                row = together[tree.size + level * width + column]
                torch.testing.assert_close(row, plain, atol=2e-3, rtol=1e-3)
                assert int(row.argmax()) == int(plain.argmax())


def test_window_rows_see_what_the_layout_says_llama(tiny) -> None:
    model, tokenizer = tiny
    prompt_ids = tokenizer("def add(a, b):\n    return a + b\n\ndef sub(a, b):")["input_ids"]
    check_rows_against_plain_forwards(model, prompt_ids, {"window": 4, "ngram": 4})


def test_window_rows_see_what_the_layout_says_gemma3_past_its_sliding_window(tiny_gemma3) -> None:
    model, tokenizer = tiny_gemma3
    window = Verifier(model).sliding_window
    assert window is not None
    text = " ".join(dataset_prompts("humaneval", 2))
    prompt_ids = tokenizer(text)["input_ids"][: window + 40]  # the rows' context crosses the sliding window
    assert len(prompt_ids) > window
    check_rows_against_plain_forwards(model, prompt_ids, {"window": 3, "ngram": 3})


class _WindowlessLookahead(LookaheadSource):
    """The lookahead source with its window kept out of the verify pass (the pool still drafts)."""

    @goose.hookimpl
    def goose_auxiliary_rows(self, context: DecodeContext) -> None:
        return None


@goose.hookimpl
def goose_register_sources(register: Register) -> None:
    register("lookahead_windowless", _WindowlessLookahead, description="test only: lookahead without its window")


@pytest.fixture(scope="module")
def windowless() -> Iterator[str]:
    registrations = register(sys.modules[__name__], origin="tests")
    yield "lookahead_windowless"
    unregister(registrations)


def decode(model, tokenizer, prompt: str, tokens: int, **config: object) -> list[int]:
    return GooseDecoder(model, tokenizer, GooseConfig(**config)).generate(prompt, tokens).new_token_ids


SMOLLM2_PROMPTS = dataset_prompts("humaneval", 1) + dataset_prompts("gsm8k", 1) + dataset_prompts("mt_bench", 1)
# the lossless suite's lengths on its own prompts: the autoregressive references are the ones it computes
SMOLLM2_LENGTH, GEMMA3_LENGTH = SMOLLM2_TOKENS, GEMMA3_TOKENS


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["chain", "spine"])
def test_lossless_on_smollm2(smollm2, ar_reference, topology: str) -> None:
    model, tokenizer = smollm2
    accepted_drafts = 0
    for prompt in SMOLLM2_PROMPTS:
        expected = ar_reference(model, tokenizer, prompt, SMOLLM2_LENGTH).new_token_ids
        result = GooseDecoder(model, tokenizer, GooseConfig(sources=["lookahead"], topology=topology)).generate(
            prompt, SMOLLM2_LENGTH)
        assert result.new_token_ids == expected
        accepted_drafts += result.stats.source_accepted["lookahead"]
    assert accepted_drafts > 0  # the pool drafted, and the target agreed


@pytest.mark.slow
def test_lossless_with_other_sources_and_without_the_window(smollm2, ar_reference, windowless: str) -> None:
    model, tokenizer = smollm2
    prompt = SMOLLM2_PROMPTS[0]
    expected = ar_reference(model, tokenizer, prompt, SMOLLM2_LENGTH).new_token_ids
    assert decode(model, tokenizer, prompt, SMOLLM2_LENGTH,
                  sources=["context_match", "lookahead", "bigram_transition"]) == expected
    # the window's rows change no output: the same source with and without them in the verify pass
    small = {"lookahead": {"window": 4, "ngram": 3}}  # the subclass reads lookahead's options too
    with_rows = decode(model, tokenizer, prompt, SMOLLM2_LENGTH, sources=["lookahead"], topology="chain",
                       source_options=small)
    without = decode(model, tokenizer, prompt, SMOLLM2_LENGTH, sources=[windowless], topology="chain",
                     source_options=small)
    assert with_rows == without == expected


@pytest.mark.slow
def test_lossless_on_gemma3(gemma3, ar_reference) -> None:
    model, tokenizer = gemma3
    prompt = dataset_prompts("humaneval", 1)[0]
    expected = ar_reference(model, tokenizer, prompt, GEMMA3_LENGTH, chat=False).new_token_ids
    result = GooseDecoder(model, tokenizer, GooseConfig(sources=["lookahead"], topology="chain"),
                          chat=False).generate(prompt, GEMMA3_LENGTH)
    assert result.new_token_ids == expected


@pytest.mark.slow
def test_the_window_never_overflows_the_context(smollm2) -> None:
    model, tokenizer = smollm2
    goose_decoder = GooseDecoder(model, tokenizer, GooseConfig(sources=["lookahead"], topology="chain"))
    plain = AutoregressiveDecoder(model, tokenizer)
    prompt = goose_decoder.encode("Write a function that adds two numbers.")
    for decoder in (goose_decoder, plain):
        decoder.verifier.max_positions = len(prompt) + 12  # the window reaches 10 positions past the anchor
    expected = plain.generate(prompt, 64)
    result = goose_decoder.generate(prompt, 64)
    assert result.new_token_ids == expected.new_token_ids and result.stop_reason == "context_full"
