"""The multi-level planner on real CandidatePools (real Drafts, a real successor table) and on a real model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import goose
from goose import CandidatePool, DecodeContext, Draft, DraftTree, GooseConfig, SourceCandidates
from goose.boundary import TopologyPlanner
from goose.contract.candidates import common_prefix
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
from goose.hookspecs import Register
from goose.planning.allocation import SpineSpec, multi_spine_allocation
from goose.plugins import BUILTIN_ORIGIN, registry, unregister
from goose.topologies.chain import ChainTopology
from goose.topologies.multi_spine import MultiSpineTopology
from goose.topologies.spine import SpineOptions, SpineTopology
from goose.topologies.toolkit import grow_branches
from tests.helpers import TransitionTable, assert_lossless, check_tree, random_drafts

ANCHOR, PREVIOUS = 3, 2
NAMES = ("context_match", "rest", "bigram_transition")
MAIN, SIDE, BRANCH = 0, 1, 2


def successors(seed: int = 0) -> TransitionTable:
    """These tests' bigram successors: a seeded table over a 300-token vocabulary, scores falling with rank."""
    return TransitionTable(vocab=300, seed=seed)


def chain(tokens: list[int] | range, score: float = 0.5, consensus: int = 0) -> Draft:
    return Draft.chain(np.array(list(tokens)), score, consensus=consensus)


def make_pool(
    main: Draft | None,
    side: Draft | None = None,
    *,
    p_main: float = 0.5,
    p_side: float = 0.3,
    p_t: float = 0.04,
    table: TransitionTable | None = None,
) -> CandidatePool:
    candidates = [
        SourceCandidates("context_match", MAIN, p_main, main, None),
        SourceCandidates("rest", SIDE, p_side, side, None),
        SourceCandidates("bigram_transition", BRANCH, p_t, None, table),
    ]
    candidates.sort(key=lambda c: -c.acceptance)  # the decoder ranks the pool by acceptance
    return CandidatePool(ANCHOR, PREVIOUS, NAMES, tuple(candidates))


def plan(pool: CandidatePool, budget: int, config: GooseConfig | None = None) -> tuple[DraftTree, MultiSpineTopology]:
    config = config or GooseConfig(topology="multi_spine")
    planner = MultiSpineTopology(config)
    return planner.goose_plan_tree(pool=pool, budget=budget, config=config), planner


def same_tree(first: DraftTree, second: DraftTree) -> bool:
    return all(np.array_equal(getattr(first, f), getattr(second, f))
               for f in ("tokens", "parents", "depths", "source_ids", "on_spine"))


def nodes_of(tree: DraftTree, source: int) -> list[int]:
    return np.flatnonzero(tree.source_ids == source).tolist()


# --- registration ----------------------------------------------------------------------------


def test_registered_through_the_entry_point_as_built_in() -> None:
    registration = registry(refresh=True).topology("multi_spine")
    assert registration.origin == BUILTIN_ORIGIN and "side spines" in registration.description
    config = GooseConfig(topology="multi_spine")
    pool = make_pool(chain(range(500, 520)), chain(range(900, 910)), table=successors())
    tree = TopologyPlanner("multi_spine", config, vocab_size=1000).plan(pool, 16)
    check_tree(tree, 16, pool)


