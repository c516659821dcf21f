"""goose-bench reaches Goose only through Goose's public API: a name listed in the ``__all__`` of the goose module it
is imported from, through a module path with no private (``_``) part. Read from the source (ast), not by importing:
every import counts, the lazy ones inside functions too."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import goose_bench

PACKAGE = Path(goose_bench.__file__).resolve().parent


def _private_uses(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """``file:line: why`` (the file relative to ``root``) for every import in ``path`` of a goose name outside
    Goose's public API."""
    found = []
    where = f"{path.relative_to(root)}"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in imported:
            if module != "goose" and not module.startswith("goose."):
                continue
            if any(part.startswith("_") for part in module.split(".")):
                found.append(f"{where}:{node.lineno}: {module} is a private module")
                continue
            public = getattr(importlib.import_module(module), "__all__", None)
            if name is None:
                continue  # `import goose.x`: the module itself; what is read from it is not visible here
            if name.startswith("_"):
                found.append(f"{where}:{node.lineno}: {module}.{name} is private")
            elif _is_submodule(module, name):
                continue  # `from goose import models`: a public module (what is read from it is not visible here)
            elif public is None:
                found.append(f"{where}:{node.lineno}: {module} declares no __all__ ({name} imported)")
            elif name not in public:
                found.append(f"{where}:{node.lineno}: {name} is not in {module}.__all__")
    return found


def _is_submodule(package: str, name: str) -> bool:
    try:
        importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError:
        return False
    return True


def test_the_bench_imports_only_gooses_public_names() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20  # the whole bench is read, its peers too
    private = [use for path in files for use in _private_uses(path)]
    assert not private, "goose-bench imports outside Goose's public API:\n" + "\n".join(private)


def test_a_private_import_is_named_by_file_and_line(tmp_path: Path) -> None:
    """The check sees the imports it is meant to refuse (a check that finds nothing must be able to find something)."""
    probe = tmp_path / "goose_bench" / "probe.py"
    probe.parent.mkdir()
    probe.write_text("from goose.cli import _Default\nfrom goose.config import GooseConfig\n\n\n"
                     "def f():\n    from goose.cli import logger\n    import goose._x\n")
    assert _private_uses(probe, tmp_path) == ["goose_bench/probe.py:1: goose.cli._Default is private",
                                              "goose_bench/probe.py:6: logger is not in goose.cli.__all__",
                                              "goose_bench/probe.py:7: goose._x is a private module"]
