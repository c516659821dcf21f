"""The edit set and the copy-heavy datasets: deterministic, real functions of installed packages, kinds as promised."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from goose_bench import edit_set
from goose_bench.edit_set import EXCLUDED, KINDS, MAX_LINES, MIN_LINES, PACKAGES, build, main
from goose_bench.prompts import PACKAGED_DATA, load_samples


@pytest.fixture(scope="module")
def tasks():
    return build()


@pytest.mark.slow  # builds the set a second time
def test_the_set_is_deterministic_and_spread(tasks):
    assert [t.question_id for t in build()] == [t.question_id for t in tasks]
    assert len(tasks) == 24 and len({t.question_id for t in tasks}) == 24
    assert {t.category for t in tasks} == set(KINDS)
    assert all(sum(t.category == kind for t in tasks) == 4 for kind in KINDS)
    assert len({t.package for t in tasks}) >= 8  # spread over the packages, not one package's functions
    assert not EXCLUDED.intersection(PACKAGES) and not {t.package for t in tasks} & EXCLUDED


def test_every_task_shows_a_real_function_as_its_prediction(tasks):
    for task in tasks:
        assert MIN_LINES <= task.lines <= MAX_LINES, task.question_id
        tree = ast.parse(task.prediction)  # the code shown parses on its own
        assert isinstance(tree.body[0], ast.FunctionDef | ast.AsyncFunctionDef)
        assert f"```python\n{task.prediction}\n```" in task.prompt
        assert task.version


def test_kinds_pick_functions_that_suit_them(tasks):
    for task in tasks:
        function = ast.parse(task.prediction).body[0]
        if task.category == "docstring":
            assert ast.get_docstring(function) is None
        if task.category == "fstrings":
            # a %-format of a string literal or a "...".format() call, not just a % sign somewhere
            assert edit_set._uses_old_formatting(function), task.question_id
        if task.category == "rename":
            old = re.search(r"parameter `(\w+)`", task.prompt).group(1)
            assert old in [a.arg for a in function.args.args + function.args.kwonlyargs]
            assert f"`{old}_value`" in task.prompt


def test_a_bugfix_shows_a_flipped_comparison_and_names_the_fix(tasks):
    for task in (t for t in tasks if t.category == "bugfix"):
        line, wrong, right = re.search(r"bug on line (\d+): `(.+)` should be `(.+)`\. Fix it", task.prompt).groups()
        shown = task.prediction.splitlines()[int(line) - 1]
        assert shown.strip() == wrong and wrong != right
        # the mutation changed the code, and the fix restores a line of the package's own source
        assert task.prediction.replace(wrong, right, 1) != task.prediction
        ast.parse(task.prediction.replace(wrong, right, 1))  # SyntaxError unless the fixed code parses
        sources = "".join(path.read_text(encoding="utf-8") for path in edit_set._files(task.package))
        assert right in sources and wrong not in sources, task.question_id


def test_rag_and_summarization_are_spec_bench_categories():
    for name in ("rag", "summarization"):
        samples = load_samples(name, PACKAGED_DATA)
        assert len(samples) == 80 and {s.category for s in samples} == {name} and {s.dataset for s in samples} == {name}
        assert all(s.prediction is None for s in samples)


@pytest.mark.slow  # builds the set twice more
def test_the_written_set_loads_back_with_its_predictions(tmp_path: Path, tasks):
    path = tmp_path / "edit.jsonl"
    assert main(["--write", str(path)]) == 0
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["question_id"] for line in lines] == [t.question_id for t in tasks]
    samples = load_samples(str(path))
    assert [s.prediction for s in samples] == [t.prediction for t in tasks]
    edits = load_samples("edit")  # each load builds the set again: two loads, not more, to keep the test short
    assert load_samples("edit", limit=3) == edits[:3]
    assert edits[0].turns == (tasks[0].prompt,) and edits[0].prediction == tasks[0].prediction


def test_excluded_packages_are_refused():
    with pytest.raises(ValueError, match="click"):
        build(packages=("json", "click"))
