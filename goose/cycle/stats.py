"""Generation statistics: tau, speed, per-source acceptance and the kinds of accepted paths."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from goose import plugins
from goose.contract.outcome import PathKind


@dataclass
class GenerationStats:
    """Counters of one generation. ``tau`` is tokens per verification call, the bonus token included."""

    new_tokens: int = 0
    verify_steps: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    auxiliary_rows: int = 0  # rows that rode in verify passes without being drafted (Lookahead's window)
    source_tested: Counter[str] = field(default_factory=Counter)  # draft tokens tested: their parent was accepted
    source_accepted: Counter[str] = field(default_factory=Counter)
    path_kinds: Counter[str] = field(default_factory=Counter)
    prefill_s: float = 0.0
    wall_s: float = 0.0
    profile: Counter[str] = field(default_factory=Counter)  # seconds per cycle phase, when profiling
    batch_rows: list[int] = field(default_factory=list)  # batched: the requests in each pass this one rode in
    row_budgets: list[int] = field(default_factory=list)  # batched: this request's share of each pass's budget
    constrained: bool = False  # a structured output: its output followed a grammar
    grammar_cut_tokens: int = 0  # drafted tokens the grammar forbade, cut before verification
    grammar_s: float = 0.0  # the grammar's own time: masks, cuts, masking the rows, advancing the matcher
    # the trees the automatic budget laid: how many, the E[tau] it expected of them as planned, the tokens they kept
    trees_laid: int = 0
    trees_promised: float = 0.0
    trees_kept: int = 0
    # per plugin whose hooks faulted for this request: {"kind", "count", "hooks": {hook: count}, "first"}
    faults: dict[str, dict[str, Any]] = field(default_factory=dict)

    def record_step(self, new_tokens: int, tree_size: int, kind: PathKind,
                    per_source: dict[str, tuple[int, int]], auxiliary_rows: int = 0) -> None:
        self.verify_steps += 1
        self.accepted_lengths.append(new_tokens)
        self.tree_sizes.append(tree_size)
        self.auxiliary_rows += auxiliary_rows
        self.path_kinds[kind.value] += 1
        for name, (tested, accepted) in per_source.items():
            self.source_tested[name] += tested
            self.source_accepted[name] += accepted

    @property
    def tau(self) -> float:
        """Mean tokens gained per verification call (the paper's tau; 1.0 for plain decoding)."""
        return sum(self.accepted_lengths) / self.verify_steps if self.verify_steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def source_acceptance(self) -> dict[str, float]:
        """Per source: accepted / tested draft nodes (a node is tested when its parent was accepted)."""
        return {
            name: (self.source_accepted[name] / tested if tested else 0.0)
            for name, tested in sorted(self.source_tested.items())
        }

    def to_dict(self) -> dict[str, Any]:
        predicting = plugins.registry().needing("prediction")
        return {
            "new_tokens": self.new_tokens,
            "verify_steps": self.verify_steps,
            "tau": round(self.tau, 4),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "wall_s": round(self.wall_s, 4),
            "prefill_s": round(self.prefill_s, 4),
            "mean_tree_size": round(sum(self.tree_sizes) / len(self.tree_sizes), 2) if self.tree_sizes else 0.0,
            "auxiliary_rows": self.auxiliary_rows,
            "source_acceptance": {k: round(v, 4) for k, v in self.source_acceptance.items()},
            "source_tested": dict(self.source_tested),
            "source_accepted": dict(self.source_accepted),
            # OpenAI's Predicted Outputs counters: prediction tokens the target checked and kept / refused, over
            # every source that drafts from the prediction (registered needs_request="prediction")
            "accepted_prediction_tokens": sum(self.source_accepted.get(name, 0) for name in predicting),
            "rejected_prediction_tokens": sum(self.source_tested.get(name, 0) - self.source_accepted.get(name, 0)
                                              for name in predicting),
            "path_kinds": {kind.value: self.path_kinds.get(kind.value, 0) for kind in PathKind},
            "accepted_lengths": list(self.accepted_lengths),
            "faults": {name: {**entry, "hooks": dict(entry["hooks"])} for name, entry in self.faults.items()},
            **({"profile_s": {k: round(v, 4) for k, v in self.profile.items()}} if self.profile else {}),
            **({"mean_batch_rows": round(sum(self.batch_rows) / len(self.batch_rows), 2)} if self.batch_rows else {}),
            **({"row_budgets": list(self.row_budgets)} if self.row_budgets else {}),
            **({"trees": {"laid": self.trees_laid, "promised_tau": round(self.trees_promised / self.trees_laid, 3),
                          "kept_tau": round(self.trees_kept / self.trees_laid, 3)}} if self.trees_laid else {}),
            **({"grammar_cut_tokens": self.grammar_cut_tokens, "grammar_s": round(self.grammar_s, 4)}
               if self.constrained else {}),
        }
