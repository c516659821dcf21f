"""Replay GooseProposer's drafting offline against a vLLM benchmark's own outputs, in seconds.

``scripts/vllm_bench.py`` takes minutes per configuration and its tok/s move by a few percent
between runs on a shared machine. This replay answers "which proposer configuration accepts more,
and what would it cost" deterministically: it feeds every prompt's reference output (vLLM without
speculation, one request at a time, from the bench's ``results.json``) to a :class:`RowDrafter`
step by step as vLLM would (greedy verification: a draft token is accepted while it equals the
output, then the output's next token comes free), one drafter for all prompts in order, as at
batch 1. Time is modelled, not measured: a step costs ``--fixed-ms`` plus ``--per-token-ms`` per
verified token (the line the proposer fits in the engine; its log prints it), and the chain cut
uses the same line. vLLM's ``ngram`` proposer (the longest of the last 3..5 tokens found earliest
in the context, K tokens copied) is replayed beside it under the same model, as the yardstick::

    .venv/bin/python scripts/vllm_replay.py bench-results/vllm/results.json
    .venv/bin/python scripts/vllm_replay.py results.json --config '{"sources": ["context_match"]}'

Prints tau, modelled tok/s (and the ratio to ``ngram``), drafts, draft tokens and accepted tokens,
overall and per dataset. bfloat16 outputs change with the batch's shape, so a replayed tau is close
to, not equal to, the engine's.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from goose.boundary import FaultLog
from goose.vllm import ChainCut, ProposerConfig, RowDrafter

Drafter = Callable[[list[int]], list[int]]


@dataclass
class Tally:
    steps: int = 0
    tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    seconds: float = 0.0

    def add(self, other: Tally) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def line(self) -> str:
        return (f"tau {self.tokens / self.steps:.3f}, {self.tokens / self.seconds:.1f} tok/s (modelled), "
                f"{self.drafts} drafts, {self.draft_tokens} draft tokens, {self.accepted} accepted")


def vllm_ngram(tokens: list[int], k: int, smallest: int = 3, largest: int = 5) -> list[int]:
    """What vLLM's ngram proposer drafts: after the longest matching suffix n-gram's earliest occurrence."""
    for n in range(largest, smallest - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


def replay(data: dict[str, Any], propose: Drafter, cost: tuple[float, float],
           start: Callable[[list[int], int], None] | None = None,
           learn: Callable[[list[int]], None] | None = None) -> dict[str, Tally]:
    """Per dataset, what ``propose`` achieves on the reference outputs, one request after another."""
    fixed, per_token = cost
    reference = next(r for r in data["runs"] if r["method"] == "none" and r["concurrency"] == 1)
    tallies: dict[str, Tally] = {}
    for prompt, output in zip(data["prompts"], reference["outputs"], strict=True):
        tokens = list(prompt["ids"]) + output[:1]  # the prefill step gave the first output token
        tally = tallies.setdefault(prompt["dataset"], Tally())
        tally.steps, tally.tokens, tally.seconds = tally.steps + 1, tally.tokens + 1, tally.seconds + fixed + per_token
        if start is not None:
            start(tokens, len(prompt["ids"]))
        produced = 1
        while produced < len(output):
            draft = propose(tokens)
            accepted = 0
            while (accepted < len(draft) and produced + accepted < len(output)
                   and draft[accepted] == output[produced + accepted]):
                accepted += 1
            sampled = output[produced : produced + accepted + 1]
            produced += len(sampled)
            tokens += sampled
            if learn is not None:
                learn(sampled)
            tally.steps += 1
            tally.tokens += len(sampled)
            tally.drafts += bool(draft)
            tally.draft_tokens += len(draft)
            tally.accepted += accepted
            tally.seconds += fixed + per_token * (1 + len(draft))
    return tallies


def goose_replay(data: dict[str, Any], settings: ProposerConfig, k: int, cost: tuple[float, float],
                 vocab_size: int, eos: frozenset[int]) -> dict[str, Tally]:
    fixed, per_token = cost
    cut = ChainCut.of_step(fixed, per_token, rows=1)  # the engine's batch-1 cut
    drafter = RowDrafter(settings.sources, settings.goose_config(), vocab_size=vocab_size, eos_token_ids=eos,
                         tokenizer=None, faults=FaultLog(), estimates=None)

    def start(tokens: list[int], prompt_length: int) -> None:
        drafter.start(np.asarray(tokens, dtype=np.int64), prompt_length)

    def propose(tokens: list[int]) -> list[int]:
        return drafter.propose(np.asarray(tokens, dtype=np.int64), k, cut)

    return replay(data, propose, cost, start, drafter.learn)


def combined(tallies: dict[str, Tally]) -> Tally:
    """One tally of every dataset's."""
    total = Tally()
    for tally in tallies.values():
        total.add(tally)
    return total


