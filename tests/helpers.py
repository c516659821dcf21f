"""What the tests share: benchmark prompts, reference runs, outcome and table builders, the server harness.

One module, imported by the test files (``from tests.helpers import ...``); no test file imports
another. Fixtures live in ``conftest.py``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import subprocess
import sysconfig
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import torch
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from goose import CandidatePool, Draft, DraftTree, Harvest, PathKind, TreeBuilder, VerifyOutcome, models
from goose.cycle.decoder import AutoregressiveDecoder, GenerationResult
from goose.cycle.logprobs import TokenLogprob
from goose.models import encode_chat, encode_prompt
from goose.planning.cost import CostCurve
from goose_bench.prompts import PACKAGED_DATA, load_samples

# GOOSE_TEST_DEVICE=cuda runs the model tests on a GPU (the device check); CI stays on the CPU
DEVICE = os.environ.get("GOOSE_TEST_DEVICE", "cpu")


# --- tiny random-weight models: the engine's mechanics without a real model's cost -------------------

# Weights drawn at this scale (transformers' default is 0.02) make the output depend on the context yet fall into
# loops of a few tokens: the sources draft, some drafts are accepted and some rejected, as with a real model.
TINY_INIT = 0.1
# A CPU-like verify cost curve (width costs, as on these 2-core VMs when quiet), for tests that need drafting to
# happen whatever curve this machine measured: one measured while a test suite shared the cores prices every
# extra row so dearly that a short run may lay no tree at all. Decoders built with it and pinned_costs=True
# budget the same on every machine, at any load.
CPU_CURVE = CostCurve((1, 2, 4, 8, 16, 32, 64, 128), (0.020, 0.022, 0.026, 0.034, 0.050, 0.080, 0.140, 0.260))


def tiny_model(kind: str = "llama", seed: int = 0) -> tuple[Any, Any]:
    """A 2-layer random-weight causal LM with SmolLM2's tokenizer (and its vocabulary), built here in float32.

    ``"llama"``: grouped-query attention (4 query heads over 2 key/value heads) and tied embeddings, as SmolLM2.
    ``"gemma3"``: Gemma 3's architecture with a 32-token sliding window on its first layer and global attention
    on its second, so that short runs cross the window. Nothing is downloaded; the tokenizer is read from the
    embedded SmolLM2's cache folder (built by its first load).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig, LlamaConfig

    tokenizer = AutoTokenizer.from_pretrained(models.pretrained_location(models.DEFAULT_MODEL))
    shape = {"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 2048,
             "tie_word_embeddings": True, "initializer_range": TINY_INIT, "bos_token_id": tokenizer.bos_token_id,
             "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    if kind == "llama":
        config = LlamaConfig(**shape)
    elif kind == "gemma3":
        config = Gemma3TextConfig(**shape, sliding_window=32, layer_types=["sliding_attention", "full_attention"],
                                  query_pre_attn_scalar=16)
    else:
        raise ValueError(kind)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    # a name of its own: the cost-curve cache and the shared autoregressive references are keyed by it
    model.config._name_or_path = f"tiny-random-{kind}-{seed}"
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer


# --- benchmark prompts -------------------------------------------------------------------------------


def dataset_prompts(name: str, limit: int) -> list[str]:
    """The first ``limit`` prompts of a benchmark the project ships (bench/goose_bench/data), first turns, as text."""
    return [sample.turns[0] for sample in load_samples(name, PACKAGED_DATA, limit)]


# the lossless suite's prompts and lengths, which the batched and four-source tests reuse
SMOLLM2_TOKENS = 48
GEMMA3_TOKENS = 64  # at 40 the greedy text of a prompt (the Hawaii blog) gave its drafts no accepted token
PROMPT_BEFORE_WINDOW = 488  # the prompt ends 24 tokens before the window; 48 new tokens run 24 past it
WINDOW_TOKENS = 48


def assert_lossless(result: Any, reference: Any, *, accepted: bool = True, label: object = "",
                    near_tie: Callable[[list[int]], bool] | None = None) -> tuple[int, int]:
    """The project's one lossless check of a Goose run: its tokens are ``reference``'s (a token list, or anything with
    ``new_token_ids``), no plugin faulted while serving it, its sources drafted and the target tested their tokens,
    and (``accepted``) kept some. Returns (draft tokens tested, accepted), for checks over several runs.

    Tokens alone cannot see a dead source: the plugin boundary skips a source that raises (the run's
    ``stats.faults`` counts it) and a plain step is lossless too, so the output stays the reference's.
    A list of results (a batch's rows) takes a list of references: every row's tokens and faults are checked, the
    drafting over the rows together (a row whose drafts never paid may lay none; a dead source lays none in any).
    ``near_tie(ids)``: whether an output that parts from the reference does so at a near-tie of the reference's own
    logits (llama.cpp's batched rows may round differently from its one-token rows); None: every token must match.
    """
    batch = isinstance(result, list | tuple)
    rows, references = (list(result), list(reference)) if batch else ([result], [reference])
    assert len(rows) == len(references), f"{len(rows)} results for {len(references)} references"
    name = f"{label}: " if label != "" else ""
    for i, (row, expected) in enumerate(zip(rows, references, strict=True)):
        at = f"{name}row {i}: " if batch else name
        _assert_output(list(row.new_token_ids), list(getattr(expected, "new_token_ids", expected)), at, near_tie)
        _assert_no_faults(row.stats.faults, at)
    stats = [row.stats for row in rows]
    # every pass's tree holds the anchor; a constrained request's grammar cut some drafted nodes before the pass
    drafted = sum(sum(s.tree_sizes) - len(s.tree_sizes) + s.grammar_cut_tokens for s in stats)
    return _assert_drafting(name, drafted, sum(s.verify_steps for s in stats),
                            [(s.source_tested, s.source_accepted) for s in stats], accepted)


def assert_served_lossless(served: Any, text: str | Sequence[Any], reference: Any, *, accepted: bool = True,
                           label: object = "") -> tuple[int, int]:
    """assert_lossless over the wire, for goose serve's answers: the answer's ``text`` is ``reference``'s (a string, or
    a run with ``text``), and its ``goose`` statistics report no plugin fault, drafts laid and tested, and
    (``accepted``) some kept. ``served``: a response or last chunk (the openai client's object or the JSON body),
    or its ``goose`` field itself (``goose generate --json``'s report has the same fields: its token ids then
    stand for the text). Lists of texts and references take the answer's ``goose_choices`` (n choices) or a list
    of answers' statistics: every row's text and faults, the drafting over the rows together. Returns (draft tokens
    tested, accepted).

    The wire carries the mean tree size rounded to 2 decimals: the drafted count is exact up to 100 passes.
    """
    body = served.model_dump() if hasattr(served, "model_dump") else served
    batch = not isinstance(text, str) and all(isinstance(row, str) for row in text)
    if isinstance(body, list) or "sources" in body:  # the statistics themselves
        stats = list(body) if batch else [body]
    else:
        stats = body.get("goose_choices") if batch else [body.get("goose")]
        assert stats and None not in stats, f"no Goose statistics in the answer: {served}"
    texts, references = (list(text), list(reference)) if batch else ([text], [reference])
    assert len(texts) == len(references) == len(stats), (
        f"{len(texts)} texts, {len(stats)} statistics, {len(references)} references")
    name = f"{label}: " if label != "" else ""
    for i, (got, expected, entry) in enumerate(zip(texts, references, stats, strict=True)):
        at = f"{name}row {i}: " if batch else name
        _assert_output(got, expected if isinstance(expected, str | list) else expected.text, at)
        assert not entry.get("partial"), f"{at}partial statistics: the request's result was lost"
        assert "faults" in entry, f"{at}the server reports no plugin faults: {entry}"
        _assert_no_faults(entry["faults"], at)
    # as assert_lossless counts them: the nodes beyond each pass's anchor, and those the grammar cut
    drafted = sum(round(s["mean_tree_size"] * s["verify_steps"]) - s["verify_steps"]
                  + (s.get("grammar_cut_tokens") or 0) for s in stats)
    return _assert_drafting(name, drafted, sum(s["verify_steps"] for s in stats),
                            [(s["source_tested"], s["source_accepted"]) for s in stats], accepted)


def _assert_output(got: Sequence[Any], want: Sequence[Any], at: str,
                   near_tie: Callable[[list[int]], bool] | None = None) -> None:
    """The output (tokens or text) is the reference's, or parts from it at a near tie; else where they part."""
    if got != want and (near_tie is None or not near_tie(list(got))):
        index = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
        where = (f"first difference at {index}: {got[index]!r} for {want[index]!r}" if index is not None else
                 f"{len(got)} long for {len(want)}")
        raise AssertionError(f"{at}not the reference's output: {where}")


def _assert_no_faults(faults: dict[str, dict[str, Any]], at: str) -> None:
    assert not faults, f"{at}plugin fault while serving the request: " + "; ".join(
        f"{plugin} ({entry['kind']}) {entry['count']}x, first {entry['first']}" for plugin, entry in faults.items())


def _assert_drafting(name: str, drafted: int, steps: int, counts: list[tuple[dict[str, int], dict[str, int]]],
                     accepted: bool) -> tuple[int, int]:
    """Some source drafted, the target tested its tokens and (``accepted``) kept some; (tested, kept) summed over
    ``counts``' (source_tested, source_accepted) pairs."""
    assert drafted > 0, f"{name}no source drafted a token in {steps} passes"
    tested = sum(sum(tried.values()) for tried, _ in counts)
    kept = sum(sum(took.values()) for _, took in counts)
    assert tested > 0, f"{name}{drafted} draft tokens laid, none tested"
    assert kept > 0 or not accepted, f"{name}no draft token accepted of {tested} tested"
    return tested, kept


def lossless_prompts(model: str) -> list[str]:
    """The lossless suite's prompts for ``model`` ("smollm2": 9, "gemma3": 3), read on first use."""
    return list(_lossless_prompts(model))


@functools.cache
def _lossless_prompts(model: str) -> tuple[str, ...]:
    if model == "smollm2":
        return tuple(dataset_prompts("humaneval", 3) + dataset_prompts("gsm8k", 3) + dataset_prompts("mt_bench", 3))
    if model == "gemma3":
        return tuple(dataset_prompts("humaneval", 1) + dataset_prompts("gsm8k", 1) + dataset_prompts("mt_bench", 1))
    raise ValueError(model)


# --- log probabilities ----------------------------------------------------------------------------

TOLERANCE = 1e-4
Row = tuple[Hashable, float, tuple[tuple[Hashable, float], ...]]  # (token, log probability, top alternatives)


def rows(entries: Sequence[TokenLogprob], tokenizer: Any = None) -> list[Row]:
    """Entries as rows; with ``tokenizer`` each token named by its text, as the server names it."""
    def name(token: int) -> Hashable:
        return token if tokenizer is None else tokenizer.decode([token], skip_special_tokens=False)

    return [(name(entry.token_id), entry.logprob, tuple((name(token), logprob) for token, logprob in entry.top))
            for entry in entries]


def assert_same_logprobs(got: Sequence[TokenLogprob | Row], expected: Sequence[TokenLogprob | Row]) -> None:
    """Same tokens; each log probability and each top alternative's within TOLERANCE (two alternatives whose
    values are within it may come in either order)."""
    mine_rows = [row if isinstance(row, tuple) else rows([row])[0] for row in got]
    their_rows = [row if isinstance(row, tuple) else rows([row])[0] for row in expected]
    assert [row[0] for row in mine_rows] == [row[0] for row in their_rows]
    for position, (mine, theirs) in enumerate(zip(mine_rows, their_rows, strict=True)):
        assert abs(mine[1] - theirs[1]) <= TOLERANCE, (position, mine, theirs)
        assert len(mine[2]) == len(theirs[2]), (position, mine, theirs)
        for (token, logprob), (expected_token, expected_logprob) in zip(mine[2], theirs[2], strict=True):
            assert abs(logprob - expected_logprob) <= TOLERANCE, (position, mine, theirs)
            if token != expected_token:  # a near tie, listed the other way round
                assert abs(dict(theirs[2]).get(token, -math.inf) - logprob) <= TOLERANCE, (position, mine, theirs)


_REFERENCES: dict[str, GenerationResult] = {}


def ar_logprobs(model: Any, tokenizer: Any, prompt_ids: list[int], max_new_tokens: int, top: int,
                **sampling: Any) -> GenerationResult:
    """The autoregressive loop's run with log probabilities (``top`` alternatives), once per test process."""
    key = json.dumps([prompt_ids, max_new_tokens, top, sorted(sampling.items())])
    if key not in _REFERENCES:
        _REFERENCES[key] = AutoregressiveDecoder(model, tokenizer, chat=False).generate(
            prompt_ids, max_new_tokens, logprobs=top, **sampling)
    return _REFERENCES[key]


# --- structured outputs ---------------------------------------------------------------------------

# objects, an array, an enum, a nested object with a required field, a string pattern
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z_]+$"},
        "role": {"enum": ["admin", "user", "guest"]},
        "skills": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                    "required": ["city"], "additionalProperties": False},
    },
    "required": ["name", "role", "skills", "address"],
    "additionalProperties": False,
}
# the repeated prose is what context match copies: drafts of it inside the JSON are forbidden, and cut
FACT = "The user bob_smith is an admin, knows python and rust, and lives in Paris. "
PROMPT = (FACT + FACT + 'Reply with one line of JSON, like {"name": "ann_lee", "role": "guest", "skills": ["go"], '
          '"address": {"city": "Rome"}}.')


