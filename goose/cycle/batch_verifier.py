"""The batched verifier: several requests' draft trees through the target in one forward pass.

Each request owns a *slot* of a batched KV cache; the requests decoding now hold slots
``0 .. live - 1`` (a leaving request's slot is refilled by the last one's, so a pass always reads a
contiguous view). Slot i keeps its context at cache positions ``0 .. length_i - 1``: a position in
the cache is the token's position in its sequence, and each row is at its own length.

A pass pads every row's tree, followed by its auxiliary rows (Lookahead's window, laid out as the
single-request :func:`goose.cycle.verifier.pass_rows` lays them), to the largest one (``R`` rows) and
writes row i's keys at ``length_i .. length_i + R - 1``; the attention mask [live, 1, R, max(length) + R]
lets each row see its own context and its own pass rows only. Padding rows see only themselves and are
never read.
A commit keeps one row's accepted path and never touches another row's cache; kept rows that must
move travel in the pass's one host-to-device copy, as in :class:`goose.cycle.verifier.Verifier`.

A joining request's prompt runs as its own pass, into its slot alone, with the model's own causal
(and sliding-window) masks. Storage is zeroed when grown: padding columns are masked, but a masked
column must still hold finite numbers (a NaN times a zero weight is NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer

from goose.contract.outcome import AuxiliaryRows
from goose.contract.tree import DraftTree
from goose.cycle.verifier import ContextOverflowError, TargetModel, pass_rows


@dataclass
class _PassPlan:
    """Where the pass now running writes: slots ``first .. first + rows - 1``, row i from ``offsets[i]``."""

    first: int = 0
    offsets: torch.Tensor | None = None  # [rows] int64 on the device; None: every row at ``offset``
    offset: int = 0
    width: int = 0  # the keys a pass reads: max(offsets) + its rows
    flat: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # (heads, capacity) -> write rows

    def flat_rows(self, heads: int, capacity: int, length: int, device: torch.device) -> torch.Tensor:
        """Where the pass's keys [rows, heads, length, dim] go in a slot store flattened to [.., dim] (made once
        per pass and store shape, shared by the layers)."""
        key = (heads, capacity)
        if key not in self.flat:
            assert self.offsets is not None
            rows = self.offsets.shape[0]
            slot = (self.first + torch.arange(rows, device=device))[:, None, None] * (heads * capacity)
            head = torch.arange(heads, device=device)[None, :, None] * capacity
            position = self.offsets[:, None, None] + torch.arange(length, device=device)[None, None, :]
            self.flat[key] = (slot + head + position).flatten()
        return self.flat[key]


class SlotStore:
    """The keys and values of every layer in one tensor [layers, 2, slots, heads, capacity, dim].

    The model's layers join as they first see keys; they must share one shape (the usual case): a
    model whose layers differ in heads or head size is refused with a clear error.
    """

    def __init__(self, layers: int, slots: int, capacity: int | None = None) -> None:
        self.layers = layers
        self.slots = slots
        self.capacity = capacity  # the positions one slot may hold at most (None: as many as it needs)
        self.members: list[SlotLayer] = []
        self.store: torch.Tensor | None = None
        self.plan = _PassPlan()

    def join(self, layer: SlotLayer, key_states: torch.Tensor) -> int:
        if self.store is None:
            self.store = key_states.new_zeros((self.layers, 2, self.slots, key_states.shape[1], 0,
                                               key_states.shape[-1]))
        elif key_states.shape[1:2] + key_states.shape[-1:] != self.store.shape[3:4] + self.store.shape[-1:]:
            raise ValueError("batched decoding needs every layer's keys in one shape; this model's layers differ")
        if len(self.members) >= self.layers:
            raise ValueError("the model has more cache layers than its config's num_hidden_layers")
        self.members.append(layer)
        return len(self.members) - 1

    def reserve(self, needed: int) -> None:
        """Room for ``needed`` positions in every slot (doubling; zeroed, so masked columns stay finite)."""
        assert self.store is not None
        held = self.store.shape[-2]
        if needed <= held:
            return
        grown = max(needed, 2 * held, 256)
        if self.capacity is not None:
            if needed > self.capacity:
                raise CacheBudgetError(f"a pass needs {needed} positions a slot; the cache holds {self.capacity}")
            grown = min(grown, self.capacity)
        store = self.store.new_zeros((*self.store.shape[:-2], grown, self.store.shape[-1]))
        if held:
            store[..., :held, :] = self.store
        self.store = store

    def move(self, slot: int, start: int, rows: torch.Tensor) -> None:
        """In ``slot`` of every layer, move positions ``rows`` (ascending) to ``start, start + 1, ...``."""
        if self.store is not None:
            view = self.store[:, :, slot]
            view[..., start : start + rows.shape[0], :] = view.index_select(-2, rows)

    def copy_slot(self, source: int, target: int, length: int) -> None:
        if self.store is not None and length:
            self.store[:, :, target, :, :length] = self.store[:, :, source, :, :length]


class SlotLayer(DynamicLayer):
    """One layer's view of the :class:`SlotStore`: writes each row of a pass at that row's own offset."""

    def __init__(self, store: SlotStore) -> None:
        super().__init__()
        self.slots = store
        self.index = -1

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.index = self.slots.join(self, key_states)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        plan = self.slots.plan
        rows, heads, length, dim = key_states.shape
        self.slots.reserve(plan.width)
        store = self.slots.store
        assert store is not None
        if plan.offsets is None:
            keys = store[self.index, 0, plan.first : plan.first + rows]
            values = store[self.index, 1, plan.first : plan.first + rows]
            keys[:, :, plan.offset : plan.offset + length] = key_states
            values[:, :, plan.offset : plan.offset + length] = value_states
        else:  # each row at its own offset: one index copy into the layer's store seen as rows of ``dim``
            target = plan.flat_rows(heads, store.shape[-2], length, key_states.device)
            store[self.index, 0].view(-1, dim).index_copy_(0, target, key_states.reshape(-1, dim))
            store[self.index, 1].view(-1, dim).index_copy_(0, target, value_states.reshape(-1, dim))
            keys = store[self.index, 0, plan.first : plan.first + rows]
            values = store[self.index, 1, plan.first : plan.first + rows]
        self.keys, self.values = keys[:, :, : plan.width], values[:, :, : plan.width]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.slots.plan.offset if self.slots.plan.offsets is None else 0


class CacheBudgetError(ContextOverflowError):
    """A request needs more cache positions than a slot of the batch's cache budget holds."""


