"""Summary -> PNG plots (matplotlib, Agg backend: no display needed).

- ``speedup*.png``: speedup over ``ar`` per dataset, one bar per method, with the 95% bootstrap
  interval over prompts as an error bar (``speedup_ci``);
- ``tau_topology*.png``: tau of the spine tree against Iso(3)/Iso(5) per dataset;
- ``acceptance*.png``: every source's accepted / tested draft nodes, per method (all datasets); a
  source of the method none of whose nodes was tested is a hatched "not tested" bar (or "faulted"
  where the boundary skipped its hooks), not a 0;
- ``sweep*.png``: mean tau and speedup against each swept parameter;
- ``study*.png``: the three-source study's tau and its one speedup estimate per configuration;
- ``layouts.png`` (``goose bench layouts``): every GGUF file's t(n) / t(1) against n.

Legends sit outside the axes, so no bar hides behind one.

A plot whose methods did not run is skipped. matplotlib is the ``bench`` extra; without it the
run still writes every other output and says why there are no plots.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from goose_bench.aggregate import ALL, Row, lookup
from goose_bench.methods import BASELINE, TOPOLOGY_BASELINES
from goose_bench.prompts import DATASET_TITLES


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, whatever the environment's default backend
    import matplotlib.pyplot as plt

    return plt


def _datasets(rows: Sequence[Row]) -> list[str]:
    return list(dict.fromkeys(row["dataset"] for row in rows if row["dataset"] != ALL))


def _value(rows: Sequence[Row], method: str, dataset: str, key: str) -> float:
    row = lookup(rows, method, dataset)
    value = row.get(key) if row is not None else None
    return float(value) if isinstance(value, int | float) else float("nan")


def _grouped_bars(plt: Any, groups: list[str], series: dict[str, list[float]], ylabel: str, title: str,
                  path: Path, reference: float | None = None,
                  errors: dict[str, list[list[float] | None]] | None = None,
                  untested: dict[str, list[str | None]] | None = None) -> None:
    """One group of bars per ``groups`` entry, one bar per series; ``errors``: per series and group a [low, high]
    interval (an error bar) or None; ``untested``: per series and group a label ("not tested") drawn as a hatched
    bar in place of a missing value, or None. The legend goes to the right of the axes."""
    figure, axes = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) * max(1, len(series)) / 3 + 3) + 2, 4))
    from matplotlib import patches

    width = 0.8 / max(1, len(series))
    placeholders = False
    top = max([v for values in series.values() for v in values if v == v] +
              [interval[1] for intervals in (errors or {}).values() for interval in intervals if interval] + [1.0])
    for i, (name, values) in enumerate(series.items()):
        offsets = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        bars = axes.bar(offsets, values, width, label=name)
        intervals = (errors or {}).get(name)
        if intervals and any(intervals):
            low = [v - iv[0] if iv and v == v else float("nan") for v, iv in zip(values, intervals, strict=True)]
            high = [iv[1] - v if iv and v == v else float("nan") for v, iv in zip(values, intervals, strict=True)]
            axes.errorbar(offsets, values, yerr=[low, high], fmt="none", ecolor="black", elinewidth=0.8, capsize=3)
        for offset, label in zip(offsets, (untested or {}).get(name) or [], strict=False):
            if label is None:
                continue
            # a grey hatched placeholder the height of the axes (no value), its label naming the series
            axes.bar(offset, top, width, facecolor="none", edgecolor="0.7", hatch="///", linewidth=0.0)
            axes.text(offset, top / 2, f"{name}: {label}", rotation=90, ha="center", va="center", fontsize=8,
                      color=bars.patches[0].get_facecolor(), fontweight="bold",
                      bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.9, "pad": 1.5})
            placeholders = True
    if reference is not None:
        axes.axhline(reference, color="grey", linewidth=0.8, linestyle="--")
    axes.set_xticks(range(len(groups)), groups)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    handles, labels = axes.get_legend_handles_labels()
    if placeholders:
        handles.append(patches.Patch(facecolor="none", edgecolor="0.7", hatch="///"))
        labels.append("no node tested (no value)")
    axes.legend(handles, labels, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    figure.tight_layout()
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)


def _titles(datasets: list[str], last: str = "mean") -> list[str]:
    return [DATASET_TITLES.get(d, d) for d in datasets] + [last]


def _speedup(plt: Any, summary: dict[str, Any], path: Path) -> bool:
    rows = summary["results"]
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != BASELINE]
    if not methods:
        return False
    datasets = _datasets(rows)
    series = {m: [_value(rows, m, d, "speedup") for d in [*datasets, ALL]] for m in methods}
    errors = {m: [(lookup(rows, m, d) or {}).get("speedup_ci") for d in [*datasets, ALL]] for m in methods}
    _grouped_bars(plt, _titles(datasets), series, "speedup over ar (mean, 95% bootstrap CI)",
                  f"{summary['model']}: speedup", path, 1.0, errors=errors)
    return True


def _topology(plt: Any, summary: dict[str, Any], path: Path) -> bool:
    rows = summary["results"]
    present = {r["method"] for r in rows}
    methods = [m for m in ("goose", *TOPOLOGY_BASELINES) if m in present]
    if "goose" not in methods or len(methods) < 2:
        return False
    datasets = _datasets(rows)
    series = {("spine (goose)" if m == "goose" else m): [_value(rows, m, d, "tau") for d in [*datasets, ALL]]
              for m in methods}
    _grouped_bars(plt, _titles(datasets), series, "tau (tokens per verification)",
                  f"{summary['model']}: tau by topology", path, 1.0)
    return True


def _acceptance(plt: Any, summary: dict[str, Any], path: Path) -> bool:
    """Every source's accepted / tested draft nodes (all datasets pooled), one group of bars per method."""
    rows = summary["results"]
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if (lookup(rows, m, ALL) or {}).get("source_tested")]
    if not methods:
        return False
    pooled = {m: lookup(rows, m, ALL) or {} for m in methods}
    sources = list(dict.fromkeys(s for m in methods for s in pooled[m]["source_tested"]))
    series = {s: [pooled[m]["source_acceptance"].get(s, float("nan")) for m in methods] for s in sources}

    def untested(source: str, method: str) -> str | None:
        """Why a source of the method has no acceptance: none of its nodes was tested (it faulted, or drafted
        nothing); None where it has one, or is not the method's."""
        if source in pooled[method]["source_acceptance"]:
            return None
        mine = set(pooled[method]["source_tested"]) | set(
            ((summary.get("methods", {}).get(method) or {}).get("digest") or {}).get("sources") or ())
        if source not in mine:
            return None
        return "not tested (faulted)" if source in (pooled[method].get("faults") or {}) else "not tested"

    _grouped_bars(plt, methods, series, "accepted / tested draft nodes",
                  f"{summary['model']}: acceptance per source (all datasets, measured)", path,
                  untested={s: [untested(s, m) for m in methods] for s in sources})
    return True


