"""The plugin boundary: every call from the decoder into a source or a topology, through pluggy, guarded and checked.

A plugin may raise, or answer with something malformed. Either costs that plugin's contribution for
the cycle, with one logged warning per (plugin, hook), and never the output: a skipped draft is a
draft not verified, a skipped tree the bare anchor, a skipped hint the planner's own estimate. The
answers are checked here, by the checks that live with the contract's types (``Draft.validated``,
``AuxiliaryRows.validated``, ``checked_successors``, ``checked_tree``); sources, topologies and
the decoder trust what comes out. Each instance has a pluggy manager of its own, so a hook is
called through pluggy and acceptance stays per source. The sources' acceptance estimates live here
too (one :class:`AcceptanceEstimate` per registered name), handed to ``goose_propose`` and updated
from every outcome.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from pydantic import ValidationError

from goose.config import GooseConfig, first_error
from goose.contract.acceptance import AcceptanceEstimate
from goose.contract.candidates import (
    CandidateError,
    CandidatePool,
    DecodeContext,
    Draft,
    SourceCandidates,
    chain_rate,
    checked_successors,
)
from goose.contract.outcome import AuxiliaryRows, Harvest, VerifyOutcome
from goose.contract.tree import DraftTree, checked_tree
from goose.plugins import HOOKS, PluginError, Registration, Registry, manager, registry

logger = logging.getLogger("goose.plugins")


class FaultLog:
    """Logs a plugin fault once per (plugin, hook); later faults of the same kind are counted, not logged."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}

    def warn(self, kind: str, name: str, hook: str, problem: str) -> None:
        self.counts[name, hook] = self.counts.get((name, hook), 0) + 1
        if self.counts[name, hook] == 1:
            logger.warning("%s %r skipped in %s: %s (further faults of this kind are not logged)", kind, name, hook,
                           problem)


def made(registration: Registration, config: GooseConfig) -> Any:
    """A plugin's instance; what its constructor raises comes back as a PluginError naming the plugin."""
    try:
        return registration.factory(config)
    except Exception as error:
        detail = first_error(error, "options") if isinstance(error, ValidationError) else str(error)
        raise PluginError(f"{registration.kind} {registration.name!r} could not be made: {type(error).__name__}: "
                          f"{detail}") from error


class Guarded:
    """One plugin instance and the pluggy manager its hooks are called through; a fault is logged, not raised."""

    def __init__(self, name: str, kind: str, instance: Any, faults: FaultLog) -> None:
        self.name, self.kind, self.instance, self.faults = name, kind, instance, faults
        self.hooks = manager(instance, kind, name).hook  # PluginError on a misspelt, unmarked or misnamed hook
        self.implements = {hook for hook in HOOKS[kind] if getattr(self.hooks, hook).get_hookimpls()}

    def call(self, hook: str, **arguments: Any) -> Any:
        """The hook's answer (pluggy's list of one unwrapped), None when missing, None on a fault (logged)."""
        if hook not in self.implements:
            return None
        try:
            answer = getattr(self.hooks, hook)(**arguments)
        except Exception as error:  # a faulty plugin costs its contribution for the cycle, never the output
            self.faults.warn(self.kind, self.name, hook, f"raised {type(error).__name__}: {error}")
            return None
        return (answer[0] if answer else None) if isinstance(answer, list) else answer

    def fault(self, hook: str, problem: object) -> None:
        self.faults.warn(self.kind, self.name, hook, str(problem))


