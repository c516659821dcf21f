"""The Goose plugin author's manual: every hook, its arguments, what it returns, when it is called.

**Registering.** The ``goose`` entry-point group points at registration plugins (a module or an
object). Built-in sources and topologies register exactly like third-party ones::

    # pyproject.toml of your distribution
    [project.entry-points.goose]
    phrase_list = "goose_phrase_list"

    # goose_phrase_list.py
    import goose

    @goose.hookimpl
    def goose_register_sources(register):
        register("phrase_list", PhraseListSource, description="drafts from a phrase file", initial_acceptance=0.6)

(``goose.plugins.register(module)`` does the same at run time, for notebooks and scripts.)

**A source** is a plain class. The decoder makes one instance per decoder with
``factory(config)`` (the decoder's :class:`goose.config.GooseConfig`; read your options from
``config.options_for(name)``) and calls the hooks it implements; every hook is optional, and one
that is missing costs nothing. The one job most sources have is ``goose_propose``; a source that
can branch answers ``goose_successors``; one that learns from outcomes implements
``goose_observe``. All arrays are NumPy, on the host.

**Acceptance.** A source does not keep or report its own acceptance rate: the decoder keeps one
:class:`goose.contract.acceptance.AcceptanceEstimate` per source, made for the name it was registered under,
starting at ``initial_acceptance`` (the registration's value, or ``GooseConfig.initial_acceptance``
[name]) and moved by an EMA step (``GooseConfig.ema``) towards the accepted / tested ratio of the
source's tree nodes after every verification. Planners rank sources by it (the most trusted gets
the spine) and the automatic budget sizes trees by it. ``goose_propose`` receives the current
value; a draft without scores gets it for every token.

**Faults are contained.** Every call into a plugin goes through one guard
(:mod:`goose.contract.boundary`): a hook that raises, or returns something malformed (token ids outside the
vocabulary, parents out of order, wrong shapes, wrong types), is skipped for that cycle and logged
once; the output of decoding never changes because of a plugin, only its speed.

Order of calls for one request::

    goose_reset()                       once, before the prompt
    goose_prefill(context, harvest)     once, with the prompt and its positions' top-k
    repeat until done:
        goose_propose(context, acceptance)   -> Draft or None
        goose_auxiliary_rows(context)        -> AuxiliaryRows or None
        goose_spine_lengths(...)             topology, with budget="auto"
        goose_plan_tree(...)                 topology, which calls goose_successors zero or more times
        goose_observe(outcome, own_nodes, auxiliary_predictions)   after verification

**A topology** is a plain class too, made per decoder with ``factory(config)``; it implements
``goose_plan_tree`` and optionally ``goose_spine_lengths``. ``goose.topologies.toolkit`` holds the
shape helpers the built-in planners share (best-first branch growth, harmonic splits, rankings).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import numpy as np

    from goose.config import GooseConfig
    from goose.contract.candidates import CandidatePool, DecodeContext, Draft
    from goose.contract.outcome import AuxiliaryRows, Harvest, VerifyOutcome
    from goose.contract.tree import DraftTree

PROJECT = "goose"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Register = Callable[..., None]


# --- registration (entry-point plugins) -----------------------------------------------------


@hookspec
def goose_register_sources(register: Register) -> None:
    """Register candidate sources: ``register(name, factory, description="", initial_acceptance=0.3)``.

    ``factory(config: GooseConfig)`` returns a new source instance implementing some of the
    source hooks below. ``initial_acceptance`` is the estimate before any of the source's tokens
    has been verified. Names are global: registering a name twice is an error.
    """


@hookspec
def goose_register_topologies(register: Register) -> None:
    """Register topology planners: ``register(name, factory, description="")``.

    ``factory(config: GooseConfig)`` returns a planner instance implementing ``goose_plan_tree``.
    """


# --- candidate sources (instances) ----------------------------------------------------------


@hookspec
def goose_reset() -> None:
    """Forget per-request state before a new prompt.

    State meant to outlive a request (a persistent adjacency table, a memory of earlier outputs)
    is kept when the source's options say so.
    """


@hookspec
def goose_prefill(context: DecodeContext, harvest: Harvest) -> None:
    """Observe the prompt once, before the first cycle.

    ``context.tokens`` is the prompt followed by the first generated token (the anchor).
    ``harvest`` holds the target's top-k at the last prompt positions
    (``GooseConfig.prefill_harvest`` of them).
    """


@hookspec
def goose_propose(context: DecodeContext, acceptance: float) -> Draft | None:
    """Draft tokens to follow the anchor (``context.tokens[-1]``), or None.

    Return a :class:`goose.contract.candidates.Draft`: a chain (``Draft.chain(tokens)``) or a small trie
    (``Draft.trie(paths, weights, acceptance)``). Scores, when given, estimate the chance that
    each token is accepted given that its parent was; planners rank and prune by them. Without
    scores every token gets ``acceptance``, this source's current estimate (see the module
    docstring). A source that knows how far this very draft is trusted per depth (context match:
    by how long the copied text has matched) says so with ``Draft.depth_acceptance``, which the
    automatic budget sizes the spine by. Called once per cycle; keep it fast (vectorised or
    incremental, never a scan of the whole context in Python).
    """


@hookspec
def goose_successors(previous: np.ndarray, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Up to k tokens likely to follow each (previous, token) pair; None if this source cannot branch.

    ``previous`` and ``tokens`` are int64 [m] (previous is -1 when unknown). Return (successors
    int64 [m, k'], scores float [m, k']) with k' <= k, best first, -1 where nothing is known;
    scores estimate each successor's chance of being accepted after the pair. Planners call this
    while they grow branches, a whole tree level at a time.
    """


