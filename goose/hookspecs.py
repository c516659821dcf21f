"""The Goose plugin author's manual: every hook, its arguments, what it returns, when it is called.

Every rule a plugin may rely on is stated here, and the code does what it says.

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

``goose.plugins.register(module)`` (also ``goose.register``) does the same at run time, for
notebooks and scripts; ``goose.plugins.SourcePlugin(name, Class)`` is a ready-made registration
plugin for one source class.

**Names are global.** A name registered twice is an error, reported two ways:

* from an entry point: built-ins load first and keep their names; a third-party registration of a
  name already taken (or one that breaks a rule below) is skipped with one logged error, recorded
  in ``goose.plugins.registry().load_errors`` (``goose plugins`` prints them), and every other
  registration works as before;
* from an explicit ``goose.plugins.register(...)`` call: it raises ``goose.PluginError``.

**The shape of a plugin is checked** when its class is registered and again when the decoder
makes its instance: a ``goose_*`` method that is not a hook of its kind (a misspelling, say
``goose_proposee``, gets "did you mean goose_propose?"), a hook method without ``@goose.hookimpl``,
a hook argument the spec below does not have, or a pluggy ordering option (``tryfirst``,
``trylast``, ``hookwrapper``, ``wrapper``, ``optionalhook``) raises ``goose.PluginError`` naming it.
Goose calls each source's and the topology's hooks itself, one implementation at a time, so
pluggy's ordering and wrapping would do nothing; they are refused rather than ignored.
``specname`` works as in pluggy.

**Partial arguments.** A hook implementation declares only the arguments it uses, in any order,
with the names below (pluggy's rule): ``def goose_propose(self, context)`` is called without
``acceptance``, ``def goose_observe(self, outcome)`` without the rest.

**A source** is a plain class. The registry calls ``factory(config)`` (the decoder's
:class:`goose.config.GooseConfig`; read your options from ``config.options_for(name)``) to make an
instance, and the decoder calls the hooks it implements; every hook is optional, and one that is
missing costs nothing. The one job most sources have is ``goose_propose``; a source that can
branch answers ``goose_successors``; one that learns from outcomes implements ``goose_observe``.
All arrays are NumPy, on the host.

**Lifetime of an instance.** ``GooseDecoder`` makes one instance of each of its sources and of its
topology when it is made, and keeps them for every request it decodes, one request at a time.
The batched engine (``GooseDecoder.batch``, ``generate_batch``, and ``goose serve``, which decodes
up to ``--max-batch`` requests together) gives each row its own instances, made when a row first
needs them and reused, after ``goose_reset`` and ``goose_prefill``, by a later request; a source
registered ``shareable=True`` has one instance for every row instead (``GooseConfig.
batch_shared_sources``, default "auto": every shareable source the decoder drafts from), which sees
every row's hooks in turn within a cycle and is not reset when a row joins. Inside vLLM's proposer
(:mod:`goose.vllm`) each running request has its own instances, all in one thread; when a request
finishes its instances are reused for a later one (after ``goose_reset`` and ``goose_prefill``),
and one more set is made once, when the proposer starts, to see which hooks each source
implements, and never called. State meant to outlive a request therefore outlives it in every
integration, but in a batch or inside vLLM it is split over the running requests' instances
(unless shared as above; see ``suffix_memory``'s ``share`` for one memory in common inside vLLM).

**The context** (``DecodeContext.tokens``) is the prompt followed by everything generated so
far, the anchor (the last token, already verified) last. Within a request it only grows by
appending: each call's context extends the previous call's (the decoder never edits or drops a
token), so a source may index it incrementally. A new request always starts with ``goose_reset``
then ``goose_prefill``; a request may end without a last ``goose_observe``. ``vocab_size`` (in
``DecodeContext`` and every check) is the number of rows of the model's output layer, which may
exceed ``len(tokenizer)`` (padded embeddings): every token id a plugin returns must lie in
``[0, vocab_size)`` (ids the tokenizer lacks pass that check). ``DecodeContext.prediction`` is
the request's predicted output (OpenAI's Predicted Outputs) as read-only token ids, the same array
every cycle of the request, or None; any source may draft from it. A request that carries one adds
the built-in ``prediction`` source in front of the decoder's sources for that request.

**Acceptance.** A source does not keep or report its own acceptance rate: the decoder keeps one
:class:`goose.contract.acceptance.AcceptanceEstimate` per source, made for the name it was
registered under, starting at ``initial_acceptance`` (the registration's value, or
``GooseConfig.initial_acceptance[name]``) and moved by an EMA step (``GooseConfig.ema``) towards
the accepted / tested ratio of the source's tree nodes after every verification.
``goose_propose`` receives the current value, and a draft without scores gets it for every token.

**Ranking.** Each cycle the sources in the pool are ranked, most trusted first (planners give
the first drafting source the spine), by one number per source: for a draft that carries
``Draft.depth_acceptance``, the draft's own chain-equivalent rate
(:func:`goose.contract.candidates.chain_rate` over the draft's length; its only value when it has
one); otherwise (no draft, or a draft without it) the decoder's estimate above. Ties keep the
configured order. The automatic budget sizes the spine by ``depth_acceptance`` when given, else
by that same number.

**Faults are contained.** Every call into a plugin while decoding goes through one guard
(:mod:`goose.boundary`): a hook that raises, or returns something malformed (token ids
outside the vocabulary, parents out of order, wrong shapes, wrong types), is skipped for that
cycle and logged once per (plugin, hook); the output of decoding never changes because of a
plugin, only its speed.

**What ``None`` means.** From ``goose_propose``: no draft this cycle. From ``goose_successors``:
nothing known for any of the queried pairs. From ``goose_auxiliary_rows``: no extra rows. From
``goose_plan_tree``: no tree this cycle, so the cycle verifies the bare anchor (a plain decoding
step); not a fault, nothing is logged. From ``goose_spine_lengths``: no hint, the decoder assumes
the best split. None of these is logged. The other hooks' return values are ignored.

Order of calls for one request::

    goose_reset()                       once, before the prompt
    goose_prefill(context, harvest)     once, with the prompt and its positions' top-k
    repeat until done:
        goose_propose(context, acceptance)   -> Draft or None
        goose_auxiliary_rows(context)        -> AuxiliaryRows or None
        goose_spine_lengths(...)             topology, with budget="auto"
        goose_plan_tree(...)                 topology, which calls goose_successors zero or more times
        goose_observe(outcome, own_nodes, auxiliary_predictions)   after verification

**A topology** is a plain class too, made with ``factory(config)`` once per decoder (the lifetime
above); it implements ``goose_plan_tree`` and optionally ``goose_spine_lengths``.
``goose.topologies.toolkit`` holds the shape helpers the built-in planners share (best-first
branch growth, harmonic splits, rankings, a ``Planner`` base for stateless planners);
``goose.sources.toolkit`` holds the helpers the built-in sources share (stop cuts, copy-depth
estimates, frequency tries, context fingerprints, tokenizer identity).
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
    """Register candidate sources:
    ``register(name, factory, description="", initial_acceptance=0.3, shareable=False)``.

    ``factory(config: GooseConfig)`` returns a new source instance implementing some of the
    source hooks below (a class is checked at once, see the module docstring). ``initial_acceptance``
    is the estimate before any of the source's tokens has been verified, in [0, 1]. ``shareable=True``
    says an instance holds knowledge of the model, not of any one request (a table of what the target
    predicts after a bigram, say), so in a batch one instance may serve every row (see "Lifetime of an
    instance"); leave it False when an instance keeps anything of its request. Names are global: a
    name already registered is skipped with a logged error from an entry point and raises
    PluginError from ``goose.plugins.register``.
    """


@hookspec
def goose_register_topologies(register: Register) -> None:
    """Register topology planners: ``register(name, factory, description="")``.

    ``factory(config: GooseConfig)`` returns a planner instance implementing ``goose_plan_tree``
    (and optionally ``goose_spine_lengths``). Names follow the same rules as sources'.
    """


# --- candidate sources (instances) ----------------------------------------------------------


@hookspec
def goose_reset() -> None:
    """Forget per-request state before a new prompt (always followed by ``goose_prefill``).

    State meant to outlive a request (a persistent adjacency table, a memory of earlier outputs)
    is kept when the source's options say so; see the module docstring for how long an instance
    lives in each integration.
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
    """Draft tokens to follow the anchor (``context.tokens[-1]``), or None: no draft this cycle.

    Return a :class:`goose.contract.candidates.Draft`: a chain (``Draft.chain(tokens)``) or a small trie
    (``Draft.trie(paths, weights, acceptance)``). Scores, when given, estimate the chance that
    each token is accepted given that its parent was; planners prune and order nodes by them.
    Without scores every token gets ``acceptance``, this source's current estimate (see the
    module docstring). A source that knows how far this very draft is trusted per depth (context
    match: by how long the copied text has matched) says so with ``Draft.depth_acceptance``;
    the draft is then ranked by those numbers instead of the decoder's estimate, and the automatic
    budget sizes the spine by them (module docstring, "Ranking"). Nodes deeper than the tokens the
    request has left are cut before planners see the draft, so a long draft costs nothing near the
    end of ``max_new_tokens``. Called once per cycle; keep it fast (vectorised or incremental, never
    a scan of the whole context in Python).
    """


@hookspec
def goose_successors(previous: np.ndarray, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Up to k tokens likely to follow each (previous, token) pair; None: nothing known for any of them.

    ``previous`` and ``tokens`` are int64 [m] (previous is -1 when unknown). Return (successors
    int64 [m, k'], scores float [m, k']) with k' <= k, best first, -1 where nothing is known;
    scores estimate each successor's chance of being accepted after the pair. Planners call this
    while they grow branches, a whole tree level at a time.
    """


@hookspec
def goose_auxiliary_rows(context: DecodeContext) -> AuxiliaryRows | None:
    """Extra rows to ride in this cycle's verification pass without being drafted; None: none this cycle.

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
    """Turn the candidate pool into a draft tree of at most ``budget`` draft nodes; None: no tree this cycle.

    ``pool.candidates`` is ranked most trusted first (module docstring, "Ranking"); drafts carry
    scores. Returning None verifies the bare anchor (a plain decoding step) and is not a fault;
    a malformed tree is (skipped, logged once, the bare anchor verified).
    Lay nodes with ``pool.builder(budget)`` (deduplicated on (parent, token); the first source to
    lay a node keeps it, which is how the walker prefers trusted sources) and return
    ``builder.build()``. A source's ``successors(previous, tokens, k)`` answers are already checked
    and padded: int64 [m, k] and scores in [0, 1], -1 / 0 where nothing is known.
    With a fixed ``config.budget`` the budget is that one plus ``config.spine_extension`` (within the
    context's room): the extension is for the main spine alone, a long copy verified whole; everything
    else stays within ``goose.topologies.toolkit.priced(budget, config)``. With ``budget="auto"`` the
    decoder sizes the whole tree and the two are equal.
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
