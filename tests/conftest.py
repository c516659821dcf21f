"""Shared fixtures: the tiny random-weight models built in the test, the real embedded models loaded once per test
session (from the on-disk cache), the autoregressive references computed once per test run, and the suite's time
per group at the end."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from goose import models
from tests.helpers import DEVICE, tiny_model

# Under pytest-xdist (`make test` runs two workers) each worker gets one thread: two one-thread
# workers do nearly twice the work of one two-thread process on a 2-core machine, because a
# small model's forward pass barely uses a second thread. Subprocesses the tests start (the CLI,
# `goose serve`) inherit OMP_NUM_THREADS, so they do not oversubscribe the cores either, and their
# float32 arithmetic is split the same way as the in-process reference they are compared with.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("GOOSE_TEST_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", os.environ["GOOSE_TEST_THREADS"])
torch.set_num_threads(int(os.environ.get("GOOSE_TEST_THREADS", "2")))

def _with_cost_curve(loaded):
    """The model, its verify cost curve measured (first use on this machine) or loaded, one process at a time.

    ``budget="auto"`` measures the curve on a decoder's first generation; on a fresh machine both
    xdist workers would time the same curve at once, each slowing the other's measurement.
    """
    from filelock import FileLock

    from goose.cycle.calibration import load_or_measure
    from goose.planning.cost import cache_key

    folder = models.default_cache_dir() / "calibration"
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / f"{cache_key(loaded[0])}.lock")):
        load_or_measure(loaded[0])
    return loaded


@pytest.fixture(scope="session")
def tiny():
    """A 2-layer random-weight Llama (hidden size 64) with SmolLM2's tokenizer, built in the test: (model, tokenizer).

    For the engine's mechanics (verifier, walker, batching, sampling identity): a pass costs far less than
    SmolLM2's, and the float32 lossless contract is the same."""
    return _with_cost_curve(tiny_model("llama"))


@pytest.fixture(scope="session")
def tiny_gemma3():
    """Gemma 3's architecture, 2 random-weight layers, a 32-token sliding window: (model, tokenizer)."""
    return _with_cost_curve(tiny_model("gemma3"))


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct in float32 (the embedded default): (model, tokenizer)."""
    return _with_cost_curve(models.load("smollm2-135m", dtype="float32", device=DEVICE))


@pytest.fixture(scope="session")
def gemma3():
    """Gemma 3 270M (base, sliding-window layers, 262k vocabulary) in float32: (model, tokenizer)."""
    return _with_cost_curve(models.load("gemma3-270m", dtype="float32", device=DEVICE))


@pytest.fixture(scope="session")
def smollm2_int8():
    """SmolLM2-135M-Instruct, every linear layer in int8 (goose.quantize), the rest in float32: (model, tokenizer).

    Skipped, with goose.quantize's one-line refusal as the reason, on a CPU without int8 dot products (an AVX2-only
    EPYC: no avx512_vnni, no amx_tile) or a torch build without oneDNN's int8 ops."""
    from goose.quantize import QuantizeError, check

    try:
        check("int8")
    except QuantizeError as refused:
        pytest.skip(f"int8 cannot run here: {refused}")
    return _with_cost_curve(models.load("smollm2-135m", dtype="float32", quantize="int8"))  # int8 is the CPU's


@pytest.fixture(scope="session")
def qwen15b():
    """Qwen2.5-Coder-1.5B-Instruct (152k vocabulary, grouped-query attention) in float32: (model, tokenizer).

    Its 22 packages come with ``make models``; 7 GB in float32, so its tests share one worker (``xdist_group``).
    """
    return _with_cost_curve(models.load("qwen2.5-coder-1.5b", dtype="float32", device=DEVICE, progress=False))


# --- which tests are slow, and in what order the workers take them ---------------------------------

# Fixtures that make a test slow whatever its mark: Gemma 3's passes (a 262k-token vocabulary), the 1.5B model, the
# real `goose serve` process, SmolLM2 in int8 and SmolLM2's GGUF file on llama.cpp (real-model runs of another
# engine, test_int8.py and test_llama_engine.py). `make test-fast` runs `-m "not slow"`: the engine's mechanics on
# the tiny random-weight models, SmolLM2 for short runs.
SLOW_FIXTURES = {"gemma3", "qwen15b", "server", "smollm2_int8", "gguf"}


