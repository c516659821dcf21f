"""The llama.cpp engine is as exact as its docstrings say, on SmolLM2's Q4_1 GGUF file as shipped.

- A tree's rows are llama.cpp's one-token rows bit for bit (goose.llama_model, goose.cycle.llama_verifier):
  chains and branching trees whose rejected branches become tombstones, compared with ``np.array_equal``.
- The tombstones are freed when a pass needs their cells (a context small enough to force it), and the
  decoding goes on as llama.cpp's own one-token decoding does.
- A decode that llama.cpp refuses in a prefill (a token outside the vocabulary: ``llama_decode`` returns
  -1 from its batch check, no mock) leaves no phantom slot and no cells: the next request is exact.
- The engine's threads default to the CPUs this process may run on.

The same skip conditions as tests/test_llama_engine.py: llama-cpp-python installed and built for this CPU.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from goose import cpu, llama_model, models
from goose.contract.tree import DraftTree, TreeBuilder
from goose.planning import machine

# goose.llama_model.bindings' own check, before anything imports llama_cpp (nothing above does)
REFUSED = cpu.refusal("llama-cpp-python", llama_model.cpu_flags_file(), "make llama-setup")
if REFUSED:
    pytest.skip(REFUSED, allow_module_level=True)
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: `make llama-setup` builds it")

from goose.cycle.llama_verifier import LlamaVerifier  # noqa: E402  (after the skip: it loads llama_cpp)
from goose.llama_model import LlamaEngineError, LlamaModel  # noqa: E402

THREADS = int(os.environ.get("GOOSE_TEST_THREADS", "2"))
PROMPT = "Write a Python function that merges two sorted lists."
ANCHOR_ONLY = np.zeros(0, dtype=np.int64)


@pytest.fixture(scope="module")
def gguf() -> tuple[LlamaModel, Any]:
    return models.load_gguf("smollm2-135m", threads=THREADS)


def _prompt(gguf: tuple[LlamaModel, Any]) -> list[int]:
    return models.encode_prompt(gguf[1], PROMPT)


def _one_token_rows(model: LlamaModel, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    """llama.cpp's own greedy decoding, one token a pass: the tokens (the first from the prefill) and the row of
    logits that predicted each token after the first."""
    verifier = LlamaVerifier(model)
    tokens = [int(verifier.prefill(prompt)[-1].argmax())]
    rows = []
    for _ in range(steps):
        row = verifier.verify([DraftTree.single(tokens[-1])])[0][0].numpy().copy()
        verifier.commit(0, ANCHOR_ONLY)
        rows.append(row)
        tokens.append(int(row.argmax()))
    return tokens, rows


def _branchy(anchor: int, right: list[int], wrong: list[list[int]]) -> tuple[DraftTree, np.ndarray]:
    """A tree of the anchor, wrong branches laid first and the right chain last; the right chain's nodes."""
    builder = TreeBuilder(anchor, ("wrong", "right"), capacity=len(right) + sum(len(w) for w in wrong))
    for branch in wrong:
        builder.add_chain(0, np.array(branch), 0)
    nodes = builder.add_chain(0, np.array(right), 1) if right else np.zeros(0)
    return builder.build(), np.asarray(nodes, dtype=np.int64)


def test_a_trees_rows_are_the_one_token_rows_bit_for_bit(gguf: tuple[LlamaModel, Any]) -> None:
    """Chains accepted whole, and trees whose wrong branches are rejected (their cells tombstones): every row of
    the right path equals the row llama.cpp's one-token decoding computes there, bit for bit."""
    model, _ = gguf
    prompt = _prompt(gguf)
    tokens, rows = _one_token_rows(model, prompt, 24)
    for size in (2, 5, 8):
        verifier = LlamaVerifier(model)
        verifier.prefill(prompt)
        for start in range(0, 24 - size + 1, size):
            builder = TreeBuilder(tokens[start], ("chain",), capacity=size - 1)
            builder.add_chain(0, np.array(tokens[start + 1 : start + size]), 0)
            got = verifier.verify([builder.build()])[0].numpy()
            assert np.array_equal(got, np.stack(rows[start : start + size])), (size, start)
            verifier.commit(0, np.arange(1, size))
    verifier = LlamaVerifier(model)
    verifier.prefill(prompt)
    for start in range(0, 20, 4):
        wrong = [[11, 12, 13], [tokens[start + 1], 14], [15]]  # one shares the right first token: a shared node
        tree, right = _branchy(tokens[start], tokens[start + 1 : start + 4], wrong)
        got = verifier.verify([tree])[0].numpy()
        assert np.array_equal(got[np.concatenate(([0], right))], np.stack(rows[start : start + 4])), start
        verifier.commit(0, right)
    assert verifier.buried > 0  # the wrong branches' cells stayed, as tombstones, between the right path's


