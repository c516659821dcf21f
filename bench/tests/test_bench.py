"""Tests for ``goose bench``: prompt formats, method table, aggregation, report, and one real run."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

import goose
import goose_bench.prompts
from goose import cli, models, plugins
from goose.config import GooseConfig
from goose.planning.cost import CostCurve
from goose_bench.aggregate import ALL, build_summary, lookup, summarize
from goose_bench.concurrency import ConcurrencyRow, write_concurrency
from goose_bench.conversation import turn_prompt_ids
from goose_bench.generators import TurnOutput
from goose_bench.medians import median_of, middle_by
from goose_bench.methods import (
    ABLATIONS,
    ALL_METHODS,
    MAIN_METHODS,
    METHODS,
    QUICK_METHODS,
    SUITE_NAMES,
    SWEEP,
    Method,
    method_named,
    resolve_methods,
    suite_methods,
    unavailable_reason,
)
from goose_bench.outputs import write_outputs
from goose_bench.peers import vllm_runner
from goose_bench.prompts import (
    KNOWN_DATASETS,
    PACKAGED_DATA,
    PAPER_DATASETS,
    DatasetError,
    Sample,
    default_data_dir,
    load_samples,
)
from goose_bench.records import build_record, compare
from goose_bench.report import build_report
from goose_bench.runner import describe, finished_cells
from goose_bench.study import predicted_speedup, study_rows, tokens_lost_without
from goose_bench.vllm_peer import (
    DEFAULT_VLLM_METHODS,
    VllmBenchError,
    run_vllm_bench,
    vllm_peer,
    vllm_rows,
)


def _raw(name: str, limit: int) -> list[dict]:
    with (PACKAGED_DATA / f"{name}.jsonl").open() as lines:
        return [json.loads(line) for _, line in zip(range(limit), lines, strict=False)]


# --- prompts -------------------------------------------------------------------------------------


def test_prompt_formats_follow_the_paper_per_dataset() -> None:
    he, mb, ce, gs = (_raw(n, 2) for n in ("humaneval", "mbpp", "classeval", "gsm8k"))
    expected = {
        "humaneval": [("Complete this Python function:\n" + r["prompt"],) for r in he],
        "mbpp": [(r["text"] + "\n" + r["test_list"][0],) for r in mb],
        "classeval": [("Complete this Python class:\n" + r["skeleton"],) for r in ce],
        "gsm8k": [(r["question"] + "\nLet's think step by step.",) for r in gs],
    }
    for name, turns in expected.items():
        samples = load_samples(name, PACKAGED_DATA, limit=2)
        assert [s.turns for s in samples] == turns
        assert all(s.dataset == name for s in samples)
    assert [s.question_id for s in load_samples("humaneval", PACKAGED_DATA, 2)] == ["HumanEval/0", "HumanEval/1"]
    assert load_samples("mbpp", PACKAGED_DATA, 1)[0].question_id == 11


def test_the_project_ships_its_prompts_with_licenses_and_no_answers(monkeypatch) -> None:
    monkeypatch.delenv("GOOSE_DATA", raising=False)
    assert default_data_dir() == PACKAGED_DATA and PACKAGED_DATA.parent == Path(goose_bench.prompts.__file__).parent
    readme = (PACKAGED_DATA / "README.md").read_text()
    answers = {"canonical_solution", "test", "code", "solution_code", "answer", "reference", "challenge_test_list"}
    for name in (*PAPER_DATASETS, "spec_bench"):
        assert load_samples(name, limit=1), name  # no data folder given: the shipped one
        records = [json.loads(line) for line in (PACKAGED_DATA / f"{name}.jsonl").read_text().splitlines()]
        assert not answers & set().union(*records), name  # nothing a datastore or memory could copy an answer from
        assert f"`{name}.jsonl`" in readme
    for license_file in re.findall(r"`licenses/([^`]+)`", readme):
        assert (PACKAGED_DATA / "licenses" / license_file).is_file(), license_file


def test_multi_turn_datasets_keep_both_turns_and_categories() -> None:
    mt = load_samples("mt_bench", PACKAGED_DATA, limit=3)
    assert [len(s.turns) for s in mt] == [2, 2, 2]
    assert mt[0].turns == tuple(_raw("mt_bench", 1)[0]["turns"])
    assert (mt[0].question_id, mt[0].category) == (81, "writing")
    spec = load_samples("spec_bench", PACKAGED_DATA, limit=None)
    assert len(spec) == 480
    assert {len(s.turns) for s in spec if s.category == "qa"} == {1}
    assert all(len(load_samples(name, PACKAGED_DATA, limit=1)) == 1 for name in KNOWN_DATASETS)


def test_custom_jsonl_prompt_or_turns(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "Say hi."}\n\n{"turns": ["One?", "Two?"], "id": "q7", "category": "chat"}\n'
                    '{"prompt": "Third", "question_id": 3}\n')
    samples = load_samples(str(path), limit=None)
    assert samples == [
        Sample("mine", 0, ("Say hi.",)),
        Sample("mine", "q7", ("One?", "Two?"), "chat"),
        Sample("mine", 3, ("Third",)),
    ]
    assert len(load_samples(str(path), limit=2)) == 2


@pytest.mark.parametrize(("content", "message"), [
    ('{"text": "no prompt"}\n', "mine.jsonl:1: cannot format"),
    ('{"prompt": "ok"}\nnot json\n', "mine.jsonl:2: not JSON"),
    ('["a list"]\n', "expected a JSON object"),
    ('{"turns": []}\n', "cannot format"),
    ('{"prompt": "   "}\n', "empty prompt"),
    ("\n\n", "no samples"),
])
def test_custom_jsonl_errors_say_where(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(content)
    with pytest.raises(DatasetError, match=message):
        load_samples(str(path))


def test_unknown_dataset_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="unknown dataset 'humaneavl'"):
        load_samples("humaneavl", PACKAGED_DATA)
    with pytest.raises(DatasetError, match="not found"):
        load_samples("gsm8k", tmp_path)


def test_turn_prompts_carry_the_earlier_answer(smollm2) -> None:
    _, tokenizer = smollm2
    turns = ("Name a fruit.", "Now name a vegetable.")
    first = turn_prompt_ids(tokenizer, turns, [])
    assert first == models.encode_prompt(tokenizer, turns[0])
    second = tokenizer.decode(turn_prompt_ids(tokenizer, turns, ["An apple."]))
    assert second.index("Name a fruit.") < second.index("An apple.") < second.index("Now name a vegetable.")
    assert second.rstrip().endswith("assistant")  # ends with the assistant's generation prompt
    plain = turn_prompt_ids(tokenizer, turns, ["An apple."], chat=False)
    assert plain == tokenizer.encode("Name a fruit.\n\nAn apple.\n\nNow name a vegetable.")
    with pytest.raises(ValueError, match="no user turn"):
        turn_prompt_ids(tokenizer, turns, ["a", "b"])


# --- methods -------------------------------------------------------------------------------------


def test_method_table_defines_the_papers_methods_as_config() -> None:
    assert set(MAIN_METHODS) == {"ar", "hf_ar", "hf_pld", "pld", "tr", "lookahead", "rest", "iso3", "iso5",
                                 "goose", "goose3", "goose_rest", "goose4"}
    assert METHODS["pld"].fields == {"sources": ["context_match"], "topology": "chain"}
    tr = METHODS["tr"].config()
    assert (tr.sources, tr.topology, tr.options_for("bigram_transition")) == (
        ["bigram_transition"], "transition_tree", {"unigram_only": True})
    assert (METHODS["iso3"].config().options_for("isotropic"), METHODS["iso5"].config().options_for("isotropic")) == (
        {"k": 3}, {"k": 5})
    assert METHODS["iso5"].config().sources == GooseConfig().sources  # equal sources: a topology comparison
    assert METHODS["goose"].config() == GooseConfig()
    goose3 = METHODS["goose3"].config()  # the default config and one more source, nothing else changed
    assert goose3 == GooseConfig(sources=[*GooseConfig().sources, "suffix_memory"],
                                 source_options={"suffix_memory": {"search_current": False}})
    assert METHODS["goose_rest"].config() == GooseConfig(sources=[*GooseConfig().sources, "rest"])
    goose4 = METHODS["goose4"].fields
    assert goose4["topology"] == "multi_spine"
    assert set(goose4["sources"]) == {"context_match", "bigram_transition", "rest", "lookahead"}
    assert METHODS["hf_pld"].fields == {"prompt_lookup_num_tokens": 10}
    assert [m.kind for m in (METHODS["ar"], METHODS["hf_ar"], METHODS["goose"])] == ["ar", "hf", "goose"]


def test_suites_ablations_and_sweeps_are_method_lists() -> None:
    assert QUICK_METHODS == ("ar", "pld", "goose", "hf_pld")
    for suite in SUITE_NAMES:  # generated from the registry: every Goose method validates
        assert all(unavailable_reason(m) is None for m in suite_methods(suite)), suite
    assert ABLATIONS["no_spine_branches"].config().options_for("spine") == {"branches": False}
    assert ABLATIONS["no_consensus_bypass"].config().options_for("spine") == {"consensus_bypass": False}
    assert ABLATIONS["unigram_adjacency"].config().options_for("bigram_transition") == {"unigram_only": True}
    assert ABLATIONS["no_cm_spine"].config().sources == ["bigram_transition"]
    assert ABLATIONS["no_cm_spine"].config().topology == "spine"
    assert SWEEP["B=16"].config().budget == 16
    assert SWEEP["D=4"].config().max_depth == 4
    assert SWEEP["rho=0.25"].config().options_for("spine") == {"branch_ratio": 0.25}
    spine_options = plugins.registry().topology("spine").options  # the model the spine registered
    fixed = spine_options.model_validate(SWEEP["r=0.3"].config().options_for("spine"))
    assert fixed.split == "tiers" and {fixed.ratio(p) for p in (0.0, 0.3, 0.9)} == {0.3}
    assert SWEEP["r=optimal"].config().options_for("spine") == {"split": "optimal"}
    for method in ALL_METHODS.values():  # every Goose method validates and its plugins are registered
        if method.kind == "goose":
            assert unavailable_reason(method) is None, method.name


def test_resolve_methods_puts_ar_first_and_rejects_unknown_names() -> None:
    assert [m.name for m in resolve_methods(["goose", "pld", "goose", "ar"])] == ["ar", "goose", "pld"]
    with pytest.raises(ValueError, match="unknown method 'gose'"):
        resolve_methods(["gose"])


def test_unavailable_methods_say_why() -> None:
    assert unavailable_reason(METHODS["goose"]) is None
    assert unavailable_reason(METHODS["hf_pld"]) is None
    ghost = Method("ghost", "goose", "a source nobody wrote", "source", {"sources": ["ghost_source"]})
    assert "source 'ghost_source' is not registered" in unavailable_reason(ghost)
    assert ABLATIONS["tr_spine_tokens"].config().options_for("spine") == {"tokens": "transition"}


# --- records, aggregation, report ----------------------------------------------------------------


def _turn(ids: list[int], wall: float, steps: list[int] | None = None, *, tested: dict | None = None,
          accepted: dict | None = None, kinds: dict | None = None) -> TurnOutput:
    stats = None if steps is None else {"source_tested": tested or {}, "source_accepted": accepted or {},
                                        "path_kinds": kinds or {}, "prefill_s": 0.0, "mean_tree_size": 1.0}
    return TurnOutput(prompt_tokens=5, new_token_ids=ids, text=" ".join(map(str, ids)), wall_s=wall,
                      stop_reason="max_new_tokens", accepted_lengths=steps, stats=stats)


def _sample_records(dataset: str, qid: int, ar_wall: float, goose_wall: float, goose_ids: list[int],
                    iso_steps: list[int]) -> list[dict]:
    sample = Sample(dataset, qid, ("prompt",))
    ids = [1, 2, 3, 4, 5, 6]
    per_method = {
        "ar": [_turn(ids, ar_wall, [1] * 5)],
        "hf_ar": [_turn(ids, ar_wall / 2)],
        "goose": [_turn(goose_ids, goose_wall, [2, 3], tested={"context_match": 4, "bigram_transition": 20},
                        accepted={"context_match": 2, "bigram_transition": 1},
                        kinds={"pure_spine": 1, "spine_continuation": 1})],
        "pld": [_turn(ids, goose_wall * 2, [1, 2, 1, 1])],
        "iso3": [_turn(ids, goose_wall * 1.5, iso_steps)],
    }
    records = {name: build_record("tiny", name, sample, outputs) for name, outputs in per_method.items()}
    compare(records)
    return list(records.values())


@pytest.fixture
def recorded() -> list[dict]:
    return [*_sample_records("humaneval", 0, 2.0, 1.0, [1, 2, 3, 4, 5, 6], [1, 2, 2]),
            *_sample_records("humaneval", 1, 4.0, 1.0, [1, 2, 3, 4, 5, 6], [1, 1, 3]),
            *_sample_records("gsm8k", 2, 3.0, 3.0, [1, 2, 3, 4, 5, 9], [2, 2, 1])]


def test_records_are_spec_bench_compatible(recorded: list[dict]) -> None:
    goose_record = next(r for r in recorded if r["method"] == "goose")
    choice = goose_record["choices"][0]
    assert goose_record["model_id"] == "tiny-goose" and goose_record["question_id"] == 0
    assert choice["new_tokens"] == [6] and choice["wall_time"] == [1.0] and choice["accept_lengths"] == [2, 3]
    assert choice["decoding_steps"] == [2]
    assert goose_record["tau"] == 2.5 and goose_record["speedup"] == pytest.approx(2.0)
    assert goose_record["speedup_vs_hf_ar"] == pytest.approx(1.0)
    assert goose_record["source_acceptance"] == {"bigram_transition": 0.05, "context_match": 0.5}
    hf = next(r for r in recorded if r["method"] == "hf_ar")
    assert hf["tau"] is None and hf["verify_steps"] is None and hf["choices"][0]["decoding_steps"] is None
    json.dumps(recorded)  # every record is JSON


def test_aggregation_follows_the_paper(recorded: list[dict]) -> None:
    rows = summarize(recorded)
    he = lookup(rows, "goose", "humaneval")
    # mean of per-sample speedups (2.0 and 4.0), not the ratio of mean speeds
    assert he["speedup"] == pytest.approx(3.0) and he["samples"] == 2
    assert he["tau"] == pytest.approx(2.5) and he["identical_to_ar"] == 1.0
    gs = lookup(rows, "goose", "gsm8k")
    assert gs["speedup"] == pytest.approx(1.0) and gs["identical_to_ar"] == 0.0
    overall = lookup(rows, "goose", ALL)
    assert overall["speedup"] == pytest.approx(2.0)  # mean over datasets, each weighing the same
    assert overall["identical_to_ar"] == pytest.approx(2 / 3)  # pooled over samples
    assert overall["samples"] == 3
    assert overall["source_acceptance"] == {"bigram_transition": 0.05, "context_match": 0.5}
    assert overall["path_kinds"] == {"pure_spine": 0.5, "spine_continuation": 0.5}
    iso = lookup(rows, "iso3", "humaneval")
    assert iso["tau"] == pytest.approx(10 / 6)  # pooled over steps: (1+2+2+1+1+3) / 6
    assert lookup(rows, "hf_ar", ALL)["tau"] is None
    assert lookup(rows, "ar", ALL)["speedup"] == 1.0 and lookup(rows, "ar", ALL)["tau"] == 1.0
    assert [r["dataset"] for r in rows if r["method"] == "ar"] == ["humaneval", "gsm8k", ALL]


def test_report_has_the_papers_tables(recorded: list[dict], tmp_path: Path) -> None:
    described = {name: describe(m) for name, m in ALL_METHODS.items()
                 if name in {"ar", "hf_ar", "goose", "pld", "iso3"}}
    summary = build_summary("tiny", "cpu", "float32", recorded, described,
                            {"rest": "source 'rest' is not registered"}, {"max_new_tokens": 6})
    report = build_report([summary])
    # tokens/s summed: 6 + 6 + 2 over ar's 3 + 1.5 + 2 = 2.15x beside the mean of ratios' 2.00x (within 10%); the
    # interval resamples HumanEval's two prompts (mean 2x, 3x or 4x) beside GSM8K's one: (2 + 1) / 2 to (4 + 1) / 2
    assert "| `goose` | 3.00x / 2.50 | 1.00x / 2.50 | 2.00x | 1.50–2.50x | 2.15x | 2.50 |" in report
    assert "| `goose` | **all** | 3 | 1.00x / 2.00x / 4.00x | 2.00x | 2.15x |  | – |" in report
    # on HumanEval the mean of ratios (2x and 4x: 3.00x) and 12 over 4.5 tokens/s (2.67x) lie 12% apart
    assert "| `goose` | HumanEval | 2 | 2.00x / 3.00x / 4.00x | 3.00x | 2.67x | (!) | – |" in report
    assert "### Topology at equal sources and budget" in report
    spine_vs_iso = 2.5 / (10 / 6) - 1
    assert f"{spine_vs_iso:+.1%}" in report
    assert "### Synergy" in report and "`pld` 1.25" in report
    assert "p_s/p_t" in report and "10.0x" in report  # 0.5 / 0.05
    assert "- `rest`: source 'rest' is not registered" in report
    assert "Speedup over Hugging Face `generate`" in report
    assert "67%" in report  # goose identical on 2 of 3 samples

    written = write_outputs([summary], tmp_path)
    names = {p.name for p in written}
    assert {"summary.json", "report.md", "speedup.png", "tau_topology.png", "acceptance.png"} <= names
    assert all(p.stat().st_size > 0 for p in written)
    loaded = json.loads((tmp_path / "summary.json").read_text())
    assert set(loaded) >= {"model", "device", "dtype", "results"}
    assert {"method", "dataset", "samples", "speedup", "tau", "tokens_per_s", "identical_to_ar"} <= set(
        loaded["results"][0])


def test_several_models_give_a_summary_list(recorded: list[dict], tmp_path: Path) -> None:
    summaries = [build_summary(name, "cpu", "bfloat16", recorded) for name in ("a/one", "two")]
    written = {p.name for p in write_outputs(summaries, tmp_path)}
    assert {"speedup-a_one.png", "speedup-two.png"} <= written
    assert [s["model"] for s in json.loads((tmp_path / "summary.json").read_text())] == ["a/one", "two"]
    report = (tmp_path / "report.md").read_text()
    assert "## a/one" in report and "## two" in report


def test_ablation_and_sweep_tables() -> None:
    records = []
    for name, steps in (("ar", [1, 1]), ("goose", [3, 3]), ("no_consensus_bypass", [2, 4, 3, 3]),
                        ("B=16", [2, 2])):
        records.append(build_record("tiny", name, Sample("gsm8k", 0, ("p",)), [_turn([1, 2], 1.0, steps)]))
    compare({r["method"]: r for r in records})
    described = {n: {"group": ALL_METHODS[n].group} for n in ("ar", "goose", "no_consensus_bypass", "B=16")}
    report = build_report([build_summary("tiny", "cpu", "float32", records, described)])
    assert "### Ablations" in report and "| `no_consensus_bypass` | 3.00 | 3.00 | +0.0% |" in report
    assert "### Sensitivity sweeps" in report and "| budget | `B=16` | 2.00 |" in report


def test_categories_of_multi_category_datasets() -> None:
    records = []
    for qid, category, wall in ((81, "writing", 1.0), (161, "translation", 2.0), (162, "translation", 4.0)):
        sample = Sample("spec_bench", qid, ("p",), category)
        measured = {"ar": build_record("tiny", "ar", sample, [_turn([1, 2], 4.0, [1])]),
                    "goose": build_record("tiny", "goose", sample, [_turn([1, 2], wall, [2])])}
        compare(measured)
        records += measured.values()
    records.append(build_record("tiny", "ar", Sample("gsm8k", 1, ("p",)), [_turn([1], 1.0, [1])]))
    summary = build_summary("tiny", "cpu", "float32", records)
    rows = summary["categories"]
    assert {r["dataset"] for r in rows} == {"spec_bench/writing", "spec_bench/translation"}  # gsm8k: one category
    assert lookup(rows, "goose", "spec_bench/translation")["speedup"] == pytest.approx(1.5)  # mean of 2x and 1x
    report = build_report([summary])
    assert "### Per category" in report and "translation (2)" in report and "| `goose` | 4.00x / 2.00 |" in report


# --- one real run ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_bench_end_to_end_on_smollm2(tmp_path: Path) -> None:
    status = cli.main(["bench", "run", "--model", "smollm2-135m", "--datasets", "humaneval", "--limit", "1",
                       "--max-new-tokens", "16", "--methods", "ar,pld,goose,hf_pld", "--dtype", "float32",
                       "--no-memo", "--out", str(tmp_path), "--no-progress"])  # the clock's figures: every pass real
    assert status == 0
    for name in ("results.jsonl", "summary.json", "report.md", "speedup.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["method"] for r in records] == ["ar", "pld", "goose", "hf_pld"]
    assert all(r["new_tokens"] == 16 or r["stop_reasons"] == ["eos"] for r in records)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["model"], summary["dtype"], summary["unavailable"]) == ("smollm2-135m", "float32", {})
    for method in ("pld", "goose", "ar"):
        row = lookup(summary["results"], method, ALL)
        assert row["identical_to_ar"] == 1.0, method
        mine = [r for r in records if r["method"] == method]
        # tau pools the records' own accepted lengths per verify pass (not a mean of per-record taus)
        accepted = sum(sum(r["choices"][0]["accept_lengths"]) for r in mine)
        assert row["tau"] == pytest.approx(accepted / sum(r["verify_steps"] for r in mine)) and row["speedup"] > 0
    # ar commits one token a pass; Goose's sources drafted tokens that were accepted, so it commits more
    assert lookup(summary["results"], "ar", ALL)["tau"] == 1.0
    goose_records = [r for r in records if r["method"] == "goose"]
    assert sum(sum(r["source_accepted"].values()) for r in goose_records) > 0
    assert lookup(summary["results"], "goose", ALL)["tau"] > 1.0
    assert lookup(summary["results"], "hf_pld", "humaneval")["samples"] == 1
    # time to first token for every method: ours from the decoder, the HF peer's from a streamer's clock
    for record in records:
        assert 0 < record["first_token_s"] < record["wall_s"], record["method"]
    assert lookup(summary["results"], "hf_pld", ALL)["first_token_s"] == records[-1]["first_token_s"]
    report = (tmp_path / "report.md").read_text()
    assert "| `goose` |" in report and "### Time to first token" in report


def test_one_jsonl_reader_for_prompts_and_a_stopped_runs_results(tmp_path: Path) -> None:
    """A results.jsonl cut short by a stop: its whole lines are kept cells, the broken last one runs again; in a
    prompt file the same line is an error naming it."""
    line = {"model": "m", "dataset": "gsm8k", "question_id": 3, "method": "goose", "prompt": "p"}
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps(line) + "\n" + json.dumps({**line, "method": "ar"})[:20])
    assert list(finished_cells(results)) == [("m", "gsm8k", "3", "goose")]
    with pytest.raises(DatasetError, match=r"results\.jsonl:2: not JSON"):
        load_samples(str(results), tmp_path)


def test_the_two_medians() -> None:
    assert median_of([3.0, None, 1.0, 2.0]) == 2.0 and median_of([None]) is None
    runs = [{"s": 4.0}, {"s": 1.0}, {"s": 3.0}, {"s": 2.0}]
    assert middle_by(runs, key=lambda run: run["s"]) == {"s": 2.0}  # the lower middle: a real run


@pytest.mark.slow
def test_repeats_keep_the_median_run_and_compare_with_prompt_lookup(tmp_path: Path) -> None:
    """--repeats 3: every method three times on the prompt, the record is the median-time run, every run's time kept;
    speedups over hf_pld per prompt in the records, the summary and the report; the real passes also priced on the
    run's own curve beside the clock (ar's own at 1x, goose's its passes' price a token)."""
    status = cli.main(["bench", "run", "--model", "smollm2-135m", "--datasets", "humaneval", "--limit", "1",
                       "--max-new-tokens", "8", "--methods", "ar,goose,hf_pld", "--dtype", "float32",
                       "--repeats", "3", "--out", str(tmp_path), "--no-progress"])
    assert status == 0
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["method"] for r in records] == ["ar", "goose", "hf_pld"]
    for record in records:
        runs = record["wall_s_runs"]
        assert len(runs) == 3 and record["wall_s"] == sorted(runs)[1], record["method"]
        assert record["repeats_identical"] is True  # the same work three times: the same tokens
    hf_pld = records[-1]
    for record in records:
        assert record["speedup_vs_hf_pld"] == pytest.approx(record["tokens_per_s"] / hf_pld["tokens_per_s"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["settings"]["repeats"] == 3
    goose_row = lookup(summary["results"], "goose", "humaneval")
    assert goose_row["speedup_vs_hf_pld"] == pytest.approx(records[1]["speedup_vs_hf_pld"])
    assert goose_row["speedup_vs_hf_pld_range"] == [goose_row["speedup_vs_hf_pld"]] * 2  # one prompt
    report = (tmp_path / "report.md").read_text()
    assert "ran 3 times on every prompt" in report and "### Speedup over Hugging Face prompt lookup" in report
    beside = CostCurve.from_dict(summary["settings"]["priced_beside"])
    assert beside.sizes == tuple(summary["settings"]["cost_curve"]["sizes"]) and "priced_on" not in summary["settings"]
    ar, goose = records[0], records[1]
    assert ar["estimated_speedup"] == 1.0 and records[2]["estimated_speedup"] is None  # hf_pld reports no passes
    assert goose["estimated_speedup"] == pytest.approx((len(ar["tree_sizes"]) * beside.seconds[0] / ar["new_tokens"])
                                                       / (sum(float(beside(n)) for n in goose["tree_sizes"])
                                                          / goose["new_tokens"]))
    assert goose_row["estimated_speedup_spread"] == [goose["estimated_speedup"]] * 3
    assert "priced on this device's measured curve" in report and "beside the clock" in report


@pytest.mark.parametrize(("flags", "message"), [
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--repeats", "2", "--warm-sources"], "leave out --warm-sources or --repeats"),
])
def test_bench_repeats_bad_values(flags: list[str], message: str, tmp_path: Path, capsys) -> None:
    assert cli.main(["bench", "run", "--datasets", "humaneval", "--out", str(tmp_path), *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_sampled_study_run_on_smollm2(tmp_path: Path) -> None:
    """A sampled run of study configurations: same seed per sample for every method, lossless in float32,
    the study's tables and plot written."""
    methods = "goose,hf_pld,cm+bt@spine,cm+bt+la@multi_spine"
    status = cli.main(["bench", "run", "--model", "smollm2-135m", "--datasets", "humaneval,gsm8k", "--limit", "1",
                       "--max-new-tokens", "16", "--methods", methods, "--dtype", "float32", "--temperature", "0.7",
                       "--top-p", "0.9", "--seed", "5", "--out", str(tmp_path), "--no-progress"])
    assert status == 0
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    for record in records:
        assert record["seed"] == 5 + (0 if record["dataset"] == "humaneval" else 1)
        if record["method"] != "hf_pld":  # ours sample by (seed, position): every text is ar's
            assert record["identical_to_ar"] is True, record["method"]
            assert len(record["tree_sizes"]) == record["verify_steps"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["settings"]["sampling"]["temperature"] == 0.7 and summary["settings"]["cost_curve"]["sizes"]
    study = {row["method"]: row for row in summary["study"]["rows"]}
    assert set(study) == {"cm+bt@spine", "cm+bt+la@multi_spine"}
    assert all(row["predicted_device"] > 0 for row in study.values())
    for method in study:  # each study method's sources drafted, and their drafts were verified
        assert sum(sum(r["source_tested"].values()) for r in records if r["method"] == method) > 0, method
    assert "### Three-source study" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "study.png").stat().st_size > 0


