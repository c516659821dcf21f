"""``goose bench`` reporting: bootstrap intervals, plugin faults, one estimate per method, the plots, ``--dry-run``
and the structured-prompt dataset."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import goose
from goose import cli, models, plugins
from goose.config import GooseConfig
from goose_bench import plots
from goose_bench.aggregate import ALL, bootstrap_ci, build_summary, lookup
from goose_bench.generators import TurnOutput
from goose_bench.outputs import write_outputs
from goose_bench.prompts import DATASET_TITLES, KNOWN_DATASETS, PACKAGED_DATA, Sample, load_samples
from goose_bench.records import build_record, compare
from goose_bench.report import build_report


def _turn(ids: list[int], wall: float, steps: list[int], stats: dict[str, Any] | None = None) -> TurnOutput:
    drafted = len(steps) < len(ids) - 1  # fewer passes than tokens after the first: context match drafted
    base = {"source_tested": {"context_match": 4} if drafted else {},
            "source_accepted": {"context_match": 2} if drafted else {}, "path_kinds": {}, "prefill_s": 0.0,
            "mean_tree_size": 1.0}
    return TurnOutput(prompt_tokens=5, new_token_ids=ids, text="", wall_s=wall, stop_reason="max_new_tokens",
                      accepted_lengths=steps, stats=base | (stats or {}))


def _records(speedups: dict[str, list[float]], faults: dict[str, Any] | None = None) -> list[dict]:
    """``ar`` and ``goose`` on every prompt, ``goose`` that many times faster (tokens/s) than ``ar`` on it."""
    records = []
    for dataset, values in speedups.items():
        for qid, speedup in enumerate(values):
            sample = Sample(dataset, qid, ("p",))
            measured = {"ar": build_record("tiny", "ar", sample, [_turn([1, 2, 3, 4], 1.0, [1, 1, 1])]),
                        "goose": build_record("tiny", "goose", sample, [
                            _turn([1, 2, 3, 4], 1.0 / speedup, [3], {"faults": faults} if faults else None)])}
            compare(measured)
            records += measured.values()
    return records


# --- bootstrap intervals -----------------------------------------------------------------------


def test_bootstrap_ci_holds_the_mean_narrows_with_more_prompts_and_is_deterministic() -> None:
    generator = np.random.default_rng(7)
    few, many = generator.lognormal(0.4, 0.3, 12), generator.lognormal(0.4, 0.3, 300)
    narrow, wide = bootstrap_ci([many]), bootstrap_ci([few])
    assert wide[0] < few.mean() < wide[1] and narrow[0] < many.mean() < narrow[1]
    assert narrow[1] - narrow[0] < (wide[1] - wide[0]) / 2  # ~sqrt(300 / 12) = 5 times narrower
    assert bootstrap_ci([few]) == wide  # a fixed seed: the same prompts, the same interval
    assert bootstrap_ci([[1.5]]) is None and bootstrap_ci([[]]) is None  # nothing to resample
    # the all row's statistic: the mean of dataset means, prompts resampled within each dataset
    low, high = bootstrap_ci([[2.0, 4.0], [1.0]])
    assert (low, high) == (1.5, 2.5)


def test_intervals_reach_the_summary_csv_and_report(tmp_path: Path) -> None:
    records = _records({"humaneval": [1.2, 1.5, 1.9, 2.4], "gsm8k": [0.9, 1.1, 1.3]})
    summary = build_summary("tiny", "cpu", "float32", records)
    row, overall = lookup(summary["results"], "goose", "humaneval"), lookup(summary["results"], "goose", ALL)
    assert row["speedup_ci"] == bootstrap_ci([[1.2, 1.5, 1.9, 2.4]])
    assert row["speedup_ci"][0] < row["speedup"] < row["speedup_ci"][1]
    assert overall["speedup_ci"] == bootstrap_ci([[1.2, 1.5, 1.9, 2.4], [0.9, 1.1, 1.3]])
    assert summary["bootstrap"]["resamples"] == 2000 and summary["bootstrap"]["level"] == 0.95
    write_outputs([summary], tmp_path)
    lines = list(csv.DictReader((tmp_path / "summary.csv").open()))
    line = next(r for r in lines if r["method"] == "goose" and r["dataset"] == ALL)
    assert [float(line["speedup_ci_low"]), float(line["speedup_ci_high"])] == pytest.approx(overall["speedup_ci"])
    report = (tmp_path / "report.md").read_text()
    low, high = overall["speedup_ci"]
    assert f"| {overall['speedup']:.2f}x | {low:.2f}–{high:.2f}x |" in report and "95% CI" in report


# --- faults ------------------------------------------------------------------------------------


def test_faults_carried_by_the_statistics_reach_summary_csv_and_report(tmp_path: Path) -> None:
    """The path GenerationStats will take: a ``faults`` entry in a turn's statistics."""
    faults = {"raising": {"kind": "source", "count": 3, "hooks": {"goose_propose": 2, "goose_observe": 1},
                          "first": "goose_propose: raised RuntimeError: boom"}}
    records = _records({"gsm8k": [1.1, 1.3]}, faults)
    assert records[1]["faults"] == faults and records[0]["faults"] == {}  # goose's record; ar's has none
    summary = build_summary("tiny", "cpu", "float32", records)
    pooled = lookup(summary["results"], "goose", ALL)["faults"]["raising"]
    assert (pooled["count"], pooled["samples"], pooled["hooks"]) == (6, 2, {"goose_propose": 4, "goose_observe": 2})
    assert pooled["first"] == "goose_propose: raised RuntimeError: boom"
    write_outputs([summary], tmp_path)
    line = next(r for r in csv.DictReader((tmp_path / "summary.csv").open()) if r["method"] == "goose")
    assert line["faults"] == "raising: 6 (goose_propose: raised RuntimeError: boom)"
    report = (tmp_path / "report.md").read_text()
    assert ("| `goose` | **all** | `raising` (source) | 6 | 2/2 | goose_propose 4, goose_observe 2 | "
            "goose_propose: raised RuntimeError: boom |") in report


