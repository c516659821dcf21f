"""The installed distribution carries every goose package (a wheel, not only the editable install), and
``goose bench``'s peers run from it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from setuptools.config.pyprojecttoml import read_configuration

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject() -> None:
    # setuptools' own reader (tomllib is Python 3.11+; the package supports 3.10)
    settings = read_configuration(ROOT / "pyproject.toml")["tool"]["setuptools"]
    listed = set(settings["packages"])
    folders = {".".join(("goose", *p.parent.relative_to(ROOT / "goose").parts)).rstrip(".")
               for p in (ROOT / "goose").rglob("__init__.py")}
    assert folders <= listed, f"packages missing from pyproject.toml: {sorted(folders - listed)}"
    for package, folder in settings["package-dir"].items():
        assert (ROOT / folder / "__init__.py").exists(), f"{package} -> {folder} has no __init__.py"


def test_python_dash_m_goose_has_every_command() -> None:
    shown = subprocess.run([sys.executable, "-m", "goose", "--help"], capture_output=True, text=True, check=True)
    for command in ("generate", "plugins", "calibrate", "bench", "datastore"):
        assert command in shown.stdout, f"`python -m goose` lacks {command}"


@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel setuptools builds from a copy of the project (a build writes build/ and *.egg-info where it
    runs), unpacked: what `pip install` puts in site-packages."""
    project = tmp_path_factory.mktemp("project")
    shutil.copy(ROOT / "pyproject.toml", project)
    shutil.copy(ROOT / "README.md", project)
    for folder in ("goose", "sources", "topologies"):
        shutil.copytree(ROOT / folder, project / folder, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                    "build_meta.build_wheel(sys.argv[1])", str(dist)], cwd=project, check=True, capture_output=True)
    (wheel,) = dist.glob("goose_decoding-*.whl")
    unpacked = tmp_path_factory.mktemp("site-packages")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    return unpacked


def test_the_wheel_holds_every_module_and_the_prompts(unpacked_wheel: Path) -> None:
    installed = {"goose": ROOT / "goose", "goose/sources": ROOT / "sources", "goose/topologies": ROOT / "topologies"}
    for target, folder in installed.items():
        for module in folder.rglob("*.py"):
            shipped = unpacked_wheel / target / module.relative_to(folder)
            assert shipped.is_file(), f"{module.relative_to(ROOT)} is not in the wheel"
    data = ROOT / "goose" / "bench" / "data"
    for prompts in [*data.glob("*.jsonl"), data / "README.md", *(data / "licenses").iterdir()]:
        assert (unpacked_wheel / prompts.relative_to(ROOT)).is_file(), f"{prompts.relative_to(ROOT)} is not shipped"


def test_an_installed_goose_runs_its_peers_runners_from_the_package(unpacked_wheel: Path, tmp_path: Path) -> None:
    """`goose bench --llama-python / --vllm-python` from a wheel: each peer's runner is the installed file,
    and it starts under a bare interpreter (no site-packages, so no goose): the peer's environment needs none
    for it to parse its arguments."""
    found = subprocess.run(
        [sys.executable, "-c", "import sys; from goose.bench.llama_peer import llama_peer; "
         "from goose.bench.vllm_peer import vllm_peer; "
         "print(llama_peer(sys.executable, ['smollm2-135m']).script); print(vllm_peer(sys.executable, None).script)"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(unpacked_wheel)}, capture_output=True, text=True,
        check=True)
    runners = [Path(line) for line in found.stdout.splitlines()]
    assert runners == [unpacked_wheel / "goose" / "bench" / "peers" / name
                       for name in ("llama_runner.py", "vllm_runner.py")]
    for runner in runners:
        shown = subprocess.run([sys.executable, "-I", "-S", str(runner), "--help"], cwd=tmp_path,
                               capture_output=True, text=True, check=True)
        assert "--out" in shown.stdout and "--methods" in shown.stdout
