"""The plugin boundary: every call from the decoder into a source or a topology, guarded and checked.

A plugin may raise, or answer with something malformed (ids outside the vocabulary, parents out
of order, wrong shapes or types). Either costs that plugin's contribution for the cycle, with one
logged warning per (plugin, hook), and never the output: a skipped draft is a draft not verified,
a skipped tree is the bare anchor, a skipped budget hint is the planner's own estimate. This is
the only place such checks live; sources, topologies and the decoder trust what comes out of it.

It is also where the sources' acceptance estimates live (one :class:`AcceptanceEstimate` per
registered name, see :mod:`goose.contract.acceptance`): the boundary hands each source its estimate when
asking for a draft, fills unscored drafts with it, and updates it from every outcome. Sources are
ranked by one number per cycle: the chain-equivalent rate (:func:`chain_rate`) of the draft's
``depth_acceptance`` when the draft carries one, else the source's estimate.

It sits beside the registry it makes plugins from (:mod:`goose.plugins`). A plugin's shape (hook
names, markers, options) is checked when its instance is made (:func:`goose.plugins.plugin_manager`):
a misspelled or unmarked hook is a PluginError then, not a source that silently never drafts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pluggy
from pydantic import ValidationError

from goose.config import GooseConfig, first_error
from goose.contract.acceptance import AcceptanceEstimate
from goose.contract.candidates import (
    CandidateError,
    CandidatePool,
    DecodeContext,
    Draft,
    SourceCandidates,
    SuccessorFn,
    chain_rate,
)
from goose.contract.outcome import AuxiliaryRows, Harvest, VerifyOutcome
from goose.contract.tree import DraftTree
from goose.plugins import PluginError, Registration, Registry, plugin_manager, registry

logger = logging.getLogger("goose.plugins")

Implementation = tuple[str, Callable[..., Any], tuple[str, ...]]  # (plugin name, function, argument names)


class FaultLog:
    """Logs a plugin fault once per (plugin, hook); later faults of the same kind are counted, not logged."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}

    def warn(self, kind: str, name: str, hook: str, problem: str) -> None:
        key = (name, hook)
        self.counts[key] = self.counts.get(key, 0) + 1
        if self.counts[key] == 1:
            logger.warning("%s %r skipped in %s: %s (further faults of this kind are not logged)",
                           kind, name, hook, problem)


def _implementations(manager: pluggy.PluginManager, hook: str, order: tuple[str, ...]) -> list[Implementation]:
    found = {impl.plugin_name: (impl.plugin_name, impl.function, tuple(impl.argnames))
             for impl in getattr(manager.hook, hook).get_hookimpls()}
    return [found[name] for name in order if name in found]


def made(registration: Registration, config: GooseConfig) -> Any:
    """A plugin's instance; what its constructor raises comes back as a PluginError naming the plugin."""
    try:
        return registration.factory(config)
    except Exception as error:
        detail = first_error(error, "options") if isinstance(error, ValidationError) else str(error)
        raise PluginError(f"{registration.kind} {registration.name!r} could not be made: {type(error).__name__}: "
                          f"{detail}") from error


