"""Reading the target's logits: the greedy token and the top-k of every row, in one pass and one read.

Every cycle needs the argmax of each verified row (the walk) and the top-k of each tree row (the
harvest). For a large vocabulary both are expensive on a CPU, ``argmax`` more than ``max`` (the
same answer, see below), and both are cheaper done together.

One pass does both here. The vocabulary is cut into blocks and each block's maximum (value and
first position) is taken: that is the only full read of the logits. The row's argmax is the
first position of the first block holding the largest maximum, so it is exactly ``argmax``'s
first-occurrence answer. The top-k lie in the k blocks with the largest maxima (a value outside
them has k larger block maxima above it, hence k larger values), so a top-k over those k
blocks, k * block values, equals the full top-k up to the order of exact ties.

``torch.max(dim)`` and ``torch.argmax`` both document first-occurrence ties; the decoder and the
autoregressive loop both read their greedy token through :func:`greedy`, so they agree even
where a bfloat16 row has two equal top logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

BLOCK = 1024  # values per block: small enough that k blocks are cheap to rescan, large enough to pay


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Argmax of each row of ``logits`` [n, V] (first occurrence on ties), int64 [n] on the same device."""
    return logits.max(dim=-1).indices


def greedy_and_top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(argmax [n], top-k indices [n, k], top-k values [n, k]) of ``logits`` [n, V], in one full read.

    The argmax is exactly ``greedy(logits)``; the top-k equal ``logits.topk(k)`` up to the order of
    exactly tied values. Small vocabularies (under a few blocks per kept value) take the plain path.
    """
    vocab = logits.shape[-1]
    k = min(k, vocab)
    blocks = vocab // BLOCK
    if blocks < 4 * k:
        values, indices = logits.topk(k, dim=-1)
        return greedy(logits), indices, values
    whole = blocks * BLOCK
    block_max, block_arg = logits[:, :whole].unflatten(1, (blocks, BLOCK)).max(dim=-1)
    if whole < vocab:  # the last, shorter block
        tail_max, tail_arg = logits[:, whole:].max(dim=-1, keepdim=True)
        block_max, block_arg = torch.cat([block_max, tail_max], 1), torch.cat([block_arg, tail_arg], 1)
    best_block = block_max.max(dim=-1).indices  # first block holding the row's maximum
    argmax = best_block * BLOCK + block_arg.gather(1, best_block[:, None]).squeeze(1)

    kept_blocks = block_max.topk(k, dim=-1).indices  # [n, k]
    positions = (kept_blocks[:, :, None] * BLOCK + torch.arange(BLOCK, device=logits.device)).flatten(1)
    if whole == vocab:
        candidates = logits.gather(1, positions)
    else:  # the shorter last block reads past the vocabulary: those slots can never be chosen
        candidates = logits.gather(1, positions.clamp(max=vocab - 1)).masked_fill(positions >= vocab, float("-inf"))
    values, chosen = candidates.topk(k, dim=-1)
    return argmax, positions.gather(1, chosen), values


@dataclass(frozen=True)
class Readout:
    """One cycle's reading of the logits, on the host: what the walk and the observers need."""

    predictions: np.ndarray  # int64 [rows]: argmax of every row of the pass (tree rows, then auxiliary rows)
    top_tokens: np.ndarray  # int64 [tree rows, k]
    top_scores: np.ndarray  # float32 [tree rows, k]: softmax over the k kept logits


def read(logits: torch.Tensor, tree_rows: int, k: int) -> Readout:
    """Argmax of every row and top-k of the first ``tree_rows`` rows of ``logits`` [rows, V], in one device read.

    The three results travel to the host as one float tensor (one device-to-host copy and sync):
    token ids are exact in float32 below 2**24 and in float64 above.
    """
    rows = logits.shape[0]
    predictions, top_tokens, top_logits = greedy_and_top_k(logits[:tree_rows], k)
    if rows > tree_rows:
        predictions = torch.cat([predictions, greedy(logits[tree_rows:])])
    carrier = torch.float32 if logits.shape[-1] < 2**24 else torch.float64
    top_scores = torch.softmax(top_logits.float(), dim=-1)
    host = torch.cat([predictions.to(carrier), top_tokens.flatten().to(carrier),
                      top_scores.flatten().to(carrier)]).cpu().numpy()
    kept = top_tokens.shape[1]
    tokens_end = rows + tree_rows * kept
    return Readout(host[:rows].astype(np.int64), host[rows:tokens_end].astype(np.int64).reshape(tree_rows, kept),
                   host[tokens_end:].astype(np.float32).reshape(tree_rows, kept))