def _study_record(method: str, dataset: str, lengths: list[int], sizes: list[int],
                  accepted: dict[str, int]) -> dict:
    record = build_record("tiny", method, Sample(dataset, 1, ("p",)),
                          [_turn(list(range(sum(lengths) + 1)), 1.0, lengths)])
    record.update(tree_sizes=sizes, auxiliary_rows=0, source_accepted=accepted, identical_to_ar=True, speedup=1.5)
    record["config"] = method_named(method).config().digest()  # as the runner records it
    return record


def test_study_rows_tokens_lost_and_predicted_speedups() -> None:
    curve = CostCurve((1, 4, 16), (1.0, 2.0, 4.0))  # a steep curve: four rows cost two tokens' time
    records = [
        _study_record("cm+bt@spine", "mbpp", [3, 1], [4, 4], {"context_match": 2}),
        _study_record("cm+bt+la@spine", "mbpp", [4, 2], [4, 16], {"context_match": 2, "lookahead": 2}),
    ]
    rows = {row["method"]: row for row in study_rows(records, curve)}
    assert rows["cm+bt@spine"]["tau"] == {"mbpp": 2.0, "all": 2.0}
    assert (rows["cm+bt+la@spine"]["sources"], rows["cm+bt+la@spine"]["topology"]) == (
        ["context_match", "bigram_transition", "lookahead"], "spine")  # the records' config
    assert rows["cm+bt+la@spine"]["yield_per_pass"] == {"cm": 1.0, "la": 1.0}
    # 5 tokens (4 accepted + the prefill's) in t(4) + t(4) = 4: 1.25x one token a pass; 7 in 2 + 4: 1.17x
    assert rows["cm+bt@spine"]["predicted_device"] == pytest.approx(5 / 4)
    assert rows["cm+bt+la@spine"]["predicted_device"] == pytest.approx(7 / 6)
    assert tokens_lost_without(list(rows.values())) == [
        {"triple": "cm+bt+la@spine", "source": "lookahead", "tau_lost": pytest.approx(1.0)}]
    flat = CostCurve((1, 2, 128), (1.0, 1.06, 1.06))  # a GPU-like curve: rows nearly free
    assert predicted_speedup(records[:1], flat) == pytest.approx(5 / (2 * 1.06))


