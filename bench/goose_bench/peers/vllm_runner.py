"""Benchmark Goose inside vLLM: no speculation vs vLLM's own prompt lookup (ngram) vs GooseProposer.

Run with the vLLM environment (``make vllm-setup`` builds it)::

    .venv-vllm/bin/python bench/goose_bench/peers/vllm_runner.py         # 5 datasets x 5 prompts, 256 tokens, bf16
    .venv-vllm/bin/python bench/goose_bench/peers/vllm_runner.py --limit 1 --max-tokens 64 --batch 1   # a quick look

Every method decodes the same prompts (the first user turn of each sample, chat template applied)
greedily, first one request at a time, then all prompts submitted together with ``max_num_seqs`` =
``--batch``, so that vLLM decodes ``--batch`` of them at once and admits the next whenever one ends
(continuous batching); ``--concurrency 1,2,4`` runs those concurrencies instead (1: one at a time).
Each (method, concurrency) gets a fresh engine, warmed up on a prompt that is not in the benchmark:
Goose's suffix memory remembers earlier requests' outputs, and must never have seen the outputs of
the prompts it is timed on. ``goose`` is the proposer's default
configuration (context match and the cross-request suffix memory, shared by the engine's
drafters), ``goose_cm`` context match alone, ``goose_unshared`` the default with each drafter
remembering only the requests it served (the same as ``goose`` one request at a time). Reported
per (method, concurrency): output tokens per second (all output tokens over the wall time),
tau (output tokens per engine step of a request: output / (output - accepted draft tokens)), vLLM's
own mean acceptance length (1 + accepted / drafts, over steps that drafted) and the share of
outputs token-identical to vLLM without speculation (at concurrency 1, and at the same
concurrency: in bfloat16 vLLM's own output changes with the batch's shape). Writes ``results.json``
(every output and counter) and ``report.md`` into ``--out``. ``--peer`` adds a method of vLLM's own
with a speculative config of your choice, e.g. ``ngram`` tuned otherwise.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

METHODS = ("none", "ngram", "goose", "goose_cm", "goose_unshared")
# GOOSE_VLLM_CONFIG of each: the defaults, context match alone, drafters each with their own suffix memory
GOOSE_METHODS = {"goose": None, "goose_cm": '{"sources": ["context_match"]}',
                 "goose_unshared": '{"share_memory": false}'}
WARMUP_PROMPT = "Name three colours."  # not a benchmark prompt: the warm-up must teach no answer
PAPER_DATASETS = ("humaneval", "mbpp", "classeval", "gsm8k", "mt_bench")
COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}


@dataclass
class Prompt:
    dataset: str
    question_id: int | str
    ids: list[int]


@dataclass
class Run:
    """One method at one concurrency: its outputs and vLLM's speculative-decoding counters."""

    method: str
    concurrency: int
    wall_s: float
    outputs: list[list[int]]
    seconds: list[float | None]  # per prompt, one request at a time only
    counters: dict[str, int] = field(default_factory=dict)
    repeat: int = 0  # which of the --repeat rounds

    @property
    def output_tokens(self) -> int:
        return sum(len(output) for output in self.outputs)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def tau(self) -> float:
        """Output tokens per request step: each step gives one token of its own plus the accepted drafts."""
        accepted = self.counters.get("accepted_tokens", 0)
        return self.output_tokens / max(1, self.output_tokens - accepted)

    @property
    def mean_acceptance_length(self) -> float | None:
        drafts = self.counters.get("drafts", 0)
        return 1.0 + self.counters.get("accepted_tokens", 0) / drafts if drafts else None


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="HF model folder (default: SmolLM2-135M from Goose's cache)")
    parser.add_argument("--datasets", default=",".join(PAPER_DATASETS), help="comma-separated dataset names")
    parser.add_argument("--limit", type=int, default=5, help="prompts per dataset")
    parser.add_argument("--max-tokens", type=int, default=256, help="output tokens per prompt")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {', '.join(METHODS)}")
    parser.add_argument("--batch", type=int, default=4,
                        help="concurrency of the batched run: vLLM's max_num_seqs (1: one request at a time only)")
    parser.add_argument("--concurrency", default=None, metavar="C1,C2,...",
                        help="the concurrencies to run instead of 1 and --batch, e.g. 1,2,4 (goose bench "
                        "vllm passes its own)")
    parser.add_argument("--num-speculative-tokens", type=int, default=16, help="K, for ngram and goose alike")
    parser.add_argument("--ngram-min", type=int, default=3, help="vLLM ngram prompt_lookup_min (Goose matches 3-5)")
    parser.add_argument("--ngram-max", type=int, default=5, help="vLLM ngram prompt_lookup_max")
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=JSON",
                        help="one more method: vLLM's speculative_config as JSON, e.g. "
                        "'ngram_k8={\"method\": \"ngram\", \"num_speculative_tokens\": 8, \"prompt_lookup_min\": 2, "
                        "\"prompt_lookup_max\": 5}' (a peer tuned differently from `ngram`); repeatable")
    parser.add_argument("--goose-config", default=None,
                        help="GOOSE_VLLM_CONFIG for the goose method (JSON or path; default: the proposer's defaults)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of every (method, concurrency), interleaved; the tables show each one's median "
                        "run (by tok/s) and every round's tok/s")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--out", default="bench-results/vllm", help="folder for results.json and report.md")
    parser.add_argument("--data-dir", default=None,
                        help="benchmark data (default: $GOOSE_DATA, else the prompts goose ships)")
    args = parser.parse_args(argv)
    args.methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    args.peers = {}
    for peer in args.peer:
        name, _, text = peer.partition("=")
        if not name or name in METHODS or name in args.peers:
            parser.error(f"--peer {peer!r}: give a new name (not one of {', '.join(METHODS)}) before '='")
        try:
            config = json.loads(text)
        except json.JSONDecodeError as error:
            parser.error(f"--peer {name}: not JSON ({error})")
        if not isinstance(config, dict) or "method" not in config:
            parser.error(f"--peer {name}: a JSON object with vLLM's speculative 'method' (e.g. ngram) is needed")
        args.peers[name] = config
    args.methods += list(args.peers)
    if "none" not in args.methods:
        parser.error("the 'none' method is the reference every output is compared with; keep it in --methods")
    if args.batch < 1:
        parser.error("--batch must be >= 1")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.concurrency is None:
        args.concurrency = sorted({1, args.batch})
    else:
        try:
            args.concurrency = sorted({int(part) for part in args.concurrency.split(",") if part.strip()})
        except ValueError:
            parser.error(f"--concurrency takes integers, e.g. 1,2,4; got {args.concurrency!r}")
        if not args.concurrency or args.concurrency[0] < 1:
            parser.error("--concurrency takes integers >= 1")
    return args


