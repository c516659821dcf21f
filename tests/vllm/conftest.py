"""Fixtures of the vLLM suite: SmolLM2 in vLLM's CPU backend, and one reference run without speculation.

This suite runs only under the vLLM environment's pytest (``.venv-vllm/bin/python -m pytest tests/vllm``,
which ``make test`` does); the main suite leaves it out (``--ignore=tests/vllm``). Engines start in
seconds but not for free, so each configuration starts once and serves every test that needs it.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# modest CPU resources on a small shared machine; set before vLLM reads its environment
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache per engine
os.environ.setdefault("OMP_NUM_THREADS", "1")

vllm = pytest.importorskip("vllm", reason="the vLLM suite needs the vLLM environment (make vllm-setup)")

from goose import models  # noqa: E402
from goose_bench.prompts import load_samples  # noqa: E402
from goose_vllm import CONFIG_ENV  # noqa: E402

MAX_TOKENS = 64
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 4  # the batch: at most four requests decode together
PROPOSER = "goose_vllm.GooseProposer"
NUM_SPECULATIVE_TOKENS = 16
# two prompts from each of three datasets: code that quotes its prompt, arithmetic, open writing
TEST_DATASETS = {"humaneval": 2, "gsm8k": 2, "mt_bench": 2}


def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder (float32), the one Goose's model cache holds."""
    cache = models.default_cache_dir() / "models"
    folders = sorted(cache.glob("smollm2-135m-*/goose-cache.json"), key=lambda marker: marker.stat().st_mtime)
    if not folders:
        models.load("smollm2-135m", dtype="float32")  # dequantizes the embedded GGUF file into the cache once
        folders = sorted(cache.glob("smollm2-135m-*/goose-cache.json"), key=lambda marker: marker.stat().st_mtime)
    return folders[-1].parent


@pytest.fixture(scope="session")
def model_path() -> str:
    return str(smollm2_folder())


@pytest.fixture(scope="session")
def prompts(model_path: str) -> list[list[int]]:
    """Chat-formatted prompt ids of the benchmark prompts the suite decodes."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    samples = [sample for name, count in TEST_DATASETS.items() for sample in load_samples(name, limit=count)]
    return [models.encode_prompt(tokenizer, sample.turns[0]) for sample in samples]


def greedy() -> vllm.SamplingParams:
    return vllm.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)


@contextmanager
def goose_environment(config: str | None) -> Iterator[None]:
    """``$GOOSE_VLLM_CONFIG`` set to ``config`` (unset for None) while an engine starts; restored after."""
    saved = os.environ.pop(CONFIG_ENV, None)
    if config is not None:
        os.environ[CONFIG_ENV] = config
    try:
        yield
    finally:
        os.environ.pop(CONFIG_ENV, None)
        if saved is not None:
            os.environ[CONFIG_ENV] = saved


def start_llm(model_path: str, speculative_config: dict | None = None, goose_config: str | None = None) -> vllm.LLM:
    """An offline engine on SmolLM2 in float32, eager (no compile step), four requests at a time."""
    with goose_environment(goose_config):
        return vllm.LLM(model=model_path, dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS,
                        enforce_eager=True, seed=0, disable_log_stats=False, speculative_config=speculative_config)


def goose_speculation() -> dict:
    return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": NUM_SPECULATIVE_TOKENS}


def stop(llm: vllm.LLM) -> None:
    """Shut an engine's processes down now, before the next engine starts (not at interpreter exit)."""
    llm.llm_engine.engine_core.shutdown()
    gc.collect()


def generate(llm: vllm.LLM, prompt_ids: list[list[int]]) -> list[list[int]]:
    """Output token ids of ``prompt_ids`` submitted together (vLLM batches up to MAX_NUM_SEQS of them)."""
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], greedy(), use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


def spec_counters(llm: vllm.LLM) -> dict[str, int]:
    """vLLM's own speculative-decoding counters: drafts, draft tokens, accepted tokens."""
    wanted = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
              "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
    return {wanted[metric.name]: int(metric.value) for metric in llm.get_metrics() if metric.name in wanted}


# the chat questions the OpenAI-server test asks (tests/vllm/test_server.py)
QUESTIONS = [
    "Write a Python function is_palindrome(s) that ignores case and spaces, with three example calls.",
    "Explain in three sentences why the sky is blue.",
]


@pytest.fixture(scope="session")
def no_speculation(model_path: str, prompts: list[list[int]]) -> dict[str, list]:
    """vLLM without speculation, one engine for the session: every prompt decoded alone (``outputs``) and
    each of QUESTIONS as a chat (``chat``, the text), the server rendering its chat template as ``LLM.chat`` does."""
    llm = start_llm(model_path)
    try:
        outputs = [generate(llm, [ids])[0] for ids in prompts]
        chats = [llm.chat([{"role": "user", "content": question}], greedy(), use_tqdm=False)[0].outputs[0].text
                 for question in QUESTIONS]
        return {"outputs": outputs, "chat": chats}
    finally:
        stop(llm)


@pytest.fixture(scope="session")
def reference(no_speculation: dict[str, list]) -> list[list[int]]:
    """Every prompt decoded alone by vLLM without speculation: what every Goose run must reproduce."""
    return no_speculation["outputs"]


@pytest.fixture(scope="session")
def chat_reference(no_speculation: dict[str, list]) -> list[str]:
    """The text of each of QUESTIONS answered by vLLM without speculation (greedy, MAX_TOKENS)."""
    return no_speculation["chat"]
