"""Many requests at once: every row of a batch is token-identical to its prompt's own autoregressive run.

Tiny random-weight models in float32 (the batching is the engine's mechanics; the real models' batches are
checked at scale, test_scale.py, and through the server); rows of different lengths join and leave mid-run (a
request waits for a slot, another ends at its own max_new_tokens), for the spine, chain and multi_spine
topologies, and on Gemma 3's architecture across its sliding window. The references are the suite's shared
autoregressive runs (the ``ar_reference`` fixture).
"""

from __future__ import annotations

import json

import pytest

import goose
from goose import cli, plugins
from goose.config import GooseConfig
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
from goose.cycle.verifier import CacheBudgetError
from goose.planning.budget import BudgetPlanner
from goose.planning.cost import CostCurve
from tests.helpers import CPU_CURVE, SMOLLM2_TOKENS, WINDOW_TOKENS, assert_lossless, dataset_prompts, lossless_prompts

SMOLLM2_PROMPTS = lossless_prompts("smollm2")
PROMPTS = SMOLLM2_PROMPTS[:2] + SMOLLM2_PROMPTS[3:4] + SMOLLM2_PROMPTS[6:7]  # code, a word problem, a chat
LIMITS = [SMOLLM2_TOKENS, SMOLLM2_TOKENS, 40, SMOLLM2_TOKENS]  # one row stops at its own limit, early
# the lossless runs budget on a fixed CPU-like curve, unmoved by measured times: every row drafts at any load
PINNED = {"cost_curve": CPU_CURVE, "pinned_costs": True}


def decode_staggered(decoder, prompts, limits, max_batch, late, **options):
    """Submit all but the last ``late`` prompts, step twice, then submit the rest: each request's tokens."""
    session = decoder.batch(max_batch)
    ids = [session.submit(decoder.request(p, n, **options))
           for p, n in zip(prompts[:-late], limits[:-late], strict=True)]
    outputs, results = {}, {}
    for step in range(10_000):
        if step == 2:
            ids += [session.submit(decoder.request(p, n, **options))
                    for p, n in zip(prompts[-late:], limits[-late:], strict=True)]
        for event in session.step():
            outputs.setdefault(event.request_id, []).extend(event.token_ids)
            if event.finished:
                results[event.request_id] = event.result
        if step > 2 and not session.active:
            break
    return [outputs[i] for i in ids], [results[i] for i in ids], session


@pytest.mark.parametrize("topology", ["spine", "chain", "multi_spine"])
def test_every_row_equals_its_own_autoregressive_run(tiny, ar_reference, topology) -> None:
    model, tokenizer = tiny
    references = [ar_reference(model, tokenizer, p, n).new_token_ids for p, n in zip(PROMPTS, LIMITS, strict=True)]
    decoder = GooseDecoder(model, tokenizer, GooseConfig(topology=topology), **PINNED)
    outputs, results, session = decode_staggered(decoder, PROMPTS, LIMITS, max_batch=3, late=1)
    for i, (output, result, reference) in enumerate(zip(outputs, results, references, strict=True)):
        assert output == reference, f"row {i}"  # what the events streamed
        assert len(result.stats.row_budgets) == result.stats.verify_steps
    assert_lossless(results, references, label=topology)
    assert len(references[2]) == 40 and results[2].stop_reason == "max_new_tokens"
    assert max(session.pass_rows) > 3  # rows drafted: some pass verified more than one token per row
    # Rows joined and left. Which cycle each row ends in follows the tree sizes, which follow the measured cost
    # curve (wall clock), so two rows may end in the same cycle on one machine and not on another: the batch
    # goes from 3 to something smaller, not necessarily through 2. The outputs above do not depend on it.
    sizes = {rows for result in results for rows in result.stats.batch_rows}
    assert 3 in sizes and min(sizes) < 3
    assert sum(result.stats.tau for result in results) > len(results)  # more than one token per pass, overall


def test_generate_batch_keeps_the_order_and_matches_the_autoregressive_batch(tiny, ar_reference) -> None:
    model, tokenizer = tiny
    references = [ar_reference(model, tokenizer, p, SMOLLM2_TOKENS).new_token_ids for p in PROMPTS]
    results = GooseDecoder(model, tokenizer, **PINNED).generate_batch(PROMPTS, SMOLLM2_TOKENS, max_batch=2)
    assert_lossless(results, references)
    plain = AutoregressiveDecoder(model, tokenizer).generate_batch(PROMPTS, SMOLLM2_TOKENS)  # the batched baseline
    assert [result.new_token_ids for result in plain] == references
    assert all(result.stats.tau == 1.0 for result in plain)


