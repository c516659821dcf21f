"""The verify cost curve t(n): seconds for one verification pass of an n-node tree on this device.

On a GPU a 60-node tree costs about one token; on a small CPU width costs (docs/results.md has the
measured curves). The budget planner needs the real curve of the model, dtype, device and context
length at hand, so it is measured once (a few seconds, by timing real passes of the verifier:
:mod:`goose.cycle.calibration`) and cached per machine; ``goose calibrate`` prints it. Here: the curve,
where it is cached, and the curves of batched passes.
"""

from __future__ import annotations

import json
import logging
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from goose.quantize import Int8Linear, quantized
from goose.store.cache_dir import default_cache_dir

logger = logging.getLogger("goose.planning.cost")

CURVE_FORMAT = 6  # part of the cache key: bump when the measurement changes, so stale curves are re-measured


@dataclass(frozen=True)
class CostCurve:
    """Median verify latency per tree size (anchor included), interpolated in between."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __call__(self, nodes: int | np.ndarray) -> float | np.ndarray:
        return np.interp(nodes, self.sizes, self.seconds)

    def relative(self) -> dict[int, float]:
        """t(n) / t(1) per measured size."""
        return {n: s / self.seconds[0] for n, s in zip(self.sizes, self.seconds, strict=True)}

    def to_dict(self) -> dict[str, list[float] | list[int]]:
        return {"sizes": list(self.sizes), "seconds": list(self.seconds)}

    @classmethod
    def load(cls, path: Path) -> CostCurve:
        """A curve saved by :func:`cached` (a JSON file of ``to_dict``)."""
        data = json.loads(Path(path).expanduser().read_text())
        return cls(tuple(data["sizes"]), tuple(data["seconds"]))


def monotone(seconds: list[float]) -> np.ndarray:
    """The curve made non-decreasing by lowering, never raising, a size that measured slower than a
    bigger one (a minimum taken from the right). Raising small sizes instead (a running maximum)
    lets one slow sample of t(1) make every tree up to that cost look free."""
    return np.minimum.accumulate(np.asarray(seconds, dtype=float)[::-1])[::-1]


def cache_key(model: torch.nn.Module) -> str:
    if not isinstance(model, torch.nn.Module):  # another engine's model names its own key (goose.llama_model)
        return f"v{CURVE_FORMAT}-{model.cache_key()}"
    parameter = next(model.parameters())
    config = model.config
    parts = [f"v{CURVE_FORMAT}", getattr(config, "_name_or_path", "") or config.model_type,
             str(config.num_hidden_layers), str(getattr(config, "hidden_size", "")),
             quantized(model) or "", str(parameter.dtype).removeprefix("torch."),
             parameter.device.type, f"threads{torch.get_num_threads()}", platform.machine(),
             _processor_name(parameter.device)]
    return "-".join(p.replace("/", "_").replace(" ", "_") for p in parts if p)


def _processor_name(device: torch.device) -> str:
    """The chip the curve was measured on: the same VM image can land on different CPUs."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def cpu_name() -> str:
    """This machine's processor model, for a cache key."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()[:40]
    except OSError:
        pass
    return platform.processor() or "cpu"


def curve_path(model: torch.nn.Module, cache_dir: Path | None = None, batch: int = 1) -> Path:
    """Where this machine's curve for ``model`` (of passes of ``batch`` requests) is cached."""
    suffix = "" if batch == 1 else f"-batch{batch}"
    return (cache_dir or default_cache_dir()) / "calibration" / f"{cache_key(model)}{suffix}.json"


def cached(path: Path, measured: Callable[[], CostCurve], refresh: bool = False) -> CostCurve:
    """The curve saved at ``path``, or ``measured()`` saved there (atomically: concurrent writers never tear it)."""
    if path.exists() and not refresh:
        return CostCurve.load(path)
    logger.info("measuring a verify cost curve once (cached at %s)", path)
    curve = measured()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(curve.to_dict()))
    temporary.replace(path)
    return curve


BATCH_SIZES = (2, 4, 8, 16, 32, 64)  # batch sizes whose curves are measured; those between are interpolated
BATCH_WIDTHS = (1, 2, 4, 8, 16, 32)  # rows per request in a batched calibration pass


