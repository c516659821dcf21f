"""GooseProposer's bookkeeping, driven step by step the way vLLM's model runner drives it.

The steps replay greedy verification against SmolLM2's real outputs (the reference run): a draft
token is accepted while it equals the output, then the output's next token is the bonus. The
proposer gets exactly what vLLM hands it (sampled tokens per row, the token table, row lengths),
built from vLLM's own configuration objects, and rows move between steps as vLLM moves them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from vllm.engine.arg_utils import EngineArgs

from goose_vllm import ChainCut, GooseProposer, ProposerConfig, StepCost
from tests.vllm.conftest import MAX_MODEL_LEN, MAX_NUM_SEQS, goose_speculation


class FixedCutProposer(GooseProposer):
    """Chains cut at a fixed path probability, so that a run does not depend on the machine's step times."""

    config = ProposerConfig(min_path_probability=0.1)


@pytest.fixture(scope="module")
def vllm_config(model_path):
    return EngineArgs(model=model_path, dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS,
                      enforce_eager=True, speculative_config=goose_speculation()).create_engine_config()


@dataclass
class Request:
    prompt: list[int]
    output: list[int]  # what the target generates: the verifier's ground truth
    produced: int = 1  # the prefill step gave the first output token
    sampled: list[int] = field(default_factory=list)
    trace: list[tuple[int, int]] = field(default_factory=list)  # (draft length, accepted) per step

    def __post_init__(self) -> None:
        self.sampled = self.output[:1]

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output[: self.produced]

    @property
    def done(self) -> bool:
        return self.produced >= len(self.output)

    def verify(self, draft: list[int]) -> None:
        """Greedy verification: the longest draft prefix the target agrees with, then the target's own token."""
        accepted = 0
        while (accepted < len(draft) and self.produced + accepted < len(self.output)
               and draft[accepted] == self.output[self.produced + accepted]):
            accepted += 1
        self.sampled = self.output[self.produced : self.produced + accepted + 1]
        self.produced += len(self.sampled)
        self.trace.append((len(draft), accepted))


def decode(proposer: GooseProposer, requests: list[Request], move_rows: bool) -> None:
    """Step until every request is done; with ``move_rows`` the row order rotates every step."""
    table = np.zeros((MAX_NUM_SEQS, MAX_MODEL_LEN), dtype=np.int32)
    step = 0
    while live := [request for request in requests if not request.done]:
        if move_rows:
            shift = step % len(live)
            live = live[shift:] + live[:shift]
        lengths = np.zeros(MAX_NUM_SEQS, dtype=np.int32)
        for row, request in enumerate(live):
            lengths[row] = len(request.tokens)
            table[row, : lengths[row]] = request.tokens
        drafts = proposer.propose([request.sampled for request in live], lengths, table)
        assert len(drafts) == len(live)
        for request, draft in zip(live, drafts, strict=True):
            request.verify(list(draft))
        step += 1


def requests_of(prompts, reference, indices) -> list[Request]:
    return [Request(list(prompts[i]), list(reference[i])) for i in indices]


def drafters(proposer: GooseProposer) -> set[int]:
    return {id(entry.drafter) for entries in proposer.requests.by_key.values() for entry in entries}


def test_state_follows_requests_when_rows_move(vllm_config, prompts, reference):
    """The same drafts and the same learning whether the requests keep their rows or change them every step."""
    still = requests_of(prompts, reference, range(3))
    decode(FixedCutProposer(vllm_config), still, move_rows=False)
    proposer = FixedCutProposer(vllm_config)
    moving = requests_of(prompts, reference, range(3))
    decode(proposer, moving, move_rows=True)
    for first, second in zip(still, moving, strict=True):
        assert second.trace == first.trace
    assert sum(accepted for request in moving for _, accepted in request.trace) > 0
    assert len(drafters(proposer)) == 3  # one drafter per request, none restarted when its row moved
    # context match learned; the suffix memory (the default's second source) has no finished request to draft from
    assert proposer.estimates["context_match"].cycles > 0
    assert set(proposer.estimates) == {"context_match", "suffix_memory"}


