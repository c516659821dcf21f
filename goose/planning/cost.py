"""The verify cost curve t(n): seconds for one verification pass of an n-node tree on this device.

On a GPU a 60-node tree costs about one token; on a small CPU width costs (docs/results.md has the
measured curves). The budget planner needs the real curve of the model, dtype, device and context
length at hand, so it is measured once (a few seconds, by timing real passes of the verifier:
:mod:`goose.cycle.calibration`) and cached per machine; ``goose calibrate`` prints it. Here: the curve
and how it was measured, the signs that it was measured on a busy machine, where it is cached, and
the curves of batched passes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from goose.planning import machine
from goose.quantize import Int8Linear, quantized
from goose.store.cache_dir import default_cache_dir

logger = logging.getLogger("goose.planning.cost")

# part of the cache key: bump when the measurement changes, so stale curves are re-measured.
# 7: keyed by the CPU's features (goose.planning.machine), not its name alone; the file carries how it was measured
CURVE_FORMAT = 7


@dataclass(frozen=True)
class CurveMeta:
    """How, where and when a curve was measured (empty where unknown: a file of sizes and seconds alone has none)."""

    measured_at: str = ""  # ISO 8601, UTC
    cpu: str = ""  # the processor's model name (a GPU's name on CUDA)
    cpu_key: str = ""  # goose.planning.machine.machine_key(): its speed flags' hash and the CPUs this process had
    cpu_features: str = ""  # those flags in words
    threads: int | None = None  # torch's (llama.cpp's) threads
    model: str = ""
    dtype: str = ""
    quantize: str = ""
    device: str = ""
    batch: int = 1  # requests per pass
    context_length: int | None = None
    rounds: int | None = None  # timed passes per size
    weight_bytes: int | None = None  # what one pass reads at least (the bound on t(1) in busy_signs)
    load_average: float | None = None  # the 1-minute load average when the measurement began
    raw_seconds: tuple[float, ...] = ()  # per size: the median of its samples, before monotone()
    spread: tuple[float, ...] = ()  # per size: interquartile range / median of its samples
    samples: tuple[tuple[float, ...], ...] = ()  # per size: every timed pass, in seconds
    tries: int = 1  # measurements taken until one looked quiet (or gave up)
    problems: tuple[str, ...] = ()  # busy_signs of the curve kept; non-empty: it was not cached
    note: str = ""  # free text: e.g. what a shipped curve's machine was

    def to_dict(self) -> dict[str, Any]:
        """The fields that are known, tuples as lists (what JSON reads back)."""
        def listed(value: Any) -> Any:
            return [listed(v) for v in value] if isinstance(value, tuple) else value

        return {k: listed(v) for k, v in asdict(self).items() if v not in ("", (), None)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CurveMeta:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for name in ("raw_seconds", "spread"):
            values[name] = tuple(float(x) for x in values.get(name, ()))
        values["samples"] = tuple(tuple(float(x) for x in row) for row in values.get("samples", ()))
        values["problems"] = tuple(str(x) for x in values.get("problems", ()))
        return cls(**values)


@dataclass(frozen=True)
class CostCurve:
    """Median verify latency per tree size (anchor included), interpolated in between.

    ``meta``: how it was measured (None for a curve given as sizes and seconds alone); it is not part
    of a curve's identity, so two curves of the same points are equal whatever their history.
    """

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    meta: CurveMeta | None = field(default=None, compare=False, repr=False)

    def __call__(self, nodes: int | np.ndarray) -> float | np.ndarray:
        return np.interp(nodes, self.sizes, self.seconds)

    def relative(self) -> dict[int, float]:
        """t(n) / t(1) per measured size."""
        return {n: s / self.seconds[0] for n, s in zip(self.sizes, self.seconds, strict=True)}

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"format": CURVE_FORMAT, "sizes": list(self.sizes), "seconds": list(self.seconds)}
        if self.meta is not None:
            data["meta"] = self.meta.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostCurve:
        """``to_dict``'s object; ``sizes`` and ``seconds`` alone (the files of format 6 and before) have no meta."""
        meta = data.get("meta")
        return cls(tuple(int(n) for n in data["sizes"]), tuple(float(s) for s in data["seconds"]),
                   CurveMeta.from_dict(meta) if isinstance(meta, dict) else None)

    @classmethod
    def load(cls, path: Path) -> CostCurve:
        """A curve saved by :func:`cached` (a JSON file of ``to_dict``), or any JSON object with sizes and seconds."""
        return cls.from_dict(json.loads(Path(path).expanduser().read_text()))

    def save(self, path: Path) -> None:
        """Write it to ``path`` atomically: a concurrent reader sees the old file or the new one, never half."""
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        temporary.replace(path)


