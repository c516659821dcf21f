"""The Goose plugin author's manual: every hook, its arguments, what it returns, when it is called.

**Registering.** The ``goose`` entry-point group names registration plugins (a module or an object); built-ins
register exactly like third-party ones::

    [project.entry-points.goose]              # pyproject.toml of your distribution
    phrase_list = "goose_phrase_list"

    @goose.hookimpl                           # goose_phrase_list.py
    def goose_register_sources(register):
        register("phrase_list", PhraseListSource, description="drafts from a phrase file", initial_acceptance=0.6)

``goose.register(plugin)`` does the same at run time (``goose.plugins.SourcePlugin(name, Class)`` is a ready-made
plugin for one source). Names are global and built-ins load first: from an entry point, a registration of a taken
name or one breaking a rule below is skipped with one logged error, kept in ``registry().load_errors`` (``goose
plugins`` prints them); ``goose.register`` raises ``goose.PluginError`` instead.

**Shape.** A class is checked when it registers, a factory function's product when it is made: a ``goose_*``
method that is no hook of its kind ("did you mean goose_propose?"), a hook without ``@goose.hookimpl``, or a hook
asking for an argument its spec below does not pass raises ``goose.PluginError`` naming it. A hook declares only
the arguments it uses, in any order (``def goose_observe(self, outcome)``). Goose calls every hook through pluggy,
one instance at a time, so pluggy's markers mean what pluggy says (``specname``, a ``wrapper`` around the same
instance's hook, ``firstresult`` on the two topology hooks).

**Sources and topologies** are plain classes; ``factory(config)`` makes an instance, which reads its options from
``config.options_for(name)`` (``GooseConfig.source_options`` or ``topology_options``: options for a name nobody
registered are an error). A source's hooks are all optional; a topology needs ``goose_plan_tree``. All arrays are
NumPy, on the host.

**Lifetime, in every door** (``GooseDecoder``, its batches, ``goose serve``, the vLLM proposer): an instance serves
one request at a time in the slot it was made for (a decoder has one slot, a batch or server ``--max-batch``, the
vLLM proposer one per running request); it is made when its slot first needs it and reused for the slot's later
requests. A source registered ``shareable=True`` (knowledge of the model, not of a request: ``bigram_transition``'s
table) has one instance for every slot of its decoder (``GooseConfig.batch_shared_sources``), is never reset and
sees every slot's hooks in turn. The decoder's first instances are made when it is built, so a bad option is an
error there; a factory that raises for a later slot costs that source in that slot, logged once.

**The context** (``DecodeContext.tokens``) is the prompt and everything generated so far, the anchor (the last,
verified token) last; within a request it only grows at the end, so a source may index it incrementally.
``vocab_size`` is the output layer's row count (it may exceed ``len(tokenizer)``): every token id a plugin returns
lies in ``[0, vocab_size)``. ``DecodeContext.prediction`` is the request's predicted output (OpenAI's Predicted
Outputs) as read-only token ids, or None; a request with one puts the built-in ``prediction`` source first.

**Acceptance.** Sources neither keep nor report a rate: the decoder keeps one estimate per registered name, from
``initial_acceptance`` (``GooseConfig.initial_acceptance[name]``, else the registration's), moved by an EMA step
(``GooseConfig.ema``) towards the accepted / tested ratio of the source's nodes after every verification; reports
give accepted / tested counts. Each cycle the pool ranks sources most trusted first (planners give the first
drafting source the spine) by the draft's chain-equivalent rate when it carries ``Draft.depth_acceptance``
(:func:`goose.contract.candidates.chain_rate`), else the estimate; ties keep the configured order. The automatic
budget sizes the spine by the same numbers.

**Faults are contained** (:mod:`goose.boundary`): a hook that raises or answers something malformed (ids outside
the vocabulary, parents out of order, wrong shapes or types) is skipped for that cycle, logged once per (plugin,
hook); the output never changes because of a plugin, only its speed. None, where a hook below returns something,
means "nothing this cycle" and is never logged; other hooks' return values are ignored.

Helpers: ``goose.topologies.toolkit`` (branch growth, harmonic splits, rankings, a ``Planner`` base) and
``goose.sources.toolkit`` (stop cuts, copy depth, frequency tries, fingerprints).
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


# --- registration plugins (entry points), asked once when the registry loads -----------------
@hookspec
def goose_register_sources(register: Register) -> None:
    """``register(name, factory, description="", initial_acceptance=0.3, shareable=False)`` per source:
    ``initial_acceptance`` in [0, 1] is the estimate before any verification; ``shareable=True`` says an instance
    holds nothing of a request, so one may serve every slot."""


@hookspec
def goose_register_topologies(register: Register) -> None:
    """``register(name, factory, description="")`` per topology planner."""


@hookspec
def goose_register_commands(register: Register) -> None:
    """``register(name, add_arguments, description="")`` per ``goose`` subcommand: ``add_arguments(parser)`` fills
    an argparse parser and sets ``run=function(args) -> exit status`` (``goose datastore`` is the rest source's)."""


# --- candidate sources, in the order a request calls them ------------------------------------
@hookspec
def goose_reset() -> None:
    """Forget per-request state: before every request's prompt, then ``goose_prefill``."""


@hookspec
def goose_prefill(context: DecodeContext, harvest: Harvest) -> None:
    """See the prompt, once a request: ``context.tokens`` is the prompt and the first generated token; ``harvest``
    the target's top-k at the last prompt positions (``GooseConfig.prefill_harvest`` of them)."""


@hookspec
def goose_propose(context: DecodeContext, acceptance: float) -> Draft | None:
    """Once a cycle, a draft to follow the anchor: a chain (``Draft.chain(tokens)``) or a small trie (``Draft.trie``).

    Scores estimate each token's chance of acceptance given its parent's; without them every token gets
    ``acceptance`` (the source's estimate). ``Draft.depth_acceptance`` says how far this very draft is trusted per
    depth (it ranks the source). Nodes deeper than the tokens the request has left are cut. Keep it vectorised or
    incremental, never a Python scan of the context.
    """


@hookspec
def goose_auxiliary_rows(context: DecodeContext) -> AuxiliaryRows | None:
    """Once a cycle, rows to ride in the verify pass without being drafted (Lookahead's Jacobi window); the
    target's greedy token at each comes back in ``goose_observe``'s ``auxiliary_predictions``."""


@hookspec
def goose_successors(previous: np.ndarray, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Up to k tokens likely to follow each (previous, token) pair (int64 [m]; previous -1 when unknown), asked by
    the planner a whole tree level at a time, zero or more times a cycle: (successors int64 [m, k'], scores float
    [m, k']), k' <= k, best first, -1 where nothing is known."""


@hookspec
def goose_observe(outcome: VerifyOutcome, own_nodes: np.ndarray, auxiliary_predictions: np.ndarray | None) -> None:
    """After every verification: ``outcome`` (the tree, the accepted path, each node's ``reached`` and ``accepted``,
    the target's top-k at every tree row), ``own_nodes`` (bool [n], the nodes this source laid first),
    ``auxiliary_predictions`` (int64 [a] for this source's auxiliary rows, else None)."""


# --- topology planners, once a cycle after the sources' drafts -------------------------------
@hookspec(firstresult=True)
def goose_spine_lengths(pool: CandidatePool, budgets: tuple[int, ...], config: GooseConfig) -> tuple[int, ...] | None:
    """With ``budget="auto"``, for each candidate budget the nodes ``goose_plan_tree`` would lay on the main spine,
    when that is not the best split of the budget (the paper's spine takes ``B * r``)."""


@hookspec(firstresult=True)
def goose_plan_tree(pool: CandidatePool, budget: int, config: GooseConfig) -> DraftTree | None:
    """The pool as a draft tree of at most ``budget`` draft nodes (None: verify the bare anchor).

    Lay nodes with ``pool.builder(budget)`` (one node per (parent, token): the first source to lay it keeps it,
    which is how the walker prefers trusted sources) and return ``builder.build()``; a source's
    ``successors(previous, tokens, k)`` answers arrive checked and padded. With a fixed ``config.budget`` the
    budget holds ``config.spine_extension`` more nodes, for the main spine alone (everything else within
    ``goose.topologies.toolkit.priced(budget, config)``); with ``"auto"`` the decoder sizes the whole tree.
    """
