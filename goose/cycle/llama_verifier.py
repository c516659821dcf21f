"""The llama.cpp verifier: the draft trees of one request or of many in one ``llama_batch``, on a GGUF file as shipped.

It keeps :class:`goose.cycle.verifier.Verifier`'s interface (prefill, verify, commit, release, room),
so the same :class:`goose.cycle.session.Session`, sources, topologies, planner and walker run on it.
Only llama-cpp-python's public low-level bindings are used: ``llama_batch_init``, ``llama_decode``,
``llama_get_logits`` and the memory functions ``llama_memory_seq_cp`` / ``seq_rm``.

A tree rides in a batch as llama.cpp's sequences. Every leaf of a request's tree is a sequence
id; a node belongs to the sequences of the leaves below it (the root-to-leaf paths through it),
at position context + depth. The KV cache is unified (``kv_unified``): a cell holds one node's keys
once, whatever sequences it belongs to, and a row attends to the cells of its first sequence up
to its own position, which are the context and the node's ancestors: the tree attention mask,
built by llama.cpp from the sequence ids. The context is in every leaf's sequence (``seq_cp`` from
the request's main sequence before the pass); the batch asks logits for the tree's rows only.

Each request (slot) owns a pool of sequence ids. Between passes only its main sequence holds
cells: its context. A commit keeps the accepted path: the chosen leaf (one below the deepest
accepted node) becomes the main sequence, every other sequence of the pass is removed, and the
chosen path's nodes below the accepted ones are cut (``seq_rm`` from the first position not
kept). No key moves: llama.cpp finds a cell by its sequence and position, not by its index.

A rejected node's cell is not freed but handed to a *tombstone* sequence that no row reads.
llama.cpp fills the lowest free cells first, so a freed cell would soon hold a later token below
the cells of earlier positions, and its attention sums a row's cells in cell order (in half
precision, flash attention's values): a token out of order moved SmolLM2's logits by up to 0.7
and parted the output from ``ar``'s. With tombstones every sequence's cells stay in position order
and a tree's rows attend as the one-token rows do (on SmolLM2's file the rows are then equal bit for
bit: tests/test_llama_exactness.py; see goose.llama_model for files whose matmuls round a batch
otherwise). A released request's cells become tombstones too (the last request to leave empties the
cache). When a pass would not fit beside them they are all freed at once (``tombstone_frees`` counts
it): the freed cells are refilled out of position order and the rows after that round differently,
measured up to 1.7 logits from the one-token rows on SmolLM2 (5 freeings in 120 tokens of a 256-cell
context; the tokens stayed ``ar``'s there, tests/test_llama_exactness.py), so a near-tie can flip.

A pass that is not committed (the calibration's) is forgotten at the start of the next one.
The logits of a verify pass are views of llama.cpp's output buffer: valid until the next pass
(the cycle reads them before it); a prefill's are copied (a session keeps them a step).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from goose.contract.outcome import AuxiliaryRows
from goose.contract.tree import DraftTree
from goose.cycle.verifier import CacheBudgetError, ContextOverflowError
from goose.llama_model import LlamaEngineError, LlamaModel, bindings, recent_errors

MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ
SLOT_SEQUENCES = 64  # sequence ids a request's pool holds at most: its tree's leaves, so its draft rows
BATCH_TOKENS = 2048  # tokens one llama_decode takes: a prompt is fed in pieces of this many
_ANCHOR_ONLY = np.ones((1, 1), dtype=np.bool_)  # the membership of a one-node pass: the anchor on the main sequence
_ANCHOR_ONLY.flags.writeable = False


@dataclass
class _Slot:
    """One request's part of the context: its sequence ids, its main one, and its pass awaiting a commit."""

    pool: np.ndarray  # int32 sequence ids this request owns
    main: int  # the sequence that holds its context between passes
    length: int = 0  # positions in its context (the anchor of the next pass sits at this position)
    leaves: np.ndarray | None = None  # the last pass's leaf sequence ids (None: no pass awaits a commit)
    member: np.ndarray | None = None  # bool [nodes, leaves]: node i lies on leaf k's root path