def test_the_study_suite_is_every_pair_and_triple_under_three_shapes() -> None:
    methods = {m.name: m for m in suite_methods("three-source")}
    assert len(methods) == 1 + (10 + 10) * 3  # goose, then C(5, 2) + C(5, 3) source sets under three topologies
    assert methods["cm+bt@spine"].fields == {"sources": ["context_match", "bigram_transition"], "topology": "spine",
                                             "budget": 16}
    # beside context match the suffix memory remembers earlier requests only (no duplicate copies)
    assert methods["cm+bt+sm@spine"].fields["source_options"] == {"suffix_memory": {"search_current": False}}
    assert "source_options" not in methods["bt+rest+sm@spine"].fields
    assert all(m.config().budget == 16 for name, m in methods.items() if name != "goose")  # equal budgets


@pytest.mark.slow
def test_bench_concurrency_on_smollm2(tmp_path: Path) -> None:
    """Closed-loop clients at concurrency 1 and 2: every method's row, float32 outputs identical to AR's."""
    status = cli.main(["bench", "load", "--model", "smollm2-135m", "--datasets", "gsm8k,mt_bench", "--limit", "2",
                       "--max-new-tokens", "12", "--concurrency", "1,2", "--dtype", "float32", "--out", str(tmp_path),
                       "--no-progress"])
    assert status == 0
    rows = json.loads((tmp_path / "concurrency.json").read_text())
    found = {(row["method"], row["concurrency"]) for row in rows}
    assert found == {("ar_single", 1), ("goose_single", 1), *((m, c) for m in ("ar", "goose", "hf_ar") for c in (1, 2))}
    for row in rows:
        assert row["requests"] == 4 and row["tokens_per_s"] > 0 and row["latency_p95_s"] >= row["latency_p50_s"]
        # every request's own latency and tau, in prompt order: the p95 is one of them
        assert len(row["latencies_s"]) == len(row["taus"]) == 4 and max(row["latencies_s"]) >= row["latency_p95_s"]
        if row["method"] in ("ar", "ar_single"):  # one token a pass
            assert row["taus"] == [1.0] * 4, row["method"]
        elif row["method"] in ("goose", "goose_single"):  # some request accepted a drafted token
            assert max(row["taus"]) > 1.0, row["method"]
        if row["method"] != "hf_ar":  # our engines are exact in float32; HF's padded batches are reported as they are
            assert row["identical_to_ar"] == 1.0, row
    report = (tmp_path / "concurrency.md").read_text()
    assert "| goose | 2 |" in report
    assert "- goose at concurrency 2: the slowest request (prompt " in report and "batched ar took " in report
    assert (tmp_path / "concurrency.png").stat().st_size > 0