def test_seeded_sampling_per_row(tiny, ar_reference) -> None:
    """Each row draws with its own sampler and seed: every row is its prompt's seeded autoregressive run."""
    model, tokenizer = tiny
    prompts, options = PROMPTS[1:3], {"temperature": 0.7, "top_p": 0.9}
    references = [ar_reference(model, tokenizer, p, 48, seed=seed, **options).new_token_ids
                  for p, seed in zip(prompts, (11, 12), strict=True)]
    # a fixed budget: at T=0.7 the tiny model leaves its loops, and the CPU curve prices its doubtful drafts out
    decoder = GooseDecoder(model, tokenizer, GooseConfig(budget=8))
    session = decoder.batch(2)
    ids = [session.submit(decoder.request(p, 48, seed=seed, **options))
           for p, seed in zip(prompts, (11, 12), strict=True)]
    results = {event.request_id: event.result for event in session.run() if event.finished}
    # drafted and tested; at T=0.7 the random-weight model's draws rarely follow a draft: acceptance not required
    assert_lossless([results[i] for i in ids], references, accepted=False)
    assert [results[i].seed for i in ids] == [11, 12]


def test_a_cancelled_row_frees_its_slot_and_changes_no_other(tiny, ar_reference) -> None:
    model, tokenizer = tiny
    reference = ar_reference(model, tokenizer, PROMPTS[0], SMOLLM2_TOKENS).new_token_ids
    decoder = GooseDecoder(model, tokenizer)
    session = decoder.batch(2)
    kept = session.submit(decoder.request(PROMPTS[0], SMOLLM2_TOKENS))
    gone = session.submit(decoder.request(PROMPTS[1], SMOLLM2_TOKENS))
    waiting = session.submit(decoder.request(PROMPTS[2], 8))  # no slot: waits
    tokens = []
    for _ in range(3):
        tokens += [t for event in session.step() if event.request_id == kept for t in event.token_ids]
    assert len(session.rows) == 2 and len(session.waiting) == 1
    stopped = session.cancel(gone)
    assert stopped is not None and stopped.stop_reason == "stopped" and len(session.rows) == 1
    assert session.cancel(gone) is None  # once only
    assert session.cancel(12345) is None
    finished = {}
    for event in session.run():
        if event.request_id == kept:
            tokens += event.token_ids
        if event.finished:
            finished[event.request_id] = event.result
    assert tokens == reference
    assert finished[waiting].stop_reason in ("max_new_tokens", "eos")  # it took the freed slot


class RaisesForOnePrompt:
    """A source that raises on every call for contexts holding a marker token, and drafts nothing otherwise."""

    marker = -1

    def __init__(self, config: GooseConfig) -> None:
        self.calls = 0

    @goose.hookimpl
    def goose_propose(self, context):
        self.calls += 1
        if RaisesForOnePrompt.marker in context.tokens[: context.prompt_length]:
            raise RuntimeError("this row's plugin fails")
        return None


def test_a_plugin_that_raises_in_one_row_changes_no_row(tiny, ar_reference, caplog) -> None:
    model, tokenizer = tiny
    references = [ar_reference(model, tokenizer, p, SMOLLM2_TOKENS).new_token_ids for p in PROMPTS[:2]]
    RaisesForOnePrompt.marker = int(tokenizer.encode(PROMPTS[1], add_special_tokens=False)[0])
    registrations = goose.register(plugins.SourcePlugin("raises_for_one", RaisesForOnePrompt))
    try:
        decoder = GooseDecoder(model, tokenizer, GooseConfig(sources=["raises_for_one", "context_match",
                                                                      "bigram_transition"]))
        results = decoder.generate_batch(PROMPTS[:2], SMOLLM2_TOKENS)
    finally:
        plugins.unregister(registrations)
    assert [result.new_token_ids for result in results] == references
    assert "raises_for_one" in caplog.text and "this row's plugin fails" in caplog.text


