"""The plugin boundary: every call from the decoder into a source or a topology, through pluggy, guarded and checked.

A plugin that raises or answers malformed (by the contract types' own checks) costs its contribution for the cycle
(a draft not verified, the bare anchor for a tree, the planner's own estimate for a hint), never the output.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from pydantic import ValidationError

from goose.config import GooseConfig, first_error
from goose.contract import candidates
from goose.contract.acceptance import AcceptanceEstimate
from goose.contract.candidates import CandidatePool, DecodeContext, Draft, SourceCandidates
from goose.contract.outcome import AuxiliaryRows, Harvest, VerifyOutcome
from goose.contract.tree import DraftTree, checked_tree
from goose.plugins import Manager, PluginError, Registration, Registry, registry

logger = logging.getLogger("goose.plugins")


class FaultLog:
    """Logs a plugin fault once per (plugin, hook); later faults of the same kind are counted, not logged.

    Every fault is also credited to the request being served (``serving``: that request's
    ``GenerationStats.faults``, set by the cycle before it calls the plugins for the request), as
    ``{plugin: {"kind", "count", "hooks": {hook: count}, "first": "<hook>: <problem>"}}``.
    """

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.serving: dict[str, dict[str, Any]] | None = None

    def warn(self, kind: str, name: str, hook: str, problem: object) -> None:
        self.counts[name, hook] += 1
        if self.serving is not None:
            entry = self.serving.setdefault(name, {"kind": kind, "count": 0, "hooks": {},
                                                   "first": f"{hook}: {problem}"})
            entry["count"] += 1
            entry["hooks"][hook] = entry["hooks"].get(hook, 0) + 1
        if self.counts[name, hook] == 1:
            logger.warning("%s %r skipped in %s: %s (not logged again for this hook)", kind, name, hook, problem)


def made(plugin: Registration, config: GooseConfig) -> Any:
    """A plugin's instance; what its constructor raises comes back as a PluginError naming the plugin."""
    try:
        return plugin.factory(config)
    except Exception as error:
        why = first_error(error, "options") if isinstance(error, ValidationError) else str(error)
        raise PluginError(f"{plugin.kind} {plugin.name!r} could not be made: {type(error).__name__}: {why}") from error


class Guarded(Manager):
    """The pluggy manager of one plugin instance, whose hooks are called guarded: a fault is logged, not raised."""

    def __init__(self, name: str, kind: str, instance: Any, faults: FaultLog) -> None:
        super().__init__(instance, kind, name)  # PluginError on a misspelt, unmarked or misnamed hook
        self.faults, self.implements = faults, self.implemented()

    def call(self, hook: str, check: Callable[[Any], Any] = lambda answer: answer, kind: type = object,
             **arguments: Any) -> Any:
        """The hook's answer (pluggy's list of one unwrapped), a ``kind``, through ``check``; None when the plugin
        lacks the hook or answers None, and on a fault (logged): the hook raised, or answered malformed."""
        try:  # a hook the plugin lacks answers [] (or None), as pluggy calls no implementation
            answer = getattr(self.hook, hook)(**arguments)
        except Exception as error:  # a faulty plugin costs its contribution for the cycle, never the output
            return self.faults.warn(self.kind, self.name, hook, f"raised {type(error).__name__}: {error}")
        answer = (answer[0] if answer else None) if isinstance(answer, list) else answer
        try:
            if answer is not None and not isinstance(answer, kind):
                raise TypeError(f"{type(answer).__name__}, not {kind.__name__}")
            return None if answer is None else check(answer)
        except (TypeError, ValueError) as error:
            return self.faults.warn(self.kind, self.name, hook, f"malformed answer: {type(error).__name__}: {error}")


