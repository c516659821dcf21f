"""Prediction: draft the request's predicted output (OpenAI's Predicted Outputs), re-synced after every departure.

A client that edits a file knows most of the answer in advance: the file itself. It sends it as
the request's ``prediction`` (``DecodeContext.prediction``, token ids), and this source drafts the
prediction's continuation from where the output stands in it. The output departs where the edit
is (a new docstring, a renamed parameter) and usually rejoins the prediction a few tokens later,
as in a diff; so after every departure the source looks for the output's latest tokens in the
prediction again, nearest after the last place the two agreed, and drafts from there.

Without a prediction the source drafts nothing and costs one attribute read a cycle. It is the
request's most trusted source (a high initial acceptance), so planners give it the spine, and,
like every draft, its tokens are verified: the prediction changes how many tokens a pass yields,
never the output.

A draft's ``consensus`` is how many tokens the output has followed the prediction in a row since
it last departed (up to the draft's length). It is this source's evidence of a reliable copy, as
agreeing n-gram matches are context match's: a long run lets a planner lay the spine alone (the
consensus bypass) instead of spending rows on transition branches beside a copy that holds.

How far a draft is trusted is estimated by *run depth*, as context match estimates its copies by
copy depth (:class:`CopyDepthEstimate`): a token due when the output has followed the prediction
for D tokens (the re-sync's own tokens included) holds with the rate of D's bin, learnt from every
tested token of this source's drafts. An edit departs where the edit is and holds everywhere else,
so the deep bins learn within a draft or two that a long run goes on, and the planner lays the long
spine from the next cycle, instead of waiting for one EMA over whole drafts to climb (with which a
held prediction spent cycle after cycle on small trees that it filled whole).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from pydantic import BaseModel, ConfigDict, Field, field_validator

import goose
from goose.config import GooseConfig
from goose.contract.candidates import DecodeContext, Draft
from goose.contract.outcome import VerifyOutcome
from goose.hookspecs import Register
from goose.sources.toolkit import CopyDepthEstimate, before_eos, increasing_edges, without_trailing_repeats

NAME = "prediction"


class PredictionOptions(BaseModel):
    """Options of the prediction source (``GooseConfig.source_options["prediction"]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_continuation: int = Field(
        default=128, ge=1,
        description="most prediction tokens one draft carries (the budget decides how many are verified)",
    )
    resync_ngram: int = Field(
        default=3, ge=1,
        description="after a departure, the longest run of the output's last tokens looked up in the prediction; "
        "shorter runs down to one token are tried in turn, nearest after the last agreement first",
    )
    consensus: bool = Field(
        default=True,
        description="report the run of tokens followed since the last departure as the draft's consensus "
        "(False: no consensus, so a planner always hangs branches beside the prediction's spine)",
    )
    depth_edges: tuple[int, ...] = Field(
        default=(4, 8, 16, 32, 64),
        description="run-depth bin edges: one acceptance estimate per bin of how many tokens the output has "
        "followed the prediction when a draft token is due. () = the decoder's one estimate for every token",
    )
    depth_prior: float = Field(default=0.9, ge=0.0, le=1.0, description="acceptance every run-depth bin starts from")
    depth_memory: float = Field(
        default=50.0, ge=1.0, description="tokens of evidence each run-depth bin remembers (older ones fade)"
    )

    _increasing = field_validator("depth_edges")(staticmethod(increasing_edges))


class PredictionSource:
    """Follows the output through the request's prediction; one instance per decoder, state per request."""

    name = NAME

    def __init__(self, config: GooseConfig) -> None:
        self.options = PredictionOptions.model_validate(config.options_for(NAME))
        options = self.options
        # kept across requests: how long this model's output goes on following a client's prediction
        self.by_depth = CopyDepthEstimate(options.depth_edges, options.depth_prior, options.depth_memory) \
            if options.depth_edges else None
        self.goose_reset()

    @goose.hookimpl
    def goose_reset(self) -> None:
        self.prediction: np.ndarray | None = None
        self.cursor: int | None = None  # the prediction position the output's end is aligned with
        self.agreed = 0  # the prediction position just after the last token the output and it agreed on
        self.run = 0  # output tokens followed in a row since the last departure
        self.lead = 0  # tokens the alignment rests on before the run: the re-sync's n-gram (0 at the start)
        self._first_depth: int | None = None  # run depth of this cycle's first draft token (None: no draft)
        self.seen = 0  # context length the alignment has followed
        self.resyncs = 0

    @goose.hookimpl
    def goose_propose(self, context: DecodeContext) -> Draft | None:
        self._first_depth = None
        prediction = context.prediction
        if prediction is None or prediction.shape[0] == 0:
            return None
        if self.prediction is not prediction:  # a new request: the output starts at the prediction's start
            self.goose_reset()
            self.prediction, self.cursor, self.seen = prediction, 0, context.prompt_length
        self._follow(context.tokens)
        if self.cursor is None:
            self.cursor = self._resync(context.tokens[context.prompt_length :])
        if self.cursor is None or self.cursor >= prediction.shape[0]:
            return None
        draft = before_eos(prediction[self.cursor : self.cursor + self.options.max_continuation].tolist(),
                           context.eos_token_ids)
        if not draft:
            return None
        consensus = min(self.run, len(draft)) if self.options.consensus else 0
        if self.by_depth is None:
            return Draft.chain(draft, consensus=consensus)
        self._first_depth = self.lead + self.run
        estimates = self.by_depth.profile(self._first_depth, len(draft))
        return Draft.chain(draft, estimates, consensus=consensus,
                           depth_acceptance=without_trailing_repeats(estimates.tolist()))

    @goose.hookimpl
    def goose_observe(self, outcome: VerifyOutcome, own_nodes: np.ndarray) -> None:
        if self.by_depth is not None and self._first_depth is not None:
            self.by_depth.observe_draft(self._first_depth, outcome, own_nodes)

    def _follow(self, tokens: np.ndarray) -> None:
        """Advance the alignment over the tokens appended since the last call; a mismatch loses it."""
        prediction = self.prediction
        assert prediction is not None
        for token in tokens[self.seen :].tolist():
            if self.cursor is not None and self.cursor < prediction.shape[0] and prediction[self.cursor] == token:
                self.cursor += 1
                self.agreed = self.cursor
                self.run += 1
            else:
                self.cursor, self.run, self.lead = None, 0, 0
        self.seen = int(tokens.shape[0])

    def _resync(self, output: np.ndarray) -> int | None:
        """Where the prediction continues the output's latest tokens, nearest after the last agreement."""
        assert self.prediction is not None
        for n in range(min(self.options.resync_ngram, output.shape[0]), 0, -1):
            if self.prediction.shape[0] <= n:
                continue
            windows = sliding_window_view(self.prediction[:-1], n)  # an occurrence must leave a token to draft
            ends = np.flatnonzero((windows == output[-n:]).all(axis=1)) + n
            if ends.size:
                after = ends[ends >= self.agreed]
                self.resyncs += 1
                self.lead = n
                return int(after[0] if after.size else ends[-1])
        return None


@goose.hookimpl
def goose_register_sources(register: Register) -> None:
    register(NAME, PredictionSource, description="the request's predicted output (OpenAI Predicted Outputs)",
             initial_acceptance=0.9, options=PredictionOptions, needs_request="prediction")
