"""``goose bench load --concurrency 1,2,4,8``: many requests at once, closed-loop clients, every method on the
same prompts.

At concurrency c, c clients each keep one request in flight: when one ends, that client's next
prompt joins at the next cycle boundary. Methods:

- ``ar`` and ``goose``: the batched engine (:class:`goose.cycle.session.Session`), without and
  with drafting (one bigram table for all rows: ``GooseConfig.batch_shared_sources="auto"``);
  ``goose_own``: the same with every row's own sources, tables included (``batch_shared_sources=[]``;
  asked for by name only);
- ``hf_ar``: Hugging Face's batched ``generate`` (greedy, left-padded static batches of c prompts:
  a batch ends when its longest answer does), the peer a user would batch with;
- ``goose_single`` and ``ar_single`` (concurrency 1 only): today's one-request-at-a-time paths,
  which also give every prompt's reference output.

Reported per method and concurrency: total output tokens per second, per-request latency p50/p95,
tau, and the share of requests whose output is token-identical to that prompt's own single-request
autoregressive run. Written to ``concurrency.json`` (rows with a ``concurrency`` field),
``concurrency.md`` and ``concurrency.png`` (throughput against concurrency). With ``goose bench vllm``
vLLM's rows (``vllm_none``, ``vllm_ngram``, ``vllm_goose``: :mod:`goose_bench.vllm_peer`) join the
same table and plot.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

CONCURRENCY_METHODS = ("ar", "goose", "hf_ar")
OPTIONAL_METHODS = ("goose_own",)  # run when --methods names them
SERIAL_METHODS = ("ar_single", "goose_single")
BATCHED_GOOSE_METHODS = ("goose", "goose_own")  # compared with vLLM's ngram
VLLM_PREFIX = "vllm_"  # rows measured by bench/goose_bench/peers/vllm_runner.py: vllm_none, vllm_ngram, vllm_goose


@dataclass
class ConcurrencyRow:
    model: str
    method: str
    concurrency: int
    requests: int
    tokens: int
    wall_s: float
    tokens_per_s: float
    latency_p50_s: float | None  # None: not measured (vLLM given every prompt at once)
    latency_p95_s: float | None
    tau: float
    identical_to_ar: float | None  # share of requests token-identical to their own single-request AR run
    # per request, in prompt order (None for vLLM's rows, given every prompt at once): what a percentile hides
    latencies_s: list[float] | None = None
    taus: list[float] | None = None


@dataclass
class _Run:
    outputs: list[list[int]]
    latencies: list[float]
    wall_s: float
    taus: list[float]


def closed_loop(decoder: Any, prompts: Sequence[list[int]], max_new_tokens: int, concurrency: int) -> _Run:
    """Every prompt through ``decoder``'s batched engine, ``concurrency`` of them in flight at any time."""
    session = decoder.batch(concurrency)
    pending = deque(enumerate(prompts))
    submitted: dict[int, tuple[int, float]] = {}  # request id -> (prompt index, submit time)
    outputs: list[list[int]] = [[] for _ in prompts]
    latencies, taus = [0.0] * len(prompts), [1.0] * len(prompts)
    started = time.perf_counter()

    def submit_next() -> None:
        index, prompt = pending.popleft()
        submitted[session.submit(decoder.request(prompt, max_new_tokens))] = (index, time.perf_counter())

    for _ in range(min(concurrency, len(pending))):
        submit_next()
    while session.active:
        for event in session.step():
            if event.result is None:
                continue
            index, at = submitted.pop(event.request_id)
            outputs[index], latencies[index] = event.result.new_token_ids, time.perf_counter() - at
            taus[index] = event.result.stats.tau
            if pending:
                submit_next()
    return _Run(outputs, latencies, time.perf_counter() - started, taus)


def serial(decoder: Any, prompts: Sequence[list[int]], max_new_tokens: int) -> _Run:
    """One request at a time through the single-request path."""
    outputs, latencies, taus = [], [], []
    started = time.perf_counter()
    for prompt in prompts:
        at = time.perf_counter()
        result = decoder.generate(prompt, max_new_tokens)
        outputs.append(result.new_token_ids)
        latencies.append(time.perf_counter() - at)
        taus.append(result.stats.tau)
    return _Run(outputs, latencies, time.perf_counter() - started, taus)


