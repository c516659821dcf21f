"""The cost curve t(n) measured on the real model, its cache, and the budget it leads the planner to."""

from __future__ import annotations

import json

import numpy as np
import pytest

import goose
from goose import plugins
from goose.config import GooseConfig
from goose.contract.candidates import chain_rate
from goose.cycle import calibration
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
from goose.planning import cost
from goose.planning.budget import BudgetPlanner
from goose.planning.cost import CostCurve
from tests.helpers import assert_lossless


def test_monotone_lowers_a_slow_small_size_instead_of_raising_the_rest() -> None:
    # one slow t(1) sample (a scheduler hiccup) must not make trees up to that cost look free
    measured = [0.096, 0.050, 0.052, 0.060, 0.058, 0.090]
    assert cost.monotone(measured).tolist() == [0.050, 0.050, 0.052, 0.058, 0.058, 0.090]
    assert np.all(np.diff(cost.monotone(list(np.random.default_rng(0).random(50)))) >= 0)


def test_measure_times_real_verify_passes(tiny) -> None:
    model, _ = tiny
    curve = calibration.measure(model, sizes=(1, 8, 64), rounds=2, context_length=64)
    assert curve.sizes == (1, 8, 64)
    assert all(s > 0 for s in curve.seconds)
    # interpolation between measured sizes, and relative cost per size
    assert curve.seconds[0] <= float(curve(4)) <= curve.seconds[1]
    assert curve.relative()[1] == 1.0


def test_the_curve_is_cached_per_model_and_processor(tiny, tmp_path, monkeypatch) -> None:
    model, _ = tiny
    key = cost.cache_key(model)
    assert key.startswith(f"v{cost.CURVE_FORMAT}-") and "float32" in key and "threads" in key
    monkeypatch.setattr(cost, "busy_signs", lambda curve: [])  # cached even if the suite keeps the machine busy
    first = calibration.load_or_measure(model, cache_dir=tmp_path)
    stored = tmp_path / "calibration" / f"{key}.json"
    assert json.loads(stored.read_text()) == first.to_dict()
    stored.write_text(json.dumps({"sizes": [1, 2], "seconds": [1.0, 2.0]}))  # the cache is what is read back
    assert calibration.load_or_measure(model, cache_dir=tmp_path) == CostCurve((1, 2), (1.0, 2.0))
    # refresh measures again and replaces the file (a stand-in measurement: the real one was timed above)
    remeasured = CostCurve((1, 4), (0.5, 0.6))
    assert cost.cached(stored, lambda: remeasured, refresh=True) == remeasured
    assert CostCurve.load(stored) == remeasured and first.sizes == calibration.DEFAULT_SIZES


def _curve(relative: dict[int, float], one_token: float = 0.05) -> CostCurve:
    return CostCurve(tuple(relative), tuple(one_token * r for r in relative.values()))


FLAT = _curve({1: 1.0, 16: 1.02, 64: 1.06, 128: 1.1})  # a GPU: a wide tree costs one token
STEEP = _curve({1: 1.0, 16: 4.0, 64: 16.0, 128: 32.0})  # every node costs a full token


def test_budget_follows_the_cost_curve() -> None:
    flat, steep = BudgetPlanner(FLAT), BudgetPlanner(STEEP)
    trusted_long_match = (0.9, 20, 0.2)
    assert flat.choose(*trusted_long_match) >= 32
    assert steep.choose(*trusted_long_match) <= 16
    assert flat.choose(*trusted_long_match) > steep.choose(*trusted_long_match)
    # nothing drafted and weak successors: on a steep curve a bigger tree can only lose
    assert steep.choose(0.0, 0, 0.05) <= 2


def test_budget_grows_with_trust_in_the_spine() -> None:
    middle = BudgetPlanner(_curve({1: 1.0, 8: 1.1, 16: 1.4, 32: 1.9, 64: 2.5, 128: 3.6}))
    budgets = [middle.choose(p_s, 20, 0.15) for p_s in (0.2, 0.5, 0.8, 0.95)]
    assert budgets == sorted(budgets) and budgets[-1] > budgets[0]


