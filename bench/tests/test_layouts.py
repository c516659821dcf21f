"""``goose bench layouts``: a GGUF file re-quantized by llama.cpp, measured beside the shipped one; its flags checked
before anything loads, and one real run on SmolLM2's Q4_1 file where llama-cpp-python is installed."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from goose import cli
from goose_bench.layouts import LAYOUTS_FILE, PLOT_FILE, SIZES, run_layouts
from goose_bench.peers import llama_runner

LLAMA_BUILT = importlib.util.find_spec("llama_cpp") is not None  # `make llama-setup` installs it into this environment
FOREIGN = llama_runner.llama_cpp_refusal()  # a build for another CPU's instruction sets


@pytest.mark.parametrize(("flags", "message"), [
    (["--layouts", "q4_0,q5_k"], "--layouts takes names from q4_0, iq4_nl, q4_k-q8_0-head; got 'q4_0,q5_k'"),
    (["--layouts", ","], "--layouts takes names from"),
    (["--model", "someone/some-model"], "someone/some-model has no GGUF file"),
])
def test_bench_layouts_argument_errors(flags: list[str], message: str, capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    assert cli.main(["bench", "layouts", "--out", str(tmp_path), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything was written


@pytest.mark.slow
@pytest.mark.skipif(not LLAMA_BUILT or FOREIGN is not None,
                    reason=FOREIGN or "llama-cpp-python is not installed (`make llama-setup` builds it)")
def test_bench_layouts_writes_and_measures_a_q4_0_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SmolLM2's Q4_1 file re-quantized to Q4_0 (a second): written into --out, loaded, its curve and perplexity
    beside the shipped file's in the table, layouts.json and layouts.png; a second run keeps the file."""
    flags = ["--model", "smollm2-135m", "--layouts", "q4_0", "--rounds", "1", "--windows", "2", "--window-tokens",
             "64", "--threads", "1", "--out", str(tmp_path)]
    assert cli.main(["bench", "layouts", *flags]) == 0
    output = capsys.readouterr()
    written = tmp_path / "SmolLM2-135M-Instruct.Q4_1-q4_0.gguf"
    assert f"writing {written} (q4_0 from SmolLM2-135M-Instruct.Q4_1.gguf" in output.err
    assert "| SmolLM2-135M-Instruct.Q4_1-q4_0.gguf (q4_0) | 78 |" in output.out
    document = json.loads((tmp_path / LAYOUTS_FILE).read_text())
    assert (tmp_path / PLOT_FILE).stat().st_size > 0
    shipped, layout = document["files"]
    assert (shipped["layout"], layout["layout"]) == (None, "q4_0") and layout["path"] == str(written.resolve())
    assert "Q4_0" in layout["description"] and "Q4_1" in shipped["description"]  # as llama.cpp loaded each file
    assert layout["bytes"] == written.stat().st_size < shipped["bytes"]
    for entry in document["files"]:
        assert len(entry["seconds"]) == len(SIZES) and all(s > 0 and math.isfinite(s) for s in entry["seconds"])
        assert entry["ratios"][0] == 1.0 and all(math.isfinite(r) for r in entry["ratios"])
        # a 135M model on Python source: far from 1 (a broken score) and from the vocabulary's 49152 (a uniform one)
        assert 2 < entry["perplexity"] < 200 and len(entry["window_perplexities"]) == 2
    assert document["conditions"]["text"] == {"modules": ["argparse", "difflib"],
                                              "python": document["conditions"]["text"]["python"], "windows": 2,
                                              "window_tokens": 64, "scored_tokens": 126}
    assert shipped["perplexity_change"] == 0.0 and layout["perplexity_change"] == pytest.approx(
        layout["perplexity"] / shipped["perplexity"] - 1)

    written_at = written.stat().st_mtime_ns
    again = run_layouts("smollm2-135m", ["q4_0"], tmp_path, threads=1, rounds=1, windows=2, window_tokens=64)
    assert "writing" not in capsys.readouterr().err and written.stat().st_mtime_ns == written_at
    # the same windows of the same text: the same perplexity, to the last bits llama.cpp's threads may move
    assert again["files"][1]["perplexity"] == pytest.approx(layout["perplexity"], rel=1e-4)
