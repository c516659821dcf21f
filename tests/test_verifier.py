"""Tree verification equals sequential decoding: every node's logits match its root path run alone.

Random trees (hypothesis) go through the real verifier in float32 on tiny random-weight models of SmolLM2's
architecture (grouped-query attention) and of Gemma 3's (a sliding window of 32 tokens, crossed here); each
node's logits are compared with a plain causal forward of context + anchor + the node's root path. Also: cache
compaction leaves the cache exactly as if only the accepted path had been fed. The real models' trees are
checked by the lossless tests.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goose.contract.tree import DraftTree, TreeBuilder
from goose.cycle.attention import VERIFY_SDPA
from goose.cycle.decoder import AutoregressiveDecoder
from goose.cycle.verifier import Verifier
from goose.cycle.walker import walk

TOLERANCE = 2e-4  # float32; observed differences are ~5e-5 (different matmul shapes, same math)


def build_tree(anchor: int, parent_choices: list[int], tokens: list[int]) -> DraftTree:
    builder = TreeBuilder(anchor, ("test",), capacity=len(tokens))
    for choice, token in zip(parent_choices, tokens, strict=True):
        builder.add_children(np.array([choice % builder.size]), np.array([token]), source=0)
    return builder.build()


@torch.inference_mode()
def sequential_logits(model, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids], device=model.device), logits_to_keep=1).logits[0, -1]


def check_tree_against_sequential(model, context: list[int], tree: DraftTree) -> None:
    verifier = Verifier(model)
    verifier.prefill(context[:-1])
    logits = verifier.verify([tree])[0]
    assert logits.shape[0] == tree.size
    for node in range(tree.size):
        path_tokens = tree.tokens[tree.root_path(node)].tolist()
        expected = sequential_logits(model, context + path_tokens)
        difference = (logits[node] - expected).abs().max().item()
        assert difference < TOLERANCE, f"node {node}: max |diff| {difference:.2e}"


tree_specs = st.integers(1, 10).flatmap(
    lambda n: st.tuples(st.lists(st.integers(0, 99), min_size=n, max_size=n),
                        st.lists(st.integers(0, 7), min_size=n, max_size=n))
)


@given(tree_specs)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_trees_match_sequential_llama(tiny, spec) -> None:
    model, tokenizer = tiny
    context = tokenizer.encode("def add(a, b):\n    return a + b\n\nprint(add(1, 2))")
    vocabulary = tokenizer.encode(" the a b return def ( ) :")  # real, plausible token ids
    parents, picks = spec
    tree = build_tree(context[-1], parents, [vocabulary[p % len(vocabulary)] for p in picks])
    check_tree_against_sequential(model, context, tree)


@given(tree_specs)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_trees_match_sequential_gemma3(tiny_gemma3, spec) -> None:
    model, tokenizer = tiny_gemma3
    context = tokenizer.encode("The quick brown fox jumps over the lazy dog. The quick brown")
    vocabulary = tokenizer.encode(" fox dog the lazy quick jumps over")
    parents, picks = spec
    tree = build_tree(context[-1], parents, [vocabulary[p % len(vocabulary)] for p in picks])
    check_tree_against_sequential(model, context, tree)


def window_context(tokenizer) -> list[int]:
    """75 tokens: past the tiny Gemma 3's 32-token window by more than twice its width."""
    text = " ".join(f"item {i} costs {i * 7 % 13} dollars." for i in range(20))
    return tokenizer.encode(text)[:75]


def test_gemma3_tree_past_the_sliding_window(tiny_gemma3) -> None:
    """With 75 tokens of context the sliding layer must see only the last 32 positions."""
    model, tokenizer = tiny_gemma3
    context = window_context(tokenizer)
    assert len(context) == 75 and Verifier(model).sliding_window == 32
    tree = build_tree(context[-1], [0, 0, 1, 2, 1], tokenizer.encode(" item costs 3 dollars.")[:5])
    check_tree_against_sequential(model, context, tree)


def test_commit_keeps_exactly_the_accepted_path(tiny) -> None:
    """After compaction the next token's logits equal those of a plain forward over the accepted text."""
    model, tokenizer = tiny
    context = tokenizer.encode("for i in range(10):\n    print(i)\nfor j in range(")
    verifier = Verifier(model)
    verifier.prefill(context[:-1])
    # the model's own greedy continuation, so the walk accepts a path of several nodes past the decoy
    branch = AutoregressiveDecoder(model, tokenizer, chat=False).generate(context, 6).new_token_ids[:-1]
    decoy = (branch[0] + 1) % len(tokenizer)
    builder = TreeBuilder(context[-1], ("test",), capacity=len(branch) + 1)
    builder.add_children(np.array([0]), np.array([decoy]), source=0)  # node 1: a sibling decoy
    builder.add_chain(0, np.array(branch), source=0)
    tree = builder.build()
    logits = verifier.verify([tree])[0]
    walked = walk(tree, logits.argmax(-1).cpu().numpy())
    assert walked.path.tolist() == [2, 3, 4, 5, 6]  # the branch whole: rows 0, 2.. 6 kept, the decoy's row 1 not
    verifier.commit(0, walked.path)
    accepted = context + tree.tokens[walked.path].tolist()
    assert verifier.lengths == [len(accepted)]  # the slot's context: the accepted path, nothing else
    next_logits = verifier.verify([DraftTree.single(walked.bonus_token)])[0][0]
    expected = sequential_logits(model, [*accepted, walked.bonus_token])
    assert (next_logits - expected).abs().max().item() < TOLERANCE


