"""``--quantize int8``: Goose is lossless against the int8 model's own autoregressive loop.

SmolLM2-135M with every linear layer in int8 (goose.quantize: per-channel weights, activations
quantized per row, oneDNN's kernel) and the rest in float32. The reference is the same quantized
model's one-token greedy loop (and its seeded sampler): a verify pass must give every row the
numbers a one-token pass gives it, bit for bit, or a moved integer grows into another token.

int8 needs int8 dot products (goose.quantize: avx512_vnni or amx_tile). On a CPU without them (an
AVX2-only EPYC) every test that runs int8 kernels is skipped with goose.quantize's refusal as the
reason; the tests of the refusal itself run on every CPU and expect it exactly where the CPU lacks them.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from goose import cli, cpu, models
from goose.config import GooseConfig
from goose.contract.tree import TreeBuilder
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
from goose.cycle.verifier import Verifier
from goose.planning.cost import cache_key
from goose.quantize import (
    INT8_DOT_PRODUCTS,
    Int8Linear,
    QuantizeError,
    check,
    cpu_refusal,
    int8_dot_products,
    quantized,
)
from goose_bench.prompts import PACKAGED_DATA, load_samples
from tests.helpers import CPU_CURVE, REPO, SMOLLM2_TOKENS, assert_lossless, lossless_prompts

# a tree every cycle, whatever this CPU's curve (budget 0 and rests are decoding's, tested in test_budget)
TREES = {"cost_curve": CPU_CURVE, "pinned_costs": True}


def _refusal() -> str | None:
    """goose.quantize's one-line refusal of int8 on this CPU and torch build, or None where int8 runs here."""
    try:
        check("int8")
    except QuantizeError as refused:
        return str(refused)
    return None


INT8_REFUSAL = _refusal()
# the tests that run int8 kernels without the smollm2_int8 fixture (which skips itself alike)
needs_int8 = pytest.mark.skipif(INT8_REFUSAL is not None, reason=f"int8 cannot run here: {INT8_REFUSAL}")
# /proc/cpuinfo's flags of the project's three machine kinds (abridged), as tests/test_cpu.py has them
ZEN3 = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 bmi1 bmi2 fma f16c aes sha_ni"
EPYC_AVX512 = ZEN3 + (" avx512f avx512dq avx512cd avx512bw avx512vl avx512ifma avx512vbmi avx512_vbmi2 avx512_vnni"
                      " avx512_bf16 avx_vnni")
XEON_AMX = EPYC_AVX512 + " avx512_fp16 amx_bf16 amx_tile amx_int8"

PROMPTS = lossless_prompts("smollm2")
CONFIGS = {"spine": GooseConfig(), "chain": GooseConfig(topology="chain"),
           "isotropic": GooseConfig(topology="isotropic"), "transition_tree": GooseConfig(topology="transition_tree"),
           "multi_spine": GooseConfig(topology="multi_spine"),
           "spine, tiers": GooseConfig(topology_options={"spine": {"split": "tiers"}})}


# --- the layer ----------------------------------------------------------------------------------


@needs_int8
def test_int8_linear_is_the_integer_product_and_rows_do_not_depend_on_the_batch() -> None:
    """Rows of one call equal each row alone, bit for bit, and the integer product scaled back (bias included)."""
    torch.manual_seed(0)
    linear = nn.Linear(96, 40)
    layer = Int8Linear(linear)
    x = torch.randn(2, 9, 96) * torch.rand(2, 9, 1) * 10
    x[..., 3] *= 40  # an outlier channel, as language models have
    out = layer(x)
    assert out.shape == (2, 9, 40) and out.dtype == torch.float32
    rows = x.reshape(-1, 96)
    assert torch.equal(out.reshape(-1, 40), torch.cat([layer(row[None]) for row in rows]))
    weight_scales = linear.weight.abs().amax(dim=1) / 127
    weights = torch.round(linear.weight / weight_scales[:, None])
    row_scales = rows.abs().amax(dim=1, keepdim=True) / 127
    expected = (torch.round(rows / row_scales).double() @ weights.double().T) * weight_scales.double() \
        * row_scales.double() + linear.bias.double()
    assert torch.allclose(out.reshape(-1, 40).double(), expected, rtol=1e-6, atol=1e-5)
    assert (out.reshape(-1, 40) - rows @ linear.weight.T - linear.bias).abs().max() < 0.05 * out.abs().max()
    assert torch.equal(layer(torch.zeros(3, 96)), linear.bias.detach().expand(3, 40))  # a zero row: its bias
    assert layer(x.bfloat16()).dtype == torch.bfloat16


