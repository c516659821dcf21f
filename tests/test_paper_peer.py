"""scripts/paper_peer.py: tau of the paper's own decoder beside ours. Its flag errors, a failing side, our side on
SmolLM2, and both sides where GOOSE_PAPER_ROOT names a checkout of the paper's code (not part of this repository)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from goose.bench.conversation import turn_prompt_ids
from goose.bench.prompts import load_samples
from goose.models import pretrained_location
from tests.helpers import PACKAGED_DATA, REPO

SCRIPT = REPO / "scripts" / "paper_peer.py"
EXPECTED = "a checkout of https://github.com/2kinto/GOOSE_Speculative_Decoding"
PAPER_ROOT = os.environ.get("GOOSE_PAPER_ROOT", "").strip()
SMALL_RUN = ["--model", "smollm2-135m", "--datasets", "humaneval", "--limit", "1", "--max-new-tokens", "16",
             "--dtype", "float32", "--threads", "1"]


def paper_peer(*flags: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, env={**os.environ, "GOOSE_DATA": str(PACKAGED_DATA)})


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- flags, checked before anything loads ---------------------------------------------------------


@pytest.mark.parametrize(("root", "message"), [
    (None, "the official side needs --official-root"),
    ("missing", "no such folder"),
    ("file", "not a folder"),
    ("empty", "no goose/decoding.py in it"),
])
def test_an_unusable_official_root_is_one_line_and_exit_status_2(root: str | None, message: str,
                                                                 tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a checkout")
    (tmp_path / "empty" / "goose").mkdir(parents=True)
    flags = [] if root is None else ["--official-root", str(tmp_path / root)]
    run = paper_peer(*flags, "--out", str(tmp_path / "out"), timeout=120)
    assert run.returncode == 2, run.stderr
    assert message in run.stderr and EXPECTED in run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing written, no model touched


def test_a_config_that_is_not_ours_is_refused(tmp_path: Path) -> None:
    run = paper_peer("--sides", "ours", "--config", '{"node_budget": 60}', "--out", str(tmp_path), timeout=120)
    assert run.returncode == 2 and "--config: not fields of our GooseConfig" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_failing_side_names_its_command_and_last_stderr_lines(tmp_path: Path) -> None:
    """A folder that passes the root check but is not the paper's code: the official side's own process stops,
    and the parent says which command failed and shows what it printed."""
    fake = tmp_path / "fake"
    (fake / "goose").mkdir(parents=True)
    (fake / "goose" / "__init__.py").write_text("")
    (fake / "goose" / "decoding.py").write_text("")
    run = paper_peer("--official-root", str(fake), *SMALL_RUN, "--sides", "official", "--out", str(tmp_path / "out"))
    assert run.returncode == 1, run.stderr
    failure = run.stderr[run.stderr.index("paper_peer: the official side failed"):]
    assert "(exit status 2)" in failure and f"PYTHONPATH={fake}" in failure and "--_side official" in failure
    assert "its last stderr lines:" in failure and "is not the paper's code" in failure and EXPECTED in failure
    assert (tmp_path / "out" / "inputs.jsonl").is_file() and not (tmp_path / "out" / "official.jsonl").exists()


# --- real runs ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_our_side_on_smollm2(tmp_path: Path) -> None:
    """--sides ours: the prompt encoded as `goose bench` encodes it, our output the autoregressive one (float32),
    tau from the passes after the prefill, the table and the summary written."""
    run = paper_peer(*SMALL_RUN, "--sides", "ours", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    [record] = read_rows(tmp_path / "inputs.jsonl")
    tokenizer = AutoTokenizer.from_pretrained(pretrained_location("smollm2-135m"))
    sample = load_samples("humaneval", PACKAGED_DATA, 1)[0]
    assert record["input_ids"] == turn_prompt_ids(tokenizer, sample.turns[:1], [], chat=True)
    assert record["id"] == "humaneval/0" and record["n_prompt"] == len(record["input_ids"])

    [row] = read_rows(tmp_path / "ours.jsonl")
    assert row["side"] == "ours" and 0 < row["new_tokens"] <= 16
    assert row["new_token_ids"] == row["ar_new_token_ids"] and row["identical_to_ar"] is True
    assert row["tau"] == pytest.approx((row["new_tokens"] - 1) / (row["passes"] - 1), abs=1e-4)
    assert row["tau"] >= 1.0 and row["tau"] == pytest.approx(row["native_tau"], abs=1e-4)
    assert "[ours] 1/1 humaneval/0:" in run.stderr  # the progress line

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["sides"] == ["ours"] and summary["compared"] == 1
    assert summary["mean_tau"] == {"official": None, "ours": row["tau"]} and summary["ratio_of_means"] is None
    assert summary["identical"] == {"ours_to_ar": 1} and summary["ours_config"] == {"budget": 60}
    assert summary["speed_ratio_mean"] is None  # one side: nothing to compare its speed with
    assert summary["over_own_ar_mean"]["ours"] == pytest.approx(row["ar_wall_s"] / row["wall_s"], rel=1e-3)
    assert summary["per_prompt"][0]["tokens_per_s"] == [None, pytest.approx(row["new_tokens"] / row["wall_s"],
                                                                           rel=1e-3)]
    table = (tmp_path / "table.md").read_text()
    assert f"| humaneval/0 | {record['n_prompt']} | - / {row['new_tokens']} |" in table
    assert table in run.stdout


@pytest.mark.slow
@pytest.mark.skipif(not PAPER_ROOT, reason="GOOSE_PAPER_ROOT names no checkout of the paper's code "
                    "(github.com/2kinto/GOOSE_Speculative_Decoding); it is not part of this repository")
def test_both_sides_on_smollm2(tmp_path: Path) -> None:
    """Their decode and ours on one prompt, each in its own process: both outputs their autoregressive ones."""
    run = paper_peer("--official-root", PAPER_ROOT, *SMALL_RUN, "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    rows = {side: read_rows(tmp_path / f"{side}.jsonl") for side in ("official", "ours")}
    for side, [row] in rows.items():
        assert row["new_token_ids"] == row["ar_new_token_ids"], side
        assert row["tau"] is not None and row["tau"] >= 1.0, side
    assert isinstance(rows["official"][0]["crop_cache_replaced"], bool)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["identical"]["official_to_ar"] == summary["identical"]["ours_to_ar"] == 1
    assert summary["ratio_of_means"] == pytest.approx(rows["ours"][0]["tau"] / rows["official"][0]["tau"], abs=1e-3)
    assert sum(summary["ahead"].values()) == 1
    speeds = [row["new_tokens"] / row["wall_s"] for row in (rows["official"][0], rows["ours"][0])]
    assert summary["speed_ratio_mean"] == pytest.approx(speeds[1] / speeds[0], rel=1e-3)
