"""goose-vllm reaches Goose only through Goose's public API (tests/public_api.py: a name in the ``__all__`` of the
goose module it is imported from, every import read from the source, the lazy ones too). Runs in the main
environment, where goose-vllm is installed beside goose (`make setup`); vLLM is not needed."""

from __future__ import annotations

from pathlib import Path

import goose_vllm
from tests.public_api import private_uses

PACKAGE = Path(goose_vllm.__file__).resolve().parent


def test_the_vllm_proposer_imports_only_gooses_public_names() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert {path.name for path in files} >= {"__init__.py", "proposer.py"}
    private = [use for path in files for use in private_uses(path, PACKAGE.parent)]
    assert not private, "goose-vllm imports outside Goose's public API:\n" + "\n".join(private)


def test_a_private_import_of_the_proposer_is_refused(tmp_path: Path) -> None:
    """What the proposer imports from Goose's internals would be named (goose.cycle.walker lists walk, not classify)."""
    probe = tmp_path / "goose_vllm" / "probe.py"
    probe.parent.mkdir()
    probe.write_text("from goose.cycle.walker import classify, walk\nfrom goose.boundary import logger\n")
    assert private_uses(probe, tmp_path) == ["goose_vllm/probe.py:1: classify is not in goose.cycle.walker.__all__",
                                             "goose_vllm/probe.py:2: logger is not in goose.boundary.__all__"]
