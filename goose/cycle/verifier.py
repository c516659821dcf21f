"""The verifier: the draft trees of one request or of many through a stock Hugging Face causal LM, in one pass.

Nothing here is model-specific: the model is driven through its public forward with a 4D boolean
attention mask (True = may attend), explicit position ids (context length + depth) and a KV cache
built from transformers' public ``Cache`` class. Models with sliding-window layers (Gemma 3) take
a dict of masks, one per attention type. Every layer keeps its whole history (the sliding window
is enforced by the mask), which keeps rollback to the accepted path an index copy on the sequence axis.

Each request owns a *slot* of the cache; the requests decoding now hold slots ``0 .. live - 1`` (a
leaving request's slot is refilled by the last one's, so a pass reads a contiguous view). Slot i
keeps its context at cache positions ``0 .. length_i - 1``: a position in the cache is the token's
position in its sequence. A pass pads every row's tree, followed by its auxiliary rows (Lookahead's
window), to the largest one (``R`` rows) and writes row i's keys at ``length_i .. length_i + R - 1``;
the mask [live, 1, R, max(length) + R] lets each row see its own context and its own pass rows only.
Padding rows see only themselves and are never read. When every row is at one length (one request,
always) the pass writes one block and its mask is the context's ones beside the tree's ancestors, with
no per-row gather.

Every layer of the usual shape keeps its keys and values in one shared tensor (:class:`LayerStack`),
so moving a commit's kept rows is one gather for all layers at once; a layer of another shape keeps
its own storage and moves alone. Per cycle the pass crosses to the model's device once: one host
array holding the tokens, the positions, the ancestor blocks (a byte an entry), the lengths, and the rows the previous
commits keep when they must move (a commit that is not a plain cut is applied at the start of the
next pass, from that same copy).

A joining request's prompt runs as its own pass, into its slot alone, with the model's own causal
(and sliding-window) masks. Storage is zeroed when grown: padding columns are masked, but a masked
column must still hold finite numbers (a NaN times a zero weight is NaN).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer

from goose.contract.outcome import AuxiliaryRows
from goose.contract.tree import DraftTree
from goose.cycle.attention import verify_attention
from goose.quantize import quantized


class ContextOverflowError(ValueError):
    """The prompt (plus what must follow it) does not fit the model's context."""


class CacheBudgetError(ContextOverflowError):
    """A request needs more cache positions than a slot of the session's cache budget holds."""


@dataclass
class PassPlan:
    """Where the pass now running writes: slots ``first ..``, every row from ``offset`` or row i from ``offsets[i]``."""

    first: int = 0
    offset: int = 0
    offsets: torch.Tensor | None = None  # [rows] int64 on the device; None: every row at ``offset``
    width: int = 0  # the keys a pass reads: its longest row's length + its rows
    flat: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # (heads, capacity) -> write rows

    def flat_rows(self, heads: int, capacity: int, length: int, device: torch.device) -> torch.Tensor:
        """Where the pass's keys [rows, heads, length, dim] go in a store [slots, heads, capacity, dim] flattened
        to rows of ``dim`` (made once per pass and store shape, shared by the layers)."""
        key = (heads, capacity)
        if key not in self.flat:
            assert self.offsets is not None
            rows = self.offsets.shape[0]
            slot = (self.first + torch.arange(rows, device=device))[:, None, None] * (heads * capacity)
            head = torch.arange(heads, device=device)[None, :, None] * capacity
            position = self.offsets[:, None, None] + torch.arange(length, device=device)[None, None, :]
            self.flat[key] = (slot + head + position).flatten()
        return self.flat[key]


