"""The three-source study: every pair and triple of sources under spine, multi_spine and isotropic, at one budget.

It answers which third source, and which shape, adds tokens over the two-source spine (context
match + bigram transition), on which data, and what that costs in time on this device and on
another device's cost curve. The configurations are generated from the registry
(:func:`goose_bench.methods.suite_methods`). Per configuration and dataset:

- **tau** (tokens per verify pass). Run in float32, every lossless configuration decodes the same
  text, so tau differences are the sources' and shapes' own;
- each source's **marginal yield**: accepted tokens it laid, per pass;
- the **tokens lost without it**: tau of a triple minus tau of the same shape without that source;
- the speedup over one token a pass **predicted from a cost curve**: t(1) * tokens / sum over the
  passes of t(rows of the pass), for this device's curve (recorded by the run) and, with
  ``--cost-curve FILE``, a curve measured elsewhere (a GPU's, say: ``goose calibrate --json``).

Budgets are equal (:data:`STUDY_BUDGET` draft nodes for every configuration), so shapes compete for
the same rows; auxiliary rows are priced as in every Goose run (``GooseConfig.price_rows``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from statistics import fmean
from typing import Any

from goose.config import GooseConfig
from goose.planning.cost import CostCurve
from goose.plugins import registry
from goose_bench.estimate import priced_seconds

Record = dict[str, Any]  # one results.jsonl line (goose_bench.records)

STUDY_TOPOLOGIES: tuple[str, ...] = ("spine", "multi_spine", "isotropic")
STUDY_BUDGET = 16
REFERENCE = "cm+bt@spine"  # the paper's two-source spine, at the study's budget


def default_sources() -> list[str]:
    """GooseConfig's default sources, in its order (the paper's: the spine's source first, then the branches')."""
    return list(GooseConfig.model_fields["sources"].default_factory())  # type: ignore[misc]


def study_order(names: Iterable[str]) -> list[str]:
    """``names`` in the order the suites take sources: GooseConfig's default sources first, in the default's order,
    then the others in registration order (built-ins first, then other distributions', each group by entry-point
    name, then run-time registrations), then any unregistered ones as given. Learnt from the config and the
    registry, never from a source's name."""
    ranks = {name: rank for rank, name in enumerate(dict.fromkeys([*default_sources(), *registry().sources]))}
    return sorted(dict.fromkeys(names), key=lambda name: ranks.get(name, len(ranks)))


def short(name: str) -> str:
    """A source's name in a method's name: the short name it registered (``cm``), else its name."""
    registration = registry().sources.get(name)
    return registration.short_name if registration is not None and registration.short_name else name


def full_name(part: str) -> str:
    """The source a part of a method's name stands for: the source that registered it as its short name, else
    ``part`` itself (a composed method's name may use either)."""
    return next((r.name for r in registry().sources.values() if part and r.short_name == part), part)


def label(sources: Sequence[str], topology: str) -> str:
    return "+".join(short(s) for s in sources) + f"@{topology}"


def study_fields(sources: Sequence[str], topology: str, budget: int | None = STUDY_BUDGET) -> dict[str, Any]:
    """GooseConfig fields for ``sources`` under ``topology`` (``budget`` None: the automatic budget), each source
    with the options it registered for drafting beside another of them (``beside``)."""
    fields: dict[str, Any] = {"sources": list(sources), "topology": topology}
    if budget is not None:
        fields["budget"] = budget
    known, options = registry().sources, {}
    for name in sources:
        for other, values in (known[name].beside.items() if name in known else ()):
            if other in sources:
                options.setdefault(name, {}).update(values)
    if options:
        fields["source_options"] = options
    return fields


def predicted_speedup(records: Sequence[Record], curve: CostCurve) -> float | None:
    """Mean over samples of t(1) * tokens / (the sample's passes priced on ``curve``): the speedup over one token
    a pass on ``curve``."""
    ratios = []
    for record in records:
        seconds = priced_seconds(record, curve)
        if seconds is not None:
            ratios.append(curve.seconds[0] * record["new_tokens"] / seconds if seconds > 0 else 0.0)
    return fmean(ratios) if ratios else None


def _tau(records: Sequence[Record]) -> float | None:
    """Accepted tokens per verify pass, pooled (the main table's tau: the prefill's token is no pass's)."""
    lengths = [n for r in records for n in r["choices"][0]["accept_lengths"]]
    return sum(lengths) / len(lengths) if lengths else None


def study_rows(records: Sequence[Record], device_curve: CostCurve | None,
               named_curve: CostCurve | None = None) -> list[dict[str, Any]]:
    """Per study configuration (and the reference), per dataset and overall: tau, yields, predicted speedups. The
    configurations are the composed methods (``SOURCES@TOPOLOGY``); each row's sources and topology are its
    records' ``config``."""
    by_method: dict[str, list[Record]] = {}
    for record in records:
        by_method.setdefault(record["method"], []).append(record)
    rows = []
    for method, mine in by_method.items():
        if "@" not in method:
            continue
        datasets = list(dict.fromkeys(r["dataset"] for r in mine))
        steps = sum(r["verify_steps"] or 0 for r in mine)
        accepted: dict[str, int] = {}
        for record in mine:
            for name, count in (record.get("source_accepted") or {}).items():
                accepted[name] = accepted.get(name, 0) + count
        config = mine[0]["config"]  # the method's sources and topology as it ran, not read back from its name
        rows.append({
            "method": method,
            "sources": list(config["sources"]),
            "topology": config["topology"],
            "tau": {d: _tau([r for r in mine if r["dataset"] == d]) for d in datasets} | {"all": _tau(mine)},
            "yield_per_pass": {short(n): c / steps for n, c in accepted.items()} if steps else {},
            "speedup": fmean(r["speedup"] for r in mine if r.get("speedup") is not None)
            if any(r.get("speedup") is not None for r in mine) else None,
            "predicted_device": predicted_speedup(mine, device_curve) if device_curve else None,
            "predicted_curve": predicted_speedup(mine, named_curve) if named_curve else None,
            "identical_to_ar": fmean(bool(r["identical_to_ar"]) for r in mine if r.get("identical_to_ar") is not None)
            if any(r.get("identical_to_ar") is not None for r in mine) else None,
        })
    return rows


def tokens_lost_without(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For every triple and each of its sources: tau(triple) - tau(the same shape without that source)."""
    by_shape = {(frozenset(row["sources"]), row["topology"]): row for row in rows}
    lost = []
    for row in rows:
        if len(row["sources"]) != 3:
            continue
        for dropped in row["sources"]:
            pair = by_shape.get((frozenset(row["sources"]) - {dropped}, row["topology"]))
            if pair is not None and row["tau"]["all"] is not None and pair["tau"]["all"] is not None:
                lost.append({"triple": row["method"], "source": dropped,
                             "tau_lost": row["tau"]["all"] - pair["tau"]["all"]})
    return lost
