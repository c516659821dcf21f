"""Summaries -> the files of ``--out``: ``summary.json``, ``summary.csv``, ``report.md`` and the plots.

``results.jsonl`` is written by the runner as it goes. With one model ``summary.json`` is that
model's summary object; with several it is a JSON list of them, in ``--model`` order, and the
plots carry the model in their names (``speedup-<model>.png``). ``report.md`` has one section per
model either way. ``summary.csv`` holds one line per model, method and dataset (the ``all`` rows
included): the figures (with the bootstrap intervals' bounds), the plugins that faulted (``name: count
(first message)``, ``;``-separated), the method's config and every source's accepted and tested draft nodes.
"""

from __future__ import annotations

import csv
import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from goose_bench.report import build_report

logger = logging.getLogger("goose_bench")

SUMMARY_FILE = "summary.json"
CSV_FILE = "summary.csv"
CSV_FIGURES = ("samples", "speedup", "speedup_ci_low", "speedup_ci_high", "speedup_min", "speedup_median",
               "speedup_max", "speedup_of_sums", "ratios_disagree", "tau", "tokens_per_s", "identical_to_ar",
               "speedup_vs_hf_pld", "estimated_speedup", "estimated_speedup_ci_low", "estimated_speedup_ci_high",
               "first_token_s", "faults")
REPORT_FILE = "report.md"


def _slug(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_") or "model"


def write_outputs(summaries: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """Write summary, plots and report for ``summaries``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    document: Any = summaries[0] if len(summaries) == 1 else list(summaries)
    (out / SUMMARY_FILE).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    plots: list[str] = []
    try:
        from goose_bench.plots import write_plots

        for summary in summaries:
            suffix = "" if len(summaries) == 1 else f"-{_slug(summary['model'])}"
            plots += write_plots(summary, out, suffix)
    except ImportError as error:  # matplotlib is the `bench` extra
        logger.warning("no plots: %s (pip install 'goose-decoding[bench]')", error)
    write_csv(summaries, out / CSV_FILE)
    (out / REPORT_FILE).write_text(build_report(summaries, plots), encoding="utf-8")
    return [out / SUMMARY_FILE, out / CSV_FILE, out / REPORT_FILE, *(out / p for p in plots)]


def write_csv(summaries: Sequence[dict[str, Any]], path: Path) -> None:
    """One line per (model, method, dataset): figures, config, and accepted / tested per source (all sources)."""
    rows = [(summary["model"], row) for summary in summaries for row in summary["results"]]
    sources = list(dict.fromkeys(s for _, row in rows for s in row.get("source_tested") or {}))
    header = ["model", "method", "dataset", *CSV_FIGURES, "sources", "topology", "budget", "options", "changed",
              *(f"{kind}:{s}" for s in sources for kind in ("accepted", "tested", "acceptance"))]
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        for model, row in rows:
            spread = row.get("speedup_spread") or [None, None, None]
            figures = {**row, "speedup_min": spread[0], "speedup_median": spread[1], "speedup_max": spread[2],
                       "faults": "; ".join(f"{name}: {entry['count']} ({entry.get('first')})"
                                           for name, entry in (row.get("faults") or {}).items())}
            for key in ("speedup", "estimated_speedup"):
                low, high = row.get(f"{key}_ci") or (None, None)
                figures |= {f"{key}_ci_low": low, f"{key}_ci_high": high}
            config = row.get("config") or {}
            counts = []
            for source in sources:
                tested = (row.get("source_tested") or {}).get(source)
                accepted = (row.get("source_accepted") or {}).get(source)
                counts += [accepted, tested, accepted / tested if tested else None]
            writer.writerow([model, row["method"], row["dataset"], *(figures.get(key) for key in CSV_FIGURES),
                             "+".join(config.get("sources") or ()), config.get("topology"), config.get("budget"),
                             json.dumps(config.get("source_options")) if config.get("source_options") else "",
                             json.dumps(config.get("changed")) if config.get("changed") else "", *counts])
