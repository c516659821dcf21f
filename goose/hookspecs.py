"""The Goose plugin author's manual: every hook, its arguments, what it returns, when it is called.

Every rule a plugin may rely on is stated here, and the code does what it says.

**Registering.** The ``goose`` entry-point group points at registration plugins (a module or an
object); built-in sources and topologies register exactly like third-party ones::

    [project.entry-points.goose]              # pyproject.toml of your distribution
    phrase_list = "goose_phrase_list"

    @goose.hookimpl                           # goose_phrase_list.py
    def goose_register_sources(register):
        register("phrase_list", PhraseListSource, description="drafts from a phrase file", initial_acceptance=0.6)

``goose.register(module)`` does the same at run time; ``goose.plugins.SourcePlugin(name, Class)``
is a ready-made registration plugin for one source class. Names are global: from an entry point,
built-ins load first and a third-party registration of a taken name (or one that breaks a rule
below) is skipped with one logged error, kept in ``registry().load_errors`` (``goose plugins``
prints them); from ``goose.register`` it raises ``goose.PluginError``.

**The shape of a plugin is checked** when its class registers (a factory function's product, when
it is made): a ``goose_*`` method that is no hook of its kind ("did you mean goose_propose?"), a
hook without ``@goose.hookimpl``, or a hook asking for an argument its spec below does not pass
raises ``goose.PluginError`` naming it. Goose calls every hook through pluggy, one plugin instance
at a time, so pluggy's markers mean what pluggy says (``specname``, a ``wrapper`` around the same
instance's hook, ``firstresult`` on the two topology hooks). A hook declares only the arguments
it uses, in any order, with the names below: ``def goose_observe(self, outcome)`` is called
without the rest.

**A source** is a plain class; ``factory(config)`` makes an instance (read your options from
``config.options_for(name)``, validated by your own model) and every hook is optional. A topology
is the same, with ``goose_plan_tree`` required; ``GooseConfig.topology_options[name]`` is its
options door (``config.options_for(name)`` too). All arrays are NumPy, on the host.

**Lifetime of an instance, in every door** (``GooseDecoder``, its batches, ``goose serve``, the
vLLM proposer): an instance serves one request at a time, in the slot it was made for (a decoder
has one slot, a batch or server ``--max-batch``, the vLLM proposer one per running request). It is
made when its slot first needs it and reused for the slot's later requests, each begun with
``goose_reset`` then ``goose_prefill``. A source registered ``shareable=True`` (knowledge of the
model, not of a request: ``bigram_transition``'s table) has one instance for every slot of its
decoder instead (``GooseConfig.batch_shared_sources``), is never reset, and sees every slot's hooks
in turn. A factory that raises when a slot needs it costs that source in that slot, logged once
with its name; the decoder's first instances are made when it is built, so a bad option is an
error there.

**The context** (``DecodeContext.tokens``) is the prompt and everything generated so far, the
anchor (the last, verified token) last; within a request it only grows at the end, so a source may
index it incrementally. ``vocab_size`` is the output layer's row count (may exceed
``len(tokenizer)``): every token id a plugin returns lies in ``[0, vocab_size)``.
``DecodeContext.prediction`` is the request's predicted output (OpenAI's Predicted Outputs) as
read-only token ids, or None; a request with one puts the built-in ``prediction`` source first.

**Acceptance.** Sources do not keep or report their own rate: the decoder keeps one estimate per
registered name, starting at ``initial_acceptance`` (the registration's, or
``GooseConfig.initial_acceptance[name]``), moved by an EMA step (``GooseConfig.ema``) towards the
accepted / tested ratio of the source's nodes after every verification; ``goose_propose`` receives
it and a draft without scores gets it for every token. Reports give accepted / tested counts.

**Ranking.** Each cycle the pool ranks sources, most trusted first (planners give the first
drafting source the spine), by the draft's chain-equivalent rate when it carries
``Draft.depth_acceptance`` (:func:`goose.contract.candidates.chain_rate`), else the estimate; ties
keep the configured order. The automatic budget sizes the spine by the same numbers.

**Faults are contained** (:mod:`goose.boundary`): a hook that raises or returns something
malformed (ids outside the vocabulary, parents out of order, wrong shapes or types) is skipped for
that cycle and logged once per (plugin, hook); the output never changes because of a plugin, only
its speed. **None** means: no draft (``goose_propose``), nothing known (``goose_successors``), no
extra rows (``goose_auxiliary_rows``), no tree, verify the bare anchor (``goose_plan_tree``), no
hint (``goose_spine_lengths``); never logged. Other hooks' return values are ignored.

Order of calls for one request::

    goose_reset()                       once, before the prompt
    goose_prefill(context, harvest)     once, with the prompt and its positions' top-k
    repeat until done:
        goose_propose(context, acceptance)   -> Draft or None
        goose_auxiliary_rows(context)        -> AuxiliaryRows or None
        goose_spine_lengths(...)             topology, with budget="auto"
        goose_plan_tree(...)                 topology, which calls goose_successors zero or more times
        goose_observe(outcome, own_nodes, auxiliary_predictions)   after verification

Helpers: ``goose.topologies.toolkit`` (branch growth, harmonic splits, rankings, a ``Planner``
base) and ``goose.sources.toolkit`` (stop cuts, copy depth, frequency tries, fingerprints).
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


# --- registration plugins (entry points) ----------------------------------------------------


@hookspec
def goose_register_sources(register: Register) -> None:
    """``register(name, factory, description="", initial_acceptance=0.3, shareable=False)`` per source.

    ``initial_acceptance`` in [0, 1]: the estimate before any of its tokens was verified.
    ``shareable=True``: an instance holds nothing of a request, so one may serve every slot.
    """


@hookspec
def goose_register_topologies(register: Register) -> None:
    """``register(name, factory, description="")`` per topology planner."""


@hookspec
def goose_register_commands(register: Register) -> None:
    """``register(name, add_arguments, description="")`` per ``goose`` subcommand: ``add_arguments(parser)`` fills
    an argparse parser and sets ``run=function(args) -> exit status`` (``goose datastore`` is the rest source's)."""


# --- candidate sources ----------------------------------------------------------------------


@hookspec
def goose_reset() -> None:
    """Forget per-request state before a new prompt (always followed by ``goose_prefill``)."""


@hookspec
def goose_prefill(context: DecodeContext, harvest: Harvest) -> None:
    """See the prompt once: ``context.tokens`` is the prompt and the first generated token; ``harvest`` the
    target's top-k at the last prompt positions (``GooseConfig.prefill_harvest`` of them)."""


@hookspec
def goose_propose(context: DecodeContext, acceptance: float) -> Draft | None:
    """Draft tokens to follow the anchor: a chain (``Draft.chain(tokens)``) or a small trie (``Draft.trie``).

    Scores, when given, estimate each token's chance of acceptance given its parent's; without them
    every token gets ``acceptance``. ``Draft.depth_acceptance`` says how far this very draft is trusted
    per depth (ranking above). Nodes deeper than the tokens the request has left are cut before planners
    see them. Called once a cycle: keep it vectorised or incremental, never a Python scan of the context.
    """


@hookspec
def goose_successors(previous: np.ndarray, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Up to k tokens likely to follow each (previous, token) pair (int64 [m]; previous -1 when unknown).

    Return (successors int64 [m, k'], scores float [m, k']), k' <= k, best first, -1 where nothing is
    known. Planners call it a whole tree level at a time.
    """


@hookspec
def goose_auxiliary_rows(context: DecodeContext) -> AuxiliaryRows | None:
    """Rows to ride in this cycle's pass without being drafted (Lookahead's Jacobi window); the target's greedy
    token at each comes back in ``goose_observe``'s ``auxiliary_predictions``."""


@hookspec
def goose_observe(outcome: VerifyOutcome, own_nodes: np.ndarray, auxiliary_predictions: np.ndarray | None) -> None:
    """Learn from one verification: ``outcome`` (the tree, the accepted path, each node's ``reached`` and
    ``accepted``, the target's top-k at every tree row), ``own_nodes`` (bool [n], the nodes this source laid
    first), ``auxiliary_predictions`` (int64 [a] for this source's auxiliary rows, else None)."""


# --- topology planners ----------------------------------------------------------------------


@hookspec(firstresult=True)
def goose_plan_tree(pool: CandidatePool, budget: int, config: GooseConfig) -> DraftTree | None:
    """The pool as a draft tree of at most ``budget`` draft nodes.

    Lay nodes with ``pool.builder(budget)`` (one node per (parent, token): the first source to lay it
    keeps it, which is how the walker prefers trusted sources) and return ``builder.build()``. A source's
    ``successors(previous, tokens, k)`` answers arrive checked and padded. With a fixed
    ``config.budget`` the budget holds ``config.spine_extension`` more nodes, for the main spine alone
    (everything else within ``goose.topologies.toolkit.priced(budget, config)``); with ``"auto"`` the
    decoder sizes the whole tree.
    """


@hookspec(firstresult=True)
def goose_spine_lengths(pool: CandidatePool, budgets: tuple[int, ...], config: GooseConfig) -> tuple[int, ...] | None:
    """For each candidate budget, the nodes ``goose_plan_tree`` would lay on the main spine, when that is not the
    best split of the budget (the paper's spine takes ``B * r``); the automatic budget then values each budget
    by the tree that will really be laid."""
