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
    """Logs a plugin fault once per (plugin, hook); later faults of the same kind are counted, not logged."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def warn(self, kind: str, name: str, hook: str, problem: object) -> None:
        self.counts[name, hook] += 1
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


def validated(kind: type, arguments: tuple[Any, ...], answer: Any) -> Any:
    """A ``Draft`` or ``AuxiliaryRows`` answer as clean arrays (its own ``validated``); TypeError for another type."""
    if not isinstance(answer, kind):
        raise TypeError(f"{type(answer).__name__}, not {kind.__name__}")
    return answer.validated(*arguments)


class Guarded:
    """One plugin instance and the pluggy manager its hooks are called through; a fault is logged, not raised."""

    def __init__(self, name: str, kind: str, instance: Any, faults: FaultLog) -> None:
        self.name, self.kind, self.faults = name, kind, faults
        plugins = Manager(instance, kind, name)  # PluginError on a misspelt, unmarked or misnamed hook
        self.hooks, self.implements = plugins.hook, plugins.implemented()

    def call(self, hook: str, check: Callable[[Any], Any] = lambda answer: answer, **arguments: Any) -> Any:
        """The hook's answer (pluggy's list of one unwrapped) through ``check``; None when the plugin lacks the hook
        or answers None, and on a fault (logged): the hook raised, or ``check`` did (a malformed answer)."""
        if hook not in self.implements:
            return None
        try:
            answer = getattr(self.hooks, hook)(**arguments)
        except Exception as error:  # a faulty plugin costs its contribution for the cycle, never the output
            return self.faults.warn(self.kind, self.name, hook, f"raised {type(error).__name__}: {error}")
        answer = (answer[0] if answer else None) if isinstance(answer, list) else answer
        try:
            return None if answer is None else check(answer)
        except (TypeError, ValueError) as error:
            return self.faults.warn(self.kind, self.name, hook, f"malformed answer: {type(error).__name__}: {error}")


class SourceSet:
    """One slot's live sources, their acceptance estimates and guarded calls. ``estimates``, ``instances``: shared
    with another set (made where absent); a constructor that raises is an error when ``strict`` (a decoder's first
    set), else (a later slot) that source sits the slot out, logged."""

    def __init__(self, names: list[str] | tuple[str, ...], config: GooseConfig, vocab_size: int,
                 known: Registry | None = None, faults: FaultLog | None = None,
                 estimates: dict[str, AcceptanceEstimate] | None = None, instances: dict[str, Any] | None = None,
                 strict: bool = True) -> None:
        known = known or registry()
        known.check_options("source", config.source_options)
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
            draft = source.call("goose_propose", partial(validated, Draft, (self.vocab_size, rate)), context=context,
                                acceptance=rate)
            if draft is not None and depth is not None:
                draft = draft.within_depth(depth)
            rows = source.call("goose_auxiliary_rows", partial(validated, AuxiliaryRows, (self.vocab_size,)),
                               context=context)
            if rows is not None:
                auxiliary.append((name, rows))
            entries.append(self._candidates(source_id, source, draft))
        entries.sort(key=lambda c: -c.acceptance)  # stable: ties keep the configured order
        return CandidatePool(context.anchor, context.previous, self.names, tuple(entries)), auxiliary

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

    def _candidates(self, source_id: int, source: Guarded, draft: Draft | None) -> SourceCandidates:
        """The pool entry of one source: per-depth estimates of its draft when it gave them, else its estimate."""
        depths = draft.depth_acceptance if draft is not None else ()
        acceptance = candidates.chain_rate(depths, len(draft)) if len(depths) > 1 else (  # type: ignore[arg-type]
            depths[0] if depths else self.estimates[source.name].rate)

        def successors(previous: np.ndarray, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
            check = partial(candidates.checked_successors, m=len(tokens), k=max(k, 0), vocab_size=self.vocab_size)
            answer = source.call("goose_successors", check, previous=previous, tokens=tokens, k=k) \
                if len(tokens) and k > 0 else None
            return answer if answer is not None else check(None)

        return SourceCandidates(source.name, source_id, acceptance, draft, successors if "goose_successors" in
                                source.implements else None, depths if len(depths) > 1 else ())


class TopologyPlanner(Guarded):
    """One decoder's topology: its plan checked, its budget hint checked, either skipped on a fault."""

    def __init__(self, name: str, config: GooseConfig, vocab_size: int, known: Registry | None = None,
                 faults: FaultLog | None = None) -> None:
        known = known or registry()
        known.check_options("topology", config.topology_options)
        super().__init__(name, "topology", made(known.topology(name), config), faults or FaultLog())
        self.config, self.vocab_size = config, vocab_size
        if "goose_plan_tree" not in self.implements:
            raise PluginError(f"topology {name!r} does not implement goose_plan_tree")

    def plan(self, pool: CandidatePool, budget: int) -> DraftTree:
        """The topology's tree for ``pool`` within ``budget`` draft nodes; the bare anchor (a plain decoding step)
        when it answers None or fails (logged once)."""
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