# --- sources: verification outcomes and a datastore corpus --------------------------------------


def make_outcome(source_names: tuple[str, ...], chains: dict[str, list[int]], accepted_per_source: dict[str, int],
                 harvest: Harvest | None = None) -> VerifyOutcome:
    """A verification outcome: each source's chain hangs off the anchor; the first
    ``accepted_per_source[name]`` nodes of each chain are accepted, the next one is reached and rejected."""
    builder = TreeBuilder(anchor=5, source_names=source_names, capacity=64)
    reached_nodes, accepted_nodes = [], []
    for name, chain in chains.items():
        nodes = builder.add_chain(0, np.array(chain), builder.source_id(name)).tolist()
        accepted = accepted_per_source.get(name, 0)
        accepted_nodes += nodes[:accepted]
        reached_nodes += nodes[: accepted + 1]
    tree = builder.build()
    reached = np.zeros(tree.size, dtype=np.bool_)
    reached[reached_nodes] = True
    accepted = np.zeros(tree.size, dtype=np.bool_)
    accepted[accepted_nodes] = True
    return VerifyOutcome(tree=tree, accepted_nodes=np.array(accepted_nodes, dtype=np.int64), new_tokens=[],
                         bonus_token=7, reached=reached, accepted=accepted, path_kind=PathKind.SPINE,
                         harvest=harvest if harvest is not None else Harvest.empty(10))


