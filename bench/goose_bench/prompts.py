"""Benchmark files -> samples: the prompt formats of the paper's evaluation, one per dataset.

Every sample is a list of user turns (one for most datasets, two for MT-Bench and the MT-Bench
part of Spec-Bench). Formatting is text-only; turning turns into token ids (chat template or
plain text) is :mod:`goose_bench.conversation`'s job, because it needs the tokenizer and, from
the second turn on, the model's own earlier answers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The five datasets of the paper's tables, in the paper's column order, and Spec-Bench.
PAPER_DATASETS: tuple[str, ...] = ("humaneval", "mbpp", "classeval", "gsm8k", "mt_bench")
# Where prompt lookup is strongest: Spec-Bench's long-context categories, and the edit set
# (goose_bench.edit_set: code edits of installed packages' functions, each with its prediction).
SPEC_BENCH_CATEGORIES: tuple[str, ...] = ("rag", "summarization")
COPY_DATASETS: tuple[str, ...] = ("edit", *SPEC_BENCH_CATEGORIES)
# Written for goose (bench/goose_bench/data/README.md), where structure-aware sources would be studied: numbered
# lists, tables, JSON, CSV and logs to continue, convert or reformat. Always found in the packaged copy.
GOOSE_DATASETS: tuple[str, ...] = ("structured",)
KNOWN_DATASETS: tuple[str, ...] = (*PAPER_DATASETS, "spec_bench", *COPY_DATASETS, *GOOSE_DATASETS)

# Display names for tables and plots.
DATASET_TITLES: dict[str, str] = {
    "humaneval": "HumanEval",
    "mbpp": "MBPP",
    "classeval": "ClassEval",
    "gsm8k": "GSM8K",
    "mt_bench": "MT-Bench",
    "spec_bench": "Spec-Bench",
    "edit": "Edits",
    "rag": "RAG",
    "summarization": "Summaries",
    "structured": "Structured",
}


@dataclass(frozen=True)
class Sample:
    """One benchmark question: its id, category and the user turns, already formatted."""

    dataset: str
    question_id: int | str
    turns: tuple[str, ...]
    category: str | None = None
    prediction: str | None = None  # the expected output's draft (the edit set: the code to edit)


class DatasetError(ValueError):
    """A dataset file is missing or a line cannot be read as a sample (one line, says where)."""


# the prompts the project ships (answers left out; licenses and provenance in its README.md)
PACKAGED_DATA = Path(__file__).resolve().parent / "data"


def default_data_dir() -> Path:
    """``$GOOSE_DATA``, else the prompts shipped with goose (``bench/goose_bench/data``)."""
    env = os.environ.get("GOOSE_DATA", "").strip()
    return Path(env).expanduser() if env else PACKAGED_DATA


def _humaneval(record: dict[str, Any]) -> list[str]:
    return ["Complete this Python function:\n" + record["prompt"]]


def _mbpp(record: dict[str, Any]) -> list[str]:
    # the task text and the first assert: the assert names the function and its signature
    return [record["text"] + "\n" + record["test_list"][0]]


def _classeval(record: dict[str, Any]) -> list[str]:
    return ["Complete this Python class:\n" + record["skeleton"]]


def _gsm8k(record: dict[str, Any]) -> list[str]:
    return [record["question"] + "\nLet's think step by step."]


def _turns(record: dict[str, Any]) -> list[str]:
    return list(record["turns"])


_FORMATS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "humaneval": _humaneval,
    "mbpp": _mbpp,
    "classeval": _classeval,
    "gsm8k": _gsm8k,
    "mt_bench": _turns,
    "spec_bench": _turns,
    "rag": _turns,
    "summarization": _turns,
    "structured": _turns,
}


def _custom(record: dict[str, Any]) -> list[str]:
    """A custom JSONL line: a ``prompt`` string, or a ``turns`` list of strings."""
    if isinstance(record.get("prompt"), str):
        return [record["prompt"]]
    turns = record.get("turns")
    if isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns):
        return list(turns)
    raise KeyError("needs a 'prompt' string or a non-empty 'turns' list of strings")


def _question_id(record: dict[str, Any], index: int) -> int | str:
    for key in ("question_id", "task_id", "id"):
        value = record.get(key)
        if isinstance(value, int | str) and not isinstance(value, bool):
            return value
    return index


def read_jsonl(path: Path, *, skip_broken: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, parsed object) of every non-blank line of a JSONL file: the bench's one reader, of prompt
    files and of ``results.jsonl``. A line that is not a JSON object is a DatasetError naming it, or, with
    ``skip_broken`` (a results file cut short by a stopped run), left out."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                if skip_broken:
                    continue
                raise DatasetError(f"{path}:{number}: not JSON ({error.msg})") from None
            if not isinstance(record, dict):
                if skip_broken:
                    continue
                raise DatasetError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
            yield number, record


def resolve_dataset(spec: str, data_dir: Path) -> tuple[str, Path, bool]:
    """(dataset name, file, is a known benchmark) for a ``--datasets`` entry: a name or a JSONL path."""
    if spec in KNOWN_DATASETS:
        path = data_dir / f"{'spec_bench' if spec in SPEC_BENCH_CATEGORIES else spec}.jsonl"
        if spec in GOOSE_DATASETS and not path.is_file():  # no upstream copy exists: the one goose ships
            path = PACKAGED_DATA / f"{spec}.jsonl"
        if not path.is_file():
            raise DatasetError(f"dataset {spec!r}: {path} not found (set --data-dir or GOOSE_DATA)")
        return spec, path, True
    path = Path(spec).expanduser()
    if path.is_file():
        return path.stem, path, False
    known = ", ".join(KNOWN_DATASETS)
    raise DatasetError(f"unknown dataset {spec!r}: use one of {known}, or the path of a JSONL file")


def load_samples(spec: str, data_dir: Path | None = None, limit: int | None = None) -> list[Sample]:
    """The first ``limit`` samples (all when None) of a known dataset or a custom JSONL file."""
    if spec == "edit":
        from goose_bench.edit_set import build

        return [Sample("edit", task.question_id, (task.prompt,), task.category, task.prediction)
                for task in build()][:limit]
    name, path, known = resolve_dataset(spec, data_dir or default_data_dir())
    formatter = _FORMATS[name] if known else _custom
    samples: list[Sample] = []
    for number, record in read_jsonl(path):
        if limit is not None and len(samples) >= limit:
            break
        if name in SPEC_BENCH_CATEGORIES and record.get("category") != name:
            continue
        try:
            turns = formatter(record)
        except (KeyError, IndexError, TypeError) as error:
            raise DatasetError(f"{path}:{number}: cannot format a {name} prompt ({error})") from None
        if not any(turn.strip() for turn in turns):
            raise DatasetError(f"{path}:{number}: empty prompt")
        category, prediction = record.get("category"), record.get("prediction")
        samples.append(Sample(dataset=name, question_id=_question_id(record, len(samples)), turns=tuple(turns),
                              category=category if isinstance(category, str) else None,
                              prediction=prediction if isinstance(prediction, str) else None))
    if not samples:
        raise DatasetError(f"{path}: no samples")
    return samples
