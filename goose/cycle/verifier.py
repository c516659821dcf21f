"""The shared verifier: one forward pass of a draft tree through a stock Hugging Face causal LM.

Nothing here is model-specific: the model is driven through its public forward with a 4D boolean
attention mask (True = may attend), explicit position ids (context length + depth) and a KV cache
built from transformers' public ``Cache`` class. Models with sliding-window layers (Gemma 3) take
a dict of masks, one per attention type. Every layer keeps its whole history (the sliding window
is enforced by the mask), which keeps rollback to the accepted path an index copy on the sequence
axis, and every layer of the usual shape keeps it in one shared tensor (:class:`LayerStack`), so
that copy is one gather for all layers at once.

Per cycle the tree crosses to the model's device once: one host array holding the tokens, the
positions and the tree's ancestor block, and the accepted rows of the previous pass when they must
move in the cache (a commit that is not a plain cut is applied at the start of the next pass, from
that same copy). The context part of the mask (everything the tree may see of the cache) is built
on the device.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from functools import partial

import numpy as np
import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer

from goose.contract.outcome import AuxiliaryRows
from goose.contract.tree import DraftTree
from goose.cycle.attention import grouped_attention


class ContextOverflowError(ValueError):
    """The prompt (plus what must follow it) does not fit the model's context."""


class LayerStack:
    """The keys and values of every layer of one shape in one tensor [layers, 2, batch, heads, capacity, dim].

    Layers join as they first see keys (the first forward); each layer's storage is a view of its slot,
    so moving kept rows on the sequence axis is one gather and one copy for the whole cache instead
    of four kernels per layer. A layer whose keys differ in shape, dtype or device from the first
    layer's (or one past ``slots``) keeps its own storage and moves alone.
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.members: list[GrowingLayer] = []
        self.loners: list[GrowingLayer] = []
        self.store: torch.Tensor | None = None

    def join(self, layer: GrowingLayer, key_states: torch.Tensor, value_states: torch.Tensor) -> bool:
        """Whether ``layer`` shares the stack's storage (its slot is then ``len(members) - 1``)."""
        if self.members:
            first = self.store
            assert first is not None
            fits = (len(self.members) < self.slots and key_states.shape[:-2] == first.shape[2:-2]
                    and key_states.shape[-1] == first.shape[-1] and key_states.dtype == first.dtype
                    and key_states.device == first.device)
        else:
            fits = self.slots > 0
        fits = fits and key_states.shape == value_states.shape and key_states.dtype == value_states.dtype
        (self.members if fits else self.loners).append(layer)
        if fits:
            if self.store is None:
                self.store = key_states.new_empty((self.slots, 2, *key_states.shape[:-2], 0, key_states.shape[-1]))
            slot = len(self.members) - 1
            layer.attach(self.store[slot, 0], self.store[slot, 1])
        return fits

    def reserve(self, needed: int) -> None:
        """Room for ``needed`` rows in every member (storage doubles; the rows held so far are copied once)."""
        assert self.store is not None
        held = self.store.shape[-2]
        if needed <= held:
            return
        store = self.store.new_empty((*self.store.shape[:-2], max(needed, 2 * held, 256), self.store.shape[-1]))
        if held:
            store[..., :held, :] = self.store
        self.store = store
        for slot, layer in enumerate(self.members):
            layer.attach(store[slot, 0], store[slot, 1])

    def move(self, start: int, rows: torch.Tensor) -> None:
        """Move rows ``rows`` (absolute, ascending) to ``start, start + 1, ...`` in every layer."""
        if self.store is not None and self.members:
            self.store[..., start : start + rows.shape[0], :] = self.store.index_select(-2, rows)
        for layer in self.loners:
            layer.move(start, rows)