def test_every_linear_is_int8_and_the_rest_is_float(smollm2_int8, smollm2) -> None:
    model, _ = smollm2_int8
    assert quantized(model) == "int8" and quantized(smollm2[0]) is None
    assert not any(isinstance(module, nn.Linear) for module in model.modules())
    assert isinstance(model.get_output_embeddings(), Int8Linear)  # the tied output layer got its own int8 copy
    assert model.get_input_embeddings().weight.dtype == torch.float32
    assert cache_key(model) != cache_key(smollm2[0]) and "int8" in cache_key(model)  # its own cost curve


# --- lossless -----------------------------------------------------------------------------------


def test_a_tree_row_is_the_one_token_pass_bit_for_bit(smollm2_int8) -> None:
    """A branch first, then the greedy continuation as a chain: its rows' ancestors lie apart in the cache, and
    still every row's logits equal the one-token loop's, every bit."""
    model, tokenizer = smollm2_int8
    prompt = AutoregressiveDecoder(model, tokenizer).encode(PROMPTS[0])
    alone = Verifier(model)
    anchor = int(alone.prefill(prompt).argmax())
    steps, token = [], anchor
    for _ in range(8):
        builder = TreeBuilder(token, ("chain",), capacity=0)
        logits = alone.verify([builder.build()])[0][0]
        alone.commit(0, np.zeros(0, dtype=np.int64))
        steps.append(logits)
        token = int(logits.argmax())
    continuation = [int(logits.argmax()) for logits in steps[:-1]]
    tree = Verifier(model)
    tree.prefill(prompt)
    builder = TreeBuilder(anchor, ("branch", "chain"), capacity=16)
    builder.add_chain(0, np.array([17, 18, 19]), 0)  # tokens the model does not continue with
    nodes = builder.add_chain(0, np.array(continuation), 1)
    rows = tree.verify([builder.build()])[0]
    assert torch.equal(rows[0], steps[0])
    for depth, node in enumerate(nodes.tolist(), start=1):
        assert torch.equal(rows[node], steps[depth]), f"depth {depth}"


@pytest.mark.parametrize("index", range(3), ids=["humaneval", "gsm8k", "mt_bench"])
def test_every_topology_is_identical_to_the_int8_loop(smollm2_int8, ar_reference, index: int) -> None:
    """The spine on every prompt, the five other configurations two a prompt in turn (each meets one or two)."""
    model, tokenizer = smollm2_int8
    prompt = PROMPTS[3 * index]
    reference = ar_reference(model, tokenizer, prompt, SMOLLM2_TOKENS)
    others = [name for name in CONFIGS if name != "spine"]
    for name in ["spine", others[2 * index % len(others)], others[(2 * index + 1) % len(others)]]:
        result = GooseDecoder(model, tokenizer, CONFIGS[name], **TREES).generate(prompt, SMOLLM2_TOKENS)
        assert_lossless(result, reference, label=name)


def test_batched_rows_are_each_their_own_int8_loop(smollm2_int8, ar_reference) -> None:
    """Four requests, at most three at once (the fourth joins as one ends), one with a shorter limit."""
    model, tokenizer = smollm2_int8
    prompts, limits = [PROMPTS[0], PROMPTS[1], PROMPTS[4], PROMPTS[7]], [SMOLLM2_TOKENS, SMOLLM2_TOKENS, 40, 48]
    references = [ar_reference(model, tokenizer, p, n).new_token_ids for p, n in zip(prompts, limits, strict=True)]
    decoder = GooseDecoder(model, tokenizer, **TREES)
    session = decoder.batch(3)
    ids = [session.submit(decoder.request(p, n)) for p, n in zip(prompts, limits, strict=True)]
    results = {chunk.request_id: chunk.result for chunk in session.run() if chunk.result is not None}
    for i, reference in zip(ids, references, strict=True):  # every row drafted and kept some of its drafts
        assert_lossless(results[i], reference, label=f"row {i}")
    assert max(session.pass_rows) > 3


