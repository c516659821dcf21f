"""The rest source and its datastore: suffix array, search, trie, manifest guard, CLI, losslessness."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goose import cli, models
from goose.config import GooseConfig
from goose.contract.candidates import DecodeContext
from goose.cycle.decoder import GooseDecoder
from goose.plugins import PluginError
from goose.sources.rest import RestOptions, RestSource
from goose.sources.rest.corpus import build, default_datastore, default_datastore_path
from goose.sources.rest.datastore import Datastore
from goose.sources.rest.suffix_index import SEPARATOR, DatastoreError, SuffixIndex, suffix_array
from goose.sources.toolkit import frequency_trie
from goose_bench.methods import ALL_METHODS, method_named, with_datastore
from tests.helpers import CPU_CURVE, PACKAGED_DATA, SMALL_CORPUS, SMOLLM2_TOKENS, dataset_prompts, stdlib_sample

BIG = 200_000  # token ids above 2**16: the datastore must not truncate them (Gemma 3 has 262k tokens)

# a few standard-library modules: a few hundred KB, tokenized in about a second
@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stdlib_sample(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory, corpus: Path, smollm2) -> Datastore:
    _, tokenizer = smollm2
    return build(tokenizer, [corpus], tmp_path_factory.mktemp("stores") / "small", progress=False)


def brute_suffix_array(tokens: list[int]) -> list[int]:
    return sorted(range(len(tokens)), key=lambda i: tokens[i:])


def context_for(tokens: list[int], vocab_size: int = BIG + 100, tokenizer: object = None,
                eos: frozenset[int] = frozenset()) -> DecodeContext:
    array = np.asarray(tokens, dtype=np.int64)
    array.flags.writeable = False
    return DecodeContext(tokens=array, prompt_length=len(tokens), vocab_size=vocab_size, eos_token_ids=eos,
                         tokenizer=tokenizer)


# --- suffix array and search ----------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([SEPARATOR, BIG, BIG + 1, BIG + 2, 70_000]), min_size=0, max_size=60))
def test_suffix_array_matches_brute_force(tokens: list[int]) -> None:
    array = np.asarray(tokens, dtype=np.int32)
    result = suffix_array(array)
    assert result.tolist() == brute_suffix_array(tokens)
    assert result.dtype == np.int32


def test_suffix_array_orders_long_repeats() -> None:
    """Suffixes sharing thousands of tokens: every neighbouring pair in order, checked at its first difference."""
    rng = np.random.default_rng(0)
    block = rng.integers(BIG, BIG + 50, 3_000)
    tokens = np.concatenate([block, block, [SEPARATOR], block[:1500], rng.integers(BIG, BIG + 3, 5_000)])
    order = suffix_array(tokens.astype(np.int32))
    assert sorted(order.tolist()) == list(range(tokens.shape[0]))
    for first, second in zip(order[:-1].tolist(), order[1:].tolist(), strict=True):
        a, b = tokens[first:], tokens[second:]
        length = min(a.shape[0], b.shape[0])
        differ = np.flatnonzero(a[:length] != b[:length])
        assert (a[differ[0]] < b[differ[0]]) if differ.shape[0] else a.shape[0] < b.shape[0]


def brute_longest(documents: list[list[int]], context: list[int], min_span: int, max_span: int
                  ) -> tuple[int, Counter[tuple[int, ...]]] | None:
    """(span, Counter of the 3 tokens after each occurrence, cut at the document end) of the longest match."""
    for span in range(min(max_span, len(context)), min_span - 1, -1):
        pattern = context[-span:]
        following: Counter[tuple[int, ...]] = Counter()
        for document in documents:
            for start in range(len(document) - span + 1):
                if document[start : start + span] == pattern:
                    following[tuple(document[start + span : start + span + 3])] += 1
        if following:
            return span, following
    return None


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.integers(BIG, BIG + 3), min_size=1, max_size=40), min_size=1, max_size=8),
    st.lists(st.integers(BIG, BIG + 3), min_size=1, max_size=12),
    st.integers(1, 3),
    st.integers(3, 9),
)
def test_longest_match_matches_brute_force(documents: list[list[int]], context: list[int], min_span: int,
                                           max_span: int) -> None:
    index = SuffixIndex.from_documents(documents)
    match = index.longest_match(np.asarray(context), min_span, max_span)
    expected = brute_longest(documents, context, min_span, max_span)
    if expected is None:
        assert match is None
        return
    assert match is not None
    span, following = expected
    assert (match.span, match.count) == (span, sum(following.values()))
    rows = index.continuations(match, limit=10_000, length=3)
    got = Counter(tuple(row.tolist()[: [*row.tolist(), SEPARATOR].index(SEPARATOR)]) for row in rows)
    assert got == following


def test_matches_stay_inside_one_document() -> None:
    index = SuffixIndex.from_documents([[BIG, BIG + 1], [BIG + 2, BIG + 3, BIG + 4]])
    assert index.longest_match(np.array([BIG + 1, BIG + 2]), 2, 4) is None  # spans the document boundary
    match = index.longest_match(np.array([BIG + 9, BIG + 2, BIG + 3]), 2, 4)
    assert match is not None and match.span == 2
    assert index.continuations(match, 10, 3).tolist() == [[BIG + 4, SEPARATOR, SEPARATOR]]


def test_many_occurrences_are_sampled_across_the_range() -> None:
    # 1000 occurrences of (a, b), each followed by its own token: a prefix of the suffix-array
    # range would hold only the smallest followers
    documents = [[BIG, BIG + 1, 1000 + i] for i in range(1000)]
    index = SuffixIndex.from_documents(documents)
    match = index.longest_match(np.array([BIG, BIG + 1]), 2, 2)
    assert match is not None and match.count == 1000
    followers = index.continuations(match, limit=100, length=1)[:, 0]
    assert followers.shape == (100,) and followers.min() < 1020 and followers.max() > 1970


# --- the frequency trie -----------------------------------------------------------------------------


def test_frequency_trie_counts_and_conditional_scores() -> None:
    continuations = np.array([[1, 2, 3], [1, 2, 4], [1, 5, -1], [6, -1, 7], [1, 2, 3]])
    trie = frequency_trie(continuations, max_nodes=64)
    nodes = {}
    for i in range(len(trie)):  # path of each node -> (count, score)
        path, j = [], i
        while j >= 0:
            path.append(int(trie.tokens[j]))
            j = int(trie.parents[j])
        nodes[tuple(reversed(path))] = (int(trie.counts[i]), round(float(trie.scores[i]), 6))
    assert trie.total == 5
    assert nodes == {(1,): (4, 0.8), (6,): (1, 0.2), (1, 2): (3, 0.75), (1, 5): (1, 0.25),
                     (1, 2, 3): (2, 0.666667), (1, 2, 4): (1, 0.333333)}
    assert (6, -1, 7) not in nodes and (6, 7) not in nodes  # a row ends at its first -1


def test_frequency_trie_of_one_continuation_is_its_chain() -> None:
    """One live row (the fast path) gives what the general merge gives: its tokens up to its first -1, scores 1."""
    one = frequency_trie(np.array([[-1, 3, 3, 3], [4, 5, -1, 6]]), max_nodes=64)
    same = frequency_trie(np.array([[4, 5, -1, 6], [4, 5, -1, 6]]), max_nodes=64)  # two rows: the general path
    for trie in (one, same):
        assert trie.tokens.tolist() == [4, 5] and trie.parents.tolist() == [-1, 0]
        assert trie.scores.tolist() == [1.0, 1.0] and trie.depths.tolist() == [1, 2]
    assert one.counts.tolist() == [1, 1] and one.total == 1
    assert frequency_trie(np.array([[7, 8, 9]]), max_nodes=2).tokens.tolist() == [7, 8]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(BIG, BIG + 2), min_size=4, max_size=4), min_size=1, max_size=60),
       st.integers(1, 20))
def test_frequency_trie_keeps_the_most_frequent_prefixes(rows: list[list[int]], max_nodes: int) -> None:
    prefixes = Counter(tuple(row[:d]) for row in rows for d in range(1, 5))
    trie = frequency_trie(np.asarray(rows, dtype=np.int64), max_nodes)
    assert len(trie) == min(max_nodes, len(prefixes))
    parents = trie.parents.tolist()
    assert all(-1 <= p < i for i, p in enumerate(parents))  # parents first: a valid Draft
    paths: list[tuple[int, ...]] = []
    for i, parent in enumerate(parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (int(trie.tokens[i]),))
        assert prefixes[paths[-1]] == trie.counts[i]
        assert trie.depths[i] == len(paths[-1])
        parent_count = trie.counts[parent] if parent >= 0 else len(rows)
        assert trie.scores[i] == pytest.approx(trie.counts[i] / parent_count)
    assert len(set(paths)) == len(paths)
    # no prefix left out counts more than one kept
    left_out = [count for prefix, count in prefixes.items() if prefix not in set(paths)]
    assert not left_out or max(left_out) <= trie.counts.min()


# --- building, opening, guarding ----------------------------------------------------------------------


def test_build_and_open_round_trip(small_store: Datastore, corpus: Path, smollm2) -> None:
    _, tokenizer = smollm2
    store = Datastore.open(small_store.path, tokenizer)
    assert isinstance(store.tokens, np.memmap) and isinstance(store.suffixes, np.memmap)
    assert store.tokens.dtype == np.int32
    manifest = store.manifest
    assert manifest["documents"] == len(SMALL_CORPUS) and manifest["tokenizer"]["vocab_size"] == len(tokenizer)
    assert manifest["tokens"] == store.tokens.shape[0] and manifest["suffixes"] == len(store)
    # the documents are the files' token ids, in path order, each followed by the separator
    expected: list[int] = []
    for path in sorted(corpus.iterdir()):
        expected += tokenizer(path.read_text(), add_special_tokens=False)["input_ids"] + [SEPARATOR]
    assert store.tokens.tolist() == expected
    # the suffix array is sorted (checked on a sample of neighbours, 24 tokens deep)
    tokens, suffixes = np.asarray(store.tokens).tolist(), np.asarray(store.suffixes)
    for i in np.random.default_rng(0).integers(0, len(store) - 1, 300):
        a, b = int(suffixes[i]), int(suffixes[i + 1])
        assert tokens[a : a + 24] <= tokens[b : b + 24]
    assert len(store) == len(tokens) - manifest["documents"]  # every non-separator suffix, once
    # a stretch of the corpus is found at full span, its true continuation among the occurrences
    start = len(tokens) // 2
    query = np.asarray(tokens[start : start + 12])
    assert SEPARATOR not in query
    match = store.longest_match(query, 2, 12)
    assert match is not None and match.span == 12
    assert tokens[start + 12 : start + 15] in store.continuations(match, 10_000, 3).tolist()


def test_datastore_refuses_another_tokenizer(small_store: Datastore, gemma3) -> None:
    _, gemma_tokenizer = gemma3
    with pytest.raises(DatastoreError, match=r"built for tokenizer .*smollm2.* rebuild it"):
        Datastore.open(small_store.path, gemma_tokenizer)
    # the source: refused at the first context, then silent (the decoder logs the failure once)
    source = RestSource(GooseConfig(source_options={"rest": {"datastore": str(small_store.path)}}))
    context = context_for([10, 11, 12], vocab_size=len(gemma_tokenizer), tokenizer=gemma_tokenizer)
    with pytest.raises(DatastoreError, match="rebuild"):
        source.goose_prefill(context)
    assert source.goose_propose(context) is None


def test_bad_datastore_path_fails_when_the_decoder_is_made(tmp_path: Path, smollm2) -> None:
    model, tokenizer = smollm2
    config = GooseConfig(sources=["rest"], source_options={"rest": {"datastore": str(tmp_path / "missing")}})
    with pytest.raises(PluginError, match="source 'rest' could not be made: DatastoreError: no datastore at"):
        GooseDecoder(model, tokenizer, config)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatastoreError, match="not a Goose datastore"):
        RestSource(GooseConfig(source_options={"rest": {"datastore": str(tmp_path / "empty")}}))
    with pytest.raises(ValueError, match="min_span"):
        RestOptions(min_span=5, max_span=3)


def test_jsonl_fields_and_benchmark_guard(tmp_path: Path, smollm2) -> None:
    _, tokenizer = smollm2
    records = [{"prompt": "def add(a, b):", "completion": "    return a + b", "meta": "not indexed"},
               {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]},
               {"id": 3, "score": 0.5}]  # no text field: no document
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    store = build(tokenizer, [data], tmp_path / "store", progress=False)
    assert store.manifest["documents"] == 2
    first = tokenizer("def add(a, b):\n    return a + b", add_special_tokens=False)["input_ids"]
    assert store.tokens[: len(first) + 1].tolist() == [*first, SEPARATOR]
    assert "not indexed" not in tokenizer.decode([t for t in store.tokens.tolist() if t >= 0])
    # benchmark files (their items carry task ids, reference answers, tests) are refused
    humaneval = PACKAGED_DATA / "humaneval.jsonl"
    with pytest.raises(DatastoreError, match="benchmark"):
        build(tokenizer, [humaneval], tmp_path / "contaminated", progress=False)
    assert not (tmp_path / "contaminated").exists()
    with pytest.raises(DatastoreError, match="not empty"):
        build(tokenizer, [data], tmp_path / "store", progress=False)


def test_cli_build_and_info(corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli-store"
    assert cli.main(["datastore", "build", "--model", "smollm2-135m", "--from", str(corpus / "heapq.py"),
                     str(corpus / "bisect.py"), "--out", str(out)]) == 0
    assert "datastore" in capsys.readouterr().err
    assert cli.main(["datastore", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["documents"] == 2 and info["tokenizer"]["vocab_size"] == 49152 and info["size_bytes"] > 0
    assert cli.main(["datastore", "info", str(out)]) == 0
    assert "smollm2" in capsys.readouterr().out
    # user errors: one line, exit status 2
    assert cli.main(["datastore", "info", str(tmp_path / "nothing")]) == 2
    assert "no datastore at" in capsys.readouterr().err


# --- the source in the decoder --------------------------------------------------------------------------


def test_propose_returns_a_valid_trie(small_store: Datastore, smollm2) -> None:
    _, tokenizer = smollm2
    source = RestSource(GooseConfig(source_options={"rest": {"datastore": str(small_store.path), "max_nodes": 20}}))
    ids = tokenizer("class Foo:\n    def __init__(self", add_special_tokens=False)["input_ids"]
    context = context_for(ids, vocab_size=len(tokenizer), tokenizer=tokenizer, eos=frozenset({2}))
    source.goose_prefill(context)
    draft = source.goose_propose(context)
    assert draft is not None and 1 <= len(draft) <= 20
    assert draft.validated(len(tokenizer), 0.3).tokens.tolist() == draft.tokens.tolist()
    assert bool(((draft.scores > 0) & (draft.scores <= 1)).all())
    assert source.last_span >= 2 and source.last_occurrences >= 1
    # the most frequent first token after "def __init__(self" in the corpus is "," or ")"
    assert tokenizer.decode(draft.tokens[:1]).strip() in {",", "):", ")", "):\n"}


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["chain", "spine"])
def test_rest_is_lossless_smollm2(small_store: Datastore, smollm2, ar_reference, topology: str) -> None:
    model, tokenizer = smollm2
    sources = ["rest"] if topology == "chain" else ["rest", "bigram_transition"]
    config = GooseConfig(sources=sources, topology=topology,
                         source_options={"rest": {"datastore": str(small_store.path)}})
    goose = GooseDecoder(model, tokenizer, config)
    tested = 0
    for prompt in dataset_prompts("humaneval", 2):  # the lossless suite's prompts and length: shared AR runs
        result = goose.generate(prompt, SMOLLM2_TOKENS)
        assert result.new_token_ids == ar_reference(model, tokenizer, prompt, SMOLLM2_TOKENS).new_token_ids
        tested += result.stats.source_tested["rest"]
    assert tested > 0  # rest drafted and the target checked its nodes
    assert goose.sources.instances["rest"].matched > 0


@pytest.mark.slow
def test_rest_is_lossless_gemma(tmp_path: Path, corpus: Path, gemma3, ar_reference) -> None:
    model, tokenizer = gemma3
    store = build(tokenizer, [corpus], tmp_path / "gemma-store", progress=False)
    config = GooseConfig(sources=["rest"], topology="chain", source_options={"rest": {"datastore": str(store.path)}})
    prompt = dataset_prompts("humaneval", 1)[0]
    result = GooseDecoder(model, tokenizer, config, chat=False).generate(prompt, 32)
    assert result.new_token_ids == ar_reference(model, tokenizer, prompt, 32, chat=False).new_token_ids
    assert result.stats.source_tested["rest"] > 0


@pytest.mark.slow
def test_learn_outputs_retrieves_earlier_answers(small_store: Datastore, smollm2, ar_reference) -> None:
    model, tokenizer = smollm2
    options = {"datastore": str(small_store.path), "learn_outputs": True}
    goose = GooseDecoder(model, tokenizer, GooseConfig(sources=["rest"], topology="chain",
                                                       source_options={"rest": options}),
                         cost_curve=CPU_CURVE, pinned_costs=True)  # a tree every cycle, whatever this CPU's curve
    prompt = dataset_prompts("humaneval", 2)[1]
    first = goose.generate(prompt, 48)
    second = goose.generate(prompt, 48)  # the first answer is now in the side store
    assert second.new_token_ids == first.new_token_ids == ar_reference(model, tokenizer, prompt, 48).new_token_ids
    assert second.stats.verify_steps < first.stats.verify_steps / 2
    assert second.stats.source_acceptance["rest"] > 0.8
    source = goose.sources.instances["rest"]
    assert source.side is not None and len(source.learned) == 1  # the second answer joins at the next request
    # without learn_outputs nothing is kept
    plain = RestSource(GooseConfig(source_options={"rest": {"datastore": str(small_store.path)}}))
    plain.goose_prefill(context_for([1, 2, 3], vocab_size=len(tokenizer), tokenizer=tokenizer))
    plain.goose_reset()
    assert plain.side is None


@pytest.mark.slow
def test_the_datastore_build_reads_the_tokenizer_alone(tmp_path: Path, smollm2) -> None:
    """No weights are dequantized for a tokenizer: a GGUF model's comes from the file into a tokenizer cache."""
    tokenizer = models.load_tokenizer("smollm2-135m", cache_dir=tmp_path)
    assert not (tmp_path / "models").exists() and (tmp_path / "tokenizers").is_dir()
    text = "def heappush(heap, item):\n    heap.append(item)"
    assert tokenizer.encode(text) == smollm2[1].encode(text)
    assert models.load_tokenizer("smollm2-135m", cache_dir=tmp_path).encode(text) == tokenizer.encode(text)  # cached


