"""A study through `goose bench` reads the target's memo (goose_bench.memo, whose exactness tests/test_memo.py checks):
a re-run computes nothing and records the same figures, and --resume runs only the cells a stopped run left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import CPU_CURVE

from goose import cli


def _bench(out: Path, *flags: str) -> list[dict]:
    status = cli.main(["bench", "run", "--model", "smollm2-135m", "--datasets", "humaneval", "--limit", "2",
                       "--max-new-tokens", "16", "--methods", "ar,goose,cm@chain,la+cm@spine", "--dtype", "float32",
                       "--out", str(out), "--no-progress", *flags])
    assert status == 0
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def _same_decoding(records: list[dict], others: list[dict]) -> None:
    assert len(records) == len(others)
    for record, other in zip(records, others, strict=True):
        for key in ("method", "question_id", "new_token_ids", "tree_sizes", "source_tested", "source_accepted",
                    "estimated_s", "estimated_speedup"):
            assert record[key] == other[key], (record["method"], key)
        assert record["choices"][0]["accept_lengths"] == other["choices"][0]["accept_lengths"], record["method"]


@pytest.mark.slow
def test_bench_study_reads_the_memo_and_resumes(tmp_path: Path) -> None:
    """A first run computes, a re-run on the same memo computes nothing and records the same figures, a run without
    the memo decodes the same, and --resume runs only the cells a stopped run had not written."""
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"sizes": list(CPU_CURVE.sizes), "seconds": list(CPU_CURVE.seconds)}))
    memo = ["--memo", str(tmp_path / "memo"), "--cost-curve", str(curve)]
    first = _bench(tmp_path / "first", *memo)
    assert sum(r["memo"]["computed_rows"] for r in first) > 0  # whichever method ran first on a prompt computed
    again = _bench(tmp_path / "again", *memo)
    _same_decoding(first, again)
    for record in again:
        assert record["memo"]["computed_rows"] == record["memo"]["passes"] == record["memo"]["prefills"] == 0
        assert record["memo"]["answered_rows"] > 0
    summary = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert summary["settings"]["memo"]["totals"]["computed_rows"] == 0
    assert summary["settings"]["priced_on"]["curve"] == str(curve)
    real = _bench(tmp_path / "real", "--no-memo", "--cost-curve", str(curve))
    _same_decoding(first, real)
    assert all(r["memo"] is None for r in real)
    # a run that stopped after its first prompt: --resume keeps those cells and runs the second prompt's
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    kept = (tmp_path / "first" / "results.jsonl").read_text().splitlines()[:4]
    (stopped / "results.jsonl").write_text("\n".join(kept) + "\n")
    resumed = _bench(stopped, *memo, "--resume")
    assert [r["answer_id"] for r in resumed[:4]] == [json.loads(line)["answer_id"] for line in kept]
    _same_decoding(first, resumed)
    assert json.loads((stopped / "summary.json").read_text())["settings"]["resumed"] is True
