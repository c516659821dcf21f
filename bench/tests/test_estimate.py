"""The cost curves goose-bench ships (goose_bench/data/curves): loaded by name, carried as package data."""

from __future__ import annotations

import pytest

from goose.planning import cost
from goose_bench import estimate


def test_a_shipped_curve_loads_by_name_and_an_unknown_name_lists_them() -> None:
    names = estimate.shipped_curves()
    assert "smollm2-135m-float32-epyc-avx512" in names
    curve = estimate.load_curve("smollm2-135m-float32-epyc-avx512")
    assert curve.sizes[0] == 1 and curve.meta is not None and curve.meta.note
    assert curve.meta.model.endswith("smollm2-135m") or "smollm2" in curve.meta.model.lower()
    assert curve.meta.dtype == "float32" and curve.meta.threads == 2 and "AVX-512" in curve.meta.cpu_features
    assert cost.busy_signs(curve) == []
    with pytest.raises(ValueError, match="smollm2-135m-float32-epyc-avx512"):
        estimate.load_curve("no-such-curve")


def test_the_shipped_curves_are_package_data() -> None:
    """A wheel carries them (bench/pyproject.toml's package-data): a study prices on them from a wheel too."""
    from fnmatch import fnmatch
    from pathlib import Path

    from setuptools.config.pyprojecttoml import read_configuration

    root = Path(__file__).resolve().parents[1]
    patterns = read_configuration(root / "pyproject.toml")["tool"]["setuptools"]["package-data"]["goose_bench"]
    shipped = [p.relative_to(root / "goose_bench").as_posix() for p in estimate.SHIPPED_CURVES.glob("*.json")]
    assert shipped and all(any(fnmatch(f, pattern) for pattern in patterns) for f in shipped)


def test_an_unknown_curve_name_is_refused() -> None:
    with pytest.raises(ValueError, match="no-such-curve is neither a file nor a shipped curve"):
        estimate.load_curve("no-such-curve")
