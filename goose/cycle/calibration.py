"""Measuring this device's verify cost curve t(n) (:class:`goose.planning.cost.CostCurve`): timed passes of the
real verifier over chain-shaped trees, every sample kept, cached per machine only when it looks measured on a
quiet one (:func:`goose.planning.cost.busy_signs`)."""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from goose.config import GooseConfig
from goose.contract.tree import TreeBuilder
from goose.cycle.engine import new_verifier
from goose.cycle.readout import read
from goose.planning import machine
from goose.planning.cost import (
    BATCH_WIDTHS,
    CostCurve,
    busy_now,
    cached,
    curve_path,
    describe_measurement,
    monotone,
)

logger = logging.getLogger("goose.cycle.calibration")

DEFAULT_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
CALIBRATION_CONTEXT = 256  # tokens of context while measuring: a typical prompt length
HARVEST_TOP_K = GooseConfig.model_fields["harvest_top_k"].default  # what a default decoder reads per row


def measure(model: torch.nn.Module, sizes: tuple[int, ...] = DEFAULT_SIZES, rounds: int = 5,
            context_length: int = CALIBRATION_CONTEXT, batch: int = 1) -> CostCurve:
    """Time one verify pass of ``batch`` requests, each a chain of every size in ``sizes`` after its own
    ``context_length`` prefill: the curve over the pass's total rows (``batch x size``).

    The sizes are timed round-robin, one warm-up round and then ``rounds`` rounds, and each size
    keeps its median: a slow spell of the machine (another process, a frequency change) then hits
    every size alike instead of inflating whichever size was being timed at the moment. A batched
    pass does not cost what one request's pass of as many rows does (every request attends over its
    own context, and small per-request blocks use the kernels less well), hence a curve per batch size.

    Every sample is kept in the curve's ``meta`` with each size's median and spread (interquartile
    range over median), the machine, the model and the time: what tells a curve measured on a busy
    machine from a quiet one.
    """
    load = machine.load_average()  # before the measurement's own load
    verifier = new_verifier(model, batch)
    vocab = verifier.vocab_size
    generator = np.random.default_rng(0)
    contexts = [generator.integers(100, min(vocab, 30_000), context_length).tolist() for _ in range(batch)]
    for context in contexts:
        verifier.prefill(context)
    passes = []
    for size in sizes:
        trees = []
        for context in contexts:
            builder = TreeBuilder(context[-1], ("calibration",), capacity=size - 1)
            builder.add_chain(0, generator.integers(100, min(vocab, 30_000), size - 1), 0)
            trees.append(builder.build())
        passes.append(trees)
    timings: list[list[float]] = [[] for _ in sizes]
    for round_index in range(rounds + 1):  # round 0 warms the kernels of every shape
        for trees, samples in zip(passes, timings, strict=True):
            started = time.perf_counter()
            for tree, logits in zip(trees, verifier.verify(trees), strict=True):  # uncommitted: the context stays
                read(logits, tree.size, HARVEST_TOP_K)  # the readout and device read the decoder pays
            if round_index:
                samples.append(time.perf_counter() - started)
    medians = [statistics.median(t) for t in timings]
    spreads = [float(np.subtract(*np.percentile(t, [75, 25]))) / m for t, m in zip(timings, medians, strict=True)]
    meta = describe_measurement(model, batch=batch, context_length=context_length, rounds=rounds, load_average=load,
                                raw_seconds=tuple(medians), spread=tuple(round(s, 4) for s in spreads),
                                samples=tuple(tuple(round(x, 7) for x in t) for t in timings))
    # an engine that names its sizes (every size to 32) has steps, its kernels': kept; a torch model's few
    # sizes are made monotone, so that one slow sample of a small size cannot make the trees up to its cost look free
    seconds = medians if hasattr(model, "calibration_sizes") else monotone(medians)
    return CostCurve(tuple(batch * size for size in sizes), tuple(float(s) for s in seconds), meta)


def load_or_measure(model: torch.nn.Module, cache_dir: Path | None = None, refresh: bool = False,
                    batch: int = 1) -> CostCurve:
    """The cached curve for this model/dtype/device/threads/CPU (of passes of ``batch`` requests), measured on first
    use, and measured again when it looks measured on a busy machine (:func:`goose.planning.cost.cached`)."""
    path, legacy = curve_path(model, cache_dir, batch), curve_path(model, cache_dir, batch, curve_format=6)
    if batch == 1:  # an engine whose kernels take rows in blocks names every size to measure (goose.llama_model)
        sizes = getattr(model, "calibration_sizes", DEFAULT_SIZES)
        return cached(path, lambda: measure(model, sizes), refresh, legacy=legacy)
    return cached(path, lambda: measure(model, BATCH_WIDTHS, 3, batch=batch), refresh, legacy=legacy)


def correct(model: torch.nn.Module, curve: CostCurve, cache_dir: Path | None = None) -> bool:
    """Cache ``curve``, a decoder's live correction of this model's cached curve (one request's passes,
    :meth:`goose.planning.budget.BudgetPlanner.contradicted`), unless other processes hold the cores now:
    passes slowed by a neighbour must not become the next run's calibration. True when saved."""
    if busy_now():
        return False
    path = curve_path(model, cache_dir)
    curve.save(path)
    logger.info("the passes contradicted the cached cost curve; corrected at %s", path)
    return True


__all__ = ["load_or_measure", "measure"]
