"""The target's answers kept: a memo through which a study runs each verify row once.

In float32 on the torch engine a verified row's answer, its greedy token and the top-k logits the
harvest reads, is a function of the model, its numeric settings and the row's token path (the
prompt, the committed tokens, the draft nodes down to the row): the lossless tests rely on it. A
study runs many methods over the same prompts, and in float32 every lossless method commits the
same tokens, so most rows one method verifies another has verified before: the same anchor rows,
the same accepted drafts, often the same rejected ones.

:class:`TargetMemo` keeps those answers: per prompt a trie of token paths after the prompt (node 0
is the empty path; a node's answer is the row of its last token), the top ``MEMO_TOP_K`` logits of
each answered row, the prompt's last rows, and the auxiliary rows (Lookahead's window) keyed by the
anchor's node and the (offset, token) pairs each row sees. On disk: one file a prompt under a folder
named by the fingerprint of the model and settings, so a re-run, or another study on the same model,
starts from what the last one computed.

:class:`MemoVerifier` is a decoder's verifier over it (:class:`goose.cycle.engine.Verifying`, one
request at a time). It answers every row it has; a cycle with a missing row runs one real pass of
the missing rows, their ancestors and the committed tokens the real cache lacks, through a real
:class:`goose.cycle.verifier.Verifier` the memo keeps for the prompt (one cache, shared by every
method in turn: they commit the same tokens). Whatever the route, the decoder reads a row's stored
answer, rebuilt as a row of -inf with its top-k logits in place, so the argmax, the top-k and their
softmax are those of the row, up to the order of logits tied exactly at the k-th place.

Where an answer is not a function of the path it refuses (:func:`refusal`): bfloat16 and the engines'
quantized kernels round by the pass's shape. Sampled decoding, log probabilities and grammars read the
whole distribution, which the memo does not keep: the bench runs those for real.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from goose import AuxiliaryRows, DraftTree
from goose.cpu import cpu_kind
from goose.cycle.readout import greedy_and_top_k
from goose.cycle.verifier import Verifier
from goose.quantize import quantized
from goose.store.cache_dir import default_cache_dir

MEMO_TOP_K = 16  # logits kept per row: a decoder reading more (harvest_top_k > 16) is refused
MEMO_FORMAT = 1
PROMPT_ROWS = 256  # a real prefill keeps at least this many prompt rows, for the methods that harvest more


def refusal(model: Any) -> str | None:
    """Why the memo cannot be exact for ``model`` (None: it can)."""
    if not isinstance(model, torch.nn.Module):
        return "the memo keeps torch models' answers; llama.cpp's batched kernels round by the batch's shape"
    if quantized(model) is not None:
        return "int8 linears round by the pass's shape: an answer is not a function of the token path"
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        name = str(dtype).removeprefix("torch.")
        return f"{name} rounds by the pass's shape (a near-tie can flip): the memo needs float32"
    return None


def fingerprint(model: torch.nn.Module) -> dict[str, Any]:
    """What an answer depends on besides its path: the weights, the numeric settings, the CPU's kernels."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy())  # the buffer: no copy
    parameter = next(model.parameters())
    return {"format": MEMO_FORMAT, "model": getattr(model.config, "_name_or_path", "") or model.config.model_type,
            "weights_sha256": digest.hexdigest(), "dtype": str(parameter.dtype).removeprefix("torch."),
            "device": parameter.device.type, "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "cpu": cpu_kind(), "top_k": MEMO_TOP_K}


@dataclass
class MemoCounts:
    """What one request cost through the memo: rows answered from it, and the real work it still needed."""

    answered_rows: int = 0  # rows (prompt rows included) read from the memo
    computed_rows: int = 0  # rows of real passes: the missing ones, their ancestors and catch-up tokens
    passes: int = 0  # real verify passes
    prefills: int = 0  # real prefills

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class PromptMemo:
    """The answers for one prompt: its last rows, a trie of the token paths after it, and auxiliary rows."""

    def __init__(self, prompt: np.ndarray, k: int) -> None:
        self.prompt = prompt
        self.k = k
        self.prompt_ids = np.zeros((0, k), dtype=np.int32)  # the last prompt rows' top-k (row i predicts i + 1)
        self.prompt_logits = np.zeros((0, k), dtype=np.float32)
        self.parents = np.full(64, -1, dtype=np.int64)
        self.tokens = np.full(64, -1, dtype=np.int64)
        self.known = np.zeros(64, dtype=np.bool_)
        self.top_ids = np.zeros((64, k), dtype=np.int32)
        self.top_logits = np.zeros((64, k), dtype=np.float32)
        self.nodes = 1  # node 0: the empty path, answered by the prompt's last row
        self.children: dict[tuple[int, int], int] = {}
        self.aux: dict[bytes, int] = {}  # key -> index into aux_ids / aux_logits
        self.aux_ids = np.zeros((0, k), dtype=np.int32)
        self.aux_logits = np.zeros((0, k), dtype=np.float32)
        self.changed = False

    def node(self, parent: int, token: int) -> int:
        """The trie node of ``parent``'s path followed by ``token`` (made if new, unanswered)."""
        key = (parent, token)
        found = self.children.get(key)
        if found is not None:
            return found
        if self.nodes == self.parents.shape[0]:
            grown = 2 * self.nodes
            self.parents = np.resize(self.parents, grown)
            self.tokens = np.resize(self.tokens, grown)
            self.known = np.concatenate([self.known, np.zeros(grown - self.nodes, dtype=np.bool_)])
            self.top_ids = np.concatenate([self.top_ids, np.zeros((grown - self.nodes, self.k), dtype=np.int32)])
            self.top_logits = np.concatenate([self.top_logits, np.zeros((grown - self.nodes, self.k),
                                                                         dtype=np.float32)])
        made = self.nodes
        self.parents[made], self.tokens[made] = parent, token
        self.nodes += 1
        self.children[key] = made
        return made

    def keep(self, nodes: np.ndarray, ids: np.ndarray, logits: np.ndarray) -> None:
        """Answers for ``nodes``; a node answered before keeps its first answer (every reader sees one)."""
        new = ~self.known[nodes]
        if new.any():
            chosen = nodes[new]
            self.top_ids[chosen], self.top_logits[chosen] = ids[new], logits[new]
            self.known[chosen] = True
            self.changed = True

    def keep_prompt(self, ids: np.ndarray, logits: np.ndarray) -> None:
        """The last ``len(ids)`` prompt rows' answers (more than were kept: the new ones in front)."""
        have = self.prompt_ids.shape[0]
        if ids.shape[0] > have:
            extra = ids.shape[0] - have
            self.prompt_ids = np.concatenate([ids[:extra], self.prompt_ids])
            self.prompt_logits = np.concatenate([logits[:extra], self.prompt_logits])
            self.changed = True

    def keep_aux(self, keys: list[bytes], ids: np.ndarray, logits: np.ndarray) -> None:
        new = [i for i, key in enumerate(keys) if key not in self.aux]
        if new:
            start = self.aux_ids.shape[0]
            for offset, i in enumerate(new):
                self.aux[keys[i]] = start + offset
            self.aux_ids = np.concatenate([self.aux_ids, ids[new]])
            self.aux_logits = np.concatenate([self.aux_logits, logits[new]])
            self.changed = True

    def save(self, path: Path) -> None:
        """Write atomically (a reader never sees half a file)."""
        keys = list(self.aux)
        lengths = np.asarray([len(key) for key in keys], dtype=np.int64)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
        n = self.nodes
        np.savez(temporary, prompt=self.prompt, prompt_ids=self.prompt_ids, prompt_logits=self.prompt_logits,
                 parents=self.parents[:n], tokens=self.tokens[:n], known=self.known[:n], top_ids=self.top_ids[:n],
                 top_logits=self.top_logits[:n], aux_keys=np.frombuffer(b"".join(keys), dtype=np.uint8),
                 aux_lengths=lengths, aux_rows=np.asarray([self.aux[key] for key in keys], dtype=np.int64),
                 aux_ids=self.aux_ids, aux_logits=self.aux_logits)
        temporary.replace(path)
        self.changed = False

    @classmethod
    def load(cls, path: Path, prompt: np.ndarray, k: int) -> PromptMemo:
        memo = cls(prompt, k)
        with np.load(path) as data:
            if not np.array_equal(data["prompt"], prompt) or data["top_ids"].shape[1] != k:
                return memo  # a hash collision or another format: start over
            memo.prompt_ids, memo.prompt_logits = data["prompt_ids"], data["prompt_logits"]
            memo.parents, memo.tokens, memo.known = data["parents"].copy(), data["tokens"].copy(), data["known"].copy()
            memo.top_ids, memo.top_logits = data["top_ids"].copy(), data["top_logits"].copy()
            memo.nodes = int(memo.parents.shape[0])
            memo.children = dict(zip(zip(memo.parents[1:].tolist(), memo.tokens[1:].tolist(), strict=True),
                                     range(1, memo.nodes), strict=True))
            raw, bounds = data["aux_keys"].tobytes(), np.concatenate([[0], np.cumsum(data["aux_lengths"])])
            memo.aux = {raw[bounds[i] : bounds[i + 1]]: int(row) for i, row in enumerate(data["aux_rows"])}
            memo.aux_ids, memo.aux_logits = data["aux_ids"], data["aux_logits"]
        return memo


class TargetMemo:
    """The memo of one model's answers, on disk under ``folder`` (default: Goose's cache), and the real verifier
    that computes what it lacks. Open it once per model and give each decoder :meth:`verifier`."""

    def __init__(self, model: torch.nn.Module, folder: Path | None = None) -> None:
        reason = refusal(model)
        if reason is not None:
            raise ValueError(f"the memo cannot be exact here: {reason}")
        self.model = model
        self.settings = fingerprint(model)
        key = hashlib.sha256(json.dumps(self.settings, sort_keys=True).encode()).hexdigest()[:20]
        self.folder = (folder if folder is not None else default_cache_dir() / "memo") / key
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "settings.json").write_text(json.dumps(self.settings, indent=1) + "\n")
        self.real = Verifier(model, 1)
        self.vocab_size, self.max_positions = self.real.vocab_size, self.real.max_positions
        self.cached = np.zeros(0, dtype=np.int64)  # the tokens whose keys the real verifier's slot holds
        self.current: PromptMemo | None = None
        self.k = min(MEMO_TOP_K, self.vocab_size)

    def verifier(self) -> MemoVerifier:
        return MemoVerifier(self)

    def open(self, prompt_ids: list[int]) -> PromptMemo:
        """The memo of ``prompt_ids`` (the last one opened is kept in memory; another is written first)."""
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        if self.current is not None and np.array_equal(self.current.prompt, prompt):
            return self.current
        self.flush()
        path = self._path(prompt)
        self.current = PromptMemo.load(path, prompt, self.k) if path.exists() else PromptMemo(prompt, self.k)
        return self.current

    def flush(self) -> None:
        """Write the open prompt's answers if they grew."""
        if self.current is not None and self.current.changed:
            self.current.save(self._path(self.current.prompt))

    def _path(self, prompt: np.ndarray) -> Path:
        return self.folder / f"{hashlib.sha256(prompt.astype(np.int64).tobytes()).hexdigest()[:24]}.npz"

    # --- the real work, for what the memo lacks ------------------------------------------------

    def top(self, logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        _, ids, values = greedy_and_top_k(logits, self.k)
        return ids.to(torch.int32).cpu().numpy(), values.float().cpu().numpy()

    def prefill(self, memo: PromptMemo, keep: int, counts: MemoCounts) -> None:
        """A real prefill of the prompt into the real cache, keeping at least ``keep`` of its last rows."""
        prompt = memo.prompt
        keep = max(keep, min(PROMPT_ROWS, prompt.shape[0]))
        self._restart(prompt, keep, counts)

    def catch_up(self, context: np.ndarray, merge: bool, counts: MemoCounts) -> np.ndarray:
        """Bring the real cache to ``context``; returns the tokens still missing at its end, for the next pass to
        carry in front of its tree (with ``merge``), else runs them now (a chain pass of their own)."""
        common = _common_prefix(self.cached, context)
        if self.real.live == 0 or common == 0:
            self._restart(context, 1, counts)
            return context[:0]
        self.real.truncate(0, common)
        self.cached = self.cached[:common]
        chain = context[common:]
        if chain.shape[0] == 0 or merge:
            return chain
        self.real.verify([_chain_tree(chain)])
        self.real.commit(0, np.arange(1, chain.shape[0], dtype=np.int64))
        self.cached = context.copy()
        counts.passes += 1
        counts.computed_rows += int(chain.shape[0])
        return context[:0]

    def _restart(self, context: np.ndarray, keep: int, counts: MemoCounts) -> None:
        """A real prefill of ``context`` (the prompt, or the prompt and what followed it) into a fresh slot."""
        if self.real.live:
            self.real.release(0)
        logits = self.real.prefill(context.tolist(), keep)
        self.cached = context.copy()
        counts.prefills += 1
        counts.computed_rows += int(context.shape[0])
        memo = self.current
        if memo is not None and context.shape[0] == memo.prompt.shape[0]:
            ids, values = self.top(logits)
            memo.keep_prompt(ids, values)


class MemoVerifier:
    """A decoder's verifier over a :class:`TargetMemo`: one request at a time, every answer from the memo,
    one real pass for the rows it lacks (see the module's docstring)."""

    slots = 1

    def __init__(self, memo: TargetMemo) -> None:
        self.memo = memo
        self.model = memo.model
        self.vocab_size, self.max_positions = memo.vocab_size, memo.max_positions
        self.prompt: PromptMemo | None = None
        self.context = np.zeros(0, dtype=np.int64)  # the committed tokens (the next anchor not among them)
        self.path_nodes: list[int] = [0]  # the trie node of each output prefix of the context (the empty one first)
        self.last: tuple[DraftTree, np.ndarray] | None = None  # the last pass's tree and its nodes
        self.counts = MemoCounts()

    # --- the slot ---------------------------------------------------------------------------------

    @property
    def lengths(self) -> list[int]:
        return [int(self.context.shape[0])] if self.prompt is not None else []

    @property
    def live(self) -> int:
        return 1 if self.prompt is not None else 0

    def check_fits(self, positions: int) -> None:
        self.memo.real.check_fits(positions)

    def full(self) -> list[int]:
        return [0] if self.prompt is not None and self.context.shape[0] >= self.max_positions - 1 else []

    def room(self) -> list[int]:
        return [max(0, self.max_positions - 1 - length) for length in self.lengths]

    def release(self, slot: int) -> int | None:
        self.prompt, self.last = None, None
        self.memo.flush()
        return None

    def reset(self) -> None:
        self.release(0)

    # --- the cycle's calls ------------------------------------------------------------------------

    def prefill(self, prompt_ids: list[int], logits_to_keep: int = 1) -> torch.Tensor:
        if not prompt_ids:
            raise ValueError("empty prompt: give at least one token")
        self.memo.real.check_fits(len(prompt_ids))
        memo = self.prompt = self.memo.open(prompt_ids)
        self.context, self.path_nodes, self.counts = memo.prompt.copy(), [0], MemoCounts()
        keep = max(1, min(logits_to_keep, len(prompt_ids)))
        if memo.prompt_ids.shape[0] < keep:
            self.memo.prefill(memo, keep, self.counts)
        else:
            self.counts.answered_rows += keep
        return self._dense(memo.prompt_ids[-keep:], memo.prompt_logits[-keep:])

    def verify(self, trees: Any, auxiliary: Any = None) -> list[torch.Tensor]:
        memo = self.prompt
        if memo is None or len(trees) != 1:
            raise ValueError(f"{len(trees)} trees for {self.live} live slots")
        tree = trees[0]
        rows = list(auxiliary[0]) if auxiliary else []
        nodes = np.empty(tree.size, dtype=np.int64)
        nodes[0] = memo.node(self.path_nodes[-1], int(tree.tokens[0]))
        parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
        for i in range(1, tree.size):
            nodes[i] = memo.node(int(nodes[parents[i]]), tokens[i])
        aux_keys = _aux_keys(int(nodes[0]), rows)
        missing = ~memo.known[nodes]
        aux_missing = any(key not in memo.aux for key in aux_keys)
        if missing.any() or aux_missing:
            self._compute(tree, nodes, missing, rows if aux_missing else [], aux_keys)
        answered = tree.size + len(aux_keys)
        self.counts.answered_rows += answered - int(missing.sum()) - (len(aux_keys) if aux_missing else 0)
        self.last = (tree, nodes)
        ids, logits = memo.top_ids[nodes], memo.top_logits[nodes]
        if aux_keys:
            where = [memo.aux[key] for key in aux_keys]
            ids = np.concatenate([ids, memo.aux_ids[where]])
            logits = np.concatenate([logits, memo.aux_logits[where]])
        return [self._dense(ids, logits)]

    def commit(self, slot: int, path: np.ndarray) -> None:
        assert self.last is not None, "commit follows a verify"
        tree, nodes = self.last
        kept = np.concatenate([[0], np.asarray(path, dtype=np.int64)])
        self.context = np.concatenate([self.context, tree.tokens[kept]])
        self.path_nodes.extend(nodes[kept].tolist())
        self.last = None

    # --- a pass for what is missing ----------------------------------------------------------------

    def _compute(self, tree: DraftTree, nodes: np.ndarray, missing: np.ndarray, rows: list[AuxiliaryRows],
                 aux_keys: list[bytes]) -> None:
        """One real pass: the committed tokens the real cache lacks, then the missing nodes with their ancestors
        (the anchor always), then the auxiliary rows when any is missing (whose rows see the anchor, so the
        catch-up then runs first)."""
        memo, real, counts = self.memo, self.memo.real, self.counts
        chain = memo.catch_up(self.context, merge=not rows, counts=counts)
        closure = tree.ancestors[missing].any(axis=0)
        closure[0] = True
        chosen = np.flatnonzero(closure)
        m = int(chain.shape[0])
        index = np.full(tree.size, -1, dtype=np.int64)
        index[chosen] = m + np.arange(chosen.shape[0])
        parents = np.concatenate([np.arange(-1, m - 1, dtype=np.int64),
                                  [m - 1 if m else -1], index[tree.parents[chosen[1:]]]])
        depths = np.concatenate([np.arange(m, dtype=np.int64), m + tree.depths[chosen]])
        tokens = np.concatenate([chain, tree.tokens[chosen]])
        size = tokens.shape[0]
        passed = DraftTree(tokens=tokens, parents=parents, depths=depths, source_ids=np.full(size, -1, dtype=np.int64),
                           on_spine=np.zeros(size, dtype=np.bool_), source_names=(), max_depth=int(depths.max()))
        logits = real.verify([passed], [rows] if rows else None)[0]
        real.commit(0, np.arange(1, m + 1, dtype=np.int64))  # the chain and the anchor: committed tokens
        memo.cached = np.concatenate([self.context, tree.tokens[:1]])
        counts.passes += 1
        counts.computed_rows += int(logits.shape[0])
        ids, values = memo.top(logits)
        prompt = self.prompt
        assert prompt is not None
        outputs = self.context.shape[0] - prompt.prompt.shape[0]  # output tokens committed
        chain_rows = np.arange(m) + (outputs - m)  # each chain row's output index (negative: a prompt row)
        on_output = chain_rows >= 0
        if on_output.any():
            chain_nodes = np.asarray(self.path_nodes, dtype=np.int64)[chain_rows[on_output] + 1]
            prompt.keep(chain_nodes, ids[:m][on_output], values[:m][on_output])
        prompt.keep(nodes[chosen], ids[m:size], values[m:size])
        if rows:
            prompt.keep_aux(aux_keys, ids[size:], values[size:])

    def _dense(self, ids: np.ndarray, logits: np.ndarray) -> torch.Tensor:
        """Rows of -inf with each row's kept logits in place: the argmax, top-k and their softmax of the row."""
        dense = torch.full((ids.shape[0], self.vocab_size), float("-inf"))
        dense.scatter_(1, torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(np.ascontiguousarray(logits)))
        return dense


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.shape[0], b.shape[0])
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.shape[0] else n


def _chain_tree(tokens: np.ndarray) -> DraftTree:
    n = tokens.shape[0]
    depths = np.arange(n, dtype=np.int64)
    return DraftTree(tokens=tokens, parents=depths - 1, depths=depths, source_ids=np.full(n, -1, dtype=np.int64),
                     on_spine=np.zeros(n, dtype=np.bool_), source_names=(), max_depth=n - 1)


def _aux_keys(anchor: int, rows: list[AuxiliaryRows]) -> list[bytes]:
    """Per auxiliary row, what its answer depends on beyond the context: the anchor's node and the (offset, token)
    of every auxiliary row it sees, itself included."""
    keys = []
    head = np.int64(anchor).tobytes()
    for block in rows:
        pairs = np.stack([block.position_offsets, block.tokens], axis=1).astype(np.int64)
        for row in range(block.tokens.shape[0]):
            keys.append(head + pairs[block.mask[row]].tobytes())
    return keys
