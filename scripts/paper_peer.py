"""tau of the paper's own decoder beside ours, on the same input ids: the reproducible form of that comparison.

The paper's authors published their implementation (https://github.com/2kinto/GOOSE_Speculative_Decoding,
MIT; measured at commit c5c8bb3). Nothing of it is copied here: this script imports it from the checkout
``--official-root`` names, in a process of its own, because its package is also called ``goose``::

    git clone https://github.com/2kinto/GOOSE_Speculative_Decoding /tmp/official
    .venv/bin/python scripts/paper_peer.py --official-root /tmp/official --model smollm2-135m \\
        --datasets humaneval,mbpp,classeval,gsm8k,mt_bench --limit 4 --max-new-tokens 128 --out bench-results/paper-peer

What it measures, per prompt and per side: tokens per second (prefill included) and tau, the
tokens committed per verify pass, as ``(len(output) - 1) / (passes - 1)``: the token the prefill
gives and the prefill pass itself are left out on both sides (their own
``stats.compression_ratio`` counts both; it is kept as ``native_tau``). Each side also decodes
the prompt autoregressively (theirs ``decode_autoregressive``, ours
:class:`goose.cycle.decoder.AutoregressiveDecoder`), so every output is checked against its own
reference; in float32 both decoders are lossless and every output is that reference.

How:

1. The first turn of the first ``--limit`` prompts of each dataset is encoded exactly as
   ``goose bench`` encodes it (:func:`goose.bench.prompts.load_samples`, then
   :func:`goose.bench.conversation.turn_prompt_ids` with the chat template) and written to
   ``OUT/inputs.jsonl``; both sides decode these ids, from the same model folder
   (:func:`goose.models.pretrained_location`), loaded the same way (transformers, ``sdpa``).
2. Each side runs in a subprocess of this interpreter, this script again with a hidden
   ``--_side``: the official one with ``PYTHONPATH=<official-root>`` first, so that ``import goose``
   is theirs (checked), at their ``GooseConfig(node_budget=--budget)``; ours in the normal
   environment at ``GooseConfig(budget=--budget, **--config)``, a fresh decoder per prompt (cold
   sources, as ``goose bench`` runs it). One warm-up generation first on each side. Each writes
   ``OUT/<side>.jsonl``, a line per prompt.
3. ``OUT/table.md`` (per prompt: both taus, ours over theirs, the outputs against their references
   and each other) and ``OUT/summary.json`` (mean tau of each side, the ratio of the means, the
   prompts where each side is ahead, the identical-output counts); the table is printed.

Their code as published calls ``DynamicCache.crop`` with an absolute length, which transformers 5.x
refuses (it now takes minus the number of positions to remove). Their files are not edited: in the
official side's process, if their ``goose.runtime.crop_cache`` fails on a probe cache, the function is
replaced in their modules by one that crops the same positions the 5.x way, and the rows say so.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from statistics import mean
from types import ModuleType
from typing import Any

PAPER_REPOSITORY = "https://github.com/2kinto/GOOSE_Speculative_Decoding"
SIDES: tuple[str, ...] = ("official", "ours")
DEFAULT_OUT = "bench-results/paper-peer"
INPUTS_FILE = "inputs.jsonl"
WARMUP_PROMPT_TOKENS = 32  # the warm-up generation: the first prompt's first tokens, a few new ones
WARMUP_NEW_TOKENS = 8
STDERR_LINES_SHOWN = 15


class UsageError(Exception):
    """A flag or input that cannot work: one line on stderr, exit status 2."""


class SideFailed(Exception):
    """A side's subprocess failed: the message names the command and its last stderr lines."""