def load_prompts(args: argparse.Namespace, tokenizer: Any) -> list[Prompt]:
    from goose.models import encode_prompt
    from goose_bench.prompts import load_samples

    data_dir = Path(args.data_dir) if args.data_dir else None
    prompts = []
    for dataset in [d for d in args.datasets.split(",") if d]:
        for sample in load_samples(dataset, data_dir, args.limit):
            prompts.append(Prompt(dataset, sample.question_id, encode_prompt(tokenizer, sample.turns[0])))
    return prompts


def default_model() -> str:
    from goose import models

    markers = sorted((models.default_cache_dir() / "models").glob("smollm2-135m-*/goose-cache.json"),
                     key=lambda marker: marker.stat().st_mtime)
    if not markers:
        models.load("smollm2-135m", dtype="float32")
        return default_model()
    return str(markers[-1].parent)


def speculative_config(method: str, args: argparse.Namespace) -> dict[str, Any] | None:
    if method in args.peers:
        return args.peers[method]
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": args.num_speculative_tokens,
                "prompt_lookup_min": args.ngram_min, "prompt_lookup_max": args.ngram_max}
    if method in GOOSE_METHODS:
        return {"method": "custom_class", "model": "goose_vllm.GooseProposer",
                "num_speculative_tokens": args.num_speculative_tokens}
    return None


