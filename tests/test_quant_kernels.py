"""scripts/quant_kernels.py: the int4 kernel it times computes a Q4_K sub-block's weights, and the script runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "quant_kernels.py"


def test_int4_kernel_is_a_q4k_sub_block() -> None:
    """w = (q - 8) * scale + zero per 32 weights: a Q4_K sub-block (d * sc * q - dmin * m) with zero = 8 * scale - min,
    so the timings are of the layout llama.cpp's file holds, not of some other quantization."""
    torch.manual_seed(0)
    n_out, n_in, group = 64, 128, 32
    nibbles = torch.randint(0, 16, (n_out, n_in), dtype=torch.int32)
    scales = torch.rand(n_in // group, n_out) * 0.1
    minimums = torch.rand(n_in // group, n_out) * 0.5
    scales_and_zeros = torch.stack([scales, 8 * scales - minimums], dim=-1).to(torch.bfloat16)
    x = torch.randn(3, n_in, dtype=torch.bfloat16)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(nibbles, 8)
    got = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_and_zeros).float()

    per_weight = scales_and_zeros.float().repeat_interleave(group, dim=0).transpose(0, 1)  # [n_out, n_in, 2]
    weight = nibbles * per_weight[..., 0] - (8 * per_weight[..., 0] - per_weight[..., 1])  # sc * q - min
    expected = x.float() @ weight.T
    assert torch.allclose(got, expected, atol=0.05 * expected.abs().max().item())


def test_script_times_the_four_kernels(tmp_path: Path) -> None:
    """At SmolLM2's shapes: every kernel at every row count, positive times, in the JSON and the printed table."""
    out = tmp_path / "kernels.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--model", "smollm2-135m", "--threads", "1", "--rows", "1,2",
                          "--repeats", "1", "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    record = json.loads(out.read_text())
    assert record["model"] == "smollm2-135m"
    assert set(record["seconds"]) == set(record["layer_seconds"]) == {"bf16", "int4", "int8", "int8_rows"}
    for times in [*record["seconds"].values(), *record["layer_seconds"].values()]:
        assert set(times) == {"1", "2"} and all(seconds > 0 for seconds in times.values())
    assert "| 2 |" in run.stdout