def monotone(seconds: list[float]) -> np.ndarray:
    """The curve made non-decreasing by lowering, never raising, a size that measured slower than a
    bigger one (a minimum taken from the right). Raising small sizes instead (a running maximum)
    lets one slow sample of t(1) make every tree up to that cost look free."""
    return np.minimum.accumulate(np.asarray(seconds, dtype=float)[::-1])[::-1]


class LiveCurve:
    """The calibrated curve corrected by the passes really run: what a decoder prices trees on.

    A calibration is a first guess, taken at 256 tokens of context on a machine whose load moves; the
    passes a decoder runs are the truth. Each pass's time over the calibrated time of its rows is
    filed under the calibrated size nearest to its rows (on a log scale). A size with ``MIN_SAMPLES`` or
    more takes the median of its last ``WINDOW``; the others take the median of the last ``WINDOW``
    passes of any size (the whole curve rescaled: its shape kept). Medians, so that a pass slowed by a
    page fault or a neighbour's burst moves nothing; the curve is kept non-decreasing
    (:func:`monotone`), unless the calibration has steps (an engine measured at every size: a row more
    may cost less, and that is what the planner shapes trees by). ``curve`` is replaced only when some
    size moved by more than ``MOVE`` from the curve in use, so that a planner's cached choices (keyed on
    estimates, not on the curve) are re-evaluated on a real change, not on every pass.
    """

    WINDOW = 32
    MIN_SAMPLES = 5
    MOVE = 0.05
    CONTRADICTED_AFTER = 64
    CONTRADICTION = 0.25

    def __init__(self, calibrated: CostCurve) -> None:
        self.calibrated = calibrated
        self.curve = calibrated
        self._log_sizes = np.log(np.asarray(calibrated.sizes, dtype=float))
        self._base = np.asarray(calibrated.seconds, dtype=float)
        self._all: deque[float] = deque(maxlen=self.WINDOW)
        self._points: list[deque[float]] = [deque(maxlen=self.WINDOW) for _ in calibrated.sizes]
        self._monotone = bool(np.all(np.diff(self._base) >= 0))
        self._own = np.full(len(calibrated.sizes), np.nan)  # each size's own median, once it has enough passes
        self._in_use = self._base  # ``curve``'s seconds, as an array
        self.passes = 0

    @property
    def scale(self) -> float:
        """The median of the recent passes' measured over calibrated time (1.0 before any pass)."""
        return float(np.median(self._all)) if self._all else 1.0

    def observe(self, rows: int, seconds: float) -> bool:
        """Fold in one pass of ``rows`` rows that took ``seconds``; True when ``curve`` was replaced."""
        ratio = seconds / float(self.calibrated(rows))
        if not math.isfinite(ratio) or ratio <= 0.0:
            return False
        self.passes += 1
        self._all.append(ratio)
        nearest = int(np.argmin(np.abs(self._log_sizes - math.log(max(1, rows)))))
        point = self._points[nearest]
        point.append(ratio)
        if len(point) >= self.MIN_SAMPLES:  # two medians a pass: the one size's and the whole curve's
            self._own[nearest] = np.median(point)
        corrections = np.where(np.isnan(self._own), self.scale, self._own)
        seconds_now = self._base * corrections
        if self._monotone:  # a curve with steps (an engine's kernels, every size measured) keeps them
            seconds_now = monotone(list(seconds_now))
        if np.max(np.abs(seconds_now / self._in_use - 1.0)) <= self.MOVE:
            return False
        self._in_use = seconds_now
        self.curve = CostCurve(self.calibrated.sizes, tuple(float(s) for s in seconds_now),
                               replace(self.calibrated.meta, note=f"corrected by {self.passes} live passes")
                               if self.calibrated.meta is not None else None)
        return True

    def contradicted(self) -> bool:
        """Whether the passes have shown the calibration wrong: ``CONTRADICTED_AFTER`` passes or more, and some
        size's cost moved by more than ``CONTRADICTION`` of it (a cached curve to correct on disk)."""
        if self.passes < self.CONTRADICTED_AFTER:
            return False
        moved = self._in_use / self._base - 1.0
        return bool(np.max(np.abs(moved)) > self.CONTRADICTION)


