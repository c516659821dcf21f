"""The four built-in planners on real CandidatePools: real Drafts and a real (table) successor source.

The successor source is a deterministic bigram table: (previous, token) picks a row of a seeded
random table of successor tokens with decreasing conditional scores, answering as the plugin
boundary hands successors to planners (int64 [m, k] with -1 / 0 for unknown, scores best first).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goose import CandidatePool, Draft, DraftTree, GooseConfig, SourceCandidates
from goose.boundary import TopologyPlanner
from goose.planning.allocation import best_spine_tree
from goose.plugins import BUILTIN_ORIGIN, registry
from goose.topologies.chain import ChainTopology
from goose.topologies.isotropic import IsotropicTopology
from goose.topologies.spine import SpineOptions, SpineTopology, spine_length
from goose.topologies.toolkit import harmonic_split
from goose.topologies.transition_tree import TransitionTreeTopology, static_template
from tests.helpers import TransitionTable, check_tree, random_drafts

PLANNERS = {
    "spine": SpineTopology,
    "chain": ChainTopology,
    "isotropic": IsotropicTopology,
    "transition_tree": TransitionTreeTopology,
}
ANCHOR, PREVIOUS = 3, 2


def make_pool(
    draft: Draft | None = None,
    acceptance: float = 0.5,
    table: TransitionTable | None = None,
    extra: tuple[SourceCandidates, ...] = (),
) -> CandidatePool:
    """A pool of a context-match-like drafting source and a transition-like branching source."""
    names = ("context_match", "bigram_transition", *(c.name for c in extra))
    candidates = (
        SourceCandidates("context_match", 0, acceptance, draft, None),
        SourceCandidates("bigram_transition", 1, 0.04, None, table),
        *extra,
    )
    return CandidatePool(ANCHOR, PREVIOUS, names, tuple(c for c in candidates if c.draft or c.successors))


def spine_draft(length: int = 20, score: float = 0.8, consensus: int = 0, start: int = 500) -> Draft:
    return Draft.chain(np.arange(start, start + length), score, consensus=consensus)


def spine(**options: object) -> GooseConfig:
    """A config with the spine topology's ``options``."""
    return GooseConfig(topology_options={"spine": options})


TIERS = spine(split="tiers")  # the paper's spine share B * r, which most rule tests pin down


def plan(name: str, pool: CandidatePool, budget: int, config: GooseConfig | None = None) -> DraftTree:
    config = config or TIERS
    return PLANNERS[name](config).goose_plan_tree(pool=pool, budget=budget, config=config)


def spine_of(tree: DraftTree) -> list[int]:
    return tree.tokens[tree.on_spine].tolist()


def branch_sizes(tree: DraftTree) -> list[int]:
    """Off-spine nodes hanging from each spine node (the anchor first), by nearest spine ancestor."""
    spine_nodes = [0, *np.flatnonzero(tree.on_spine).tolist()]
    owner = np.zeros(tree.size, dtype=np.int64)
    for node in range(1, tree.size):  # test code: a plain loop is clearest
        parent = int(tree.parents[node])
        owner[node] = node if bool(tree.on_spine[node]) else owner[parent]
    off_spine = ~tree.on_spine
    off_spine[0] = False
    return [int((owner[off_spine] == s).sum()) for s in spine_nodes]


# --- registry --------------------------------------------------------------------------------


def test_registry_lists_the_four_planners_as_built_in() -> None:
    topologies = registry(refresh=True).topologies
    for name in PLANNERS:
        assert name in topologies, f"{name} is not registered"
        assert topologies[name].origin == BUILTIN_ORIGIN
        assert topologies[name].description


@pytest.mark.parametrize("name", list(PLANNERS))
def test_planner_runs_through_pluggy(name: str) -> None:
    config = GooseConfig(topology=name)
    pool = make_pool(spine_draft(), table=TransitionTable())
    tree = TopologyPlanner(name, config, vocab_size=1000).plan(pool, 16)
    assert isinstance(tree, DraftTree)
    check_tree(tree, 16, pool)
    assert tree.draft_size > 0


# --- invariants on random pools ---------------------------------------------------------------


