"""The deterministic mode: the speed a cost curve implies for what a run decoded (an estimate, not a clock).

On a shared 2-core VM the clock moves more between runs than two sources differ. Decoded in
float32, every lossless method produces the autoregressive text, so what separates them is only
how many verify passes of how many rows they needed. Priced on a cost curve t(rows) (this device's
measured curve, a curve file measured elsewhere, e.g. on a GPU with ``goose calibrate --json``, or a
curve shipped with goose by name, ``bench/goose_bench/data/curves/<name>.json``, measured on a quiet machine
for studies that must price on the same curve wherever they run), a sample costs sum over its passes
of t(rows + the auxiliary rows riding along); the estimated speedup is ``ar``'s priced cost a token
on the same prompt over the method's. Prefill and host time are left out on both sides: this ranks
drafting, it does not predict wall time.

Where every pass runs for real (bfloat16, int8, the llama.cpp engine, sampling, ``--no-memo``,
``--repeats``), the bench prices the same passes on the curve the run calibrated, beside the clock
(``priced_beside``): the clock says what the run took, the priced figure what its trees cost by the
rule the planner lays them by, which does not move with the machine's load from prompt to prompt.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from goose.planning.cost import CostCurve, busy_signs

logger = logging.getLogger("goose_bench.estimate")
Record = dict[str, Any]  # one results.jsonl line (goose_bench.records)
DEVICE_CURVE = "device"  # --cost-curve device: the curve the run measured (or cached) for this model here
SHIPPED_CURVES = Path(__file__).parent / "data" / "curves"  # pinned curves, by name (the file's stem)


def shipped_curves() -> list[str]:
    """The names of the curves shipped with goose (``bench/goose_bench/data/curves/*.json``)."""
    return sorted(p.stem for p in SHIPPED_CURVES.glob("*.json"))


def load_curve(spec: str) -> CostCurve:
    """A curve file (``goose calibrate --json``'s output, or any JSON with ``sizes`` and ``seconds``), or the name
    of a shipped curve (:func:`shipped_curves`). A path that exists wins over a shipped curve of the same name; a
    spec that is neither fails with the shipped names. A curve whose samples show a busy machine loads with a
    warning (it is what the caller asked for)."""
    path = Path(spec).expanduser()
    if not path.exists() and (SHIPPED_CURVES / f"{spec}.json").is_file() and "/" not in spec:
        path = SHIPPED_CURVES / f"{spec}.json"
    elif not path.exists() and "/" not in spec and not spec.endswith(".json"):
        raise ValueError(f"--cost-curve: {spec} is neither a file nor a shipped curve (shipped: "
                         f"{', '.join(shipped_curves()) or 'none'}; or 'device': this machine's)")
    try:
        curve = CostCurve.load(path)
    except OSError as error:
        raise ValueError(f"--cost-curve: cannot read {spec}: {error.strerror or error}") from None
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"--cost-curve: {spec} is not a cost curve (a JSON object with 'sizes' and 'seconds', as "
                         f"`goose calibrate --json` prints): {error}") from None
    if not curve.sizes or curve.sizes[0] != 1 or len(curve.sizes) != len(curve.seconds) or min(curve.seconds) <= 0:
        raise ValueError(f"--cost-curve: {spec}: sizes must start at 1 and every time must be positive")
    signs = busy_signs(curve)
    if signs:
        logger.warning("--cost-curve %s looks measured on a busy machine: %s", spec, "; ".join(signs))
    return curve


def priced_seconds(record: Record, curve: CostCurve) -> float | None:
    """The sample's verify passes priced on ``curve``; None for a method that reports no passes (the HF peers)."""
    sizes = record.get("tree_sizes")
    if not sizes:
        return None
    passes = np.asarray(sizes, dtype=np.float64)
    riding = record.get("auxiliary_rows", 0) / len(sizes)  # spread evenly over the passes
    return float(np.sum(curve(passes + riding)))


def price(records: Mapping[str, Record], curve: CostCurve, baseline: str) -> None:
    """Fill in ``estimated_s`` and ``estimated_speedup`` (over ``baseline`` on the same sample, a token each: texts of
    different lengths, sampled or where numerics depend on the batch, compare by their cost a token) in place."""
    for record in records.values():
        record["estimated_s"] = priced_seconds(record, curve)

    def per_token(record: Record) -> float | None:
        seconds, tokens = record.get("estimated_s"), record.get("new_tokens")
        return seconds / tokens if seconds and tokens else None

    base = per_token(records.get(baseline, {}))
    for record in records.values():
        mine = per_token(record)
        record["estimated_speedup"] = base / mine if base and mine else None
