"""Predicted Outputs where the prediction is not in the prompt: each prompt with an earlier answer as its prediction.

A client that asks again (a regenerated answer, the same question after a small change of set-up)
often holds the previous answer. This writes a JSONL file for ``goose bench --datasets FILE``: each
prompt of a dataset with, as its ``prediction``, the model's own float32 answer. Decoded again in
bfloat16, the output follows that answer until bf16 rounding flips a near-tie, then departs and
re-joins it where the two texts agree again: a prediction mostly, not wholly, right, and nowhere in
the prompt, so context match cannot copy it.

    python scripts/regenerate_predictions.py --dataset mt_bench --limit 6 --out /tmp/regen.jsonl
    goose bench --dtype bfloat16 --datasets /tmp/regen.jsonl --max-new-tokens 256 \\
        --methods ar,goose,goose_pred,hf_pld
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from goose.bench.prompts import load_samples
from goose.cycle.decoder import GooseDecoder
from goose.models import encode_prompt, load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dataset", default="mt_bench")
    parser.add_argument("--limit", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, tokenizer = load(args.model, dtype="float32", progress=False)
    decoder = GooseDecoder(model, tokenizer)  # float32 greedy: the same answer as the autoregressive loop's
    with args.out.open("w") as out:
        for sample in load_samples(args.dataset, limit=args.limit):
            with torch.inference_mode():
                answer = decoder.generate(encode_prompt(tokenizer, sample.turns[0]), args.max_new_tokens)
            out.write(json.dumps({"question_id": f"regen-{sample.question_id}", "prompt": sample.turns[0],
                                  "prediction": answer.text}) + "\n")
            print(f"{sample.question_id}: {len(answer.new_token_ids)} tokens", flush=True)


if __name__ == "__main__":
    main()