class SourceSet:
    """One slot's live sources: their instances, their acceptance estimates, and guarded calls into them.

    ``estimates``, ``instances``: shared with another set (made where absent). ``strict`` (a decoder's first
    set): a constructor that raises is an error; otherwise (a later slot) that source sits the slot out, logged.
    """

    def __init__(self, names: list[str] | tuple[str, ...], config: GooseConfig, vocab_size: int,
                 known: Registry | None = None, faults: FaultLog | None = None,
                 estimates: dict[str, AcceptanceEstimate] | None = None, instances: dict[str, Any] | None = None,
                 strict: bool = True) -> None:
        known = known or registry()
        unknown = sorted(set(config.source_options) - set(known.sources))
        if unknown:  # options for a source nobody registered would be ignored without a word
            raise PluginError(f"source_options names {', '.join(map(repr, unknown))}, not a registered source; "
                              f"registered sources: {', '.join(sorted(known.sources))}")
        self.vocab_size, self.faults = vocab_size, faults or FaultLog()
        self.estimates = estimates if estimates is not None else {}
        self.instances: dict[str, Any] = {}
        self.guarded: dict[str, Guarded] = {}
        for name in names:
            registration = known.source(name)
            try:
                instance = (instances or {}).get(name)
                self.instances[name] = instance if instance is not None else made(registration, config)
            except PluginError as error:
                if strict:
                    raise
                self.faults.warn("source", name, "its constructor", str(error))
                continue
            self.guarded[name] = Guarded(name, "source", self.instances[name], self.faults)
            if name not in self.estimates:
                initial = config.initial_acceptance.get(name, registration.initial_acceptance)
                self.estimates[name] = AcceptanceEstimate(name, initial, config.ema)
        self.names: tuple[str, ...] = tuple(self.guarded)

    def implements(self, name: str, hook: str) -> bool:
        return name in self.guarded and hook in self.guarded[name].implements

    def reset(self, keep: frozenset[str] = frozenset()) -> None:
        """A new request: every source but those in ``keep`` (instances shared with other slots) resets."""
        for name, source in self.guarded.items():
            if name not in keep:
                source.call("goose_reset")

    def prefill(self, context: DecodeContext, harvest: Harvest) -> None:
        for source in self.guarded.values():
            source.call("goose_prefill", context=context, harvest=harvest)

    def propose(self, context: DecodeContext, depth: int | None = None
                ) -> tuple[CandidatePool, list[tuple[str, AuxiliaryRows]]]:
        """Every source's checked draft, ranked by acceptance, and the auxiliary rows that asked to ride along;
        ``depth``: the most draft tokens a path may keep (the tokens the request has left), deeper nodes cut."""
        candidates, auxiliary = [], []
        for source_id, (name, source) in enumerate(self.guarded.items()):
            rate = self.estimates[name].rate
            draft = self._checked(source, "goose_propose", source.call("goose_propose", context=context,
                                                                       acceptance=rate), rate)
            if draft is not None and depth is not None:
                draft = draft.within_depth(depth)
            rows = self._checked(source, "goose_auxiliary_rows", source.call("goose_auxiliary_rows", context=context))
            if rows is not None:
                auxiliary.append((name, rows))
            candidates.append(self._candidates(source_id, source, draft))
        candidates.sort(key=lambda c: -c.acceptance)  # stable: ties keep the configured order
        return CandidatePool(context.anchor, context.previous, self.names, tuple(candidates)), auxiliary

    def observe(self, outcome: VerifyOutcome, auxiliary_predictions: dict[str, np.ndarray]
                ) -> dict[str, tuple[int, int]]:
        """Update every estimate from its source's nodes, then let the sources learn; returns (tested, accepted)."""
        counts = {}
        for source_id, (name, source) in enumerate(self.guarded.items()):
            own = outcome.tree.source_ids == source_id
            counts[name] = (int(np.count_nonzero(own & outcome.reached)), int(np.count_nonzero(own & outcome.accepted)))
            self.estimates[name].observe(*counts[name])
            source.call("goose_observe", outcome=outcome, own_nodes=own,
                        auxiliary_predictions=auxiliary_predictions.get(name))
        return counts

    def _checked(self, source: Guarded, hook: str, answer: Any, rate: float = 0.0) -> Any:
        """A draft or auxiliary rows as clean arrays; None (the fault logged) when malformed."""
        if answer is None:
            return None
        try:
            kind = Draft if hook == "goose_propose" else AuxiliaryRows
            if not isinstance(answer, kind):
                raise TypeError(f"{hook} returned {type(answer).__name__}, not {kind.__name__}")
            return answer.validated(self.vocab_size, rate) if kind is Draft else answer.validated(self.vocab_size)
        except (TypeError, ValueError) as error:
            source.fault(hook, error)
            return None

    def _candidates(self, source_id: int, source: Guarded, draft: Draft | None) -> SourceCandidates:
        """The pool entry of one source: per-depth estimates of its draft when it gave them, else its estimate."""
        depths = draft.depth_acceptance if draft is not None else ()
        if len(depths) > 1:
            acceptance = chain_rate(depths, len(draft))  # type: ignore[arg-type]
        else:
            acceptance, depths = depths[0] if depths else self.estimates[source.name].rate, ()
        successors = None
        if "goose_successors" in source.implements:
            def successors(previous: np.ndarray, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
                m = tokens.shape[0]
                answer = source.call("goose_successors", previous=previous, tokens=tokens, k=k) if m and k > 0 \
                    else None
                try:
                    return checked_successors(answer, m, max(k, 0), self.vocab_size)
                except CandidateError as error:
                    source.fault("goose_successors", error)
                    return checked_successors(None, m, max(k, 0), self.vocab_size)
        return SourceCandidates(name=source.name, source_id=source_id, acceptance=acceptance, draft=draft,
                                successors=successors, depth_acceptance=depths)


class TopologyPlanner:
    """One decoder's topology: its plan checked, its budget hint checked, either skipped on a fault."""

    def __init__(self, name: str, config: GooseConfig, vocab_size: int, known: Registry | None = None,
                 faults: FaultLog | None = None) -> None:
        self.name, self.config, self.vocab_size, self.faults = name, config, vocab_size, faults or FaultLog()
        known = known or registry()
        unknown = sorted(set(config.topology_options) - set(known.topologies))
        if unknown:
            raise PluginError(f"topology_options names {', '.join(map(repr, unknown))}, not a registered topology; "
                              f"registered topologies: {', '.join(sorted(known.topologies))}")
        self.instance = made(known.topology(name), config)
        self.planner = Guarded(name, "topology", self.instance, self.faults)
        if "goose_plan_tree" not in self.planner.implements:
            raise PluginError(f"topology {name!r} does not implement goose_plan_tree")

    def plan(self, pool: CandidatePool, budget: int) -> DraftTree:
        """The topology's tree for ``pool`` within ``budget`` draft nodes; the bare anchor (a plain decoding step)
        when it answers None or fails (logged once)."""
        tree = self.planner.call("goose_plan_tree", pool=pool, budget=budget, config=self.config)
        try:
            return DraftTree.single(pool.anchor, pool.source_names) if tree is None else \
                checked_tree(tree, pool.anchor, budget, self.vocab_size)
        except CandidateError as error:  # a faulty planner costs speed for a cycle, never correctness
            self.planner.fault("goose_plan_tree", error)
            return DraftTree.single(pool.anchor, pool.source_names)

    def spine_lengths(self, pool: CandidatePool, budgets: tuple[int, ...]) -> tuple[int, ...] | None:
        """The topology's spine length for every candidate budget (``goose_spine_lengths``), if it says."""
        lengths = self.planner.call("goose_spine_lengths", pool=pool, budgets=budgets, config=self.config)
        if lengths is None:
            return None
        try:
            lengths = tuple(int(length) for length in lengths)
            if len(lengths) != len(budgets) or min(lengths, default=0) < 0:
                raise ValueError(f"{len(lengths)} spine lengths for {len(budgets)} budgets, or a negative one")
            return lengths
        except (TypeError, ValueError) as error:  # a faulty hint costs the budget's accuracy, never correctness
            self.planner.fault("goose_spine_lengths", f"{type(error).__name__}: {error}")
            return None