@pytest.mark.parametrize(("flag", "message"), [("1,x", "--concurrency takes integers"), ("0,2", "in 1..64")])
def test_bench_concurrency_bad_values(flag: str, message: str, capsys) -> None:
    assert cli.main(["bench", "load", "--concurrency", flag]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ["run", "--concurrency", "1"], ["run", "--python", "x"], ["load", "--repeats", "2"], ["load", "--temperature", "1"],
    ["llama", "--temperature", "0.7"], ["llama", "--vllm-methods", "none"], ["vllm", "--llama-methods", "llama"],
    ["run", "--sources", "cm"], ["load", "--suite", "ablation"], ["vllm", "--cost-curve", "device"], [],
])
def test_a_mode_takes_its_own_flags_only(command: list[str], capsys) -> None:
    """Each mode of `goose bench` a subcommand: another mode's flag is argparse's usage error, not a refusal."""
    with pytest.raises(SystemExit) as stopped:
        cli.main(["bench", *command, *(["--python", sys.executable] if command[:1] == ["vllm"] else [])])
    assert stopped.value.code == 2 and "usage:" in capsys.readouterr().err


# --- vLLM beside our load run (goose bench vllm) --------------------------------------------------------


def _our_row(method: str, concurrency: int, tokens_per_s: float) -> ConcurrencyRow:
    return ConcurrencyRow("smollm2-135m", method, concurrency, 2, 4, 4 / tokens_per_s, tokens_per_s, 0.5, 0.6, 1.0, 1.0)


