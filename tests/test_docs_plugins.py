"""Every command of docs/plugins.md's walkthrough ("Write a source, install it, study it") runs as written.

The page's console blocks are read here: each ``$ goose ...`` line runs through the real ``goose``
command in a fresh folder, with ``plugins/goose-freq-next`` installed the way ``pip install -e``
installs it (a dist-info naming its entry point, the plugin folder on the path). The study file is
the page's own TOML block. Each run must succeed and what it shows must hold: the new source is
listed with its hooks' arguments, decodes exactly what plain decoding does, drafted and was accepted
in every bench method that names it, and every generated method ran.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "plugins.md"
FREQ_NEXT = REPO / "plugins" / "goose-freq-next"
GOOSE = Path(sys.executable).with_name("goose")
INSTALL = "pip install -e plugins/goose-freq-next"


def walkthrough() -> str:
    text = PAGE.read_text()
    start = text.index("## Write a source, install it, study it")
    return text[start:text.index("\n## ", start + 1)]


def commands() -> list[str]:
    """The ``$ `` lines of the walkthrough's console blocks, in order."""
    blocks = re.findall(r"(`{3,})console\n(.*?)\1", walkthrough(), flags=re.S)
    return [line[2:] for _, block in blocks for line in block.splitlines() if line.startswith("$ ")]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the page's study file, and a site folder where the plugin is 'installed'."""
    folder = tmp_path_factory.mktemp("walkthrough")
    study = re.search(r"```toml\n# study\.toml\n(.*?)```", walkthrough(), flags=re.S)
    assert study, "the walkthrough shows its study.toml"
    (folder / "study.toml").write_text(study.group(1))
    info = folder / "site" / "goose_freq_next-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: goose-freq-next\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[goose]\nfreq_next = goose_freq_next\n")
    return folder


def run(command: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(workdir / "site"), str(FREQ_NEXT)])}
    environment.pop("GOOSE_DATA", None)  # the prompts goose ships
    words = shlex.split(command)
    assert words[0] == "goose", command
    done = subprocess.run([str(GOOSE), *words[1:]], capture_output=True, text=True, timeout=1500, cwd=workdir,
                          env=environment)
    assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    return done


def test_the_walkthrough_installs_the_plugin_first_and_runs_goose_only() -> None:
    lines = commands()
    assert lines[0] == INSTALL  # the one command the fixture stands in for
    assert all(line.startswith("goose ") for line in lines[1:])
    assert {"plugins", "generate", "bench"} <= {line.split()[1] for line in lines[1:]}


@pytest.mark.slow
def test_every_command_of_the_walkthrough_runs_and_shows_what_the_page_says(workdir: Path) -> None:
    for command in commands()[1:]:
        done = run(command, workdir)
        words = shlex.split(command)
        if words[1] == "plugins":
            assert re.search(r"^freq_next +source +available +goose-freq-next", done.stdout, flags=re.M)
            assert "hooks: reset(), propose(context)" in done.stdout
        elif words[1] == "generate":
            stats = done.stderr.splitlines()[-1]
            assert "identical" in stats and "DIFFERENT" not in stats and "freq_next" in stats
        else:
            out = workdir / words[words.index("--out") + 1]
            summary = json.loads((out / "summary.json").read_text())
            assert not summary["unavailable"], summary["unavailable"]
            rows = [row for row in summary["results"] if row["dataset"] == "all"]
            assert all(row["identical_to_ar"] == 1.0 for row in rows)  # float32: every method lossless
            drafting = [row for row in rows if "freq_next" in ((row["config"] or {}).get("sources") or ())]
            assert drafting and all(row["source_tested"]["freq_next"] > 0 for row in drafting)
            assert sum(row["source_accepted"]["freq_next"] for row in drafting) > 0
            with (out / "summary.csv").open() as file:
                assert "accepted:freq_next" in next(csv.reader(file))
            if "--cost-curve" in words:
                assert all(row["estimated_speedup"] is not None for row in rows)
            if "--methods-file" in words:
                assert {"freq_deep", "freq_beside_goose"} <= set(summary["methods"])