def test_budget_reads_per_depth_estimates() -> None:
    middle = BudgetPlanner(_curve({1: 1.0, 8: 1.1, 16: 1.4, 32: 1.9, 64: 2.5, 128: 3.6}))
    # one rate and the same rate spelt per depth are the same plan
    assert middle.choose((0.8, 0.8, 0.8), 40, 0.15) == middle.choose(0.8, 40, 0.15)
    # a copy whose first tokens are doubtful but which holds once it has held (copy depth) earns a
    # longer tree than its first-token rate alone, and a shorter one than the deep rate alone
    rising = (0.6, 0.6, 0.6, 0.99)
    assert middle.choose(0.6, 40, 0.15) < middle.choose(rising, 40, 0.15) <= middle.choose(0.99, 40, 0.15)
    # the estimate beyond the draft's end does not matter
    assert middle.choose((0.6, 0.6, 0.05), 2, 0.15) == middle.choose(0.6, 2, 0.15)


def test_a_real_change_of_overhead_re_plans_and_noise_does_not() -> None:
    """The decoder's own time per cycle is part of the price: a slower decoder earns bigger trees. The
    cached choice is re-evaluated when the overhead moves by more than a tenth of one token's verify,
    not on every wobble of the running mean around a grid line."""
    planner = BudgetPlanner(_curve({1: 1.0, 2: 1.05, 4: 1.15, 8: 1.35, 16: 1.7, 32: 2.4, 64: 3.8, 128: 6.6}))
    planner.overhead_s = 0.0
    lean = planner.choose(0.0, 0, 0.3)
    planner.overhead_s = 0.004  # 0.08 of one token's verify (0.05 s): the same plan, from the cache
    assert planner.choose(0.0, 0, 0.3) == lean and planner._choose.cache_info().hits == 1
    planner.overhead_s = 0.05  # a whole token's verify more per cycle
    assert planner.choose(0.0, 0, 0.3) > lean


def test_a_curve_calibrated_on_a_busy_machine_is_rescaled_by_the_real_passes() -> None:
    """A curve measured while the machine was 30x slower keeps its shape but would make the real
    per-cycle overhead look free (smaller trees than pay); the passes observed rescale it, and the
    plan becomes the one the true curve gives."""
    shape = {1: 1.0, 2: 1.05, 4: 1.15, 8: 1.35, 16: 1.7, 32: 2.4, 64: 3.8, 128: 6.6}
    true_curve = _curve(shape)  # 0.05 s a token
    stale = CostCurve(true_curve.sizes, tuple(30 * s for s in true_curve.seconds))
    right, wrong = BudgetPlanner(true_curve), BudgetPlanner(stale)
    for planner in (right, wrong):
        planner.overhead_s = 0.05  # the host's own time a cycle, as measured
    assert right.choose(0.0, 0, 0.3) > wrong.choose(0.0, 0, 0.3)
    for rows in (1, 4, 8, 16) * 20:  # the passes really run cost what the true curve says
        wrong.observe_pass(1, rows, float(true_curve(rows)))
    assert wrong.scale == pytest.approx(1 / 30, rel=0.01)
    assert wrong.choose(0.0, 0, 0.3) == right.choose(0.0, 0, 0.3)
    # the corrected curve is the true one, in real seconds
    np.testing.assert_allclose(wrong.curve.seconds, true_curve.seconds, rtol=0.01)
    assert wrong.expected_rate(8, 0.5, 8, 0.3) == pytest.approx(right.expected_rate(8, 0.5, 8, 0.3), rel=0.01)