def test_vllm_rows_from_vllm_runner_results(tmp_path: Path) -> None:
    """results.json as the vLLM runner writes it becomes vllm_* rows, compared with our AR outputs, in one report
    (its dataclasses and results.json writer need no vLLM until main())."""
    script = vllm_runner
    args = script.parse_arguments(["--datasets", "humaneval", "--limit", "2", "--max-tokens", "2",
                                   "--methods", "none,ngram", "--concurrency", "1,2"])
    assert args.concurrency == [1, 2]
    prompts = [script.Prompt("humaneval", 0, [1, 2, 3]), script.Prompt("humaneval", 1, [4, 5, 6])]
    drafted = {"drafts": 2, "draft_tokens": 8, "accepted_tokens": 1}
    runs = [script.Run("none", 1, 2.0, [[7, 8], [9, 10]], [0.5, 1.5]),
            script.Run("none", 2, 1.0, [[7, 8], [9, 10]], [None, None]),
            script.Run("ngram", 1, 1.0, [[7, 8], [9, 11]], [0.2, 0.8], drafted),
            script.Run("ngram", 2, 0.5, [[7, 8], [9, 11]], [None, None], drafted)]
    results_file = tmp_path / "results.json"
    results_file.write_text(json.dumps(script.results_document(args, {"vllm": "test"}, prompts, runs), indent=1))
    results = json.loads(results_file.read_text())
    reference = [[7, 8], [9, 10]]  # our single-request AR outputs

    rows, notes = vllm_rows(results, "smollm2-135m", [[1, 2, 3], [4, 5, 6]], reference)
    assert notes == []
    found = {(row.method, row.concurrency): row for row in rows}
    assert set(found) == {(m, c) for m in ("vllm_none", "vllm_ngram") for c in (1, 2)}
    assert [found["vllm_none", c].identical_to_ar for c in (1, 2)] == [1.0, 1.0]
    ngram = found["vllm_ngram", 1]
    assert (ngram.identical_to_ar, ngram.tokens_per_s, ngram.tau) == (0.5, 4.0, round(4 / 3, 3))
    assert (ngram.latency_p50_s, ngram.latency_p95_s) == (0.5, 0.77)  # one at a time: vLLM's own per-prompt times
    assert (found["vllm_ngram", 2].latency_p50_s, found["vllm_ngram", 2].latency_p95_s) == (None, None)

    # the second prompt encoded otherwise on vLLM's side: said, and left out of the comparison
    rows_other, notes_other = vllm_rows(results, "smollm2-135m", [[1, 2, 3], [4, 5]], reference)
    assert len(notes_other) == 1 and "1 of 2 prompts" in notes_other[0] and "humaneval/1" in notes_other[0]
    assert {row.identical_to_ar for row in rows_other} == {1.0}

    ours = [_our_row("ar", 1, 3.0), _our_row("goose", 1, 6.0), _our_row("ar", 2, 5.0), _our_row("goose", 2, 10.0),
            _our_row("goose_own", 2, 12.0)]
    written = write_concurrency(ours + rows, tmp_path / "out", {"smollm2-135m": notes_other})
    report = (tmp_path / "out" / "concurrency.md").read_text()
    assert "| vllm_ngram | 2 | 8.0 | 1.60x | - | - | 1.33 | 50% |" in report
    assert "- concurrency 1: batched goose 6.0 tok/s over vllm_ngram 4.0 tok/s = 1.50x" in report
    assert "- concurrency 2: batched goose_own 12.0 tok/s over vllm_ngram 8.0 tok/s = 1.50x" in report
    assert notes_other[0] in report
    saved = json.loads((tmp_path / "out" / "concurrency.json").read_text())
    assert saved[-1] == {"model": "smollm2-135m", "method": "vllm_ngram", "concurrency": 2, "requests": 2,
                         "tokens": 4, "wall_s": 0.5, "tokens_per_s": 8.0, "latency_p50_s": None,
                         "latency_p95_s": None, "tau": 1.333, "identical_to_ar": 0.5, "latencies_s": None,
                         "taus": None}
    assert tmp_path / "out" / "concurrency.png" in written