@st.composite
def random_cases(draw: st.DrawFn) -> tuple[CandidatePool, int, GooseConfig]:
    vocab = draw(st.sampled_from([5, 30, 500]))  # small vocabularies force dedup collisions
    draft = draw(random_drafts(vocab))
    table = None
    if draw(st.booleans()) or draft is None:
        table = TransitionTable(vocab=vocab, width=min(vocab, 10), seed=draw(st.integers(0, 50)),
                                first=draw(st.floats(0.05, 1.0)), holes=draw(st.sampled_from([0.0, 0.3, 0.9])))
    extra = ()
    if draw(st.booleans()):  # a third source that both drafts and branches, less trusted
        second = draw(random_drafts(vocab))
        extra = (SourceCandidates("third", 2, 0.01, second, TransitionTable(vocab=vocab, width=min(vocab, 10),
                                                                             seed=99, first=0.3)),)
    pool = make_pool(draft, draw(st.floats(0.0, 1.0)), table, extra)
    top_k = draw(st.integers(1, 10))
    config = GooseConfig(
        max_depth=draw(st.integers(1, 6)),
        min_score=draw(st.sampled_from([0.0, 0.01, 0.2])),
        topology_options={
            "spine": {"branch_ratio": draw(st.sampled_from([0.0, 0.5, 1.0])), "branch_top_k": top_k,
                      "branches": draw(st.booleans()), "consensus_bypass": draw(st.booleans())},
            "isotropic": {"k": draw(st.integers(1, 5))}, "transition_tree": {"fan_out": top_k}},
    )
    return pool, draw(st.integers(0, 80)), config


@pytest.mark.parametrize("name", list(PLANNERS))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=random_cases())
def test_random_pools_keep_the_budget_and_tree_invariants(name: str, case: tuple) -> None:
    pool, budget, config = case
    tree = plan(name, pool, budget, config)
    check_tree(tree, budget, pool)


# --- spine ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("acceptance", "ratio"), [(0.1, 0.15), (0.3, 0.30), (0.5, 0.50)])
@pytest.mark.parametrize("budget", [16, 60])
def test_spine_length_follows_the_tier_ratio(acceptance: float, ratio: float, budget: int) -> None:
    draft = spine_draft(length=40)
    tree = plan("spine", make_pool(draft, acceptance, TransitionTable()), budget)
    expected = max(1, int(budget * ratio + 0.5))
    assert spine_of(tree) == draft.tokens[:expected].tolist()
    assert tree.draft_size == budget  # the rest of the budget went to branches


def test_spine_nodes_come_from_the_most_trusted_drafting_source() -> None:
    weaker = SourceCandidates("weak_draft", 2, 0.01, spine_draft(start=900), None)
    pool = make_pool(spine_draft(), 0.5, TransitionTable(), extra=(weaker,))
    tree = plan("spine", pool, 16)
    spine = np.flatnonzero(tree.on_spine)
    assert spine.shape[0] == 8
    assert set(tree.source_ids[spine].tolist()) == {0}
    assert set(tree.source_ids[~tree.on_spine][1:].tolist()) == {1}  # branches: the branching source
    assert not set(range(900, 920)) & set(tree.tokens.tolist())  # the less trusted draft is not used


def test_consensus_stretches_the_spine_beyond_the_tier() -> None:
    # tier r=0.15 at budget 16 gives 2 spine nodes; five agreeing tokens stretch it to 5
    tree = plan("spine", make_pool(spine_draft(consensus=5), 0.1, TransitionTable()), 16)
    assert len(spine_of(tree)) == 5
    assert spine_length(16, 0.15, 5, available=3) == 3  # never past the draft


def test_consensus_bypass_lays_the_linear_spine_alone() -> None:
    draft = spine_draft(length=12, consensus=9)
    tree = plan("spine", make_pool(draft, 0.1, TransitionTable()), 16)
    assert spine_of(tree) == draft.tokens.tolist()  # as long as the match goes, not capped at B*r
    assert bool(tree.on_spine[1:].all())
    assert tree.parents.tolist() == list(range(-1, 12))
    long_tree = plan("spine", make_pool(spine_draft(length=30, consensus=9), 0.1, TransitionTable()), 16)
    assert long_tree.draft_size == 16 and bool(long_tree.on_spine[1:].all())  # ... up to the budget