# --- a curve measured on a busy machine -----------------------------------------------------------
# A curve measured while another process had the cores was once cached and reused by every later run
# (SmolLM2-135M float32, 2 threads: t(1) 511 ms and t(2)/t(1) 2.91 against 68.9 ms and 1.30 quiet), and
# the automatic budget then drafted next to nothing. These are the signs such a curve shows.

SPREAD_LIMIT = 0.25  # a size's interquartile range over its median above this is a noisy size...
# ...and so many noisy sizes a noisy curve: "several", a quarter of the sizes and at least 2
NOISY_SHARE = 0.25
DIP_LIMIT = 0.25  # a size measured slower than a bigger one by more than this (plus both sizes' spreads)
# n rows can always be verified as n one-row passes, so t(n) above n t(1) means t(1) was timed in a lull
# that the bigger sizes missed; 25% over it leaves room for the kernels' shape effects (llama.cpp's t(2)
# is 1.72 t(1) on the 2-core EPYC, the highest ratio to n measured on a quiet machine)
SUPERLINEAR = 1.25
# One row's pass reads every weight once, so on a quiet machine t(1) is about weight bytes over the
# memory bandwidth. A single core streams 10 GB/s or more from DRAM (one DDR4 channel moves ~20 GB/s);
# 5 GB/s is a conservative floor for a whole VM, and 10x that time (0.5 GB/s) leaves room for compute-
# bound dtypes (bfloat16 or float16 without native instructions), the attention over the context and
# the readout. SmolLM2-135M float32 reads 0.54 GB: quiet 69 ms (7.8 GB/s), the bound 1.1 s. A fixed
# allowance covers a tiny model's per-pass host time, which its few bytes do not.
BANDWIDTH_FLOOR = 5e9  # bytes per second
T1_MARGIN = 10.0
T1_ALLOWANCE = 0.02  # seconds


