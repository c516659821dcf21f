"""``--engine llama.cpp``: Goose's trees verified by llama.cpp on SmolLM2's Q4_1 GGUF file as shipped.

The reference is llama.cpp's own greedy decoding of the same file: llama-cpp-python's ``Llama``,
one token a ``llama_decode``, which our ``ar`` on this engine must reproduce token for token.
Goose's tree passes batch rows, and llama.cpp's quantized kernels may round a batch a little
differently from a single row: an output that differs from ``ar``'s must differ at a near-tie of
``ar``'s own logits (goose_bench.mismatch), never more. The tests also check that the sources
drafted and were accepted, the KV cache after an accepted branch, batched requests, sampling and
the errors. They need llama-cpp-python (``make llama-setup``, which ``make test`` runs) built for this
CPU: a build whose recorded instruction sets this CPU lacks (goose.cpu) is not imported, its refusal
is the reason the module is skipped (importing it would die with SIGILL).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from goose import cli, cpu, llama_model, models
from goose.config import GooseConfig
from goose.contract.tree import DraftTree, TreeBuilder
from goose.cycle.calibration import measure
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
from goose.cycle.llama_verifier import LlamaVerifier
from goose.cycle.verifier import ContextOverflowError
from goose.llama_model import GGML_TYPE_BF16, LlamaModel
from goose.planning.cost import CostCurve, cache_key
from goose_bench.mismatch import explain, first_difference
from tests.helpers import assert_lossless

# goose.llama_model.bindings' own check, before anything imports llama_cpp (nothing above does)
REFUSED = cpu.refusal("llama-cpp-python", llama_model.cpu_flags_file(), "make llama-setup")
if REFUSED:
    pytest.skip(REFUSED, allow_module_level=True)
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: `make llama-setup` builds it")

THREADS = int(os.environ.get("GOOSE_TEST_THREADS", "2"))
COPY_PROMPT = "Write the numbers from 1 to 40, separated by commas."  # SmolLM2 writes 1234567890 over and over
PROMPTS = ("Write a Python function that merges two sorted lists.", COPY_PROMPT,
           "Explain how a hash map works, in three paragraphs.")
# the budget's cost curve, fixed so that no test measures one (t(n) / t(1) as llama.cpp's passes cost here)
CURVE = CostCurve((1, 2, 4, 8, 16, 32), (0.010, 0.016, 0.025, 0.040, 0.070, 0.130))
NEAR_TIE = 0.5  # logits: the most a row computed in a batch may part from the one-token row and flip the argmax


@pytest.fixture(scope="module")
def gguf() -> tuple[LlamaModel, Any]:
    return models.load_gguf("smollm2-135m", threads=THREADS)


def _goose(gguf: tuple[LlamaModel, Any], **fields: Any) -> GooseDecoder:
    model, tokenizer = gguf
    return GooseDecoder(model, tokenizer, GooseConfig(**fields), cost_curve=CURVE)


def _agrees(ar: AutoregressiveDecoder, prompt: Any, reference: list[int], other: list[int]) -> bool:
    """Identical, or parted from ``reference`` at a near-tie of ar's own logits (the other token ranked second)."""
    if other == reference:
        return True
    found = explain(ar.verifier, ar.encode(prompt), reference, other)
    assert found is not None and found["replayed"], found
    assert found["token_rank"] <= 2 and found["token_gap"] < NEAR_TIE, found
    return False


def test_ar_on_the_engine_is_llama_cpps_own_greedy_decoding(gguf: tuple[LlamaModel, Any]) -> None:
    """Our ar through the llama.cpp verifier decodes what llama-cpp-python's Llama decodes greedily (with the
    engine's attention settings: flash attention, a bfloat16 V cache)."""
    from llama_cpp import Llama

    model, tokenizer = gguf
    ar = AutoregressiveDecoder(model, tokenizer)
    ids = ar.encode(PROMPTS[0])
    ours = ar.generate(ids, 40).new_token_ids
    llama = Llama(model_path=str(model.path), n_ctx=512, n_threads=THREADS, n_threads_batch=THREADS, flash_attn=True,
                  type_v=GGML_TYPE_BF16, verbose=False)
    theirs = []
    for token in llama.generate(ids, temp=0.0, repeat_penalty=1.0):
        theirs.append(int(token))
        if token in ar.eos_ids or len(theirs) == 40:
            break
    assert ours == theirs and len(ours) == 40


