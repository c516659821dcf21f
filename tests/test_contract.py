"""The plugin contract cannot fail silently: one test per trap a plugin author can fall into.

A misspelled or unmarked hook, a pluggy option Goose would ignore and a name clash are all
reported by name; ``None`` from a planner is a plain step, not a fault; hooks may take only some of
their arguments. Only the last test loads a model (the example line source, against plain decoding).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Generator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import goose
from goose import plugins
from goose.boundary import SourceSet, TopologyPlanner
from goose.cli import main
from goose.config import GooseConfig
from goose.contract.candidates import CandidatePool, DecodeContext, Draft
from goose.contract.outcome import Harvest, PathKind, VerifyOutcome
from goose.contract.tree import DraftTree
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "line_source.py"
VOCAB = 100


class Misspelled:
    def __init__(self, config: GooseConfig) -> None:
        pass

    @goose.hookimpl
    def goose_proposee(self, context: DecodeContext) -> Draft | None:
        return None


class Unmarked:
    def __init__(self, config: GooseConfig) -> None:
        pass

    def goose_propose(self, context: DecodeContext) -> Draft | None:  # no @goose.hookimpl: never called
        return Draft.chain([1, 2])


class MisnamedArguments:
    def __init__(self, config: GooseConfig) -> None:
        pass

    @goose.hookimpl
    def goose_propose(self, ctx: DecodeContext, acceptence: float) -> Draft | None:  # pluggy would refuse it late
        return None


class BrokenConstructor:
    def __init__(self, config: GooseConfig) -> None:
        raise RuntimeError("no phrase file")


def registry_with(name: str, factory: object, kind: str = "source") -> plugins.Registry:
    """A registry of its own holding one plugin, so that no test touches the process-wide one."""
    known = plugins.Registry()
    hook = "goose_register_sources" if kind == "source" else "goose_register_topologies"
    known.add_plugin(SimpleNamespace(**{hook: goose.hookimpl(lambda register: register(name, factory))}), "tests")
    return known


@pytest.mark.parametrize(("factory", "message"), [
    (Misspelled, r"source 'bad': goose_proposee is not a Goose hook \(did you mean goose_propose\?\)"),
    (Unmarked, r"source 'bad': goose_propose is not marked @goose.hookimpl"),
    (MisnamedArguments, r"(?s)source 'bad': .*hook 'goose_propose'.*Argument\(s\) \{(?=.*'ctx')(?=.*'acceptence').*\} "
                        r"are declared in the hookimpl but can not be found in the hookspec; goose_propose passes "
                        r"context, acceptance$"),
])
def test_a_broken_hook_is_refused_at_registration_and_at_construction(factory: type, message: str) -> None:
    with pytest.raises(plugins.PluginError, match=message):  # the class, when it registers
        plugins.register(plugins.SourcePlugin("bad", factory))
    assert "bad" not in plugins.registry().sources
    known = registry_with("bad", lambda config: factory(config))  # a factory function: checked when it makes one
    with pytest.raises(plugins.PluginError, match=message):
        SourceSet(["bad"], GooseConfig(), VOCAB, known=known)


def test_options_for_an_unregistered_source_and_a_failing_constructor_are_named() -> None:
    with pytest.raises(plugins.PluginError, match=r"source_options: unknown source 'context_matcher' \(did "
                                                  r"you mean 'context_match'\?\); registered sources: .*context_match"):
        SourceSet(["context_match"], GooseConfig(source_options={"context_matcher": {"max_continuation": 4}}), VOCAB)
    known = registry_with("phrases", BrokenConstructor)
    with pytest.raises(plugins.PluginError, match="source 'phrases' could not be made: RuntimeError: no phrase file"):
        SourceSet(["phrases"], GooseConfig(), VOCAB, known=known)
    with pytest.raises(plugins.PluginError, match=r"source_options.context_match.max_continuation: Input should be"):
        SourceSet(["context_match"], GooseConfig(source_options={"context_match": {"max_continuation": "x"}}), VOCAB)
    with pytest.raises(plugins.PluginError, match=r"unknown topology 'spin' \(did you mean 'spine'\?\); registered "):
        TopologyPlanner("spin", GooseConfig(), VOCAB)


def test_a_topology_hook_on_a_source_is_refused() -> None:
    class PlansTrees:
        def __init__(self, config: GooseConfig) -> None:
            pass

        @goose.hookimpl
        def goose_plan_tree(self, pool: CandidatePool, budget: int) -> DraftTree | None:
            return None

    with pytest.raises(plugins.PluginError, match="goose_plan_tree is a topology hook"):
        registry_with("plans", PlansTrees)


def test_a_name_clash_from_an_entry_point_skips_the_newcomer(caplog) -> None:
    class Impostor:
        def __init__(self, config: GooseConfig) -> None:
            pass

    @goose.hookimpl
    def goose_register_sources(register: plugins.hookspecs.Register) -> None:
        register("context_match", Impostor)  # taken by the built-in
        register("impostor_extra", Impostor)  # free: still registered

    builtins = [ep for ep in plugins.metadata.entry_points(group=plugins.ENTRY_POINT_GROUP)
                if ep.dist is not None and ep.dist.name == plugins.OWN_DISTRIBUTION]
    # named to sort before every built-in: built-ins still load first and keep their names
    newcomer = SimpleNamespace(name="aaa", value="impostor:plugin", dist=SimpleNamespace(name="impostor-dist"),
                               load=lambda: SimpleNamespace(goose_register_sources=goose_register_sources))
    with caplog.at_level(logging.ERROR, logger="goose.plugins"):
        known = plugins._load_entry_points([newcomer, *builtins])
    assert known.sources["context_match"].origin == plugins.BUILTIN_ORIGIN
    assert known.sources["impostor_extra"].origin == "impostor-dist"
    assert len(known.load_errors) == 1 and "'context_match'" in known.load_errors[0]
    errors = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert len(errors) == 1 and "impostor-dist" in errors[0].getMessage()
    assert known.topology("spine").origin == plugins.BUILTIN_ORIGIN  # the registry works on
    with pytest.raises(plugins.PluginError, match="the name is taken"):  # an explicit call still raises
        plugins.register(plugins.SourcePlugin("context_match", Impostor))
    with pytest.raises(plugins.PluginError, match="shareable must be True or False"):
        plugins.register(plugins.SourcePlugin("impostor_shared", Impostor, shareable="yes"))


def test_goose_plugins_lists_every_plugins_hooks(capsys) -> None:
    assert main(["plugins", "--hooks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    opening = next(i for i, line in enumerate(lines) if line.startswith("context_match "))
    # every hook with the arguments it asks for (checked against the spec when the class registered)
    assert lines[opening + 1].split() == ["hooks:", "reset(),", "prefill(context),", "propose(context,",
                                          "acceptance),", "observe(outcome,", "own_nodes)"]
    spine = next(i for i, line in enumerate(lines) if line.startswith("spine "))
    assert lines[spine + 1].split() == ["hooks:", "plan_tree(pool,", "budget,", "config),",
                                        "spine_lengths(pool,", "budgets,", "config)"]
    assert main(["plugins", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)["plugins"]}
    assert rows["bigram_transition"]["hooks"] == ["goose_reset", "goose_prefill", "goose_successors", "goose_observe"]
    assert rows["bigram_transition"]["hook_arguments"]["goose_successors"] == ["previous", "tokens", "k"]
    # one bigram table may serve every row of a batch; context match reads each request's own context
    assert rows["bigram_transition"]["shareable"] is True and rows["context_match"]["shareable"] is False
    assert main(["plugins"]) == 0  # the plain listing: one line per plugin, no hooks
    assert "hooks:" not in capsys.readouterr().out


def test_no_tree_from_a_planner_is_the_bare_anchor_and_no_fault(caplog) -> None:
    class Abstains:
        def __init__(self, config: GooseConfig) -> None:
            pass

        @goose.hookimpl
        def goose_plan_tree(self, pool: CandidatePool) -> DraftTree | None:
            return None

    planner = TopologyPlanner("abstains", GooseConfig(), VOCAB, known=registry_with("abstains", Abstains, "topology"))
    pool = CandidatePool(anchor=7, previous=3, source_names=("a",), candidates=())
    with caplog.at_level(logging.WARNING, logger="goose.plugins"):
        tree = planner.plan(pool, 8)
    assert tree.size == 1 and int(tree.tokens[0]) == 7
    assert not caplog.records and not planner.faults.counts


def test_hooks_may_take_some_of_their_arguments_in_any_order() -> None:
    class Partial:
        def __init__(self, config: GooseConfig) -> None:
            self.seen: list[str] = []

        @goose.hookimpl
        def goose_prefill(self, harvest: Harvest) -> None:
            self.seen.append(f"prefill {type(harvest).__name__}")

        @goose.hookimpl
        def goose_propose(self, acceptance: float, context: DecodeContext) -> Draft | None:
            self.seen.append(f"propose {acceptance} {context.anchor}")
            return Draft.chain([context.anchor + 1])

        @goose.hookimpl
        def goose_observe(self, outcome: VerifyOutcome) -> None:
            self.seen.append(f"observe {outcome.bonus_token}")

    config = GooseConfig(initial_acceptance={"partial": 0.25})
    sources = SourceSet(["partial"], config, VOCAB, known=registry_with("partial", Partial))
    context = DecodeContext(tokens=np.array([1, 2, 3]), prompt_length=2, vocab_size=VOCAB, eos_token_ids=frozenset())
    sources.prefill(context, Harvest.empty(config.harvest_top_k))
    pool, _ = sources.propose(context)
    tree = DraftTree.single(3, ("partial",))
    none = np.zeros(1, dtype=np.bool_)
    sources.observe(VerifyOutcome(tree=tree, accepted_nodes=np.zeros(0, dtype=np.int64), new_tokens=[9],
                                  bonus_token=9, reached=none, accepted=none, path_kind=PathKind.BONUS,
                                  harvest=Harvest.empty(config.harvest_top_k)), {})
    assert sources.instances["partial"].seen == ["prefill Harvest", "propose 0.25 3", "observe 9"]
    assert pool.drafting[0].draft.tokens.tolist() == [4]


def test_the_example_line_source_is_short_drafts_and_stays_lossless(smollm2) -> None:
    assert len(EXAMPLE.read_text().splitlines()) <= 50
    spec = importlib.util.spec_from_file_location("line_source", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model, tokenizer = smollm2
    prompt = ("def area(shape, size):\n    if shape == 'square':\n        return size * size\n"
              "    if shape == 'cube':\n        return size * size * size\n    if shape == 'circle':")
    registrations = goose.register(plugins.SourcePlugin("line", example.LineSource, initial_acceptance=0.5))
    try:
        result = GooseDecoder(model, tokenizer, GooseConfig(sources=["line"]), chat=False).generate(prompt, 24)
    finally:
        plugins.unregister(registrations)
    reference = AutoregressiveDecoder(model, tokenizer, chat=False).generate(prompt, 24)
    assert result.new_token_ids == reference.new_token_ids
    assert result.stats.source_tested["line"] > 0  # it drafted, and the target tested its tokens


def test_a_draft_within_a_depth_keeps_its_shallow_nodes() -> None:
    """A chain keeps its first tokens; a trie every node at most that deep, re-indexed with its parents."""
    chain = Draft.chain([10, 11, 12, 13, 14], [0.9, 0.8, 0.7, 0.6, 0.5], consensus=4, depth_acceptance=(0.9, 0.8))
    cut = chain.within_depth(2)
    assert cut.tokens.tolist() == [10, 11] and cut.parents.tolist() == [-1, 0]
    assert cut.scores.tolist() == [0.9, 0.8] and cut.consensus == 2 and cut.depth_acceptance == (0.9, 0.8)
    assert chain.within_depth(5) is chain
    trie = Draft.trie([[1, 2, 3], [1, 4], [5, 6, 7, 8]], [2.0, 1.0, 1.0], 0.5)
    assert trie is not None
    shallow = trie.within_depth(2)
    assert shallow.tokens.tolist() == [1, 2, 4, 5, 6]
    assert shallow.parents.tolist() == [-1, 0, 0, -1, 3]
    assert np.allclose(shallow.scores, trie.scores[[0, 1, 3, 4, 5]])


def test_no_draft_goes_deeper_than_the_tokens_a_request_has_left(smollm2) -> None:
    """The output itself as the prediction, 4 tokens asked for: the prefill gives the first, so the first pass's
    chain holds the 3 left, however long the prediction and the budget (rows no token of which could be kept)."""
    model, tokenizer = smollm2
    prompt = "def add(a, b):"
    reference = AutoregressiveDecoder(model, tokenizer).generate(prompt, 24)
    decoder = GooseDecoder(model, tokenizer, GooseConfig(topology="chain", budget=32))
    result = decoder.generate(prompt, 4, prediction=list(reference.new_token_ids))
    assert result.new_token_ids == reference.new_token_ids[:4]
    assert result.stats.tree_sizes == [4]  # the anchor and three of the prediction's 23 tokens still to come


def test_hooks_are_called_through_pluggy_so_a_wrapper_means_what_pluggy_says() -> None:
    class Trimmed:  # its own wrapper keeps the first two tokens of its own draft
        def __init__(self, config: GooseConfig) -> None:
            pass

        @goose.hookimpl
        def goose_propose(self, context: DecodeContext) -> Draft | None:
            return Draft.chain([5, 6, 7, 8])

        @goose.hookimpl(wrapper=True, specname="goose_propose")
        def trim(self, context: DecodeContext) -> Generator[None, list[Draft], list[Draft]]:
            drafts = yield
            return [Draft.chain(draft.tokens[:2]) for draft in drafts]

    sources = SourceSet(["trimmed"], GooseConfig(), VOCAB, known=registry_with("trimmed", Trimmed))
    context = DecodeContext(np.array([1, 2, 3]), 2, VOCAB, frozenset())
    pool, _ = sources.propose(context)
    assert pool.candidates[0].draft.tokens.tolist() == [5, 6]


def test_a_constructor_failing_in_a_later_slot_costs_that_source_there_only(caplog) -> None:
    made: list[int] = []

    class FailsSecond:
        def __init__(self, config: GooseConfig) -> None:
            made.append(1)
            if len(made) > 1:
                raise RuntimeError("out of phrase files")

    known = registry_with("second", FailsSecond)
    first = SourceSet(["second"], GooseConfig(), VOCAB, known=known)  # a decoder's first slot: strict
    with caplog.at_level(logging.WARNING, logger="goose.plugins"):
        later = SourceSet(["second"], GooseConfig(), VOCAB, known=known, faults=first.faults, strict=False)
    assert first.names == ("second",) and later.names == ()
    assert "source 'second' skipped in its constructor: source 'second' could not be made: RuntimeError: out of " \
           "phrase files" in caplog.text
    with pytest.raises(plugins.PluginError, match="could not be made"):
        SourceSet(["second"], GooseConfig(), VOCAB, known=known)


def test_a_topology_reads_its_own_options_and_unknown_ones_are_refused() -> None:
    class Capped:  # lays the best draft as a chain of at most `cap` nodes, its option
        def __init__(self, config: GooseConfig) -> None:
            self.cap = int(config.options_for("capped").get("cap", 1))

        @goose.hookimpl
        def goose_plan_tree(self, pool: CandidatePool, budget: int) -> DraftTree | None:
            builder = pool.builder(budget)
            builder.add_chain(0, pool.drafting[0].draft.tokens[: self.cap], pool.drafting[0].source_id, spine=True)
            return builder.build()

    known = registry_with("capped", Capped, kind="topology")
    config = GooseConfig(topology_options={"capped": {"cap": 2}})
    planner = TopologyPlanner("capped", config, VOCAB, known=known)
    pool = SourceSet(["context_match"], config, VOCAB).propose(DecodeContext(np.array([4, 5, 6, 7, 4, 5, 6]), 7,
                                                                               VOCAB, frozenset()))[0]
    assert planner.plan(pool, 8).tokens.tolist() == [6, 7, 4]  # the anchor and two of the copy [7, 4, 5, 6]
    assert GooseConfig(topology_options={"capped": {"cap": 2}}).digest()["topology_options"] == {"capped": {"cap": 2}}
    with pytest.raises(plugins.PluginError, match=r"topology_options: unknown topology 'cappd' \(did you mean "
                                                  r"'capped'\?\); registered topologies"):
        TopologyPlanner("capped", GooseConfig(topology_options={"cappd": {}}), VOCAB, known=known)
