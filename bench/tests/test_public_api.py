"""goose-bench reaches Goose only through Goose's public API (tests/public_api.py: a name in the ``__all__`` of the
goose module it is imported from, every import read from the source, the lazy ones too)."""

from __future__ import annotations

import ast
from pathlib import Path

import goose_bench
from tests.public_api import private_uses  # the repository's checker: the one thing taken from Goose's tests

PACKAGE = Path(goose_bench.__file__).resolve().parent
TESTS = Path(__file__).resolve().parent


def test_the_bench_imports_only_gooses_public_names() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20  # the whole bench is read, its peers too
    private = [use for path in files for use in private_uses(path, PACKAGE.parent)]
    assert not private, "goose-bench imports outside Goose's public API:\n" + "\n".join(private)


def test_a_private_import_is_named_by_file_and_line(tmp_path: Path) -> None:
    """The check sees the imports it is meant to refuse (a check that finds nothing must be able to find something)."""
    probe = tmp_path / "goose_bench" / "probe.py"
    probe.parent.mkdir()
    probe.write_text("from goose.cli import _Default\nfrom goose.config import GooseConfig\n\n\n"
                     "def f():\n    from goose.cli import logger\n    import goose._x\n")
    assert private_uses(probe, tmp_path) == ["goose_bench/probe.py:1: goose.cli._Default is private",
                                              "goose_bench/probe.py:6: logger is not in goose.cli.__all__",
                                              "goose_bench/probe.py:7: goose._x is a private module"]


def _from_goose_tests(node: ast.AST) -> bool:
    """Whether ``node`` imports from Goose's own test package (``tests``), the public-API checker aside."""
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "tests" for alias in node.names)
    return (isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "tests"
            and node.module != "tests.public_api")


def test_the_bench_tests_stand_on_their_own() -> None:
    """goose-bench's tests reach Goose as goose-bench does, through its public names, and build their fixtures and
    helpers themselves (conftest.py, helpers.py): nothing from Goose's test package but the checker above."""
    files = sorted(TESTS.glob("*.py"))
    assert {"conftest.py", "helpers.py", "test_public_api.py"} <= {path.name for path in files}
    private = [use for path in files for use in private_uses(path, TESTS.parent)]
    assert not private, "goose-bench's tests import outside Goose's public API:\n" + "\n".join(private)
    borrowed = [f"{path.name}:{node.lineno}" for path in files
                for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if _from_goose_tests(node)]
    assert not borrowed, f"goose-bench's tests import from Goose's tests package: {', '.join(borrowed)}"
