"""The benchmark loop: warm-up, then every method on every prompt, interleaved, with one progress bar.

Fair timing on a noisy machine:

- every method is warmed up once (a short generation) before anything is timed, so one-off costs
  (lazy kernels, allocator growth, plugin tables) land on no sample;
- methods are interleaved per prompt: for each prompt every method runs, in an order rotated from
  prompt to prompt, so slow drift (thermal state, other processes) hits all methods alike and no
  method always runs right after the same neighbour;
- speedups are per prompt, against ``ar`` on that same prompt in the same pass;
- with ``repeats`` (``--repeats N``) every method runs N times on every prompt, each time with fresh
  decoders and the rotation shifted by one, and the record is the run with the median wall time
  (``wall_s_runs`` keeps every run's): one slow moment of a shared machine then moves no sample.
  The runs do the same work, so their texts agree (``repeats_identical`` says whether they did).

A study never runs the same pass twice: where a verified row's answer is a function of its token
path (float32 on the torch engine, greedy), our decoders verify through the target's memo
(:mod:`goose_bench.memo`, on disk under Goose's cache or ``--memo DIR``): every method, and every later
run on the same model, reads the rows any method computed before, and only the missing rows run. The
clock then times the drafting and what little runs, so a method's figure is its passes priced on a
pinned cost curve (``--cost-curve``; default this device's), on which its budgets are planned too
(no measured time moves them, so the figures reproduce on any machine, at any load). Each record
carries what the memo answered and what ran (``memo``). Where the memo cannot be exact (bfloat16,
int8, llama.cpp, sampling) or ``--repeats`` asks for clocks, every pass runs for real, and the run says why.
With ``resume`` (``--resume``) a run that stopped goes on: every method x prompt cell already in
``results.jsonl`` is kept, not run again.

Sources are cold by default: every Goose method gets a fresh decoder for each sample, so what a
source learns on one prompt (acceptance estimates, tables, a memory of earlier outputs) never
carries to the next and a sample's figures do not depend on the prompts before it. With
``warm_sources`` (``--warm-sources``) each method keeps one decoder for all samples, in dataset
order, which is how a long-lived server runs and what cross-request memory (``suffix_memory``)
needs to show; the warm-up then uses a prompt of its own, so no sample's answer is learned before
that sample is timed.

A method that cannot be built (plugin not registered, unknown config field) or that raises
mid-run is reported as unavailable with the reason; the others go on. Records are appended to
``results.jsonl`` after each prompt, so an interrupted run keeps what it measured, and the
summary, report and plots are written from whatever was measured.
"""

from __future__ import annotations

import gc
import json
import logging
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np
import torch
import transformers
from tqdm import tqdm
from transformers.utils import logging as hf_logging

from goose import models
from goose.config import SamplingParams
from goose.cycle.calibration import load_or_measure
from goose.cycle.engine import new_verifier
from goose.cycle.verifier import ContextOverflowError, Verifier
from goose.planning import machine
from goose.planning.cost import CostCurve
from goose_bench.aggregate import build_summary
from goose_bench.conversation import turn_prompt_ids
from goose_bench.estimate import DEVICE_CURVE, load_curve, price
from goose_bench.generators import DecoderGenerator, Generator, Study, TurnOutput, make_generator
from goose_bench.generators import memo_refusal as memo_refusal_of
from goose_bench.medians import middle_by
from goose_bench.memo import TargetMemo
from goose_bench.memo import refusal as memo_refusal
from goose_bench.methods import (
    BASELINE,
    NO_OVERRIDES,
    Method,
    Overrides,
    construction_problem,
    resolve_methods,
    unavailable_reason,
    with_datastore,
)
from goose_bench.mismatch import explain, first_difference
from goose_bench.prompts import Sample, load_samples, read_jsonl
from goose_bench.records import Record, build_record, compare
from goose_bench.study import study_rows, tokens_lost_without

logger = logging.getLogger("goose_bench")

RESULTS_FILE = "results.jsonl"
# With warm sources the warm-up must not show any sample's answer to a decoder that keeps it
WARMUP_TURNS = ("Say hello in one short sentence.",)