def test_default_stdlib_datastore_builds_once(tmp_path: Path, smollm2) -> None:
    """The default datastore (the stdlib, ~2.3M SmolLM2 tokens): built in well under a minute, then reused."""
    _, tokenizer = smollm2
    store = default_datastore(tokenizer, tmp_path, progress=False)
    assert store.path == default_datastore_path(tokenizer, tmp_path)
    assert 1_000_000 < len(store) <= 4_000_000
    assert not any("site-packages" in s or "/test/" in s for s in store.manifest["sources"])
    again = default_datastore(tokenizer, tmp_path)
    assert again.manifest["created"] == store.manifest["created"]  # reused, not rebuilt
    # the source builds it on first use when no datastore is given (here: already cached)
    source = RestSource(GooseConfig(source_options={"rest": {"cache_dir": str(tmp_path)}}))
    ids = tokenizer("import os\nimport sys\n", add_special_tokens=False)["input_ids"]
    context = context_for(ids, vocab_size=len(tokenizer), tokenizer=tokenizer)
    source.goose_prefill(context)
    assert source.store is not None and source.store.path == store.path
    draft = source.goose_propose(context)
    assert draft is not None and isinstance(draft.tokens, np.ndarray)


# --- the bench with a datastore of one's own ------------------------------------------------------------