def counters(llm: Any) -> dict[str, int]:
    return {COUNTERS[m.name]: int(m.value) for m in llm.get_metrics() if m.name in COUNTERS}


def run_method(method: str, concurrency: int, args: argparse.Namespace, model_path: str, prompts: list[Prompt],
               warmup_ids: list[int], repeat: int = 0) -> Run:
    """A fresh engine for ``method`` decoding every prompt at ``concurrency``; it is shut down before returning."""
    import vllm

    goose_config = args.goose_config if method == "goose" else GOOSE_METHODS.get(method)
    if goose_config:
        os.environ["GOOSE_VLLM_CONFIG"] = goose_config
    llm = vllm.LLM(model=model_path, dtype=args.dtype, max_model_len=args.max_model_len,
                   max_num_seqs=concurrency, enforce_eager=True, seed=0, disable_log_stats=False,
                   speculative_config=speculative_config(method, args))
    greedy = vllm.SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    requests = [{"prompt_token_ids": prompt.ids} for prompt in prompts]
    try:
        llm.generate([{"prompt_token_ids": warmup_ids}], vllm.SamplingParams(temperature=0.0, max_tokens=16),
                     use_tqdm=False)
        before = counters(llm)
        started = time.perf_counter()
        if concurrency == 1:
            outputs, seconds = [], []
            for request in requests:
                began = time.perf_counter()
                outputs.append(list(llm.generate([request], greedy, use_tqdm=False)[0].outputs[0].token_ids))
                seconds.append(time.perf_counter() - began)
        else:
            # all prompts at once: vLLM keeps up to max_num_seqs of them decoding, admitting the next as one ends
            results = llm.generate(requests, greedy, use_tqdm=False)
            outputs, seconds = [list(r.outputs[0].token_ids) for r in results], [None] * len(requests)
        wall = time.perf_counter() - started
        after = counters(llm)
        run = Run(method, concurrency, wall, outputs, seconds,
                  {key: after.get(key, 0) - before.get(key, 0) for key in after}, repeat)
        print(f"  {method:>8} x{concurrency}: {run.output_tokens} tokens in {wall:.1f} s "
              f"({run.tokens_per_s:.1f} tok/s), tau {run.tau:.2f}", flush=True)
        return run
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        os.environ.pop("GOOSE_VLLM_CONFIG", None)


def identical_rate(run: Run, reference: Run) -> float:
    same = sum(a == b for a, b in zip(run.outputs, reference.outputs, strict=True))
    return same / len(run.outputs)


def median_runs(runs: list[Run]) -> dict[tuple[str, int], Run]:
    """Per (method, concurrency), the round with the median tok/s (the lower one of an even count)."""
    from goose_bench.medians import middle_by  # on the path wherever the runner runs, as goose_bench.prompts is

    rounds: dict[tuple[str, int], list[Run]] = {}
    for run in runs:
        rounds.setdefault((run.method, run.concurrency), []).append(run)
    return {key: middle_by(found, key=lambda r: r.tokens_per_s) for key, found in rounds.items()}


