"""What ``--quantize int8`` costs in quality: perplexity on a fixed text, and greedy agreement with bfloat16.

Perplexity: a source file of an installed package (default: httpx's ``_models.py``, code no benchmark
asks for), tokenized once by the model's tokenizer, cut into ``--windows`` windows of ``--window``
tokens, each scored from an empty cache (token i + 1 by the log softmax of the logits at i, in
float32); perplexity is exp of the mean over every scored token. Variants: ``float32`` (the GGUF
file's dequantized weights, exactly), ``bfloat16`` (our default), ``int8`` (``--quantize int8``,
the rest in bfloat16), and with ``--llama-python`` llama.cpp on the GGUF file as shipped (Q4_K_M for
the 1.5B model), through ``scripts/llama_perplexity.py`` on the same token ids.

Greedy agreement (``--reference``: a bfloat16 ``goose bench`` results.jsonl(.gz)): the int8 model is
fed each prompt's first turn and the bfloat16 ``ar`` text after it, and the share of positions where
its argmax is bfloat16's next token is counted (teacher-forced: one disagreement does not carry on).
``--compare`` (an int8 ``goose bench`` run on the same prompts) adds how many ``ar`` texts are
identical and how far they agree from the start.

    python scripts/int8_quality.py --model qwen2.5-coder-1.5b --threads 2 --llama-python .venv/bin/python \\
        --reference docs/bench/qwen15b/greedy-256-x3/results.jsonl.gz --compare int8-run/results.jsonl.gz --out q.json
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.metadata
import json
import math
import subprocess
import tempfile
from pathlib import Path

import torch

from goose import models
from goose_bench.conversation import turn_prompt_ids
from goose_bench.prompts import default_data_dir, load_samples

VARIANTS = {"float32": ("float32", None), "bfloat16": ("bfloat16", None), "int8": ("bfloat16", "int8")}
DEFAULT_PACKAGE, DEFAULT_FILE = "httpx", "httpx/_models.py"


def default_text() -> Path:
    for file in importlib.metadata.files(DEFAULT_PACKAGE) or []:
        if str(file) == DEFAULT_FILE:
            return Path(file.locate())
    raise SystemExit(f"{DEFAULT_FILE} not found; give --text")


@torch.inference_mode()
def window_nll(model: torch.nn.Module, window: list[int]) -> float:
    """Sum of -log p(token i + 1 | tokens <= i) over the window, one forward from an empty cache."""
    ids = torch.tensor([window])
    logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    return float(-torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None]).sum())


def read_records(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def ar_first_turns(path: Path) -> dict[tuple[str, str], list[int]]:
    """(dataset, question id) -> the ``ar`` method's first-turn token ids in a goose bench run."""
    return {(r["dataset"], str(r["question_id"])): r["new_token_ids"][0] for r in read_records(path)
            if r["method"] == "ar"}


@torch.inference_mode()
def forced_agreement(model: torch.nn.Module, prompt: list[int], text: list[int]) -> tuple[int, int]:
    """Positions of ``text`` where the model's argmax, fed the prompt and the text before it, is the text's token."""
    ids = torch.tensor([prompt + text])
    logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1]
    return int((logits.argmax(dim=-1) == torch.tensor(text)).sum()), len(text)


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--text", type=Path, default=None, help=f"the text to score (default: {DEFAULT_FILE})")
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--llama-python", default=None, help="the llama.cpp environment's python: add its perplexity")
    parser.add_argument("--reference", type=Path, default=None, help="a bfloat16 goose bench results.jsonl(.gz)")
    parser.add_argument("--compare", type=Path, default=None, help="an int8 goose bench run on the same prompts")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    text_path = args.text or default_text()
    text = text_path.read_text(encoding="utf-8")
    report: dict = {"model": args.model, "threads": args.threads,
                    "text": {"path": str(text_path), "sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}}
    if args.text is None:
        report["text"]["package"] = f"{DEFAULT_PACKAGE} {importlib.metadata.version(DEFAULT_PACKAGE)}"
    variants = [v for v in args.variants.split(",") if v]
    windows: list[list[int]] = []
    perplexity: dict[str, dict] = {}
    agreement: dict[str, dict] = {}
    reference = ar_first_turns(args.reference) if args.reference else {}
    for variant in variants:
        dtype, quantize = VARIANTS[variant]
        model, tokenizer = models.load(args.model, dtype=dtype, quantize=quantize, progress=False)
        if not windows:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) < args.windows * args.window:
                raise SystemExit(f"{text_path} holds {len(ids)} tokens, fewer than {args.windows} x {args.window}")
            windows = [ids[i * args.window : (i + 1) * args.window] for i in range(args.windows)]
            report["text"]["tokens_scored"] = args.windows * (args.window - 1)
        nll = sum(window_nll(model, window) for window in windows)
        perplexity[variant] = {"perplexity": math.exp(nll / report["text"]["tokens_scored"]), "nll": nll}
        print(f"{variant}: perplexity {perplexity[variant]['perplexity']:.4f}", flush=True)
        if reference and variant != "bfloat16":
            agreed = total = 0
            for dataset in dict.fromkeys(key[0] for key in reference):
                for sample in load_samples(dataset, args.data_dir or default_data_dir(), None):
                    text_ids = reference.get((dataset, str(sample.question_id)))
                    if text_ids:
                        prompt = turn_prompt_ids(tokenizer, sample.turns[:1], [])
                        hits, count = forced_agreement(model, prompt, text_ids)
                        agreed, total = agreed + hits, total + count
            agreement[variant] = {"agreed": agreed, "tokens": total, "share": agreed / max(1, total)}
            print(f"{variant}: argmax equals bfloat16's greedy token at {agreed} of {total} positions "
                  f"({agreed / max(1, total):.2%})", flush=True)
        del model
    if args.llama_python:
        with tempfile.TemporaryDirectory() as scratch:
            window_file, out = Path(scratch) / "windows.json", Path(scratch) / "nll.json"
            window_file.write_text(json.dumps(windows))
            script = Path(__file__).with_name("llama_perplexity.py")
            subprocess.run([args.llama_python, str(script), "--gguf", str(models.gguf_path(args.model)),
                            "--windows", str(window_file), "--threads", str(args.threads), "--out", str(out)],
                           check=True)
            scored = json.loads(out.read_text())
        nll = sum(window["nll"] for window in scored["windows"])
        perplexity["llama.cpp"] = {"perplexity": math.exp(nll / report["text"]["tokens_scored"]), "nll": nll,
                                   "engine": scored["conditions"]["engine"],
                                   "gguf": Path(scored["conditions"]["gguf"]).name}
        print(f"llama.cpp: perplexity {perplexity['llama.cpp']['perplexity']:.4f}", flush=True)
    report["perplexity"] = perplexity
    if agreement:
        report["forced_agreement_with_bfloat16"] = agreement
    if args.reference and args.compare:
        theirs = ar_first_turns(args.compare)
        pairs = [(reference[key], theirs[key]) for key in reference if key in theirs]
        report["ar_texts"] = {"compared": len(pairs), "identical": sum(a == b for a, b in pairs),
                              "common_prefix": [common_prefix(a, b) for a, b in pairs],
                              "lengths": [len(a) for a, _ in pairs]}
        print(f"int8 ar texts identical to bfloat16's: {report['ar_texts']['identical']} of {len(pairs)}; "
              f"agreeing from the start for {report['ar_texts']['common_prefix']} tokens", flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