# --- roles ------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [8, 16, 30, 60])
def test_main_spine_side_spine_and_branches_come_from_their_sources(budget: int) -> None:
    main, side = chain(range(500, 520), 0.5), chain(range(900, 910), 0.4)
    pool = make_pool(main, side, p_main=0.5, p_side=0.4, table=successors())
    tree, planner = plan(pool, budget)
    check_tree(tree, budget, pool)
    allocation = planner.last_allocation
    assert allocation is not None and allocation.lengths[1] > 0
    # the main spine: the top drafter's draft, from the anchor, as long as the model says
    spine = np.flatnonzero(tree.on_spine)
    assert tree.tokens[spine].tolist() == list(range(500, 500 + allocation.lengths[0]))
    # the side spine: the second drafter's tokens, a chain hanging off the anchor (no shared prefix)
    side_nodes = nodes_of(tree, SIDE)
    assert tree.tokens[side_nodes].tolist() == list(range(900, 900 + allocation.lengths[1]))
    assert tree.parents[side_nodes].tolist() == [0, *side_nodes[:-1]]
    assert not bool(tree.on_spine[side_nodes].any())
    # everything else: branches of the branching source, within the budget the model left them
    branch_nodes = nodes_of(tree, BRANCH)
    assert len(branch_nodes) == tree.draft_size - allocation.lengths[0] - allocation.lengths[1]
    assert len(branch_nodes) <= sum(sum(widths) for widths in allocation.widths)
    # laid in priority order: main spine, side spine, then branches
    assert max(spine.tolist()) < min(side_nodes) and max(side_nodes) < min(branch_nodes, default=tree.size)
    if budget >= 16:  # enough room for the brancher's wide branches
        assert len(branch_nodes) > 4


def test_side_spine_hangs_where_the_drafts_diverge() -> None:
    main = chain(range(500, 520), 0.5)
    side = chain([500, 501, 502, 900, 901, 902, 903], 0.4)
    pool = make_pool(main, side, p_main=0.5, p_side=0.4, table=successors())
    tree, planner = plan(pool, 30)
    check_tree(tree, 30, pool)
    assert planner.last_allocation is not None and planner.last_allocation.lengths[1] > 0
    side_nodes = nodes_of(tree, SIDE)
    assert tree.tokens[side_nodes[0]].item() == 900
    divergence = int(tree.parents[side_nodes[0]])
    assert bool(tree.on_spine[divergence]) and int(tree.tokens[divergence]) == 502 and int(tree.depths[divergence]) == 3
    assert int((tree.tokens == 500).sum()) == 1  # the shared prefix is laid once, by the main drafter
    assert common_prefix(np.array([1, 2, 3]), np.array([1, 2, 4, 5])) == 2


def test_a_side_draft_inside_the_main_draft_adds_nothing() -> None:
    pool = make_pool(chain(range(500, 520)), chain(range(500, 505)), table=successors())
    tree, planner = plan(pool, 30)
    assert nodes_of(tree, SIDE) == []
    assert planner.last_allocation is not None and planner.last_allocation.lengths == (
        planner.last_allocation.lengths[0],)


def test_ranking_decides_the_roles() -> None:
    first, second = chain(range(500, 520), 0.5), chain(range(900, 920), 0.5)
    tree, _ = plan(make_pool(first, second, p_main=0.6, p_side=0.3, table=successors()), 30)
    assert tree.tokens[tree.on_spine].tolist()[0] == 500
    swapped, _ = plan(make_pool(first, second, p_main=0.3, p_side=0.6, table=successors()), 30)
    assert swapped.tokens[swapped.on_spine].tolist()[0] == 900
    assert set(swapped.source_ids[swapped.on_spine].tolist()) == {SIDE}


def test_budget_split_follows_the_current_estimates() -> None:
    main, side = chain(range(500, 520)), chain(range(900, 910))
    weak_side, planner = plan(make_pool(main, side, p_main=0.5, p_side=0.01, table=successors()), 30)
    assert nodes_of(weak_side, SIDE) == []  # not worth its nodes
    strong_side, planner = plan(make_pool(main, side, p_main=0.5, p_side=0.45, table=successors()), 30)
    expected = multi_spine_allocation([SpineSpec((0.5,), 20), SpineSpec((0.45,), 6)], 0.04, 30)
    assert planner.last_allocation == expected
    assert len(nodes_of(strong_side, SIDE)) == expected.lengths[1] > 0
    assert int(strong_side.on_spine.sum()) == expected.lengths[0]