class BatchVerifier(TargetModel):
    """Owns the batched KV cache of up to ``slots`` requests: each request's prefill, the joint verify pass,
    and every row's commit.

    ``cache_positions``: the cache's budget, in positions over all slots (each slot holds an equal share,
    at most the model's context); None: each slot may grow to the model's context. The cache is
    allocated as it grows, so the budget bounds memory without reserving it up front.
    """

    def __init__(self, model: PreTrainedModel, slots: int, cache_positions: int | None = None) -> None:
        if slots < 1:
            raise ValueError(f"a batch needs at least one slot, got {slots}")
        if cache_positions is not None and cache_positions < slots * 2:
            raise ValueError(f"a cache budget of {cache_positions} positions is too small for {slots} slots")
        super().__init__(model)
        self.slots = slots
        self.slot_positions = min(self.max_positions, cache_positions // slots) if cache_positions else \
            self.max_positions
        self.store = SlotStore(self._layers, slots, self.slot_positions)
        self.cache = Cache(layer_class_to_replicate=partial(SlotLayer, self.store))
        self.lengths: list[int] = []  # per live slot: positions that belong to its context
        self._pending: dict[int, tuple[int, np.ndarray]] = {}  # slot -> (start, kept rows' positions) to move

    @property
    def live(self) -> int:
        return len(self.lengths)

    def check_fits(self, positions: int) -> None:
        """Refuse (CacheBudgetError) a request that may come to hold ``positions`` positions: more than a slot holds."""
        if positions > self.slot_positions:
            budget = ("the model's context" if self.slot_positions == self.max_positions else
                      f"a slot's share of the cache budget ({self.slots} slots)")
            raise CacheBudgetError(f"a request of up to {positions} positions (prompt + max_new_tokens) does not fit "
                                   f"{budget}: {self.slot_positions} positions; lower max_new_tokens")

    def full(self) -> list[int]:
        """The live slots at the model's last position: their requests end here (``context_full``)."""
        return [slot for slot, length in enumerate(self.lengths) if length >= self.max_positions - 1]

    def room(self) -> list[int]:
        """Per live slot, the draft nodes its next tree may hold (0: the anchor alone).

        Every row of a pass is padded to the widest tree and written from its own length, so the longest
        row bounds every row's tree within a slot's positions; the model's context bounds each row's own.
        """
        shared = self.slot_positions - 1 - max(self.lengths)
        return [max(0, min(self.max_positions - 1 - length, shared)) for length in self.lengths]

    @torch.inference_mode()
    def prefill(self, prompt_ids: list[int], logits_to_keep: int = 1) -> tuple[int, torch.Tensor]:
        """Run a joining request's prompt into the next free slot: (that slot, its last k positions' logits [k, V])."""
        if not prompt_ids:
            raise ValueError("empty prompt: give at least one token")
        if len(prompt_ids) >= self.max_positions:
            raise ContextOverflowError(
                f"prompt of {len(prompt_ids)} tokens does not fit the model's context of {self.max_positions}"
            )
        if self.live >= self.slots:
            raise RuntimeError(f"every one of the {self.slots} slots is taken")
        slot = self.live
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        self.store.plan = _PassPlan(first=slot, offset=0, width=len(prompt_ids))
        output = self.model(input_ids=input_ids, use_cache=True,
                            logits_to_keep=self.last_rows(len(prompt_ids), logits_to_keep),
                            **{self._cache_kwarg: self.cache})
        self.lengths.append(len(prompt_ids))
        return slot, output.logits[0]

    @torch.inference_mode()
    def verify(self, trees: list[DraftTree], auxiliary: Sequence[Sequence[AuxiliaryRows]] | None = None
               ) -> list[torch.Tensor]:
        """Logits [n_i + a_i, V] for every node of every live slot's tree (``trees[i]`` for slot i), then its
        auxiliary rows (``auxiliary[i]``, as :meth:`goose.cycle.verifier.Verifier.verify` takes them), in one pass.

        Each tree's anchor enters the cache here with its draft; call :meth:`commit` for every slot after.
        """
        if len(trees) != self.live:
            raise ValueError(f"{len(trees)} trees for {self.live} live slots")
        own = [pass_rows(tree, 0, auxiliary[i] if auxiliary else ()) for i, tree in enumerate(trees)]
        sizes = [row_tokens.shape[0] for row_tokens, _, _ in own]
        rows = max(sizes)
        live = self.live
        lengths = np.asarray(self.lengths, dtype=np.int64)
        if int(lengths.max()) + rows > self.slot_positions:
            raise ContextOverflowError(f"a pass of {rows} rows after {int(lengths.max())} positions does not fit a "
                                       f"slot's {self.slot_positions} positions")
        tokens = np.zeros((live, rows), dtype=np.int64)
        depths = np.zeros((live, rows), dtype=np.int64)
        block = np.zeros((live, rows, rows), dtype=np.int64)
        block[:, np.arange(rows), np.arange(rows)] = 1  # a padding row sees itself only
        for i, (row_tokens, offsets, row_block) in enumerate(own):
            n = sizes[i]
            tokens[i, :n], depths[i, :n], block[i, :n, :n] = row_tokens, offsets, row_block
        positions = lengths[:, None] + depths
        moves = sorted(self._pending.items())
        moved = [rows_ for _, (_, rows_) in moves]
        # the one host-to-device copy: tokens, positions, ancestor blocks, lengths, rows kept rows move from
        packed = torch.from_numpy(np.concatenate([tokens.ravel(), positions.ravel(), block.ravel(), lengths,
                                                  *moved])).to(self.device, non_blocking=True)
        cut = np.cumsum([live * rows, live * rows, live * rows * rows, live])
        tokens_t = packed[: cut[0]].view(live, rows)
        positions_t = packed[cut[0] : cut[1]].view(live, rows)
        block_t = packed[cut[1] : cut[2]].view(live, rows, rows).bool()
        lengths_t = packed[cut[2] : cut[3]]
        start = int(cut[3])
        for slot, (first, kept) in moves:
            self.store.move(slot, first, packed[start : start + kept.shape[0]])
            start += kept.shape[0]
        self._pending.clear()
        width = int(lengths.max()) + rows
        self.store.plan = _PassPlan(first=0, offsets=lengths_t, width=width)
        logits = self.tree_pass(self.cache, input_ids=tokens_t, position_ids=positions_t,
                                attention_mask=self._masks(lengths_t, positions_t, block_t, width))
        return [logits[i, :n] for i, n in enumerate(sizes)]

    def _masks(self, lengths: torch.Tensor, positions: torch.Tensor, block: torch.Tensor,
               width: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """The pass's attention mask(s) [live, 1, R, width], built on the device."""
        live, rows = positions.shape
        columns = torch.arange(width, device=self.device)
        context = columns[None, None, :] < lengths[:, None, None]  # [live, 1, width]
        relative = columns[None, :] - lengths[:, None]  # [live, width]: a column's row in the pass, if any
        in_pass = (relative >= 0) & (relative < rows)
        own = block.gather(2, relative.clamp(0, rows - 1)[:, None, :].expand(live, rows, width)) & in_pass[:, None]
        full = (context | own)[:, None]
        if self.sliding_window is None:
            return full
        # as in plain decoding, a row at position q sees a cached position k only when q - k < window
        seen = context & (positions[:, :, None] - columns[None, None, :] < self.sliding_window)
        masks = {"full_attention": full, "sliding_attention": (seen | own)[:, None]}
        return {kind: masks.get(kind, full) for kind in self.mask_kinds}

    def commit(self, slot: int, path: np.ndarray) -> None:
        """Keep slot ``slot``'s anchor and accepted draft nodes ``path`` of the last pass; the other rows are dropped.

        A chain-shaped path is already in place; other kept rows move at the start of the next pass.
        """
        keep = np.concatenate([[0], np.asarray(path, dtype=np.int64)])
        start = self.lengths[slot]
        if not (keep == np.arange(keep.shape[0])).all():
            self._pending[slot] = (start, start + keep)
        self.lengths[slot] = start + int(keep.shape[0])

    @torch.inference_mode()
    def release(self, slot: int) -> int | None:
        """Free ``slot``; the last live slot's request moves into it. Returns the slot that moved (or None)."""
        last = self.live - 1
        for pending_slot, (first, kept) in sorted(self._pending.items()):  # apply moves before slots shift
            self.store.move(pending_slot, first, torch.from_numpy(kept).to(self.device))
        self._pending.clear()
        if slot != last:
            self.store.copy_slot(last, slot, self.lengths[last])
            self.lengths[slot] = self.lengths[last]
        self.lengths.pop()
        return last if slot != last else None
