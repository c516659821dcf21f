"""Log probabilities of the output tokens, read from the pass that produced them (no extra forward).

A token's log probability is ``log_softmax`` of the raw logits, in float32, of the row that predicted
it; its top alternatives are the k largest values of that same row. The raw distribution, not the one
after temperature, top-k and top-p: it is what vLLM returns by default, it does not depend on the
sampling options (the same output scores the same greedy or sampled), and it is defined for every
token (a warped distribution gives -inf to every token top-k or top-p cut, and greedy decoding has no
distribution at all).

Which row predicted which token: in the Goose cycle the anchor's row (row 0) predicts the cycle's
first token, each accepted node's row its child's token, and the deepest accepted node's row the bonus
token, so the kept tokens' rows are ``[0, *path]`` in order; the first output token comes from the
prefill's last row. All the kept tokens of a cycle are read together, in one device read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from goose.cycle.readout import greedy_and_top_k

MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """One output token's log probability and the ``k`` most likely tokens at its position (best first)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, log probability)

    def to_dict(self) -> dict[str, Any]:
        return {"token_id": self.token_id, "logprob": self.logprob,
                "top_logprobs": [{"token_id": token, "logprob": logprob} for token, logprob in self.top]}


def check_top_logprobs(value: Any) -> int | None:
    """The ``logprobs`` option: None (off) or the number of top alternatives per token, 0 to MAX_TOP_LOGPROBS."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise ValueError(f"logprobs must be None (off) or an integer from 0 to {MAX_TOP_LOGPROBS}, the top "
                         f"alternatives to report per token; got {value!r}")
    return value


def token_logprobs(logits: torch.Tensor, rows: Sequence[int], tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """The log probability of ``tokens[i]`` under row ``rows[i]`` of ``logits`` [n, V], with each row's ``top``
    most likely tokens: every row at once, one copy to the device and one back (float64 carries ids exactly).

    One ``log_softmax`` kernel over the picked rows, and the readout's blockwise top-k (one values-only
    pass, then k blocks), rather than a composite log-sum-exp and a full ``topk``: on a CPU each full
    read of the rows is what costs.
    """
    indices = torch.tensor([list(rows), list(tokens)], dtype=torch.long).to(logits.device)  # one host-to-device copy
    scores = torch.log_softmax(logits[indices[0]].float(), dim=-1)
    parts = [scores.gather(1, indices[1][:, None])]
    if top:
        _, top_ids, top_values = greedy_and_top_k(scores, top)
        parts += [top_values, top_ids]
    host = torch.cat([part.to(torch.float64) for part in parts], dim=1).cpu().tolist()
    kept = (len(host[0]) - 1) // 2 if host else 0
    # a structured output's masked tokens (-inf: impossible there) are no alternatives, and JSON has no -inf
    return [TokenLogprob(int(token), line[0], tuple((int(i), value) for i, value in
                                                    zip(line[1 + kept :], line[1 : 1 + kept], strict=True)
                                                    if value != -math.inf))
            for token, line in zip(tokens, host, strict=True)]