def test_goose_on_the_gguf_file_is_llama_cpps_greedy_output(gguf: tuple[LlamaModel, Any]) -> None:
    """Every output is ar's (or parts from it at a near-tie), with the sources drafting and accepted."""
    model, tokenizer = gguf
    # a fixed budget: every cycle lays a tree through the engine (on the engine's steep curve the automatic
    # budget rightly lays few, and this test is about the rows of trees)
    ar, goose = AutoregressiveDecoder(model, tokenizer), _goose(gguf, budget=8)
    tested, accepted, results, references = {}, {}, [], []
    for prompt in PROMPTS:
        references.append(ar.generate(prompt, 96).new_token_ids)
        results.append(result := goose.generate(prompt, 96))
        for name, count in result.stats.source_tested.items():
            tested[name] = tested.get(name, 0) + count
        for name, count in result.stats.source_accepted.items():
            accepted[name] = accepted.get(name, 0) + count
        if prompt == COPY_PROMPT:  # the digits repeat: context match copies them
            assert result.stats.tau > 1.5 and result.stats.source_accepted["context_match"] > 10
    # one request: its rows round as one-token rows do (flash attention), so every token is ar's
    assert_lossless(results, references)
    assert accepted["context_match"] > 0 and accepted["bigram_transition"] > 0, (tested, accepted)


def test_the_kv_cache_keeps_an_accepted_branch(gguf: tuple[LlamaModel, Any]) -> None:
    """A tree of two branches; the walk takes the second leaf's: the cache then holds context + anchor + that path
    in one sequence, every other sequence is empty, and the next pass reads what a chain of the same tokens gives."""
    model, tokenizer = gguf
    prompt = tokenizer.encode("The quick brown fox jumps over the lazy dog. The quick brown")
    verifier = LlamaVerifier(model)
    first = int(verifier.prefill(prompt)[-1].argmax())
    builder = TreeBuilder(first, ("a", "b"), capacity=5)
    builder.add_chain(0, np.array([11, 12]), 0)  # a wrong branch (leaf 2)
    greedy = []
    chain_check = LlamaVerifier(model)
    chain_check.prefill(prompt)
    logits = chain_check.verify([DraftTree.single(first)])[0][0]
    for _ in range(3):  # the right branch: the greedy continuation, found one token at a time
        greedy.append(int(logits.argmax()))
        chain_check.commit(0, np.zeros(0, dtype=np.int64))
        logits = chain_check.verify([DraftTree.single(greedy[-1])])[0][0]
    builder.add_chain(0, np.array(greedy), 1)
    tree = builder.build()
    assert tree.size == 6
    rows = verifier.verify([tree])[0]
    predictions = rows.argmax(dim=-1).numpy()
    assert predictions[0] == greedy[0] and predictions[3] == greedy[1] and predictions[4] == greedy[2]
    verifier.commit(0, np.array([3, 4, 5]))  # anchor, then the three greedy nodes
    length = len(prompt) + 4
    assert verifier.lengths == [length] and verifier.kept_positions(0) == (0, length - 1)
    slot = verifier._slots[0]
    llama = verifier.llama
    for sequence in slot.pool:
        if sequence != slot.main:
            assert llama.llama_memory_seq_pos_max(verifier.memory, int(sequence)) == -1
    # the same tokens as a plain chain in a fresh context: the next pass reads the same row
    chain = LlamaVerifier(model)
    chain.prefill(prompt)
    builder = TreeBuilder(first, ("a",), capacity=3)
    builder.add_chain(0, np.array(greedy), 0)
    chain.verify([builder.build()])
    chain.commit(0, np.array([1, 2, 3]))
    following = int(predictions[5])
    ours = verifier.verify([DraftTree.single(following)])[0][0].numpy()
    theirs = chain.verify([DraftTree.single(following)])[0][0].numpy()
    assert np.allclose(ours, theirs, atol=2e-2) and ours.argmax() == theirs.argmax()


