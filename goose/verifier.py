"""The shared verifier: one forward pass of a draft tree through a stock Hugging Face causal LM.

Nothing here is model-specific: the model is driven through its public forward with a 4D
boolean attention mask (True = may attend), explicit position ids (context length + depth) and
a ``DynamicCache``. Models with sliding-window layers (Gemma 3) take a dict of masks, one per
attention type. The cache is built without a config so every layer keeps its whole history;
the sliding window is enforced by the mask instead, which keeps rollback to the accepted path a
plain index-select on the sequence axis.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, PreTrainedModel

from goose.outcome import AuxiliaryRows
from goose.tree import DraftTree


class ContextOverflowError(ValueError):
    """The prompt (plus what must follow it) does not fit the model's context."""


class Verifier:
    """Owns the KV cache of one request and runs prefill, tree verification and cache compaction."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        config = model.config.get_text_config(decoder=True)
        layer_types = getattr(config, "layer_types", None) or []
        self.sliding_window: int | None = (
            int(config.sliding_window) if "sliding_attention" in layer_types and config.sliding_window else None
        )
        self.mask_kinds = sorted(set(layer_types)) if self.sliding_window is not None else []
        self.max_positions: int = int(getattr(config, "max_position_embeddings", 1 << 30))
        self.vocab_size: int = int(model.get_output_embeddings().weight.shape[0])
        # transformers 5.x renamed `past_key_values` to `cache`; speak whichever this version knows
        self._cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.cache = DynamicCache()
        self.past_length = 0  # tokens whose key/values are in the cache and belong to the context
        self._pass_length = 0  # rows the last verify pass appended after past_length

    def reset(self) -> None:
        self.cache = DynamicCache()
        self.past_length = 0
        self._pass_length = 0

    @torch.inference_mode()
    def prefill(self, prompt_ids: list[int], logits_to_keep: int = 1) -> torch.Tensor:
        """Run the prompt into a fresh cache; return the logits [k, V] of its last k positions."""
        if not prompt_ids:
            raise ValueError("empty prompt: give at least one token")
        if len(prompt_ids) >= self.max_positions:
            raise ContextOverflowError(
                f"prompt of {len(prompt_ids)} tokens does not fit the model's context of {self.max_positions}"
            )
        self.reset()
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        logits_to_keep = max(1, min(logits_to_keep, len(prompt_ids)))
        # the model builds its own causal (and sliding-window) masks for a plain prefix
        output = self.model(
            input_ids=input_ids, use_cache=True, logits_to_keep=logits_to_keep, **{self._cache_kwarg: self.cache}
        )
        self.past_length = len(prompt_ids)
        return output.logits[0]

    @torch.inference_mode()
    def verify(self, tree: DraftTree, auxiliary: list[AuxiliaryRows] | None = None) -> torch.Tensor:
        """Logits [n + a, V] for every tree node (then every auxiliary row), in one forward pass.

        The anchor (node 0) is not yet in the cache; it enters here with its draft descendants.
        Call ``commit`` with the accepted path before the next pass.
        """
        past = self.past_length
        tokens = tree.tokens
        positions = tree.position_ids(past)[0]
        mask = tree.attention_mask(past, None)[0, 0]
        sliding = tree.attention_mask(past, self.sliding_window)[0, 0] if self.sliding_window else None
        if auxiliary:
            tokens, positions, mask, sliding = _append_auxiliary(tree, past, auxiliary, tokens, positions, mask,
                                                                 sliding, self.sliding_window)
        if positions.max() >= self.max_positions:
            raise ContextOverflowError(f"context reached the model's limit of {self.max_positions} positions")
        attention: torch.Tensor | dict[str, torch.Tensor] = mask[None, None].to(self.device)
        if self.sliding_window is not None:
            masks = {"full_attention": attention, "sliding_attention": sliding[None, None].to(self.device)}
            attention = {kind: masks.get(kind, attention) for kind in self.mask_kinds}
        output = self.model(
            input_ids=tokens[None].to(self.device),
            attention_mask=attention,
            position_ids=positions[None].to(self.device),
            use_cache=True,
            **{self._cache_kwarg: self.cache},
        )
        self._pass_length = int(tokens.shape[0])
        return output.logits[0]

    @torch.inference_mode()
    def commit(self, path: torch.Tensor) -> None:
        """Keep the anchor and the accepted draft nodes ``path`` of the last pass; drop every other row.

        The kept rows move to the front of the pass's slots (index-select on the sequence axis)
        and the cache is cut after them. A chain-shaped path is already in place: a plain cut.
        """
        keep = torch.cat([torch.zeros(1, dtype=torch.long), path.to(torch.long)])
        start = self.past_length
        kept = int(keep.shape[0])
        in_place = bool((keep == torch.arange(kept)).all())
        source = (start + keep).to(self.device)
        for layer in self.cache.layers:
            if not in_place:
                layer.keys[:, :, start : start + kept] = layer.keys.index_select(2, source)
                layer.values[:, :, start : start + kept] = layer.values.index_select(2, source)
            layer.keys = layer.keys[:, :, : start + kept]
            layer.values = layer.values[:, :, : start + kept]
        self.past_length = start + kept
        self._pass_length = 0


    def discard(self) -> None:
        """Drop every row of the last pass, anchor included (the cache is as before ``verify``)."""
        for layer in self.cache.layers:
            layer.keys = layer.keys[:, :, : self.past_length]
            layer.values = layer.values[:, :, : self.past_length]
        self._pass_length = 0


def _append_auxiliary(
    tree: DraftTree,
    past: int,
    auxiliary: list[AuxiliaryRows],
    tokens: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor,
    sliding: torch.Tensor | None,
    window: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Extend the tree's rows with auxiliary rows: they see the context, the anchor and their own mask."""
    n = tree.size
    aux_tokens = torch.cat([rows.tokens for rows in auxiliary])
    aux_positions = past + torch.cat([rows.position_offsets for rows in auxiliary])
    total = n + aux_tokens.shape[0]
    block = torch.block_diag(*[rows.mask for rows in auxiliary]).to(torch.bool)

    def widen(tree_mask: torch.Tensor, windowed: bool) -> torch.Tensor:
        full = torch.zeros(total, past + total, dtype=torch.bool)
        full[:n, : past + n] = tree_mask
        seen = torch.ones(aux_tokens.shape[0], past, dtype=torch.bool)
        if windowed and window is not None:
            seen = aux_positions[:, None] - torch.arange(past)[None, :] < window
        full[n:, :past] = seen
        full[n:, past] = True  # the anchor
        full[n:, past + n :] = block
        return full

    return (
        torch.cat([tokens, aux_tokens]),
        torch.cat([positions, aux_positions]),
        widen(mask, False),
        widen(sliding, True) if sliding is not None else None,
    )