def test_the_cache_grows_in_place_across_many_passes(tiny) -> None:
    """Storage that doubles: dozens of passes and commits past its first block, the cache still equals a plain
    forward."""
    model, tokenizer = tiny
    context = tokenizer.encode("Count: " + ", ".join(map(str, range(1, 80))) + ",")[:200]
    verifier = Verifier(model)
    verifier.prefill(context[:-1])
    accepted = list(context)
    for step in range(60):  # from 200 rows past the first storage block of 256, and its doubling
        tree = build_tree(accepted[-1], [0, 0, 1], [11 + step % 5, 12, 13])
        logits = verifier.verify([tree])[0]
        walked = walk(tree, logits.argmax(-1).cpu().numpy())
        verifier.commit(0, walked.path)
        accepted += [*tree.tokens[walked.path].tolist(), walked.bonus_token]  # the bonus: the next anchor
    assert verifier.lengths[0] == len(accepted) - 1 > 256
    next_logits = verifier.verify([DraftTree.single(accepted[-1])])[0][0]
    expected = sequential_logits(model, accepted)
    assert (next_logits - expected).abs().max().item() < TOLERANCE


def _commit_tree_paths(model, context: list[int], stacked: bool) -> Verifier:
    """Passes of small trees whose accepted paths skip rows (non-chain commits), with the layer stack or without."""
    verifier = Verifier(model)
    verifier.stacked = stacked
    verifier.reset()  # the cache's storage, made afresh as ``stacked`` says
    verifier.prefill(context[:-1])
    anchor = context[-1]
    for step in range(6):
        # node 1 is a decoy sibling, so a path through node 2 keeps rows 0, 2, 3, ...: the kept rows move
        tree = build_tree(anchor, [0, 0, 2, 3, 2], [7 + step, 11, 12 + step, 13, 14])
        verifier.verify([tree])
        path = np.array([2, 3, 4][: 1 + step % 3])
        verifier.commit(0, path)
        anchor = 20 + step
    verifier.verify([DraftTree.single(anchor)])  # the last commit's rows move at the start of this pass
    return verifier


def _assert_same_caches(model, context: list[int]) -> None:
    stacked, per_layer = _commit_tree_paths(model, context, True), _commit_tree_paths(model, context, False)
    layers = stacked.cache.layers
    assert len(stacked.stack.members) == len(layers) and not stacked.stack.loners  # one gather moved them all
    assert not per_layer.stack.members and len(per_layer.stack.loners) == len(layers)
    for mine, theirs in zip(layers, per_layer.cache.layers, strict=True):
        assert mine.keys.shape == theirs.keys.shape
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)


def test_one_gather_commit_equals_the_per_layer_commit_llama(tiny) -> None:
    model, tokenizer = tiny
    _assert_same_caches(model, tokenizer.encode("def add(a, b):\n    return a + b\n"))


def test_one_gather_commit_equals_the_per_layer_commit_gemma3_past_the_window(tiny_gemma3) -> None:
    """Gemma 3's sliding-window layers share the stack with its global layers, past the window."""
    model, tokenizer = tiny_gemma3
    _assert_same_caches(model, window_context(tokenizer))


def _tree_logits_both_ways(model, context: list[int], tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor, set]:
    """A tree's logits through the verifier (grouped-query attention) and through stock sdpa, and the
    attention paths the verifier's forward calls asked for (None: stock sdpa)."""
    seen: set = set()
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: seen.add(kwargs.get("goose_attention")),
                                           with_kwargs=True)
    try:
        verifier = Verifier(model)
        verifier.prefill(context)
        grouped = verifier.verify([tree])[0].clone()
    finally:
        hook.remove()
    with torch.inference_mode():  # one plain forward of context + tree, every row with its own mask row
        rows, past = tree.size, len(context)
        mask = torch.zeros(1, 1, past + rows, past + rows, dtype=torch.bool)
        mask[0, 0, :past, :past] = torch.ones(past, past, dtype=torch.bool).tril()
        mask[0, 0, past:, :past] = True
        mask[0, 0, past:, past:] = torch.from_numpy(tree.ancestors)
        positions = torch.cat([torch.arange(past), past + torch.from_numpy(tree.depths)])[None]
        sliding = getattr(model.config, "sliding_window", None)
        stock = model(input_ids=torch.tensor([context + tree.tokens.tolist()]), position_ids=positions,
                      attention_mask={"full_attention": mask, "sliding_attention": mask} if sliding else mask
                      ).logits[0, -rows:]
    return grouped, stock, seen


def test_grouped_query_attention_reads_the_cache_in_place_and_leaves_the_model_as_found(tiny, tiny_gemma3) -> None:
    """Multi-row passes run with the query heads of a key/value group folded into rows (no copy of the cache
    per head); the logits are sdpa's. The model is set once to the attention that runs transformers' sdpa for every
    call but a verify pass (no per-pass switch of a shared model)."""
    for model, tokenizer in (tiny, tiny_gemma3):
        assert model.config._attn_implementation in ("sdpa", VERIFY_SDPA)
        context = tokenizer.encode("def add(a, b):\n    return a + b\n\nprint(add(1, 2))")
        tree = build_tree(context[-1], [0, 1, 0, 2, 4, 1], tokenizer.encode(" the a b return def (")[:6])
        grouped, stock, seen = _tree_logits_both_ways(model, context[:-1], tree)
        assert seen == {None, "grouped"}  # the tree pass took the grouped path (the prefill: stock sdpa)
        assert model.config._attn_implementation == VERIFY_SDPA
        assert (grouped - stock).abs().max().item() < TOLERANCE
        assert torch.equal(grouped.argmax(-1), stock.argmax(-1))