def _sweep(plt: Any, summary: dict[str, Any], path: Path) -> bool:
    rows = summary["results"]
    meta = summary.get("methods", {})
    groups: dict[str, list[str]] = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        group = str(meta.get(method, {}).get("group", ""))
        if group.startswith("sweep:"):
            groups.setdefault(group.removeprefix("sweep:"), []).append(method)
    if not groups:
        return False
    figure, all_axes = plt.subplots(1, len(groups), figsize=(4 * len(groups), 3.5), squeeze=False)
    for axes, (parameter, methods) in zip(all_axes[0], groups.items(), strict=True):
        labels = [m.split("=", 1)[-1] for m in methods]
        axes.plot(labels, [_value(rows, m, ALL, "tau") for m in methods], marker="o", label="tau")
        axes.plot(labels, [_value(rows, m, ALL, "speedup") for m in methods], marker="s", label="speedup")
        axes.set_title(parameter)
        axes.legend(fontsize="small")
    figure.suptitle(f"{summary['model']}: sensitivity (mean over datasets)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def _study(plt: Any, summary: dict[str, Any], path: Path) -> bool:
    """Mean tau and the report's one speedup estimate (priced over ``ar`` on --cost-curve's curve, else predicted
    over one token a pass from this device's) of every study configuration, one colour per shape."""
    study = summary.get("study")
    if not study or not study["rows"]:
        return False
    rows = sorted(study["rows"], key=lambda r: (r["topology"], len(r["sources"]), r["method"]))
    colours = {"spine": "tab:blue", "multi_spine": "tab:orange", "isotropic": "tab:green"}
    figure, axes = plt.subplots(1, 2, figsize=(13, max(4.0, 0.28 * len(rows))), sharey=True)
    positions = list(range(len(rows)))
    curve = summary.get("settings", {}).get("priced_on")
    # the report's one estimate per configuration: priced over ar on --cost-curve's curve, else this device's
    # prediction over one token a pass
    results = summary["results"]
    estimates = [(lookup(results, r["method"], ALL) or {}).get("estimated_speedup") if curve else
                 r["predicted_device"] for r in rows]
    named = ("this device's curve" if curve["curve"] == "device" else Path(str(curve["curve"])).name) if curve else ""
    estimate_title = (f"estimated speedup over ar on {named}" if curve else
                      "predicted speedup over one token a pass, this device's curve") + " (estimate)"
    for axis, values, title in ((axes[0], [r["tau"]["all"] for r in rows], "mean tau (tokens per pass)"),
                                (axes[1], estimates, estimate_title)):
        axis.barh(positions, [v or 0.0 for v in values], color=[colours.get(r["topology"], "grey") for r in rows])
        axis.set_title(title)
        axis.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(positions, [r["method"] for r in rows], fontsize=7)
    axes[0].invert_yaxis()
    figure.suptitle(f"{summary['model']}: three-source study (blue spine, orange multi_spine, green isotropic)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def layouts_plot(document: dict[str, Any], path: Path, title: str) -> None:
    """``goose bench layouts``' curves: t(n) / t(1) of every file against n, beside n itself (every row at one row's
    cost: no batched kernel at all); ``title``: the conditions, as the layouts module words them."""
    plt = _pyplot()
    sizes = document["conditions"]["sizes"]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    axes.plot(sizes, sizes, color="grey", linewidth=0.8, linestyle="--", label="n (each row at one row's cost)")
    for entry in document["files"]:
        label = (f"{entry['layout'] or 'as shipped'}: perplexity {entry['perplexity']:.3f}, "
                 f"t(1) {entry['seconds'][0] * 1e3:.1f} ms")
        axes.plot(sizes, entry["ratios"], marker="o", markersize=3, label=label)
    axes.set_xlabel("rows in the pass (n)")
    axes.set_ylabel("t(n) / t(1)")
    axes.set_title(title, fontsize="medium")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    figure.tight_layout()
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)


PLOTS = (("speedup", _speedup), ("tau_topology", _topology), ("acceptance", _acceptance), ("sweep", _sweep),
         ("study", _study))


def write_plots(summary: dict[str, Any], out: Path, suffix: str = "") -> list[str]:
    """Write every plot that has data; returns the file names (relative to ``out``)."""
    plt = _pyplot()
    written = []
    for name, plot in PLOTS:
        file_name = f"{name}{suffix}.png"
        if plot(plt, summary, out / file_name):
            written.append(file_name)
    return written

