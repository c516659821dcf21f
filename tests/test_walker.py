"""The walks: greedy (longest agreed path, bonus token, path kinds, source priority) and sampled."""

from __future__ import annotations

import numpy as np

from goose.contract.outcome import PathKind
from goose.contract.tree import TreeBuilder
from goose.cycle.walker import walk, walk_sampled

SPINE, BRANCH = 0, 1


def spine_tree():
    """anchor 1 -> spine 10, 11, 12; root branch 20 -> 21; branch 30 off the first spine node."""
    builder = TreeBuilder(1, ("context_match", "bigram_transition"), capacity=10)
    builder.add_chain(0, np.array([10, 11, 12]), SPINE, spine=True)  # nodes 1, 2, 3
    builder.add_children(np.array([0, 1]), np.array([20, 30]), BRANCH)  # nodes 4, 5
    builder.add_children(np.array([4]), np.array([21]), BRANCH)  # node 6
    return builder.build()


def predictions_for(tree, next_token: dict[int, int]) -> np.ndarray:
    """The target's argmax per node: ``next_token[node]`` or an unrelated token."""
    return np.array([next_token.get(i, 999) for i in range(tree.size)])


def test_pure_spine_with_bonus() -> None:
    tree = spine_tree()
    walked = walk(tree, predictions_for(tree, {0: 10, 1: 11, 2: 12, 3: 13}))
    assert walked.tokens == [10, 11, 12, 13] and walked.kind is PathKind.SPINE
    assert walked.path.tolist() == [1, 2, 3]


def test_pure_branch() -> None:
    tree = spine_tree()
    walked = walk(tree, predictions_for(tree, {0: 20, 4: 21, 6: 22}))
    assert walked.tokens == [20, 21, 22] and walked.kind is PathKind.BRANCH


def test_spine_continuation() -> None:
    tree = spine_tree()
    walked = walk(tree, predictions_for(tree, {0: 10, 1: 30, 5: 31}))
    assert walked.tokens == [10, 30, 31] and walked.kind is PathKind.CONTINUATION


def test_bonus_only_and_fates() -> None:
    tree = spine_tree()
    walked = walk(tree, predictions_for(tree, {0: 77}))
    assert walked.tokens == [77] and walked.kind is PathKind.BONUS and walked.path.shape[0] == 0
    # the anchor's children were tested, nothing else
    assert walked.reached.tolist() == [False, True, False, False, True, False, False]
    assert not walked.accepted.any()


def test_duplicate_proposals_keep_the_trusted_tag() -> None:
    """Both sources propose 11 after 10: one node, tagged with the spine source laid first."""
    builder = TreeBuilder(1, ("context_match", "bigram_transition"), capacity=10)
    builder.add_chain(0, np.array([10, 11]), SPINE, spine=True)
    builder.add_children(np.array([1, 1]), np.array([11, 40]), BRANCH)
    tree = builder.build()
    walked = walk(tree, predictions_for(tree, {0: 10, 1: 11, 2: 5}))
    assert walked.tokens == [10, 11, 5]
    assert tree.source_ids[walked.path].tolist() == [SPINE, SPINE]


def test_sampled_walk_follows_the_drawn_tokens_and_draws_only_on_its_path() -> None:
    """A sampled walk draws at the anchor's row, moves to the child holding the drawn token, and so on."""
    tree = spine_tree()
    for next_token, tokens, kind in (
        ({0: 10, 1: 11, 2: 12, 3: 13}, [10, 11, 12, 13], PathKind.SPINE),
        ({0: 20, 4: 21, 6: 22}, [20, 21, 22], PathKind.BRANCH),
        ({0: 10, 1: 30, 5: 31}, [10, 30, 31], PathKind.CONTINUATION),
        ({0: 77}, [77], PathKind.BONUS),
    ):
        drawn_at: list[int] = []

        def draw(node: int, table: dict[int, int] = next_token, log: list[int] = drawn_at) -> int:
            log.append(node)
            return table.get(node, 999)

        walked = walk_sampled(tree, draw)
        greedy = walk(tree, predictions_for(tree, next_token))
        assert walked.tokens == tokens == greedy.tokens and walked.kind is kind
        assert np.array_equal(walked.reached, greedy.reached) and np.array_equal(walked.accepted, greedy.accepted)
        assert drawn_at == [0, *walked.path.tolist()]  # one draw per row on the path, none elsewhere


def test_rows_drawn_in_one_batch_are_the_rows_drawn_one_by_one(tiny) -> None:
    """``Sampler.draw_rows`` over a batch of a model's rows gives each row the token ``draw`` gives it alone."""
    import torch

    from goose.cycle.sampling import Sampler, SamplingParams

    model, tokenizer = tiny
    ids = tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n    return")
    with torch.inference_mode():
        rows = model(input_ids=torch.tensor([ids])).logits[0, -12:]
    positions = list(range(30, 42))
    for params in (SamplingParams(temperature=0.8), SamplingParams(temperature=1.0, top_k=20),
                   SamplingParams(temperature=0.7, top_k=50, top_p=0.9), SamplingParams(temperature=0.7, top_p=0.9)):
        for seed in range(5):
            sampler = Sampler(params, seed)
            one_by_one = [sampler.draw(row, position) for row, position in zip(rows, positions, strict=True)]
            assert sampler.draw_rows(rows, positions).tolist() == one_by_one
    # top-p alone on bfloat16 rows (ties everywhere), peaked and flat: their nuclei are read from different
    # numbers of candidates, yet each row keeps what it keeps alone
    generator = torch.Generator().manual_seed(0)
    rows = (torch.randn(12, 32_768, generator=generator) * torch.linspace(0.3, 6.0, 12)[:, None]).to(torch.bfloat16)
    for top_p in (0.5, 0.95):
        sampler = Sampler(SamplingParams(temperature=1.0, top_p=top_p), 1)
        one_by_one = [sampler.draw(row, position) for row, position in zip(rows, positions, strict=True)]
        assert sampler.draw_rows(rows, positions).tolist() == one_by_one
        kept = [len(sampler.support(row)[0]) for row in rows]
        assert kept[0] > 4 * 64 > kept[-1]  # flat rows needed more rounds than peaked ones


def test_the_batched_sampled_walk_is_the_seeded_autoregressive_sampler(tiny) -> None:
    """Every tree row drawn in one batch (as on a GPU), float32: token for token the seeded sampler's output."""
    from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder

    model, tokenizer = tiny
    prompt = "Repeat after me: one two three four five six seven. One two three four five six seven."
    for options in ({"temperature": 0.7, "seed": 3}, {"temperature": 1.0, "top_k": 40, "seed": 11},
                    {"temperature": 0.9, "top_p": 0.8, "seed": 5}):
        reference = AutoregressiveDecoder(model, tokenizer).generate(prompt, 32, **options).new_token_ids
        decoder = GooseDecoder(model, tokenizer, budget=12)
        decoder.drafter.draw_all_rows = True
        result = decoder.generate(prompt, 32, **options)
        assert result.new_token_ids == reference
        assert result.stats.verify_steps < 32  # drafts were accepted: the walk went past the anchor's row