def test_two_drafters_without_a_brancher_lay_spines_only() -> None:
    pool = make_pool(chain(range(500, 520)), chain(range(900, 910)), p_side=0.4, table=None)
    tree, planner = plan(pool, 20)
    check_tree(tree, 20, pool)
    assert nodes_of(tree, BRANCH) == []
    assert planner.last_allocation is not None
    assert tree.draft_size == sum(planner.last_allocation.lengths)


def test_consensus_bypass_lays_the_main_draft_alone() -> None:
    pool = make_pool(chain(range(500, 520), 0.9, consensus=10), chain(range(900, 910)), table=successors())
    tree, _ = plan(pool, 16)
    assert tree.tokens[1:].tolist() == list(range(500, 516)) and bool(tree.on_spine[1:].all())


def test_without_spine_branches_every_branch_hangs_off_the_anchor() -> None:
    config = GooseConfig(topology="multi_spine", topology_options={"multi_spine": {"branches": False}})
    pool = make_pool(chain(range(500, 520)), chain(range(900, 910)), p_side=0.4, table=successors())
    tree, _ = plan(pool, 30, config)
    check_tree(tree, 30, pool)
    branch_nodes = nodes_of(tree, BRANCH)
    assert branch_nodes
    drafted = set(nodes_of(tree, MAIN) + nodes_of(tree, SIDE))
    for node in branch_nodes:  # walk up to the first drafted ancestor: there is none
        while node and node not in drafted:
            node = int(tree.parents[node])
        assert node == 0


# --- degenerate cases ---------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [1, 8, 16, 60])
@pytest.mark.parametrize("consensus", [0, 4, 9])
@pytest.mark.parametrize("acceptance", [0.1, 0.3, 0.6])
def test_one_drafter_and_one_brancher_give_the_spine_tree(budget: int, consensus: int, acceptance: float) -> None:
    config = GooseConfig(topology="multi_spine")
    pool = make_pool(chain(range(500, 520), acceptance, consensus), None, p_main=acceptance, table=successors())
    expected = SpineTopology(config, "multi_spine").goose_plan_tree(pool=pool, budget=budget, config=config)
    tree, planner = plan(pool, budget, config)
    assert same_tree(tree, expected)
    assert planner.last_allocation is None


def test_a_configured_third_source_without_a_draft_changes_nothing() -> None:
    config = GooseConfig(topology="multi_spine", max_depth=4, topology_options={"multi_spine": {"branch_ratio": 0.3}})
    pool = make_pool(chain(range(500, 520)), Draft.chain(np.zeros(0, dtype=np.int64), 0.5),
                     table=successors(seed=3))
    assert len(pool.drafting) == 1
    expected = SpineTopology(config, "multi_spine").goose_plan_tree(pool=pool, budget=40, config=config)
    assert same_tree(plan(pool, 40, config)[0], expected)


@pytest.mark.parametrize("budget", [1, 16, 60])
def test_one_source_gets_its_own_best_shape(budget: int) -> None:
    config = GooseConfig(topology="multi_spine")
    drafter_only = make_pool(chain(range(500, 540)), None, table=None)
    expected = ChainTopology(config).goose_plan_tree(pool=drafter_only, budget=budget, config=config)
    assert same_tree(plan(drafter_only, budget, config)[0], expected)
    assert plan(drafter_only, budget, config)[0].draft_size == min(budget, 40)

    brancher_only = make_pool(None, None, table=successors())
    tree = plan(brancher_only, budget, config)[0]
    expected = brancher_only.builder(budget)
    grow_branches(brancher_only, expected, brancher_only.branching[0], starts=[0], budgets=[budget],
                  start_scores=[1.0], max_depth=config.max_depth, min_score=config.min_score,
                  top_k=SpineOptions().branch_top_k)  # the best-first tree of the brancher's successors
    assert same_tree(tree, expected.build()) and tree.draft_size == budget

    nothing = make_pool(None, None, table=None)
    assert plan(nothing, budget, config)[0].size == 1


