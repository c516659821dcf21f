"""Rebuild bench/goose_bench/data/ (the benchmark prompts the project ships) from the upstream JSONL files.

Keeps the fields a prompt is made of (bench/goose_bench/prompts.py) and the ids; drops every reference
answer, solution and test, so nothing the bench or a source reads holds an answer:

    python scripts/bench_data.py /path/to/upstream/data     # the folder described in bench/goose_bench/data/README.md

It copies the license files beside them and prints each file's sha256 for the README.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "goose" / "bench" / "data"
KEEP: dict[str, tuple[str, ...]] = {
    "humaneval": ("task_id", "prompt", "entry_point"),
    "mbpp": ("task_id", "text", "test_list"),  # the first assert names the function and its signature
    "classeval": ("task_id", "class_name", "skeleton"),
    "gsm8k": ("question",),
    "mt_bench": ("question_id", "category", "turns"),
    "spec_bench": ("question_id", "category", "turns"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("upstream", type=Path, help="folder of the upstream JSONL files and their licenses/")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for name, fields in KEEP.items():
        source = args.upstream / f"{name}.jsonl"
        lines = []
        for line in source.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                lines.append(json.dumps({key: record[key] for key in fields if key in record}, ensure_ascii=False))
        target = OUT / f"{name}.jsonl"
        target.write_text("\n".join(lines) + "\n", encoding="utf-8")
        upstream_sha = hashlib.sha256(source.read_bytes()).hexdigest()
        print(f"{name}: {len(lines)} records, {target.stat().st_size} bytes, "
              f"sha256 {hashlib.sha256(target.read_bytes()).hexdigest()} (upstream {upstream_sha})")
    shutil.copytree(args.upstream / "licenses", OUT / "licenses", dirs_exist_ok=True)


if __name__ == "__main__":
    main()
