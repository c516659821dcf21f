"""goose-bench's wheel (not only the editable install) carries every module, the prompts with their licenses and
the shipped cost curves, and ``goose bench``'s peers run from it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1]  # bench/: goose-bench's pyproject.toml and goose_bench


@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel setuptools builds from a copy of bench/ (a build writes build/ and *.egg-info where it runs),
    unpacked: what `pip install` puts in site-packages."""
    project = tmp_path_factory.mktemp("bench")
    shutil.copy(BENCH / "pyproject.toml", project)
    shutil.copytree(BENCH / "goose_bench", project / "goose_bench", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                    "build_meta.build_wheel(sys.argv[1])", str(dist)], cwd=project, check=True, capture_output=True)
    (wheel,) = dist.glob("goose_bench-*.whl")
    unpacked = tmp_path_factory.mktemp("site-packages")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    return unpacked


def test_the_wheel_holds_every_module_the_prompts_and_the_curves(unpacked_wheel: Path) -> None:
    package = BENCH / "goose_bench"
    data = package / "data"
    shipped = [*package.rglob("*.py"), *data.glob("*.jsonl"), data / "README.md", *(data / "licenses").iterdir(),
               *(data / "curves").glob("*.json")]
    for path in shipped:
        assert (unpacked_wheel / path.relative_to(BENCH)).is_file(), f"{path.relative_to(BENCH)} is not shipped"


def test_the_wheel_registers_the_bench_command(unpacked_wheel: Path) -> None:
    """The `goose` entry-point group names goose_bench.cli: `goose bench` comes from there, as a plugin's would."""
    (entry_points,) = unpacked_wheel.glob("goose_bench-*.dist-info/entry_points.txt")
    assert "[goose]\nbench = goose_bench.cli" in entry_points.read_text()


def test_an_installed_goose_bench_runs_its_peers_runners_from_the_package(unpacked_wheel: Path,
                                                                          tmp_path: Path) -> None:
    """`goose bench llama / vllm` from a wheel: each peer's runner is the installed file, and it starts under a
    bare interpreter (no site-packages, so no goose): the peer's environment needs none for it to parse its
    arguments."""
    found = subprocess.run(
        [sys.executable, "-c", "import sys; from goose_bench.llama_peer import llama_peer; "
         "from goose_bench.vllm_peer import vllm_peer; "
         "print(llama_peer(sys.executable, ['smollm2-135m']).script); print(vllm_peer(sys.executable, None).script)"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(unpacked_wheel)}, capture_output=True, text=True,
        check=True)
    runners = [Path(line) for line in found.stdout.splitlines()]
    peers = unpacked_wheel / "goose_bench" / "peers"
    assert runners == [peers / "llama_runner.py", peers / "vllm_runner.py"]
    for runner in runners:
        shown = subprocess.run([sys.executable, "-I", "-S", str(runner), "--help"], cwd=tmp_path,
                               capture_output=True, text=True, check=True)
        assert "--out" in shown.stdout and "--methods" in shown.stdout


def test_python_dash_m_goose_lists_bench() -> None:
    shown = subprocess.run([sys.executable, "-m", "goose", "--help"], capture_output=True, text=True, check=True)
    assert "bench" in shown.stdout