def test_identical_prompts_in_one_batch_get_one_state_each(vllm_config, prompts, reference):
    proposer = FixedCutProposer(vllm_config)
    twins = requests_of(prompts, reference, [0, 0])
    decode(proposer, twins, move_rows=True)
    assert twins[0].trace == twins[1].trace
    assert any(length for length, _ in twins[0].trace)
    assert len(drafters(proposer)) == 2


def test_a_finished_requests_drafter_serves_the_next_request(vllm_config, prompts, reference):
    """One request after another (batch 1): one drafter, whose source state carries over as in Goose."""
    proposer = FixedCutProposer(vllm_config)
    for index in range(3):
        decode(proposer, requests_of(prompts, reference, [index]), move_rows=False)
    assert len(drafters(proposer)) == 1


class ContextMatchProposer(FixedCutProposer):
    config = ProposerConfig(min_path_probability=0.1, sources=["context_match"])


def test_the_suffix_memory_drafts_a_request_from_an_earlier_one(vllm_config, prompts, reference):
    """The same prompt again (batch 1): the default proposer remembers the first answer, context match alone cannot."""
    steps = {}
    for proposer in (ContextMatchProposer(vllm_config), FixedCutProposer(vllm_config)):
        first, second = requests_of(prompts, reference, [1]), requests_of(prompts, reference, [1])
        decode(proposer, first, move_rows=False)
        decode(proposer, second, move_rows=False)
        steps[type(proposer).__name__] = (len(first[0].trace), len(second[0].trace))
    alone, default = steps["ContextMatchProposer"], steps["FixedCutProposer"]
    # context match keeps only its estimates across requests; the memory drafts the whole answer again
    assert default[1] < default[0] / 2 and default[1] < alone[1] / 2


class UnsharedMemoryProposer(FixedCutProposer):
    config = ProposerConfig(min_path_probability=0.1, share_memory=False)


def test_drafters_share_the_memory_of_finished_requests(vllm_config, prompts, reference):
    """Two requests together after one alone: the new drafter drafts the repeated one from the first answer too."""
    steps = {}
    for proposer in (UnsharedMemoryProposer(vllm_config), FixedCutProposer(vllm_config)):
        first = requests_of(prompts, reference, [1])
        decode(proposer, first, move_rows=False)
        # the other prompt takes row 0 and with it the first request's drafter; the repeat gets a new drafter
        pair = requests_of(prompts, reference, [2, 1])
        decode(proposer, pair, move_rows=False)
        steps[type(proposer).__name__] = (len(first[0].trace), len(pair[1].trace))
        assert len(drafters(proposer)) == 2
    unshared, shared = steps["UnsharedMemoryProposer"], steps["FixedCutProposer"]
    assert shared[1] < shared[0] / 2 and shared[1] < unshared[1] / 2


def test_step_cost_fit_and_chain_cut():
    cost = StepCost()
    assert cost.cut(rows=1) is None  # nothing measured yet
    for step in range(60):
        tokens = 1 + step % 17
        cost.observe(tokens, 0.020 + 0.0013 * tokens)
    cost.observe(5, 2.0)  # a stall far off the line is ignored
    fixed, per_token = cost.fit()
    assert fixed == pytest.approx(0.020, rel=1e-6) and per_token == pytest.approx(0.0013, rel=1e-6)
    cut = cost.cut(rows=1)
    sure = np.cumprod(np.full(16, 0.95))
    assert cut.length(sure)[0] == 16  # a trusted copy: all K tokens are worth their verify rows
    hopeless = np.cumprod(np.full(16, 0.02))
    assert cut.length(hopeless)[0] == 0  # a 2% token is not worth 1.3 ms of a 21 ms step
    # the fixed cost shared by four rows makes each row's draft tokens relatively dearer
    middling = np.cumprod(np.full(16, 0.7))
    assert cost.cut(rows=4).length(middling)[0] < cut.length(middling)[0]
    assert ChainCut(threshold=0.5).length(middling)[0] == 1  # 0.7 kept, 0.49 not