@dataclass
class BenchSettings:
    """Everything one ``goose bench`` run needs (the CLI fills it from its flags)."""

    models: list[str]
    datasets: list[str]
    methods: list[str | Method]  # built-in names, SOURCES@TOPOLOGY, or methods made by a suite or a study file
    out: Path
    data_dir: Path
    limit: int | None = None
    max_new_tokens: int = 128
    dtype: str = "bfloat16"
    quantize: str | None = None  # "int8": every linear layer in int8 (goose.quantize), the rest in dtype
    device: str = "cpu"
    seed: int = 0
    threads: int | None = None
    chat: bool = True
    warmup_tokens: int = 8
    warm_sources: bool = False  # one decoder per method for all samples (else a fresh one per sample)
    repeats: int = 1  # timed runs of every method on every sample; the record is the median run
    datastore: Path | None = None  # REST's datastore for every method that drafts from REST (None: its default)
    sampling: SamplingParams = field(default_factory=SamplingParams)  # greedy unless temperature > 0
    overrides: Overrides = NO_OVERRIDES  # --budget / --config on composed methods
    cost_curve: str | None = None  # the deterministic mode: "device" or a curve file (goose_bench.estimate)
    progress: bool = True
    engine: str = "torch"  # or "llama.cpp": the GGUF file as shipped (goose.cycle.engine)
    memo: bool = True  # through the target's memo where it is exact (goose_bench.memo); False: every pass for real
    memo_dir: Path | None = None  # where the memo lives (None: a folder under Goose's cache)
    resume: bool = False  # keep the cells already in results.jsonl and run the rest
    extra: dict[str, Any] = field(default_factory=dict)  # recorded in the summary's settings as is


@dataclass
class ModelRun:
    """One model's part of a run: what ran, what did not, and the records."""

    model: str
    device: str
    dtype: str
    methods: list[Method]
    unavailable: dict[str, str] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)
    cost_curve: CostCurve | None = None  # this device's verify cost curve, for time predicted from tree sizes
    priced_on: CostCurve | None = None  # the deterministic mode's curve (--cost-curve)
    priced_name: str | None = None  # which: "device" or the curve's file or shipped name
    # what another engine needs to decode the same first turns and stop where ours stop (goose bench llama)
    first_turn_ids: list[list[int]] = field(default_factory=list)  # per sample, as run_sample encodes turn 0
    eos_ids: list[int] = field(default_factory=list)
    memo: dict[str, Any] = field(default_factory=dict)  # where the memo was and what it did, or why it was off


class Alongside(Protocol):
    """Another engine taking turns with our methods on the same samples (``goose bench llama``'s llama.cpp): started
    once a model's first turns are encoded, it runs each sample's turn (every repeat) before or after our methods'
    runs of it, alternately, so that a machine's drift hits both sides alike."""

    def begin(self, model: str, samples: Sequence[Sample], first_turn_ids: Sequence[list[int]],
              eos_ids: Sequence[int]) -> None:
        """Load and warm up on ``model``, whose samples' first turns our run encoded as ``first_turn_ids``."""

    def turn(self, index: int, repeat: int) -> None:
        """Run sample ``index`` (its first turn) once more: repeat ``repeat``."""

    def end(self, model: str, records: Sequence[Record], finished: bool) -> None:
        """``model`` is done (``finished``: every sample ran; else the run stopped): collect against ``records``."""


def _set_seed(seed: int) -> None:
    # pins whatever a plugin might randomise; sampled decoding draws by its own per-sample seed
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _device(device: str) -> str:
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def memo_off(settings: BenchSettings) -> str | None:
    """Why no model of this run can verify through the memo (None: each model's own check decides)."""
    if not settings.memo:
        return "--no-memo"
    if settings.engine != "torch":
        return memo_refusal(None)
    if not settings.sampling.greedy:
        return "sampled decoding draws from whole distributions, which the memo does not keep"
    if settings.repeats > 1:
        return "--repeats times real passes"
    return None


def memo_totals(records: Sequence[Record]) -> dict[str, int]:
    """What the memo answered and what still ran, over ``records``."""
    totals: dict[str, int] = {}
    for record in records:
        for key, value in (record.get("memo") or {}).items():
            totals[key] = totals.get(key, 0) + value
    return totals


def finished_cells(path: Path) -> dict[tuple[str, str, str, str], Record]:
    """The (model, dataset, question id, method) cells of an earlier run's ``results.jsonl`` (for ``--resume``); a
    line cut short by the stop is left out, and its cell runs again."""
    cells: dict[tuple[str, str, str, str], Record] = {}
    if not path.exists():
        return cells
    for _, record in read_jsonl(path, skip_broken=True):
        try:
            cells[(record["model"], record["dataset"], str(record["question_id"]), record["method"])] = record
        except (KeyError, TypeError):
            continue
    return cells


