"""The benchmarked methods, as data: a name, a kind, and GooseConfig fields (or generate() arguments).

Every Goose-family method is a :class:`goose.config.GooseConfig` built from its ``fields``, run by
the same :class:`goose.cycle.decoder.GooseDecoder` through the same verifier, so the methods differ only
in what the config says: the paper's baselines (PLD, TR, Lookahead, REST, Iso(k)) are the same
sources in other topologies. Suites (the main table, the ablations, the parameter sweeps) are
just more entries in the same table.

A method whose plugin is not registered (sources and topologies still being written) or whose
fields the config does not know is reported as unavailable with the reason, never a crash.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from goose.bench.study import study_configs, study_fields
from goose.config import GooseConfig, first_error
from goose.plugins import PluginError, registry

Kind = Literal["ar", "goose", "hf"]

# the paper's four "best single source" baselines (synergy table), and its topology baselines
STANDALONE_SOURCES: tuple[str, ...] = ("pld", "tr", "rest", "lookahead")
TOPOLOGY_BASELINES: tuple[str, ...] = ("iso3", "iso5")
BASELINE = "ar"  # speedups are against this method on the same prompt
PEER_BASELINE = "hf_ar"  # ... and, where it ran, also against Hugging Face's own greedy loop
LOOKUP_PEER = "hf_pld"  # ... and against Hugging Face's prompt lookup, the peer on copy-heavy prompts


@dataclass(frozen=True)
class Method:
    """One benchmarked method.

    ``fields``: GooseConfig fields for ``kind="goose"``; extra ``model.generate`` keyword arguments
    for ``kind="hf"``; nothing for ``kind="ar"``. ``prediction``: the sample's prediction (the edit
    set's code) goes with the request's first turn, as OpenAI's Predicted Outputs send it.
    """

    name: str
    kind: Kind
    description: str
    group: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    prediction: bool = False

    def config(self) -> GooseConfig:
        """The method's GooseConfig (raises pydantic's ValidationError for unknown or bad fields)."""
        return GooseConfig.model_validate(dict(self.fields))


def _table(*methods: Method) -> dict[str, Method]:
    return {method.name: method for method in methods}


_BOTH = ["context_match", "bigram_transition"]
_ALL_SOURCES = ["context_match", "bigram_transition", "rest", "lookahead"]
_UNIGRAM = {"bigram_transition": {"unigram_only": True}}
# Lookahead's and REST's drafts are tries (several candidate continuations). `chain` and `spine`
# keep only a trie's best root path; the isotropic planner lays the whole trie breadth first
# (fan-out up to isotropic_k per node, max_depth levels), which is how both methods verify.
_TRIE = {"topology": "isotropic", "isotropic_k": 10}

METHODS: dict[str, Method] = _table(
    Method("ar", "ar", "greedy, one token per forward pass, through Goose's verifier (the baseline)", "baseline"),
    Method("hf_ar", "hf", "Hugging Face model.generate, greedy (peer)", "peer"),
    Method("hf_pld", "hf", "Hugging Face prompt lookup decoding, 10 tokens (peer)", "peer",
           {"prompt_lookup_num_tokens": 10}),
    Method("pld", "goose", "PLD: context match as one chain", "source",
           {"sources": ["context_match"], "topology": "chain"}),
    Method("tr", "goose", "Token Recycling: unigram adjacency in TR's static tree", "source",
           {"sources": ["bigram_transition"], "topology": "transition_tree", "source_options": _UNIGRAM}),
    Method("lookahead", "goose", "Lookahead: Jacobi n-gram pool, its trie laid isotropically, its window in "
           "every pass", "source", {"sources": ["lookahead"], "price_rows": False, **_TRIE}),
    Method("rest", "goose", "REST: retrieval from a datastore, its trie laid isotropically", "source",
           {"sources": ["rest"], **_TRIE}),
    Method("iso3", "goose", "Iso(3): context match + bigram transition in a balanced 3-ary tree", "topology",
           {"sources": _BOTH, "topology": "isotropic", "isotropic_k": 3}),
    Method("iso5", "goose", "Iso(5): context match + bigram transition in a balanced 5-ary tree", "topology",
           {"sources": _BOTH, "topology": "isotropic", "isotropic_k": 5}),
    Method("goose", "goose", "Goose: the default GooseConfig (context-match spine, bigram branches)", "goose"),
    Method("goose3", "goose", "Goose with a third source: the default config plus the cross-request suffix memory",
           "goose", study_fields([*_BOTH, "suffix_memory"], "spine", budget=None)),
    Method("goose_rest", "goose", "Goose with REST beside its two sources: the default config plus retrieval from "
           "the datastore (default: the Python standard library)", "goose", {"sources": [*_BOTH, "rest"]}),
    Method("goose4", "goose", "Goose with all four paper sources in a multi-level spine tree", "goose",
           {"sources": _ALL_SOURCES, "topology": "multi_spine"}),
)

# The paper's ablations (Qwen3-8B table): each changes one thing of the default Goose config.
ABLATIONS: dict[str, Method] = _table(
    Method("no_spine_branches", "goose", "w/o spine branches (root branches only)", "ablation",
           {"spine_branches": False}),
    Method("unigram_adjacency", "goose", "w/o bigram adjacency (unigram keys)", "ablation",
           {"source_options": _UNIGRAM}),
    Method("no_consensus_bypass", "goose", "w/o consensus bypass", "ablation", {"consensus_bypass": False}),
    # with no drafting source the spine planner gives the whole budget to the transition tree
    Method("no_cm_spine", "goose", "w/o context-match spine (transition tree only)", "ablation",
           {"sources": ["bigram_transition"]}),
    Method("tr_spine_tokens", "goose", "w/o PLD tokens: shape kept, transition tokens on the spine", "ablation",
           {"spine_tokens": "transition"}),
)


def _sweep() -> dict[str, Method]:
    """One-parameter sweeps around the defaults (the paper's sensitivity study)."""
    methods: list[Method] = []
    for budget in (8, 16, 32, 60, 100):
        methods.append(Method(f"B={budget}", "goose", f"budget B = {budget}", "sweep:budget", {"budget": budget}))
    for depth in (2, 4, 6, 8):
        methods.append(Method(f"D={depth}", "goose", f"max depth D = {depth}", "sweep:max_depth",
                              {"max_depth": depth}))
    for ratio in (0.15, 0.3, 0.5, 0.7):
        # one tier for every acceptance level: the confidence-adaptive choice is switched off
        methods.append(Method(f"r={ratio:g}", "goose", f"fixed spine ratio r = {ratio:g}", "sweep:spine_ratio",
                              {"spine_tiers": [{"below": 1.01, "ratio": ratio}]}))
    methods.append(Method("r=optimal", "goose", "spine length of the best spine tree instead of a ratio",
                          "sweep:spine_ratio", {"spine_split": "optimal"}))
    for rho in (0.0, 0.25, 0.5, 0.75, 1.0):
        methods.append(Method(f"rho={rho:g}", "goose", f"spine-branch ratio rho = {rho:g}", "sweep:rho",
                              {"spine_branch_ratio": rho}))
    return _table(*methods)


SWEEP: dict[str, Method] = _sweep()
# The three-source study (goose.bench.study): every pair and triple of sources under three shapes
STUDY: dict[str, Method] = _table(*(Method(name, "goose", f"study: {name.replace('@', ' in ')}", "study", fields)
                                    for name, fields in study_configs().items()))
# Requests that carry the sample's prediction (datasets with one: edit, or a JSONL with a 'prediction')
PREDICTION: dict[str, Method] = _table(
    Method("goose_pred", "goose", "Goose with the sample's prediction as its most trusted source (Predicted "
           "Outputs)", "prediction", prediction=True),
)
ALL_METHODS: dict[str, Method] = {**METHODS, **ABLATIONS, **SWEEP, **STUDY, **PREDICTION}

MAIN_METHODS: tuple[str, ...] = tuple(METHODS)
QUICK_METHODS: tuple[str, ...] = ("ar", "pld", "goose", "hf_pld")
SUITES: dict[str, tuple[str, ...]] = {
    "ablation": ("goose", *ABLATIONS),
    "sweep": ("goose", *SWEEP),
    "three-source": ("goose", "goose3", *STUDY),
}


def resolve_methods(names: Iterable[str]) -> list[Method]:
    """The named methods in order, without repeats, with the ``ar`` baseline first (always run)."""
    ordered: list[str] = [BASELINE]
    for name in names:
        if name not in ALL_METHODS:
            raise ValueError(f"unknown method {name!r}; known: {', '.join(ALL_METHODS)}")
        if name not in ordered:
            ordered.append(name)
    return [ALL_METHODS[name] for name in ordered]


def with_datastore(method: Method, datastore: Path) -> Method:
    """``method`` with REST drafting from ``datastore`` (a ``goose datastore build`` folder), if it drafts from REST.

    The folder replaces the default datastore (the standard library) and nothing else: the
    method's other REST options stay as they are.
    """
    if method.kind != "goose" or "rest" not in method.fields.get("sources", ()):
        return method
    options = {name: dict(values) for name, values in method.fields.get("source_options", {}).items()}
    options["rest"] = {**options.get("rest", {}), "datastore": str(datastore)}
    return replace(method, fields={**method.fields, "source_options": options},
                   description=f"{method.description} [REST datastore {datastore}]")


def unavailable_reason(method: Method) -> str | None:
    """Why ``method`` cannot run in this installation (None when it can, as far as a static check tells)."""
    if method.kind != "goose":
        return None
    try:
        config = method.config()
    except ValidationError as error:
        return f"config field {first_error(error)}"
    known = registry()
    for name in config.sources:
        if name not in known.sources:
            return f"source {name!r} is not registered (its plugin is not installed or failed to load)"
    if config.topology not in known.topologies:
        return f"topology {config.topology!r} is not registered (its plugin is not installed or failed to load)"
    return None


def construction_problem(error: Exception, method: Method) -> str:
    """One line for an error raised while a method's decoder was built (bad source options, etc.)."""
    if isinstance(error, ValidationError):
        return f"options {first_error(error, 'options')}"
    if isinstance(error, PluginError):
        return str(error)
    return f"{type(error).__name__}: {error}"