def test_bad_requests_are_refused_where_they_are_built(tiny) -> None:
    model, tokenizer = tiny
    decoder = GooseDecoder(model, tokenizer)
    session = decoder.batch(2)
    with pytest.raises(ValueError, match="empty prompt"):
        decoder.request("   ", 8)
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.request("hello", 0)
    with pytest.raises(ValueError, match="temperature"):
        decoder.request("hello", 8, temperature=-1.0)
    with pytest.raises(ValueError, match="does not fit"):
        decoder.request(list(range(10)) * 1000, 8)
    with pytest.raises(TypeError, match="unknown generation option"):
        decoder.request("hello", 8, temprature=0.5)
    with pytest.raises(ValueError, match="max_batch"):
        GooseDecoder(model, tokenizer).batch(0)
    assert session.active == 0 and session.step() == []


def test_a_request_beyond_the_cache_budget_is_refused_and_nothing_else_changes(tiny, ar_reference) -> None:
    """Each slot holds an equal share of the cache budget: a request that could outgrow it is refused at submit
    with a clear error; the rows decoding meanwhile are untouched, even while the longest one fills its share
    (its length then bounds every row's padded tree)."""
    model, tokenizer = tiny
    decoder = GooseDecoder(model, tokenizer)
    references = [ar_reference(model, tokenizer, p, SMOLLM2_TOKENS).new_token_ids for p in PROMPTS[:2]]
    longest = max(len(decoder.encode(p)) for p in PROMPTS[:2])
    share = longest + SMOLLM2_TOKENS  # the longest row ends exactly at its share
    session = decoder.batch(2, cache_positions=2 * share)
    ids = [session.submit(decoder.request(p, SMOLLM2_TOKENS)) for p in PROMPTS[:2]]
    session.step()
    with pytest.raises(CacheBudgetError, match=f"does not fit a slot's share of the cache budget.*{share} positions"):
        session.submit(decoder.request(PROMPTS[0], share - len(decoder.encode(PROMPTS[0])) + 1))
    assert session.active == 2
    results = {event.request_id: event.result for event in session.run() if event.finished}
    assert [results[i].new_token_ids for i in ids] == references
    assert session.verifier.stack.store.shape[-2] <= share  # the cache never grew past a slot's share
    assert max(session.pass_rows) > 2  # the rows still drafted


def test_rows_sharing_one_bigram_table_stay_exact(tiny, ar_reference) -> None:
    """``batch_shared_sources``: one bigram table learns from every row; each row's output is still its own."""
    model, tokenizer = tiny
    references = [ar_reference(model, tokenizer, p, SMOLLM2_TOKENS).new_token_ids for p in PROMPTS[:3]]
    decoder = GooseDecoder(model, tokenizer, GooseConfig(batch_shared_sources=["bigram_transition"]), **PINNED)
    session = decoder.batch(2)
    ids = [session.submit(decoder.request(p, SMOLLM2_TOKENS)) for p in PROMPTS[:3]]  # the third joins when a slot frees
    results = {event.request_id: event.result for event in session.run() if event.finished}
    assert_lossless([results[i] for i in ids], references)
    slots = decoder.drafter.spare  # every row gave its sources back: the decoder's own set and one more
    assert len(slots) == 2 and any(slot.sources is decoder.sources for slot in slots)
    instances = {id(slot.sources.instances["bigram_transition"]) for slot in slots}
    assert instances == {id(decoder.drafter.shared["bigram_transition"])}  # one table behind every row
    assert decoder.generate(PROMPTS[3], SMOLLM2_TOKENS).new_token_ids == ar_reference(
        model, tokenizer, PROMPTS[3], SMOLLM2_TOKENS).new_token_ids  # a request alone drafts from the same table
    with pytest.raises(ValueError, match="batch_shared_sources names rest"):
        GooseDecoder(model, tokenizer, GooseConfig(batch_shared_sources=["rest"]))
    # the default ("auto") shares what registered itself shareable (the bigram table, not context match);
    # [] gives every row its own; a decoder without the bigram source shares nothing
    assert set(GooseDecoder(model, tokenizer).drafter.shared) == {"bigram_transition"}
    assert GooseDecoder(model, tokenizer, GooseConfig(batch_shared_sources=[])).drafter.shared == {}
    assert GooseDecoder(model, tokenizer, GooseConfig(sources=["context_match"])).drafter.shared == {}


