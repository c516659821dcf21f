"""Structured outputs: constrained Goose against constrained autoregressive decoding on an extraction workload.

Each prompt shows the source of one function of an installed package (the standard library, httpx,
packaging) and asks for its signature as JSON following ``examples/signature.schema.json`` (name,
parameters with their defaults, return annotation). The output copies names from the prompt, which
is what Goose's context match drafts, and the grammar cuts the drafts that would break the JSON.

For every prompt the two decoders run in turn, constrained AR first then constrained Goose, so the
machine's load falls on both alike; both are warmed up first. Prints one JSON line per prompt and a
summary: median tokens/s of each, the median per-prompt ratio, tau, the grammar's seconds per cycle
and its share of the wall time, the drafted tokens the grammar cut per cycle, whether the outputs
are identical and how many validate against the schema.

    python scripts/structured_bench.py --dtype bfloat16 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import statistics
import time
from pathlib import Path

import torch

from goose.config import GooseConfig
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
from goose.models import load

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "examples" / "signature.schema.json").read_text())
FUNCTIONS = ["textwrap:shorten", "shutil:copyfileobj", "shutil:copymode", "packaging.version:parse",
             "httpx:get", "base64:b64encode", "fnmatch:filter", "difflib:get_close_matches"]


def prompt_of(target: str) -> str:
    module, name = target.split(":")
    source = inspect.getsource(getattr(importlib.import_module(module), name))
    return (f"Here is a Python function:\n\n```python\n{source}```\n\n"
            "Give its signature as JSON: its name, each parameter's name and default (null when it has none), "
            "and its return annotation (null when it has none).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--functions", default=",".join(FUNCTIONS), help="module:function, comma-separated")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import jsonschema

    model, tokenizer = load(args.model, dtype=args.dtype)
    ar, goose = AutoregressiveDecoder(model, tokenizer), GooseDecoder(model, tokenizer, GooseConfig())
    prompts = [prompt_of(target) for target in args.functions.split(",")]
    for decoder in (ar, goose):  # warm-up: compile the grammar, measure or load the cost curve
        decoder.generate(prompts[0], 8, json_schema=SCHEMA)
    rows = []
    for target, prompt in zip(args.functions.split(","), prompts, strict=True):
        constrained_ar = ar.generate(prompt, args.max_new_tokens, json_schema=SCHEMA)
        started = time.perf_counter()
        constrained = goose.generate(prompt, args.max_new_tokens, json_schema=SCHEMA)
        goose_wall = time.perf_counter() - started
        stats = constrained.stats
        try:
            jsonschema.validate(json.loads(constrained.text), SCHEMA)
            valid = True
        except (ValueError, jsonschema.ValidationError):
            valid = False
        row = {"function": target, "tokens": stats.new_tokens, "stop_reason": constrained.stop_reason,
               "ar_tok_s": round(constrained_ar.stats.tokens_per_s, 2), "goose_tok_s": round(stats.tokens_per_s, 2),
               "ratio": round(stats.tokens_per_s / constrained_ar.stats.tokens_per_s, 3), "tau": round(stats.tau, 3),
               "grammar_ms_per_cycle": round(1e3 * stats.grammar_s / max(1, stats.verify_steps), 3),
               "grammar_share": round(stats.grammar_s / goose_wall, 4),
               "ar_grammar_ms_per_token": round(1e3 * constrained_ar.stats.grammar_s
                                                / max(1, constrained_ar.stats.new_tokens), 3),
               "cut_per_cycle": round(stats.grammar_cut_tokens / max(1, stats.verify_steps), 2),
               "identical": constrained.new_token_ids == constrained_ar.new_token_ids, "valid": valid,
               "text": constrained.text}
        rows.append(row)
        print(json.dumps(row), flush=True)
    median = lambda key: statistics.median(row[key] for row in rows)  # noqa: E731
    print(json.dumps({"prompts": len(rows), "model": args.model, "dtype": args.dtype,
                      "ar_tok_s_median": median("ar_tok_s"), "goose_tok_s_median": median("goose_tok_s"),
                      "ratio_median": median("ratio"), "tau_median": median("tau"),
                      "grammar_ms_per_cycle_median": median("grammar_ms_per_cycle"),
                      "grammar_share_median": median("grammar_share"),
                      "cut_per_cycle_median": median("cut_per_cycle"),
                      "identical": sum(row["identical"] for row in rows),
                      "valid": sum(row["valid"] for row in rows)}))


if __name__ == "__main__":
    main()
