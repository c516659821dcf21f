"""goose-bench's fixtures, built through Goose's public API (helpers.py): the tiny random-weight models and SmolLM2,
once per test session, each with its verify cost curve cached as a run finds it.

They bear the names of Goose's own fixtures (tests/conftest.py) but are goose-bench's: each folder's tests get
their own folder's, so `pytest bench/tests` needs nothing of Goose's test package and `pytest tests bench/tests`
(make test) runs both suites together.
"""

from __future__ import annotations

import os

import pytest
import torch
from filelock import FileLock
from helpers import DEVICE, tiny_model

from goose import models
from goose.cycle.calibration import load_or_measure
from goose.planning.cost import cache_key

# Under pytest-xdist each worker gets one torch thread (two one-thread workers beat one two-thread process on a
# 2-core machine); the subprocesses the tests start inherit it through OMP_NUM_THREADS. Goose's conftest says so too.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("GOOSE_TEST_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", os.environ["GOOSE_TEST_THREADS"])
torch.set_num_threads(int(os.environ.get("GOOSE_TEST_THREADS", "2")))


def _calibrated(loaded: tuple) -> tuple:
    """``loaded`` (model, tokenizer) once its cost curve is cached: measured by one process on a fresh machine (a
    lock per curve, the one Goose's tests take), read by the others, which would slow its measurement otherwise."""
    lock = models.default_cache_dir() / "calibration" / f"{cache_key(loaded[0])}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock)):
        load_or_measure(loaded[0])
    return loaded


@pytest.fixture(scope="session")
def tiny():
    """The tiny random-weight Llama with SmolLM2's tokenizer: (model, tokenizer)."""
    return _calibrated(tiny_model("llama"))


@pytest.fixture(scope="session")
def tiny_gemma3():
    """The tiny random-weight Gemma 3, a 32-token sliding window on its first layer: (model, tokenizer)."""
    return _calibrated(tiny_model("gemma3"))


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct in float32 (Goose's embedded default): (model, tokenizer)."""
    return _calibrated(models.load("smollm2-135m", dtype="float32", device=DEVICE))