def test_the_vllm_methods_goose_bench_accepts_are_the_ones_the_runner_runs() -> None:
    """`--vllm-methods` is checked before vLLM starts, against the packaged runner's METHODS: the defaults are
    among them, every accepted choice passes the runner's own argument check, and a name the runner does not
    know is refused on our side."""
    peer = vllm_peer(sys.executable, None)
    assert peer.methods == DEFAULT_VLLM_METHODS and peer.script == Path(vllm_runner.__file__)
    for method in vllm_runner.METHODS:
        chosen = vllm_peer(sys.executable, f"none,{method}").methods
        assert vllm_runner.parse_arguments(["--methods", ",".join(chosen)]).methods == list(chosen)
    with pytest.raises(ValueError, match="unknown goose_bogus"):
        vllm_peer(sys.executable, "none,goose_bogus")


@pytest.mark.parametrize(("flags", "message"), [
    (["--python", "/no/such/python"], "--python /no/such/python: no such interpreter"),
    (["--python", sys.executable, "--vllm-methods", "none,bogus"], "unknown bogus"),
    (["--python", sys.executable, "--vllm-methods", "ngram"], "must keep none"),
    (["--python", sys.executable, "--no-chat"], "always applies the chat template"),
])
def test_bench_vllm_argument_errors(flags: list[str], message: str, capsys) -> None:
    assert cli.main(["bench", "vllm", "--concurrency", "1", *flags]) == 2
    assert message in capsys.readouterr().err