class RaisingSource:
    def __init__(self, config: GooseConfig) -> None:
        pass

    @goose.hookimpl
    def goose_propose(self, context):
        raise RuntimeError("boom")


class RaisingPlugin:
    @goose.hookimpl
    def goose_register_sources(self, register) -> None:
        register("raising", RaisingSource, initial_acceptance=0.99)


@pytest.fixture
def raising_source() -> Iterator[None]:
    registrations = plugins.register(RaisingPlugin(), origin="tests")
    yield
    plugins.unregister(registrations)


def test_a_raising_source_in_a_real_run_is_reported(tmp_path: Path, raising_source, tiny, monkeypatch) -> None:
    """A source that raises on every cycle, in a whole `goose bench` run (on the tiny random-weight model): its faults,
    counted per sample, reach results.jsonl, summary.json, summary.csv, report.md and the acceptance plot, not a silent
    source that never fired."""
    monkeypatch.setattr(models, "load", lambda name, **options: tiny)
    status = cli.main(["bench", "run", "--model", "tiny", "--dtype", "float32", "--datasets", "gsm8k", "--limit", "2",
                       "--max-new-tokens", "6", "--methods", "raising+cm@chain", "--out", str(tmp_path),
                       "--no-progress"])
    assert status == 0
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    raising = [r for r in records if r["method"] == "raising+cm@chain"]
    assert len(raising) == 2
    for record in raising:  # asked on every sample (a fresh decoder each); a row resting from drafting is not asked
        assert 0 < record["faults"]["raising"]["count"] <= record["verify_steps"]
        assert record["faults"]["raising"]["first"] == "goose_propose: raised RuntimeError: boom"
    assert all(r["faults"] == {} for r in records if r["method"] == "ar")
    summary = json.loads((tmp_path / "summary.json").read_text())
    pooled = lookup(summary["results"], "raising+cm@chain", ALL)
    assert pooled["faults"]["raising"]["count"] == sum(r["faults"]["raising"]["count"] for r in raising)
    assert pooled["faults"]["raising"]["samples"] == 2 and pooled["source_tested"].get("raising", 0) == 0
    line = next(r for r in csv.DictReader((tmp_path / "summary.csv").open()) if r["method"] == "raising+cm@chain")
    assert line["faults"].startswith("raising: ")
    report = (tmp_path / "report.md").read_text()
    assert "### Plugin faults" in report and "`raising` (source)" in report and "RuntimeError: boom" in report
    assert "not tested: faulted" in report  # the acceptance table, where it showed a dash
    assert (tmp_path / "acceptance.png").stat().st_size > 0


# --- one estimate per method -------------------------------------------------------------------


def test_one_estimate_per_method_named_by_its_curve() -> None:
    """The study's predictions over one token a pass and the priced estimate over ar are two numbers for one speedup;
    with --cost-curve only the priced one is shown, in every table, with the curve's name."""
    rows = [{"method": "ar", "dataset": d, "samples": 2, "speedup": 1.0, "estimated_speedup": 1.0, "tau": 1.0}
            for d in ("gsm8k", ALL)]
    rows += [{"method": "cm+bt@spine", "dataset": d, "samples": 2, "speedup": 1.31, "estimated_speedup": 2.0,
              "estimated_speedup_ci": [1.8, 2.2], "tau": 2.1} for d in ("gsm8k", ALL)]
    curve = {"curve": "docs/bench/gpu/curve.json", "sizes": [1, 2], "seconds": [0.01, 0.011]}
    study = {"rows": [{"method": "cm+bt@spine", "sources": ["cm", "bt"], "topology": "spine",
                       "tau": {"gsm8k": 2.1, "all": 2.1}, "yield_per_pass": {"cm": 0.9}, "speedup": 1.25,
                       "predicted_device": 1.51, "predicted_curve": 1.94}], "tokens_lost_without": []}
    summary = {"model": "tiny", "device": "cpu", "dtype": "float32", "settings": {"priced_on": curve},
               "results": rows, "study": study}
    report = build_report([summary])
    assert "1.94x" not in report and "1.51x" not in report  # the predictions over one token a pass
    assert "### Estimated speedup on `docs/bench/gpu/curve.json`" in report
    assert "| `cm+bt@spine` | 2.00x / 2.10 | 2.00x | 1.80–2.20x |" in report  # the estimate table
    assert "est. over `ar` on `docs/bench/gpu/curve.json`" in report
    assert "| `cm+bt@spine` | 2.10 | 2.10 | +0.0% (0/1 >= +10%) | 2.00x | 1.31x |" in report  # measured: main table's
    del summary["settings"]["priced_on"]  # no curve: the device's prediction is the one estimate
    report = build_report([summary])
    assert "pred. over one token a pass, this device's curve" in report and "1.51x" in report
    assert "1.94x" not in report and "2.00x" not in report


