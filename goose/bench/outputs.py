"""Summaries -> the files of ``--out``: ``summary.json``, ``report.md`` and the plots.

``results.jsonl`` is written by the runner as it goes. With one model ``summary.json`` is that
model's summary object; with several it is a JSON list of them, in ``--model`` order, and the
plots carry the model in their names (``speedup-<model>.png``). ``report.md`` has one section per
model either way.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from goose.bench.report import build_report

logger = logging.getLogger("goose.bench")

SUMMARY_FILE = "summary.json"
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
        from goose.bench.plots import write_plots

        for summary in summaries:
            suffix = "" if len(summaries) == 1 else f"-{_slug(summary['model'])}"
            plots += write_plots(summary, out, suffix)
    except ImportError as error:  # matplotlib is the `bench` extra
        logger.warning("no plots: %s (pip install 'goose-decoding[bench]')", error)
    (out / REPORT_FILE).write_text(build_report(summaries, plots), encoding="utf-8")
    return [out / SUMMARY_FILE, out / REPORT_FILE, *(out / p for p in plots)]
