"""Per-cycle time outside the forward pass, at several prompt lengths: does Goose's own work grow with the context?

Each cycle is a forward pass plus Goose's own work (drafting, planning, building the pass's inputs,
reading the logits, walking, committing the cache, observing). The model's forward is timed with
forward hooks (public torch API); what is left of a cycle is Goose's. Prompts of the given lengths
are cut from the benchmark files (code and questions, plain text, no chat template), each
generated ``--repeats`` times after a warm-up, each by a new decoder; medians are printed and written as JSON, with the
decoder's per-phase times (its profile; "verify" there is the pass's inputs and readout, the
forward taken out) and a digest of the output tokens, so two versions of the code can be compared
on the same prompts (run one with PYTHONPATH pointing at the other's checkout).

    python scripts/cycle_overhead.py --model gemma3-270m --dtype bfloat16 --lengths 1024,4096,16384
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from pathlib import Path

import torch

from goose import models
from goose.config import GooseConfig
from goose.cycle.decoder import GooseDecoder
from goose.planning.cost import CostCurve
from goose_bench.prompts import default_data_dir


def long_prompt(tokenizer, length: int, data_dir: Path) -> list[int]:
    """The first ``length`` tokens of the benchmark files' prompts, concatenated."""
    ids: list[int] = []
    for name in ("classeval", "humaneval", "mbpp", "gsm8k"):
        for line in (data_dir / f"{name}.jsonl").read_text().splitlines():
            record = json.loads(line)
            text = record.get("skeleton") or record.get("prompt") or record.get("text") or record.get("question")
            ids += tokenizer.encode(f"{text}\n\n", add_special_tokens=False)
            if len(ids) >= length:
                return ids[:length]
    raise ValueError(f"the benchmark files hold fewer than {length} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the hooks then synchronise around forwards)")
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per generation")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0, help="> 0: seeded sampling (seed 0)")
    parser.add_argument("--top-p", type=float, default=1.0, help="with --temperature: nucleus sampling")
    parser.add_argument("--draw-all-rows", action="store_true",
                        help="sampled: draw every tree row in one batch, as on a GPU (the CPU draws walked rows only)")
    parser.add_argument("--curve", type=Path, default=None,
                        help="a saved cost curve (JSON) for the automatic budget, instead of this machine's: "
                        "two runs then plan by the same prices whatever the machine's load while measuring")
    parser.add_argument("--prefill-harvest", default="auto",
                        help="GooseConfig.prefill_harvest: 'auto', 'all', or a number of prompt positions")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the per-run rows and the medians")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, tokenizer = models.load(args.model, dtype=args.dtype, device=args.device, progress=False)
    started: list[float] = []
    forward_s: list[float] = []

    def synchronized() -> float:
        if args.device.startswith("cuda"):  # a forward's kernels run asynchronously: wait for them
            torch.cuda.synchronize()
        return time.perf_counter()

    model.register_forward_pre_hook(lambda *_: started.append(synchronized()))
    model.register_forward_hook(lambda *_: forward_s.append(synchronized() - started[-1]))
    harvest = {"auto": "auto", "all": None}.get(args.prefill_harvest, args.prefill_harvest)
    config = GooseConfig(temperature=args.temperature, top_p=args.top_p, seed=0 if args.temperature > 0 else None,
                         prefill_harvest=harvest if harvest in ("auto", None) else int(harvest))
    curve = CostCurve.load(args.curve) if args.curve else None
    rows = []
    for length in (int(value) for value in args.lengths.split(",")):
        prompt = long_prompt(tokenizer, length, args.data_dir or default_data_dir())
        for repeat in range(args.repeats + 1):
            # a new decoder a generation: cold sources, as `goose bench` runs a prompt, so that what the
            # sources learnt in one run does not change the next run's trees
            decoder = GooseDecoder(model, tokenizer, config, chat=False, profile=True, cost_curve=curve)
            if args.draw_all_rows:
                decoder.drafter.draw_all_rows = True
            forward_s.clear()
            with torch.inference_mode():
                clock = time.perf_counter()
                result = decoder.generate(prompt, args.tokens)
                wall = time.perf_counter() - clock
            if repeat == 0:
                continue  # warm-up: one-off costs (kernels, allocations, the cost curve) land here
            steps = max(1, result.stats.verify_steps)
            cycle_forward = sum(forward_s[1:])  # the first forward is the prefill
            phases = dict(result.stats.profile)
            phases["verify"] = phases.get("verify", 0.0) - cycle_forward  # the pass's inputs and readout
            row = {"length": length, "steps": steps, "tau": round(result.stats.tau, 2),
                   "outside_ms": round(1000 * (wall - result.stats.prefill_s - cycle_forward) / steps, 3),
                   "forward_ms": round(1000 * cycle_forward / steps, 2),
                   "phases_us": {k: round(1e6 * v / steps, 1) for k, v in sorted(phases.items())},
                   "tokens": hashlib.sha1(str(result.new_token_ids).encode()).hexdigest()[:12]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    medians = {}
    for length in sorted({r["length"] for r in rows}):
        mine = [r for r in rows if r["length"] == length]
        medians[length] = {key: statistics.median(r[key] for r in mine) for key in ("outside_ms", "forward_ms")}
        medians[length]["phases_us"] = {phase: statistics.median(r["phases_us"][phase] for r in mine)
                                        for phase in mine[0]["phases_us"]}
        medians[length]["tokens"] = sorted({r["tokens"] for r in mine})
    print(json.dumps(medians))
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "medians": medians}, indent=1))


if __name__ == "__main__":
    main()
