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

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import ValidationError

from goose.config import GooseConfig, did_you_mean, first_error
from goose.plugins import BUILTIN_ORIGIN, PluginError, registry
from goose_bench.study import (
    STUDY_BUDGET,
    STUDY_TOPOLOGIES,
    default_sources,
    full_name,
    label,
    study_fields,
    study_order,
)

Kind = Literal["ar", "goose", "hf"]

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


def _spine(**options: Any) -> dict[str, Any]:
    """The fields that give the spine topology ``options``."""
    return {"topology_options": {"spine": options}}


# Lookahead's and REST's drafts are tries (several candidate continuations). `chain` and `spine`
# keep only a trie's best root path; the isotropic planner lays the whole trie breadth first
# (fan-out up to its k per node, max_depth levels), which is how both methods verify.
_TRIE = {"topology": "isotropic", "topology_options": {"isotropic": {"k": 10}}}

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
           {"sources": _BOTH, "topology": "isotropic", "topology_options": {"isotropic": {"k": 3}}}),
    Method("iso5", "goose", "Iso(5): context match + bigram transition in a balanced 5-ary tree", "topology",
           {"sources": _BOTH, "topology": "isotropic", "topology_options": {"isotropic": {"k": 5}}}),
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
           _spine(branches=False)),
    Method("unigram_adjacency", "goose", "w/o bigram adjacency (unigram keys)", "ablation",
           {"source_options": _UNIGRAM}),
    Method("no_consensus_bypass", "goose", "w/o consensus bypass", "ablation", _spine(consensus_bypass=False)),
    # with no drafting source the spine planner gives the whole budget to the transition tree
    Method("no_cm_spine", "goose", "w/o context-match spine (transition tree only)", "ablation",
           {"sources": ["bigram_transition"]}),
    Method("tr_spine_tokens", "goose", "w/o PLD tokens: shape kept, transition tokens on the spine", "ablation",
           _spine(tokens="transition")),
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
                              _spine(split="tiers", tiers=[{"below": 1.01, "ratio": ratio}])))
    methods.append(Method("r=optimal", "goose", "spine length of the best spine tree instead of a ratio",
                          "sweep:spine_ratio", _spine(split="optimal")))
    for rho in (0.0, 0.25, 0.5, 0.75, 1.0):
        methods.append(Method(f"rho={rho:g}", "goose", f"spine-branch ratio rho = {rho:g}", "sweep:rho",
                              _spine(branch_ratio=rho)))
    return _table(*methods)


SWEEP: dict[str, Method] = _sweep()
# Requests that carry the sample's prediction (datasets with one: edit, or a JSONL with a 'prediction')
PREDICTION: dict[str, Method] = _table(
    Method("goose_pred", "goose", "Goose with the sample's prediction as its most trusted source (Predicted "
           "Outputs)", "prediction", prediction=True),
)
# The built-in names: fixed definitions, aliases of configurations any composed method can also say
ALL_METHODS: dict[str, Method] = {**METHODS, **ABLATIONS, **SWEEP, **PREDICTION}

MAIN_METHODS: tuple[str, ...] = tuple(METHODS)
QUICK_METHODS: tuple[str, ...] = ("ar", "pld", "goose", "hf_pld")
SUITE_NAMES: tuple[str, ...] = ("ablation", "synergy", "three-source", "sweep")
# a source's standalone row in the synergy suite: the paper's baseline that drafts from that source alone, where
# there is one (pld, tr, lookahead, rest)
STANDALONE_ALIASES: dict[str, str] = {method.fields["sources"][0]: name for name, method in METHODS.items()
                                      if method.group == "source"}