# --- invariants on random pools ---------------------------------------------------------------


@st.composite
def random_cases(draw: st.DrawFn) -> tuple[CandidatePool, int, GooseConfig]:
    vocab = draw(st.sampled_from([5, 30, 500]))  # small vocabularies force dedup collisions
    main = draw(random_drafts(vocab))
    side = draw(random_drafts(vocab, main.tokens.tolist() if main is not None else None))
    table = TransitionTable(vocab=vocab, width=min(vocab, 10), seed=draw(st.integers(0, 50))) if draw(
        st.booleans()) else None
    candidates = [
        SourceCandidates("context_match", MAIN, draw(st.floats(0.0, 1.0)), main, None),
        SourceCandidates("rest", SIDE, draw(st.floats(0.0, 1.0)), side, None),
        SourceCandidates("bigram_transition", BRANCH, draw(st.floats(0.0, 1.0)), None, table),
    ]
    if draw(st.booleans()):  # a fourth source that both drafts and branches
        fourth = draw(random_drafts(vocab, main.tokens.tolist() if main is not None else None))
        candidates.append(SourceCandidates("lookahead", 3, draw(st.floats(0.0, 1.0)), fourth,
                                           TransitionTable(vocab=vocab, width=min(vocab, 10), seed=99)))
    candidates.sort(key=lambda c: -c.acceptance)
    names = (*NAMES, "lookahead")
    pool = CandidatePool(ANCHOR, PREVIOUS, names, tuple(candidates))
    config = GooseConfig(
        topology="multi_spine",
        max_depth=draw(st.integers(1, 6)),
        min_score=draw(st.sampled_from([0.0, 0.01, 0.2])),
        topology_options={"multi_spine": {"branch_top_k": draw(st.integers(1, 10)), "branches": draw(st.booleans()),
                                          "consensus_bypass": draw(st.booleans())}},
    )
    return pool, draw(st.integers(0, 80)), config


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=random_cases())
def test_random_pools_keep_the_budget_and_tree_invariants(case: tuple) -> None:
    pool, budget, config = case
    tree, planner = plan(pool, budget, config)
    check_tree(tree, budget, pool)
    if planner.last_allocation is not None:
        assert tree.draft_size <= planner.last_allocation.size <= budget


# --- a real model -------------------------------------------------------------------------------


class UnigramLookup:
    """A second, weaker drafter for the real-model test: what followed the anchor's last earlier occurrence."""

    def __init__(self, config: GooseConfig) -> None:
        self.config = config

    @goose.hookimpl
    def goose_propose(self, context: DecodeContext) -> Draft | None:
        tokens = context.tokens
        earlier = np.flatnonzero(tokens[:-1] == tokens[-1])
        if earlier.shape[0] == 0:
            return None
        return Draft.chain(tokens[earlier[-1] + 1 : earlier[-1] + 7])


class _TestPlugin:
    @staticmethod
    @goose.hookimpl
    def goose_register_sources(register: Register) -> None:
        register("unigram_lookup", UnigramLookup, description="test: unigram prompt lookup", initial_acceptance=0.2)


def test_three_sources_on_a_model_are_lossless(tiny) -> None:
    model, tokenizer = tiny
    registrations = goose.plugins.register(_TestPlugin)
    prompt = "List the planets of the solar system, one per line, as '- Planet: <name>'."
    config = GooseConfig(sources=["context_match", "unigram_lookup", "bigram_transition"], topology="multi_spine",
                         budget=16)
    decoder = GooseDecoder(model, tokenizer, config)
    result = decoder.generate(prompt, max_new_tokens=48)
    unregister(registrations)
    reference = AutoregressiveDecoder(model, tokenizer).generate(prompt, max_new_tokens=48)
    assert_lossless(result, reference)
    assert result.stats.verify_steps < len(result.new_token_ids)
    assert result.stats.source_tested["unigram_lookup"] > 0  # the side spines took part