def test_the_live_curve_takes_medians_and_corrects_each_size_it_sees() -> None:
    """One pass slowed 100 times (a page fault, a neighbour's burst) moves nothing; passes of one size that
    keep costing 40% more than calibrated correct that size, the sizes around it keep the curve's shape
    rescaled by the median of all passes, and the curve stays non-decreasing."""
    shape = {1: 1.0, 2: 1.05, 4: 1.15, 8: 1.35, 16: 1.7, 32: 2.4}
    planner = BudgetPlanner(_curve(shape))
    for _ in range(10):
        planner.observe_pass(1, 1, 0.05)
    planner.observe_pass(1, 1, 5.0)
    assert planner.curve.seconds[0] == pytest.approx(0.05)
    for _ in range(30):
        planner.observe_pass(1, 8, 1.4 * 0.05 * 1.35)
    corrected = dict(zip(planner.curve.sizes, planner.curve.seconds, strict=True))
    assert corrected[8] == pytest.approx(1.4 * 0.05 * 1.35)
    assert corrected[1] == pytest.approx(0.05)  # its own passes: 11 of them, median 0.05
    assert corrected[16] == pytest.approx(1.4 * 0.05 * 1.7)  # the recent passes' median ratio, 1.4
    assert np.all(np.diff(planner.curve.seconds) >= 0)
    pinned = BudgetPlanner(_curve(shape), pinned=True)
    pinned.observe_pass(1, 8, 10.0)
    assert pinned.curve.seconds == _curve(shape).seconds


LINEAR = _curve({n: float(n) for n in (1, 2, 4, 8, 16, 32, 64, 128)})  # every row a full token: no tree can pay


def test_a_row_more_where_the_kernels_make_it_cheaper() -> None:
    """Budgets land on every size the curve was measured at: on a curve where 16 rows cost less than 15 (a kernel
    that takes rows in blocks, as llama.cpp's here), a long trusted chain gets 15 draft nodes and the anchor."""
    blocky = CostCurve(tuple(range(1, 21)), tuple(0.03 * r for r in (
        1.0, 1.93, 2.54, 3.15, 3.84, 4.47, 5.14, 5.0, 5.97, 6.27, 6.92, 6.88, 7.69, 8.48, 9.03, 7.44, 8.91, 9.07,
        10.13, 10.22)))
    planner = BudgetPlanner(blocky, max_budget=19)
    assert set(range(1, 20)) == set(planner.candidates)
    assert planner.choose((0.98,), 40, 0.0) == 15


def test_no_tree_where_none_pays() -> None:
    """Budget 0 (the anchor alone) is a candidate: where n rows cost n tokens no tree yields more tokens a
    second than plain decoding, however good the draft; where rows are cheap the same draft gets a tree. A
    pinned planner (a study's) lays its best tree whatever it costs: it measures the sources."""
    assert BudgetPlanner(LINEAR, pinned=True).choose(0.1, 40, 0.1) > 0
    planner = BudgetPlanner(LINEAR)
    assert planner.choose(0.95, 40, 0.5) == 0
    assert planner.choose((0.97, 0.9), 40, 0.0) == 0
    assert BudgetPlanner(STEEP).choose(0.1, 40, 0.1) == 0  # weak drafts on a steep curve
    assert BudgetPlanner(STEEP).choose(0.95, 40, 0.1) > 0
    assert BudgetPlanner(FLAT).choose(0.1, 40, 0.1) > 0


class CountingCopy:
    """Drafts the 8 tokens that followed the anchor's latest earlier occurrence, and counts its proposals."""

    calls = 0

    def __init__(self, config: goose.GooseConfig) -> None:
        pass

    @goose.hookimpl
    def goose_propose(self, context: goose.DecodeContext) -> goose.Draft | None:
        CountingCopy.calls += 1
        earlier = np.flatnonzero(context.tokens[:-1] == context.anchor)
        copied = context.tokens[earlier[-1] + 1 : earlier[-1] + 9] if earlier.size else context.tokens[:0]
        return goose.Draft.chain(copied.copy()) if copied.size else None


