"""Why an output differs from ``ar``'s: the reference's two top logits at the first token where they part.

Where numerics depend on a pass's shape (bfloat16, llama.cpp's quantized kernels), a batched
verify pass can compute a row a little differently from a one-token pass and flip a near-tie.
For every greedy output that is not ``ar``'s, the first differing token is found and ``ar``'s own
decoding is replayed up to it (the prompt's prefill, then one token a pass, as ``ar`` ran): that
row's two top logits, and the rank and logit of the token the other method chose there. A gap
of a few hundredths between the two top logits, with the other token second, is a near-tie; a
wide gap would be a bug.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from goose.contract.tree import DraftTree
from goose.cycle.engine import Verifying


def first_difference(reference: list[int], other: list[int]) -> int | None:
    """The first index where the two token lists differ (the shorter one's length when one is a prefix of the
    other; None when they are equal)."""
    for index, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            return index
    return None if len(reference) == len(other) else min(len(reference), len(other))


@torch.inference_mode()
def reference_row(verifier: Verifying, prompt_ids: list[int], reference: list[int], index: int) -> torch.Tensor:
    """The logits ``ar`` read for ``reference[index]``: the prompt's prefill, then one token a pass (the
    verifier is reset before and after)."""
    verifier.reset()
    try:
        logits = verifier.prefill(prompt_ids)[-1]
        for token in reference[:index]:
            logits = verifier.verify([DraftTree.single(int(token))])[0][0]
            verifier.commit(0, np.zeros(0, dtype=np.int64))
        return logits.float().clone()
    finally:
        verifier.reset()


def explain(verifier: Verifying, prompt_ids: list[int], reference: list[int], other: list[int],
            tokenizer: Any = None) -> dict[str, Any] | None:
    """The first difference of ``other`` from ``reference`` (greedy outputs of ``prompt_ids``) with the reference's
    logits there; None when they are equal or ``other`` only stops earlier or later."""
    index = first_difference(reference, other)
    if index is None or index >= len(reference) or index >= len(other):
        return None
    row = reference_row(verifier, prompt_ids, reference, index)
    values, tokens = row.topk(2)
    chosen = int(other[index])
    rank = int((row > row[chosen]).sum())

    def text(token: int) -> str | None:
        return tokenizer.decode([token]) if tokenizer is not None else None

    return {
        "index": index,
        "reference_token": int(reference[index]), "reference_text": text(int(reference[index])),
        "token": chosen, "text": text(chosen),
        "top2_tokens": [int(t) for t in tokens], "top2_logits": [round(float(v), 5) for v in values],
        "gap": round(float(values[0] - values[1]), 5),
        "replayed": int(tokens[0]) == int(reference[index]),  # the replay's argmax is the token ar chose
        "token_rank": rank, "token_logit": round(float(row[chosen]), 5),
        "token_gap": round(float(values[0] - row[chosen]), 5),
    }
