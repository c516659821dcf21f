"""The installed distribution carries every goose package (a wheel, not only the editable install). goose-bench's
wheel, its prompts and its peers' runners: bench/tests/test_wheel.py."""

from __future__ import annotations

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
    for command in ("generate", "plugins", "calibrate", "serve", "datastore"):
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


def test_the_wheel_holds_every_module(unpacked_wheel: Path) -> None:
    installed = {"goose": ROOT / "goose", "goose/sources": ROOT / "sources", "goose/topologies": ROOT / "topologies"}
    for target, folder in installed.items():
        for module in folder.rglob("*.py"):
            shipped = unpacked_wheel / target / module.relative_to(folder)
            assert shipped.is_file(), f"{module.relative_to(ROOT)} is not in the wheel"
