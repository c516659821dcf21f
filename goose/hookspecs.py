"""The Goose plugin author's manual: every hook, its arguments, what it returns, when it is called.

**Registering.** A distribution names a registration plugin (module or object) in the ``goose`` entry-point group
(``[project.entry-points.goose] phrase_list = "goose_phrase_list"``); built-ins do the same and load first, and
``goose.register(plugin)`` does it at run time (``goose.plugins.SourcePlugin(name, Class)``: one source). Names are
global. A registration of a taken name or breaking a rule below raises ``goose.PluginError`` from
``goose.register``; from an entry point it is skipped, logged and kept in ``registry().load_errors`` (``goose
plugins`` prints them).

**Shape**, checked when a class registers (a factory function's product, when made): a ``goose_*`` method that is
no hook of its kind ("did you mean goose_propose?"), a hook without ``@goose.hookimpl``, or an argument its spec
does not pass raises ``goose.PluginError`` naming it. A hook asks only for the arguments it uses, in any order.
Hooks are called through pluggy, one instance at a time: ``specname``, ``wrapper`` (around the same instance's
hook) and ``firstresult`` (the topology hooks') mean what pluggy says.

**Options.** ``factory(config)`` makes an instance, which reads its options from ``config.options_for(name)``
(``GooseConfig.source_options[name]``, ``topology_options[name]``); options for a name nobody registered are an
error ("did you mean"). Register ``options=Model`` (a pydantic ``BaseModel`` subclass) and Goose validates them
through it before the factory runs, refusing keys the model does not declare whatever its ``extra``
(``source_options.context_match: unknown option 'ngram_size' (did you mean 'ngram_sizes'? known: ngram_sizes,
...)``) and naming a bad value's field with pydantic's message, a ``goose.PluginError`` when the decoder is made;
the factory may validate them again with the same model (the built-ins do). Without a model Goose cannot tell which
keys the factory reads: check them there.

**Instances.** A source's hooks are all optional; a topology needs ``goose_plan_tree``. In every door an instance
serves one request at a time in the slot it was made for (a ``GooseDecoder`` has one, a batch or ``goose serve``
``--max-batch``, the vLLM proposer one per running request), made when the slot first needs it and reused for its
later requests; a ``shareable`` source has one instance for all its decoder's slots, never reset, seeing every
slot's hooks in turn. The decoder's first instances are made when it is built (a bad option is an error there); a
factory that raises for a later slot costs that source in that slot, logged once.

**Data** is NumPy, on the host. ``DecodeContext.tokens`` is the prompt and all generated so far, the anchor (the
last, verified token) last; within a request it only grows at the end (index it incrementally). Token ids are
integers (any integer dtype; floats and bools are malformed, never rounded: ``Draft.chain([1.5, 2.7])`` raises
``CandidateError``) in ``[0, DecodeContext.vocab_size)``, the output layer's rows (it may exceed
``len(tokenizer)``); ``.prediction`` is the request's predicted output (OpenAI's Predicted Outputs) as read-only
ids, or None (a request with one puts the built-in ``prediction`` source first).

**Acceptance.** The decoder keeps one estimate per source name (sources keep none), from ``initial_acceptance``
(``GooseConfig.initial_acceptance[name]``, else the registration's), moved by an EMA step (``GooseConfig.ema``)
towards the accepted / tested ratio of the source's nodes at every verification. Each cycle sources rank most
trusted first (planners give the first drafting one the spine) by the draft's chain-equivalent rate when it
carries ``Draft.depth_acceptance`` (:func:`goose.contract.candidates.chain_rate`), else the estimate; ties keep the
configured order.

**Faults are contained** (:mod:`goose.boundary`): a hook that raises or answers malformed (ids that are not
integers or lie outside the vocabulary, parents out of order, wrong shapes or types) is skipped for that cycle,
logged once per (plugin, hook); a plugin changes the speed, never the output. None means nothing this cycle, never
logged; what ``goose_reset``, ``goose_prefill`` and ``goose_observe`` return is ignored. Helpers:
``goose.{sources,topologies}.toolkit``.
"""

from collections.abc import Callable

import numpy as np
import pluggy