def test_lookahead_rows_ride_in_batched_passes(tiny, ar_reference) -> None:
    """A source's auxiliary rows (Lookahead's window) ride in the batched pass beside every row's tree."""
    model, tokenizer = tiny
    references = [ar_reference(model, tokenizer, p, SMOLLM2_TOKENS).new_token_ids for p in PROMPTS[:2]]
    config = GooseConfig(sources=["context_match", "bigram_transition", "lookahead"], price_rows=False,
                         source_options={"lookahead": {"window": 4, "ngram": 3}})
    results = GooseDecoder(model, tokenizer, config, **PINNED).generate_batch(PROMPTS[:2], SMOLLM2_TOKENS, max_batch=2)
    assert_lossless(results, references)
    for result in results:  # every row's window rode its passes
        assert result.stats.auxiliary_rows >= result.stats.verify_steps
    # and Lookahead drafted from its pool (the prompt's n-grams and its window's), some of it accepted
    assert sum(result.stats.source_accepted["lookahead"] for result in results) > 0


def test_gemma3_rows_cross_the_sliding_window(tiny_gemma3, ar_reference) -> None:
    """One row runs past the tiny Gemma 3's 32-token window while a short one decodes beside it."""
    model, tokenizer = tiny_gemma3
    long = tokenizer.decode(tokenizer.encode(dataset_prompts("humaneval", 1)[0], add_special_tokens=False)[:28])
    prompts = [long, "def add(a, b):"]
    references = [ar_reference(model, tokenizer, p, WINDOW_TOKENS, chat=False).new_token_ids for p in prompts]
    for topology in ("spine", "multi_spine"):
        decoder = GooseDecoder(model, tokenizer, GooseConfig(topology=topology), chat=False, **PINNED)
        results = decoder.generate_batch(prompts, WINDOW_TOKENS)
        assert_lossless(results, references, label=topology)  # drafts kept in some row
    assert len(results[0].prompt_ids) < 32 < len(results[0].prompt_ids) + len(results[0].new_token_ids) - 8


def test_the_budget_split_is_the_single_rule_for_one_row_and_prices_the_padded_pass() -> None:
    # a CPU-like curve: every row costs
    curve = CostCurve((1, 2, 4, 8, 16, 32, 64, 128, 256),
                      tuple(ms * 1e-3 for ms in (10, 10.5, 11, 12, 14, 18, 26, 42, 74)))
    planner = BudgetPlanner(curve)

    def yields(acceptance: float, length: int, branch: float):
        return planner._yields(*planner._key(acceptance, length, branch, None))

    for acceptance, length in ((0.9, 40), (0.6, 12), (0.2, 4), (0.0, 0)):
        for extra in (0, 5):
            assert planner.divide([yields(acceptance, length, 0.3)], [extra]) == [
                planner.choose(acceptance, length, 0.3, extra_rows=extra)]
    alone = planner.choose(0.9, 40, 0.3)
    shared = planner.divide([yields(0.9, 40, 0.3)] + [yields(0.1, 4, 0.1)] * 3, [0, 0, 0, 0])
    assert len(set(shared)) == 1 and shared[0] <= alone  # every row is padded to the widest: its nodes are free
    crowded = planner.divide([yields(0.9, 40, 0.3)] * 8, [0] * 8)
    assert crowded[0] < alone  # eight rows pay eight times for every node of width
    riding = planner.divide([yields(0.9, 40, 0.3), yields(0.9, 40, 0.3)], [6, 0])
    assert riding[0] + 6 <= riding[1]  # a row's auxiliary rows take its share of the width


@pytest.mark.slow  # the CLI loads the embedded SmolLM2 by name
def test_goose_generate_prompts_prints_one_line_per_prompt_in_order(smollm2, ar_reference, tmp_path, capsys) -> None:
    model, tokenizer = smollm2
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": p, **({"max_new_tokens": 16} if i == 1 else {})})
                              for i, p in enumerate(PROMPTS[:3])) + "\n")
    assert cli.main(["generate", "--prompts", str(path), "--max-new-tokens", "24", "--max-batch", "2", "--json",
                     "--compare-ar"]) == 0
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["index"] for line in lines] == [0, 1, 2]
    for line, prompt, tokens in zip(lines, PROMPTS[:3], (24, 16, 24), strict=True):
        assert line["new_token_ids"] == ar_reference(model, tokenizer, prompt, tokens).new_token_ids
        assert line["identical_to_ar"] is True and line["text"]
    assert "3 prompts, up to 2 at once" in err and "3 of 3 identical" in err
