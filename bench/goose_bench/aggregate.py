"""Records -> summary rows, aggregated as the paper does.

Per (method, dataset):

- ``speedup``: the mean of per-sample speedups (each sample's tokens/s over ``ar``'s on the same
  prompt, in the same run), so a long sample does not outweigh a short one; beside it
  ``speedup_spread`` (min, median, max over the prompts), ``speedup_of_sums`` (the summed tokens/s
  over ``ar``'s summed on the same prompts) and ``ratios_disagree`` (the two fall on different
  sides of 1x or more than 10% apart: a few prompts carry the mean);
- ``repeat_spread``: with ``--repeats``, the median and the largest (slowest run / fastest run - 1)
  of one method on one prompt;
- ``estimated_speedup`` (``--cost-curve``): the mean of per-sample estimates (goose_bench.estimate);
- ``tau``: accepted tokens per verification call pooled over the dataset's steps (Spec-Bench's
  mean of ``accept_lengths``); None for methods that do not report steps (the HF peers);
- ``tokens_per_s``: the mean of per-sample tokens/s;
- ``identical_to_ar``: the fraction of samples whose token ids equal ``ar``'s (1.0 = lossless);
- ``source_acceptance``: per source, accepted / tested draft nodes pooled over the dataset, the counts
  in ``source_accepted`` and ``source_tested``;
- ``path_kinds``: the share of verification steps of each accepted-path kind;
- ``speedup_vs_hf_pld``: the mean of per-sample speedups over Hugging Face's prompt lookup (where
  ``hf_pld`` ran), with ``speedup_vs_hf_pld_range`` their [min, max];
- ``first_token_s``: the median time to first token (the call to the first new token of a
  sample's first turn; the ``all`` row's median is over every sample);
- ``speedup_ci`` / ``estimated_speedup_ci``: the 95% percentile bootstrap interval of ``speedup`` /
  ``estimated_speedup`` over prompts (:func:`bootstrap_ci`: 2000 resamples of the prompts, a fixed
  seed, so the same records give the same interval); None with fewer than two prompts;
- ``faults``: per plugin whose hooks faulted (the boundary skipped the call: it raised or answered
  malformed), ``{"kind", "count", "samples", "hooks", "first"}``: faults summed, samples with at
  least one, per hook, and the first message (``goose_bench.records``).

The ``all`` row of a method is the mean over its datasets of ``speedup``, ``tau``,
``tokens_per_s``, ``speedup_vs_hf_ar``, ``speedup_vs_hf_pld`` and ``estimated_speedup`` (each dataset weighs the
same, as in the paper's "mean" column), and its intervals resample the prompts within each dataset and take the
same mean of dataset means; the counts, spreads, ``speedup_of_sums``, ``identical_to_ar``, ``path_kinds`` and
``faults`` are pooled over every sample. Every row carries its method's ``config`` (sources,
topology, budget, options, other changed fields).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from statistics import fmean, median
from typing import Any

import numpy as np

from goose_bench.medians import median_of
from goose_bench.records import Record, merge_faults

ALL = "all"
Row = dict[str, Any]


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return fmean(present) if present else None


def _range(values: Iterable[float | None]) -> list[float] | None:
    present = [v for v in values if v is not None]
    return [min(present), max(present)] if present else None


def _spread(values: Iterable[float | None]) -> list[float] | None:
    """[min, median, max]."""
    present = [v for v in values if v is not None]
    return [min(present), median(present), max(present)] if present else None


BOOTSTRAP_LEVEL, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED = 0.95, 2000, 0
BOOTSTRAP = {"kind": "percentile", "level": BOOTSTRAP_LEVEL, "resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED,
             "statistic": "mean over prompts (the all row: the mean of dataset means, prompts resampled within each "
                          "dataset)"}


def bootstrap_ci(groups: Sequence[Sequence[float | None]], level: float = BOOTSTRAP_LEVEL,
                 resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> list[float] | None:
    """[low, high]: the percentile bootstrap interval of the mean of group means, the values resampled with
    replacement within each group (one group: the plain mean over prompts). Deterministic (a fixed seed); None
    where no group has two values (nothing to resample)."""
    arrays = [np.asarray([v for v in group if v is not None], dtype=np.float64) for group in groups]
    arrays = [a for a in arrays if len(a)]
    if not arrays or all(len(a) < 2 for a in arrays):
        return None
    generator = np.random.default_rng(seed)
    means = np.zeros(resamples)
    for values in arrays:
        means += values[generator.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)
    low, high = np.percentile(means / len(arrays), [50 * (1 - level), 50 * (1 + level)])
    return [float(low), float(high)]


def _faults(records: Sequence[Record]) -> dict[str, dict[str, Any]]:
    """Per plugin: faults summed over the records, the samples with any, per hook, and the first message."""
    pooled = merge_faults([r.get("faults") for r in records])
    for name, entry in pooled.items():
        entry["samples"] = sum(1 for r in records if ((r.get("faults") or {}).get(name) or {}).get("count"))
    return pooled


DISAGREEMENT = 0.10  # the mean of ratios and the ratio of sums this far apart (or either side of 1x): flagged


def _honest(records: Sequence[Record]) -> Row:
    """The spreads and the ratio of sums beside the mean of per-prompt ratios."""
    paired = [r for r in records if r.get("speedup") is not None and r.get("ar_tokens_per_s")]
    of_sums = (sum(r["tokens_per_s"] for r in paired) / sum(r["ar_tokens_per_s"] for r in paired)) if paired else None
    runs = [max(r["wall_s_runs"]) / min(r["wall_s_runs"]) - 1 for r in records
            if len(r.get("wall_s_runs") or ()) > 1 and min(r["wall_s_runs"]) > 0]
    return {
        "speedup_spread": _spread(r.get("speedup") for r in records),
        "estimated_speedup_spread": _spread(r.get("estimated_speedup") for r in records),
        "tokens_per_s_spread": _spread(r["tokens_per_s"] for r in records),
        "speedup_of_sums": of_sums,
        "repeat_spread": [median(runs), max(runs)] if runs else None,
    }


def _pooled(records: Sequence[Record]) -> Row:
    """The fields every aggregate pools over samples, whatever their dataset."""
    tested: Counter[str] = Counter()
    accepted: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for record in records:
        tested.update(record.get("source_tested") or {})
        accepted.update(record.get("source_accepted") or {})
        kinds.update(record.get("path_kinds") or {})
    steps = sum(kinds.values())
    compared = [r["identical_to_ar"] for r in records if r.get("identical_to_ar") is not None]
    return {
        "samples": len(records),
        "identical_to_ar": (sum(bool(c) for c in compared) / len(compared)) if compared else None,
        "source_acceptance": {name: accepted[name] / n for name, n in sorted(tested.items()) if n},
        "source_accepted": {name: accepted[name] for name in sorted(tested)},
        "source_tested": dict(sorted(tested.items())),
        "path_kinds": {kind: count / steps for kind, count in kinds.items()} if steps else {},
        "faults": _faults(records),
        **_honest(records),
        **_work(records),
    }


def _work(records: Sequence[Record]) -> Row:
    """What the samples cost in the target's work, the deterministic figure: verify passes and the rows they held
    (auxiliary rows included), and, through the memo, the rows it answered and the real work left."""
    counted = [r for r in records if r.get("tree_sizes") is not None]
    memo: Counter[str] = Counter()
    for record in records:
        memo.update(record.get("memo") or {})
    return {"passes": sum(len(r["tree_sizes"]) for r in counted) if counted else None,
            "rows": sum(sum(r["tree_sizes"]) + r.get("auxiliary_rows", 0) for r in counted) if counted else None,
            "memo": dict(memo) or None}


def _flagged(row: Row) -> Row:
    """``ratios_disagree``: the row's speedup (a mean of ratios) and its ratio of sums on either side of 1x, or more
    than :data:`DISAGREEMENT` apart."""
    mean, of_sums = row.get("speedup"), row.get("speedup_of_sums")
    row["ratios_disagree"] = bool(mean is not None and of_sums and (
        (mean - 1) * (of_sums - 1) < 0 or abs(mean / of_sums - 1) > DISAGREEMENT))
    return row


def _dataset_row(method: str, dataset: str, records: Sequence[Record]) -> Row:
    counted = [r for r in records if r.get("verify_steps")]
    steps = sum(r["verify_steps"] for r in counted)
    accepted = sum(sum(r["choices"][0]["accept_lengths"]) for r in counted)
    return _flagged({
        "method": method,
        "dataset": dataset,
        **_pooled(records),
        "speedup": _mean(r.get("speedup") for r in records),
        "speedup_ci": bootstrap_ci([[r.get("speedup") for r in records]]),
        "speedup_vs_hf_ar": _mean(r.get("speedup_vs_hf_ar") for r in records),
        "speedup_vs_hf_pld": _mean(r.get("speedup_vs_hf_pld") for r in records),
        "speedup_vs_hf_pld_range": _range(r.get("speedup_vs_hf_pld") for r in records),
        "estimated_speedup": _mean(r.get("estimated_speedup") for r in records),
        "estimated_speedup_ci": bootstrap_ci([[r.get("estimated_speedup") for r in records]]),
        "tau": accepted / steps if steps else None,
        "tokens_per_s": _mean(r["tokens_per_s"] for r in records),
        "new_tokens": _mean(r["new_tokens"] for r in records),
        "first_token_s": median_of(r.get("first_token_s") for r in records),
    })


def _all_row(method: str, rows: Sequence[Row], records: Sequence[Record]) -> Row:
    by_dataset: dict[str, list[Record]] = {}
    for record in records:
        by_dataset.setdefault(record["dataset"], []).append(record)
    return _flagged({
        "method": method,
        "dataset": ALL,
        **_pooled(records),
        **{key: _mean(row[key] for row in rows)
           for key in ("speedup", "speedup_vs_hf_ar", "speedup_vs_hf_pld", "estimated_speedup", "tau", "tokens_per_s",
                       "new_tokens")},
        **{f"{key}_ci": bootstrap_ci([[r.get(key) for r in group] for group in by_dataset.values()])
           for key in ("speedup", "estimated_speedup")},
        "speedup_vs_hf_pld_range": _range(r.get("speedup_vs_hf_pld") for r in records),
        "first_token_s": median_of(r.get("first_token_s") for r in records),
    })


def summarize(records: Sequence[Record]) -> list[Row]:
    """Summary rows of one model's records: every (method, dataset) in first-seen order, then ``all``."""
    methods: dict[str, dict[str, list[Record]]] = {}
    for record in records:
        methods.setdefault(record["method"], {}).setdefault(record["dataset"], []).append(record)
    rows: list[Row] = []
    for method, by_dataset in methods.items():
        dataset_rows = [_dataset_row(method, dataset, recs) for dataset, recs in by_dataset.items()]
        everything = [r for recs in by_dataset.values() for r in recs]
        rows += [*dataset_rows, _all_row(method, dataset_rows, everything)]
    return rows


