"""The verify cost curve t(n): seconds for one verification pass of an n-node tree on this device.

On a GPU a 60-node tree costs about one token; on a small CPU width costs (docs/results.md has the
measured curves). The budget planner needs the real curve of the model, dtype, device and context
length at hand, so it is measured once (a few seconds) and cached per machine; ``goose calibrate``
prints it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from goose.config import GooseConfig
from goose.contract.tree import TreeBuilder
from goose.cycle.readout import read
from goose.cycle.verifier import Verifier

logger = logging.getLogger("goose.planning.cost")

DEFAULT_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
CALIBRATION_CONTEXT = 256  # tokens of context while measuring: a typical prompt length
HARVEST_TOP_K = GooseConfig.model_fields["harvest_top_k"].default  # what a default decoder reads per row
CURVE_FORMAT = 6  # part of the cache key: bump when measure() changes, so stale curves are re-measured


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
        """A curve saved by :func:`load_or_measure` (a JSON file of ``to_dict``)."""
        data = json.loads(Path(path).expanduser().read_text())
        return cls(tuple(data["sizes"]), tuple(data["seconds"]))


def measure(model: torch.nn.Module, sizes: tuple[int, ...] = DEFAULT_SIZES, rounds: int = 5,
            context_length: int = CALIBRATION_CONTEXT) -> CostCurve:
    """Time one verify pass of chain-shaped trees of each size after a ``context_length`` prefill.

    The sizes are timed round-robin, one warm-up round and then ``rounds`` rounds, and each size
    keeps its median: a slow spell of the machine (another process, a frequency change) then hits
    every size alike instead of inflating whichever size was being timed at the moment.
    """
    verifier = Verifier(model)
    vocab = verifier.vocab_size
    generator = np.random.default_rng(0)
    context = generator.integers(100, min(vocab, 30_000), context_length).tolist()
    verifier.prefill(context)
    trees = []
    for size in sizes:
        builder = TreeBuilder(context[-1], ("calibration",), capacity=size - 1)
        builder.add_chain(0, generator.integers(100, min(vocab, 30_000), size - 1), 0)
        trees.append(builder.build())
    timings: list[list[float]] = [[] for _ in sizes]
    for round_index in range(rounds + 1):  # round 0 warms the kernels of every shape
        for tree, samples in zip(trees, timings, strict=True):
            started = time.perf_counter()
            read(verifier.verify(tree), tree.size, HARVEST_TOP_K)  # the readout and device read the decoder pays
            elapsed = time.perf_counter() - started
            verifier.discard()  # the context stays put for every measurement
            if round_index:
                samples.append(elapsed)
    return CostCurve(tuple(sizes), tuple(float(s) for s in monotone([statistics.median(t) for t in timings])))


def monotone(seconds: list[float]) -> np.ndarray:
    """The curve made non-decreasing by lowering, never raising, a size that measured slower than a
    bigger one (a minimum taken from the right). Raising small sizes instead (a running maximum)
    lets one slow sample of t(1) make every tree up to that cost look free."""
    return np.minimum.accumulate(np.asarray(seconds, dtype=float)[::-1])[::-1]


def cache_key(model: torch.nn.Module) -> str:
    parameter = next(model.parameters())
    config = model.config
    parts = [f"v{CURVE_FORMAT}", getattr(config, "_name_or_path", "") or config.model_type,
             str(config.num_hidden_layers),
             str(getattr(config, "hidden_size", "")), str(parameter.dtype).removeprefix("torch."),
             parameter.device.type, f"threads{torch.get_num_threads()}", platform.machine(),
             _processor_name(parameter.device)]
    return "-".join(p.replace("/", "_").replace(" ", "_") for p in parts if p)


def _processor_name(device: torch.device) -> str:
    """The chip the curve was measured on: the same VM image can land on different CPUs."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()[:40]
    except OSError:
        pass
    return platform.processor() or "cpu"


def load_or_measure(model: torch.nn.Module, cache_dir: Path | None = None, refresh: bool = False) -> CostCurve:
    """The cached curve for this model/dtype/device/threads, measured on first use."""
    from goose.models import default_cache_dir

    path = (cache_dir or default_cache_dir()) / "calibration" / f"{cache_key(model)}.json"
    return _cached(path, lambda: measure(model), refresh)


def _cached(path: Path, measured: Callable[[], CostCurve], refresh: bool = False) -> CostCurve:
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


