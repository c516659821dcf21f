"""Third-party plugins: a separately installed distribution adds a source through the ``goose`` entry points.

``plugins/goose-phrase-list`` is installed (editable, offline, no dependency resolution) into the
environment running the tests, then the real ``goose`` command is run in subprocesses, as a user
would: a process started after the install sees the new entry point, which is the point.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from goose import DecodeContext, Draft, GooseConfig

pytestmark = pytest.mark.xdist_group("entry_points")  # one worker: the test plugin is pip-installed once

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "plugins" / "goose-phrase-list"
DISTRIBUTION = "goose-phrase-list"
GOOSE = Path(sys.executable).with_name("goose")
THREADS = os.environ.get("GOOSE_TEST_THREADS", "2")


def _installed_here() -> bool:
    """Whether goose-phrase-list is installed in this environment, editable from this checkout."""
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return False
    direct_url = distribution.read_text("direct_url.json")
    return bool(direct_url) and json.loads(direct_url).get("url", "").rstrip("/").endswith(PLUGIN.as_posix())


@pytest.fixture(scope="module")
def phrase_list_installed() -> None:
    """Install the plugin once (a few seconds; skipped when this checkout's copy is already installed).

    --no-index and --no-deps keep pip off the network (goose-decoding is already here);
    --no-build-isolation builds with the setuptools of this environment.
    """
    if not _installed_here():
        if importlib.util.find_spec("setuptools") is None:
            pytest.fail("setuptools is needed to install plugins/goose-phrase-list offline: pip install setuptools")
        install = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-build-isolation",
             "--editable", str(PLUGIN)],
            capture_output=True, text=True, timeout=300,
        )
        if install.returncode != 0:
            pytest.fail(f"installing {PLUGIN} failed:\n{install.stderr[-2000:]}")
    importlib.invalidate_caches()
    assert _installed_here()


def goose_command(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GOOSE), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def import_plugin() -> ModuleType:
    """The plugin module, imported from the checkout (this process may predate the install's .pth file)."""
    if str(PLUGIN) not in sys.path:
        sys.path.insert(0, str(PLUGIN))
    import goose_phrase_list

    return goose_phrase_list


# --- the entry point, end to end ----------------------------------------------------------------


def test_goose_plugins_lists_the_third_party_source(phrase_list_installed: None) -> None:
    listed = goose_command("plugins", "--json", timeout=300)
    assert listed.returncode == 0, listed.stderr
    report = json.loads(listed.stdout)
    assert report["load_errors"] == []
    rows = {row["name"]: row for row in report["plugins"]}
    assert rows["phrase_list"]["kind"] == "source"
    assert rows["phrase_list"]["origin"] == DISTRIBUTION  # the distribution's name, not "built-in"
    assert rows["context_match"]["origin"] == "built-in"


@pytest.mark.slow
def test_goose_generate_with_the_plugin_is_lossless(phrase_list_installed: None) -> None:
    options = {"source_options": {"phrase_list": {"phrases": ["def merge_sorted_lists(list1, list2):",
                                                              "return merged_list"]}}}
    run = goose_command(
        "generate", "Write a Python function that merges two sorted lists.",
        "--sources", "context_match,phrase_list", "--max-new-tokens", "32", "--threads", THREADS,
        "--compare-ar", "--json", "--config", json.dumps(options),
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["identical_to_ar"] is True
    assert report["new_tokens"] == 32
    assert report["prefill_s"] > 0 and report["ar_prefill_s"] > 0  # both times to first token
    assert report["source_accepted"].get("phrase_list", 0) > 0  # the phrase was drafted and accepted


def test_a_broken_option_is_one_line_not_a_traceback(phrase_list_installed: None) -> None:
    run = goose_command("generate", "hi", "--sources", "phrase_list", "--max-new-tokens", "2",
                        "--config", json.dumps({"source_options": {"phrase_list": {"phrases": []}}}), timeout=600)
    assert run.returncode == 2
    assert "phrase_list: no phrases" in run.stderr and "Traceback" not in run.stderr


# --- the source's logic -------------------------------------------------------------------------


def context(tokens: list[int], tokenizer: object = None, vocab: int = 1000) -> DecodeContext:
    return DecodeContext(tokens=np.array(tokens, dtype=np.int64), prompt_length=1, vocab_size=vocab,
                         eos_token_ids=frozenset(), tokenizer=tokenizer)


def source(**options: object) -> Any:
    module = import_plugin()
    return module.PhraseListSource(GooseConfig(source_options={"phrase_list": options}))


def test_proposes_the_rest_once_two_tokens_match() -> None:
    phrases = source(phrases=[[10, 11, 12, 13, 14], [50, 51, 52]])
    assert phrases.goose_propose(context([1, 2, 10]), 0.6) is None  # one token is not enough (min_match 2)
    draft = phrases.goose_propose(context([1, 2, 10, 11]), 0.6)
    assert isinstance(draft, Draft) and draft.parents.tolist() == [-1, 0, 1]
    assert draft.tokens.tolist() == [12, 13, 14]
    assert draft.scores.tolist() == pytest.approx([0.6] * 3)
    assert phrases.goose_propose(context([7, 10, 11, 12, 13]), 0.6).tokens.tolist() == [14]
    assert phrases.goose_propose(context([10, 11, 12, 13, 14]), 0.6) is None  # the phrase is complete
    assert phrases.goose_propose(context([11, 12]), 0.6) is None  # the context must end with a phrase *prefix*


def test_phrases_sharing_a_start_become_a_trie() -> None:
    phrases = source(phrases=[[1, 2, 3, 4], [1, 2, 3, 5, 6], [1, 2, 7]], min_match=2)
    draft = phrases.goose_propose(context([9, 1, 2]), 0.6)
    assert sorted(zip(draft.parents.tolist(), draft.tokens.tolist(), strict=True)) == [
        (-1, 3), (-1, 7), (0, 4), (0, 5), (2, 6)]
    scores = dict(zip(draft.tokens.tolist(), draft.scores.tolist(), strict=True))
    assert scores[3] == pytest.approx(0.6 * 2 / 3) and scores[7] == pytest.approx(0.6 / 3)
    assert draft.validated(1000, 0.6).tokens.tolist() == draft.tokens.tolist()
    # the longest started prefix wins over shorter ones
    longer = source(phrases=[[2, 3, 4, 5], [1, 2, 3, 9]])
    assert longer.goose_propose(context([1, 2, 3]), 0.6).tokens.tolist() == [9]


def test_text_phrases_are_tokenized_lazily_with_the_models_tokenizer(smollm2) -> None:
    _, tokenizer = smollm2
    phrases = source(phrases=["def merge_sorted_lists(list1, list2):"])
    assert phrases.trie is None
    ids = tokenizer.encode("x = 1\ndef merge_sorted_lists(list1, list2):", add_special_tokens=False)
    split = ids.index(tokenizer.encode("def", add_special_tokens=False)[0]) + 2
    draft = phrases.goose_propose(context(ids[:split], tokenizer, vocab=len(tokenizer)), 0.6)
    assert draft is not None and draft.tokens.tolist() == ids[split:]
    with pytest.raises(ValueError, match="tokenizer"):
        source(phrases=["no tokenizer here"]).goose_propose(context([1, 2]), 0.6)


def test_phrase_file_and_bad_ids(tmp_path: Path) -> None:
    path = tmp_path / "phrases.txt"
    path.write_text("# comment\n\nfirst phrase\n")
    phrases = source(path=str(path))
    assert phrases.texts == ["first phrase"]
    with pytest.raises(FileNotFoundError, match="phrase file"):
        source(path=str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        source(phrases=[[1, 2, 5000]]).goose_propose(context([1, 2]), 0.6)


# --- commands: one registry, built-ins included ---------------------------------------------------------------------


def test_every_command_comes_through_the_registration_hook() -> None:
    """goose's own subcommands come from its own entry points (origin built-in), as a plugin's do from its
    distribution's; `goose bench` is goose-bench's, a distribution like any other."""
    from goose.plugins import BUILTIN_ORIGIN, registry

    origins = {name: command.origin for name, command in registry().commands.items()}
    assert {name: origins.get(name) for name in ("generate", "plugins", "calibrate", "serve", "datastore")} == \
        dict.fromkeys(("generate", "plugins", "calibrate", "serve", "datastore"), BUILTIN_ORIGIN)
    assert origins.get("bench") == "goose-bench"


def test_goose_cli_imports_no_command_module_of_its_own() -> None:
    """goose.cli reaches serve, datastore and bench through the registry only: no import (importlib's included)
    of goose.serve or goose_bench, which import goose.cli for its shared flags (that would be a cycle)."""
    import ast

    import goose.cli

    tree = ast.parse(Path(goose.cli.__file__).read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert not {name for name in imported | strings if name.startswith(("goose.serve", "goose_bench", "importlib"))}
    assert "importlib" not in imported


def test_a_command_registered_at_run_time_is_a_subcommand_like_the_built_ins(capsys) -> None:
    import goose
    from goose import cli

    class Hello:
        @goose.hookimpl
        def goose_register_commands(self, register) -> None:
            def add(parser) -> None:
                parser.add_argument("--name", default="world")
                parser.set_defaults(run=lambda args: print(f"hello {args.name}") or 0)

            register("hello", add, description="say hello")

    added = goose.register(Hello(), origin="tests")
    try:
        assert cli.main(["hello", "--name", "goose"]) == 0
        assert capsys.readouterr().out == "hello goose\n"
    finally:
        goose.unregister(added)
    with pytest.raises(SystemExit):
        cli.main(["hello"])