# --- plots -------------------------------------------------------------------------------------


class _Keep:
    """matplotlib.pyplot, but the figures are kept open for the test to inspect."""

    def __init__(self) -> None:
        self.plt, self.figures = plots._pyplot(), []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.plt, name)

    def close(self, figure: Any) -> None:
        self.figures.append(figure)


def test_speedup_plot_has_error_bars_and_its_legend_outside(tmp_path: Path) -> None:
    from matplotlib.container import ErrorbarContainer

    summary = build_summary("tiny", "cpu", "float32", _records({"humaneval": [1.2, 1.5, 3.9], "gsm8k": [2.0, 2.6]}))
    keep = _Keep()
    assert plots._speedup(keep, summary, tmp_path / "speedup.png")
    (figure,) = keep.figures
    axes = figure.axes[0]
    bars = [c for c in axes.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 1 and len(bars[0].lines[2][0].get_segments()) == 3  # humaneval, gsm8k, mean
    figure.canvas.draw()
    legend, frame = axes.get_legend().get_window_extent(), axes.get_window_extent()
    assert legend.x0 >= frame.x1  # beside the axes: no bar behind it
    keep.plt.close(figure)


def test_acceptance_plot_draws_a_source_never_tested_as_not_tested(tmp_path: Path) -> None:
    summary = build_summary("tiny", "cpu", "float32", _records({"gsm8k": [1.5]}))
    summary["methods"] = {"goose": {"digest": {"sources": ["context_match", "silent"]}}}
    lookup(summary["results"], "goose", ALL)["source_tested"]["silent"] = 0  # in the method, never tested
    keep = _Keep()
    assert plots._acceptance(keep, summary, tmp_path / "acceptance.png")
    (figure,) = keep.figures
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert texts == ["silent: not tested"]
    heights = [p.get_height() for p in figure.axes[0].patches if p.get_hatch() is None]
    assert [h for h in heights if h == h] == [0.5]  # context_match's 2 of 4; no bar of height 0 for the silent one
    keep.plt.close(figure)


# --- --dry-run ---------------------------------------------------------------------------------


def test_dry_run_prints_the_expansion_and_loads_no_model(tmp_path: Path, capsys, monkeypatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("--dry-run loaded a model")

    monkeypatch.setattr(models, "load", refuse)
    monkeypatch.setattr(models, "load_gguf", refuse)
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"sizes": [1, 2, 4], "seconds": [0.01, 0.011, 0.013]}))
    out = tmp_path / "out"
    status = cli.main(["bench", "run", "--dry-run", "--methods", "goose,cm+bt@chain,hf_pld", "--datasets",
                       "humaneval,structured", "--limit", "2", "--max-new-tokens", "16", "--dtype", "float32",
                       "--cost-curve", str(curve), "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0 and not out.exists()
    assert "goose        goose  sources context_match+bigram_transition, topology spine, budget auto" in printed
    assert "cm+bt@chain  goose  sources context_match+bigram_transition, topology chain, budget auto" in printed
    assert "hf_pld       hf     model.generate(prompt_lookup_num_tokens=10)" in printed
    assert "humaneval: 2 prompts, 2 turns" in printed and "structured: 2 prompts, 3 turns" in printed
    # 4 methods (ar added) x 5 turns x 15 passes a turn (the prefill gives the first token) at 10 ms
    assert "at most 300 verify passes beside 20 prefills" in printed and "about 3 s" in printed


# --- the structured dataset --------------------------------------------------------------------


def test_the_structured_dataset_loads(tmp_path: Path) -> None:
    samples = load_samples("structured", PACKAGED_DATA)
    assert len(samples) == 40 and "structured" in KNOWN_DATASETS and DATASET_TITLES["structured"] == "Structured"
    categories = [s.category for s in samples]
    assert {c: categories.count(c) for c in set(categories)} == {
        "numbered_list": 8, "table": 8, "json": 8, "csv": 8, "log": 8}
    assert len({s.question_id for s in samples}) == 40 and all(s.turns and all(t.strip() for t in s.turns)
                                                               for s in samples)
    assert load_samples("structured", tmp_path, limit=3) == samples[:3]  # a data folder without it: the shipped one
    readme = (PACKAGED_DATA / "README.md").read_text()
    assert "`structured.jsonl`" in readme and (PACKAGED_DATA / "licenses" / "structured_LICENSE_MIT.txt").is_file()