def test_bypass_ablation_builds_the_tree_instead() -> None:
    config = spine(consensus_bypass=False)
    tree = plan("spine", make_pool(spine_draft(length=12, consensus=9), 0.1, TransitionTable()), 16, config)
    assert len(spine_of(tree)) == 9  # still stretched to the consensus
    assert tree.draft_size == 16 and int((~tree.on_spine[1:]).sum()) == 7


@pytest.mark.parametrize("case", [
    dict(length=20, acceptance=0.5, consensus=0, table=True),   # tier r=0.5
    dict(length=20, acceptance=0.1, consensus=5, table=True),   # r=0.15 stretched to the consensus
    dict(length=6, acceptance=0.9, consensus=0, table=True),    # a draft shorter than B*r
    dict(length=30, acceptance=0.3, consensus=9, table=True),   # consensus bypass: spine alone
    dict(length=30, acceptance=0.3, consensus=0, table=False),  # no branching source: spine alone
    dict(length=0, acceptance=0.5, consensus=0, table=True),    # no draft: no spine
])
@pytest.mark.parametrize("split", ["tiers", "optimal"])
def test_spine_length_hint_is_the_spine_the_planner_lays(case: dict, split: str) -> None:
    # --budget auto values each budget by the tree the topology will lay; the hint must be that tree's spine
    draft = spine_draft(length=case["length"], consensus=case["consensus"]) if case["length"] else None
    pool = make_pool(draft, case["acceptance"], TransitionTable() if case["table"] else None)
    config = spine(split=split)
    budgets = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
    hints = SpineTopology(config).goose_spine_lengths(pool=pool, budgets=budgets, config=config)
    assert hints == tuple(int(plan("spine", pool, budget, config).on_spine.sum()) for budget in budgets)


def test_the_optimal_split_lays_a_trusted_copy_whole_and_keeps_a_doubtful_one_short() -> None:
    """split="optimal": the spine is the best spine tree's, not the paper's share B*r."""
    optimal = spine(split="optimal")
    trusted = make_pool(spine_draft(length=40, score=0.95), 0.95, TransitionTable())
    assert len(spine_of(plan("spine", trusted, 48))) == 24  # the tier r = 0.5: 24 spine, 24 weak branches
    tree = plan("spine", trusted, 48, optimal)
    assert spine_of(tree) == list(range(500, 540))  # the whole copy; the 8 nodes left go to branches
    check_tree(tree, 48, trusted)
    doubtful = make_pool(spine_draft(length=40, score=0.3), 0.3, TransitionTable())
    expected = best_spine_tree(0.3, 0.04, 48, GooseConfig().max_depth, max_spine=40).spine_len
    assert len(spine_of(plan("spine", doubtful, 48, optimal))) == max(1, expected) < 40


def test_planners_without_a_spine_rule_give_no_hint() -> None:
    planner = TopologyPlanner("chain", GooseConfig(), vocab_size=1000)
    assert planner.spine_lengths(make_pool(spine_draft(), 0.5, TransitionTable()), (4, 8)) is None


def path_scores(tree: DraftTree, table: TransitionTable) -> np.ndarray:
    """Every node's path score under ``table`` (the anchor 1), for trees without a spine."""
    scores = np.ones(tree.size)
    for node in range(1, tree.size):
        parent = int(tree.parents[node])
        previous = int(tree.tokens[tree.parents[parent]]) if parent > 0 else PREVIOUS
        scores[node] = scores[parent] * table.score(previous, int(tree.tokens[parent]), int(tree.tokens[node]))
    return scores


