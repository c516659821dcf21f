"""One method's generation of one turn, behind one interface, timed the same way for every kind.

The clock covers exactly the call that turns prompt ids into new token ids (prefill included):
``GooseDecoder.generate`` / ``AutoregressiveDecoder.generate`` for our methods and
``model.generate`` for the Hugging Face peers. Prompt encoding happens before the clock starts,
for every kind alike. Every call runs under ``torch.inference_mode`` (as Spec-Bench does), so no
method pays autograd bookkeeping that another does not.

Sampling (a :class:`goose.cycle.sampling.SamplingParams` with temperature > 0) reaches every method with
the same seed for the same prompt: our decoders draw by (seed, position), so every lossless method
reproduces ``ar``'s text; the Hugging Face peers sample with ``do_sample=True`` and the same warpers
from torch's generator seeded with that seed (their texts are their own).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation.streamers import BaseStreamer

from goose.config import SamplingParams
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
from goose.cycle.engine import model_device
from goose.planning.cost import CostCurve
from goose_bench.memo import MEMO_TOP_K, TargetMemo
from goose_bench.methods import Method

# GenerationStats.to_dict() keys kept per turn (the per-step lists are kept separately)
_STATS_KEYS = ("source_tested", "source_accepted", "path_kinds", "prefill_s", "mean_tree_size", "auxiliary_rows",
               "faults")


@dataclass
class TurnOutput:
    """What one method produced for one turn, and what it cost."""

    prompt_tokens: int
    new_token_ids: list[int]
    text: str
    wall_s: float
    stop_reason: str
    # None where the method does not count verification steps (the Hugging Face peers)
    accepted_lengths: list[int] | None = None
    tree_sizes: list[int] | None = None  # rows of every verify pass (anchor included), for cost-curve predictions
    stats: dict[str, Any] | None = None
    first_token_s: float | None = None  # from the call to the first new token (the prefill and its token)

    @property
    def verify_steps(self) -> int | None:
        return len(self.accepted_lengths) if self.accepted_lengths is not None else None


def _synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so the clock stops when the tokens exist (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Generator(Protocol):
    method: Method

    def generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams | None = None,
                 prediction: str | None = None) -> TurnOutput: ...


@dataclass(frozen=True)
class Study:
    """How a study's decoders run: through the target's memo (None: every pass for real) and, with ``curve``,
    budgeted on that pinned curve alone (no measured time moves a budget: the figures reproduce anywhere)."""

    memo: TargetMemo | None = None
    curve: CostCurve | None = None


class DecoderGenerator:
    """Our decoders: plain AR (the baseline) and every Goose configuration."""

    def __init__(self, method: Method, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 study: Study | None = None) -> None:
        self.method = method
        study = study or Study()
        memo = study.memo if study.memo is not None and memo_refusal(method) is None else None
        verifier = memo.verifier() if memo is not None else None
        if method.kind == "ar":
            self.decoder: AutoregressiveDecoder | GooseDecoder = AutoregressiveDecoder(model, tokenizer,
                                                                                      verifier=verifier)
        else:
            self.decoder = GooseDecoder(model, tokenizer, method.config(), cost_curve=study.curve,
                                        pinned_costs=study.curve is not None, verifier=verifier)
        self.device = model_device(model)

    def generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams | None = None,
                 prediction: str | None = None) -> TurnOutput:
        """``prediction`` reaches the decoder only for a method that sends it (``Method.prediction``)."""
        options = (sampling or SamplingParams()).model_dump()
        if prediction is not None and self.method.prediction and isinstance(self.decoder, GooseDecoder):
            options["prediction"] = prediction
        with torch.inference_mode():
            _synchronize(self.device)
            started = time.perf_counter()
            result = self.decoder.generate(prompt_ids, max_new_tokens, **options)
            _synchronize(self.device)
            wall_s = time.perf_counter() - started
            # the finished request's KV cache is dead weight; with a dozen decoders it adds up
            self.decoder.verifier.reset()
        full = result.stats.to_dict()
        counts = getattr(self.decoder.verifier, "counts", None)  # through the memo: what it answered and ran
        return TurnOutput(
            prompt_tokens=len(prompt_ids), new_token_ids=result.new_token_ids, text=result.text, wall_s=wall_s,
            stop_reason=result.stop_reason, accepted_lengths=list(result.stats.accepted_lengths),
            first_token_s=result.stats.prefill_s,
            tree_sizes=list(result.stats.tree_sizes) if isinstance(self.decoder, GooseDecoder)
            else [1] * result.stats.verify_steps,
            stats={key: full[key] for key in _STATS_KEYS} | ({"memo": counts.to_dict()} if counts else {}),
        )


class HuggingFaceGenerator:
    """The peers: ``model.generate`` (greedy, or sampling), optionally with its own speculative options."""

    def __init__(self, method: Method, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 eos_ids: frozenset[int]) -> None:
        self.method = method
        self.model = model
        self.tokenizer = tokenizer
        # the same stopping rule as our decoders, so that outputs are comparable token for token
        self.eos_ids = sorted(eos_ids)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0)
        self.device = next(model.parameters()).device

    def generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams | None = None,
                 prediction: str | None = None) -> TurnOutput:
        """``prediction`` is not sent: prompt lookup and plain decoding have no such input."""
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        attention_mask = torch.ones_like(input_ids)
        sampling = sampling or SamplingParams()
        decoding: dict[str, Any] = {"do_sample": False}
        if not sampling.greedy:  # the same warpers as ours; top_k 0 and top_p 1 switch them off in generate too
            decoding = {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
                        "top_k": sampling.top_k}
            torch.manual_seed(sampling.seed or 0)
        # a model's generation_config may carry sampling defaults that greedy decoding ignores;
        # transformers warns about each of them on every call
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")
            _synchronize(self.device)
            clock = _FirstTokenClock()
            started = clock.started = time.perf_counter()
            output = self.model.generate(
                input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                eos_token_id=self.eos_ids or None, pad_token_id=self.pad_id, streamer=clock,
                **decoding, **dict(self.method.fields),
            )
            _synchronize(self.device)
            wall_s = time.perf_counter() - started
        new_ids = [int(t) for t in output[0, len(prompt_ids):].tolist()]
        stop = "eos" if new_ids and new_ids[-1] in self.eos_ids else "max_new_tokens"
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        return TurnOutput(prompt_tokens=len(prompt_ids), new_token_ids=new_ids, text=text, wall_s=wall_s,
                          stop_reason=stop, first_token_s=clock.first_token_s)


class _FirstTokenClock(BaseStreamer):
    """A streamer that only notes when ``generate`` hands over its first new token (the first put is the prompt)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.puts = 0
        self.first_token_s: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first_token_s = time.perf_counter() - self.started

    def end(self) -> None:
        pass


def memo_refusal(method: Method) -> str | None:
    """Why ``method`` runs every pass for real in a study with the memo (None: it reads the memo)."""
    if method.kind == "hf":
        return "Hugging Face's generate runs its own passes"
    if method.kind == "goose" and method.config().harvest_top_k > MEMO_TOP_K:
        return f"it reads the top {method.config().harvest_top_k} of a row; the memo keeps {MEMO_TOP_K}"
    return None


def make_generator(method: Method, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                   eos_ids: frozenset[int], study: Study | None = None) -> Generator:
    """A generator for ``method`` (may raise: unknown plugin, bad source options, ...)."""
    if method.kind == "hf":
        return HuggingFaceGenerator(method, model, tokenizer, eos_ids)
    return DecoderGenerator(method, model, tokenizer, study)
