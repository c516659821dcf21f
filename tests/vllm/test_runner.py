"""``goose bench vllm``'s side in the vLLM environment: the packaged runner, started as goose bench
starts it (by its path, this goose on PYTHONPATH), decodes the prompts goose encodes, and Goose's float32
greedy output inside vLLM equals vLLM's own without speculation."""

from __future__ import annotations

import sys
from pathlib import Path

from goose_bench.prompts import default_data_dir
from goose_bench.vllm_peer import run_vllm_bench, vllm_command, vllm_peer, vllm_rows
from tests.vllm.conftest import MAX_TOKENS


def test_the_vllm_runner_of_goose_bench(model_path: str, prompts: list[list[int]], tmp_path: Path) -> None:
    peer = vllm_peer(sys.executable, "none,goose")
    command = vllm_command(peer, model_path, ["humaneval"], default_data_dir(), 1, MAX_TOKENS, "float32", [1],
                           tmp_path)
    results = run_vllm_bench(command, tmp_path, progress=False)
    assert [prompt["ids"] for prompt in results["prompts"]] == prompts[:1]  # the suite's first: HumanEval 0
    plain = next(run for run in results["runs"] if run["method"] == "none")
    rows, notes = vllm_rows(results, "smollm2-135m", prompts[:1], plain["outputs"])
    assert notes == [] and {row.method: row.identical_to_ar for row in rows} == {"vllm_none": 1.0, "vllm_goose": 1.0}
    assert (tmp_path / "report.md").is_file() and (tmp_path / "vllm_bench.stderr.log").stat().st_size > 0