def summarize_categories(records: Sequence[Record]) -> list[Row]:
    """Rows per (method, ``<dataset>/<category>``) for datasets whose samples span several categories
    (Spec-Bench's subtasks, MT-Bench's eight), aggregated like dataset rows; no ``all`` rows."""
    categories: dict[str, set[str]] = {}
    for record in records:
        categories.setdefault(record["dataset"], set()).add(record["category"])
    groups: dict[tuple[str, str], list[Record]] = {}
    for record in records:
        if len(categories[record["dataset"]]) > 1:
            key = (record["method"], f"{record['dataset']}/{record['category']}")
            groups.setdefault(key, []).append(record)
    return [_dataset_row(method, group, recs) for (method, group), recs in groups.items()]


def lookup(rows: Sequence[Row], method: str, dataset: str) -> Row | None:
    """The row of (method, dataset), or None."""
    for row in rows:
        if row["method"] == method and row["dataset"] == dataset:
            return row
    return None


def build_summary(
    model: str,
    device: str,
    dtype: str,
    records: Sequence[Record],
    methods: dict[str, dict[str, Any]] | None = None,
    unavailable: dict[str, str] | None = None,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``summary.json`` object of one model.

    ``methods``: name -> {kind, group, description, fields} of every requested method (the report
    groups its tables by it); ``unavailable``: name -> why it did not run; ``settings``: how the run
    was made (max_new_tokens, threads, versions...).
    """
    methods = methods or {}
    rows = summarize(records)
    for row in rows:
        row["config"] = methods.get(row["method"], {}).get("digest")
    return {
        "model": model,
        "device": device,
        "dtype": dtype,
        "settings": settings or {},
        "methods": methods,
        "unavailable": unavailable or {},
        "bootstrap": dict(BOOTSTRAP),
        "results": rows,
        "categories": summarize_categories(records),
        "differences": differences(records),
    }


def differences(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Every greedy output that is not ``ar``'s, with where it parts from it and ``ar``'s logits there
    (``first_difference``, from :mod:`goose_bench.mismatch`)."""
    return [{"method": record["method"], "dataset": record["dataset"], "question_id": record["question_id"],
             **record["first_difference"]} for record in records if record.get("first_difference")]
