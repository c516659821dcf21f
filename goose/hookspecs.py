"""The Goose plugin author's manual: every hook, its arguments, what it returns, when it is called.

There are two kinds of plugin object.

*Registration plugins* are what the ``goose`` entry-point group points at (a module or an
object). Built-in sources and topologies are registered exactly like third-party ones::

    # pyproject.toml of your distribution
    [project.entry-points.goose]
    phrase_list = "goose_phrase_list"

    # goose_phrase_list.py
    import goose

    @goose.hookimpl
    def goose_register_sources(register):
        register("phrase_list", PhraseListSource, description="drafts from a phrase file")

*Source and topology instances* are made by the registered factories, one per decoder, and
hold all the per-request state (an adjacency table belongs to its source instance, not to a
module). A source instance implements any subset of the source hooks below; a topology
instance implements ``goose_plan_tree`` (and, optionally, ``goose_spine_lengths`` to tell the
automatic budget what tree a budget will buy). Factories are called as ``factory(config)`` with the
decoder's :class:`goose.config.GooseConfig`; read your options from
``config.options_for(name)``.

Faults are contained: a source hook that raises, or returns a malformed draft (token ids
outside the vocabulary, parents out of order, wrong shapes), is skipped for that cycle and
logged once; the output of decoding never changes because of a plugin, only its speed.

Order of calls for one request::

    goose_reset()                       once, before the prompt
    goose_prefill(context, harvest)     once, with the prompt and its positions' top-k
    repeat until done:
        goose_propose(context)          -> Draft or None
        goose_acceptance()              -> the planner ranks sources by it (may describe this draft)
        goose_auxiliary_rows(context)   -> AuxiliaryRows or None
        goose_spine_lengths(...)        topology, with budget="auto": spine per candidate budget
        goose_successors(...)           zero or more times, while the planner builds the tree
        goose_observe(outcome)          after verification
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import torch

    from goose.candidates import CandidatePool, DecodeContext, Draft
    from goose.config import GooseConfig
    from goose.outcome import AuxiliaryRows, Harvest, VerifyOutcome
    from goose.tree import DraftTree

PROJECT = "goose"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Register = Callable[..., None]


# --- registration (entry-point plugins) -----------------------------------------------------


@hookspec
def goose_register_sources(register: Register) -> None:
    """Register candidate sources: ``register(name, factory, description="")``.

    ``factory(config: GooseConfig)`` returns a new source instance implementing some of the
    source hooks below. Names are global: registering a name twice is an error.
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

    State meant to outlive a request (a persistent adjacency table, a datastore) is kept when
    the source's options say so.
    """


@hookspec
def goose_prefill(context: DecodeContext, harvest: Harvest) -> None:
    """Observe the prompt once, before the first cycle.

    ``context.tokens`` is the prompt followed by the first generated token (the anchor).
    ``harvest`` holds the target's top-k at the last prompt positions
    (``GooseConfig.prefill_harvest`` of them).
    """


@hookspec
def goose_propose(context: DecodeContext) -> Draft | None:
    """Draft tokens to follow the anchor (``context.tokens[-1]``), or None.

    Return a :class:`goose.candidates.Draft`: a chain (``Draft.chain(tokens, scores)``) or a
    small trie. Scores estimate the probability that each token is accepted given that its
    parent was; planners use them to rank and prune. Called once per cycle; keep it fast
    (vectorised or incremental, never a scan of the whole context in Python).
    """


@hookspec
def goose_successors(previous: torch.Tensor, tokens: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Up to k tokens likely to follow each (previous, token) pair; None if this source cannot branch.

    ``previous`` and ``tokens`` are int64 [m] (previous is -1 when unknown). Return
    (successors int64 [m, k'], scores float32 [m, k']) with k' <= k, best first, -1 where nothing
    is known. Planners call this while they grow branches, a whole tree level at a time.
    """


@hookspec
def goose_acceptance() -> float | Sequence[float] | None:
    """The source's current estimate of its per-token acceptance rate, in [0, 1].

    Planners rank sources by it (the most trusted source gets the spine), and the automatic
    budget sizes the tree by it. Called each cycle *after* ``goose_propose``, so a source may
    report how far it trusts this cycle's draft in particular. A number is one rate for every
    draft token; a sequence gives it per draft depth (entry i: draft token i + 1 accepted given
    that its parent was; the last entry repeats), which the budget planner sizes the spine by
    (context match reports its copy-depth estimates this way). Where one number is needed (the
    ranking, the spine ratio), a sequence counts as its chain-equivalent rate over the draft:
    expected accepted over expected tested tokens. The built-in sources keep EMAs
    (``GooseConfig.ema``) of accepted / tested nodes of their own.
    """


@hookspec
def goose_auxiliary_rows(context: DecodeContext) -> AuxiliaryRows | None:
    """Extra rows to ride in this cycle's verification pass without being drafted.

    Lookahead decoding uses this for its Jacobi window. Their logits come back in
    ``outcome.auxiliary[<source name>]`` and their argmax (on the host) in
    ``outcome.auxiliary_predictions[<source name>]``.
    """


@hookspec
def goose_observe(outcome: VerifyOutcome) -> None:
    """Learn from one verification: the accepted path, every node's fate and the target's top-k."""


# --- topology planners (instances) ----------------------------------------------------------


@hookspec(firstresult=True)
def goose_plan_tree(pool: CandidatePool, budget: int, config: GooseConfig) -> DraftTree | None:
    """Turn the candidate pool into a draft tree of at most ``budget`` draft nodes.

    ``pool.candidates`` is ranked by acceptance estimate, most trusted first. Lay nodes with
    ``pool.builder(budget)`` (deduplicated on (parent, token); the first source to lay a node
    keeps it, which is how the walker prefers trusted sources) and return ``builder.build()``.
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