def busy_signs(curve: CostCurve, weight_bytes: int | None = None) -> list[str]:
    """Why ``curve`` looks measured on a busy machine, one phrase a sign; empty when it looks quiet.

    The spread and the dips need the samples (``curve.meta``); the bound on t(1) needs the bytes a
    pass reads (``weight_bytes``, else ``curve.meta.weight_bytes``). A curve without them is judged on
    its shape alone.
    """
    signs = []
    meta = curve.meta
    sizes, seconds = curve.sizes, curve.seconds
    if meta is not None and len(meta.spread) == len(sizes):
        noisy = [(n, s) for n, s in zip(sizes, meta.spread, strict=True) if s > SPREAD_LIMIT]
        if len(noisy) >= max(2, math.ceil(NOISY_SHARE * len(sizes))):
            signs.append(f"spread (IQR/median) above {SPREAD_LIMIT} at {len(noisy)} of {len(sizes)} sizes, "
                         f"up to {max(s for _, s in noisy):.2f}")
    if meta is not None and len(meta.raw_seconds) == len(sizes) and len(meta.spread) == len(sizes):
        raw, spread = meta.raw_seconds, meta.spread
        for i in range(len(sizes) - 1):
            j = min(range(i + 1, len(sizes)), key=raw.__getitem__)
            if raw[i] > raw[j] * (1 + DIP_LIMIT + spread[i] + spread[j]):
                signs.append(f"t({sizes[i]}) measured {raw[i] / raw[j]:.2f}x t({sizes[j]}), a bigger tree")
                break
    for n, s in zip(sizes[1:], seconds[1:], strict=True):
        if s > SUPERLINEAR * n / sizes[0] * seconds[0]:
            signs.append(f"t({n}) is {s / seconds[0]:.1f}x t({sizes[0]}), more than {n // sizes[0]} "
                         f"{'one-row passes' if sizes[0] == 1 else 'passes'} cost")
            break
    weight_bytes = weight_bytes if weight_bytes is not None else (meta.weight_bytes if meta else None)
    if weight_bytes and sizes[0] == 1:
        bound = T1_ALLOWANCE + T1_MARGIN * weight_bytes / BANDWIDTH_FLOOR
        if seconds[0] > bound:
            floor = BANDWIDTH_FLOOR / T1_MARGIN / 1e9
            signs.append(f"t(1) {1000 * seconds[0]:.0f} ms, above the {1000 * bound:.0f} ms that reading "
                         f"{weight_bytes / 1e6:.0f} MB of weights takes at {floor:.1f} GB/s")
    return signs


# --- the machine, the model, the key ---------------------------------------------------------------


def cache_key(model: torch.nn.Module, curve_format: int = CURVE_FORMAT) -> str:
    """The model, dtype, device, threads and processor a curve is for (``curve_format`` < 7: the key it once had)."""
    on_cpu = not isinstance(model, torch.nn.Module) or next(model.parameters()).device.type == "cpu"
    features = machine.machine_key() if on_cpu and curve_format >= 7 else ""  # the same name, two CPUs
    if not isinstance(model, torch.nn.Module):  # another engine's model names its own key (goose.llama_model)
        return "-".join(p for p in (f"v{curve_format}-{model.cache_key()}", features) if p)
    parameter = next(model.parameters())
    config = model.config
    parts = [f"v{curve_format}", getattr(config, "_name_or_path", "") or config.model_type,
             str(config.num_hidden_layers), str(getattr(config, "hidden_size", "")),
             quantized(model) or "", str(parameter.dtype).removeprefix("torch."),
             parameter.device.type, f"threads{torch.get_num_threads()}", platform.machine(),
             _processor_name(parameter.device), features]
    return "-".join(p.replace("/", "_").replace(" ", "_") for p in parts if p)


def _processor_name(device: torch.device) -> str:
    """The chip the curve was measured on: the same VM image can land on different CPUs."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def cpu_name() -> str:
    """This machine's processor model, for a cache key."""
    return machine.cpu_model()[:40]


def weight_bytes(model: Any) -> int | None:
    """The bytes of weights one pass reads (an input table counted too: an upper bound); a GGUF model's file size."""
    if not isinstance(model, torch.nn.Module):
        path = getattr(model, "path", None)
        try:
            return Path(path).stat().st_size if path else None
        except OSError:
            return None
    seen, total = set(), 0
    for parameter in model.parameters():
        if parameter.data_ptr() not in seen:
            seen.add(parameter.data_ptr())
            total += parameter.numel() * parameter.element_size()
    total += sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, Int8Linear))
    return total