def print_tallies(name: str, tallies: dict[str, Tally], yardstick: Tally | None) -> Tally:
    total = combined(tallies)
    ratio = ""
    if yardstick is not None:
        ratio = f" = {total.tokens / total.seconds / (yardstick.tokens / yardstick.seconds):.2f}x ngram"
    print(f"{name}: {total.line()}{ratio}")
    for dataset, tally in tallies.items():
        print(f"    {dataset:<10} {tally.line()}")
    return total


NGRAM_SWEEP_K = (3, 4, 5, 6, 8, 10, 12, 16)
NGRAM_SWEEP_LENGTHS = ((5, 5), (4, 5), (3, 5), (2, 5), (1, 5), (3, 4), (2, 4), (2, 3), (1, 3), (3, 3), (2, 2))


def sweep_ngram(data: dict[str, Any], cost: tuple[float, float], yardstick: Tally, show: int = 8) -> None:
    """vLLM's ngram at every K and lookup-length range of the sweep, fastest first (vLLM's default: n=5..5)."""
    found = []
    for low, high in NGRAM_SWEEP_LENGTHS:
        for k in NGRAM_SWEEP_K:
            total = combined(replay(data, lambda t, k=k, low=low, high=high: vllm_ngram(t, k, low, high), cost))
            found.append((total.tokens / total.seconds, k, low, high, total))
    found.sort(key=lambda row: -row[0])
    reference = yardstick.tokens / yardstick.seconds
    print(f"ngram sweep ({len(found)} configurations), the {show} fastest, modelled tok/s against the one above:")
    for speed, k, low, high, total in found[:show]:
        print(f"    K={k:<2} n={low}..{high}: {speed / reference:.3f}x, tau {total.tokens / total.steps:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="results.json written by scripts/vllm_bench.py")
    parser.add_argument("--config", action="append", default=None,
                        help="a GOOSE_VLLM_CONFIG (JSON) to replay; repeatable (default: the proposer's defaults)")
    parser.add_argument("--fixed-ms", type=float, default=16.0, help="modelled step cost: fixed part")
    parser.add_argument("--per-token-ms", type=float, default=1.0, help="modelled step cost per verified token")
    parser.add_argument("--vocab-size", type=int, default=49_152, help="the model's vocabulary (SmolLM2's)")
    parser.add_argument("--eos", type=int, action="append", default=None, help="EOS id(s) (default: SmolLM2's 2)")
    parser.add_argument("--ngram-sweep", action="store_true",
                        help="also model vLLM's ngram at 8 values of K by 11 lookup-length ranges and list the fastest "
                        "(which peer configuration to benchmark against on this machine)")
    args = parser.parse_args(argv)
    data = json.loads(args.results.read_text())
    k = int(data["arguments"]["num_speculative_tokens"])
    cost = (args.fixed_ms / 1000, args.per_token_ms / 1000)
    low, high = data["arguments"]["ngram_min"], data["arguments"]["ngram_max"]
    ngram = print_tallies(f"ngram n={low}..{high}", replay(data, lambda t: vllm_ngram(t, k, low, high), cost), None)
    if args.ngram_sweep:
        sweep_ngram(data, cost, ngram)
    eos = frozenset(args.eos or [2])
    for text in args.config or ["{}"]:
        try:
            settings = ProposerConfig.model_validate(json.loads(text))
        except ValueError as error:
            parser.error(f"--config {text!r}: {error}")
        print_tallies(f"goose {text}", goose_replay(data, settings, k, cost, args.vocab_size, eos), ngram)
    return 0


if __name__ == "__main__":
    sys.exit(main())