class SourceSet:
    """One slot's live sources and their estimates (``estimates``, ``instances``: shared with another set, made where
    absent). A constructor that raises is an error when ``strict`` (a decoder's first set), else sits the slot out."""

    def __init__(self, names: list[str] | tuple[str, ...], config: GooseConfig, vocab_size: int,
                 known: Registry | None = None, faults: FaultLog | None = None,
                 estimates: dict[str, AcceptanceEstimate] | None = None, instances: dict[str, Any] | None = None,
                 strict: bool = True) -> None:
        known = known or registry()
        known.check_options("source", config)  # options nobody reads, or a key nobody reads, would pass unsaid
        self.vocab_size, self.faults = vocab_size, faults or FaultLog()
        self.estimates = estimates if estimates is not None else {}
        self.instances: dict[str, Any] = {}
        self.guarded: dict[str, Guarded] = {}
        for name in names:
            registration, instance = known.source(name), (instances or {}).get(name)
            try:
                self.instances[name] = instance if instance is not None else made(registration, config)
            except PluginError as error:
                if strict:
                    raise
                self.faults.warn("source", name, "its constructor", error)
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
        entries, auxiliary = [], []
        for source_id, (name, source) in enumerate(self.guarded.items()):
            rate = self.estimates[name].rate
            draft = source.call("goose_propose", partial(Draft.validated, vocab_size=self.vocab_size,
                                                         default_score=rate), Draft, context=context, acceptance=rate)
            draft = draft.within_depth(depth) if draft is not None and depth is not None else draft
            rows = source.call("goose_auxiliary_rows", partial(AuxiliaryRows.validated, vocab_size=self.vocab_size),
                               AuxiliaryRows, context=context)
            auxiliary += [(name, rows)] if rows is not None else []
            depths = draft.depth_acceptance if draft is not None else ()  # this very draft's trust ranks the source
            acceptance = candidates.chain_rate(depths, len(draft)) if len(depths) > 1 else (  # type: ignore[arg-type]
                depths[0] if depths else rate)
            successors = partial(self._successors, source) if "goose_successors" in source.implements else None
            entries.append(SourceCandidates(name, source_id, acceptance, draft, successors,
                                            depths if len(depths) > 1 else ()))
        entries.sort(key=lambda c: -c.acceptance)  # stable: ties keep the configured order
        return CandidatePool(context.anchor, context.previous, self.names, tuple(entries)), auxiliary

    def _successors(self, source: Guarded, previous: np.ndarray, tokens: np.ndarray, k: int
                    ) -> tuple[np.ndarray, np.ndarray]:
        """A source's ``goose_successors`` answer, checked and padded; nothing known on a fault."""
        check = partial(candidates.checked_successors, m=len(tokens), k=max(k, 0), vocab_size=self.vocab_size)
        answer = source.call("goose_successors", check, previous=previous, tokens=tokens, k=k) \
            if len(tokens) and k > 0 else None
        return answer if answer is not None else check(None)

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


class TopologyPlanner(Guarded):
    """One decoder's topology: its plan checked, its budget hint checked, either skipped on a fault."""

    def __init__(self, name: str, config: GooseConfig, vocab_size: int, known: Registry | None = None,
                 faults: FaultLog | None = None) -> None:
        known = known or registry()
        known.check_options("topology", config)
        super().__init__(name, "topology", made(known.topology(name), config), faults or FaultLog())
        self.config, self.vocab_size = config, vocab_size
        if "goose_plan_tree" not in self.implements:
            raise PluginError(f"topology {name!r} does not implement goose_plan_tree")

    def plan(self, pool: CandidatePool, budget: int) -> DraftTree:
        """The topology's tree within ``budget`` draft nodes; the bare anchor (a plain step) on None or a fault."""
        tree = self.call("goose_plan_tree", lambda tree: checked_tree(tree, pool.anchor, budget, self.vocab_size),
                         pool=pool, budget=budget, config=self.config)
        return tree if tree is not None else DraftTree.single(pool.anchor, pool.source_names)

    def spine_lengths(self, pool: CandidatePool, budgets: tuple[int, ...]) -> tuple[int, ...] | None:
        """The topology's spine length for every candidate budget (``goose_spine_lengths``), if it says."""
        lengths = self.call("goose_spine_lengths", lambda answer: tuple(int(length) for length in answer), pool=pool,
                            budgets=budgets, config=self.config)
        if lengths is None or (len(lengths) == len(budgets) and min(lengths, default=0) >= 0):
            return lengths
        return self.faults.warn(self.kind, self.name, "goose_spine_lengths", f"malformed answer: {len(lengths)} "
                                f"spine lengths for {len(budgets)} budgets, or a negative one")


__all__ = ["FaultLog", "Guarded", "SourceSet", "TopologyPlanner", "made"]