def describe_measurement(model: Any, **measured: Any) -> CurveMeta:
    """A curve's meta: this machine, ``model``'s name, dtype and bytes, now, and what ``measured`` adds."""
    from datetime import datetime, timezone

    if isinstance(model, torch.nn.Module):
        parameter = next(model.parameters())
        config = model.config
        facts = {"model": getattr(config, "_name_or_path", "") or config.model_type,
                 "dtype": str(parameter.dtype).removeprefix("torch."), "quantize": quantized(model) or "",
                 "device": parameter.device.type, "threads": torch.get_num_threads()}
        device = parameter.device
    else:
        facts = {"model": str(getattr(model, "name", type(model).__name__)), "dtype": "gguf", "device": "cpu",
                 "threads": getattr(model, "threads", None)}
        device = torch.device("cpu")
    on_cpu = device.type == "cpu"
    return CurveMeta(measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     cpu=machine.cpu_model() if on_cpu else _processor_name(device),
                     cpu_key=machine.machine_key() if on_cpu else "",
                     cpu_features=machine.describe_features() if on_cpu else "",
                     weight_bytes=weight_bytes(model), **facts, **measured)


# --- the cache ---------------------------------------------------------------------------------------


def curve_path(model: torch.nn.Module, cache_dir: Path | None = None, batch: int = 1,
               curve_format: int = CURVE_FORMAT) -> Path:
    """Where this machine's curve for ``model`` (of passes of ``batch`` requests) is cached."""
    suffix = "" if batch == 1 else f"-batch{batch}"
    return (cache_dir or default_cache_dir()) / "calibration" / f"{cache_key(model, curve_format)}{suffix}.json"


TRIES = 3  # measurements of a curve that looks measured on a busy machine, the first included
BUSY_SHARE = 0.25  # other processes' share of the CPUs from which the machine is busy now: retrying cannot help
_UNCACHED: dict[Path, CostCurve] = {}  # per cache path: the busy-looking curve this process uses as it is


def busy_now() -> bool:
    """Whether other processes hold the cores now (their share of the CPUs' time over half a second, this
    process's own left out), so that a measurement taken now would be slowed as the last one was."""
    share = machine.others_share()
    return share is not None and share >= BUSY_SHARE