def _uses_gemma3(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return "gemma3" in getattr(item, "fixturenames", ()) or (
        callspec is not None and "gemma3" in map(str, callspec.params.values()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that need Gemma 3 or the server slow; under xdist, hand out the longest first.

    xdist's loadgroup scheduler takes the grouped modules first (largest group first), then single
    tests in collection order, so the slow real-model tests go to the front: Gemma 3 runs, then the
    other slow runs, then tests that load a model, then the rest (each tier in file order). Without
    xdist the order stays the files' own, so that module fixtures (the server) start once.
    """
    for item in items:
        if _uses_gemma3(item) or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    _name_xdist_groups(config, items)

    def tier(item: pytest.Item) -> int:
        slow = item.get_closest_marker("slow") is not None
        if slow and _uses_gemma3(item):
            return 0
        if slow:
            return 1
        return 2 if {"smollm2", "gemma3"} & set(getattr(item, "fixturenames", ())) else 3

    items.sort(key=tier)  # stable: each tier keeps the files' order


def _name_xdist_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put each ``xdist_group`` mark's name into its item's node id, as ``--dist loadgroup`` needs.

    pytest-xdist 3.8 writes ``item._nodeid``, which pytest 9.2 no longer reads (a node id now comes from
    the structured ``item._id``), so every group mark was ignored: the tests of one group were spread over
    both workers and each started its own copy of the group's module fixtures (the servers, the pip-installed
    test plugin, the cold model cache). Ids already suffixed (an xdist that sets them itself) stay as they are.
    """
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import NodeId

    for item in items:
        names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                 for mark in item.iter_markers("xdist_group")}
        if names and "@" not in item.nodeid.rpartition("]")[2]:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(sorted(names))}")


# --- autoregressive references, computed once per test run -----------------------------------------


@dataclass(frozen=True)
class Reference:
    """An autoregressive run's output: what the Goose runs of a test are compared with."""

    prompt_ids: list[int]
    new_token_ids: list[int]
    text: str
    stop_reason: str
    seed: int | None


class References:
    """``goose``'s autoregressive loop, run once per (model, prompt, sampling options, stop tokens) in a test run.

    Every reference is a real run of :class:`AutoregressiveDecoder` in this test run, never a stored
    result. A longer run serves a shorter request: the autoregressive output of ``n`` tokens is the
    first ``n`` tokens of a longer one (greedy: the same argmax at every position; sampled: the draw
    at position ``t`` depends only on ``(seed, t)`` and the logits row), cut after an EOS the same way.
    Under pytest-xdist the workers of one run share the references through files under the run's
    base temporary folder, each computed by the first worker that needs it (a file lock per key); a
    run without xdist keeps them in memory only, so nothing outlives the run. The key holds the
    torch thread count and device, so a reference is compared only with runs of the same arithmetic.
    """

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.memory: dict[str, dict[str, Any]] = {}
        self.computed = 0
        self.served = 0

    def __call__(self, model, tokenizer, prompt, max_new_tokens: int, *, chat: bool = True,
                 **options: Any) -> Reference:
        from goose.cycle.decoder import AutoregressiveDecoder
        from goose.quantize import quantized

        decoder = AutoregressiveDecoder(model, tokenizer, chat=chat)
        prompt_ids = decoder.encode(prompt)
        eos = sorted(decoder.eos_ids if options.get("eos_token_ids") is None else
                     {int(token) for token in options["eos_token_ids"]})
        structured = {k: options[k] for k in ("json_schema", "json_object") if options.get(k) is not None}
        sampling = decoder.sampling.model_copy(update={k: v for k, v in options.items()
                                                       if k not in ("eos_token_ids", *structured) and v is not None})
        if not sampling.greedy and sampling.seed is None:
            raise ValueError("a sampled reference needs a seed")
        parameter = next(model.parameters())
        key = json.dumps({
            "model": getattr(model.config, "_name_or_path", "") or model.config.model_type,
            "quantize": quantized(model), "dtype": str(parameter.dtype), "device": str(parameter.device),
            "threads": torch.get_num_threads(),
            "max_positions": decoder.verifier.max_positions, "prompt": prompt_ids, "eos": eos,
            "sampling": "greedy" if sampling.greedy else [sampling.temperature, sampling.top_p, sampling.top_k,
                                                          sampling.seed],
            **({"structured_output": structured} if structured else {}),  # a constrained run is its own reference
        })
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]

        def run() -> dict[str, Any]:
            result = decoder.generate(prompt_ids, max_new_tokens, **options)
            self.computed += 1
            return {"max_new_tokens": max_new_tokens, "new_token_ids": result.new_token_ids,
                    "stop_reason": result.stop_reason, "seed": result.seed}

        entry = self.memory.get(digest)
        if entry is None or not _serves(entry, max_new_tokens):
            if self.folder is None:
                entry = run()
            else:
                from filelock import FileLock

                path = self.folder / f"{digest}.json"
                with FileLock(str(path) + ".lock"):
                    entry = json.loads(path.read_text()) if path.exists() else None
                    if entry is None or not _serves(entry, max_new_tokens):
                        entry = run()
                        path.write_text(json.dumps(entry))
            self.memory[digest] = entry
        else:
            self.served += 1
        ids = entry["new_token_ids"][:max_new_tokens]
        if len(entry["new_token_ids"]) > max_new_tokens or (entry["stop_reason"] == "context_full"
                                                            and len(ids) == max_new_tokens):
            stop_reason = "eos" if ids and ids[-1] in eos else "max_new_tokens"
        else:
            stop_reason = entry["stop_reason"]
        text = tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else ""
        return Reference(prompt_ids, ids, text, stop_reason, entry["seed"])


