"""Grouped-query attention for a pass of several rows that reads the KV cache where it lies.

A verify pass sends several query rows (a tree, or a batch of trees) with an explicit 4D mask. For
such a call transformers' ``sdpa`` attention on a CPU repeats every key/value head once per query
head it serves (``repeat_kv``), which copies the whole cache of every layer on every pass: with
SmolLM2's 3 key/value heads for 9 query heads, about 50 MB per pass at a 768-token context, a cost
that grows with the context. (For a single query row transformers already avoids the copy by
folding the query heads of a group into rows.) Here the same fold is made for any number of rows:
the query heads that share a key/value head become more rows of one attention call, the mask is
repeated along the rows to match, and the cache is read in place. Same attention, same kernel;
only the order of the kernel's sums within a block may differ.

Both functions are reached through :data:`VERIFY_SDPA`, registered with transformers' public
``AttentionInterface``: :func:`verify_attention` sets a model that runs ``sdpa`` to it once, with
``set_attn_implementation``, and a verify pass asks for its path with the forward keyword
``goose_attention`` (transformers hands a forward's keywords to the attention function). Every
other call, Hugging Face's own ``generate`` on the same model included, runs transformers' ``sdpa``
unchanged, so no per-pass switch of the shared model is needed (one would race between threads).
Anything the fold does not cover (one row, no mask, a per-head mask, a position bias, a soft cap,
dropout) goes to transformers' ``sdpa`` unchanged too.

A model whose linear layers run in int8 (:mod:`goose.quantize`) takes :func:`exact_sdpa_forward`
instead, for every verify pass, one row or many: its activations are rounded to integers before
every linear layer, so a last-bit difference in attention (float32 sums in another order, because
the pass has more rows, a wider cache or a tree's gaps between a row's ancestors) can move an
integer, and the difference then grows through the layers until tokens change. There the scores,
the softmax and the weighted sum of the values are computed in float64 (float32 products are exact
in it) and rounded once at the end, so a row's attention is the same number in a tree pass and in
a one-token pass (unless a float64 sum lands within its own rounding error of a float32 rounding
boundary: some 1e-9 of the values).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

VERIFY_SDPA = "goose_verify_sdpa"


def grouped_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention, with the query heads of a key/value group folded into rows.

    query [b, heads, q, d], key/value [b, kv_heads, k, d], mask [b or 1, 1, q, k]; returns [b, q, heads, d]
    as every transformers attention function does.
    """
    groups = int(getattr(module, "num_key_value_groups", 1))
    batch, heads, rows, _ = query.shape
    if attention_mask is None or not (
            groups > 1 and rows > 1 and attention_mask.dim() == 4 and attention_mask.shape[1] == 1 and dropout == 0.0
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
            and key.shape[1] * groups == heads):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    kv_heads = key.shape[1]
    # query head h serves key/value head h // groups: its rows go to row block h % groups of that head
    folded = query.reshape(batch, kv_heads, groups * rows, query.shape[-1])
    mask = attention_mask.expand(batch, 1, rows, attention_mask.shape[-1]).repeat(1, 1, groups, 1)
    output = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scaling)
    return output.reshape(batch, heads, rows, value.shape[-1]).transpose(1, 2).contiguous(), None


def exact_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention summed in float64 and rounded once: every row the same number whatever else is in the pass.

    The query heads of a key/value group are folded into rows as in :func:`grouped_sdpa_forward`;
    ``attention_mask`` is the verifier's boolean mask [b or 1, 1, q, k] (True: may attend).
    """
    if attention_mask is None or attention_mask.dtype != torch.bool or attention_mask.shape[1] != 1 or dropout \
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        raise ValueError("exact attention takes a verify pass's boolean mask, without dropout, bias or soft cap")
    batch, heads, rows, size = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    folded = query.reshape(batch, kv_heads, groups * rows, size).double()
    mask = attention_mask.expand(batch, 1, rows, attention_mask.shape[-1]).repeat(1, 1, groups, 1)
    scores = folded @ key.double().transpose(-1, -2) * (size ** -0.5 if scaling is None else scaling)
    probabilities = scores.masked_fill_(~mask, -torch.inf).softmax(dim=-1)
    output = (probabilities @ value.double()).to(query.dtype)
    return output.reshape(batch, heads, rows, value.shape[-1]).transpose(1, 2).contiguous(), None


_FORWARDS = {"grouped": grouped_sdpa_forward, "exact": exact_sdpa_forward}


def verify_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, goose_attention: str | None = None,
                        **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa``, or for a verify pass (``goose_attention``) the grouped or exact attention."""
    forward = _FORWARDS.get(goose_attention or "", sdpa_attention_forward)
    return forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(VERIFY_SDPA, verify_sdpa_forward)
AttentionMaskInterface.register(VERIFY_SDPA, sdpa_mask)  # masks are built as for sdpa (a prefill's, say)


def verify_attention(model: PreTrainedModel, exact: bool = False) -> dict[str, str]:
    """The forward keyword that runs a verify pass with :func:`grouped_sdpa_forward` (``exact``:
    :func:`exact_sdpa_forward`), the model set to :data:`VERIFY_SDPA` when it runs ``sdpa``; {} for a
    model on another attention implementation (eager, flash, a user's own), which is left alone."""
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(VERIFY_SDPA)
    if model.config._attn_implementation != VERIFY_SDPA:
        return {}
    return {"goose_attention": "exact" if exact else "grouped"}