def run_sample(generator: Generator, tokenizer: Any, sample: Sample, max_new_tokens: int,
               chat: bool, sampling: SamplingParams | None = None) -> list[TurnOutput]:
    """Every turn of ``sample``; turn k's prompt carries this method's own answers to turns < k."""
    outputs: list[TurnOutput] = []
    for turn in range(len(sample.turns)):
        prompt_ids = turn_prompt_ids(tokenizer, sample.turns, [o.text for o in outputs], chat=chat)
        prediction = sample.prediction if turn == 0 else None  # the prediction is the first answer's
        outputs.append(generator.generate(prompt_ids, max_new_tokens, sampling, prediction))
    return outputs


def median_run(records: Sequence[Record]) -> Record:
    """Of one method's runs on one sample, the one with the median wall time (the lower of two middles), carrying
    every run's wall time (``wall_s_runs``, in run order) and whether every run decoded the same tokens."""
    chosen = dict(middle_by(records, key=lambda record: record["wall_s"]))
    chosen["wall_s_runs"] = [record["wall_s"] for record in records]
    chosen["repeats_identical"] = all(record["new_token_ids"] == records[0]["new_token_ids"] for record in records)
    if not chosen["repeats_identical"]:
        logger.warning("%s on %s:%s decoded different tokens in its repeats", chosen["method"], chosen["dataset"],
                       chosen["question_id"])
    return chosen


def describe(method: Method) -> dict[str, Any]:
    """A method's entry in the summary: its definition and, for Goose methods, the full effective config
    (so a changed default, such as the budget, shows in the results it produced)."""
    entry: dict[str, Any] = {"kind": method.kind, "group": method.group, "description": method.description,
                             "fields": dict(method.fields), "digest": dict(method.fields)}
    if method.kind == "goose" and unavailable_reason(method) is None:
        config = method.config()
        entry["config"] = config.model_dump(mode="json")
        entry["digest"] = config.digest()  # sources, topology, budget, options, and every other changed field
    return entry


def _rotated(names: Sequence[str], shift: int) -> list[str]:
    shift %= max(1, len(names))
    return [*names[shift:], *names[:shift]]