@hookspec
def goose_auxiliary_rows(context: DecodeContext) -> AuxiliaryRows | None:
    """Extra rows to ride in this cycle's verification pass without being drafted.

    Lookahead decoding uses this for its Jacobi window. The target's greedy token at each of
    these rows comes back to the same source in ``goose_observe``'s ``auxiliary_predictions``.
    """


@hookspec
def goose_observe(outcome: VerifyOutcome, own_nodes: np.ndarray, auxiliary_predictions: np.ndarray | None) -> None:
    """Learn from one verification.

    ``outcome``: the tree, the accepted path, every node's fate (``reached``: tested, i.e. its
    parent was accepted; ``accepted``), what the cycle appended and the target's top-k at every
    tree row. ``own_nodes``: bool [n], the tree nodes this source laid (first writer of a shared
    node). ``auxiliary_predictions``: int64 [a], the target's greedy token at each row this source
    added through ``goose_auxiliary_rows`` (None when it added none). The acceptance estimate is
    updated by the decoder; implement this only to learn more than that.
    """


# --- topology planners (instances) ----------------------------------------------------------


@hookspec(firstresult=True)
def goose_plan_tree(pool: CandidatePool, budget: int, config: GooseConfig) -> DraftTree | None:
    """Turn the candidate pool into a draft tree of at most ``budget`` draft nodes.

    ``pool.candidates`` is ranked by acceptance estimate, most trusted first; drafts carry scores.
    Lay nodes with ``pool.builder(budget)`` (deduplicated on (parent, token); the first source to
    lay a node keeps it, which is how the walker prefers trusted sources) and return
    ``builder.build()``. A source's ``successors(previous, tokens, k)`` answers are already checked
    and padded: int64 [m, k] and scores in [0, 1], -1 / 0 where nothing is known.
    """


@hookspec(firstresult=True)
def goose_spine_lengths(pool: CandidatePool, budgets: tuple[int, ...], config: GooseConfig) -> tuple[int, ...] | None:
    """For each candidate budget, how many nodes ``goose_plan_tree`` would lay on the main spine.

    Optional. With ``budget="auto"`` the decoder picks, each cycle, the budget whose tree it
    expects to yield the most tokens per second; it models that tree as a spine of the best
    draft plus transition branches. A planner whose spine is not the best split of the budget
    (the paper's spine gets ``B * r`` nodes, so a small budget halves a trusted 20-token match)
    says so here, and the decoder then values each budget by the tree that will really be laid.
    Return ``None`` (or leave the hook out) to let the decoder assume the best split.
    """