def test_no_context_match_gives_the_best_first_transition_tree() -> None:
    """The whole budget to the best path scores among the successors, wherever they sit (not TR's fixed
    slots): no successor left out of the tree outscores a node in it."""
    table = TransitionTable(first=0.9, decay=0.1)  # a sure first successor, the others far behind
    pool = make_pool(None, 0.5, table)
    config = GooseConfig()
    tree = plan("spine", pool, 40, config)
    assert tree.draft_size == 40 and not bool(tree.on_spine.any())
    scores = path_scores(tree, table)
    weakest = scores[1:].min()
    for node in range(tree.size):  # every candidate child not laid scores no higher than the weakest laid
        if tree.depths[node] >= config.max_depth:
            continue
        previous = int(tree.tokens[tree.parents[node]]) if node > 0 else PREVIOUS
        candidates, conditional = table(np.array([previous]), np.array([int(tree.tokens[node])]),
                                        SpineOptions().branch_top_k)
        laid = set(tree.tokens[tree.parents == node].tolist())
        for token, score in zip(candidates[0].tolist(), conditional[0].tolist(), strict=True):
            if token >= 0 and token not in laid and score >= config.min_score:
                assert scores[node] * score <= weakest + 1e-12
    # TR's static template, filled from the same table, leaves most of its slots empty here
    assert plan("transition_tree", pool, 40, config).draft_size < tree.draft_size


def test_min_score_is_a_floor_on_each_successor_not_on_the_path() -> None:
    """A chain of likely successors goes deep even where its path score falls below the floor."""
    table = TransitionTable(first=0.3, decay=0.02)  # the first successor 0.3, the second 0.006
    config = GooseConfig(min_score=0.01, max_depth=6)
    tree = plan("spine", make_pool(None, 0.5, table), 60, config)
    scores = path_scores(tree, table)
    assert int(tree.depths.max()) == 6 and scores.min() < config.min_score  # 0.3^6: laid all the same
    assert tree.draft_size == 6  # only first successors: every second one is below the floor


def test_a_fixed_budget_lets_the_spine_run_past_it() -> None:
    """Rule 6: with a fixed budget B the decoder hands B + spine_extension; the spine takes the extension,
    the branches keep B's share."""
    draft = spine_draft(length=60, score=0.9)
    table = TransitionTable()
    fixed = GooseConfig(budget=16, spine_extension=20)
    tree = plan("spine", make_pool(draft, 0.5, table), fixed.fixed_budget(), fixed)
    within = plan("spine", make_pool(draft, 0.5, table), 16, fixed.model_copy(update={"spine_extension": 0}))
    assert len(spine_of(tree)) == len(spine_of(within)) + 20
    assert tree.draft_size - len(spine_of(tree)) == within.draft_size - len(spine_of(within))  # same branches
    # the automatic budget sizes the whole tree: no extension, whatever the budget handed
    auto = plan("spine", make_pool(draft, 0.5, table), 36, TIERS)
    assert auto.draft_size <= 36 and len(spine_of(auto)) == spine_length(36, 0.5, 0, 60)
    # planners without a spine keep the fixed budget
    assert plan("transition_tree", make_pool(None, 0.5, table), fixed.fixed_budget(), fixed).draft_size <= 16


def test_room_the_branches_leave_goes_to_the_spine() -> None:
    """Rule 7: successors below min_score leave branch shares unfilled; the spine runs on into that room
    (the draft's next tokens, in order), so the tree holds what its budget allows while the draft lasts."""
    draft = spine_draft(length=90, score=0.9)
    sparse = TransitionTable(first=0.3, decay=0.02, holes=0.5)  # at most one successor above the floor
    fixed = TIERS.model_copy(update={"budget": 60, "spine_extension": 0})
    tree = plan("spine", make_pool(draft, 0.5, sparse), 60, fixed)
    tier_share = spine_length(60, SpineOptions(split="tiers").ratio(0.5), 0, 90)
    assert tree.draft_size == 60  # the whole budget is laid
    assert len(spine_of(tree)) == 60 - sum(branch_sizes(tree)) > tier_share
    assert spine_of(tree) == draft.tokens[: len(spine_of(tree))].tolist()  # the draft's own order
    # a rich table fills the branch shares: the spine keeps its share
    rich = plan("spine", make_pool(draft, 0.5, TransitionTable(first=0.9, decay=0.9)), 60, fixed)
    assert len(spine_of(rich)) == tier_share and rich.draft_size == 60
    # a draft too short for the room: the spine ends with the draft, the room stays unspent
    short = plan("spine", make_pool(spine_draft(length=35, score=0.9), 0.5, sparse), 60, fixed)
    assert len(spine_of(short)) == 35 and short.draft_size < 60
    # the automatic budget bought the spine it chose: the room stays unspent
    auto = plan("spine", make_pool(draft, 0.5, sparse), 60)
    assert len(spine_of(auto)) == tier_share and auto.draft_size < 60


