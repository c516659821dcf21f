"""One sample x one method -> one ``results.jsonl`` line: Spec-Bench's fields plus ours.

Spec-Bench fields (so its ``speed.py`` reads our files): ``question_id``, ``category``,
``answer_id``, ``model_id`` (``<model>-<method>``, as Spec-Bench names a run), ``tstamp`` and
``choices[0]`` with per-turn ``turns`` (texts), ``decoding_steps``, ``new_tokens``, ``wall_time``
and the flat per-step ``accept_lengths`` over all turns.

Ours, all over the whole sample (every turn): ``model``, ``method``, ``dataset``, ``new_tokens``,
``wall_s``, ``tokens_per_s``, ``verify_steps``, ``tau``, per-source ``source_tested`` /
``source_accepted`` / ``source_acceptance``, ``path_kinds``, ``tree_sizes`` (rows of every verify
pass, for time predicted from a cost curve), ``auxiliary_rows``, ``seed`` (of a sampled run),
``new_token_ids`` (per turn, for auditing losslessness), ``config`` (the method's sources, topology,
budget and options), and, filled in once every method has run on the sample, ``speedup`` (over
``ar`` on the same prompt, whose tokens/s is ``ar_tokens_per_s``), ``speedup_vs_hf_ar``,
``speedup_vs_hf_pld`` (over Hugging Face's prompt lookup on the same prompt), ``identical_to_ar``
(token ids, every turn) and, in the deterministic mode, ``estimated_s`` / ``estimated_speedup``.

``faults``: per plugin (source or topology) whose hooks faulted during the sample (raised, or answered
malformed: the plugin boundary, :mod:`goose.boundary`, skipped the call and decoding went on without
it), ``{"kind", "count", "hooks": {hook: count}, "first": "<hook>: <what went wrong>"}``; ``{}`` when
none did: each turn's ``GenerationStats.faults``, which the plugin boundary credits to the request it
serves.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from goose_bench.generators import TurnOutput
from goose_bench.methods import BASELINE, LOOKUP_PEER, PEER_BASELINE
from goose_bench.prompts import Sample

Record = dict[str, Any]
Faults = dict[str, dict[str, Any]]  # plugin -> {kind, count, hooks, first}


def merge_faults(parts: Sequence[Mapping[str, Mapping[str, Any]] | None]) -> Faults:
    """Faults of several turns (or samples) as one: counts summed per plugin and hook, the first message kept."""
    merged: Faults = {}
    for part in parts:
        for name, entry in (part or {}).items():
            into = merged.setdefault(name, {"kind": entry.get("kind", "source"), "count": 0, "hooks": {},
                                            "first": None})
            into["count"] += int(entry.get("count", 0))
            for hook, count in (entry.get("hooks") or {}).items():
                into["hooks"][hook] = into["hooks"].get(hook, 0) + int(count)
            into["first"] = into["first"] or entry.get("first")
    return dict(sorted(merged.items()))


def _faults(outputs: Sequence[TurnOutput]) -> Faults:
    """The sample's plugin faults, every turn's (``GenerationStats.faults``)."""
    return merge_faults([(o.stats or {}).get("faults") for o in outputs])


def _summed(outputs: Sequence[TurnOutput], key: str) -> dict[str, Any]:
    total: Counter[str] = Counter()
    for output in outputs:
        total.update((output.stats or {}).get(key, {}))
    return dict(total)


def build_record(model: str, method: str, sample: Sample, outputs: Sequence[TurnOutput],
                 seed: int | None = None, config: dict[str, Any] | None = None) -> Record:
    """The record of ``method`` on ``sample`` (speedup fields still None: see :func:`compare`)."""
    counted = all(o.accepted_lengths is not None for o in outputs)
    accept_lengths = [n for o in outputs for n in (o.accepted_lengths or [])]
    new_tokens = sum(len(o.new_token_ids) for o in outputs)
    wall_s = sum(o.wall_s for o in outputs)
    tested, accepted = _summed(outputs, "source_tested"), _summed(outputs, "source_accepted")
    return {
        # Spec-Bench
        "question_id": sample.question_id,
        "category": sample.category or sample.dataset,
        "answer_id": uuid.uuid4().hex,
        "model_id": f"{model}-{method}",
        "tstamp": time.time(),
        "choices": [{
            "index": 0,
            "turns": [o.text for o in outputs],
            "decoding_steps": [o.verify_steps for o in outputs] if counted else None,
            "new_tokens": [len(o.new_token_ids) for o in outputs],
            "wall_time": [o.wall_s for o in outputs],
            "accept_lengths": accept_lengths,
        }],
        # ours
        "model": model,
        "method": method,
        "dataset": sample.dataset,
        "prompt_tokens": [o.prompt_tokens for o in outputs],
        "new_tokens": new_tokens,
        "wall_s": wall_s,
        "tokens_per_s": new_tokens / wall_s if wall_s > 0 else 0.0,
        # time to the first token of the first turn (later turns' prefills hold only the new turn)
        "first_token_s": outputs[0].first_token_s if outputs else None,
        "verify_steps": len(accept_lengths) if counted else None,
        # tokens per verification call; the prefill's first token is no verification step's
        "tau": (sum(accept_lengths) / len(accept_lengths)) if counted and accept_lengths else None,
        "source_tested": tested,
        "source_accepted": accepted,
        "source_acceptance": {name: accepted.get(name, 0) / n for name, n in sorted(tested.items()) if n},
        "path_kinds": _summed(outputs, "path_kinds"),
        "tree_sizes": [n for o in outputs for n in (o.tree_sizes or [])] if counted else None,
        "auxiliary_rows": sum((o.stats or {}).get("auxiliary_rows", 0) for o in outputs),
        "seed": seed,
        "config": config,
        "stop_reasons": [o.stop_reason for o in outputs],
        "faults": _faults(outputs),
        # through the target's memo: rows it answered and the real work still run (None: every pass was real)
        "memo": _summed(outputs, "memo") or None,
        "new_token_ids": [o.new_token_ids for o in outputs],
        "speedup": None,
        "ar_tokens_per_s": None,  # ar's on the same prompt: summed over prompts, the ratio of totals
        "speedup_vs_hf_ar": None,
        "speedup_vs_hf_pld": None,
        "identical_to_ar": None,
    }


def compare(records: dict[str, Record]) -> None:
    """Fill in speedups and losslessness of one sample's records (method name -> record), in place."""
    base = records.get(BASELINE)
    peer = records.get(PEER_BASELINE)
    lookup = records.get(LOOKUP_PEER)
    for record in records.values():
        if base is not None:
            record["identical_to_ar"] = record["new_token_ids"] == base["new_token_ids"]
            record["speedup"] = _ratio(record["tokens_per_s"], base["tokens_per_s"])
            record["ar_tokens_per_s"] = base["tokens_per_s"]
        if peer is not None:
            record["speedup_vs_hf_ar"] = _ratio(record["tokens_per_s"], peer["tokens_per_s"])
        if lookup is not None:
            record["speedup_vs_hf_pld"] = _ratio(record["tokens_per_s"], lookup["tokens_per_s"])


def _ratio(value: float, base: float) -> float | None:
    return value / base if base > 0 else None