def own(outcome: VerifyOutcome, name: str) -> np.ndarray:
    """The nodes ``name`` laid in ``outcome``'s tree (what the decoder passes a source as ``own_nodes``)."""
    return outcome.tree.source_ids == outcome.tree.source_names.index(name)


SMALL_CORPUS = ["functools.py", "dataclasses.py", "textwrap.py", "heapq.py", "bisect.py", "string.py", "copy.py",
                "keyword.py", "operator.py", "statistics.py"]


def stdlib_sample(folder: Path) -> Path:
    """Copies of SMALL_CORPUS in ``folder`` (a datastore's sources, never benchmark data)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    folder.mkdir(parents=True, exist_ok=True)
    for name in SMALL_CORPUS:
        (folder / name).write_text((root / name).read_text(encoding="utf-8"), encoding="utf-8")
    return folder


# --- planners: a successor table, tree invariants, random drafts ---------------------------------


class TransitionTable:
    """A bigram successor table: k successors of every (previous, token) pair with fixed scores.

    ``holes`` is the share of entries that are unknown (-1), to exercise sparse tables.
    """

    def __init__(self, vocab: int = 200, width: int = 10, seed: int = 0, first: float = 0.6,
                 decay: float = 0.5, holes: float = 0.0, rows: int = 997) -> None:
        generator = np.random.default_rng(seed)
        self.vocab, self.rows = vocab, rows
        self.tokens = np.stack([generator.permutation(vocab)[:width] for _ in range(rows)]).astype(np.int64)
        self.tokens[generator.random((rows, width)) < holes] = -1
        self.scores = np.tile(first * decay ** np.arange(width, dtype=np.float64), (rows, 1))
        self.scores[self.tokens < 0] = 0.0
        self.calls = 0

    def row(self, previous: np.ndarray | int, tokens: np.ndarray | int) -> np.ndarray:
        return (np.asarray(tokens) * 31 + np.maximum(previous, 0) * 7 + 1) % self.rows

    def __call__(self, previous: np.ndarray, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        rows = self.row(previous, tokens)
        found, scores = np.full((rows.shape[0], k), -1, dtype=np.int64), np.zeros((rows.shape[0], k))
        width = min(k, self.tokens.shape[1])
        found[:, :width], scores[:, :width] = self.tokens[rows, :width], self.scores[rows, :width]
        return found, scores

    def score(self, previous: int, token: int, successor: int) -> float:
        """The conditional score the table gives ``successor`` after (previous, token); 0 if absent."""
        row = int(self.row(previous, token))
        hit = np.flatnonzero(self.tokens[row] == successor)
        return float(self.scores[row, hit[0]]) if hit.shape[0] else 0.0


def check_tree(tree: DraftTree, budget: int, pool: CandidatePool) -> None:
    """Invariants every planner's tree must keep."""
    n = tree.size
    assert tree.draft_size <= budget
    assert tree.parents[0] == -1 and tree.tokens[0] == pool.anchor and tree.source_ids[0] == -1
    assert bool((tree.parents[1:] < np.arange(1, n)).all()) and bool((tree.parents[1:] >= 0).all())
    assert bool((tree.depths[1:] == tree.depths[tree.parents[1:]] + 1).all())
    pairs = set(zip(tree.parents.tolist(), tree.tokens.tolist(), strict=True))
    assert len(pairs) == n, "a (parent, token) pair is laid twice"
    assert bool((tree.source_ids[1:] >= 0).all()) and bool((tree.source_ids < len(pool.source_names)).all())
    spine = np.flatnonzero(tree.on_spine)
    if spine.shape[0]:  # the spine is one chain from the root, laid by the most trusted drafting source
        assert tree.parents[spine].tolist() == [0, *spine[:-1].tolist()]
        assert set(tree.source_ids[spine].tolist()) == {pool.drafting[0].source_id}