def test_no_branching_source_gives_the_spine_alone() -> None:
    draft = spine_draft(length=30)
    tree = plan("spine", make_pool(draft, 0.1, None), 16)
    assert spine_of(tree) == draft.tokens[:16].tolist() and tree.draft_size == 16


def test_harmonic_shares_decrease_with_depth_and_fill_the_tree() -> None:
    # draft scores 1 and a rich table keep every candidate above min_score: shares are filled exactly
    table = TransitionTable(first=0.9, decay=0.9)
    pool = make_pool(spine_draft(length=40, score=1.0), 0.5, table)
    tree = plan("spine", pool, 60)  # spine 30, root round(0.5 * 30) = 15, 15 harmonically over 30 nodes
    sizes = branch_sizes(tree)
    assert sizes[0] == 15
    assert sizes[1:] == harmonic_split(15, 30).tolist()
    assert all(a >= b for a, b in itertools.pairwise(sizes[1:]))
    assert sizes[1] > sizes[-1]


@given(total=st.integers(0, 200), count=st.integers(1, 40))
def test_harmonic_split_sums_exactly_and_never_increases(total: int, count: int) -> None:
    shares = harmonic_split(total, count)
    assert int(shares.sum()) == total and shares.shape == (count,)
    assert bool((np.diff(shares) <= 0).all())


def test_spine_branch_ablation_keeps_branches_at_the_root() -> None:
    config = spine(branches=False, split="tiers")
    tree = plan("spine", make_pool(spine_draft(), 0.5, TransitionTable(first=0.9, decay=0.9)), 16, config)
    sizes = branch_sizes(tree)
    assert sizes[0] == 8 and sum(sizes[1:]) == 0


def test_branches_respect_min_score_and_max_depth() -> None:
    table = TransitionTable(first=0.7, decay=0.6)
    config = GooseConfig(max_depth=3, min_score=0.05)
    pool = make_pool(spine_draft(score=0.9), 0.3, table)
    tree = plan("spine", pool, 60, config)
    spine_scores = dict(zip(spine_of(tree), np.cumprod(np.full(20, 0.9)).tolist(), strict=False))
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    path_score = {0: 1.0}
    branch_depth = {0: 0}
    for node in range(1, tree.size):
        parent = parents[node]
        if bool(tree.on_spine[node]):
            path_score[node], branch_depth[node] = spine_scores[tokens[node]], 0
            continue
        previous = tokens[parents[parent]] if parent > 0 else PREVIOUS
        path_score[node] = path_score[parent] * table.score(previous, tokens[parent], tokens[node])
        branch_depth[node] = branch_depth[parent] + 1
        # the floor is on each successor's own score; the path score only ranks
        assert table.score(previous, tokens[parent], tokens[node]) >= config.min_score - 1e-9
        assert branch_depth[node] <= config.max_depth


def test_a_branch_never_duplicates_the_next_spine_token() -> None:
    # a table whose top successor of every spine node is the next spine token
    table = TransitionTable(first=0.9, decay=0.8)
    draft = spine_draft(length=10, score=1.0)
    spine_tokens = [ANCHOR, *draft.tokens.tolist()]
    for previous, token, following in zip([PREVIOUS, *spine_tokens], spine_tokens, spine_tokens[1:], strict=False):
        table.tokens[int(table.row(previous, token)), 0] = following
    tree = plan("spine", make_pool(draft, 0.3, table), 16)
    check_tree(tree, 16, make_pool(draft, 0.3, table))
    spine_nodes = [0, *np.flatnonzero(tree.on_spine).tolist()]
    for index, node in enumerate(spine_nodes[:-1]):
        children = np.flatnonzero(tree.parents == node)
        next_spine = [c for c in children.tolist() if tree.tokens[c] == spine_tokens[index + 1]]
        assert next_spine == [spine_nodes[index + 1]], "the next spine token appears once, on the spine"
    assert tree.draft_size == 16  # the skipped duplicate's place went to another successor