def report(runs: list[Run], prompts: list[Prompt], args: argparse.Namespace, conditions: dict[str, Any]) -> str:
    by_key = median_runs(runs)
    reference = by_key[("none", min(args.concurrency))]
    repeated = args.repeat > 1
    lines = [f"vLLM {conditions['vllm']} CPU, {conditions['model_name']} {args.dtype}, {len(prompts)} prompts "
             f"({args.datasets}, --limit {args.limit}), {args.max_tokens} tokens, K={args.num_speculative_tokens}, "
             f"ngram n={args.ngram_min}..{args.ngram_max}"
             + (f"; {args.repeat} rounds, each row the round with the median tok/s" if repeated else ""), "",
             "| method | concurrency | output tok/s | vs none | vs ngram | tau | vLLM mean acceptance length | "
             f"identical to none x{min(args.concurrency)} | identical to none, same concurrency |"
             + (" tok/s of each round |" if repeated else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if repeated else "")]
    for (method, concurrency), run in by_key.items():
        none = by_key.get(("none", concurrency))
        ngram = by_key.get(("ngram", concurrency))
        length = run.mean_acceptance_length
        each = " / ".join(f"{r.tokens_per_s:.1f}" for r in runs if (r.method, r.concurrency) == (method, concurrency))
        lines.append(
            f"| `{method}` | {concurrency} | {run.tokens_per_s:.1f} | "
            f"{run.tokens_per_s / none.tokens_per_s:.2f}x | "
            f"{f'{run.tokens_per_s / ngram.tokens_per_s:.2f}x' if ngram else '-'} | {run.tau:.2f} | "
            f"{f'{length:.2f}' if length else '-'} | {identical_rate(run, reference):.0%} | "
            f"{identical_rate(run, none):.0%} |" + (f" {each} |" if repeated else ""))
    datasets = list(dict.fromkeys(p.dataset for p in prompts))
    lines += ["", "Output tok/s per dataset, one request at a time:", "",
              "| method | " + " | ".join(datasets) + " |", "|---|" + "---|" * len(datasets)]
    for run in by_key.values():
        if run.concurrency != 1:
            continue
        cells = []
        for dataset in datasets:
            rows = [i for i, p in enumerate(prompts) if p.dataset == dataset]
            tokens = sum(len(run.outputs[i]) for i in rows)
            cells.append(f"{tokens / sum(run.seconds[i] for i in rows):.1f}")  # type: ignore[misc]
        lines.append(f"| `{run.method}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def results_document(args: argparse.Namespace, conditions: dict[str, Any], prompts: list[Prompt],
                     runs: list[Run]) -> dict[str, Any]:
    """What results.json holds (``goose bench vllm`` reads it): every prompt's ids, every run's outputs."""
    return {"arguments": dict(vars(args)), "conditions": conditions, "prompts": [asdict(p) for p in prompts],
            "runs": [asdict(r) | {"tokens_per_s": r.tokens_per_s, "tau": r.tau,
                                  "mean_acceptance_length": r.mean_acceptance_length} for r in runs]}


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    # a fixed KV cache (GiB) instead of vLLM's default share of all memory, which fails on a busy machine
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import vllm

    model_path = args.model or default_model()
    from transformers import AutoTokenizer

    from goose.models import encode_prompt
    from goose.planning.machine import cpu_count  # the CPUs this process may run on (its affinity)

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = load_prompts(args, tokenizer)
    warmup_ids = encode_prompt(tokenizer, WARMUP_PROMPT)
    conditions = {"vllm": vllm.__version__, "model": model_path, "model_name": Path(model_path).name.split("-")[0],
                  "processor": platform.processor() or platform.machine(), "cpus": cpu_count(),
                  "load_average_before": os.getloadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    print(f"{len(prompts)} prompts, methods {args.methods}, concurrency {args.concurrency}", flush=True)
    runs: list[Run] = []
    for repeat in range(args.repeat):  # rounds interleaved, so that a slow spell of the machine hits every method
        for method in ["none", *[m for m in args.methods if m != "none"]]:
            for concurrency in args.concurrency:
                runs.append(run_method(method, concurrency, args, model_path, prompts, warmup_ids, repeat))
    conditions["load_average_after"] = os.getloadavg()
    text = report(runs, prompts, args, conditions)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text)
    (out / "results.json").write_text(json.dumps(results_document(args, conditions, prompts, runs), indent=1))
    print()
    print(text)
    print(f"load average before {conditions['load_average_before']}, after {conditions['load_average_after']}")
    print(f"wrote {out / 'report.md'} and {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