@st.composite
def random_drafts(draw: st.DrawFn, vocab: int, share: list[int] | None = None) -> Draft | None:
    """A chain or a small trie of up to 25 tokens; with ``share``, sometimes starting like that draft."""
    length = draw(st.integers(0, 25))
    if length == 0:
        return None
    tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=length, max_size=length))
    if share and draw(st.booleans()):  # start like the other draft, to exercise divergence points
        cut = draw(st.integers(0, min(len(share), length)))
        tokens[:cut] = share[:cut]
    tokens = np.array(tokens)
    scores = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=length, max_size=length)))
    consensus = draw(st.integers(0, 12))
    if draw(st.booleans()):
        return Draft.chain(tokens, scores, consensus=consensus)
    parents = np.array([draw(st.integers(-1, i - 1)) for i in range(length)])
    return Draft(tokens=tokens, parents=parents, scores=scores, consensus=consensus)


# --- goose serve: a real server process ---------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m"
API_KEY = "goose-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=60, **kwargs)

    def post(self, path: str, body: Any, *, raw: bytes | None = None, headers: dict[str, str] | None = None,
             timeout: float = 120) -> httpx.Response:
        content = raw if raw is not None else json.dumps(body).encode()
        return httpx.post(self.url + path, content=content, timeout=timeout,
                          headers={"Content-Type": "application/json", **AUTH, **(headers or {})})

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics, parsed by prometheus_client: (name, sorted labels) -> value."""
        text = self.get("/metrics").text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def stop(self, timeout_s: float = 60) -> None:
        """SIGTERM, as Ctrl-C would; killed if it has not exited within ``timeout_s``."""
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def wait_idle(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            health = self.get("/health").json()
            if not health["busy"] and health["waiting"] == 0:
                return
            time.sleep(0.1)
        pytest.fail(f"the server stayed busy for {timeout_s} s: {health}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_server(command: list[str], port: int, log: Path) -> Server:
    """Start ``goose serve`` (``command``) and wait until its /health answers; the test fails if it never does."""
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=REPO)
    running = Server(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 300  # model load from the cache, decoder, warm-up
    while True:
        if process.poll() is not None:
            pytest.fail(f"goose serve exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if running.get("/health").status_code == 200:
                return running
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"goose serve did not come up:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)


class ServerReference:
    """Greedy autoregressive output of the same model in this process: (text, token count, finish reason).

    The runs come from the session's ``ar_reference`` (each computed once per test run)."""

    def __init__(self, model: Any, tokenizer: Any, ar_reference: Any) -> None:
        self.model, self.tokenizer, self.ar_reference = model, tokenizer, ar_reference

    def chat(self, messages: list[dict[str, str]], max_tokens: int) -> tuple[str, int, str]:
        return self._run(encode_chat(self.tokenizer, messages), max_tokens)

    def completion(self, prompt: str, max_tokens: int) -> tuple[str, int, str]:
        return self._run(self.ids(prompt), max_tokens)

    def ids(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, chat=False)

    def generate(self, prompt_ids: list[int], max_tokens: int, **options: Any) -> Any:
        return self.ar_reference(self.model, self.tokenizer, prompt_ids, max_tokens, chat=False, **options)

    def _run(self, prompt_ids: list[int], max_tokens: int) -> tuple[str, int, str]:
        result = self.generate(prompt_ids, max_tokens)
        return result.text, len(result.new_token_ids), "stop" if result.stop_reason == "eos" else "length"


def stream_chat(client: openai.OpenAI, **request: Any) -> tuple[str, list[Any]]:
    chunks = list(client.chat.completions.create(stream=True, **request))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def completion_rows(logprobs: Any, top: int) -> list[Row]:
    """A completion's logprobs as rows; each top dict holds the k alternatives and the chosen token (OpenAI's
    "up to k + 1"), so the alternatives are its k best items."""
    result = []
    for token, logprob, alternatives in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs,
                                            strict=True):
        assert token in alternatives and abs(alternatives[token] - logprob) <= 1e-6
        best = sorted(alternatives.items(), key=lambda item: -item[1])[:top]
        result.append((token, logprob, tuple(best)))
    return result
