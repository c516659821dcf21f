"""The edit set: code-edit tasks built from the sources of installed packages, each with its prediction.

Editing a file is where a copy of the input is most of the answer, and where OpenAI's Predicted
Outputs send the original code as the ``prediction``. The set is built at run time, with no
network and nothing stored in the repository, from the installed sources of a fixed list of
packages (:data:`PACKAGES`: standard-library modules and this project's own dependencies; click,
rich, pluggy, jinja2 and fastapi are kept aside for an independent check, and Goose itself is never
used). Functions and methods of 20-120 lines are paired with one instruction each:

- ``docstring``: add a docstring (functions that have none);
- ``type_hints``: add type hints (functions with unannotated parameters or return);
- ``rename``: rename a named parameter to a named new name;
- ``comments``: add comments explaining the steps;
- ``fstrings``: convert %-formatting and ``str.format`` calls to f-strings (only functions using them);
- ``bugfix``: fix a named bug: one comparison operator of the shown code was flipped, and the
  instruction says on which line and what it should be.

The prompt shows the code (for ``bugfix``, the code with the bug) in a fenced block and asks for
the whole edited function; the ``prediction`` is exactly the code shown. The choice is seeded, so
one install always builds the same set; another version of a package builds another set (every
task records its package's version).

    python -m goose_bench.edit_set --list
    python -m goose_bench.edit_set --write edit.jsonl     # JSONL usable as goose bench run --datasets edit.jsonl
    goose bench run --datasets edit --limit 6
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata
import json
import random
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

# Standard-library modules first, then this project's dependencies. Never click, rich, pluggy,
# jinja2 or fastapi (kept aside for an independent check), never goose.
PACKAGES: tuple[str, ...] = ("argparse", "textwrap", "json", "email", "http", "logging", "numpy", "pydantic",
                             "packaging", "transformers", "tqdm")
EXCLUDED: frozenset[str] = frozenset({"click", "rich", "pluggy", "jinja2", "fastapi", "goose"})
KINDS: tuple[str, ...] = ("docstring", "type_hints", "rename", "comments", "fstrings", "bugfix")
MIN_LINES, MAX_LINES = 20, 120
FILES_PER_PACKAGE = 40  # a large package (transformers) is sampled, so building the set stays quick
SEED = 0

_FLIPS: dict[type[ast.cmpop], tuple[str, str]] = {  # operator -> (its text, the text it becomes)
    ast.LtE: ("<=", "<"), ast.GtE: (">=", ">"), ast.Lt: ("<", "<="), ast.Gt: (">", ">="),
    ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="),
}
_INSTRUCTIONS = {
    "docstring": "Add a docstring to this Python function that says what it does, its arguments and what it returns.",
    "type_hints": "Add type hints to every parameter and to the return value of this Python function.",
    "comments": "Add short comments to this Python function that explain its main steps.",
    "fstrings": "Convert every %-formatting and str.format() call in this Python function to an f-string.",
}


@dataclass(frozen=True)
class EditTask:
    """One code-edit task: the prompt, the code shown in it (the prediction), and where the code came from."""

    question_id: str  # "package:qualified.name"
    category: str  # the instruction kind
    prompt: str
    prediction: str
    package: str
    version: str
    lines: int


@dataclass(frozen=True)
class _Function:
    package: str
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    code: str  # dedented source of the function (decorators excluded)

    @property
    def lines(self) -> int:
        return self.code.count("\n") + 1


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:  # a standard-library module
        return f"python{sys.version_info.major}.{sys.version_info.minor}"


def _files(package: str) -> list[Path]:
    module = importlib.import_module(package)
    origin = Path(module.__file__ or "")
    if origin.name != "__init__.py":
        return [origin]
    files = sorted(p for p in origin.parent.rglob("*.py") if "tests" not in p.parts)
    step = max(1, len(files) // FILES_PER_PACKAGE)
    return files[::step][:FILES_PER_PACKAGE]


def _functions(package: str) -> list[_Function]:
    found = []
    for path in _files(package):
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = text.splitlines()
        scopes: list[tuple[str, list[ast.stmt]]] = [("", tree.body)]
        scopes += [(f"{node.name}.", node.body) for node in tree.body if isinstance(node, ast.ClassDef)]
        for prefix, body in scopes:
            for node in body:
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.end_lineno is None:
                    continue
                if MIN_LINES <= node.end_lineno - node.lineno + 1 <= MAX_LINES:
                    code = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
                    module = path.stem if path.stem != "__init__" else path.parent.name
                    found.append(_Function(package, f"{module}.{prefix}{node.name}", node, code))
    return found


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    arguments = node.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    return [a for a in every if a.arg not in ("self", "cls")]


def _uses_old_formatting(node: ast.AST) -> bool:
    for child in ast.walk(node):
        if (isinstance(child, ast.BinOp) and isinstance(child.op, ast.Mod) and isinstance(child.left, ast.Constant)
                and isinstance(child.left.value, str)):
            return True
        if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "format"
                and isinstance(child.func.value, ast.Constant) and isinstance(child.func.value.value, str)):
            return True
    return False


def _flip(function: _Function) -> tuple[str, int, str, str] | None:
    """(the code with one comparison flipped, its line in the code, the wrong text, the right text)."""
    tree = ast.parse(function.code)
    lines = function.code.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or type(node.ops[0]) not in _FLIPS:
            continue
        left, right = node.left, node.comparators[0]
        if left.end_lineno != right.lineno or left.end_col_offset is None:
            continue
        symbol, flipped = _FLIPS[type(node.ops[0])]
        line = lines[right.lineno - 1]
        between = line[left.end_col_offset : right.col_offset]
        if between.strip() != symbol:
            continue
        broken = line[: left.end_col_offset] + between.replace(symbol, flipped) + line[right.col_offset :]
        right_text, wrong_text = line.strip(), broken.strip()
        lines[right.lineno - 1] = broken
        return "\n".join(lines), right.lineno, wrong_text, right_text
    return None


def _task(function: _Function, kind: str) -> EditTask | None:
    """The task of ``kind`` on ``function``, or None when the function does not suit that kind."""
    node, code = function.node, function.code
    shown, instruction = code, _INSTRUCTIONS.get(kind)
    if kind == "docstring" and ast.get_docstring(node) is not None:
        return None
    if kind == "type_hints" and all(a.annotation is not None for a in _parameters(node)) and node.returns:
        return None
    if kind == "fstrings" and not _uses_old_formatting(node):
        return None
    if kind == "rename":
        names = [a.arg for a in _parameters(node) if len(a.arg) >= 3 and code.count(a.arg) >= 2]
        if not names:
            return None
        instruction = (f"Rename the parameter `{names[0]}` of this Python function to `{names[0]}_value`, "
                       "everywhere it is used.")
    if kind == "bugfix":
        flipped = _flip(function)
        if flipped is None:
            return None
        shown, line, wrong, right = flipped
        instruction = (f"This Python function has a bug on line {line}: `{wrong}` should be `{right}`. "
                       "Fix it.")
    prompt = f"{instruction}\n\n```python\n{shown}\n```\n\nReturn the whole edited function."
    return EditTask(f"{function.package}:{function.qualname}", kind, prompt, shown, function.package,
                    _version(function.package), shown.count("\n") + 1)


def build(count: int = 24, seed: int = SEED, packages: tuple[str, ...] = PACKAGES) -> list[EditTask]:
    """``count`` tasks, the kinds taking turns and each task from the next package in turn that has a fit."""
    unknown = EXCLUDED.intersection(packages)
    if unknown:
        raise ValueError(f"packages kept out of the edit set: {', '.join(sorted(unknown))}")
    generator = random.Random(seed)
    pools = {}
    for package in packages:
        functions = _functions(package)
        generator.shuffle(functions)
        pools[package] = functions
    tasks: list[EditTask] = []
    used: set[str] = set()
    turn = 0
    while len(tasks) < count and any(pools.values()):
        kind = KINDS[len(tasks) % len(KINDS)]
        for offset in range(len(packages)):
            package = packages[(turn + offset) % len(packages)]
            task = next((t for f in pools[package] if f.qualname not in used
                         and (t := _task(f, kind)) is not None), None)
            if task is not None:
                used.add(task.question_id.split(":", 1)[1])
                tasks.append(task)
                turn += offset + 1
                break
        else:  # no package has a function left for this kind
            break
    return tasks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=24)
    parser.add_argument("--list", action="store_true", help="print id, kind and lines of every task")
    parser.add_argument("--write", type=Path, default=None, help="write the tasks as JSONL")
    args = parser.parse_args(argv)
    tasks = build(args.count)
    if args.list or args.write is None:
        for task in tasks:
            print(f"{task.question_id:60s} {task.category:11s} {task.lines:4d} lines  ({task.package} {task.version})")
    if args.write is not None:
        args.write.write_text("".join(json.dumps(asdict(task)) + "\n" for task in tasks), encoding="utf-8")
        print(f"wrote {len(tasks)} tasks to {args.write}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
