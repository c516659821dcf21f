"""Reading the target's logits: the greedy token and the top-k of every row, in one pass and one read.

Every cycle needs the argmax of each verified row (the walk) and the top-k of each tree row (the
harvest). For a large vocabulary both are expensive on a CPU: ``argmax`` and ``max(dim)`` (which
also track positions) read the logits several times slower than ``amax``, and ``topk`` slower still.

So the vocabulary is cut into blocks of ``BLOCK`` values and each block's maximum (``amax``, values
only) is taken: that is the only full read of the logits. Then only a few blocks are looked at:

- the row's argmax lies in the first block holding the largest maximum, at the first position of
  that maximum there: exactly ``argmax``'s first-occurrence answer;
- the top-k lie in the k blocks with the largest maxima (a value outside them has k larger block
  maxima above it, hence k larger values), so a top-k over those k blocks, k * BLOCK values, equals
  the full top-k up to the order of exactly tied values.

``torch.max(dim)`` and ``torch.argmax`` both document first-occurrence ties; the decoder and the
autoregressive loop both read their greedy token through :func:`greedy`, so they agree even
where a bfloat16 row has two equal top logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

BLOCK = 128  # values per block: small enough that k blocks are cheap to rescan, large enough to pay


def _block_maxima(logits: torch.Tensor) -> torch.Tensor:
    """The maximum of every block of ``BLOCK`` values of each row [n, ceil(V / BLOCK)] (the last may be shorter)."""
    vocab = logits.shape[-1]
    whole = vocab // BLOCK * BLOCK
    maxima = logits[:, :whole].unflatten(1, (vocab // BLOCK, BLOCK)).amax(dim=-1)
    if whole < vocab:
        maxima = torch.cat([maxima, logits[:, whole:].amax(dim=-1, keepdim=True)], dim=1)
    return maxima


def _blocks(logits: torch.Tensor, chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, vocabulary positions) [n, m * BLOCK] of the blocks ``chosen`` [n, m] of each row, in that order.

    The shorter last block reads past the vocabulary: those slots hold -inf, so they are never chosen.
    """
    vocab = logits.shape[-1]
    positions = (chosen[:, :, None] * BLOCK + torch.arange(BLOCK, device=logits.device)).flatten(1)
    if vocab % BLOCK == 0:
        return logits.gather(1, positions), positions
    values = logits.gather(1, positions.clamp(max=vocab - 1)).masked_fill(positions >= vocab, float("-inf"))
    return values, positions


def _argmax_from_blocks(logits: torch.Tensor, maxima: torch.Tensor) -> torch.Tensor:
    values, positions = _blocks(logits, maxima.argmax(dim=-1, keepdim=True))  # the first block with the maximum
    return positions.gather(1, values.argmax(dim=-1, keepdim=True)).squeeze(1)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Argmax of each row of ``logits`` [n, V] (first occurrence on ties), int64 [n] on the same device.

    A float32 tensor on the CPU is read by NumPy's ``argmax`` (first occurrence too): one vectorized pass on
    the calling thread, 10-30x faster than the block maxima through torch here (2 us for SmolLM2's 49152
    logits, 6 us for Qwen's 151936), and no wake-up of torch's worker threads, which then spin on the cores
    where llama.cpp's threads run the next pass (plain decoding on the llama.cpp engine reads every token's
    row here)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and not logits.requires_grad:
        return torch.from_numpy(np.asarray(logits.numpy().argmax(axis=-1), dtype=np.int64))
    if logits.shape[-1] < 4 * BLOCK:
        return logits.argmax(dim=-1)
    return _argmax_from_blocks(logits, _block_maxima(logits))


