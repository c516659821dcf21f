"""What the vLLM proposer's sources learn from vLLM's verdict on a chain, without vLLM: the walk of the
chain vLLM verified, as Goose's own decoder walks its trees."""

from __future__ import annotations

import numpy as np
import pytest

from goose.boundary import FaultLog
from goose.config import GooseConfig
from goose.contract.tree import ROOT, TreeBuilder
from goose_vllm import Chain, RowDrafter

CHAIN = [5, 6, 7, 8]


@pytest.mark.parametrize(("sampled", "tested", "accepted"), [
    ([5, 6, 9], 3, 2),  # two accepted, the third tested and rejected; vLLM's own token follows
    ([5, 6, 7, 8, 11], 4, 4),  # the whole chain, then the bonus
    ([9], 1, 0),  # the first token rejected
    ([5, 6, 7], 2, 2),  # vLLM's token is the chain's next: the scheduler cut the chain there, untested
    ([5], 0, 0),  # cut before its first token: nothing tested
    ([6, 9], 0, 0),  # not this chain's request: nothing learned
])
def test_the_sources_learn_what_vllm_tested_and_accepted(sampled, tested, accepted) -> None:
    config = GooseConfig(sources=["context_match"])
    drafter = RowDrafter(config.sources, config, vocab_size=100, eos_token_ids=frozenset({0}), tokenizer=None,
                         faults=FaultLog(), estimates=None)
    drafter.start(np.array([1, 2, 3, 4, 1, 2, 3, 4]), 4)
    builder = TreeBuilder(4, drafter.sources.names, capacity=len(CHAIN))
    builder.add_chain(ROOT, np.array(CHAIN), 0, spine=True)
    drafter.pending = Chain(CHAIN, 0, builder.build())
    estimate = drafter.sources.estimates["context_match"]
    rate, cycles = estimate.rate, estimate.cycles
    drafter.learn(sampled)
    assert estimate.cycles == cycles + (tested > 0) and drafter.pending is None
    expected = rate + config.ema * (accepted / tested - rate) if tested else rate
    assert estimate.rate == pytest.approx(expected)