class LayerStack:
    """The keys and values of every layer of one shape in one tensor [layers, 2, slots, heads, capacity, dim].

    Layers join as they first see keys (the first forward); a member's storage is a view of its place
    in the stack. A layer whose keys differ in heads, head size, dtype or device from the first
    member's (or one past ``layers``) keeps its own storage: a *loner*, moved alone.
    """

    def __init__(self, layers: int, slots: int, capacity: int) -> None:
        self.layers = layers
        self.slots = slots
        self.capacity = capacity  # the positions one slot may hold at most
        self.members: list[SlotLayer] = []
        self.loners: list[SlotLayer] = []
        self.store: torch.Tensor | None = None
        self.plan = PassPlan()

    def join(self, layer: SlotLayer, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        first = self.store
        fits = (len(self.members) < self.layers and key_states.shape[1:] == value_states.shape[1:]
                and key_states.dtype == value_states.dtype)
        if first is not None:
            fits = fits and (key_states.shape[1], key_states.shape[-1], key_states.dtype, key_states.device) == (
                first.shape[3], first.shape[-1], first.dtype, first.device)
        if not fits:
            held = self.held()
            self.loners.append(layer)
            layer.attach(*(states.new_zeros((self.slots, states.shape[1], held, states.shape[-1]))
                           for states in (key_states, value_states)))
            return
        if first is None:
            self.store = key_states.new_zeros((self.layers, 2, self.slots, key_states.shape[1], 0,
                                               key_states.shape[-1]))
        self.members.append(layer)
        self._attach(len(self.members) - 1)

    def held(self) -> int:
        """The positions every slot of every layer has room for now."""
        if self.store is not None:
            return int(self.store.shape[-2])
        return int(self.loners[0].keys_store.shape[-2]) if self.loners else 0

    def _attach(self, member: int) -> None:
        assert self.store is not None
        self.members[member].attach(self.store[member, 0], self.store[member, 1])

    def reserve(self, needed: int) -> None:
        """Room for ``needed`` positions in every slot of every layer (doubling, zeroed; what is held is copied)."""
        held = self.held()
        if needed <= held:
            return
        if needed > self.capacity:
            raise CacheBudgetError(f"a pass needs {needed} positions a slot; the cache holds {self.capacity}")
        grown = min(max(needed, 2 * held, 256), self.capacity)

        def grow(store: torch.Tensor) -> torch.Tensor:
            bigger = store.new_zeros((*store.shape[:-2], grown, store.shape[-1]))
            bigger[..., :held, :] = store
            return bigger

        if self.store is not None:
            self.store = grow(self.store)
            for member in range(len(self.members)):
                self._attach(member)
        for layer in self.loners:
            layer.attach(grow(layer.keys_store), grow(layer.values_store))

    def move(self, slot: int, start: int, rows: torch.Tensor) -> None:
        """In ``slot`` of every layer, move positions ``rows`` (ascending) to ``start, start + 1, ...``."""
        if self.store is not None:
            view = self.store[:, :, slot]
            view[..., start : start + rows.shape[0], :] = view.index_select(-2, rows)
        for layer in self.loners:
            for store in (layer.keys_store[slot], layer.values_store[slot]):
                store[..., start : start + rows.shape[0], :] = store.index_select(-2, rows)

    def copy_slot(self, source: int, target: int, length: int) -> None:
        if self.store is not None:
            self.store[:, :, target, :, :length] = self.store[:, :, source, :, :length]
        for layer in self.loners:
            for store in (layer.keys_store, layer.values_store):
                store[target, :, :length] = store[source, :, :length]


class SlotLayer(DynamicLayer):
    """One layer's key/value cache: storage [slots, heads, capacity, dim] (its place in a :class:`LayerStack`, or
    its own), into which a pass writes only its own rows, each at its slot's length.

    transformers' ``DynamicLayer`` concatenates every new pass onto its keys, which copies the whole
    cache once per forward; here rolling back to the accepted path moves only the kept rows.
    """

    def __init__(self, stack: LayerStack) -> None:
        super().__init__()
        self.stack = stack
        self.keys_store = self.values_store = torch.empty(0)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.stack.join(self, key_states, value_states)

    def attach(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys_store, self.values_store = keys, values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        plan = self.stack.plan
        rows, heads, length, dim = key_states.shape
        self.stack.reserve(plan.width)
        keys, values = self.keys_store, self.values_store
        if plan.offsets is None:
            keys[plan.first : plan.first + rows, :, plan.offset : plan.offset + length] = key_states
            values[plan.first : plan.first + rows, :, plan.offset : plan.offset + length] = value_states
        else:  # each row at its own offset: one index copy into the store seen as rows of ``dim``
            target = plan.flat_rows(heads, keys.shape[-2], length, key_states.device)
            keys.view(-1, dim).index_copy_(0, target, key_states.reshape(-1, dim))
            values.view(-1, value_states.shape[-1]).index_copy_(0, target,
                                                                value_states.reshape(-1, value_states.shape[-1]))
        self.keys = keys[plan.first : plan.first + rows, :, : plan.width]
        self.values = values[plan.first : plan.first + rows, :, : plan.width]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.stack.plan.offset if self.stack.plan.offsets is None else 0


class Verifier:
    """Owns the KV cache of up to ``slots`` requests: each request's prefill, the pass that verifies every
    live slot's tree at once, and every slot's commit.

    ``cache_positions``: the cache's budget, in positions over all slots (each slot holds an equal share,
    at most the model's context); None: each slot may grow to the model's context. The cache is
    allocated as it grows, so the budget bounds memory without reserving it up front.
    """

    def __init__(self, model: PreTrainedModel, slots: int = 1, cache_positions: int | None = None) -> None:
        if slots < 1:
            raise ValueError(f"max_batch must be at least 1, got {slots}")
        if cache_positions is not None and cache_positions < slots * 2:
            raise ValueError(f"a cache budget of {cache_positions} positions is too small for {slots} slots")
        self.model = model
        self.device = next(model.parameters()).device
        config = model.config.get_text_config(decoder=True)
        layer_types = getattr(config, "layer_types", None) or []
        self.sliding_window: int | None = (
            int(config.sliding_window) if "sliding_attention" in layer_types and config.sliding_window else None
        )
        self.mask_kinds = sorted(set(layer_types)) if self.sliding_window is not None else []
        self.max_positions: int = int(getattr(config, "max_position_embeddings", 1 << 30))
        self.vocab_size: int = int(model.get_output_embeddings().out_features)  # an int8 head has no .weight
        # the verify passes' attention (int8: exact, its rows must not depend on the pass), chosen per call
        self._attention = verify_attention(model, exact=quantized(model) is not None)
        # transformers 5.x renamed `past_key_values` to `cache`; speak whichever this version knows
        self._cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._layers = int(getattr(config, "num_hidden_layers", 0) or 0)
        self.slots = slots
        self.budgeted = cache_positions is not None and cache_positions // slots < self.max_positions
        self.slot_positions = cache_positions // slots if self.budgeted and cache_positions else self.max_positions
        self._key_positions = torch.arange(0, device=self.device)  # 0..n-1, grown as contexts grow
        self.stacked = True  # layers of one shape share one tensor; False: each its own (the per-layer move)
        self.reset()

    def reset(self) -> None:
        """Drop every slot and the cache's storage."""
        self.stack = LayerStack(self._layers if self.stacked else 0, self.slots, self.slot_positions)
        self.cache = Cache(layer_class_to_replicate=partial(SlotLayer, self.stack))
        self.lengths: list[int] = []  # per live slot: positions that belong to its context
        self._pending: dict[int, tuple[int, np.ndarray]] = {}  # slot -> (start, kept rows' positions) to move

    @property
    def live(self) -> int:
        return len(self.lengths)

    def check_fits(self, positions: int) -> None:
        """Refuse (CacheBudgetError) a request that may come to hold more ``positions`` than a slot's share of the
        cache budget; without a budget a request runs to the model's context (its output ends ``context_full``)."""
        if self.budgeted and positions > self.slot_positions:
            raise CacheBudgetError(f"a request of up to {positions} positions (prompt + max_new_tokens) does not fit "
                                   f"a slot's share of the cache budget ({self.slots} slots): {self.slot_positions} "
                                   f"positions; lower max_new_tokens")

    def full(self) -> list[int]:
        """The live slots at the model's last position: their requests end here (``context_full``)."""
        return [slot for slot, length in enumerate(self.lengths) if length >= self.max_positions - 1]

    def room(self) -> list[int]:
        """Per live slot, the rows after the anchor its next pass may hold.

        Every row of a pass is padded to the widest and written from its own length, so the longest row
        bounds every row's pass within a slot's positions; the model's context bounds each row's own.
        """
        shared = self.slot_positions - 1 - max(self.lengths)
        return [max(0, min(self.max_positions - 1 - length, shared)) for length in self.lengths]

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

    @torch.inference_mode()
    def prefill(self, prompt_ids: list[int], logits_to_keep: int = 1) -> torch.Tensor:
        """Run a joining request's prompt into the next free slot (``live - 1`` after); the logits [k, V] of its
        last k positions."""
        if not prompt_ids:
            raise ValueError("empty prompt: give at least one token")
        if len(prompt_ids) >= self.max_positions:
            raise ContextOverflowError(
                f"prompt of {len(prompt_ids)} tokens does not fit the model's context of {self.max_positions}"
            )
        if self.live >= self.slots:
            raise RuntimeError(f"every one of the {self.slots} slots is taken")
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        self.stack.plan = PassPlan(first=self.live, width=len(prompt_ids))
        # the model builds its own causal (and sliding-window) masks for a plain prefix
        output = self.model(input_ids=input_ids, use_cache=True,
                            logits_to_keep=self.last_rows(len(prompt_ids), logits_to_keep),
                            **{self._cache_kwarg: self.cache})
        self.lengths.append(len(prompt_ids))
        return output.logits[0]

    @torch.inference_mode()
    def verify(self, trees: Sequence[DraftTree], auxiliary: Sequence[Sequence[AuxiliaryRows]] | None = None
               ) -> list[torch.Tensor]:
        """Logits [n_i + a_i, V] of every node of live slot i's tree ``trees[i]``, then of its auxiliary rows
        ``auxiliary[i]``, all in one pass.

        Each tree's anchor (node 0) is not yet in the cache; it enters here with its draft. Call
        :meth:`commit` for every slot before the next pass (without a commit the pass is forgotten).
        """
        if len(trees) != self.live:
            raise ValueError(f"{len(trees)} trees for {self.live} live slots")
        own = [pass_rows(tree, 0, auxiliary[i] if auxiliary else ()) for i, tree in enumerate(trees)]
        sizes = [row_tokens.shape[0] for row_tokens, _, _ in own]
        live, rows = self.live, max(sizes)
        lengths = np.asarray(self.lengths, dtype=np.int64)
        longest = int(lengths.max())
        if longest + rows > self.slot_positions:
            raise ContextOverflowError(f"a pass of {rows} rows after {longest} positions does not fit a slot's "
                                       f"{self.slot_positions} positions")
        tokens = np.zeros((live, rows), dtype=np.int64)
        depths = np.zeros((live, rows), dtype=np.int64)
        columns = -(-rows // 8) * 8  # the blocks cross as bytes, eight to each int64 of the packed array
        block = np.zeros((live, rows, columns), dtype=np.bool_)
        block[:, np.arange(rows), np.arange(rows)] = True  # a padding row sees itself only
        for i, (row_tokens, offsets, row_block) in enumerate(own):
            tokens[i, : sizes[i]], depths[i, : sizes[i]], block[i, : sizes[i], : sizes[i]] = row_tokens, offsets, \
                row_block
        positions = lengths[:, None] + depths
        if int(positions.max()) >= self.max_positions:
            raise ContextOverflowError(f"context reached the model's limit of {self.max_positions} positions")
        moves = sorted(self._pending.items())
        # the one host-to-device copy: tokens, positions, ancestor blocks, lengths, the rows kept rows move from
        packed = torch.from_numpy(np.concatenate([tokens.ravel(), positions.ravel(), block.view(np.int64).ravel(),
                                                  lengths, *(kept for _, (_, kept) in moves)]))
        packed = packed.to(self.device, non_blocking=True)
        cut = np.cumsum([live * rows, live * rows, live * rows * columns // 8, live])
        tokens_t, positions_t = packed[: cut[0]].view(live, rows), packed[cut[0] : cut[1]].view(live, rows)
        block_t = packed[cut[1] : cut[2]].view(torch.bool).view(live, rows, columns)[..., :rows]
        start = int(cut[3])
        for slot, (first, kept) in moves:
            self.stack.move(slot, first, packed[start : start + kept.shape[0]])
            start += kept.shape[0]
        self._pending.clear()
        width = longest + rows
        uniform = bool((lengths == longest).all())
        self.stack.plan = PassPlan(offset=longest, width=width) if uniform else \
            PassPlan(offsets=packed[cut[2] : cut[3]], width=width)
        logits = self._pass(input_ids=tokens_t, position_ids=positions_t,
                            attention_mask=self._masks(positions_t, block_t, width, self.stack.plan.offsets))
        return [logits[i, :n] for i, n in enumerate(sizes)]

    def _pass(self, **inputs: torch.Tensor) -> torch.Tensor:
        """Logits of one verify pass (rows under an explicit 4D mask) over the cache, which it extends.

        Grouped-query attention reads the cache in place for such a pass, exactly for an int8 model
        (:mod:`goose.cycle.attention`).
        """
        return self.model(use_cache=True, **{self._cache_kwarg: self.cache}, **self._attention, **inputs).logits

    def _masks(self, positions: torch.Tensor, block: torch.Tensor, width: int,
               lengths: torch.Tensor | None) -> torch.Tensor | dict[str, torch.Tensor]:
        """The pass's attention mask(s) [live, 1, R, width], built on the device; ``lengths`` None: every row's
        context is the ``width - R`` positions before its pass rows."""
        live, rows = positions.shape
        past = width - rows
        if lengths is None:
            context = torch.ones(live, rows, past, dtype=torch.bool, device=self.device)
            full = torch.cat([context, block], dim=2)[:, None]
        else:
            columns = torch.arange(width, device=self.device)
            context = columns[None, None, :] < lengths[:, None, None]  # [live, 1, width]
            relative = columns[None, :] - lengths[:, None]  # [live, width]: a column's row in the pass, if any
            in_pass = (relative >= 0) & (relative < rows)
            own = block.gather(2, relative.clamp(0, rows - 1)[:, None, :].expand(live, rows, width)) & in_pass[:, None]
            full = (context | own)[:, None]
        if self.sliding_window is None:
            return full
        if self._key_positions.shape[0] < width:
            self._key_positions = torch.arange(max(width, 2 * self._key_positions.shape[0]), device=self.device)
        # as in plain decoding, a row at position q sees a cached position k only when q - k < window; the
        # pass's own keys lie within the tree's depth, always inside it
        if lengths is None:
            seen = positions[:, :, None] - self._key_positions[None, None, :past] < self.sliding_window
            sliding = torch.cat([seen, block], dim=2)[:, None]
        else:
            seen = context & (positions[:, :, None] - self._key_positions[None, None, :width] < self.sliding_window)
            sliding = (seen | own)[:, None]
        masks = {"full_attention": full, "sliding_attention": sliding}
        return {kind: masks.get(kind, full) for kind in self.mask_kinds}

    def commit(self, slot: int, path: np.ndarray) -> None:
        """Keep slot ``slot``'s anchor and accepted draft nodes ``path`` of the last pass; its other rows are dropped.

        A chain-shaped path is already in place; other kept rows move to the front of the pass's
        positions (one gather on the sequence axis of the layer stack) at the start of the next pass,
        which carries their indices in its one host-to-device copy.
        """
        keep = np.concatenate([[0], np.asarray(path, dtype=np.int64)])
        start = self.lengths[slot]
        if not (keep == np.arange(keep.shape[0])).all():
            self._pending[slot] = (start, start + keep)
        self.lengths[slot] = start + int(keep.shape[0])

    @torch.inference_mode()
    def truncate(self, slot: int, length: int) -> None:
        """Forget slot ``slot``'s positions from ``length`` on (the next pass writes over them): its context becomes
        its first ``length`` tokens. goose-bench's memo rewinds a cache shared by several decoders."""
        if not 0 < length <= self.lengths[slot]:
            raise ValueError(f"slot {slot} holds {self.lengths[slot]} positions; cannot keep {length}")
        if slot in self._pending:  # the last commit's kept rows move into place first
            first, kept = self._pending.pop(slot)
            self.stack.move(slot, first, torch.from_numpy(kept).to(self.device))
        self.lengths[slot] = length

    @torch.inference_mode()
    def release(self, slot: int) -> int | None:
        """Free ``slot``; the last live slot's request moves into it. Returns the slot that moved (or None)."""
        last = self.live - 1
        self._pending.pop(slot, None)
        if slot != last:
            if last in self._pending:  # its kept rows move into place before the slot is copied
                first, kept = self._pending.pop(last)
                self.stack.move(last, first, torch.from_numpy(kept).to(self.device))
            self.stack.copy_slot(last, slot, self.lengths[last])
            self.lengths[slot] = self.lengths[last]
        self.lengths.pop()
        return last if slot != last else None


def pass_rows(tree: DraftTree, past: int, auxiliary: Sequence[AuxiliaryRows]) -> tuple[np.ndarray, ...]:
    """Tokens [r], positions [r] (int64) and the attention block bool [r, r] among one row's pass rows.

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


__all__ = ["CacheBudgetError", "ContextOverflowError", "Verifier"]