def test_sampled_is_the_seeded_int8_sampler_alone_and_batched(smollm2_int8, ar_reference) -> None:
    model, tokenizer = smollm2_int8
    options = {"temperature": 0.7, "top_p": 0.9}
    prompts, seeds = [PROMPTS[1], PROMPTS[6]], [3, 4]
    references = [ar_reference(model, tokenizer, p, 40, seed=seed, **options).new_token_ids
                  for p, seed in zip(prompts, seeds, strict=True)]
    alone = GooseDecoder(model, tokenizer).generate(prompts[0], 40, seed=seeds[0], **options)
    assert_lossless(alone, references[0])
    decoder = GooseDecoder(model, tokenizer)
    session = decoder.batch(len(prompts))
    ids = [session.submit(decoder.request(p, 40, seed=seed, **options)) for p, seed in zip(prompts, seeds, strict=True)]
    results = {chunk.request_id: chunk.result for chunk in session.run() if chunk.result is not None}
    assert_lossless([results[i] for i in ids], references)


@pytest.mark.slow
@needs_int8
def test_cli_generate_quantize_int8_is_identical_to_its_loop(capsys) -> None:
    assert cli.main(["generate", PROMPTS[0], "--quantize", "int8", "--max-new-tokens", "32", "--compare-ar",
                     "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["quantize"] == "int8" and report["identical_to_ar"] is True and report["tau"] > 1.0


def test_calibrate_names_the_int8_curve(smollm2_int8, capsys) -> None:
    status = cli.main(["calibrate", "--quantize", "int8", "--dtype", "float32", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == (0 if report["cached"] else 1)  # 1: measured on a busy machine, cached with its signs
    assert report["quantize"] == "int8" and "-int8-float32-" in report["key"]
    assert report["key"] == cache_key(smollm2_int8[0])


# --- what cannot run: one line, never a float fallback ------------------------------------------


@pytest.mark.parametrize(("argv", "message"), [
    (["generate", "hi", "--quantize", "int8", "--device", "cuda"],
     "runs on the CPU (oneDNN's int8 kernels), not on cuda"),
    (["generate", "hi", "--quantize", "int4"], "invalid choice: 'int4'"),
])
def test_cli_refuses_what_int8_cannot_run(argv, message, capsys) -> None:
    code = None
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse's own refusal of an unknown choice
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and (len(err.splitlines()) == 1 or err.splitlines()[0].startswith("usage:"))


def test_int8_is_refused_exactly_where_this_cpu_lacks_int8_dot_products() -> None:
    """On the AMX Xeon and the AVX-512 EPYC int8 is allowed; on the AVX2-only EPYC it is refused in one line that
    names what is missing. torch's detection (what goose.quantize asks) agrees with /proc/cpuinfo's flags."""
    has = sorted(set(INT8_DOT_PRODUCTS) & cpu.cpu_flags())
    assert sorted(int8_dot_products()) == has
    if has:
        check("int8")  # no refusal (this torch build has the ops: make test installs one that does)
        assert cpu_refusal() is None
        return
    with pytest.raises(QuantizeError) as refused:
        check("int8")
    message = str(refused.value)
    assert "\n" not in message and "needs a CPU with int8 dot products" in message
    assert "avx512_vnni or amx_tile" in message and "this one has neither" in message
    with pytest.raises(models.ModelLoadError, match="int8 dot products"):
        models.load("smollm2-135m", quantize="int8")


def test_the_refusal_of_each_machine_kind(tmp_path) -> None:
    """The decision on another CPU's /proc/cpuinfo: the AMX Xeon and the AVX-512 EPYC run int8, the AVX2-only EPYC
    (no avx512_vnni, no avx_vnni, no amx) is refused, naming the instructions it would need."""
    flags = {}
    for name, line in (("zen3", ZEN3), ("epyc", EPYC_AVX512), ("xeon", XEON_AMX)):
        path = tmp_path / f"cpuinfo-{name}"
        path.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {line}\n")
        flags[name] = cpu.cpu_flags(path)
    assert cpu_refusal(flags["epyc"]) is None and cpu_refusal(flags["xeon"]) is None
    assert cpu_refusal(["amx_tile"]) is None and cpu_refusal(["avx512_vnni"]) is None
    message = cpu_refusal(flags["zen3"])
    assert message is not None and "\n" not in message
    assert message.startswith("--quantize int8 needs a CPU with int8 dot products (AVX-512 VNNI or AMX: "
                              "avx512_vnni or amx_tile); this one has neither")
    assert cpu_refusal(["avx2", "avx_vnni"]) == message  # AVX-VNNI alone: torch does not detect it


def test_a_cpu_or_build_without_int8_is_refused_in_one_line(monkeypatch) -> None:
    """Whatever this CPU has: a CPU that torch finds no int8 dot products on, or a torch build without the ops, is
    told what is missing, before any model loads."""
    with pytest.raises(models.ModelLoadError, match=r"^unknown quantization 'int4'; known: int8$"):
        models.load("smollm2-135m", quantize="int4")
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    with pytest.raises(QuantizeError, match=r"needs a CPU with int8 dot products \(AVX-512 VNNI or AMX: "
                                            r"avx512_vnni or amx_tile\); this one has neither"):
        check("int8")
    with pytest.raises(models.ModelLoadError, match="int8 dot products"):
        models.load("smollm2-135m", quantize="int8")
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    with pytest.raises(QuantizeError, match=r"needs torch's oneDNN int8 ops .* has none"):
        check("int8")


# --- scripts/int8_quality.py ------------------------------------------------------------------------


@pytest.mark.slow
@needs_int8
def test_quality_script_scores_the_text_and_agreement(tmp_path) -> None:
    """On SmolLM2: perplexity of every variant (and llama.cpp's where its environment is built), the int8 model's
    teacher-forced agreement with a bfloat16 `ar` text, and the identical-text count of two runs."""
    model, tokenizer = models.load("smollm2-135m", dtype="bfloat16")
    sample = load_samples("humaneval", PACKAGED_DATA, 1)[0]
    ar = AutoregressiveDecoder(model, tokenizer).generate(sample.turns[0], 16)
    record = {"method": "ar", "dataset": sample.dataset, "question_id": sample.question_id,
              "new_token_ids": [ar.new_token_ids]}
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps(record) + "\n")
    built = importlib.util.find_spec("llama_cpp") is not None  # make test installs it; test-fast need not
    llama = sys.executable
    command = [sys.executable, str(REPO / "scripts" / "int8_quality.py"), "--model", "smollm2-135m", "--threads", "1",
               "--windows", "2", "--window", "48", "--variants", "bfloat16,int8", "--reference", str(results),
               "--compare", str(results), "--data-dir", str(PACKAGED_DATA), "--out", str(tmp_path / "quality.json"),
               *(["--llama-python", str(llama)] if built else [])]
    run = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "quality.json").read_text())
    assert report["text"]["path"].endswith("httpx/_models.py") and report["text"]["tokens_scored"] == 2 * 47
    expected = {"bfloat16", "int8", *(["llama.cpp"] if built else [])}
    assert set(report["perplexity"]) == expected
    # Measured on an AVX-512 EPYC (VNNI) on these 94 tokens: bfloat16 29.6, int8 31.2 (+5%), llama.cpp's Q4_1 30.6
    # (+3%); the float32 model scores 30.0. A variant more than 15% worse than bfloat16 on the same tokens has lost
    # more than rounding (a scale per tensor instead of per channel costs far more); bfloat16 itself must score as a
    # 135M model does on Python code, not the thousands of a scrambled model.
    perplexity = {name: entry["perplexity"] for name, entry in report["perplexity"].items()}
    assert 15.0 < perplexity["bfloat16"] < 60.0, perplexity
    assert all(value < 1.15 * perplexity["bfloat16"] for value in perplexity.values()), perplexity
    # teacher-forced on bfloat16's own text, int8's argmax agreed at all 16 positions; allow two near-ties to flip
    agreement = report["forced_agreement_with_bfloat16"]["int8"]
    assert agreement["tokens"] == len(ar.new_token_ids) == 16
    assert agreement["agreed"] >= agreement["tokens"] - 2, agreement
    assert report["ar_texts"] == {"compared": 1, "identical": 1, "common_prefix": [len(ar.new_token_ids)],
                                  "lengths": [len(ar.new_token_ids)]}