class SourceSet:
    """One decoder's live sources: their instances, their acceptance estimates, and guarded calls into them."""

    def __init__(self, names: list[str] | tuple[str, ...], config: GooseConfig, vocab_size: int,
                 known: Registry | None = None, faults: FaultLog | None = None,
                 estimates: dict[str, AcceptanceEstimate] | None = None,
                 instances: dict[str, Any] | None = None) -> None:
        """``estimates``, ``instances``: acceptance estimates and source instances to share with another
        source set (one of each per name is made where absent)."""
        known = known or registry()
        self.names: tuple[str, ...] = tuple(names)
        self.vocab_size = vocab_size
        self.faults = faults or FaultLog()
        self.instances: dict[str, Any] = {}
        self.estimates = estimates if estimates is not None else {}
        unknown = sorted(set(config.source_options) - set(known.sources))
        if unknown:  # options for a source nobody registered would be ignored without a word
            raise PluginError(f"source_options names {', '.join(map(repr, unknown))}, not a registered source; "
                              f"registered sources: {', '.join(sorted(known.sources))}")
        for name in self.names:
            registration = known.source(name)
            shared = (instances or {}).get(name)
            self.instances[name] = shared if shared is not None else made(registration, config)
            if name not in self.estimates:
                initial = config.initial_acceptance.get(name, registration.initial_acceptance)
                self.estimates[name] = AcceptanceEstimate(name, initial, config.ema)
        manager = plugin_manager(self.instances, "source")  # PluginError on a misspelled or unmarked hook
        self._hooks = {hook: _implementations(manager, hook, self.names)
                       for hook in ("goose_reset", "goose_prefill", "goose_propose", "goose_auxiliary_rows",
                                    "goose_successors", "goose_observe")}
        self._successors = {name: self._guarded_successors(name, function, argnames)
                            for name, function, argnames in self._hooks["goose_successors"]}

    def implements(self, name: str, hook: str) -> bool:
        return any(implementation[0] == name for implementation in self._hooks[hook])

    def _call(self, hook: str, implementation: Implementation, **kwargs: Any) -> Any:
        name, function, argnames = implementation
        try:
            return function(**{argument: kwargs[argument] for argument in argnames})
        except Exception as error:  # a faulty source costs its contribution for the cycle, never the output
            self.faults.warn("source", name, hook, f"raised {type(error).__name__}: {error}")
            return None

    # --- the request's life -----------------------------------------------------------------

    def reset(self, keep: frozenset[str] = frozenset()) -> None:
        """A new request begins: every source but those in ``keep`` (instances shared with other rows) resets."""
        for implementation in self._hooks["goose_reset"]:
            if implementation[0] not in keep:
                self._call("goose_reset", implementation)

    def prefill(self, context: DecodeContext, harvest: Harvest) -> None:
        for implementation in self._hooks["goose_prefill"]:
            self._call("goose_prefill", implementation, context=context, harvest=harvest)

    def propose(self, context: DecodeContext, depth: int | None = None
                ) -> tuple[CandidatePool, list[tuple[str, AuxiliaryRows]]]:
        """Every source's checked draft, ranked by acceptance, and the auxiliary rows that asked to ride along;
        ``depth``: the most draft tokens a path may keep (the tokens the request has left), deeper nodes cut."""
        drafts: dict[str, Draft | None] = {}
        for implementation in self._hooks["goose_propose"]:
            name = implementation[0]
            rate = self.estimates[name].rate
            answer = self._call("goose_propose", implementation, context=context, acceptance=rate)
            draft = self._checked_draft(name, answer, rate)
            drafts[name] = draft.within_depth(depth) if draft is not None and depth is not None else draft
        auxiliary: list[tuple[str, AuxiliaryRows]] = []
        for implementation in self._hooks["goose_auxiliary_rows"]:
            answer = self._call("goose_auxiliary_rows", implementation, context=context)
            if answer is None:
                continue
            try:
                if not isinstance(answer, AuxiliaryRows):
                    raise TypeError(f"returned {type(answer).__name__}, not AuxiliaryRows")
                auxiliary.append((implementation[0], answer.validated(self.vocab_size)))
            except (TypeError, ValueError) as error:
                self.faults.warn("source", implementation[0], "goose_auxiliary_rows", str(error))
        candidates = [self._candidates(source_id, name, drafts.get(name)) for source_id, name in enumerate(self.names)]
        candidates.sort(key=lambda c: -c.acceptance)  # stable: ties keep the configured order
        return CandidatePool(context.anchor, context.previous, self.names, tuple(candidates)), auxiliary

    def observe(self, outcome: VerifyOutcome,
                auxiliary_predictions: dict[str, np.ndarray]) -> dict[str, tuple[int, int]]:
        """Update every estimate from its source's nodes, then let the sources learn; returns (tested, accepted)."""
        counts, own = {}, {}
        for source_id, name in enumerate(self.names):
            own[name] = outcome.tree.source_ids == source_id
            counts[name] = (int(np.count_nonzero(own[name] & outcome.reached)),
                            int(np.count_nonzero(own[name] & outcome.accepted)))
            self.estimates[name].observe(*counts[name])
        for implementation in self._hooks["goose_observe"]:
            name = implementation[0]
            self._call("goose_observe", implementation, outcome=outcome, own_nodes=own[name],
                       auxiliary_predictions=auxiliary_predictions.get(name))
        return counts

    # --- checks -----------------------------------------------------------------------------

    def _candidates(self, source_id: int, name: str, draft: Draft | None) -> SourceCandidates:
        """The pool entry of one source: per-depth estimates of its draft when it gave them, else its estimate."""
        depths = draft.depth_acceptance if draft is not None else ()
        if len(depths) > 1:
            acceptance = chain_rate(depths, len(draft))  # type: ignore[arg-type]
        else:
            acceptance = depths[0] if depths else self.estimates[name].rate
            depths = ()
        return SourceCandidates(name=name, source_id=source_id, acceptance=acceptance, draft=draft,
                                successors=self._successors.get(name), depth_acceptance=depths)

    def _checked_draft(self, name: str, answer: object, rate: float) -> Draft | None:
        if answer is None:
            return None
        try:
            if not isinstance(answer, Draft):
                raise CandidateError(f"goose_propose returned {type(answer).__name__}, not a Draft")
            return answer.validated(self.vocab_size, rate)
        except CandidateError as error:
            self.faults.warn("source", name, "goose_propose", str(error))
            return None

    def _guarded_successors(self, name: str, function: Callable[..., Any], argnames: tuple[str, ...]) -> SuccessorFn:
        implementation = (name, function, argnames)

        def successors(previous: np.ndarray, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
            m = tokens.shape[0]
            if m == 0 or k <= 0:
                return np.full((m, max(k, 0)), -1, dtype=np.int64), np.zeros((m, max(k, 0)))
            answer = self._call("goose_successors", implementation, previous=previous, tokens=tokens, k=k)
            return self._checked_successors(name, answer, m, k)

        return successors

    def _checked_successors(self, name: str, answer: object, m: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """A successor answer as exactly int64 [m, k] and scores in [0, 1] (-1 / 0 where nothing is known)."""
        tokens, scores = np.full((m, k), -1, dtype=np.int64), np.zeros((m, k))
        if answer is None:
            return tokens, scores
        try:
            found, found_scores = (np.asarray(part) for part in answer)  # type: ignore[union-attr]
            if found.ndim != 2 or found.shape[0] != m or found_scores.shape != found.shape:
                raise CandidateError(f"successor shapes {found.shape} / {found_scores.shape} do not fit {m} queries")
            if found.size and not np.issubdtype(found.dtype, np.integer):
                raise CandidateError(f"successor tokens must be integers, got {found.dtype}")
            if found.size and (int(found.max()) >= self.vocab_size or int(found.min()) < -1):
                raise CandidateError(f"successor token ids outside the vocabulary [0, {self.vocab_size})")
            width = min(k, found.shape[1])
            tokens[:, :width] = found[:, :width]
            raw = found_scores[:, :width].astype(np.float64)
        except (CandidateError, TypeError, ValueError) as error:
            self.faults.warn("source", name, "goose_successors", str(error))
            return np.full((m, k), -1, dtype=np.int64), np.zeros((m, k))
        usable = (tokens[:, :width] >= 0) & np.isfinite(raw) & (raw > 0.0)
        scores[:, :width] = np.where(usable, np.minimum(raw, 1.0), 0.0)
        return tokens, scores


class TopologyPlanner:
    """One decoder's topology: its plan checked, its budget hint checked, either skipped on a fault."""

    def __init__(self, name: str, config: GooseConfig, vocab_size: int, known: Registry | None = None,
                 faults: FaultLog | None = None) -> None:
        known = known or registry()
        self.name = name
        self.config = config
        self.vocab_size = vocab_size
        self.faults = faults or FaultLog()
        self.instance = made(known.topology(name), config)
        manager = plugin_manager({name: self.instance}, "topology")  # PluginError on a misspelled or unmarked hook
        plans = _implementations(manager, "goose_plan_tree", (name,))
        if not plans:
            raise PluginError(f"topology {name!r} does not implement goose_plan_tree")
        self._plan = plans[0]
        hints = _implementations(manager, "goose_spine_lengths", (name,))
        self._hint = hints[0] if hints else None

    def plan(self, pool: CandidatePool, budget: int) -> DraftTree:
        """The topology's tree for ``pool`` within ``budget`` draft nodes.

        The bare anchor (a plain decoding step) when the planner answers None (no tree this cycle,
        not a fault) or fails (logged once).
        """
        _, function, argnames = self._plan
        arguments = {"pool": pool, "budget": budget, "config": self.config}
        try:
            tree = function(**{a: arguments[a] for a in argnames})
            if tree is None:
                return DraftTree.single(pool.anchor, pool.source_names)
            return checked_tree(tree, pool, budget, self.vocab_size)
        except Exception as error:  # a faulty planner costs speed for a cycle, never correctness
            self.faults.warn("topology", self.name, "goose_plan_tree", f"{type(error).__name__}: {error}")
            return DraftTree.single(pool.anchor, pool.source_names)

    def spine_lengths(self, pool: CandidatePool, budgets: tuple[int, ...]) -> tuple[int, ...] | None:
        """The topology's spine length for every candidate budget (``goose_spine_lengths``), if it says."""
        if self._hint is None:
            return None
        _, function, argnames = self._hint
        arguments = {"pool": pool, "budgets": budgets, "config": self.config}
        try:
            lengths = function(**{a: arguments[a] for a in argnames})
            if lengths is None:
                return None
            lengths = tuple(int(length) for length in lengths)
            if len(lengths) != len(budgets) or min(lengths, default=0) < 0:
                raise CandidateError(f"{len(lengths)} spine lengths for {len(budgets)} budgets, or a negative one")
            return lengths
        except Exception as error:  # a faulty hint costs the budget's accuracy, never correctness
            self.faults.warn("topology", self.name, "goose_spine_lengths", f"{type(error).__name__}: {error}")
            return None


def checked_tree(tree: object, pool: CandidatePool, budget: int, vocab_size: int) -> DraftTree:
    """``tree`` if it is a well-formed draft tree for ``pool`` within ``budget``; CandidateError otherwise."""
    if not isinstance(tree, DraftTree):
        raise CandidateError(f"planner returned {type(tree).__name__}, not a DraftTree")
    n = tree.size
    if n > budget + 1 or int(tree.tokens[0]) != pool.anchor or int(tree.parents[0]) != -1:
        raise CandidateError("tree exceeds its budget or is not rooted at the anchor")
    if any(array.shape != (n,) for array in (tree.parents, tree.depths, tree.source_ids, tree.on_spine)):
        raise CandidateError("tree arrays disagree in length")
    if n > 1:
        parents = tree.parents[1:]
        if not ((parents >= 0) & (parents < np.arange(1, n))).all():
            raise CandidateError("tree parents must precede their children")
        if int(tree.tokens.min()) < 0 or int(tree.tokens.max()) >= vocab_size:
            raise CandidateError("tree token ids outside the vocabulary")
        if np.unique(tree.parents * vocab_size + tree.tokens).shape[0] != n:
            raise CandidateError("tree has duplicate (parent, token) nodes")
        if not (tree.depths[1:] == tree.depths[parents] + 1).all():
            raise CandidateError("tree depths disagree with its parents")
        if int(tree.depths.max()) > tree.max_depth:
            raise CandidateError("tree is deeper than its max_depth")
    return tree