class BatchCosts:
    """The verify cost of a batched pass, per batch size: t_B(total rows), measured once per machine and cached.

    Batch size 1 is the single-request curve; the sizes in ``BATCH_SIZES`` are measured when first
    needed; a size between two of them is interpolated at the same rows per request. The passes
    really run correct the curve as they come (:meth:`observe`): a calibration taken at 256 tokens of
    context on a noisy machine is a first guess, the requests' own contexts are the truth.
    """

    def __init__(self, single: CostCurve, measure: Callable[[int], CostCurve]) -> None:
        self.measure = measure  # batch size -> its calibrated curve (cached on disk by the caller)
        self.measured: dict[int, CostCurve] = {1: single}
        self._bases: dict[int, CostCurve] = {1: single}  # calibrated (interpolated), before any correction
        self._curves: dict[int, CostCurve] = {1: single}  # corrected by the passes observed
        self._corrections: dict[int, np.ndarray] = {}  # per batch size: measured / calibrated, per curve point

    def observe(self, batch: int, rows: int, seconds: float) -> None:
        """Fold one real pass of ``batch`` requests and ``rows`` rows in all into the nearest point of its curve."""
        base = self._base(batch)
        point = int(np.argmin(np.abs(np.log(np.asarray(base.sizes)) - np.log(max(1, rows)))))
        correction = self._corrections.setdefault(batch, np.ones(len(base.sizes)))
        correction[point] += 0.2 * (seconds / float(base(rows)) - correction[point])
        self._curves[batch] = CostCurve(base.sizes, tuple(float(x) for x in monotone(
            list(np.asarray(base.seconds) * correction))))

    def curve(self, batch: int) -> CostCurve:
        """The curve over total rows for a pass of ``batch`` requests (corrected by the passes observed)."""
        if batch not in self._curves:
            self._curves[batch] = self._base(batch)
        return self._curves[batch]

    def _base(self, batch: int) -> CostCurve:
        """The calibrated curve for ``batch`` requests, before any correction."""
        if batch not in self._bases:
            below = max((b for b in (1, *BATCH_SIZES) if b <= batch), default=1)
            above = min((b for b in BATCH_SIZES if b >= batch), default=BATCH_SIZES[-1])
            low, high = self._measured(below), self._measured(above)
            widths = np.asarray(BATCH_WIDTHS, dtype=float)
            share = 0.0 if above == below else (batch - below) / (above - below)
            seconds = ((1 - share) * low(below * widths) + share * high(above * widths))
            self._bases[batch] = CostCurve(tuple(int(batch * w) for w in BATCH_WIDTHS),
                                           tuple(float(x) for x in seconds))
        return self._bases[batch]

    def _measured(self, batch: int) -> CostCurve:
        if batch not in self.measured:
            self.measured[batch] = self.measure(batch)
        return self.measured[batch]


HARVEST_SHARE = 0.03  # the most of the prompt's forward the automatic prefill harvest may add...
HARVEST_FLOOR = 32.0  # ...unless 32 prompt tokens' worth is more: about what one or two decoding passes cost
HARVEST_CAP = 256  # beyond this many prompt positions the bigram table gains little from more


def output_layer_weight(model: torch.nn.Module) -> float:
    """One output-layer row's multiply-adds against one token's pass through the body of the model.

    Counted in weights (a row of the output layer reads every weight of that layer; a token's
    pass reads every other weight but the input embedding, a table lookup), so it is the same on
    every device. Attention over the context is left out: it only makes the body dearer, so the
    harvest it bounds is never underestimated in cost. An int8 layer's weights are not parameters
    (:class:`goose.quantize.Int8Linear`) and are counted by its shape.
    """
    if not isinstance(model, torch.nn.Module):  # another engine's model counts from its file (goose.llama_model)
        return float(model.output_layer_weight())
    head = model.get_output_embeddings()
    counted = {model.get_input_embeddings().weight.data_ptr(), *(p.data_ptr() for p in head.parameters())}
    body = sum(p.numel() for p in model.parameters() if p.data_ptr() not in counted)
    body += sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, Int8Linear) and m is not head)
    return head.in_features * head.out_features / max(1, body)


def harvest_rows(setting: int | str | None, prompt_length: int, row_weight: float, priced: bool = True) -> int:
    """How many of the last prompt positions the prefill harvests (``GooseConfig.prefill_harvest``).

    ``"auto"``: as many as the share ``HARVEST_SHARE`` of the prompt's forward pays for, each
    costing ``row_weight`` tokens' worth (see :func:`output_layer_weight`), or as many as
    ``HARVEST_FLOOR`` tokens' worth pays for when that is more, at most ``HARVEST_CAP``. The floor
    is for short prompts: their harvest costs next to nothing beside the output's passes, and every
    prompt row the bigram table knows is a cycle with something to draft. Unless ``priced`` (a
    fixed budget: the paper's setting, where no row is priced), ``"auto"`` is every row, as the
    paper's code harvests them.
    The last position is read for the first token in any case, so at most ``prompt_length - 1``.
    """
    if setting is None or (setting == "auto" and not priced):
        wanted = prompt_length
    elif setting == "auto":
        wanted = min(HARVEST_CAP, int(max(HARVEST_SHARE * prompt_length, HARVEST_FLOOR) / row_weight))
    else:
        wanted = int(setting)
    return max(0, min(wanted, prompt_length - 1))
