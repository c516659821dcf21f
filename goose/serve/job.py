"""A generation request between the server's event loop and the model's worker: the job, and what it sends back.

The event loop makes a :class:`Job` per choice of a request and queues it with the engine
(:mod:`goose.serve.engine`); the worker decodes it and delivers :data:`Event` s (text deltas, then one
:class:`Finished` or :class:`Failed`) back to the loop that asked, which streams or collects them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from goose.serve.errors import APIError
from goose.serve.logprobs import WireLogprob
from goose.serve.schemas import GooseStats


@dataclass(frozen=True)
class Decoding:
    """The Goose options a request may choose; one decoder is kept per distinct choice."""

    sources: tuple[str, ...]
    topology: str
    budget: int | str


# --- what a job sends back ----------------------------------------------------------------------


@dataclass(frozen=True)
class Delta:
    """Text the client may be sent now (empty when a cycle's text is held back by a stop string) and, when the
    request asks for log probabilities, those of the tokens whose text it completes (None when it does not)."""

    text: str
    logprobs: list[WireLogprob] | None = None


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # "stop" or "length"
    text: str
    prompt_tokens: int
    completion_tokens: int
    stats: GooseStats
    logprobs: list[WireLogprob] | None = None  # the output's tokens' (None unless the request asked)


@dataclass(frozen=True)
class Failed:
    error: APIError
    started: bool  # whether text was already sent (a stream can only report it in-band then)


Event = Delta | Finished | Failed


@dataclass
class Job:
    """One generation request, from the event loop's side to the worker's and back."""

    endpoint: str  # "chat" or "completions", for metrics
    prompt_ids: list[int]
    max_tokens: int
    stop: tuple[str, ...]
    decoding: Decoding
    sampling: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    ignore_eos: bool = False
    prediction: list[int] | None = None  # Predicted Outputs: the expected output's token ids
    structured_output: dict[str, Any] = field(default_factory=dict)  # response_format: json_schema or json_object
    logprobs: int | None = None  # None: no log probabilities; else the top alternatives reported per token
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)

    def deliver(self, event: Event) -> None:
        """Called by the worker thread: hand the event to the request's event loop."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()

    def decoder_options(self) -> dict[str, Any]:
        """The decoder's options for this job: its sampling, and no EOS or a prediction when it asks."""
        options: dict[str, Any] = dict(self.sampling)
        if self.ignore_eos:
            options["eos_token_ids"] = ()
        if self.prediction is not None:
            options["prediction"] = self.prediction
        options.update(self.structured_output)
        if self.logprobs is not None:
            options["logprobs"] = self.logprobs
        return options

    def cancel(self) -> None:
        """The client has gone: skip the job if it still waits, stop it at the next cycle if it runs."""
        self.cancelled.set()
