"""A source installed by entry point is studied exactly like a built-in one.

A throwaway distribution (a dist-info on ``PYTHONPATH``: what ``pip install`` leaves, minus the
copy) registers ``plugins/goose-freq-next``'s source, and one with a hook that asks for a misspelt
argument. The real ``goose`` command then runs in subprocesses, as a user would: ``goose plugins``
names the broken one's argument, ``goose bench`` runs the new source as a composed method in the
deterministic mode, and its acceptance is in every output (the suites run in test_docs_plugins.py,
the walkthrough's commands).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from goose import plugins
from goose.plugins import PluginError
from goose_bench.methods import Overrides, builtin_sources, composed, read_study_file, resolve_methods, suite_methods
from goose_bench.study import default_sources, study_order

REPO = Path(__file__).resolve().parents[2]
FREQ_NEXT = REPO / "plugins" / "goose-freq-next"
GOOSE = Path(sys.executable).with_name("goose")
BAD_ARGUMENTS = '''
import goose


class Misnamed:
    def __init__(self, config):
        pass

    @goose.hookimpl
    def goose_propose(self, ctx, acceptence):
        return None


@goose.hookimpl
def goose_register_sources(register):
    register("misnamed", Misnamed)
'''


def distribution(site: Path, name: str, module: str, entry: str) -> None:
    """A dist-info of ``name`` whose ``goose`` entry point ``entry`` loads ``module``."""
    info = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[goose]\n{entry} = {module}\n")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    distribution(site, "goose-freq-next", "goose_freq_next", "freq_next")
    distribution(site, "goose-misnamed", "goose_misnamed", "misnamed")
    (site / "goose_misnamed.py").write_text(BAD_ARGUMENTS)
    return site


def goose(site: Path, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(FREQ_NEXT)])}
    environment.pop("GOOSE_DATA", None)  # the prompts goose ships: nothing beside the checkout is read
    return subprocess.run([str(GOOSE), *args], capture_output=True, text=True, timeout=1500, cwd=cwd, env=environment)


def test_goose_plugins_lists_the_new_source_and_names_a_misspelt_argument(site: Path) -> None:
    listed = goose(site, "plugins", "--hooks")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("freq_next "))
    assert "goose-freq-next" in lines[row] and lines[row + 1].split() == ["hooks:", "reset(),", "propose(context)"]
    assert "misnamed" not in listed.stdout  # refused when it registered, not when a decoder first calls it
    refusal = next(line for line in listed.stderr.splitlines() if line.startswith("! source 'misnamed': "))
    assert all(part in refusal for part in ("hook 'goose_propose'", "'ctx'", "'acceptence'", "can not be found in the "
                                            "hookspec; goose_propose passes context, acceptance",
                                            "(from goose-misnamed: not registered)")), refusal
    refused = goose(site, "bench", "run", "--methods", "misnamed@chain")
    assert refused.returncode == 2 and "unknown source 'misnamed'" in refused.stderr


@pytest.mark.slow
def test_a_composed_method_of_the_new_source_runs_with_its_acceptance_everywhere(site: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    run = goose(site, "bench", "run", "--dtype", "float32", "--datasets", "humaneval,mbpp", "--limit", "1",
                "--max-new-tokens", "48", "--methods", "freq_next@chain,cm+freq_next@spine", "--budget", "8",
                "--cost-curve", "device", "--out", str(out), "--no-progress", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert not summary["unavailable"]
    every = {row["method"]: row for row in summary["results"] if row["dataset"] == "all"}
    for method in ("freq_next@chain", "cm+freq_next@spine"):
        row = every[method]
        assert row["identical_to_ar"] == 1.0  # float32: lossless
        assert row["source_tested"]["freq_next"] > 0 and row["source_accepted"]["freq_next"] > 0
        assert row["config"]["budget"] == 8 and "freq_next" in row["config"]["sources"]
        # float32: through the target's memo, so the figure is the priced one, from its passes and rows
        assert row["estimated_speedup"] is not None and 0 < row["passes"] <= row["rows"]
    assert every["cm+freq_next@spine"]["config"]["sources"] == ["context_match", "freq_next"]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["config"]["sources"] for r in records if r["method"] != "ar")
    assert any(r["source_accepted"].get("freq_next") for r in records)
    with (out / "summary.csv").open() as file:
        rows = list(csv.DictReader(file))
    chain = next(r for r in rows if r["method"] == "freq_next@chain" and r["dataset"] == "all")
    assert int(chain["tested:freq_next"]) == every["freq_next@chain"]["source_tested"]["freq_next"]
    report = (out / "report.md").read_text()
    assert "`freq_next`" in report and "an estimate, not a clock" in report and "target's memo" in report
    assert (out / "acceptance.png").stat().st_size > 0


def test_suites_are_generated_from_the_registry() -> None:
    three = [m.name for m in suite_methods("three-source", ["context_match", "bigram_transition", "lookahead"])]
    assert three == ["goose", *(f"{pair}@{shape}" for pair in ("cm+bt", "cm+la", "bt+la", "cm+bt+la")
                                for shape in ("spine", "multi_spine", "isotropic"))]
    assert all(m.config().budget == 16 for m in suite_methods("three-source", ["rest", "lookahead"])[1:])
    equal = suite_methods("three-source", ["rest", "lookahead"], overrides=Overrides(budget=32))
    assert {m.config().budget for m in equal[1:]} == {32}
    synergy = [m.name for m in suite_methods("synergy", ["context_match", "suffix_memory"])]
    assert synergy == ["goose", "pld", "sm@spine", "cm+sm@spine"]
    defaults = [m.name for m in suite_methods("ablation", disable=["rest", "lookahead", "suffix_memory"])]
    assert defaults == ["goose", "no_spine_branches", "unigram_adjacency", "no_consensus_bypass", "no_cm_spine",
                        "tr_spine_tokens", "cm@spine"]  # bt@spine is no_cm_spine
    sweep = suite_methods("sweep", ["context_match"])
    assert sweep[0].name == "goose" and all(m.config().sources == ["context_match"] for m in sweep[1:])
    with pytest.raises(ValueError, match="every source"):
        suite_methods("synergy", ["rest"], disable=["rest"])
    with pytest.raises(PluginError, match="unknown source 'nope'"):
        suite_methods("ablation", ["nope"])


class Quiet:
    """A source that drafts nothing (its registration is what these tests read)."""

    def __init__(self, config) -> None:
        pass


def test_the_suites_sources_and_their_order_are_the_registrys_word(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default sources are the built-ins that draft from the context alone, GooseConfig's default first, then
    registration order: facts of the config and the registry, never a source's name."""
    known = plugins.registry().sources
    assert known["prediction"].needs_request == "prediction"  # it drafts from the request's prediction alone
    alone = [name for name, r in known.items() if r.origin == plugins.BUILTIN_ORIGIN and not r.needs_request]
    assert builtin_sources() == [*default_sources(), *(n for n in alone if n not in default_sources())]
    assert builtin_sources()[:2] == ["context_match", "bigram_transition"] and "prediction" not in builtin_sources()
    # the same facts said of other sources: prediction drafting alone joins the suites, lookahead needing a request
    # leaves them
    monkeypatch.setitem(known, "prediction", replace(known["prediction"], needs_request=""))
    monkeypatch.setitem(known, "lookahead", replace(known["lookahead"], needs_request="prediction"))
    assert "prediction" in builtin_sources() and "lookahead" not in builtin_sources()
    three = {m.name for m in suite_methods("three-source")}
    assert "cm+bt+prediction@spine" in three and not any("la" in name.split("@")[0].split("+") for name in three)
    monkeypatch.undo()
    # a third-party source is ordered by the same rule: after the default sources, in registration order
    registrations = plugins.register(plugins.SourcePlugin("aaa_quiet", Quiet), "tests")
    try:
        assert study_order(["aaa_quiet", "lookahead", "bigram_transition", "context_match"]) == [
            "context_match", "bigram_transition", "lookahead", "aaa_quiet"]
    finally:
        plugins.unregister(registrations)
    with pytest.raises(PluginError, match="needs_request names a request input"):
        plugins.register(plugins.SourcePlugin("needy", Quiet, needs_request="tokens"), "tests")