from goose.config import GooseConfig
from goose.contract.candidates import CandidatePool, DecodeContext, Draft
from goose.contract.outcome import AuxiliaryRows, Harvest, VerifyOutcome
from goose.contract.tree import DraftTree

PROJECT = "goose"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
Register = Callable[..., None]


# --- registration plugins, asked once when the registry loads ---------------------------------
@hookspec
def goose_register_sources(register: Register) -> None:
    """``register(name, factory, description="", initial_acceptance=0.3, shareable=False, options=None,
    short_name="", beside={}, needs_request="")`` per source: the estimate before any verification, in [0, 1];
    ``shareable=True``: an instance knows the model, not a request (one for all); ``options``: the pydantic model its
    ``source_options`` are validated through ("Options" above); ``short_name``: what a method name may call it
    (goose-bench's ``cm+bt@spine``), unique; ``beside``: another source's name -> the options this one takes in a
    composed method that drafts from both (goose-bench applies them; checked by ``options``); ``needs_request``: the
    request input it drafts from alone (``"prediction"``: ``DecodeContext.prediction``), without which it drafts
    nothing (goose-bench's suites leave it out of their default sources)."""


@hookspec
def goose_register_topologies(register: Register) -> None:
    """``register(name, factory, description="", options=None)`` per topology planner (``options``: the pydantic
    model its ``topology_options`` are validated through)."""


@hookspec
def goose_register_commands(register: Register) -> None:
    """``register(name, add_arguments, description="")`` per ``goose`` subcommand: ``add_arguments(parser)`` fills
    an argparse parser and sets ``run=function(args) -> exit status`` (``goose datastore`` is the rest source's)."""


# --- candidate sources -----------------------------------------------------------------------
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
    Scores estimate each token's chance of acceptance given its parent's (without them every token gets
    ``acceptance``, the source's estimate); ``Draft.depth_acceptance`` how far this very draft is trusted per depth.
    Nodes deeper than the tokens the request has left are cut. Vectorise: never a Python scan of the context."""


@hookspec
def goose_successors(previous: np.ndarray, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Up to k tokens likely to follow each (previous, token) pair (int64 [m]; previous -1 when unknown), asked by
    the planner a whole tree level at a time, zero or more times a cycle: (successors int64 [m, k'], scores float
    [m, k']), k' <= k, best first, -1 where nothing is known."""


@hookspec
def goose_auxiliary_rows(context: DecodeContext) -> AuxiliaryRows | None:
    """Once a cycle, rows to ride in the verify pass without being drafted (Lookahead's Jacobi window); the
    target's greedy token at each comes back in ``goose_observe``'s ``auxiliary_predictions``."""


@hookspec
def goose_observe(outcome: VerifyOutcome, own_nodes: np.ndarray, auxiliary_predictions: np.ndarray | None) -> None:
    """After every verification: ``outcome`` (the tree, the accepted path, each node's ``reached`` and ``accepted``,
    the target's top-k at every tree row), ``own_nodes`` (bool [n], the nodes this source laid first),
    ``auxiliary_predictions`` (int64 [a] for this source's auxiliary rows, else None)."""


# --- topology planners -----------------------------------------------------------------------
@hookspec(firstresult=True)
def goose_plan_tree(pool: CandidatePool, budget: int, config: GooseConfig) -> DraftTree | None:
    """Once a cycle, the pool as a draft tree of at most ``budget`` draft nodes (None: verify the bare anchor).
    Lay nodes with ``pool.builder(budget)`` (one per (parent, token): the first source to lay it keeps it, so the
    walker prefers trusted sources), return ``builder.build()``; successor answers arrive checked and padded. A fixed
    ``config.budget`` holds ``config.spine_extension`` more nodes, for the main spine alone (the rest within
    ``goose.topologies.toolkit.priced(budget, config)``); with ``"auto"`` the decoder sizes the whole tree."""


@hookspec(firstresult=True)
def goose_spine_lengths(pool: CandidatePool, budgets: tuple[int, ...], config: GooseConfig) -> tuple[int, ...] | None:
    """With ``budget="auto"``, before ``goose_plan_tree``: for each candidate budget the nodes it would lay on the
    main spine, when that is not the best split of the budget (the paper's spine takes ``B * r``)."""


__all__ = ["PROJECT", "Register", "hookimpl", "hookspec"]