@torch.inference_mode()
def hf_batched(model: Any, tokenizer: Any, prompts: Sequence[list[int]], max_new_tokens: int, concurrency: int,
               eos_ids: frozenset[int]) -> _Run:
    """Hugging Face ``generate`` on static, left-padded batches of ``concurrency`` prompts (greedy)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids, default=0)
    device = next(model.parameters()).device
    outputs: list[list[int]] = []
    latencies: list[float] = []
    started = time.perf_counter()
    for first in range(0, len(prompts), concurrency):
        batch = prompts[first : first + concurrency]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        at = time.perf_counter()
        generated = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                   do_sample=False, pad_token_id=pad, eos_token_id=sorted(eos_ids) or None)
        elapsed = time.perf_counter() - at
        for row in generated[:, width:].tolist():
            end = next((i + 1 for i, token in enumerate(row) if token in eos_ids), len(row))
            outputs.append(row[:end])
            latencies.append(elapsed)
    return _Run(outputs, latencies, time.perf_counter() - started, [1.0] * len(prompts))


def run_concurrency(model_name: str, model: Any, tokenizer: Any, prompts: Sequence[list[int]],
                    concurrencies: Sequence[int], methods: Sequence[str], max_new_tokens: int,
                    progress: bool = True) -> tuple[list[ConcurrencyRow], list[list[int]]]:
    """Every method at every concurrency on ``prompts`` (token ids); the single-request AR run is the reference.

    Returns the rows and that reference (each prompt's AR output), which other engines' rows are compared with.
    """
    from goose.config import GooseConfig
    from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder

    ar, goose = AutoregressiveDecoder(model, tokenizer), GooseDecoder(model, tokenizer)
    own = GooseDecoder(model, tokenizer, GooseConfig(batch_shared_sources=[]))
    warmed = (ar, goose, own) if "goose_own" in methods else (ar, goose)
    for decoder in warmed:  # warm-up: lazy kernels, the cost curves (measured once per machine)
        decoder.generate(prompts[0], 4)
        for concurrency in concurrencies:
            decoder.generate_batch(list(prompts[:concurrency]), 4, max_batch=concurrency)
    reference = serial(ar, prompts, max_new_tokens)
    rows = [_row(model_name, "ar_single", 1, reference, reference)]
    if "goose" in methods:
        rows.append(_row(model_name, "goose_single", 1, serial(goose, prompts, max_new_tokens), reference))
    for concurrency in concurrencies:
        for method in methods:
            if method == "ar":
                run = closed_loop(ar, prompts, max_new_tokens, concurrency)
            elif method == "goose":
                run = closed_loop(goose, prompts, max_new_tokens, concurrency)
            elif method == "goose_own":
                run = closed_loop(own, prompts, max_new_tokens, concurrency)
            elif method == "hf_ar":
                run = hf_batched(model, tokenizer, prompts, max_new_tokens, concurrency, ar.eos_ids)
            else:
                raise ValueError(f"unknown concurrency method {method!r}; known: "
                                 f"{', '.join(CONCURRENCY_METHODS + OPTIONAL_METHODS)}")
            rows.append(_row(model_name, method, concurrency, run, reference))
            if progress:
                last = rows[-1]
                print(f"  {model_name} {method} at concurrency {concurrency}: {last.tokens_per_s:.1f} tok/s, "
                      f"p95 {last.latency_p95_s:.2f} s, identical {last.identical_to_ar:.0%}", flush=True)
    return rows, reference.outputs


def _row(model: str, method: str, concurrency: int, run: _Run, reference: _Run) -> ConcurrencyRow:
    tokens = sum(len(output) for output in run.outputs)
    same = sum(output == expected for output, expected in zip(run.outputs, reference.outputs, strict=True))
    return ConcurrencyRow(model, method, concurrency, len(run.outputs), tokens, round(run.wall_s, 3),
                          round(tokens / run.wall_s, 2), latency_percentile(run.latencies, 50),
                          latency_percentile(run.latencies, 95), round(float(np.mean(run.taus)), 3),
                          round(same / len(run.outputs), 3), [round(s, 3) for s in run.latencies],
                          [round(float(t), 3) for t in run.taus])


def latency_percentile(seconds: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile of per-request latencies, rounded as the rows keep it; None when none was measured."""
    return round(float(np.percentile(seconds, q)), 3) if len(seconds) else None


def write_concurrency(rows: Sequence[ConcurrencyRow], out: Path,
                      notes: Mapping[str, Sequence[str]] | None = None) -> list[Path]:
    """concurrency.json, concurrency.md (a table per model, ratios against batched ar, our best batched goose over
    vLLM's ngram, then ``notes[model]``) and concurrency.png."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "concurrency.json", out / "concurrency.md"]
    written[0].write_text(json.dumps([asdict(row) for row in rows], indent=1))
    lines = []
    for model in dict.fromkeys(row.model for row in rows):
        mine = [row for row in rows if row.model == model]
        ar = {row.concurrency: row.tokens_per_s for row in mine if row.method == "ar"}
        lines += [f"## {model}", "", "| method | concurrency | tok/s | x batched ar | p50 s | p95 s | tau | "
                  "identical to AR |", "|---|---|---|---|---|---|---|---|"]
        for row in mine:
            ratio = f"{row.tokens_per_s / ar[row.concurrency]:.2f}x" if ar.get(row.concurrency) else "-"
            lines.append(f"| {row.method} | {row.concurrency} | {row.tokens_per_s:.1f} | {ratio} | "
                         f"{_cell(row.latency_p50_s, '.2f')} | {_cell(row.latency_p95_s, '.2f')} | {row.tau:.2f} | "
                         f"{_cell(row.identical_to_ar, '.0%')} |")
        versus_ngram = _goose_over_vllm_ngram(mine)
        lines += ["", *versus_ngram] if versus_ngram else []
        slowest = _slowest_requests(mine)
        lines += ["", *slowest] if slowest else []
        lines += ["", *notes[model]] if notes and notes.get(model) else []
        lines.append("")
    written[1].write_text("\n".join(lines))
    if _plot(rows, out / "concurrency.png"):
        written.append(out / "concurrency.png")
    return written


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _goose_over_vllm_ngram(rows: Sequence[ConcurrencyRow]) -> list[str]:
    """One line per concurrency: our fastest batched goose method's tok/s over vLLM's ngram at that concurrency."""
    lines = []
    for concurrency in sorted({row.concurrency for row in rows}):
        here = [row for row in rows if row.concurrency == concurrency]
        ngram = next((row for row in here if row.method == "vllm_ngram"), None)
        ours = [row for row in here if row.method in BATCHED_GOOSE_METHODS]
        if ngram is None or not ours or not ngram.tokens_per_s:
            continue
        best = max(ours, key=lambda row: row.tokens_per_s)
        lines.append(f"- concurrency {concurrency}: batched {best.method} {best.tokens_per_s:.1f} tok/s over "
                     f"vllm_ngram {ngram.tokens_per_s:.1f} tok/s = {best.tokens_per_s / ngram.tokens_per_s:.2f}x")
    return lines


def _slowest_requests(rows: Sequence[ConcurrencyRow]) -> list[str]:
    """One line per batched goose row: its slowest request's latency and tau, beside the same prompt under
    batched ar at that concurrency (whether a slow tail is a request the trees do not help, riding wider passes)."""
    ar = {row.concurrency: row.latencies_s for row in rows if row.method == "ar" and row.latencies_s}
    lines = []
    for row in rows:
        if row.method not in BATCHED_GOOSE_METHODS or not row.latencies_s or not row.taus:
            continue
        index = int(np.argmax(row.latencies_s))
        line = (f"- {row.method} at concurrency {row.concurrency}: the slowest request (prompt {index}) took "
                f"{row.latencies_s[index]:.1f} s at tau {row.taus[index]:.2f} (requests' median tau "
                f"{float(np.median(row.taus)):.2f})")
        same = ar.get(row.concurrency)
        if same is not None and len(same) == len(row.latencies_s):
            line += f"; batched ar took {same[index]:.1f} s on it"
        lines.append(line)
    return lines


def _plot(rows: Sequence[ConcurrencyRow], path: Path) -> bool:
    try:
        from goose_bench.plots import _pyplot

        plt = _pyplot()
    except ImportError:
        return False
    models = list(dict.fromkeys(row.model for row in rows))
    figure, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    for axis, model in zip(axes[0], models, strict=True):
        vllm_methods = [row.method for row in rows if row.model == model and row.method.startswith(VLLM_PREFIX)]
        for method in (*CONCURRENCY_METHODS, *OPTIONAL_METHODS, *dict.fromkeys(vllm_methods)):
            points = sorted((row.concurrency, row.tokens_per_s) for row in rows
                            if row.model == model and row.method == method)
            if points:  # dashed: another engine's throughput, not ours
                axis.plot(*zip(*points, strict=True), marker="o", label=method,
                          linestyle="--" if method.startswith(VLLM_PREFIX) else "-")
        single = [row.tokens_per_s for row in rows if row.model == model and row.method == "goose_single"]
        if single:
            axis.axhline(single[0], linestyle=":", color="gray", label="goose, one at a time")
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent requests")
        axis.set_ylabel("output tokens / s (all requests)")
        axis.set_title(model)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True