def measure_batch(model: torch.nn.Module, batch: int, widths: tuple[int, ...] = BATCH_WIDTHS, rounds: int = 3,
                  context_length: int = CALIBRATION_CONTEXT) -> CostCurve:
    """Time one batched verify pass of ``batch`` requests, each a chain of every width in ``widths``, each after
    its own ``context_length`` prefill: the curve over the pass's total rows (``batch x width``).

    A batched pass does not cost what one request's pass of as many rows does: every request attends
    over its own context, and small per-request blocks use the kernels less well. Timed round-robin
    with medians, as :func:`measure` does.
    """
    from goose.cycle.batch_verifier import BatchVerifier

    verifier = BatchVerifier(model, batch)
    vocab = verifier.vocab_size
    generator = np.random.default_rng(0)
    contexts = [generator.integers(100, min(vocab, 30_000), context_length).tolist() for _ in range(batch)]
    for context in contexts:
        verifier.prefill(context)
    passes = []
    for width in widths:
        trees = []
        for context in contexts:
            builder = TreeBuilder(context[-1], ("calibration",), capacity=width - 1)
            builder.add_chain(0, generator.integers(100, min(vocab, 30_000), width - 1), 0)
            trees.append(builder.build())
        passes.append(trees)
    timings: list[list[float]] = [[] for _ in widths]
    for round_index in range(rounds + 1):
        for trees, samples in zip(passes, timings, strict=True):
            started = time.perf_counter()
            for tree, logits in zip(trees, verifier.verify(trees), strict=True):
                read(logits, tree.size, HARVEST_TOP_K)
            elapsed = time.perf_counter() - started
            if round_index:
                samples.append(elapsed)
    return CostCurve(tuple(batch * width for width in widths),
                     tuple(float(s) for s in monotone([statistics.median(t) for t in timings])))


class BatchCosts:
    """The verify cost of a batched pass, per batch size: t_B(total rows), measured once per machine and cached.

    Batch size 1 is the single-request curve; the sizes in ``BATCH_SIZES`` are measured when first
    needed; a size between two of them is interpolated at the same rows per request. The passes
    really run correct the curve as they come (:meth:`observe`): a calibration taken at 256 tokens of
    context on a noisy machine is a first guess, the requests' own contexts are the truth.
    """

    def __init__(self, model: torch.nn.Module, single: CostCurve, cache_dir: Path | None = None) -> None:
        self.model = model
        self.measured: dict[int, CostCurve] = {1: single}
        self.cache_dir = cache_dir
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
            self.measured[batch] = _load_or_measure_batch(self.model, batch, self.cache_dir)
        return self.measured[batch]


def _load_or_measure_batch(model: torch.nn.Module, batch: int, cache_dir: Path | None) -> CostCurve:
    from goose.models import default_cache_dir

    path = (cache_dir or default_cache_dir()) / "calibration" / f"{cache_key(model)}-batch{batch}.json"
    return _cached(path, lambda: measure_batch(model, batch))


HARVEST_SHARE = 0.03  # the most of the prompt's forward the automatic prefill harvest may add...
HARVEST_FLOOR = 32.0  # ...unless 32 prompt tokens' worth is more: about what one or two decoding passes cost
HARVEST_CAP = 256  # beyond this many prompt positions the bigram table gains little from more


def output_layer_weight(model: torch.nn.Module) -> float:
    """One output-layer row's multiply-adds against one token's pass through the body of the model.

    Counted in parameters (a row of the output layer reads every weight of that layer; a token's
    pass reads every other weight but the input embedding, a table lookup), so it is the same on
    every device. Attention over the context is left out: it only makes the body dearer, so the
    harvest it bounds is never underestimated in cost.
    """
    head = model.get_output_embeddings().weight
    table = model.get_input_embeddings().weight
    counted = {head.data_ptr(), table.data_ptr()}
    body = sum(p.numel() for p in model.parameters() if p.data_ptr() not in counted)
    return head.numel() / max(1, body)


def harvest_rows(setting: int | str | None, prompt_length: int, row_weight: float) -> int:
    """How many of the last prompt positions the prefill harvests (``GooseConfig.prefill_harvest``).

    ``"auto"``: as many as the share ``HARVEST_SHARE`` of the prompt's forward pays for, each
    costing ``row_weight`` tokens' worth (see :func:`output_layer_weight`), or as many as
    ``HARVEST_FLOOR`` tokens' worth pays for when that is more, at most ``HARVEST_CAP``. The floor
    is for short prompts: their harvest costs next to nothing beside the output's passes, and every
    prompt row the bigram table knows is a cycle with something to draft.
    The last position is read for the first token in any case, so at most ``prompt_length - 1``.
    """
    if setting is None:
        wanted = prompt_length
    elif setting == "auto":
        wanted = min(HARVEST_CAP, int(max(HARVEST_SHARE * prompt_length, HARVEST_FLOOR) / row_weight))
    else:
        wanted = int(setting)
    return max(0, min(wanted, prompt_length - 1))
