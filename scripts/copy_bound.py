"""How far copying can take greedy decoding on this device: the copy oracle's ceiling, and Goose's missed copies.

A pass that starts after n tokens of a decoded text can accept at most L(n) drafted tokens from any
drafter that copies the request's own text: the longest run ``out[n:n+L]`` found earlier in prompt +
output (it may overlap its own start, as an LZ77 copy does). *Free*: found anywhere; *anchored*:
found where the token before ``out[n]`` leads, all that a lookup keyed on the text just written can
find (context match, prompt lookup, Hugging Face's ``prompt_lookup_num_tokens``, vLLM's ``ngram``,
llama.cpp's lookup). The *copy oracle* drafts exactly that run as a chain every pass and pays the
device's cost curve for it, t(L + 1) for L + 1 tokens. On ``ar``'s text of a prompt that is the
fastest any such drafter can decode it here; a target above the anchored one needs drafts of text
the request has not led to (the model's own knowledge, which the bigram source's harvested top-k
gives in part).

It reads a ``goose bench`` results file with ``ar``, ``goose`` and ``hf_pld`` records (``--repeats``
runs keep the median-time run) and a cost curve (``goose calibrate``), and prints per prompt:

- the oracle's tau and its speed over ``ar`` and over ``hf_pld``, priced as ``ar``'s measured time
  (its fastest run) with every decode step replaced: the prefill (``ar``'s first-token time, every
  turn) stays, and a pass of R rows costs ``ar``'s measured time a step times t(R) / t(1); over
  ``ar`` that is the cost curve's ratio alone, over ``hf_pld`` it carries both runs' clock noise;
- the measured Goose ratios beside it;
- Goose's passes walked along its own text: passes that accepted nothing though a copy of two or
  more tokens was there (missed), passes that accepted some but four or more fewer than the copy
  (short), and the drafts accepted beyond any anchored copy (the bigram source's model knowledge,
  context match's rejoin after an edit).

    python scripts/copy_bound.py docs/bench/qwen15b/greedy-256-x3/results.jsonl.gz \\
        --curve docs/bench/qwen15b/cost-curve-bfloat16.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoTokenizer

from goose.bench.conversation import turn_prompt_ids
from goose.bench.prompts import load_samples
from goose.models import pretrained_location
from goose.planning.cost import CostCurve


def copy_runs(prompt: Sequence[int], out: Sequence[int], cap: int, anchored: bool = False) -> list[int]:
    """L(n) for n = 0 .. len(out) - 1: the longest ``out[n:n+L]`` (at most ``cap``) that starts at an
    earlier position of ``prompt + out`` than ``len(prompt) + n``; ``anchored``: only a run whose
    source is preceded by the token before ``out[n]`` as well (what a lookup keyed on the last token
    can find: the first token of a copy that follows new text is out of its reach)."""
    text = np.asarray(list(prompt) + list(out), dtype=np.int64)
    start = len(prompt)
    runs = []
    for n in range(len(out)):
        here = start + n
        longest = min(cap, len(text) - here)
        candidates = np.flatnonzero(text[:here] == text[here]) if longest else np.empty(0, dtype=np.int64)
        if anchored:
            candidates = candidates[candidates >= 1]
            candidates = candidates[text[candidates - 1] == text[here - 1]]
        best = 0
        for i in candidates[::-1]:  # latest first: the usual winner, so the bound stops early
            length = 1
            while length < longest and text[i + length] == text[here + length]:
                length += 1
            best = max(best, length)
            if best == longest:
                break
        runs.append(best)
    return runs


def oracle_passes(runs: Sequence[int], tokens: int) -> list[int]:
    """Rows of every pass the copy oracle makes after the prefill's first token: each drafts the whole
    copy and commits it plus the bonus token, never past ``tokens``."""
    rows, n = [], 1
    while n < tokens:
        drafted = min(runs[n], tokens - n - 1)
        rows.append(drafted + 1)
        n += drafted + 1
    return rows


def split_turns(flat: Sequence[int], turn_tokens: Sequence[int]) -> list[list[int]]:
    """A record's flat per-pass list cut into turns: turn k's passes commit ``turn_tokens[k] - 1`` tokens
    (its first token comes from the prefill)."""
    turns, at = [], 0
    for tokens in turn_tokens:
        passes, committed = [], 0
        while committed < tokens - 1 and at < len(flat):
            passes.append(flat[at])
            committed += flat[at]
            at += 1
        turns.append(passes)
    return turns


COUNTS = ("passes", "missed", "short", "beyond_copy")


def missed_copies(runs: Sequence[int], accepted: Sequence[int]) -> dict[str, int]:
    """Goose's passes (commit lengths, bonus included) against the copy oracle's runs on the same text."""
    counts = dict.fromkeys(COUNTS, 0)
    n = 1
    for length in accepted:
        drafted = length - 1
        available = runs[n] if n < len(runs) else 0
        counts["passes"] += 1
        # one copied token is nearly always "available" (the token occurred somewhere): not a miss
        counts["missed"] += int(drafted == 0 and available >= 2)
        counts["short"] += int(0 < drafted <= available - 4)
        counts["beyond_copy"] += max(0, drafted - available)
        n += length
    return counts


def read_records(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a goose bench results.jsonl(.gz) with ar, goose and hf_pld")
    parser.add_argument("--curve", type=Path, required=True, help="the device's cost-curve JSON (goose calibrate)")
    parser.add_argument("--max-rows", type=int, default=128, help="the longest chain the oracle may verify")
    parser.add_argument("--out", type=Path, help="write the per-prompt rows as JSON here")
    args = parser.parse_args()

    curve = CostCurve.load(args.curve)
    records = read_records(args.results)
    by_prompt: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for record in records:
        by_prompt[(record["dataset"], str(record["question_id"]))][record["method"]] = record
    model = records[0]["model"]
    tokenizer = AutoTokenizer.from_pretrained(pretrained_location(model))
    samples = {(s.dataset, str(s.question_id)): s
               for dataset in sorted({d for d, _ in by_prompt}) for s in load_samples(dataset)}

    rows = []
    print(f"{model}: copy oracles on ar's text (free: a run from anywhere; anchored: a run the last token leads "
          f"to), passes priced at ar's measured step x t(R)/t(1) of {args.curve.name}; Goose's passes against the "
          "anchored oracle on its own text")
    print(f"{'prompt':24s} {'tokens':>6s} | {'free':>5s} {'/ar':>6s} {'/hf':>6s} | {'anch':>5s} {'/ar':>6s} "
          f"{'/hf':>6s} | {'goose':>5s} {'/ar':>6s} {'/hf':>6s} {'missed':>9s} {'short':>5s} {'beyond':>6s}")
    for key, methods in by_prompt.items():
        if not {"ar", "goose", "hf_pld"} <= methods.keys():
            continue
        ar, goose, hf = methods["ar"], methods["goose"], methods["hf_pld"]
        sample = samples[key]
        row: dict[str, Any] = {"prompt": f"{key[0]}/{key[1]}", "tokens": ar["new_tokens"],
                               "ar_tokens_per_s": ar["tokens_per_s"], "goose_tokens_per_s": goose["tokens_per_s"]}
        for kind in ("free", "anchored"):
            tau, seconds = oracle_time(ar, sample.turns, tokenizer, curve, args.max_rows, kind == "anchored")
            row[kind] = {"tau": tau, "over_ar": _fastest(ar) / seconds, "over_hf_pld": hf["wall_s"] / seconds,
                         "tokens_per_s": ar["new_tokens"] / seconds}
        counts = dict.fromkeys(COUNTS, 0)
        goose_answers = goose["choices"][0]["turns"]
        goose_passes = split_turns(goose["choices"][0]["accept_lengths"], [len(t) for t in goose["new_token_ids"]])
        for k, (out, passes) in enumerate(zip(goose["new_token_ids"], goose_passes, strict=True)):
            prompt = turn_prompt_ids(tokenizer, sample.turns, goose_answers[:k])
            runs = copy_runs(prompt, out, args.max_rows, anchored=True)
            for name, value in missed_copies(runs, passes).items():
                counts[name] += value
        row["goose"] = {"tau": goose["tau"], "over_ar": goose["speedup"], "over_hf_pld": goose["speedup_vs_hf_pld"]}
        row.update(counts)
        rows.append(row)
        print(_line(row["prompt"][:24], str(row["tokens"]), row, counts))

    mean = {kind: {name: statistics.fmean(r[kind][name] for r in rows) for name in ("tau", "over_ar", "over_hf_pld")}
            for kind in ("free", "anchored", "goose")}
    print(_line("mean", "", mean, {name: sum(r[name] for r in rows) for name in COUNTS}))
    print("median tok/s: " + ", ".join(
        f"{kind} {statistics.median(r[kind]['tokens_per_s'] for r in rows):.1f}" for kind in ("free", "anchored"))
        + f", goose {statistics.median(r['goose_tokens_per_s'] for r in rows):.1f}"
        + f", ar {statistics.median(r['ar_tokens_per_s'] for r in rows):.1f}")
    if args.out:
        args.out.write_text(json.dumps({"model": model, "curve": str(args.curve), "rows": rows}, indent=1))


def oracle_time(ar: dict[str, Any], turns: Sequence[str], tokenizer: Any, curve: CostCurve, cap: int,
                anchored: bool) -> tuple[float, float]:
    """The copy oracle's tau and seconds on ``ar``'s text of a prompt: ``ar``'s prefill (its first-token time,
    every turn) plus ``ar``'s measured time a step times t(R) / t(1) for every pass of R rows, from ``ar``'s
    fastest run where the record kept several (the least disturbed: a ceiling should not come out low)."""
    rows: list[int] = []
    for k, out in enumerate(ar["new_token_ids"]):
        prompt = turn_prompt_ids(tokenizer, turns, ar["choices"][0]["turns"][:k])
        rows += oracle_passes(copy_runs(prompt, out, cap, anchored), len(out))
    count = len(ar["new_token_ids"])
    prefill = ar["first_token_s"] * count  # a later turn's prefill taken as the first's
    step = (_fastest(ar) - prefill) / max(1, ar["new_tokens"] - count)
    relative = np.asarray(curve(np.asarray(rows, dtype=float))) / float(curve(1))
    return (ar["new_tokens"] - count) / max(1, len(rows)), prefill + step * float(relative.sum())


def _fastest(record: dict[str, Any]) -> float:
    return min(record.get("wall_s_runs") or [record["wall_s"]])


def _line(name: str, tokens: str, row: dict[str, Any], counts: dict[str, int]) -> str:
    cells = " | ".join(f"{row[kind]['tau']:5.2f} {row[kind]['over_ar']:5.2f}x {row[kind]['over_hf_pld']:5.2f}x"
                       for kind in ("free", "anchored", "goose"))
    return (f"{name:24s} {tokens:>6s} | {cells} {counts['missed']:4d}/{counts['passes']:<4d} "
            f"{counts['short']:5d} {counts['beyond_copy']:6d}")


if __name__ == "__main__":
    main()