def test_a_trie_draft_lays_its_most_valuable_root_path() -> None:
    # two root paths: [10] (score 0.9) and [20, 21, 22] (0.7 each): 0.7 + 0.49 + 0.34 > 0.9
    draft = Draft(tokens=np.array([10, 20, 21, 22]), parents=np.array([-1, -1, 1, 2]),
                  scores=np.array([0.9, 0.7, 0.7, 0.7]))
    tokens, scores = draft.best_path
    assert tokens.tolist() == [20, 21, 22]
    assert np.allclose(scores, [0.7, 0.49, 0.343])
    tree = plan("spine", make_pool(draft, 0.5, TransitionTable()), 16)
    assert spine_of(tree) == [20, 21, 22]


# --- chain ------------------------------------------------------------------------------------


def test_chain_lays_the_whole_draft_up_to_the_budget() -> None:
    tree = plan("chain", make_pool(spine_draft(length=30), 0.1, TransitionTable()), 16)
    assert spine_of(tree) == list(range(500, 516)) and tree.parents.tolist() == list(range(-1, 16))
    short = plan("chain", make_pool(spine_draft(length=5), 0.1, TransitionTable()), 16)
    assert short.draft_size == 5


def test_chain_falls_back_to_the_greedy_successor_chain() -> None:
    table = TransitionTable(first=0.9, decay=0.9)
    tree = plan("chain", make_pool(None, 0.5, table), 16)
    assert tree.draft_size == GooseConfig().max_depth and not bool(tree.on_spine.any())
    previous, token = PREVIOUS, ANCHOR
    for node in range(1, tree.size):  # every node is its parent's top-1 successor
        expected = int(table(np.array([previous]), np.array([token]), 1)[0][0, 0])
        assert int(tree.parents[node]) == node - 1 and int(tree.tokens[node]) == expected
        previous, token = token, expected
    bare = plan("chain", make_pool(None, 0.5, None), 16)
    assert bare.size == 1


# --- isotropic --------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [3, 5])
def test_isotropic_is_a_balanced_k_ary_tree(k: int) -> None:
    config = GooseConfig(topology_options={"isotropic": {"k": k}}, min_score=0.0)
    tree = plan("isotropic", make_pool(spine_draft(), 0.5, TransitionTable()), 60, config)
    assert tree.draft_size == 60
    fan_out = np.bincount(tree.parents[1:], minlength=tree.size)
    assert int(fan_out.max()) <= k
    level_sizes = np.bincount(tree.depths).tolist()
    full_levels = [k**d for d in range(len(level_sizes))]
    assert level_sizes[:-1] == full_levels[:-1]  # breadth first: every level but the last is full
    assert not bool(tree.on_spine.any())


def test_isotropic_merges_sources_and_follows_the_draft() -> None:
    draft = spine_draft(length=10, score=0.95)
    tree = plan("isotropic", make_pool(draft, 0.5, TransitionTable()), 60, GooseConfig())  # k = 3
    # the draft's tokens outscore the table (0.95^d vs 0.6 * ...) and form a chain of draft-tagged nodes
    drafted = np.flatnonzero(tree.source_ids == 0)
    assert tree.tokens[drafted].tolist() == draft.tokens[: drafted.shape[0]].tolist()
    assert drafted.shape[0] == int(tree.depths.max())


# --- transition tree ---------------------------------------------------------------------------


def test_static_template_is_ancestor_closed_and_deepest_on_top_ranks() -> None:
    levels = static_template(80, 8, 6)
    assert sum(ranks.shape[0] for _, ranks in levels) == 80
    assert [ranks.shape[0] for _, ranks in levels][:3] == [8, 21, 25]  # TR's published tree's first levels
    for depth in range(1, len(levels)):
        parents, _ = levels[depth]
        assert int(parents.max()) < levels[depth - 1][1].shape[0]
    root_fan_outs = [static_template(budget, 10, 6)[0][1].shape[0] for budget in (4, 16, 60)]
    assert root_fan_outs == sorted(root_fan_outs) and root_fan_outs[0] < root_fan_outs[-1]  # it scales