def test_the_tombstones_are_freed_when_a_pass_needs_their_cells(gguf: tuple[LlamaModel, Any]) -> None:
    """A context of 256 cells: every pass buries 6 rejected nodes, so the tombstones are freed several times.
    Up to the first freeing the rows are the one-token rows bit for bit; after it the freed cells are refilled
    out of position order and the rows round differently (measured: up to 1.7 logits, printed with -s), yet the
    tokens stay llama.cpp's own one-token decoding's on this prompt."""
    model, _ = gguf
    small = LlamaModel(model.path, threads=THREADS, context=256)
    prompt = _prompt(gguf)
    steps = 120
    tokens, rows = _one_token_rows(small, prompt, steps)
    verifier = LlamaVerifier(small)
    assert verifier.cells == 256
    verifier.prefill(prompt)
    ours, worst, frees = [tokens[0]], 0.0, []
    for step in range(steps):
        tree, _ = _branchy(ours[-1], [], [[11, 12, 13], [14, 15, 16]])
        row = verifier.verify([tree])[0][0].numpy()
        if verifier.tombstone_frees == 0:
            assert np.array_equal(row, rows[step]), step
        worst = max(worst, float(np.abs(row - rows[step]).max()))
        verifier.commit(0, ANCHOR_ONLY)
        frees.append(verifier.tombstone_frees)
        ours.append(int(row.argmax()))
    assert frees[-1] >= 2 and frees[0] == 0, frees
    assert ours == tokens, worst
    assert verifier.lengths == [len(prompt) + steps] and verifier.kept_positions(0) == (0, len(prompt) + steps - 1)
    print(f"tombstones freed {frees[-1]} times; largest |row - one-token row| {worst:.3g}")


def test_a_failed_prefill_leaves_no_phantom_slot(gguf: tuple[LlamaModel, Any]) -> None:
    """llama_decode refuses a token outside the vocabulary (its batch check returns -1): a prompt whose second
    piece holds one fails after its first piece was decoded. The request then holds no slot and no cell, a live
    request beside it is untouched, and the next request decodes exactly as in a fresh context."""
    model, _ = gguf
    prompt = _prompt(gguf)
    bad = [*prompt[:20], model.vocab_size + 7]  # a first piece of 16 tokens is decoded, the second is refused
    fresh = LlamaVerifier(model)
    expected = fresh.prefill(prompt).numpy()
    expected_next = fresh.verify([DraftTree.single(int(expected[-1].argmax()))])[0].numpy().copy()

    verifier = LlamaVerifier(model, slots=2, batch_tokens=16)
    with pytest.raises(LlamaEngineError, match=r"status -1.*invalid token"):
        verifier.prefill(bad)
    assert verifier.live == 0 and verifier._free == [0, 1] and verifier.buried == 0
    assert all(verifier.llama.llama_memory_seq_pos_max(verifier.memory, s) == -1 for s in range(verifier.tombstone + 1))
    first = verifier.prefill(prompt).numpy()  # alone in the cache, as in a fresh context
    assert np.array_equal(first, expected)
    assert verifier.live == 1 and verifier.lengths == [len(prompt)]

    with pytest.raises(LlamaEngineError, match="invalid token"):  # now beside a live request
        verifier.prefill(bad)
    assert verifier.live == 1 and verifier.lengths == [len(prompt)] and verifier._free == [1]
    assert verifier.kept_positions(0) == (0, len(prompt) - 1)
    pool = verifier._pools[1]
    assert all(verifier.llama.llama_memory_seq_pos_max(verifier.memory, int(s)) == -1 for s in pool)
    verifier.prefill(prompt[:12])  # the second slot works (its pieces: 12 tokens)
    assert verifier.live == 2 and verifier.lengths == [len(prompt), 12]
    anchors = [DraftTree.single(int(first[-1].argmax())), DraftTree.single(7)]
    got = verifier.verify(anchors)[0].numpy()
    assert np.array_equal(got, expected_next)  # the live request's next row: as if nothing had failed


def test_the_threads_default_to_this_process_cpus(gguf: tuple[LlamaModel, Any]) -> None:
    model, _ = gguf
    assert LlamaModel(model.path).threads == machine.cpu_count()