def test_an_uncommitted_pass_is_forgotten(gguf: tuple[LlamaModel, Any]) -> None:
    """The calibration times passes it never commits: each one finds the cache as the prefill left it."""
    model, tokenizer = gguf
    verifier = LlamaVerifier(model)
    verifier.prefill(tokenizer.encode("Counting: one two three four five"))
    builder = TreeBuilder(42, ("a",), capacity=3)
    builder.add_chain(0, np.array([7, 8, 9]), 0)
    tree = builder.build()
    first = verifier.verify([tree])[0].numpy().copy()
    again = verifier.verify([tree])[0].numpy()
    assert np.array_equal(first, again)
    before = verifier.lengths[0]
    verifier.commit(0, np.array([], dtype=np.int64))  # the anchor alone: the main sequence holds the context and it
    assert verifier.lengths[0] == before + 1 and verifier.kept_positions(0) == (0, before)


def test_requests_decoded_together_are_each_their_own(gguf: tuple[LlamaModel, Any]) -> None:
    """Three requests, at most two in one context (each its own sequences; one leaves, the third takes its slot).
    The budget is fixed: a batch plans on the engine's batch curve, measured on this machine."""
    model, tokenizer = gguf
    ar, goose = AutoregressiveDecoder(model, tokenizer), _goose(gguf, budget=8)
    results = goose.generate_batch(list(PROMPTS), 48, max_batch=2)
    identical = 0
    for prompt, result in zip(PROMPTS, results, strict=True):
        reference = ar.generate(prompt, 48).new_token_ids
        identical += result.new_token_ids == reference
        # a batch's rows may round apart from one-token rows: a difference must sit at a near-tie of ar's logits
        assert_lossless(result, reference, accepted=False, label=prompt,
                        near_tie=lambda ids, p=prompt, r=reference: not _agrees(ar, p, r, ids))
    assert identical >= 2
    assert sum(result.stats.source_accepted.get("context_match", 0) for result in results) > 0


def test_seeded_sampling_on_the_engine_is_the_seeded_sampler(gguf: tuple[LlamaModel, Any]) -> None:
    model, tokenizer = gguf
    ar, goose = AutoregressiveDecoder(model, tokenizer), _goose(gguf)
    for seed, prompt in enumerate(PROMPTS[:2]):
        expected = ar.generate(prompt, 48, temperature=0.8, top_p=0.9, seed=seed).new_token_ids
        result = goose.generate(prompt, 48, temperature=0.8, top_p=0.9, seed=seed)
        assert_lossless(result, expected, accepted=seed == 1, label=prompt)  # the copy prompt's digits are kept


def test_the_first_difference_and_ars_logits_there(gguf: tuple[LlamaModel, Any]) -> None:
    """An output changed at token 5 to ar's runner-up is explained by ar's two top logits there."""
    model, tokenizer = gguf
    ar = AutoregressiveDecoder(model, tokenizer)
    reference = ar.generate(PROMPTS[0], 12).new_token_ids
    assert first_difference(reference, reference) is None and first_difference(reference, reference[:4]) == 4
    runner_up = explain(ar.verifier, ar.encode(PROMPTS[0]), reference, [*reference[:5], -1])
    assert runner_up is not None  # -1 ranks last: its logit is read like any other
    second = runner_up["top2_tokens"][1]
    found = explain(ar.verifier, ar.encode(PROMPTS[0]), reference, [*reference[:5], second], tokenizer)
    assert found is not None and found["index"] == 5 and found["replayed"]
    assert found["top2_tokens"][0] == reference[5] and found["token_rank"] == 1
    assert found["token_gap"] == found["gap"] >= 0 and found["text"] == tokenizer.decode([second])


def test_the_engine_has_its_own_cost_curve(gguf: tuple[LlamaModel, Any]) -> None:
    model, _ = gguf
    curve = measure(model, sizes=(1, 2, 4), rounds=1)
    assert curve.sizes == (1, 2, 4) and 0 < curve.seconds[0] <= curve.seconds[1] <= curve.seconds[2]
    key = cache_key(model)
    assert "llama.cpp" in key and f"threads{THREADS}" in key and "SmolLM2-135M-Instruct.Q4_1" in key


