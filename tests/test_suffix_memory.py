"""The suffix memory: its n-gram tables against brute force, eviction, persistence, drafts, and losslessness."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goose.config import GooseConfig
from goose.contract.candidates import DecodeContext
from goose.cycle.decoder import GooseDecoder
from goose.sources.suffix_memory import NAME, SuffixMemorySource
from goose.sources.toolkit.ngram_memory import FORMAT, MemoryFileError, NgramMemory, ngram_keys
from goose_bench.methods import METHODS
from tests.helpers import dataset_prompts

EOS = 99


def reference_documents(documents: list[list[int]], capacity: int) -> list[list[int]]:
    """What a memory of ``capacity`` tokens keeps: the newest documents that fit, each cut to its last tokens."""
    kept: list[list[int]] = []
    for document in documents:
        document = document[-capacity:] if capacity else []
        if document:
            kept.append(document)
        while sum(map(len, kept)) > capacity:
            kept.pop(0)
    return kept


def reference_match(documents: list[list[int]], live: list[int], sizes: tuple[int, ...],
                    length: int) -> tuple[int, list[tuple[int, ...]]]:
    """Brute force: the longest size whose suffix of ``live`` occurred before, and every continuation of it."""
    for n in sorted(sizes, reverse=True):
        if n > len(live):
            continue
        pattern = live[-n:]
        found = []
        for text in [*documents, live]:
            for start in range(n, len(text)):  # a continuation start with at least one token after it
                if text[start - n : start] == pattern:
                    padded = text[start : start + length] + [-1] * length
                    found.append(tuple(padded[:length]))
        if found:
            return n, sorted(found)
    return 0, []


@settings(max_examples=150, deadline=None)
@given(
    documents=st.lists(st.lists(st.integers(0, 3), max_size=14), max_size=8),
    live=st.lists(st.integers(0, 3), min_size=1, max_size=24),
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=4, unique=True),
    capacity=st.integers(0, 50),
    split=st.integers(0, 24),
)
def test_memory_matches_brute_force(documents: list[list[int]], live: list[int], sizes: list[int], capacity: int,
                                    split: int) -> None:
    memory = NgramMemory(sizes, capacity)
    for document in documents:
        memory.remember(document)
    kept = reference_documents(documents, capacity)
    assert [d.tolist() for d in memory.document_tokens()] == kept
    assert memory.stored == sum(map(len, kept)) <= capacity
    # the current request arrives in two pieces, the way a context grows
    memory.follow(np.array(live[:split] or live[:1]))
    memory.extend(live[max(1, split) :])
    assert memory.live.tolist() == live
    size, expected = reference_match(kept, live, tuple(sizes), length=4)
    match = memory.longest_match()
    if not size:
        assert match is None
        return
    assert match is not None and match.size == size and match.count == len(expected)
    rows = memory.continuations(match, limit=1000, length=4)
    assert sorted(map(tuple, rows.tolist())) == expected


def test_keys_of_documents_and_of_the_current_request_agree() -> None:
    """The vectorised (documents) and the prefix-hash (current request) keys are the same hash."""
    rng = np.random.default_rng(0)
    text = rng.integers(0, 262_144, size=300)  # Gemma-sized ids
    memory = NgramMemory((24, 7, 1), capacity=1000)
    memory.remember(text)
    memory.follow(np.concatenate([rng.integers(0, 262_144, size=50), text[100:130]]))
    match = memory.longest_match()
    assert match is not None and match.size == 24 and match.hi - match.lo == 1 and match.live.shape[0] == 0
    assert memory.continuations(match, 10, 5).tolist() == [text[130:135].tolist()]
    keys = ngram_keys(text, 7)
    assert keys.dtype == np.uint64 and keys.shape == (294,) and len(set(keys.tolist())) == 294


def test_eviction_keeps_the_newest_requests_within_capacity() -> None:
    memory = NgramMemory((3, 2), capacity=20)
    for first in range(10):  # ten 8-token requests; each one's tokens are its own
        memory.remember(np.arange(first * 100, first * 100 + 8))
        assert memory.stored <= 20
    assert [int(d[0]) for d in memory.document_tokens()] == [800, 900]  # 3 would be 24 > 20 tokens
    assert all(memory.archive.keys[n].shape == memory.archive.starts[n].shape for n in memory.sizes)
    assert memory.archive.keys[3].shape[0] == 2 * (8 - 3)  # only the kept documents' entries remain
    for evicted, found in ((0, False), (900, True)):
        memory.start_request()
        memory.follow(np.array([evicted, evicted + 1, evicted + 2]))
        match = memory.longest_match()
        assert (match is not None and match.hi > match.lo) == found
    memory.remember(np.arange(5000, 5050))  # longer than the capacity: its last 20 tokens stay
    assert [d.tolist() for d in memory.document_tokens()] == [list(range(5030, 5050))]
    memory.clear()
    assert memory.stored == 0 and memory.longest_match() is None
    nothing = NgramMemory((2,), capacity=0)  # capacity 0: the current request only
    nothing.remember([1, 2, 3])
    nothing.follow(np.array([1, 2, 5, 1, 2]))
    assert nothing.stored == 0 and nothing.longest_match().live.tolist() == [2]


def test_memory_file_round_trip_and_errors(tmp_path: Path) -> None:
    memory = NgramMemory((4, 2), capacity=100)
    for document in ([1, 2, 3, 4, 5], [7, 8], [200_000, 1, 2, 9]):
        memory.remember(document)
    path = tmp_path / "memory.npz"
    memory.save(path, {"note": "test"})
    loaded, header = NgramMemory.load(path, (4, 2), capacity=100)
    assert header["format"] == FORMAT and header["note"] == "test"
    assert [d.tolist() for d in loaded.document_tokens()] == [[1, 2, 3, 4, 5], [7, 8], [200_000, 1, 2, 9]]
    for table in (memory, loaded):
        table.follow(np.array([0, 1, 2]))
    assert sorted(loaded.continuations(loaded.longest_match(), 10, 2).tolist()) == [[3, 4], [9, -1]]
    small, _ = NgramMemory.load(path, (2,), capacity=6)  # a smaller capacity keeps the newest documents
    assert [d.tolist() for d in small.document_tokens()] == [[7, 8], [200_000, 1, 2, 9]]
    path.with_name("bad.npz").write_bytes(b"not a memory")
    with pytest.raises(MemoryFileError, match="not a readable"):
        NgramMemory.load(path.with_name("bad.npz"), (2,), 10)
    np.savez(path.with_name("other.npz"), header=np.array('{"format": "something-else/9"}'),
             tokens=np.zeros(0, dtype=np.int32), lengths=np.zeros(0, dtype=np.int64))
    with pytest.raises(MemoryFileError, match="format 'something-else/9'"):
        NgramMemory.load(path.with_name("other.npz"), (2,), 10)
    with pytest.raises(MemoryFileError, match="no memory file"):
        NgramMemory.load(tmp_path / "missing.npz", (2,), 10)


def context(tokens: list[int], prompt_length: int, tokenizer=None, vocab_size: int = 1000) -> DecodeContext:
    return DecodeContext(tokens=np.array(tokens), prompt_length=prompt_length, vocab_size=vocab_size,
                         eos_token_ids=frozenset({EOS}), tokenizer=tokenizer)


def source(**options) -> SuffixMemorySource:
    return SuffixMemorySource(GooseConfig(source_options={NAME: options}))


def test_draft_stops_before_eos_and_is_frequency_weighted() -> None:
    # the last 2 tokens (5, 6) occurred once, followed by 7 8 EOS: the draft is 7 8, never the EOS
    memory = source(ngram_sizes=[2], depth_per_match_token=4.0)
    tokens = [5, 6, 7, 8, EOS, 9, 5, 6]
    memory.goose_prefill(context(tokens, prompt_length=7))
    draft = memory.goose_propose(context(tokens, prompt_length=7))
    assert draft is not None and draft.tokens.tolist() == [7, 8] and draft.parents.tolist() == [-1, 0]
    # three earlier requests continued (1, 2) with 3, 3 and 4: a two-way tree, 3 twice as frequent
    memory = source(ngram_sizes=[2], lead_in=0)
    for output in ([1, 2, 3], [1, 2, 3], [1, 2, 4]):
        memory.goose_prefill(context([0, *output], prompt_length=1))
        memory.goose_reset()
    assert memory.remembered_requests == 3
    memory.goose_prefill(context([50, 1, 2], prompt_length=2))
    draft = memory.goose_propose(context([50, 1, 2], prompt_length=2))
    assert draft is not None and sorted(draft.tokens.tolist()) == [3, 4] and draft.parents.tolist() == [-1, -1]
    scores = dict(zip(draft.tokens.tolist(), draft.scores.tolist(), strict=True))
    assert scores[3] == pytest.approx(0.5) and scores[4] == pytest.approx(0.25)  # the bin's prior; half as frequent
    assert draft.depth_acceptance == pytest.approx((0.5,))  # along the best root path
    assert memory.last_match_size == 2 and memory.last_occurrences == 3
    # a path probability below min_probability is cut
    memory = source(ngram_sizes=[2], lead_in=0, min_probability=0.5)
    for output in ([1, 2, 3], [1, 2, 3], [1, 2, 4]):
        memory.goose_prefill(context([0, *output], prompt_length=1))
    memory.goose_prefill(context([50, 1, 2], prompt_length=2))
    assert memory.goose_propose(context([50, 1, 2], prompt_length=2)).tokens.tolist() == [3]


def test_sources_sharing_a_memory_draft_each_others_requests(tmp_path: Path) -> None:
    """share: what one source remembers, the others search; each keeps its own current request."""
    first, second = source(ngram_sizes=[2], lead_in=0, share="test-a"), source(ngram_sizes=[2], lead_in=0,
                                                                                 share="test-a")
    alone = source(ngram_sizes=[2], lead_in=0)
    assert first.memory.archive is second.memory.archive and alone.memory.archive is not first.memory.archive
    first.goose_prefill(context([0, 1, 2, 3, 4], prompt_length=1))
    second.goose_prefill(context([60, 61, 62], prompt_length=1))  # a request running beside first's
    first.goose_reset()  # first's request ends: its output joins the shared archive
    for reader in (second, alone):
        reader.goose_prefill(context([50, 1, 2], prompt_length=3))
    assert second.goose_propose(context([50, 1, 2], prompt_length=3)).tokens.tolist() == [3, 4]
    assert alone.goose_propose(context([50, 1, 2], prompt_length=3)) is None
    assert second.memory.live.tolist() == [50, 1, 2] and second.remembered_requests == 1  # 61 62 joined
    assert [d.tolist() for d in first.memory.document_tokens()] == [[1, 2, 3, 4], [61, 62]]
    with pytest.raises(ValueError, match="same"):
        source(ngram_sizes=[3], share="test-a")
    with pytest.raises(ValueError, match="share"):
        source(share="")
    # with a file, the first source of a share loads it, and the others find its documents
    path = tmp_path / "shared.npz"
    first.memory.save(path)
    loading, joining = source(ngram_sizes=[2], path=str(path), share="test-b"), source(ngram_sizes=[2], share="test-b")
    assert [d.tolist() for d in joining.memory.document_tokens()] == [[1, 2, 3, 4], [61, 62]]
    assert loading.memory.archive is joining.memory.archive


def test_memory_file_through_the_source(tmp_path: Path, smollm2, gemma3) -> None:
    _, tokenizer = smollm2
    path = tmp_path / "memory.npz"
    first = source(path=str(path), lead_in=2)
    first.goose_prefill(context([10, 11, 12, 13], prompt_length=3, tokenizer=tokenizer))
    first.memory.extend([14, 15])  # what goose_observe appends
    first.flush()  # the request ends: its lead-in and output are written
    assert path.is_file()
    again = source(path=str(path), lead_in=2)
    assert [d.tolist() for d in again.memory.document_tokens()] == [[11, 12, 13, 14, 15]]
    again.goose_prefill(context([7, 11, 12], prompt_length=3, tokenizer=tokenizer))
    assert again.goose_propose(context([7, 11, 12], prompt_length=3)).tokens.tolist() == [13, 14, 15]
    # a file written for another tokenizer is refused, not used, and not overwritten
    before = path.read_bytes()
    other = source(path=str(path))
    with pytest.raises(MemoryFileError, match="written for tokenizer"):
        other.goose_prefill(context([7, 11, 12], prompt_length=3, tokenizer=gemma3[1], vocab_size=262_144))
    assert other.memory.stored == 0 and other.goose_propose(context([7, 11, 12], prompt_length=3)) is None
    other.memory.extend([13])
    other.goose_reset()  # the request had an output, but the other tokenizer's file stays as it was
    assert path.read_bytes() == before


LOSSLESS_CONFIGS = {
    "alone": GooseConfig(sources=["suffix_memory"]),
    "spine": GooseConfig(sources=["context_match", "suffix_memory", "bigram_transition"]),
    "multi_spine": GooseConfig(sources=["context_match", "suffix_memory", "bigram_transition"],
                               topology="multi_spine"),
    "goose3": METHODS["goose3"].config(),  # the bench's three-source default: earlier requests only beside cm
}


LOSSLESS_TOKENS = {"smollm2": 48, "gemma3": 40}  # test_lossless's lengths: the AR references are shared


@pytest.mark.slow
@pytest.mark.parametrize("model_name", ["smollm2", "gemma3"])
def test_lossless_with_the_suffix_memory(model_name: str, request, ar_reference) -> None:
    """float32: token-identical to AR, alone and with context match + transitions, across requests of one decoder."""
    model, tokenizer = request.getfixturevalue(model_name)
    chat = model_name == "smollm2"  # Gemma 3 270M is a base model: raw text
    tokens = LOSSLESS_TOKENS[model_name]
    prompts = dataset_prompts("humaneval", 1) + dataset_prompts("gsm8k", 1)
    expected = [ar_reference(model, tokenizer, prompt, tokens, chat=chat).new_token_ids for prompt in prompts]
    tested = 0
    # Gemma 3 (a pass costs several of SmolLM2's) with all three sources only: the memory alone and
    # multi_spine are topology questions SmolLM2 answers; Gemma checks the memory across its own vocabulary
    configs = LOSSLESS_CONFIGS if model_name == "smollm2" else {"spine": LOSSLESS_CONFIGS["spine"]}
    for name, config in configs.items():
        goose = GooseDecoder(model, tokenizer, config, chat=chat)  # the second prompt drafts from the first's output
        for prompt, want in zip(prompts, expected, strict=True):
            result = goose.generate(prompt, tokens)
            assert result.new_token_ids == want, (name, prompt[:40])
            tested += result.stats.source_tested[NAME]
    assert tested > 0  # the memory's drafts really were verified


def test_a_second_request_drafts_from_the_first(tiny, ar_reference) -> None:
    """Memory across requests in one decoder: the same request again is drafted from the first one's output."""
    model, tokenizer = tiny
    prompt = dataset_prompts("humaneval", 2)[1]
    expected = ar_reference(model, tokenizer, prompt, 48).new_token_ids
    steps = {}
    for capacity in (0, 200_000):
        # earlier requests only: the tiny model's own loops, drafted from the current request, are not the point
        config = GooseConfig(sources=["suffix_memory"], topology="chain", budget=16,  # fixed: steps repeat exactly
                             source_options={NAME: {"capacity": capacity, "search_current": False}})
        goose = GooseDecoder(model, tokenizer, config)
        first, second = goose.generate(prompt, 48), goose.generate(prompt, 48)
        assert first.new_token_ids == second.new_token_ids == expected
        steps[capacity] = (first.stats.verify_steps, second.stats.verify_steps)
    without, remembered = steps[0], steps[200_000]
    assert remembered[0] == without[0]  # nothing to remember in the first request
    assert remembered[1] < without[1] / 2 and remembered[1] <= 8  # 48 tokens in a few passes of up to 16