def cached(path: Path, measured: Callable[[], CostCurve], refresh: bool = False,
           check: Callable[[CostCurve], list[str]] | None = None, legacy: Path | None = None,
           busy: Callable[[], bool] = busy_now) -> CostCurve:
    """The curve saved at ``path``, or ``measured()`` saved there (atomically: concurrent writers never tear it).

    ``check`` (default :func:`busy_signs`) tells a curve measured on a busy machine. Such a
    measurement is taken again, up to ``TRIES`` in all, while the machine is quiet now
    (:func:`busy_now`); if every one shows the signs, the least slowed is cached with its signs
    (``meta.problems``) and one line on stderr says so. A cached curve with signs is measured again
    by the first process that finds the machine quiet, unless ``TRIES`` measurements all showed them
    (the machine's own noise: measuring again would show it again); while the machine is busy it is
    used as it is, said once per process: a process started on a busy machine (a test suite, another run) must not pay
    TRIES measurements that the load would spoil alike, every time. ``legacy``: where an older
    format cached this curve: not trusted (it was keyed by the CPU's name alone), said in one line.
    ``busy``: whether the machine is busy now (:func:`busy_now`).
    """
    check = check or busy_signs
    if not refresh and path in _UNCACHED:
        return _UNCACHED[path]
    if path.exists() and not refresh:
        try:
            curve = CostCurve.load(path)
        except (OSError, ValueError, KeyError, TypeError) as error:
            logger.warning("the cached cost curve %s cannot be read (%s); measuring it again", path, error)
        else:
            signs = check(curve)
            if not signs:
                return curve
            if curve.meta is not None and curve.meta.tries >= TRIES:  # every try showed them, the machine quiet:
                _UNCACHED[path] = curve  # this machine's own noise (a 1.5B float32 pass on a VM), not a load
                return curve
            if busy():
                logger.warning("the cached cost curve %s looks measured on a busy machine (%s) and the machine is "
                               "busy now: used as it is, until a run on a quiet machine measures it again", path,
                               "; ".join(signs))
                _UNCACHED[path] = curve
                return curve
            logger.warning("the cached cost curve %s looks measured on a busy machine (%s); measuring it again",
                           path, "; ".join(signs))
    elif legacy is not None and legacy.exists() and not refresh:
        logger.warning("not using %s: cached by the CPU's name alone (curve format %s), which two CPUs can share; "
                       "measuring this machine's curve once", legacy, legacy.name.split("-", 1)[0].lstrip("v"))
    logger.info("measuring a verify cost curve once (cached at %s)", path)
    tries = []
    for attempt in range(1, TRIES + 1):
        curve = measured()
        signs = check(curve)
        curve = replace(curve, meta=replace(curve.meta or CurveMeta(), tries=attempt, problems=tuple(signs)))
        if not signs:
            curve.save(path)
            _UNCACHED.pop(path, None)
            return curve
        logger.info("measurement %d of at most %d looks busy (%s)", attempt, TRIES, "; ".join(signs))
        tries.append(curve)
        if attempt < TRIES and busy():  # the cores are taken: another try would be slowed alike
            break
    kept = min(tries, key=lambda c: sum(c.seconds))  # the least slowed down
    kept = replace(kept, meta=replace(kept.meta, tries=len(tries)))
    kept.save(path)
    logger.warning("the verify cost curve looked measured on a busy machine %d time(s) (%s): cached at %s with those "
                   "signs; the first run on a quiet machine measures it again", len(tries),
                   "; ".join(kept.meta.problems), path)
    _UNCACHED[path] = kept
    return kept


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
        self._live: dict[int, LiveCurve] = {}  # per batch size: its curve corrected by the passes observed

    def observe(self, batch: int, rows: int, seconds: float) -> None:
        """Fold one real pass of ``batch`` requests and ``rows`` rows in all into its curve, as a single
        request's passes are (:class:`LiveCurve`: medians per calibrated size)."""
        self._corrected(batch).observe(rows, seconds)

    def curve(self, batch: int) -> CostCurve:
        """The curve over total rows for a pass of ``batch`` requests (corrected by the passes observed)."""
        return self._corrected(batch).curve

    def _corrected(self, batch: int) -> LiveCurve:
        if batch not in self._live:
            self._live[batch] = LiveCurve(self._base(batch))
        return self._live[batch]

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


def harvest_rows(setting: int | str | None, prompt_length: int, priced: bool = True) -> int:
    """How many of the last prompt positions the prefill harvests (``GooseConfig.prefill_harvest``).

    ``"auto"`` with the automatic budget: none. Every harvested row is an output-layer row computed
    before the first token goes out, and the first token is to be no later than plain decoding's: on
    the llama.cpp engine (Qwen2.5-Coder-1.5B Q4_K_M, 2 threads, AMD EPYC with AVX-512) the 145 rows
    once harvested by a price on the output layer's weights delayed a 100-token prompt's first token
    from 0.84 to 1.33 s, its Q6_K head having no batched kernel. Unless ``priced`` (a fixed budget:
    the paper's setting, where no row is priced), ``"auto"`` is every row, as the paper's code
    harvests them. The last position is read for the first token in any case, so at most
    ``prompt_length - 1``.
    """
    if setting is None or (setting == "auto" and not priced):
        wanted = prompt_length
    elif setting == "auto":
        wanted = 0
    else:
        wanted = int(setting)
    return max(0, min(wanted, prompt_length - 1))


__all__ = ["CostCurve", "CurveMeta", "busy_now", "busy_signs", "cache_key", "cached", "curve_path",
           "describe_measurement", "weight_bytes"]