class LlamaVerifier:
    """Owns a llama.cpp context holding up to ``slots`` requests; the interface of
    :class:`goose.cycle.verifier.Verifier`.

    ``cache_positions``: KV cells over all slots (each slot an equal share, at most the model's
    context); None: each slot holds ``model.context`` positions. The cells are reserved when the
    verifier is made (llama.cpp allocates its KV cache up front).
    """

    def __init__(self, model: LlamaModel, slots: int = 1, cache_positions: int | None = None,
                 batch_tokens: int = BATCH_TOKENS) -> None:
        if slots < 1:
            raise ValueError(f"max_batch must be at least 1, got {slots}")
        if slots > MAX_SEQUENCES:
            raise ValueError(f"llama.cpp holds {MAX_SEQUENCES} sequences at most: max_batch {slots} is too many")
        if cache_positions is not None and cache_positions < slots * 2:
            raise ValueError(f"a cache budget of {cache_positions} positions is too small for {slots} slots")
        self.llama = bindings()
        self.model = model
        self.slots = slots
        self.vocab_size = model.vocab_size
        self.max_positions = model.context
        self.sliding_window = None  # llama.cpp keeps a sliding-window layer's cache itself
        self.budgeted = cache_positions is not None and cache_positions // slots < self.max_positions
        self.slot_positions = cache_positions // slots if self.budgeted and cache_positions else self.max_positions
        self.pool_size = min(SLOT_SEQUENCES, (MAX_SEQUENCES - 1) // slots)
        sequences = self.pool_size * slots + 1
        self.tombstone = sequences - 1  # the sequence of rejected and released cells (see the module's docstring)
        self.cells = self.slot_positions * slots
        if not 1 <= batch_tokens <= BATCH_TOKENS:
            raise ValueError(f"batch_tokens must be in [1, {BATCH_TOKENS}], got {batch_tokens}")
        self.batch_tokens = batch_tokens
        self.context = model.new_context(self.cells, sequences, BATCH_TOKENS)
        self.memory = self.llama.llama_get_memory(self.context)
        recent_errors()  # the context's warnings (a training context exceeded by slots x positions) are not a decode's
        self.tombstone_frees = 0  # times the tombstones were freed to make room (see the module's docstring)
        self._make_batch(sequences)
        self._pools = [np.arange(i * self.pool_size, (i + 1) * self.pool_size, dtype=np.int32) for i in range(slots)]
        self.reset()

    def close(self) -> None:
        """Free the context and the batch (the verifier is unusable after)."""
        if getattr(self, "context", None):
            self.llama.llama_free(self.context)
            self.context = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the bindings may be gone: the process frees it
            self.close()

    def _make_batch(self, sequences: int) -> None:
        """The ``llama_batch`` every decode passes, over arrays this verifier owns (not ``llama_batch_init``'s): a
        pass's tokens, positions, sequence counts, output flags and its rows' sequence ids ([rows, sequences], one
        contiguous matrix whose row pointers are the batch's ``seq_id``) are written as whole-array operations."""
        llama, rows = self.llama, BATCH_TOKENS
        self._tokens = np.zeros(rows, dtype=np.int32)
        self._positions = np.zeros(rows, dtype=np.int32)
        self._counts = np.zeros(rows, dtype=np.int32)
        self._outputs = np.zeros(rows, dtype=np.int8)
        self._sequences = np.zeros((rows, sequences), dtype=np.int32)
        # llama_seq_id * [rows + 1]: row i's sequence ids, then NULL (as llama_batch_init ends its array)
        self._sequence_rows = self._sequences.ctypes.data + np.arange(rows + 1, dtype=np.uintp) * np.uintp(
            self._sequences.strides[0])
        self._sequence_rows[-1] = 0
        self._arange = np.arange(rows, dtype=np.int32)
        batch = llama.llama_batch()
        batch.token = self._tokens.ctypes.data_as(ctypes.POINTER(llama.llama_token))
        batch.pos = self._positions.ctypes.data_as(ctypes.POINTER(llama.llama_pos))
        batch.n_seq_id = self._counts.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.seq_id = self._sequence_rows.ctypes.data_as(ctypes.POINTER(ctypes.POINTER(llama.llama_seq_id)))
        batch.logits = self._outputs.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.batch = batch
        self._logits_view: tuple[int, int, np.ndarray] | None = None  # (address, rows, view) of the last read

    def reset(self) -> None:
        """Drop every slot and every cell of the KV cache."""
        self.llama.llama_memory_clear(self.memory, False)
        self.buried = 0  # cells the tombstone sequence holds
        self._slots: list[_Slot] = []
        self._free = list(range(self.slots))  # pools not held by a live slot

    @property
    def lengths(self) -> list[int]:
        return [slot.length for slot in self._slots]

    @property
    def live(self) -> int:
        return len(self._slots)

    def check_fits(self, positions: int) -> None:
        """As :meth:`goose.cycle.verifier.Verifier.check_fits`."""
        if self.budgeted and positions > self.slot_positions:
            raise CacheBudgetError(f"a request of up to {positions} positions (prompt + max_new_tokens) does not fit "
                                   f"a slot's share of the cache budget ({self.slots} slots): {self.slot_positions} "
                                   f"positions; lower max_new_tokens")

    def full(self) -> list[int]:
        return [i for i, slot in enumerate(self._slots) if slot.length >= self.slot_positions - 1]

    def room(self) -> list[int]:
        """Per live slot, the rows after the anchor its next pass may hold: its free positions, and no more draft
        rows than its pool has sequence ids (a tree of r draft rows has at most r leaves)."""
        return [max(0, min(self.slot_positions - 1 - slot.length, self.pool_size)) for slot in self._slots]

    def _held(self) -> int:
        """Cells the live slots' contexts and the tombstones hold."""
        return sum(slot.length for slot in self._slots) + self.buried

    def prefill(self, prompt_ids: list[int], logits_to_keep: int = 1) -> torch.Tensor:
        """Run a joining request's prompt into the next free slot (in pieces of ``batch_tokens``); the logits
        [k, V] of its last k positions (a copy).

        A decode that fails (llama.cpp refuses a piece) leaves no trace: the request takes no slot and the
        pieces before it are removed from the KV cache (the cache is cleared when no other request is live), so
        the next request decodes as it would have without it."""
        if not prompt_ids:
            raise ValueError("empty prompt: give at least one token")
        if len(prompt_ids) >= self.max_positions:
            raise ContextOverflowError(
                f"prompt of {len(prompt_ids)} tokens does not fit the model's context of {self.max_positions}")
        if len(prompt_ids) >= self.slot_positions:
            raise CacheBudgetError(f"prompt of {len(prompt_ids)} tokens does not fit a slot's {self.slot_positions} "
                                   "positions")
        if self.live >= self.slots:
            raise RuntimeError(f"every one of the {self.slots} slots is taken")
        for live in self._slots:
            self._forget(live)
        if self._held() + len(prompt_ids) > self.cells:
            self._free_tombstones()
        index = self._free.pop(0)
        pool = self._pools[index]
        slot = _Slot(pool=pool, main=int(pool[0]))
        ids = np.asarray(prompt_ids, dtype=np.int32)
        count = ids.shape[0]
        first_kept = count - max(1, min(logits_to_keep, count))
        rows = []
        try:
            for start in range(0, count, self.batch_tokens):
                n = min(self.batch_tokens, count - start)
                self._tokens[:n] = ids[start : start + n]
                self._positions[:n] = self._arange[:n]
                self._positions[:n] += start
                self._counts[:n] = 1
                self._sequences[:n, 0] = slot.main
                skipped = min(n, max(0, first_kept - start))  # this piece's rows before the first kept one
                self._outputs[:skipped] = 0
                self._outputs[skipped:n] = 1
                self._decode(n)
                if skipped < n:
                    rows.append(self._logits(n - skipped).copy())
        except BaseException:
            self._free.insert(0, index)
            if self._slots:
                self.llama.llama_memory_seq_rm(self.memory, slot.main, -1, -1)
            else:  # as after the last request's release: an empty cache
                self.reset()
            raise
        slot.length = count
        self._slots.append(slot)
        return torch.from_numpy(np.concatenate(rows) if len(rows) > 1 else rows[0])

    def verify(self, trees: Sequence[DraftTree], auxiliary: Sequence[Sequence[AuxiliaryRows]] | None = None
               ) -> list[torch.Tensor]:
        """Logits [n_i, V] of every node of live slot i's tree ``trees[i]``, all in one ``llama_decode``.

        Each tree's anchor (node 0) is not yet in the cache; it enters here with its draft. Call
        :meth:`commit` for every slot before the next pass (without a commit the pass is forgotten).
        """
        if len(trees) != self.live:
            raise ValueError(f"{len(trees)} trees for {self.live} live slots")
        if auxiliary is not None and any(len(rows) for rows in auxiliary):
            raise ValueError("the llama.cpp engine verifies trees only: auxiliary rows (lookahead's window) need an "
                             "attention mask of their own")
        sizes = [tree.size for tree in trees]
        total = sum(sizes)
        if total > self.batch_tokens:
            raise ValueError(f"a pass of {total} rows is more than the {self.batch_tokens} one llama_decode takes")
        for slot in self._slots:
            if slot.leaves is not None:
                self._forget(slot)
        if self._held() + total > self.cells:
            self._free_tombstones()
        row = 0
        for slot, tree in zip(self._slots, trees, strict=True):
            if slot.length + tree.size > self.slot_positions:
                raise ContextOverflowError(f"a pass of {tree.size} rows after {slot.length} positions does not fit a "
                                           f"slot's {self.slot_positions} positions")
            row = self._lay(slot, tree, row)
        self._decode(total)
        logits = torch.from_numpy(self._logits(total))
        return [logits] if len(sizes) == 1 else list(logits.split(sizes))

    def _lay(self, slot: _Slot, tree: DraftTree, row: int) -> int:
        """Write ``slot``'s tree into the batch from ``row``: tokens, positions, the sequences of each node's
        root-to-leaf paths; give every leaf but the first its own sequence holding the context. Returns the next
        free row. Array operations throughout: the only per-leaf work is llama.cpp's ``seq_cp`` of the context."""
        n = tree.size
        end = row + n
        self._outputs[row:end] = 1
        if n == 1:  # the anchor alone (plain decoding): one row in the main sequence
            self._tokens[row] = tree.tokens[0]
            self._positions[row] = slot.length
            self._counts[row] = 1
            self._sequences[row, 0] = slot.main
            slot.leaves, slot.member = np.array([slot.main], dtype=np.int32), _ANCHOR_ONLY
            return end
        has_child = np.zeros(n, dtype=np.bool_)
        has_child[tree.parents[1:]] = True
        leaves = np.flatnonzero(~has_child)
        count = leaves.shape[0]
        if count > slot.pool.shape[0]:
            raise ValueError(f"a tree of {count} leaves is more than a slot's {slot.pool.shape[0]} sequences")
        others = slot.pool[slot.pool != slot.main][: count - 1]
        sequences = np.concatenate((np.array([slot.main], dtype=np.int32), others))
        for sequence in others.tolist():  # a leaf's sequence sees the context: the cells of the main sequence
            self.llama.llama_memory_seq_cp(self.memory, slot.main, sequence, -1, -1)
        member = tree.ancestors[leaves].T  # [n, leaves]: node i is on the root path of leaf k
        self._tokens[row:end] = tree.tokens
        self._positions[row:end] = tree.depths
        self._positions[row:end] += slot.length
        self._counts[row:end] = member.sum(axis=1)
        # row i's sequences: its leaves' in leaf order (the first is the one its attention reads), then unread ones
        self._sequences[row:end, :count] = sequences[np.argsort(~member, axis=1, kind="stable")]
        slot.leaves, slot.member = sequences, member
        return end

    def commit(self, slot_index: int, path: np.ndarray) -> None:
        """Keep slot ``slot_index``'s anchor and accepted draft nodes ``path`` of the last pass: a leaf below the
        deepest of them becomes the main sequence; the pass's other sequences and that leaf's nodes past the
        path are removed from the KV cache. A pass whose every node is kept (a chain accepted whole, the anchor
        alone) had one leaf, the main sequence, and nothing past the path: the cache is left as it is."""
        slot = self._slots[slot_index]
        assert slot.leaves is not None and slot.member is not None, "commit without a pass"
        kept = len(path) + 1
        end = slot.length + kept
        rejected = slot.member.shape[0] - kept
        if rejected:  # the rejected nodes' cells go to the tombstone (kept ones may carry it too: harmless)
            deepest = int(path[-1]) if len(path) else 0
            chosen = int(slot.leaves[int(np.argmax(slot.member[deepest]))])
            for sequence in slot.leaves.tolist():
                if sequence != chosen:
                    self.llama.llama_memory_seq_cp(self.memory, sequence, self.tombstone, slot.length, -1)
            self.llama.llama_memory_seq_cp(self.memory, chosen, self.tombstone, end, -1)
            self.buried += rejected
            for sequence in slot.leaves.tolist():
                if sequence != chosen:
                    self.llama.llama_memory_seq_rm(self.memory, sequence, -1, -1)
            self.llama.llama_memory_seq_rm(self.memory, chosen, end, -1)
            slot.main = chosen
        slot.length = end
        slot.leaves = slot.member = None

    def _forget(self, slot: _Slot) -> None:
        """Remove an uncommitted pass's cells: its leaves' sequences, and the main sequence past the context."""
        if slot.leaves is None:
            return
        for sequence in slot.leaves:
            if sequence != slot.main:
                self.llama.llama_memory_seq_rm(self.memory, int(sequence), -1, -1)
        self.llama.llama_memory_seq_rm(self.memory, slot.main, slot.length, -1)
        slot.leaves = slot.member = None

    def release(self, slot_index: int) -> int | None:
        """Free ``slot_index``; the last live slot's request moves into it. Returns the slot that moved (or None)."""
        slot = self._slots[slot_index]
        if self.live == 1:  # the last request leaves: the next one starts from an empty cache, as ar's first does
            self.reset()
            return None
        self._forget(slot)
        self.llama.llama_memory_seq_cp(self.memory, slot.main, self.tombstone, -1, -1)
        self.llama.llama_memory_seq_rm(self.memory, slot.main, -1, -1)
        self.buried += slot.length
        self._free.append(int(slot.pool[0]) // self.pool_size)
        last = self.live - 1
        if slot_index != last:
            self._slots[slot_index] = self._slots[last]
        self._slots.pop()
        return last if slot_index != last else None

    def _free_tombstones(self) -> None:
        self.llama.llama_memory_seq_rm(self.memory, self.tombstone, -1, -1)
        self.buried = 0
        self.tombstone_frees += 1

    def kept_positions(self, slot_index: int) -> tuple[int, int]:
        """(first, last) position the main sequence of ``slot_index`` holds in the KV cache (-1, -1: none)."""
        main = self._slots[slot_index].main
        return (int(self.llama.llama_memory_seq_pos_min(self.memory, main)),
                int(self.llama.llama_memory_seq_pos_max(self.memory, main)))

    def _decode(self, tokens: int) -> None:
        self.batch.n_tokens = tokens
        status = self.llama.llama_decode(self.context, self.batch)
        if status == 1:
            raise ContextOverflowError(f"llama.cpp found no room for {tokens} tokens in its KV cache")
        if status != 0:
            raise LlamaEngineError(f"llama_decode failed (status {status}) on a batch of {tokens} tokens: "
                                   f"{recent_errors() or 'no reason given'}")

    def _logits(self, rows: int) -> np.ndarray:
        """The last decode's output rows [rows, V], a view of llama.cpp's buffer (valid until the next decode).

        The buffer moves only when llama.cpp grows it for more outputs: a view made once is kept while it stays."""
        address = ctypes.cast(self.llama.llama_get_logits(self.context), ctypes.c_void_p).value
        cached = self._logits_view
        if cached is None or cached[0] != address or cached[1] < rows:
            view = np.ctypeslib.as_array(ctypes.cast(address, ctypes.POINTER(ctypes.c_float)),
                                         shape=(rows, self.vocab_size))
            cached = self._logits_view = (address, rows, view)
        return cached[2][:rows]