def test_what_the_engine_cannot_do_is_a_clear_error(gguf: tuple[LlamaModel, Any]) -> None:
    model, tokenizer = gguf
    with pytest.raises(ValueError, match="lookahead adds rows beside the tree"):
        _goose(gguf, sources=["context_match", "lookahead"])
    small = LlamaModel(model.path, threads=THREADS, context=32)
    with pytest.raises(ContextOverflowError, match="does not fit the model's context of 32"):
        AutoregressiveDecoder(small, tokenizer).generate(" ".join(["word"] * 40), 4)
    with pytest.raises(models.ModelLoadError, match="has no GGUF file"):
        models.load_gguf("someone/some-model")


@pytest.mark.parametrize(("flags", "message"), [
    (["generate", "hi", "--dtype", "bfloat16"], "leave out --dtype bfloat16"),
    (["generate", "hi", "--device", "cuda"], "leave out --device cuda"),
    (["generate", "hi", "--model", "someone/some-model"], "'someone/some-model' has no GGUF file"),
    (["generate", "hi", "--sources", "lookahead"], "lookahead adds rows beside the tree"),
    (["bench", "run", "--methods", "goose,hf_pld", "--datasets", "humaneval"], "hf_pld run Hugging Face's generate"),
    (["bench", "load", "--concurrency", "1", "--methods", "ar,hf_ar", "--datasets", "humaneval"],
     "hf_ar runs Hugging Face"),
])
def test_engine_flag_errors(flags: list[str], message: str, capsys: pytest.CaptureFixture[str],
                            tmp_path: Path) -> None:
    command = [*flags, "--engine", "llama.cpp", *(["--out", str(tmp_path)] if flags[0] == "bench" else [])]
    assert cli.main(command) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1


@pytest.mark.slow
def test_goose_generate_on_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["generate", COPY_PROMPT, "--engine", "llama.cpp", "--threads", str(THREADS),
                     "--max-new-tokens", "48", "--compare-ar", "--budget", "8"]) == 0
    out, err = capsys.readouterr()
    assert "12345678901234567890" in out and "identical" in err and "DIFFERENT" not in err


def test_goose_serve_on_the_engine(gguf: tuple[LlamaModel, Any], tmp_path: Path) -> None:
    """A real `goose serve --engine llama.cpp` on 127.0.0.1: two requests decoded together answer what ``ar`` on the
    engine decodes alone (or part at a near-tie), the sources drafted and were accepted, and a bad request is a 400.
    The budget is fixed: on this engine's measured curve the automatic one may lay no tree at all."""
    import concurrent.futures
    import sys

    from tests.helpers import API_KEY, free_port, start_server

    model, tokenizer = gguf
    ar = AutoregressiveDecoder(model, tokenizer)
    port = free_port()
    server = start_server([sys.executable, "-m", "goose", "serve", "--engine", "llama.cpp", "--threads", str(THREADS),
                           "--port", str(port), "--api-key", API_KEY, "--max-batch", "2", "--budget", "8"],
                          port, tmp_path / "serve.log")
    try:
        def ask(prompt: str) -> dict[str, Any]:
            body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 48,
                    "temperature": 0}
            response = server.post("/v1/chat/completions", body)
            assert response.status_code == 200, response.text
            return response.json()

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(ask, [COPY_PROMPT, PROMPTS[0]]))
        for prompt, answer in zip([COPY_PROMPT, PROMPTS[0]], answers, strict=True):
            reference = ar.generate(prompt, 48)
            text = answer["choices"][0]["message"]["content"]
            if text != reference.text:  # batched rows: only a near-tie may part them
                ids = tokenizer.encode(text, add_special_tokens=False)
                assert _agrees(ar, prompt, reference.new_token_ids, ids), (text, reference.text)
        copy = answers[0]["goose"]
        assert "12345678901234567890" in answers[0]["choices"][0]["message"]["content"]
        assert copy["tau"] > 1.5 and copy["verify_steps"] < copy["new_tokens"]  # drafts were accepted
        bad = server.post("/v1/chat/completions", {"model": "smollm2-135m", "messages": [], "max_tokens": 8})
        assert bad.status_code == 400
    finally:
        server.stop()