def greedy_and_top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(argmax [n], top-k indices [n, k], top-k values [n, k]) of ``logits`` [n, V], in one full read.

    The argmax is exactly ``greedy(logits)``; the top-k equal ``logits.topk(k)`` up to the order of
    exactly tied values. Small vocabularies (under a few blocks per kept value) take the plain path.
    """
    vocab = logits.shape[-1]
    k = min(k, vocab)
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and not logits.requires_grad:
        predictions, indices, values = _host_greedy_and_top_k(logits.numpy(), k)
        return torch.from_numpy(predictions), torch.from_numpy(indices), torch.from_numpy(values)
    if vocab // BLOCK < 4 * k:
        values, indices = logits.topk(k, dim=-1)
        return logits.argmax(dim=-1), indices, values
    maxima = _block_maxima(logits)
    candidates, positions = _blocks(logits, maxima.topk(k, dim=-1).indices)
    values, chosen = candidates.topk(k, dim=-1)
    return _argmax_from_blocks(logits, maxima), positions.gather(1, chosen), values


def _host_greedy_and_top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`greedy_and_top_k` of a CPU float32 array by NumPy, the same blocks: on the calling thread, as
    :func:`greedy` reads, so torch's worker threads are not woken to spin on the cores where llama.cpp's threads
    run the next pass (the llama.cpp engine reads every tree here), and 2-4x faster than torch's reads here."""
    rows, vocab = logits.shape
    if vocab // BLOCK < 4 * k:
        predictions = logits.argmax(axis=-1)
        positions, values = np.broadcast_to(np.arange(vocab), logits.shape), logits
    else:
        whole = vocab // BLOCK * BLOCK
        maxima = logits[:, :whole].reshape(rows, vocab // BLOCK, BLOCK).max(axis=-1)
        if whole < vocab:
            maxima = np.concatenate([maxima, logits[:, whole:].max(axis=-1, keepdims=True)], axis=1)
        first = maxima.argmax(axis=-1)  # the first block holding the row's maximum: the argmax is its first one there
        predictions = first * BLOCK + _host_blocks(logits, first[:, None])[0].argmax(axis=-1)
        values, positions = _host_blocks(logits, _largest(maxima, k))
    kept = _largest(values, k)
    top_values = np.take_along_axis(values, kept, axis=1)
    order = np.argsort(-top_values, axis=1, kind="stable")  # largest first, as topk
    top_positions = np.take_along_axis(np.take_along_axis(positions, kept, axis=1), order, axis=1)
    return (predictions.astype(np.int64), top_positions.astype(np.int64),
            np.take_along_axis(top_values, order, axis=1))


def _host_blocks(logits: np.ndarray, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_blocks` in NumPy: (values, vocabulary positions) [n, m * BLOCK] of the blocks ``chosen`` [n, m]."""
    vocab = logits.shape[1]
    positions = (chosen[:, :, None] * BLOCK + np.arange(BLOCK)).reshape(chosen.shape[0], chosen.shape[1] * BLOCK)
    values = np.take_along_axis(logits, np.minimum(positions, vocab - 1), axis=1)
    values[positions >= vocab] = -np.inf  # the shorter last block's slots past the vocabulary
    return values, positions


def _largest(values: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the ``k`` largest values of each row, in no order."""
    if k >= values.shape[1]:
        return np.broadcast_to(np.arange(values.shape[1]), values.shape)
    return np.argpartition(values, values.shape[1] - k, axis=1)[:, values.shape[1] - k :]


@dataclass(frozen=True)
class Readout:
    """One cycle's reading of the logits, on the host: what the walk and the observers need."""

    predictions: np.ndarray  # int64 [rows]: argmax of every row of the pass (tree rows, then auxiliary rows)
    top_tokens: np.ndarray  # int64 [tree rows, k]
    top_scores: np.ndarray  # float32 [tree rows, k]: softmax over the k kept logits


def read(logits: torch.Tensor, tree_rows: int, k: int) -> Readout:
    """Argmax of every row and top-k of the first ``tree_rows`` rows of ``logits`` [rows, V], in one device read.

    Off the CPU the three results travel to the host as one float tensor (one device-to-host copy
    and sync): token ids are exact in float32 below 2**24 and in float64 above. On the CPU the
    arrays are the tensors' own memory, so nothing is packed or copied.
    """
    rows = logits.shape[0]
    predictions, top_tokens, top_logits = greedy_and_top_k(logits[:tree_rows], k)
    if rows > tree_rows:
        predictions = torch.cat([predictions, greedy(logits[tree_rows:])])
    top_scores = torch.softmax(top_logits.float(), dim=-1)
    if logits.device.type == "cpu":
        return Readout(predictions.numpy(), top_tokens.numpy(), top_scores.numpy())
    carrier = torch.float32 if logits.shape[-1] < 2**24 else torch.float64
    host = torch.cat([predictions.to(carrier), top_tokens.flatten().to(carrier),
                      top_scores.flatten().to(carrier)]).cpu().numpy()
    kept = top_tokens.shape[1]
    tokens_end = rows + tree_rows * kept
    return Readout(host[:rows].astype(np.int64), host[rows:tokens_end].astype(np.int64).reshape(tree_rows, kept),
                   host[tokens_end:].astype(np.float32).reshape(tree_rows, kept))


__all__ = ["greedy", "greedy_and_top_k", "read"]
