"""Plot how a cross-request source's gain grows with what it has seen, from ``cost_model_ab.py`` logs.

``cost_model_ab.py`` keeps one decoder per method for all prompts, in order, dataset after
dataset, so the n-th prompt of a dataset is decoded after n - 1 earlier answers of the same
dataset. This script reads its per-prompt lines (``est. tok/s: name=value ...``) and plots, for
each log, the estimated speed of ``--with`` over ``--without`` by a prompt's position within its
dataset (mean over the datasets), plus the per-dataset points::

    .venv/bin/python scripts/memory_by_position.py docs/bench/round11/ab_smol_l10.txt \\
        docs/bench/round11/ab_gemma_l10.txt --labels SmolLM2,"Gemma 3" --out position.png

Prints the same numbers as a table.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

PROMPT_LINE = re.compile(r"^\s*(\d+)\s+(\S+)\s+\S+\s+est\. tok/s:(.*)$")
VALUE = re.compile(r"(\S+)=([\d.]+)")


def ratios_by_position(log: Path, with_method: str, without_method: str) -> dict[int, list[float]]:
    """Position within the dataset (1-based) -> the ratio of the two methods' est. tok/s, one per dataset."""
    positions: dict[int, list[float]] = {}
    seen: dict[str, int] = {}
    for line in log.read_text().splitlines():
        match = PROMPT_LINE.match(line)
        if match is None:
            continue
        dataset, values = match.group(2), dict(VALUE.findall(match.group(3)))
        if with_method not in values or without_method not in values:
            raise SystemExit(f"{log}: a prompt line lacks {with_method!r} or {without_method!r}: {line.strip()}")
        seen[dataset] = seen.get(dataset, 0) + 1
        ratio = float(values[with_method]) / float(values[without_method])
        positions.setdefault(seen[dataset], []).append(ratio)
    if not positions:
        raise SystemExit(f"{log}: no per-prompt lines of cost_model_ab.py found")
    return positions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=Path, nargs="+", help="cost_model_ab.py output files")
    parser.add_argument("--with", dest="with_method", default="cm+bt+sm@spine", help="the method with the source")
    parser.add_argument("--without", default="cm+bt@spine", help="the same method without it")
    parser.add_argument("--labels", default=None, help="comma-separated label per log (default: file names)")
    parser.add_argument("--out", type=Path, default=None, help="PNG to write (default: print only)")
    args = parser.parse_args()

    labels = args.labels.split(",") if args.labels else [log.stem for log in args.logs]
    if len(labels) != len(args.logs):
        raise SystemExit("--labels needs one label per log")
    curves = {label: ratios_by_position(log, args.with_method, args.without)
              for label, log in zip(labels, args.logs, strict=True)}

    print(f"est. speed of {args.with_method} over {args.without} by position within the dataset (mean)")
    for label, positions in curves.items():
        cells = "  ".join(f"{position}:{statistics.mean(values):.3f}" for position, values in sorted(positions.items()))
        print(f"{label:>10}  {cells}")

    if args.out is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for label, positions in curves.items():
        xs = sorted(positions)
        line = axes.plot(xs, [statistics.mean(positions[x]) for x in xs], marker="o", label=label)[0]
        for x in xs:
            axes.scatter([x] * len(positions[x]), positions[x], s=10, alpha=0.35, color=line.get_color())
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xlabel("prompt's position within its dataset (earlier answers of the dataset seen: position - 1)")
    axes.set_ylabel(f"est. speed, {args.with_method} / {args.without}")
    axes.set_title("What a cross-request memory gains as it sees more of a dataset")
    axes.legend()
    figure.tight_layout()
    figure.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