class Bench:
    """Runs the settings' methods on the settings' samples, model after model."""

    def __init__(self, settings: BenchSettings, alongside: Alongside | None = None) -> None:
        if settings.repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {settings.repeats}")
        if settings.repeats > 1 and settings.warm_sources:
            raise ValueError("--repeats times the same work again, which warm sources do not do (each run would "
                             "start from what the last one learned); leave out --warm-sources or --repeats")
        self.settings = settings
        self.alongside = alongside
        self.memo_off = memo_off(settings)
        if settings.resume and settings.warm_sources:
            raise ValueError("--resume starts the missing samples with what warm sources would have learned from "
                             "the finished ones, which it does not have; leave out --warm-sources or --resume")
        self.methods = resolve_methods(settings.methods, settings.overrides)
        if settings.cost_curve not in (None, DEVICE_CURVE):
            load_curve(str(settings.cost_curve))  # a bad file fails before any model loads
        if settings.datastore is not None:
            self.methods = [with_datastore(method, settings.datastore) for method in self.methods]
        self.samples = [s for spec in settings.datasets
                        for s in load_samples(spec, settings.data_dir, settings.limit)]
        self.digests = {method.name: describe(method)["digest"] for method in self.methods}
        self.runs: list[ModelRun] = []
        self.started = time.strftime("%Y-%m-%d %H:%M:%S")

    def run(self) -> list[ModelRun]:
        settings = self.settings
        if settings.threads:
            torch.set_num_threads(settings.threads)
        settings.out.mkdir(parents=True, exist_ok=True)
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # generate()'s per-call notices would drown the progress bar
        total = len(settings.models) * len(self.samples) * len(self.methods) * settings.repeats
        self.done = finished_cells(settings.out / RESULTS_FILE) if settings.resume else {}
        grid = {(model, s.dataset, str(s.question_id), m.name) for model in settings.models for s in self.samples
                for m in self.methods}
        self.done = {cell: record for cell, record in self.done.items() if cell in grid}
        total -= len(self.done) * settings.repeats
        try:
            with (settings.out / RESULTS_FILE).open("a" if settings.resume else "w", encoding="utf-8") as results, \
                    tqdm(total=total, unit="gen", dynamic_ncols=True, disable=not settings.progress) as bar:
                for name in settings.models:
                    self._run_model(name, results, bar)
        finally:
            hf_logging.set_verbosity(verbosity)
        return self.runs

    def _run_model(self, name: str, results: TextIO, bar: tqdm) -> None:
        settings = self.settings
        _set_seed(settings.seed)
        device = _device(settings.device)
        bar.set_postfix_str(f"loading {name}")
        if settings.engine == "llama.cpp":
            model, tokenizer = models.load_gguf(name, threads=settings.threads)
        else:
            model, tokenizer = models.load(name, dtype=settings.dtype, device=device, progress=False,
                                           quantize=settings.quantize)
        run = ModelRun(name, device, settings.dtype, self.methods, cost_curve=load_or_measure(model))
        study = self._study(run, model)
        if settings.cost_curve is not None or study.memo is not None:
            spec = settings.cost_curve or DEVICE_CURVE  # the memo's clock is no cost: passes are priced
            run.priced_on = run.cost_curve if spec == DEVICE_CURVE else load_curve(spec)
            run.priced_name = spec
            study = Study(study.memo, run.priced_on)
        self.runs.append(run)
        generators = self._generators(run, model, tokenizer, bar, study)
        run.first_turn_ids = [turn_prompt_ids(tokenizer, s.turns[:1], [], chat=settings.chat) for s in self.samples]
        run.eos_ids = sorted(generators[BASELINE].decoder.eos_ids)  # type: ignore[attr-defined]
        self._warm_up(run, generators, tokenizer, bar)
        if self.alongside is None:
            self._samples(run, generators, model, tokenizer, bar, study, results)
        else:
            finished = False
            try:
                self.alongside.begin(name, self.samples, run.first_turn_ids, run.eos_ids)
                self._samples(run, generators, model, tokenizer, bar, study, results)
                finished = True
            finally:
                self.alongside.end(name, run.records, finished)
        if study.memo is not None:
            study.memo.flush()
            run.memo["totals"] = memo_totals(run.records)
        del generators, model, tokenizer
        gc.collect()

    def _samples(self, run: ModelRun, generators: dict[str, Generator], model: Any, tokenizer: Any, bar: tqdm,
                 study: Study, results: TextIO) -> None:
        """Every sample through every method (and the alongside engine's turns), records appended as they finish."""
        settings, name, alongside = self.settings, run.model, self.alongside
        order = [m.name for m in self.methods if m.name in generators]
        for index, sample in enumerate(self.samples):
            runs: dict[str, list[Record]] = {}
            skipped = False
            kept = {method: self.done[(name, sample.dataset, str(sample.question_id), method)]
                    for method in order if (name, sample.dataset, str(sample.question_id), method) in self.done}
            if len(kept) == len(order):  # --resume: every cell of this sample is done
                run.records.extend(kept[method] for method in order)
                for repeat in range(settings.repeats if alongside is not None else 0):
                    alongside.turn(index, repeat)  # type: ignore[union-attr]
                continue
            # sampled runs: one seed per sample, the same for every method (settings.seed + sample index)
            sampling = None if settings.sampling.greedy else settings.sampling.model_copy(
                update={"seed": settings.seed + index})
            for repeat in range(settings.repeats):
                if not settings.warm_sources:
                    self._fresh_decoders(run, generators, model, tokenizer, index, bar, study)
                # the alongside engine runs before our methods on every other turn, after them on the rest
                before = alongside is not None and (index + repeat) % 2 == 1
                if before:
                    alongside.turn(index, repeat)  # type: ignore[union-attr]
                for method in _rotated([m for m in order if m in generators and m not in kept], index + repeat):
                    bar.set_postfix_str(f"{name} {sample.dataset}:{sample.question_id} {method}", refresh=False)
                    try:
                        outputs = run_sample(generators[method], tokenizer, sample, settings.max_new_tokens,
                                             settings.chat, sampling)
                    except Exception as error:
                        if method != BASELINE:
                            problem = f"failed on {sample.dataset}:{sample.question_id} (after {index} samples): "
                            done = len(runs.pop(method, []))
                            self._drop(run, generators, method, problem + f"{type(error).__name__}: {error}",
                                       index, bar, done)
                            continue
                        if not isinstance(error, ContextOverflowError):
                            raise
                        # the prompt does not fit the model: no method can be compared on it
                        logger.warning("skipping %s:%s: %s", sample.dataset, sample.question_id, error)
                        skipped = True
                        break
                    runs.setdefault(method, []).append(
                        build_record(name, method, sample, outputs, sampling.seed if sampling else None,
                                     self.digests[method]))
                    bar.update(1)
                if skipped:
                    break
                if alongside is not None and not before:
                    alongside.turn(index, repeat)
            if skipped:  # its slots are spent
                bar.update(sum(1 for m in order if m in generators) * settings.repeats
                           - sum(len(r) for r in runs.values()))
                continue
            # a method dropped after some of its repeats leaves no record of this sample
            measured = {method: median_run(records) for method, records in runs.items() if method in generators}
            measured = {method: kept[method] for method in kept if method in generators} | measured
            compare(measured)
            if study.memo is not None:  # the clock timed drafting and what the memo lacked: no speed to compare
                for record in measured.values():
                    for key in ("speedup", "speedup_vs_hf_ar", "speedup_vs_hf_pld"):
                        if key in record:
                            record[key] = None
            if run.priced_on is not None:
                price(measured, run.priced_on, BASELINE)
            elif run.cost_curve is not None:  # beside the clock: what the trees cost by the planner's own rule
                price(measured, run.cost_curve, BASELINE)
            if sampling is None:
                self._explain(measured, sample, generators, tokenizer)
            for method in order:  # file order: the requested method order, whatever the timing order
                if method in measured:
                    if method not in kept:
                        results.write(json.dumps(measured[method]) + "\n")
                    run.records.append(measured[method])
            results.flush()

    def _explain(self, measured: dict[str, Record], sample: Sample, generators: dict[str, Generator],
                 tokenizer: Any) -> None:
        """Every greedy output that is not ``ar``'s gets its first difference and ``ar``'s logits there
        (:mod:`goose_bench.mismatch`), replayed through ``ar``'s own verifier (not timed)."""
        base = measured.get(BASELINE)
        if base is None:
            return
        decoder = generators[BASELINE].decoder  # type: ignore[attr-defined]
        # replayed for real: the memo keeps a row's top-k, not the logits the explanation quotes
        verifier = decoder.verifier if isinstance(decoder.verifier, Verifier) else new_verifier(decoder.model)
        for record in measured.values():
            if record["identical_to_ar"] is not False or record["method"] not in generators or \
                    generators[record["method"]].method.kind == "hf":
                continue
            for turn, (reference, other) in enumerate(zip(base["new_token_ids"], record["new_token_ids"],
                                                          strict=True)):
                if reference != other:
                    prompt_ids = turn_prompt_ids(tokenizer, sample.turns[: turn + 1],
                                                 base["choices"][0]["turns"][:turn], chat=self.settings.chat)
                    found = explain(verifier, prompt_ids, reference, other, tokenizer)
                    record["first_difference"] = {"turn": turn, "index": first_difference(reference, other)} \
                        if found is None else {"turn": turn, **found}
                    break

    def _study(self, run: ModelRun, model: Any) -> Study:
        """The memo this model's decoders verify through, or None with the reason said once."""
        reason = self.memo_off or memo_refusal(model)
        if reason is None:
            memo = TargetMemo(model, self.settings.memo_dir)
            run.memo = {"folder": str(memo.folder), "fingerprint": memo.settings}
            tqdm.write(f"goose bench: {run.model}: the memo at {memo.folder}: rows any run verified before are "
                       "read, not run; passes priced on the cost curve", file=sys.stderr)
            return Study(memo)
        run.memo = {"off": reason}
        if self.settings.memo:
            tqdm.write(f"goose bench: {run.model}: every pass runs for real: {reason}", file=sys.stderr)
        return Study()

    def _generators(self, run: ModelRun, model: Any, tokenizer: Any, bar: tqdm, study: Study
                    ) -> dict[str, Generator]:
        baseline = DecoderGenerator(self.methods[0], model, tokenizer, study)  # resolve_methods puts ar first
        generators: dict[str, Generator] = {BASELINE: baseline}
        for method in self.methods[1:]:
            reason = unavailable_reason(method)
            if reason is None:
                try:
                    generators[method.name] = make_generator(method, model, tokenizer, baseline.decoder.eos_ids, study)
                    refused = memo_refusal_of(method) if study.memo is not None else None
                    if refused is not None and method.kind != "hf":
                        tqdm.write(f"goose bench: {run.model}: {method.name} runs every pass for real: {refused}",
                                   file=sys.stderr)
                except Exception as error:
                    reason = construction_problem(error, method)
            if reason is not None:
                self._unavailable(run, method.name, reason, len(self.samples), bar)
        return generators

    def _fresh_decoders(self, run: ModelRun, generators: dict[str, Generator], model: Any, tokenizer: Any,
                        index: int, bar: tqdm, study: Study) -> None:
        """Cold sources: a new decoder for every Goose method before sample ``index`` (built before any clock)."""
        eos_ids = generators[BASELINE].decoder.eos_ids  # type: ignore[attr-defined]
        for name, generator in list(generators.items()):
            if generator.method.kind != "goose":
                continue
            try:
                generators[name] = make_generator(generator.method, model, tokenizer, eos_ids, study)
            except Exception as error:
                self._drop(run, generators, name, f"failed to build for sample {index}: {type(error).__name__}: "
                           f"{error}", index, bar)

    def _warm_up(self, run: ModelRun, generators: dict[str, Generator], tokenizer: Any, bar: tqdm) -> None:
        turns = WARMUP_TURNS if self.settings.warm_sources else self.samples[0].turns
        prompt_ids = turn_prompt_ids(tokenizer, turns, [], chat=self.settings.chat)
        for name, generator in list(generators.items()):
            bar.set_postfix_str(f"{run.model} warm-up {name}")
            try:
                generator.generate(prompt_ids, self.settings.warmup_tokens)
            except Exception as error:
                if name == BASELINE:
                    raise
                self._drop(run, generators, name, f"failed in warm-up: {type(error).__name__}: {error}", 0, bar)

    def _drop(self, run: ModelRun, generators: dict[str, Generator], name: str, reason: str, index: int,
              bar: tqdm, done: int = 0) -> None:
        """Take a failing method out for the rest of this model's run (the samples it finished stay); ``done``:
        its runs of sample ``index`` already counted, now dropped with it."""
        del generators[name]
        self._unavailable(run, name, reason, len(self.samples) - index, bar, done)

    def _unavailable(self, run: ModelRun, name: str, reason: str, remaining: int, bar: tqdm, done: int = 0) -> None:
        run.unavailable[name] = reason
        bar.total -= remaining * self.settings.repeats - done
        bar.refresh()
        tqdm.write(f"goose bench: {run.model}: method {name!r} unavailable: {reason}", file=sys.stderr)

    def summaries(self) -> list[dict[str, Any]]:
        """One ``summary.json`` object per model run so far."""
        settings = self.settings
        common = {
            "max_new_tokens": settings.max_new_tokens,
            "limit": settings.limit,
            "datasets": list(dict.fromkeys(s.dataset for s in self.samples)),
            "samples": len(self.samples),
            "seed": settings.seed,
            "quantize": settings.quantize,
            "threads": torch.get_num_threads(),
            "engine": settings.engine,
            "chat_template": settings.chat,
            "warmup_tokens": settings.warmup_tokens,
            "warm_sources": settings.warm_sources,
            "resumed": settings.resume,
            "repeats": settings.repeats,
            "rest_datastore": str(settings.datastore) if settings.datastore else "default (standard library)",
            "sampling": settings.sampling.model_dump(exclude={"seed"}) | {"seeds": "seed + sample index"}
            if not settings.sampling.greedy else "greedy",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cpu": f"{machine.cpu_model()} ({machine.describe_features()})",
            "started": self.started,
            "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
            **settings.extra,
        }
        described = {m.name: describe(m) for m in self.methods}
        summaries = []
        for run in self.runs:
            priced = {"priced_on": {"curve": run.priced_name, **run.priced_on.to_dict()}} if run.priced_on else \
                {"priced_beside": {"curve": DEVICE_CURVE, **run.cost_curve.to_dict()}} if run.cost_curve else {}
            summary = build_summary(run.model, run.device, run.dtype, run.records, described, run.unavailable,
                                    common | {"cost_curve": run.cost_curve.to_dict() if run.cost_curve else None}
                                    | priced | {"memo": run.memo})
            if any(m.kind == "goose" and "@" in m.name for m in self.methods):  # composed: the study's table
                rows = study_rows(run.records, run.cost_curve, run.priced_on)
                summary["study"] = {"rows": rows, "tokens_lost_without": tokens_lost_without(rows)}
            summaries.append(summary)
        return summaries
