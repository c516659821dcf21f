"""The check that a distribution beside goose-decoding (goose-bench, goose-vllm) reaches Goose only through Goose's
public API: a name listed in the ``__all__`` of the goose module it is imported from, through a module path with no
private (``_``) part. Read from the source (ast), not by importing: every import counts, the lazy ones inside
functions too. bench/tests/test_public_api.py and integrations/vllm/tests/test_vllm_public_api.py run it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path


def private_uses(path: Path, root: Path) -> list[str]:
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


__all__ = ["private_uses"]