def test_the_vllm_runner_imports_this_goose_alone(tmp_path: Path) -> None:
    """The runner (and vLLM's engine) import goose, goose_bench and the proposer's goose_vllm from a PYTHONPATH folder
    holding this process's packages and nothing else: from a wheel, the folder they lie in is a site-packages whose
    torch and transformers would shadow the versions vLLM pins."""
    probe = ("import json, os, sys, goose; first = os.environ['PYTHONPATH'].split(os.pathsep)[0]; "
             "json.dump({'goose': os.path.realpath(goose.__file__), 'beside': sorted(os.listdir(first))}, "
             "open(os.path.join(sys.argv[1], 'results.json'), 'w'))")
    results = run_vllm_bench([sys.executable, "-c", probe, str(tmp_path)], tmp_path, progress=False)
    proposer = ["goose_vllm"] if importlib.util.find_spec("goose_vllm") else []  # `make setup` installs goose-vllm
    assert results == {"goose": str(Path(goose.__file__).resolve()), "beside": ["goose", "goose_bench", *proposer]}


def test_a_failing_vllm_bench_names_the_command_and_its_stderr(tmp_path: Path) -> None:
    """The real runner, stopped by its own argument check (before it imports vLLM)."""
    command = [sys.executable, vllm_runner.__file__, "--methods", "none,bogus"]
    with pytest.raises(VllmBenchError) as failure:
        run_vllm_bench(command, tmp_path, progress=False)
    assert "exit status 2" in str(failure.value) and "--methods none,bogus" in str(failure.value)
    assert "unknown methods ['bogus']" in str(failure.value)