def test_a_decoder_lays_no_tree_where_none_pays_rests_and_probes(tiny) -> None:
    """On a curve where every row costs a token, the real decoder decodes plainly (budget 0); after a drafted
    cycle without a tree its row rests REST cycles (the sources are not even asked: plain decoding's cost),
    and now and then a one-node probe tests the draft. The output stays greedy."""
    from goose.cycle.drafting import REST

    model, tokenizer = tiny
    prompt = "Repeat after me: one two three four five six seven. One two three four five six seven."
    reference = AutoregressiveDecoder(model, tokenizer).generate(prompt, 60).new_token_ids
    registrations = goose.register(plugins.SourcePlugin("counting_copy", CountingCopy, initial_acceptance=0.9))
    try:
        CountingCopy.calls = 0
        decoder = GooseDecoder(model, tokenizer, GooseConfig(sources=["counting_copy"]), cost_curve=LINEAR)
        result = decoder.generate(prompt, 60)
    finally:
        plugins.unregister(registrations)
    assert result.new_token_ids == reference
    budgets = result.stats.row_budgets
    assert budgets.count(0) > len(budgets) / 2 and budgets.count(1) >= 1  # plain steps, and probes
    assert sum(result.stats.source_tested.values()) >= budgets.count(1)  # the probes' nodes were tested
    # a drafted cycle that lays no tree is followed by REST plain ones: the source is not asked in those (the
    # live curve, corrected by the tiny model's nearly flat passes, may come to lay a tree later: not counted)
    assert CountingCopy.calls <= len(budgets) - REST * (budgets.count(0) // (2 * (REST + 1)))
    assert result.stats.verify_steps == len(budgets)


class Overclaiming:
    """Drafts 8 tokens the target never says, each "0.95 likely" by the draft's own word (``depth_acceptance``)."""

    wrong = 0

    def __init__(self, config: goose.GooseConfig) -> None:
        pass

    @goose.hookimpl
    def goose_propose(self, context: goose.DecodeContext) -> goose.Draft | None:
        return goose.Draft.chain(np.full(8, Overclaiming.wrong), depth_acceptance=(0.95,))


def test_a_source_whose_trees_keep_losing_is_trusted_as_far_as_they_give(tiny) -> None:
    """A draft's estimate is its source's word; the planner sets every tree it laid against what the tree kept. On a
    curve where a 0.95 promise pays for a tree, a source that says 0.95 and is never right gets its first trees,
    then only the probes: its trust falls to what its trees give (none), and the row decodes as plainly as the
    engine. Taken at its word it would have laid a tree every step. Lossless either way."""
    model, tokenizer = tiny
    prompt = "Repeat after me: one two three four five six seven. One two three four five six seven."
    reference = AutoregressiveDecoder(model, tokenizer).generate(prompt, 60)
    Overclaiming.wrong = next(t for t in range(model.config.vocab_size - 1, 0, -1) if t not in reference.new_token_ids)
    assert BudgetPlanner(STEEP).choose((0.95,), 8, 0.0) > 0  # at its word, a tree pays on this curve
    registrations = goose.register(plugins.SourcePlugin("overclaiming", Overclaiming, initial_acceptance=0.95))
    try:
        decoder = GooseDecoder(model, tokenizer, GooseConfig(sources=["overclaiming"]), cost_curve=STEEP)
        result = decoder.generate(prompt, 60)
    finally:
        plugins.unregister(registrations)
    assert_lossless(result, reference, accepted=False)
    stats = result.stats
    assert stats.trees_kept == stats.trees_laid  # each tree kept the bonus token alone
    budgets = stats.row_budgets
    # its first trees, a few one-node probes, and trees as small as the live curve (the tiny model's nearly flat
    # passes) makes worth even a small share of its word; at its word, a tree every step
    assert 1 <= stats.trees_laid <= len(budgets) // 4, budgets
    assert 0 in budgets[:8], budgets
    assert stats.to_dict()["trees"] == {"laid": stats.trees_laid, "kept_tau": 1.0,
                                        "promised_tau": round(stats.trees_promised / stats.trees_laid, 3)}
    assert decoder.budget_planner.trust["overclaiming"].scale < 0.2


def test_chain_rate_is_accepted_over_tested() -> None:
    assert chain_rate((0.5,), 10) == pytest.approx(0.5)
    # reach 0.5, 0.5, 0.5: accepted 1.5 of 2 tested tokens
    assert chain_rate((0.5, 1.0), 3) == pytest.approx(0.75)
    assert chain_rate((0.9, 0.8, 0.7), 2) == pytest.approx((0.9 + 0.72) / 1.9)


def test_expected_rate_is_yield_over_time() -> None:
    planner = BudgetPlanner(STEEP)
    planner.overhead_s = 0.0
    # a budget of 0 extra nodes verifies the anchor alone: one token per t(1)
    assert planner.expected_rate(0, 0.5, 10, 0.1) == pytest.approx(1 / STEEP.seconds[0])
    # without branches a budget of n is a chain: (1 + sum_{i<=n} p^i) tokens in t(n + 1)
    for n in (1, 4, 8, 16):
        tokens = 1 + sum(0.9**i for i in range(1, n + 1))
        assert planner.expected_rate(n, 0.9, 20, 0.0) == pytest.approx(tokens / float(STEEP(n + 1)))


def test_the_chosen_budget_is_the_fastest_chain_worked_out_by_hand() -> None:
    # trees of up to 8 rows cost one token, then every 8 more rows cost another: for a chain at p = 0.9
    # (no branches), budget 6 yields 5.22 tokens a pass in t, budget 7 (8 rows with the anchor, a budget the
    # planner has because the curve was measured at 8) 5.70 in t, budget 8 6.13 in 1.125 t (5.45 per t),
    # budget 10 6.86 in 1.375 t (4.99): 7 is the fastest
    planner = BudgetPlanner(_curve({1: 1.0, 8: 1.0, 16: 2.0, 32: 4.0, 64: 8.0, 128: 16.0}))
    planner.overhead_s = 0.0
    assert planner.choose(0.9, 20, 0.0) == 7


def test_a_decoder_plans_with_a_given_curve(tiny, tmp_path) -> None:
    """``cost_curve`` (as ``goose bench --cost-curve`` prices) steers the real decoder; the output stays greedy."""
    model, tokenizer = tiny
    path = tmp_path / "curve.json"
    path.write_text(json.dumps(FLAT.to_dict()))
    assert CostCurve.load(path) == FLAT
    prompt = "Repeat after me: one two three four five six seven. One two three four five six seven."
    reference = AutoregressiveDecoder(model, tokenizer).generate(prompt, 40).new_token_ids
    sizes = {}
    for name, curve in (("flat", CostCurve.load(path)), ("steep", STEEP)):
        decoder = GooseDecoder(model, tokenizer, cost_curve=curve)
        assert decoder.budget_planner.curve is curve
        result = decoder.generate(prompt, 40)
        assert result.new_token_ids == reference
        sizes[name] = np.mean(result.stats.tree_sizes)
    assert sizes["flat"] > sizes["steep"]


@pytest.mark.slow  # SmolLM2 copying a periodic text for 96 tokens: a real model's behaviour
def test_a_repeating_run_is_drafted_past_the_context_end_and_trusted_by_depth(smollm2) -> None:
    """Context match on periodic text: the copy repeats the run instead of stopping at the context's
    end, the deep-match estimate (reported after proposing) learns that such copies hold, and the
    output stays the greedy one."""
    model, tokenizer = smollm2
    week = "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday,"
    prompt = f"{week} {week} Monday,"
    reference = AutoregressiveDecoder(model, tokenizer, chat=False).generate(prompt, 96).new_token_ids
    runs = {}
    for repeat in (True, False):
        decoder = GooseDecoder(model, tokenizer, cost_curve=FLAT, chat=False,
                               source_options={"context_match": {"repeat_runs": repeat}})
        result = decoder.generate(prompt, 96)
        assert result.new_token_ids == reference
        runs[repeat] = (decoder.sources.instances["context_match"], result.stats)
    source, stats = runs[True]
    assert max(stats.accepted_lengths) > 15  # more than one period (14 tokens) in a pass
    assert stats.verify_steps < runs[False][1].verify_steps
    deep = int(source.by_depth.bins(np.array([32]))[0])
    assert source.by_depth.tested[deep:].sum() > 0  # draft tokens were tested at copy depths >= 32
    assert (source.by_depth.rates[deep:] > source.by_depth.prior[deep:]).any()  # and learned to hold


def test_one_pass_over_the_budgets_equals_the_optimum_per_budget() -> None:
    """``spine_yields`` (every candidate budget at once) is ``best_spine_tree`` budget by budget, and the
    planner's choice from it is the one the per-budget rates give (the first of the fastest)."""
    from goose.planning.allocation import best_spine_tree, spine_yields
    from goose.planning.budget import CANDIDATE_BUDGETS

    generator = np.random.default_rng(0)
    planner = BudgetPlanner(_curve({1: 1.0, 8: 1.1, 16: 1.4, 32: 1.9, 64: 2.5, 128: 3.6}))
    for trial in range(150):
        depths = int(generator.integers(1, 8))
        on_grid = np.round(generator.random(depths) * 50) / 50  # the planner's cache grid (0.02)
        p_s = tuple(on_grid.tolist()) if trial % 2 else float(on_grid[0])
        p_t = 0.0 if trial % 5 == 0 else round(float(generator.random()) * 30) / 50
        length = int(generator.integers(0, 140))
        budgets = planner.candidates  # CANDIDATE_BUDGETS and those landing on the curve's sizes (7, 15, 31, ...)
        assert set(CANDIDATE_BUDGETS) <= set(budgets) and {7, 15, 31, 63, 127} <= set(budgets)
        caps = tuple(min(length, int(c)) for c in generator.integers(0, 140, len(budgets)))
        max_depth = int(generator.integers(1, 8))
        one_pass = spine_yields(p_s, p_t, budgets, caps, max_depth)
        per_budget = [best_spine_tree(p_s, p_t, n, max_depth, max_spine=cap).expected_tau
                      for n, cap in zip(budgets, caps, strict=True)]
        np.testing.assert_allclose(one_pass, per_budget, rtol=0, atol=1e-12)
        rates = [planner.expected_rate(n, p_s, cap, p_t) for n, cap in zip(budgets, caps, strict=True)]
        best = max(range(len(rates)), key=rates.__getitem__)
        chosen = budgets[best] if rates[best] > planner.expected_rate(0, p_s, length, p_t) else 0
        assert planner.choose(p_s, length, p_t, caps) == chosen


@pytest.mark.slow
def test_goose_calibrate_prints_and_plots_the_curve(tmp_path) -> None:
    import subprocess
    import sys

    picture = tmp_path / "curve.png"
    shown = subprocess.run([sys.executable, "-m", "goose", "calibrate", "--model", "smollm2-135m", "--dtype", "float32",
                            "--threads", "1", "--json", "--plot", str(picture)],
                           capture_output=True, text=True, timeout=600)
    curve = json.loads(shown.stdout)
    # exit status 1: measured on a busy machine, cached with its signs (one line on stderr says so)
    assert shown.returncode == (0 if curve["cached"] else 1), shown.stderr
    assert curve["sizes"][0] == 1 and len(curve["sizes"]) == len(curve["seconds"])
    assert curve["relative"]["1"] == 1.0 and all(s > 0 for s in curve["seconds"])
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_passes_that_contradict_the_cached_curve_correct_it_on_disk(tiny, tmp_path, monkeypatch) -> None:
    """A cached curve 30 times slower than the passes really run (calibrated under a load that has gone) is
    corrected in the cache once a decoder's passes have contradicted it, and the next decoder plans on
    the corrected curve."""
    model, tokenizer = tiny
    monkeypatch.setenv("GOOSE_CACHE", str(tmp_path))
    monkeypatch.setattr(cost, "busy_signs", lambda curve: [])  # cached even if the suite keeps the machine busy
    monkeypatch.setattr(calibration, "busy_now", lambda: False)  # the suite's other worker must not hold the save
    true = calibration.load_or_measure(model)
    path = cost.curve_path(model)
    stale = CostCurve(true.sizes, tuple(30 * s for s in true.seconds), true.meta)
    stale.save(path)
    decoder = GooseDecoder(model, tokenizer)
    for prompt in ("Repeat after me: one two three four five six seven.", "The quick brown fox jumps over",
                   "def add(a, b):\n    return a + b\n\ndef sub(a, b):"):
        decoder.generate(prompt, 80)  # 64 passes or more in all: enough to contradict a calibration
    corrected = CostCurve.load(path)
    assert corrected.seconds[0] < stale.seconds[0] / 5
    assert corrected.meta is not None and "corrected by" in corrected.meta.note
    assert GooseDecoder(model, tokenizer).budget_planner.curve == corrected