def test_composed_names_overrides_and_study_files(tmp_path: Path) -> None:
    method = composed("cm+bt+sm@multi_spine", Overrides(budget=12, config={"max_depth": 4,
                      "source_options": {"context_match": {"max_continuation": 8}}}))
    config = method.config()
    assert (config.sources, config.topology, config.budget, config.max_depth) == (
        ["context_match", "bigram_transition", "suffix_memory"], "multi_spine", 12, 4)
    assert config.source_options == {"context_match": {"max_continuation": 8},
                                     "suffix_memory": {"search_current": False}}
    assert composed("bigram_transition").config().topology == "spine"  # no @: the default topology
    names = [m.name for m in resolve_methods(["goose", "pld", "cm@chain", "goose"])]
    assert names == ["ar", "goose", "pld", "cm@chain"]
    assert resolve_methods(["goose"], Overrides(budget=8))[1].config().budget == "auto"  # built-in names keep theirs
    for bad in ("cm+@spine", "cm@spine@chain", "cm@"):
        with pytest.raises(ValueError, match="SOURCES@TOPOLOGY"):
            resolve_methods([bad])
    study = tmp_path / "study.toml"
    study.write_text('[methods.deep_pld]\nsources = ["context_match"]\ntopology = "chain"\nmax_depth = 8\n'
                     'description = "PLD, deeper"\n[methods.wide]\nsources = ["bigram_transition"]\n'
                     'topology = "isotropic"\ntopology_options = { isotropic = { k = 5 } }\n')
    deep, wide = read_study_file(study, Overrides(budget=16))
    assert (deep.name, deep.description, deep.config().max_depth, deep.config().budget) == ("deep_pld", "PLD, deeper",
                                                                                             8, 16)
    assert wide.config().options_for("isotropic") == {"k": 5}
    study.write_text('[methods.typo]\nsources = ["context_match"]\nmax_dept = 8\n')
    with pytest.raises(ValueError, match=r"methods\.typo: config field max_dept"):
        read_study_file(study)
    study.write_text('[methods.goose]\nsources = ["context_match"]\n')
    with pytest.raises(ValueError, match="built-in method's name"):
        read_study_file(study)