@dataclass(frozen=True)
class Overrides:
    """What ``--budget`` and ``--config`` set on every composed, generated and study-file method (built-in
    names keep their definitions)."""

    budget: int | str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)

    def apply(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """``fields`` under the overrides: ``--config`` first, the method's own fields over it (its sources and
        topology are its name), per-plugin options merged, then ``--budget``."""
        merged = {**self.config, **fields}
        for table in ("source_options", "topology_options"):
            options = {name: dict(values) for name, values in self.config.get(table, {}).items()}
            for name, values in fields.get(table, {}).items():
                options[name] = {**options.get(name, {}), **values}
            if options:
                merged[table] = options
        if self.budget is not None:
            merged["budget"] = self.budget
        return merged


NO_OVERRIDES = Overrides()


def composed(name: str, overrides: Overrides = NO_OVERRIDES, group: str = "composed",
             budget: int | None = None) -> Method:
    """``SOURCES@TOPOLOGY`` (sources joined by ``+``, registered names or short names, the built-ins' cm, bt,
    la, sm; no ``@``: the default topology) as a Goose method; PluginError names an unknown plugin.
    ``budget``: the method's own budget (a suite's equal budget), under ``--budget``."""
    spec, _, topology = name.partition("@")
    sources = [full_name(part) for part in spec.split("+")]
    if not all(sources) or "@" in topology or (name.count("@") and not topology):
        raise ValueError(f"method {name!r}: write SOURCES@TOPOLOGY, sources joined by '+', e.g. "
                         "context_match+bigram_transition@spine")
    known = registry()
    for source in sources:
        known.source(source)
    topology = topology or GooseConfig.model_fields["topology"].default
    known.topology(topology)
    fields = study_fields(sources, topology, budget)
    return Method(name, "goose", f"{' + '.join(sources)} in {topology}", group, overrides.apply(fields))


def method_named(name: str, overrides: Overrides = NO_OVERRIDES) -> Method:
    """A built-in name, else a composed method (``SOURCES@TOPOLOGY``); ValueError / PluginError say why not."""
    if name in ALL_METHODS:
        return ALL_METHODS[name]
    try:
        return composed(name, overrides)
    except PluginError as error:
        near = "" if "@" in name or "+" in name else did_you_mean(name, [BASELINE, *ALL_METHODS])  # else: the plugin's
        raise ValueError(f"unknown method {name!r}{near}: not a built-in name (goose bench methods) and not "
                         f"SOURCES@TOPOLOGY of registered plugins: {error}") from None


def read_study_file(path: Path, overrides: Overrides = NO_OVERRIDES) -> list[Method]:
    """The methods of a study file (TOML or JSON): ``[methods.NAME]`` tables of GooseConfig fields (and an optional
    ``description``); each is validated and its plugins checked before any model loads."""
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text) if path.suffix != ".json" else json.loads(text)
    except OSError as error:
        raise ValueError(f"--methods-file: cannot read {path}: {error.strerror or error}") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"--methods-file: {path} is not valid {path.suffix.lstrip('.') or 'TOML'}: {error}") from None
    tables = data.get("methods") if isinstance(data, dict) else None
    if not isinstance(tables, dict) or not tables:
        raise ValueError(f"--methods-file: {path} needs a [methods.NAME] table per method, e.g. [methods.mine] "
                         'with sources = ["context_match"] and topology = "chain"')
    methods = []
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise ValueError(f"--methods-file: {path}: methods.{name} must be a table of GooseConfig fields")
        if name in ALL_METHODS or name == BASELINE:
            raise ValueError(f"--methods-file: {path}: methods.{name} is a built-in method's name; choose another")
        fields = {key: value for key, value in table.items() if key != "description"}
        method = Method(name, "goose", str(table.get("description", f"from {path.name}")), "study-file",
                        overrides.apply(fields))
        problem = unavailable_reason(method)
        if problem is not None:
            raise ValueError(f"--methods-file: {path}: methods.{name}: {problem}")
        methods.append(method)
    return methods


