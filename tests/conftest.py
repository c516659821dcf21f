"""Shared fixtures: the real embedded models, loaded once per test session (from the on-disk cache)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from goose import models

# Under pytest-xdist (`make test` runs two workers) each worker gets one thread: two one-thread
# workers do nearly twice the work of one two-thread process on a 2-core machine, because a
# small model's forward pass barely uses a second thread. Subprocesses the tests start (the CLI,
# `goose serve`) inherit OMP_NUM_THREADS, so they do not oversubscribe the cores either, and their
# float32 arithmetic is split the same way as the in-process reference they are compared with.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("GOOSE_TEST_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", os.environ["GOOSE_TEST_THREADS"])
torch.set_num_threads(int(os.environ.get("GOOSE_TEST_THREADS", "2")))

# GOOSE_TEST_DEVICE=cuda runs the model tests on a GPU (the device check); CI stays on the CPU
DEVICE = os.environ.get("GOOSE_TEST_DEVICE", "cpu")
DATA_DIR = Path(os.environ.get("GOOSE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct in float32 (the embedded default): (model, tokenizer)."""
    return models.load("smollm2-135m", dtype="float32", device=DEVICE)


@pytest.fixture(scope="session")
def gemma3():
    """Gemma 3 270M (base, sliding-window layers, 262k vocabulary) in float32: (model, tokenizer)."""
    return models.load("gemma3-270m", dtype="float32", device=DEVICE)


def dataset_prompts(name: str, limit: int) -> list[str]:
    """The first ``limit`` prompts of a benchmark file in ../shared/data, as plain text."""
    path = DATA_DIR / f"{name}.jsonl"
    if not path.exists():
        pytest.fail(f"benchmark data missing: {path} (set GOOSE_DATA to the shared/data folder)")
    prompts = []
    with path.open() as lines:
        for line in lines:
            record = json.loads(line)
            if name == "humaneval":
                prompts.append("Complete this Python function:\n" + record["prompt"])
            elif name == "gsm8k":
                prompts.append(record["question"] + "\nLet's think step by step.")
            elif name in ("mt_bench", "spec_bench"):
                prompts.append(record["turns"][0])
            elif name == "mbpp":
                prompts.append(record["text"] + "\n" + record["test_list"][0])
            else:
                raise ValueError(name)
            if len(prompts) == limit:
                break
    return prompts