def test_transition_tree_fills_slots_by_rank_and_ignores_drafts() -> None:
    table = TransitionTable()
    pool = make_pool(spine_draft(), 0.9, table)
    tree = plan("transition_tree", pool, 16, GooseConfig(min_score=0.0))
    assert tree.draft_size == 16 and set(tree.source_ids[1:].tolist()) == {1}
    root_children = tree.tokens[tree.parents == 0].tolist()
    expected = table(np.array([PREVIOUS]), np.array([ANCHOR]), 10)[0][0].tolist()
    assert root_children == expected[: len(root_children)]
    assert int(tree.depths.max()) > 1  # not a flat fan: top ranks are grown deeper


def test_planners_with_an_empty_pool_return_the_bare_anchor() -> None:
    pool = CandidatePool(ANCHOR, PREVIOUS, (), ())
    for name in PLANNERS:
        assert plan(name, pool, 16).size == 1


# --- with the real bigram transition source ---------------------------------------------------


def test_spine_tree_from_the_real_bigram_transition_source() -> None:
    from goose import DecodeContext, Harvest
    from goose.boundary import SourceSet

    vocab, config = 64, GooseConfig()
    sources = SourceSet(["bigram_transition"], config, vocab_size=vocab)  # its successors, checked and padded
    generator = np.random.default_rng(1)
    previous = generator.integers(0, vocab, 400)
    tokens = generator.integers(0, vocab, 400)
    top_tokens = np.stack([generator.permutation(vocab)[:10] for _ in range(400)])
    top_scores = np.tile(np.exp(np.linspace(3.0, 0.0, 10)) / np.exp(np.linspace(3.0, 0.0, 10)).sum(), (401, 1))
    context = DecodeContext(tokens=np.array([PREVIOUS, ANCHOR]), prompt_length=2, vocab_size=vocab,
                            eos_token_ids=frozenset())
    harvest = Harvest(previous=np.concatenate([previous, [PREVIOUS]]), tokens=np.concatenate([tokens, [ANCHOR]]),
                      top_tokens=np.concatenate([top_tokens, top_tokens[:1]]), top_scores=top_scores.astype(np.float32))
    sources.prefill(context, harvest)
    transition = sources.propose(context)[0].branching[0]

    draft = Draft.chain(np.arange(40, 60), 0.8).validated(vocab, 0.5)
    pool = CandidatePool(ANCHOR, PREVIOUS, ("context_match", "bigram_transition"),
                         (SourceCandidates("context_match", 0, 0.5, draft, None),
                          SourceCandidates("bigram_transition", 1, transition.acceptance, None, transition.successors)))
    for name in PLANNERS:
        for budget in (16, 60):
            tree = plan(name, pool, budget, config)
            check_tree(tree, budget, pool)
    tree = plan("spine", pool, 16, config)
    root_branches = tree.tokens[(tree.parents == 0) & ~tree.on_spine].tolist()
    assert root_branches and set(root_branches) <= set(top_tokens[0].tolist())  # the (previous, anchor) row


def test_transition_tokens_on_the_spine_keep_its_shape() -> None:
    """The paper's 'w/o PLD tokens' ablation: the spine's length stays, its tokens are the greedy successor chain."""
    table = TransitionTable(first=0.9, decay=0.5)
    pool = make_pool(spine_draft(), 0.5, table)
    reference = plan("spine", pool, 16)
    ablated = plan("spine", pool, 16, spine(tokens="transition", split="tiers"))
    assert len(spine_of(ablated)) == len(spine_of(reference)) == 8  # tier ratio 0.5 of budget 16
    greedy, previous, token = [], PREVIOUS, ANCHOR
    for _ in range(8):
        successors, _ = table(np.array([previous]), np.array([token]), 1)
        previous, token = token, int(successors[0, 0])
        greedy.append(token)
    assert spine_of(ablated) == greedy
    assert set(ablated.source_ids[ablated.on_spine].tolist()) == {1}  # laid by the branching source
    assert ablated.draft_size <= 16