def builtin_sources() -> list[str]:
    """The sources goose itself registers that draft from the context alone (not one registered with
    ``needs_request``, as the prediction source is: it drafts only from a request's predicted output), in the
    suites' order (:func:`goose_bench.study.study_order`: GooseConfig's default sources lead). Which sources these
    are and their order are the registry's and the config's word (origin, ``needs_request``, registration order),
    never a source's name."""
    return study_order(name for name, r in registry().sources.items()
                       if r.origin == BUILTIN_ORIGIN and not r.needs_request)


def suite_methods(suite: str, sources: Sequence[str] | None = None, disable: Sequence[str] = (),
                  overrides: Overrides = NO_OVERRIDES) -> list[Method]:
    """The methods of ``--suite``, generated from the registry for ``sources`` (default: the built-ins) less
    ``disable``; every plugin named is checked first (PluginError).

    - ``ablation``: ``goose`` and the paper's five config ablations; the default without each of its sources;
      for every other source S: S alone, the default plus S, and S in place of each default source (spine);
    - ``synergy``: ``goose``, every source alone (the paper's baselines for its four), every pair in a spine;
    - ``three-source``: ``goose`` and every pair and triple under spine, multi_spine and isotropic at one equal
      budget (:data:`STUDY_BUDGET` draft nodes, or ``--budget``);
    - ``sweep``: the budget, depth, spine-ratio and rho sweeps around the default (its sources: ``--sources``
      when given).
    """
    if suite not in SUITE_NAMES:
        raise ValueError(f"unknown suite {suite!r}{did_you_mean(suite, SUITE_NAMES)}; suites: {', '.join(SUITE_NAMES)}")
    known = registry()
    for name in [*(sources or ()), *disable]:
        known.source(name)
    chosen = [s for s in (list(sources) if sources else builtin_sources()) if s not in set(disable)]
    if not chosen:
        raise ValueError("--disable switches off every source of the suite: keep at least one")
    default = default_sources()
    if suite == "sweep":
        base = overrides.apply({"sources": chosen} if sources or disable else {})
        return [ALL_METHODS["goose"], *(replace(m, fields={**base, **m.fields}) for m in SWEEP.values())]
    made: dict[str, Method] = {"goose": ALL_METHODS["goose"]}

    def add(members: Sequence[str], topology: str = "spine", group: str = "composed", budget: int | None = None
            ) -> None:
        name = label(members, topology)
        method = composed(name, overrides, group, budget)
        if not any(other.config() == method.config() for other in made.values()):  # no_cm_spine is bt@spine
            made.setdefault(name, method)

    if suite == "ablation":
        made |= ABLATIONS
        for dropped in default:
            if len(default) > 1:
                add([s for s in default if s != dropped], group="ablation:without")
        for source in [s for s in chosen if s not in default]:
            add([source], group="ablation:alone")
            add([*default, source], group="ablation:added")
            for replaced in default:
                add([source if s == replaced else s for s in default], group="ablation:instead")
    elif suite == "synergy":
        for source in chosen:
            alias = STANDALONE_ALIASES.get(source)
            if alias is not None:
                made[alias] = replace(ALL_METHODS[alias], group="standalone")
            else:
                add([source], group="standalone")
        for pair in itertools.combinations(chosen, 2):
            add(pair, group="pair")
    else:  # three-source
        for size in (2, 3):
            for members in itertools.combinations(chosen, size):
                for topology in STUDY_TOPOLOGIES:
                    add(members, topology, "study", STUDY_BUDGET)
    return list(made.values())


def resolve_methods(names: Iterable[str | Method], overrides: Overrides = NO_OVERRIDES) -> list[Method]:
    """The methods in order, without repeats, with the ``ar`` baseline first (always run): names are built-in
    methods or ``SOURCES@TOPOLOGY``; Method objects (suites, study files) are taken as they are."""
    ordered: dict[str, Method] = {BASELINE: ALL_METHODS[BASELINE]}
    for item in names:
        method = item if isinstance(item, Method) else method_named(item, overrides)
        ordered.setdefault(method.name, method)
    return list(ordered.values())


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