class GrowingLayer(DynamicLayer):
    """One layer's key/value cache in storage that grows by doubling, shared with the other layers.

    transformers' ``DynamicLayer`` concatenates every new pass onto its keys, which copies the whole
    cache once per forward; here a pass writes only its own rows, and rolling back to the accepted
    path moves only the kept rows. The storage is the layer's slot of a :class:`LayerStack` (or its
    own, when its shape is not the stack's).
    """

    def __init__(self, stack: LayerStack | None = None) -> None:
        super().__init__()
        self.stack = stack
        self.stacked = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.length = 0
        self._keys = key_states.new_empty(0)
        self._values = value_states.new_empty(0)
        self.stacked = self.stack is not None and self.stack.join(self, key_states, value_states)

    def attach(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold keys and values in this storage from now on (the stack's slot: rows already copied)."""
        self._keys, self._values = keys, values
        self._cut(self.length)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if self.stacked:
            assert self.stack is not None
            self.stack.reserve(end)
        elif self._keys.ndim != key_states.ndim or end > self._keys.shape[-2]:
            self._grow(key_states, value_states, end)
        self._keys[..., self.length : end, :] = key_states
        self._values[..., self.length : end, :] = value_states
        self._cut(end)
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        capacity = max(needed, 2 * (self._keys.shape[-2] if self._keys.ndim == key_states.ndim else 0), 256)
        keys = key_states.new_empty((*key_states.shape[:-2], capacity, key_states.shape[-1]))
        values = value_states.new_empty((*value_states.shape[:-2], capacity, value_states.shape[-1]))
        if self.length:
            keys[..., : self.length, :] = self._keys[..., : self.length, :]
            values[..., : self.length, :] = self._values[..., : self.length, :]
        self._keys, self._values = keys, values

    def _cut(self, length: int) -> None:
        self.length = length
        self.keys = self._keys[..., :length, :]
        self.values = self._values[..., :length, :]

    def move(self, start: int, rows: torch.Tensor) -> None:
        """Move the rows at ``rows`` (absolute, ascending) to ``start, start + 1, ...``.

        The storage past the cut keeps a pass's rows until the next pass writes there, so a commit can
        cut first and move the kept rows later, before that write.
        """
        end = start + rows.shape[0]
        self._keys[..., start:end, :] = self._keys.index_select(-2, rows)
        self._values[..., start:end, :] = self._values.index_select(-2, rows)

    def truncate(self, length: int) -> None:
        if self.is_initialized:
            self._cut(min(length, self.length))

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def reset(self) -> None:
        super().reset()
        self.length = 0


class TargetModel:
    """What a verifier reads of the target model once: its device, sliding window and mask kinds, context,
    vocabulary, layer count, and the keyword its forward takes the cache by."""

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
        self._layers = int(getattr(config, "num_hidden_layers", 0) or 0)

    def last_rows(self, prompt_length: int, logits_to_keep: int) -> torch.Tensor:
        """The prefill's ``logits_to_keep`` argument for the last k of ``prompt_length`` positions, as indices.

        Given indices, the model gathers those rows into a contiguous block before its output layer;
        given the int k, it multiplies a strided slice of the hidden states, and in bfloat16 on a CPU
        that matmul first copies the whole output matrix into the layout it wants: with a large
        vocabulary (Gemma 3's 262k rows) that copy costs more than the rest of a short prompt's prefill.
        The logits are the same either way.
        """
        keep = max(1, min(logits_to_keep, prompt_length))
        return torch.arange(prompt_length - keep, prompt_length, device=self.device)

    def tree_pass(self, cache: Cache, **inputs: torch.Tensor) -> torch.Tensor:
        """Logits of one verify pass (rows under an explicit 4D mask) over ``cache``, which it extends.

        Grouped-query attention reads the cache in place for such a pass (:mod:`goose.cycle.attention`).
        """
        with grouped_attention(self.model):
            return self.model(use_cache=True, **{self._cache_kwarg: cache}, **inputs).logits


class Verifier(TargetModel):
    """Owns the KV cache of one request and runs prefill, tree verification and cache compaction."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__(model)
        self._key_positions = torch.arange(0, device=self.device)  # 0..n-1, grown as the context grows
        self.stacked = True  # layers of one shape share one tensor; False: each its own (the per-layer move)
        self.reset()

    def reset(self) -> None:
        self.stack = LayerStack(self._layers if self.stacked else 0)
        self.cache = Cache(layer_class_to_replicate=partial(GrowingLayer, self.stack))
        self.past_length = 0  # tokens whose key/values are in the cache and belong to the context
        self._pending: tuple[int, np.ndarray] | None = None  # (start, kept rows' absolute indices) still to move

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
        # the model builds its own causal (and sliding-window) masks for a plain prefix
        output = self.model(input_ids=input_ids, use_cache=True,
                            logits_to_keep=self.last_rows(len(prompt_ids), logits_to_keep),
                            **{self._cache_kwarg: self.cache})
        self.past_length = len(prompt_ids)
        return output.logits[0]

    @torch.inference_mode()
    def verify(self, tree: DraftTree, auxiliary: Sequence[AuxiliaryRows] = ()) -> torch.Tensor:
        """Logits [n + a, V] for every tree node (then every auxiliary row), in one forward pass.

        The anchor (node 0) is not yet in the cache; it enters here with its draft descendants.
        Call ``commit`` with the accepted path before the next pass.
        """
        past = self.past_length
        tokens, positions, block = pass_rows(tree, past, auxiliary)
        if int(positions.max()) >= self.max_positions:
            raise ContextOverflowError(f"context reached the model's limit of {self.max_positions} positions")
        rows = tokens.shape[0]
        moved = self._pending[1] if self._pending is not None else np.zeros(0, dtype=np.int64)
        # the one host-to-device copy of the cycle: tokens, positions, the ancestor block, and the rows
        # the previous commit keeps (absolute indices in the cache)
        packed = torch.from_numpy(np.concatenate([tokens, positions, block.ravel(), moved])).to(self.device,
                                                                                                non_blocking=True)
        tokens_on_device, positions_on_device = packed[:rows], packed[rows : 2 * rows]
        block_on_device = packed[2 * rows : 2 * rows + rows * rows].view(rows, rows).bool()
        if self._pending is not None:
            self.stack.move(self._pending[0], packed[2 * rows + rows * rows :])
            self._pending = None
        return self.tree_pass(self.cache, input_ids=tokens_on_device[None],
                              attention_mask=self._masks(past, positions_on_device, block_on_device),
                              position_ids=positions_on_device[None])[0]

    def _masks(self, past: int, positions: torch.Tensor, block: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """The pass's attention mask(s) [1, 1, rows, past + rows], built on the device."""
        rows = block.shape[0]
        full = torch.cat([torch.ones(rows, past, dtype=torch.bool, device=self.device), block], dim=1)[None, None]
        if self.sliding_window is None:
            return full
        if self._key_positions.shape[0] < past:
            self._key_positions = torch.arange(max(past, 2 * self._key_positions.shape[0]), device=self.device)
        # a row at position q sees a cached position k only when q - k < window, as the model's sliding
        # layers do in plain decoding; the pass's own keys lie within the tree's depth, always inside it
        seen = positions[:, None] - self._key_positions[None, :past] < self.sliding_window
        sliding = torch.cat([seen, block], dim=1)[None, None]
        masks = {"full_attention": full, "sliding_attention": sliding}
        return {kind: masks.get(kind, full) for kind in self.mask_kinds}

    @torch.inference_mode()
    def commit(self, path: np.ndarray) -> None:
        """Keep the anchor and the accepted draft nodes ``path`` of the last pass; drop every other row.

        The cache is cut after the kept rows at once. A chain-shaped path is already in place; other
        kept rows move to the front of the pass's slots (one gather on the sequence axis of the layer
        stack) at the start of the next pass, which carries their indices in its one host-to-device copy.
        """
        keep = np.concatenate([[0], np.asarray(path, dtype=np.int64)])
        start = self.past_length
        kept = int(keep.shape[0])
        for layer in self.cache.layers:
            layer.truncate(start + kept)
        if not (keep == np.arange(kept)).all():
            self._pending = (start, start + keep)
        self.past_length = start + kept

    def discard(self) -> None:
        """Drop every row of the last pass, anchor included (the cache is as before ``verify``)."""
        for layer in self.cache.layers:
            layer.truncate(self.past_length)


def pass_rows(tree: DraftTree, past: int, auxiliary: Sequence[AuxiliaryRows]) -> tuple[np.ndarray, ...]:
    """Tokens [r], positions [r] (int64) and the attention block bool [r, r] among the pass's own rows.

    Tree rows see their root path; auxiliary rows see the anchor and what their own mask allows; no
    tree row sees an auxiliary row.
    """
    tokens, positions, block = tree.tokens, past + tree.depths, tree.ancestors
    if not auxiliary:
        return tokens, positions, block
    n = tree.size
    extra = int(sum(rows.tokens.shape[0] for rows in auxiliary))
    total = n + extra
    combined = np.zeros((total, total), dtype=np.bool_)
    combined[:n, :n] = block
    combined[n:, 0] = True  # every auxiliary row sees the anchor
    start = n
    for rows in auxiliary:
        end = start + rows.tokens.shape[0]
        combined[start:end, start:end] = rows.mask
        start = end
    return (np.concatenate([tokens, *(rows.tokens for rows in auxiliary)]),
            np.concatenate([positions, *(past + rows.position_offsets for rows in auxiliary)]), combined)