@pytest.mark.slow
def test_bench_drafts_from_the_datastore_given(small_store: Datastore, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`goose bench run --datastore` puts the folder into every REST method (and only those), checks it first."""
    composed_rest = method_named("cm+bt+rest@spine")
    method = with_datastore(composed_rest, small_store.path)
    assert method.config().source_options["rest"]["datastore"] == str(small_store.path)
    assert method.config().budget == composed_rest.config().budget  # nothing else changes
    assert with_datastore(ALL_METHODS["goose"], small_store.path) is ALL_METHODS["goose"]
    out = tmp_path / "bench"
    assert cli.main(["bench", "run", "--model", "smollm2-135m", "--datasets", "humaneval", "--limit", "1",
                     "--max-new-tokens", "24", "--methods", "goose,cm+bt+rest@spine", "--dtype", "float32",
                     "--datastore", str(small_store.path), "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["rest_datastore"] == str(small_store.path.resolve())
    config = summary["methods"]["cm+bt+rest@spine"]["config"]
    assert config["source_options"]["rest"]["datastore"] == str(small_store.path)
    assert "rest" not in summary["methods"]["goose"]["config"]["source_options"]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all(record["identical_to_ar"] for record in records if record["method"] != "ar")
    # a folder that is not a datastore: one line, exit status 2, before any model loads
    assert cli.main(["bench", "run", "--datastore", str(tmp_path / "nothing"), "--out", str(out)]) == 2
    assert "--datastore" in capsys.readouterr().err
