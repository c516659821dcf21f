"""scripts/copy_bound.py: the copy oracles' runs and passes on hand-made texts, and the script on a real bench run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from goose import cli
from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "copy_bound.py"
_spec = importlib.util.spec_from_file_location("copy_bound", SCRIPT)
copy_bound = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(copy_bound)


def test_copy_runs_free_and_anchored() -> None:
    """Free: the longest run of the rest from anywhere earlier; anchored: only a source the last token precedes.
    9 is new text: nothing copies it, and nothing keyed on it finds the copy of 2 3 4 that follows."""
    prompt, out = [1, 2, 3, 4, 5], [1, 2, 3, 9, 2, 3, 4]
    assert copy_bound.copy_runs(prompt, out, cap=128) == [3, 2, 1, 0, 3, 2, 1]
    assert copy_bound.copy_runs(prompt, out, cap=128, anchored=True) == [0, 2, 1, 0, 0, 2, 1]
    assert copy_bound.copy_runs(prompt, out, cap=2) == [2, 2, 1, 0, 2, 2, 1]
    # a run may overlap its own start (an LZ77 copy): 7 7 7 7 after one 7
    assert copy_bound.copy_runs([7], [7, 7, 7, 7], cap=128) == [4, 3, 2, 1]


def test_oracle_passes_commit_the_copy_and_the_bonus_token() -> None:
    # token 0 comes from the prefill; a pass at n drafts runs[n] (never past the end) and adds the bonus token
    assert copy_bound.oracle_passes([3, 2, 2, 0, 3, 2, 1], tokens=7) == [3, 3]
    assert copy_bound.oracle_passes([0, 0, 0, 0], tokens=4) == [1, 1, 1]
    assert copy_bound.oracle_passes([5, 5], tokens=1) == []


def test_turns_and_missed_copies() -> None:
    # turn one: 4 tokens, 3 by passes (2 + 1); turn two: 3 tokens, 2 by passes (1 + 1); a 3 would overrun
    assert copy_bound.split_turns([2, 1, 1, 1], [4, 3]) == [[2, 1], [1, 1]]
    runs = [0, 3, 0, 5, 5, 5, 5, 5, 5, 5]
    # pass at 1 commits 1 (a copy of 3 was there: missed); at 2 commits 1 (nothing to copy);
    # at 3 commits 2 (drafted 1 of 5: short); at 5 commits 3 (drafted 2 of 5)
    counts = copy_bound.missed_copies(runs, [1, 1, 2, 3])
    assert counts == {"passes": 4, "missed": 1, "short": 1, "beyond_copy": 0}
    assert copy_bound.missed_copies([0, 0, 0], [3])["beyond_copy"] == 2  # accepted where nothing copied


@pytest.mark.slow
def test_script_on_a_real_bench_run(tmp_path: Path) -> None:
    """A float32 SmolLM2 run of ar, goose and hf_pld: the free oracle is at least the anchored one, Goose's passes
    are all walked, and the table and JSON say so."""
    status = cli.main(["bench", "--model", "smollm2-135m", "--datasets", "humaneval", "--limit", "1",
                       "--max-new-tokens", "32", "--methods", "ar,goose,hf_pld", "--dtype", "float32",
                       "--out", str(tmp_path / "bench"), "--no-progress"])
    assert status == 0
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"sizes": [1, 8, 128], "seconds": [0.01, 0.012, 0.05]}))
    out = tmp_path / "bound.json"
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "bench" / "results.jsonl"),
                          "--curve", str(curve), "--out", str(out)],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert "humaneval/HumanEval/0" in run.stdout and lines[-2].startswith("mean") and "median tok/s" in lines[-1]
    (row,) = json.loads(out.read_text())["rows"]
    records = {r["method"]: r for r in map(json.loads, (tmp_path / "bench" / "results.jsonl").read_text().splitlines())}
    assert row["free"]["tau"] >= row["anchored"]["tau"] >= 1.0
    assert row["free"]["over_ar"] >= row["anchored"]["over_ar"] > 0
    assert row["passes"] == records["goose"]["verify_steps"]
    assert row["goose"]["over_hf_pld"] == pytest.approx(records["goose"]["speedup_vs_hf_pld"])
