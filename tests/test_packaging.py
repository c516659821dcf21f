"""The installed distribution carries every goose package (a wheel, not only the editable install)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
