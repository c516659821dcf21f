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

The function is registered with transformers' public ``AttentionInterface`` under
:data:`GROUPED_SDPA`, and :func:`grouped_attention` switches a model that runs ``sdpa`` to it for
the duration of one forward pass only: the caller's model is left as it was found (Hugging Face's
own ``generate`` on the same model keeps its stock path). Anything the fold does not cover (one
row, no mask, a per-head mask, a position bias, a soft cap, dropout) goes to transformers' ``sdpa``
unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED_SDPA = "goose_grouped_sdpa"


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


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_forward)
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)  # masks are built as for sdpa (a prefill's, say)


@contextmanager
def grouped_attention(model: PreTrainedModel) -> Iterator[None]:
    """Run the model's forward passes inside this block with :func:`grouped_sdpa_forward` when it runs ``sdpa``.

    Models on another attention implementation (eager, flash, a user's own) are left alone.
    """
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    config._attn_implementation = GROUPED_SDPA
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