# --- flags -------------------------------------------------------------------------------------------


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--official-root", default=None,
                        help=f"a checkout of {PAPER_REPOSITORY} (its goose/ package); needed for the official side")
    parser.add_argument("--model", default="smollm2-135m", help="an embedded model, a folder or a Hugging Face id")
    parser.add_argument("--datasets", default=None,
                        help="comma-separated (default: the paper's five, humaneval,mbpp,classeval,gsm8k,mt_bench)")
    parser.add_argument("--limit", type=int, default=2, help="the first N prompts of each dataset")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each side's process")
    parser.add_argument("--budget", type=int, default=60,
                        help="the node budget: theirs GooseConfig(node_budget=B), ours GooseConfig(budget=B)")
    parser.add_argument("--config", default=None,
                        help="JSON object of further fields of OUR GooseConfig (a 'budget' here overrides --budget "
                             "on our side only)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default ./{DEFAULT_OUT})")
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated, from official,ours")
    parser.add_argument("--_side", dest="side", choices=SIDES, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.sides = [s for s in args.sides.split(",") if s]
    unknown = sorted(set(args.sides) - set(SIDES))
    if unknown or not args.sides:
        parser.error(f"--sides: unknown {unknown}; choose from {', '.join(SIDES)}")
    for flag in ("limit", "max_new_tokens", "threads", "budget"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    args.config = parse_config(args.config)
    return args


def parse_config(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"--config is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise UsageError("--config must be a JSON object of GooseConfig fields")
    return value


def check_official_root(root: str | None) -> Path:
    """The checkout's absolute path, or a UsageError saying what is expected."""
    expected = f"a checkout of {PAPER_REPOSITORY} (the folder holding goose/decoding.py)"
    if root is None:
        raise UsageError(f"the official side needs --official-root: {expected}")
    path = Path(root).expanduser()
    if not path.exists():
        raise UsageError(f"--official-root {root}: no such folder; expected {expected}")
    if not path.is_dir():
        raise UsageError(f"--official-root {root}: not a folder; expected {expected}")
    if not (path / "goose" / "decoding.py").is_file():
        raise UsageError(f"--official-root {root}: no goose/decoding.py in it; expected {expected}")
    return path.resolve()


# --- the parent: inputs, the two sides, the table ---------------------------------------------------------


def encode_inputs(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Turn 1 of the first ``--limit`` prompts per dataset, encoded as ``goose bench`` encodes them."""
    from transformers import AutoTokenizer

    from goose.bench.conversation import turn_prompt_ids
    from goose.bench.prompts import PAPER_DATASETS, DatasetError, default_data_dir, load_samples
    from goose.models import ModelLoadError, pretrained_location

    datasets = [d for d in (args.datasets or ",".join(PAPER_DATASETS)).split(",") if d]
    try:
        samples = [(dataset, index, sample) for dataset in datasets
                   for index, sample in enumerate(load_samples(dataset, default_data_dir(), args.limit))]
    except DatasetError as error:
        raise UsageError(str(error)) from None
    try:
        folder = pretrained_location(args.model)
    except ModelLoadError as error:
        raise UsageError(f"--model {args.model}: {error}") from None
    tokenizer = AutoTokenizer.from_pretrained(folder)  # the tokenizer goose.models.load gives for this folder
    records = []
    for dataset, index, sample in samples:
        # turn 1 only: MT-Bench's second turn is built from each method's own first answer
        ids = turn_prompt_ids(tokenizer, sample.turns[:1], [], chat=True)
        records.append({"id": f"{dataset}/{index}", "dataset": dataset, "index": index,
                        "question_id": sample.question_id, "model": args.model, "folder": folder,
                        "n_prompt": len(ids), "input_ids": ids})
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / INPUTS_FILE, records)
    return records


def side_command(side: str, args: argparse.Namespace, out: Path) -> tuple[list[str], dict[str, str]]:
    """This script again, as ``side``, and its environment (the official checkout first on the path)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--_side", side, "--out", str(out),
               "--max-new-tokens", str(args.max_new_tokens), "--dtype", args.dtype, "--threads", str(args.threads),
               "--budget", str(args.budget), "--config", json.dumps(args.config)]
    env = dict(os.environ)
    if side == "official":
        command += ["--official-root", str(args.official_root)]
        env["PYTHONPATH"] = os.pathsep.join([str(args.official_root), *filter(None, [env.get("PYTHONPATH")])])
    return command, env


def run_side(side: str, args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Run one side's subprocess, echo its stderr (progress) as it comes, read back its rows."""
    command, env = side_command(side, args, out)
    shown = shlex.join(command)
    if side == "official":
        shown = f"PYTHONPATH={shlex.quote(env['PYTHONPATH'])} {shown}"
    print(f"[{side}] {shown}", file=sys.stderr, flush=True)
    tail: deque[str] = deque(maxlen=STDERR_LINES_SHOWN)
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace") as process:
        assert process.stdout is not None
        for line in process.stdout:  # the side writes its progress (and any warning) on stderr
            sys.stderr.write(line)
            sys.stderr.flush()
            tail.append(line.rstrip("\n"))
    if process.returncode != 0:
        raise SideFailed(f"the {side} side failed (exit status {process.returncode}): {shown}\n"
                         f"its last stderr lines:\n" + "\n".join(tail))
    return read_jsonl(out / f"{side}.jsonl")


def _tau_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _flag(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def _ratio_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def _speed_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def tokens_per_s(row: dict[str, Any] | None) -> float | None:
    """A side's decoding speed on one prompt, prefill included (its wall time is the whole ``decode``)."""
    return round(row["new_tokens"] / row["wall_s"], 4) if row and row["wall_s"] > 0 else None


def compare(inputs: list[dict[str, Any]], rows: dict[str, list[dict[str, Any]]],
            settings: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The per-prompt table (markdown) and the summary.

    Per prompt: each side's tau, ours over theirs, each output against its own autoregressive
    reference, and the two outputs against each other (compare.py's semantics). The means, the
    ahead counts and the identical counts are over the prompts where every side that ran has a tau
    (an output the prefill's token ended has none).
    """
    official = {row["id"]: row for row in rows.get("official", [])}
    ours = {row["id"]: row for row in rows.get("ours", [])}
    both = "official" in rows and "ours" in rows
    taus: dict[str, list[float]] = {side: [] for side in rows}
    speed_ratios: list[float] = []
    over_own_ar: dict[str, list[float]] = {side: [] for side in rows}
    ahead = {"ours": 0, "official": 0, "level": 0}
    identical = {"official_to_ar": 0, "ours_to_ar": 0, "official_to_ours": 0, "ar_to_ar": 0}
    prompts = []
    for record in inputs:
        theirs, mine = official.get(record["id"]), ours.get(record["id"])
        their_tau = theirs["tau"] if theirs else None
        my_tau = mine["tau"] if mine else None
        their_speed, my_speed = tokens_per_s(theirs), tokens_per_s(mine)
        prompt = {
            "id": record["id"], "n_prompt": record["n_prompt"], "official_tau": their_tau, "ours_tau": my_tau,
            "ratio": round(my_tau / their_tau, 4) if my_tau is not None and their_tau else None,
            "tokens_per_s": [their_speed, my_speed],
            "speed_ratio": round(my_speed / their_speed, 4) if my_speed and their_speed else None,
            "official_identical_to_ar": theirs["identical_to_ar"] if theirs else None,
            "ours_identical_to_ar": mine["identical_to_ar"] if mine else None,
            "official_identical_to_ours": theirs["new_token_ids"] == mine["new_token_ids"] if theirs and mine else None,
            "ar_identical_to_ar": theirs["ar_new_token_ids"] == mine["ar_new_token_ids"] if theirs and mine else None,
            "new_tokens": [theirs["new_tokens"] if theirs else None, mine["new_tokens"] if mine else None],
            "passes": [theirs["passes"] if theirs else None, mine["passes"] if mine else None],
        }
        prompts.append(prompt)
        present = [row for side, row in (("official", theirs), ("ours", mine)) if side in rows]
        if any(row is None or row["tau"] is None for row in present):
            continue
        prompt["compared"] = True
        for row in present:
            taus[row["side"]].append(row["tau"])
            if row["wall_s"] > 0:
                over_own_ar[row["side"]].append(row["ar_wall_s"] / row["wall_s"])
        if prompt["speed_ratio"] is not None:
            speed_ratios.append(prompt["speed_ratio"])
        for key in identical:
            identical[key] += bool(prompt[key.replace("_to_", "_identical_to_")])
        if both:
            ahead["ours" if my_tau > their_tau else "official" if their_tau > my_tau else "level"] += 1
    compared = sum(1 for prompt in prompts if prompt.get("compared"))
    means = {side: round(mean(taus[side]), 4) if taus.get(side) else None for side in SIDES}
    ratio_of_means = (round(means["ours"] / means["official"], 4)
                      if both and means["ours"] is not None and means["official"] else None)
    kept = [key for key in identical if both or key == f"{next(iter(rows))}_to_ar"]
    summary: dict[str, Any] = {
        **settings,
        "prompts": len(inputs),
        "compared": compared,
        "mean_tau": means,
        "ratio_of_means": ratio_of_means,
        "ahead": ahead if both else None,
        "identical": {key: identical[key] for key in kept},
        "wall_s": {side: round(sum(row["wall_s"] for row in side_rows), 3) for side, side_rows in rows.items()},
        # tokens per second: ours over theirs per prompt, and each side over its own autoregressive loop
        "speed_ratio_mean": round(mean(speed_ratios), 4) if speed_ratios else None,
        "over_own_ar_mean": {side: round(mean(values), 4) if values else None for side, values in over_own_ar.items()},
        "crop_cache_replaced": (any(row.get("crop_cache_replaced") for row in rows["official"])
                                if "official" in rows else None),
        "per_prompt": prompts,
    }

    def count(key: str) -> str:
        return f"{identical[key]}/{compared}" if key in kept else "-"

    lines = ["| prompt | prompt tokens | new tokens (official / ours) | passes (official / ours) | official tau "
             "| ours tau | ours / official | official tok/s | ours tok/s | ours / official tok/s "
             "| official = its AR | ours = its AR | official = ours |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:-:|:-:|:-:|"]
    for prompt in prompts:
        tokens = " / ".join("-" if n is None else str(n) for n in prompt["new_tokens"])
        passes = " / ".join("-" if n is None else str(n) for n in prompt["passes"])
        their_speed, my_speed = prompt["tokens_per_s"]
        lines.append(f"| {prompt['id']} | {prompt['n_prompt']} | {tokens} | {passes} | "
                     f"{_tau_cell(prompt['official_tau'])} | {_tau_cell(prompt['ours_tau'])} | "
                     f"{_ratio_cell(prompt['ratio'])} | {_speed_cell(their_speed)} | {_speed_cell(my_speed)} | "
                     f"{_ratio_cell(prompt['speed_ratio'])} | {_flag(prompt['official_identical_to_ar'])} | "
                     f"{_flag(prompt['ours_identical_to_ar'])} | {_flag(prompt['official_identical_to_ours'])} |")
    lines.append(f"| **mean** ({compared} prompt(s)) |  |  |  | {_tau_cell(means['official'])} | "
                 f"{_tau_cell(means['ours'])} | {_ratio_cell(ratio_of_means)} |  |  | "
                 f"{_ratio_cell(summary['speed_ratio_mean'])} | {count('official_to_ar')} | "
                 f"{count('ours_to_ar')} | {count('official_to_ours')} |")
    configs = []
    if "official" in rows:
        configs.append(f"theirs `GooseConfig(node_budget={settings['budget']})` from `{settings['official_root']}`"
                       + (" (its `crop_cache` replaced in the process for transformers 5.x)"
                          if summary["crop_cache_replaced"] else ""))
    if "ours" in rows:
        configs.append(f"ours `GooseConfig(**{json.dumps(settings['ours_config'])})`")
    head = [
        "# tau: the paper's own decoder beside ours",
        "",
        f"{settings['model']} ({settings['dtype']}, {settings['threads']} thread(s)), {settings['max_new_tokens']} "
        f"new tokens, the first turn of {len(inputs)} prompt(s); {', '.join(configs)}. "
        "tau = (new tokens - 1) / (passes - 1): the prefill's token and pass left out on both sides.",
        "",
    ]
    if both and compared:
        head += [f"Ours ahead on {ahead['ours']}, theirs on {ahead['official']}, level on {ahead['level']}; "
                 f"ours over theirs, the ratio of the mean taus: {ratio_of_means:.3f}x; in tokens per second "
                 f"(prefill included), the mean of the per-prompt ratios: {_ratio_cell(summary['speed_ratio_mean'])}; "
                 f"each side over its own autoregressive loop: theirs "
                 f"{_ratio_cell(summary['over_own_ar_mean'].get('official'))}, ours "
                 f"{_ratio_cell(summary['over_own_ar_mean'].get('ours'))}; the two autoregressive references "
                 f"identical on {identical['ar_to_ar']}/{compared}.", ""]
    return "\n".join(head + lines) + "\n", summary


def run_parent(args: argparse.Namespace) -> int:
    if "official" in args.sides:
        args.official_root = check_official_root(args.official_root)
    try:
        from goose.config import GooseConfig
    except ImportError:
        raise UsageError("our goose package does not import here: run with Goose's environment (.venv/bin/python), "
                         "without the official checkout on PYTHONPATH") from None
    try:
        ours_config = GooseConfig(**{"budget": args.budget, **args.config})
    except (TypeError, ValueError) as error:
        raise UsageError(f"--config: not fields of our GooseConfig: {' '.join(str(error).split())}") from None
    out = Path(args.out)
    inputs = encode_inputs(args, out)
    print(f"{len(inputs)} prompts encoded to {out / INPUTS_FILE}", file=sys.stderr, flush=True)
    rows: dict[str, list[dict[str, Any]]] = {}
    for side in args.sides:
        (out / f"{side}.jsonl").unlink(missing_ok=True)  # a row read back is always this run's
        rows[side] = run_side(side, args, out)
    settings = {
        "model": args.model, "folder": inputs[0]["folder"] if inputs else None, "dtype": args.dtype,
        "threads": args.threads, "max_new_tokens": args.max_new_tokens, "budget": args.budget,
        "datasets": list(dict.fromkeys(record["dataset"] for record in inputs)),
        "limit": args.limit, "sides": args.sides,
        "ours_config": {"budget": args.budget, **args.config},
        "ours_config_resolved": json.loads(ours_config.model_dump_json()),
        "official_root": str(args.official_root) if "official" in args.sides else None,
        "official_version": rows["official"][0].get("version") if rows.get("official") else None,
    }
    table, summary = compare(inputs, rows, settings)
    (out / "table.md").write_text(table, encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(table)
    print(f"written: {out / 'table.md'}, {out / 'summary.json'}", file=sys.stderr)
    return 0


# --- the sides: each in its own process ---------------------------------------------------------------------


class SideError(Exception):
    """The side cannot run: one line on stderr, exit status 2 (the parent shows it with the command)."""


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_model(folder: str, dtype: str) -> tuple[Any, Any]:
    """The model and tokenizer of ``folder``, loaded the same way on both sides (as goose.models loads a folder)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer


def tau(new_tokens: int, passes: int) -> float | None:
    """Tokens per verify pass, the prefill's token and pass left out; None for an output the prefill ended."""
    return round((new_tokens - 1) / (passes - 1), 4) if passes > 1 else None


def side_row(side: str, record: dict[str, Any], new: list[int], ar_new: list[int], passes: int, wall_s: float,
             ar_wall_s: float, native_tau: float, **extra: Any) -> dict[str, Any]:
    return {"id": record["id"], "dataset": record["dataset"], "index": record["index"],
            "question_id": record["question_id"], "side": side, "n_prompt": record["n_prompt"],
            "new_token_ids": new, "new_tokens": len(new), "ar_new_token_ids": ar_new,
            "identical_to_ar": new == ar_new, "passes": passes, "tau": tau(len(new), passes),
            "native_tau": round(native_tau, 4), "wall_s": round(wall_s, 4), "ar_wall_s": round(ar_wall_s, 4),
            **extra}


def progress(side: str, done: int, total: int, row: dict[str, Any]) -> None:
    print(f"[{side}] {done}/{total} {row['id']}: {row['new_tokens']} tokens, {row['passes']} passes, "
          f"tau {_tau_cell(row['tau'])}, {'= AR' if row['identical_to_ar'] else 'DIFFERS FROM AR'}, "
          f"{row['wall_s']:.2f} s (AR {row['ar_wall_s']:.2f} s)", file=sys.stderr, flush=True)


def _crop_cache_5x(past_key_values: Any, length: int) -> Any:
    """Their ``crop_cache`` for transformers 5.x: keep the first ``length`` positions.

    Their code calls ``past_key_values.crop(length)`` (an absolute length, the 4.x meaning); 5.x's
    ``DynamicCache.crop`` takes minus the number of positions to remove and raises on a positive
    argument. Negative counts work on 4.x too.
    """
    if past_key_values is not None:
        remove = past_key_values.get_seq_length() - length
        if remove > 0:
            past_key_values.crop(-remove)
    return past_key_values


def fix_crop_cache(*modules: ModuleType) -> bool:
    """Replace their ``crop_cache`` in ``modules`` (the first defines it, the others imported it by name) when it
    fails on a three-position probe cache cropped to one; whether it was replaced. Their files stay as they are."""
    import torch
    from transformers import DynamicCache

    probe = DynamicCache()
    probe.update(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2), 0)
    try:
        works = modules[0].crop_cache(probe, 1).get_seq_length() == 1
    except Exception:  # transformers 5.x: ValueError on a positive argument
        works = False
    if works:
        return False
    for module in modules:
        if hasattr(module, "crop_cache"):
            module.crop_cache = _crop_cache_5x
    return True


def warm_up_ids(records: list[dict[str, Any]]) -> list[int]:
    return records[0]["input_ids"][:WARMUP_PROMPT_TOKENS]


def official_side(args: argparse.Namespace, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Their ``decode`` and ``decode_autoregressive`` on every record, in this process (their package first)."""
    root = Path(args.official_root).resolve()
    try:
        import goose
    except Exception as error:  # their package's own imports failed
        raise SideError(f"`import goose` from {root} failed ({type(error).__name__}: {error}): expected a checkout "
                        f"of {PAPER_REPOSITORY}") from None
    where = getattr(goose, "__file__", None)
    if where is None or root not in Path(where).resolve().parents:
        raise SideError(f"`import goose` resolves to {where or 'a namespace package'}, not the package under {root}: "
                        f"expected a checkout of {PAPER_REPOSITORY}")
    try:
        import goose.decoding as decoding
        import goose.runtime as runtime
        from goose import GooseConfig, decode, decode_autoregressive
    except ImportError as error:
        raise SideError(f"{root}'s goose package is not the paper's code ({error}): expected a checkout of "
                        f"{PAPER_REPOSITORY}") from None
    import torch

    replaced = fix_crop_cache(runtime, decoding)
    if replaced:
        print("[official] goose.runtime.crop_cache fails under this transformers (DynamicCache.crop takes minus a "
              "count now): replaced in this process", file=sys.stderr, flush=True)
    config = GooseConfig(node_budget=args.budget)
    model, tokenizer = load_model(records[0]["folder"], args.dtype)
    warm = torch.tensor([warm_up_ids(records)], dtype=torch.long)
    decode(model, tokenizer, warm, WARMUP_NEW_TOKENS, config=config)
    decode_autoregressive(model, tokenizer, warm, WARMUP_NEW_TOKENS)
    version = getattr(goose, "__version__", None)
    rows = []
    for done, record in enumerate(records, 1):
        ids = torch.tensor([record["input_ids"]], dtype=torch.long)
        n_prompt = ids.shape[1]
        ar_output, ar_stats = decode_autoregressive(model, tokenizer, ids, args.max_new_tokens)
        output, stats = decode(model, tokenizer, ids, args.max_new_tokens, config=config)
        row = side_row("official", record, output[0, n_prompt:].tolist(), ar_output[0, n_prompt:].tolist(),
                       stats.forward_calls, stats.wall_time, ar_stats.wall_time, stats.compression_ratio,
                       version=version, crop_cache_replaced=replaced)
        rows.append(row)
        progress("official", done, len(records), row)
    return rows


def ours_side(args: argparse.Namespace, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our GooseDecoder (a fresh one per prompt) and AutoregressiveDecoder on every record."""
    import torch

    try:
        from goose.config import GooseConfig
        from goose.cycle.calibration import load_or_measure
        from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
    except ImportError as error:
        raise SideError(f"`import goose` is not Goose's own package here ({error}): run without the official "
                        "checkout on PYTHONPATH") from None

    config = GooseConfig(**{"budget": args.budget, **args.config})
    model, tokenizer = load_model(records[0]["folder"], args.dtype)
    curve = load_or_measure(model)  # cached per machine and thread count; measured here, before any timing, if not
    rows = []
    with torch.inference_mode():
        warm = warm_up_ids(records)
        GooseDecoder(model, tokenizer, config, cost_curve=curve).generate(warm, WARMUP_NEW_TOKENS)
        AutoregressiveDecoder(model, tokenizer).generate(warm, WARMUP_NEW_TOKENS)
        for done, record in enumerate(records, 1):
            ids = record["input_ids"]
            ar = AutoregressiveDecoder(model, tokenizer).generate(ids, args.max_new_tokens)
            result = GooseDecoder(model, tokenizer, config, cost_curve=curve).generate(ids, args.max_new_tokens)
            stats = result.stats
            # verify_steps counts the passes after the prefill
            row = side_row("ours", record, result.new_token_ids, ar.new_token_ids, stats.verify_steps + 1,
                           stats.wall_s, ar.stats.wall_s, stats.tau, stop_reason=result.stop_reason)
            rows.append(row)
            progress("ours", done, len(records), row)
    return rows


def run_side_process(args: argparse.Namespace) -> int:
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # the weights' loading bar: one progress line per prompt is what shows
    out = Path(args.out)
    records = read_jsonl(out / INPUTS_FILE)
    if not records:
        raise SideError(f"{out / INPUTS_FILE} holds no prompts")
    started = time.perf_counter()
    rows = official_side(args, records) if args.side == "official" else ours_side(args, records)
    write_jsonl(out / f"{args.side}.jsonl", rows)
    print(f"[{args.side}] done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_arguments(argv)
        if args.side is not None:
            return run_side_process(args)
        return run_parent(args)
    except (UsageError, SideError) as error:
        print(f"paper_peer: error: {error}", file=sys.stderr)
        return 2
    except SideFailed as error:
        print(f"paper_peer: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
