"""Time to first token: Goose's prefill (with its harvest of prompt logits) against the autoregressive loop's.

For each model and prompt length, the autoregressive loop and Goose (at each ``--harvest`` setting)
stream the same prompt in turn, ``--repeats`` rounds after a warm-up round, and the time from the
call to the first streamed token is kept; medians and the ratio to the autoregressive loop are
printed and written as JSON. Prompts are cut from the benchmark files (as scripts/cycle_overhead.py
does). ``random:qwen2.5-0.5b`` is Qwen2.5-0.5B's shape (a 152k vocabulary) with random weights:
no weights can be downloaded here, and a prefill's cost depends on the shape alone.

    python scripts/prefill_cost.py --models smollm2-135m,gemma3-270m --lengths 1024,2048,4096
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cycle_overhead import long_prompt

from goose import models
from goose.config import GooseConfig
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
from goose.planning.cost import harvest_rows, output_layer_weight
from goose_bench.prompts import default_data_dir


def load(name: str, dtype: str):
    if name != "random:qwen2.5-0.5b":
        return models.load(name, dtype=dtype, progress=False)
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=models.resolve_dtype(dtype)).eval()
    _, tokenizer = models.load("smollm2-135m", progress=False)  # only to cut prompts: ids < 49k fit
    return model, tokenizer


def first_token_s(decoder: AutoregressiveDecoder | GooseDecoder, prompt: list[int]) -> float:
    started = time.perf_counter()
    chunks = decoder.stream(prompt, 8)
    next(chunks)
    elapsed = time.perf_counter() - started
    chunks.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,gemma3-270m")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--lengths", default="1024,2048,4096")
    parser.add_argument("--harvest", default="auto,256", help="GooseConfig.prefill_harvest settings to time")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = [value if value == "auto" else int(value) for value in args.harvest.split(",")]
    rows = []
    for name in args.models.split(","):
        model, tokenizer = load(name, args.dtype)
        weight = output_layer_weight(model)
        decoders = {"ar": AutoregressiveDecoder(model, tokenizer, chat=False)}
        for setting in settings:
            decoders[f"goose harvest={setting}"] = GooseDecoder(model, tokenizer, GooseConfig(prefill_harvest=setting),
                                                                chat=False, cost_curve=None)
        for length in (int(value) for value in args.lengths.split(",")):
            prompt = long_prompt(tokenizer, length, default_data_dir())
            times: dict[str, list[float]] = {method: [] for method in decoders}
            with torch.inference_mode():
                for round_index in range(args.repeats + 1):
                    for method, decoder in decoders.items():
                        elapsed = first_token_s(decoder, prompt)
                        if round_index:  # round 0 warms every path up
                            times[method].append(elapsed)
            ar = statistics.median(times["ar"])
            for method, samples in times.items():
                setting = method.removeprefix("goose harvest=")
                row = {"model": name, "vocab": int(model.get_output_embeddings().weight.shape[0]), "length": length,
                       "method": method, "first_token_s": round(statistics.median(samples), 4),
                       "ratio_to_ar": round(statistics.median(samples) / ar, 3),
                       "samples": [round(s, 4) for s in samples],
                       "harvested": None if method == "ar" else harvest_rows(
                           setting if setting == "auto" else int(setting), length, weight)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