def _serves(entry: dict[str, Any], max_new_tokens: int) -> bool:
    """Whether a stored run answers a request for ``max_new_tokens``: it ran as far, or it ended on its own first."""
    return entry["max_new_tokens"] >= max_new_tokens or entry["stop_reason"] in ("eos", "context_full")


@pytest.fixture(scope="session")
def ar_reference(tmp_path_factory: pytest.TempPathFactory) -> References:
    """``ar_reference(model, tokenizer, prompt, max_new_tokens, chat=..., **sampling)``: the AR run, shared."""
    folder = None
    if "PYTEST_XDIST_WORKER" in os.environ:  # workers of one run share the run's base folder
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "run")
        folder = tmp_path_factory.getbasetemp().parent / f"ar-references-{run}"
        folder.mkdir(exist_ok=True)
    return References(folder)


# --- the suite's time per group ------------------------------------------------------------------

# test file -> group in the closing summary; a file not named here is a unit test file
GROUPS = {
    "test_lossless.py": "lossless", "test_four_sources.py": "lossless", "test_scale.py": "scale",
    "test_sampling.py": "sampling", "test_hf.py": "hf",
    "test_server.py": "serve", "test_serve_hardening.py": "serve", "test_serve_batch.py": "serve",
    "test_bench.py": "bench", "test_batch.py": "batch",
    "test_rest.py": "sources", "test_suffix_memory.py": "sources", "test_lookahead.py": "sources",
    "test_sources.py": "sources", "test_multi_spine.py": "sources",
    "test_topologies.py": "topologies", "test_models.py": "models",
}
_SECONDS: dict[str, float] = defaultdict(float)
_TESTS: dict[str, int] = defaultdict(int)
_STARTED = time.monotonic()


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Every phase's seconds, per test file (under xdist the controller sees every worker's reports)."""
    _SECONDS[_file_of(report.nodeid)] += report.duration
    if report.when == "call" or (report.when == "setup" and report.skipped):
        _TESTS[_file_of(report.nodeid)] += 1


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if "PYTEST_XDIST_WORKER" in os.environ or not _SECONDS:
        return
    groups: dict[str, list[str]] = defaultdict(list)
    for path in _SECONDS:
        name = Path(path).name
        groups["vllm" if "/vllm/" in f"/{path}" else GROUPS.get(name, "units")].append(path)
    write = terminalreporter.write_line
    terminalreporter.section("time per group (test seconds, setup and teardown included; summed over workers)")
    total = sum(_SECONDS.values())
    for group, paths in sorted(groups.items(), key=lambda item: -sum(_SECONDS[p] for p in item[1])):
        seconds = sum(_SECONDS[p] for p in paths)
        write(f"{group:<12} {seconds:8.1f} s  {sum(_TESTS[p] for p in paths):4d} tests  {seconds / total:6.1%}")
        for path in sorted(paths, key=lambda p: -_SECONDS[p]):
            write(f"    {Path(path).name:<28} {_SECONDS[path]:8.1f} s  {_TESTS[path]:4d} tests")
    write(f"{'all':<12} {total:8.1f} s  {sum(_TESTS.values()):4d} tests; wall {time.monotonic() - _STARTED:.1f} s")
