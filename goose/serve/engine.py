"""The model's worker: a bounded first-come-first-served queue, decoders, up to ``max_batch`` requests at a time.

A decoder is not thread-safe and holds its requests' KV cache, so every generation runs in one
worker thread. It decodes up to ``max_batch`` requests together: every cycle verifies all their
trees in one pass (a :class:`goose.cycle.session.Session`, one per set of Goose options in use;
with ``max_batch`` 1 a session of one: the same steps), requests join and
leave at cycle boundaries, and each streams on its own. Requests wait in a bounded queue in arrival
order; when it is full, ``submit`` refuses at once (the server answers 503 with Retry-After). Each
job streams its events back to the event loop that asked for it; a job whose client has gone is
skipped if it is still waiting, or stopped at its next cycle. One GooseDecoder is kept per
(sources, topology, budget) in a small LRU: building one loads the device's cost curve, and its
sources' tables (the bigram adjacency) keep learning across requests.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch
from pydantic import ValidationError
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from goose.config import GooseConfig
from goose.cycle.decoder import GenerationResult, GooseDecoder
from goose.cycle.engine import new_verifier
from goose.cycle.session import Session
from goose.plugins import PluginError, registry
from goose.serve.errors import APIError, bad_request, from_validation_error, rejection
from goose.serve.job import Decoding, Delta, Failed, Finished, Job
from goose.serve.logprobs import LogprobPlacer, TokenTexts
from goose.serve.metrics import ServerMetrics
from goose.serve.schemas import GooseStats
from goose.serve.stop import StopScanner

logger = logging.getLogger("goose.serve")

DECODER_CACHE_SIZE = 4
FINISH_REASONS = {"eos": "stop", "max_new_tokens": "length", "context_full": "length"}


SHUTTING_DOWN = APIError(503, "the server is shutting down", kind="server_error", code="shutting_down")


class QueueFullError(Exception):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"the queue is full; retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


# --- the engine ---------------------------------------------------------------------------------


class Engine:
    """Owns the model: validates Goose options, queues jobs and decodes up to ``max_batch`` together in its worker."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: GooseConfig | None = None,
        *,
        max_queue: int = 32,
        max_batch: int = 1,
        cache_positions: int | None = None,
        metrics: ServerMetrics | None = None,
    ) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.max_batch = max_batch
        self.cache_positions = cache_positions  # each session's KV cache budget, None: the context
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or GooseConfig()
        self.max_queue = max_queue
        self.metrics = metrics or ServerMetrics()
        self.default_decoding = Decoding(tuple(self.config.sources), self.config.topology, self.config.budget)
        shape = new_verifier(model)  # the context and vocabulary every decoder of this model works within
        self.context, self.vocab_size = shape.max_positions, shape.vocab_size
        del shape
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._decoders: OrderedDict[Decoding, GooseDecoder] = OrderedDict()
        self._threads = torch.get_num_threads()
        self._token_texts = TokenTexts(tokenizer)  # the worker's: it decodes with the worker's tokenizer
        self._worker: threading.Thread | None = None
        self._mean_job_s = 5.0  # a first guess for Retry-After until jobs have been timed
        self._running: dict[tuple[Decoding, int], _Running] = {}  # the jobs decoding now, by (decoding, request id)
        self._closing = False
        # jobs submitted and not yet finished or skipped; with the queue's size it tells whether the worker
        # holds one, without a gap between taking a job off the queue and starting it
        self._outstanding = 0
        self._outstanding_lock = threading.Lock()

    # event-loop side

    def start(self, warm_up: bool = True) -> None:
        """Start the worker; it builds the default decoder (loading the cost curve) and warms the model up.

        Returns when the worker is ready, and raises what it raised if it could not get ready. All the
        model's work runs in the worker thread, warm-up included: a CPU build of torch keeps one
        OpenMP thread team per thread that runs operators, and a second team (the event loop's) on
        the same cores slows every cycle.
        """
        ready, failed = threading.Event(), []
        self._worker = threading.Thread(target=self._work, args=(warm_up, ready, failed), name="goose-serve-worker",
                                        daemon=True)
        self._worker.start()
        ready.wait()
        if failed:
            raise failed[0]

    def close(self, timeout_s: float = 10.0) -> None:
        """Refuse new jobs, cancel what waits and what runs (their clients get a 503), and stop the worker."""
        self._closing = True
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel()
                job.deliver(Failed(SHUTTING_DOWN, started=False))
                self._done()
        self._current_cancel()
        if self._worker is not None and self._worker.is_alive():
            with contextlib.suppress(queue.Full):  # a request that slipped in since: the worker still stops
                self._queue.put(None, timeout=timeout_s)
            self._worker.join(timeout_s)

    def decoding(self, sources: list[str] | None, topology: str | None, budget: int | str | None) -> Decoding:
        """The request's Goose options merged over the server's, validated (a 400 naming the field if not)."""
        if sources is None and topology is None and budget is None:
            return self.default_decoding
        try:
            config = self.config.merged({"sources": sources, "topology": topology, "budget": budget})
        except ValidationError as error:
            raise from_validation_error(error) from None
        known = registry()
        for name in config.sources:
            if name not in known.sources:
                raise bad_request(f"sources: unknown source {name!r}; known: {', '.join(sorted(known.sources))}",
                                  param="sources")
        if config.topology not in known.topologies:
            raise bad_request(f"topology: unknown topology {config.topology!r}; known: "
                              f"{', '.join(sorted(known.topologies))}", param="topology")
        return Decoding(tuple(config.sources), config.topology, config.budget)

    def submit(self, job: Job) -> None:
        """Queue the job in arrival order, or raise QueueFullError at once (a 503 while shutting down)."""
        if self._closing:
            raise SHUTTING_DOWN
        with self._outstanding_lock:
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                raise QueueFullError(self.retry_after_s()) from None
            self._outstanding += 1
        self.metrics.queue_depth.set(self._queue.qsize())

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    @property
    def busy(self) -> bool:
        """Whether the worker holds a job (running it, or just taken off the queue)."""
        with self._outstanding_lock:
            return self._outstanding > self._queue.qsize()

    def _done(self) -> None:
        with self._outstanding_lock:
            self._outstanding -= 1

    @property
    def alive(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    def retry_after_s(self) -> int:
        """Seconds until a queue slot is likely free: a slot frees when the running generation ends."""
        return max(1, min(600, math.ceil(self._mean_job_s)))

    # worker side

    def _work(self, warm_up: bool, ready: threading.Event, failed: list[BaseException]) -> None:
        torch.set_num_threads(self._threads)  # intra-op threads as the server was started with
        try:
            decoder = self._decoder(self.default_decoding)
            if warm_up:
                decoder.generate([int(t) for t in self.tokenizer.encode("Hello")] or [0], 2)
                decoder.verifier.reset()
        except BaseException as error:  # start() raises it in the caller's thread
            failed.append(error)
            return
        finally:
            ready.set()
        sessions: dict[Decoding, Session] = {}
        while True:
            while len(self._running) < self.max_batch:  # wait for work only when nothing decodes
                try:
                    job = self._queue.get(block=not self._running)
                except queue.Empty:
                    break
                self.metrics.queue_depth.set(self._queue.qsize())
                if job is None:
                    for running in list(self._running.values()):
                        self._end(running, "cancelled", sessions[running.job.decoding].cancel(running.request_id))
                    return
                if job.cancelled.is_set():
                    self.metrics.generations.labels(job.endpoint, "cancelled").inc()
                    self._done()
                    continue
                self._admit(job, sessions)
            self.metrics.busy.set(1 if self._running else 0)
            for decoding, session in list(sessions.items()):
                if session.active and not self._step(decoding, session):
                    sessions[decoding] = session = self._session(decoding)  # afresh, an empty cache
                if not session.active and decoding != self.default_decoding:
                    del sessions[decoding]  # its cache goes with it; the default's stays warm
            for running in list(self._running.values()):
                if running.job.cancelled.is_set():
                    self._end(running, "cancelled", sessions[running.job.decoding].cancel(running.request_id))

    def _current_cancel(self) -> None:
        for running in list(self._running.values()):
            running.job.cancel()

    def _session(self, decoding: Decoding) -> Session:
        return self._decoder(decoding).batch(self.max_batch, self.cache_positions)

    def _admit(self, job: Job, sessions: dict[Decoding, Session]) -> None:
        started = time.perf_counter()
        self.metrics.queue_wait.observe(started - job.arrived)
        try:
            decoder = self._decoder(job.decoding)
            session = sessions.get(job.decoding)
            if session is None:
                session = sessions[job.decoding] = self._session(job.decoding)
            request_id = session.submit(decoder.request(job.prompt_ids, job.max_tokens, **job.decoder_options()))
        except (PluginError, ValueError) as error:
            job.deliver(Failed(rejection(error, job.endpoint, (job.sampling.get("temperature") or 0) > 0),
                               started=False))
            self.metrics.generations.labels(job.endpoint, "error").inc()
            self._done()
            return
        self._running[(job.decoding, request_id)] = _Running(job, request_id, StopScanner(job.stop), started,
                                                           decoder.source_names(job.prediction is not None),
                                                           self._placer(job))

    def _step(self, decoding: Decoding, session: Session) -> bool:
        """One step of ``session``, its chunks sent on; False if it failed (its requests are failed too)."""
        try:
            chunks = session.step()
        except Exception:  # the worker outlives any one session: its requests fail, the next ones start afresh
            logger.exception("generation failed")
            failure = APIError(500, "internal error during generation", code="internal_error")
            for key, running in list(self._running.items()):
                if key[0] == decoding:
                    running.job.deliver(Failed(failure, started=True))
                    self._release(key)
            return False
        if session.rows:
            self.metrics.batch_size.observe(len(session.rows))
        for chunk in chunks:
            running = self._running.get((decoding, chunk.request_id))
            if running is None:
                continue
            if running.cycles == 0:
                self.metrics.first_token.labels(running.job.endpoint).observe(time.perf_counter() - running.job.arrived)
            running.cycles += 1
            running.produced += len(chunk.token_ids)
            piece = running.scanner.feed(chunk.text)
            running.text += piece
            logprobs = running.placer.place(chunk.logprobs or (), len(running.text), cut=running.scanner.stopped) \
                if running.placer is not None else None
            if piece or logprobs or running.cycles == 1:  # the first event tells a stream that generation began
                running.job.deliver(Delta(piece, logprobs))
            if running.scanner.stopped:
                self._end(running, "stop", chunk.result or session.cancel(chunk.request_id))
            elif chunk.result is not None:
                tail = running.scanner.flush()
                running.text += tail
                logprobs = running.placer.place((), len(running.text), ended=True) if running.placer else None
                if tail or logprobs:
                    running.job.deliver(Delta(tail, logprobs))
                self._end(running, FINISH_REASONS.get(chunk.result.stop_reason, "length"), chunk.result)
        return True

    def _end(self, running: _Running, finish_reason: str, result: GenerationResult | None) -> None:
        job = running.job
        stats = _goose_stats(job, running.sources, result, running)
        self._record(job, finish_reason, running.produced, stats)
        if finish_reason == "cancelled":  # the client has gone, or the server is stopping: tell whoever is left
            job.deliver(Failed(SHUTTING_DOWN, started=True))
        else:
            job.deliver(Finished(finish_reason, running.text, len(job.prompt_ids), running.produced, stats,
                                 running.placer.sent if running.placer is not None else None))
        self._mean_job_s = 0.8 * self._mean_job_s + 0.2 * (time.perf_counter() - running.started) / self.max_batch
        self._release((job.decoding, running.request_id))

    def _release(self, key: tuple[Decoding, int]) -> None:
        del self._running[key]
        self._done()

    def _decoder(self, decoding: Decoding) -> GooseDecoder:
        decoder = self._decoders.get(decoding)
        if decoder is None:
            config = self.config.merged({"sources": list(decoding.sources), "topology": decoding.topology,
                                         "budget": decoding.budget})
            decoder = GooseDecoder(self.model, self.tokenizer, config, chat=False)
            self._decoders[decoding] = decoder
            if len(self._decoders) > DECODER_CACHE_SIZE:
                self._decoders.popitem(last=False)
        self._decoders.move_to_end(decoding)
        return decoder

    def _placer(self, job: Job) -> LogprobPlacer | None:
        return LogprobPlacer(self._token_texts) if job.logprobs is not None else None

    def _record(self, job: Job, finish_reason: str, produced: int, stats: GooseStats) -> None:
        m = self.metrics
        m.generations.labels(job.endpoint, finish_reason).inc()
        m.prompt_tokens.inc(len(job.prompt_ids))
        m.completion_tokens.inc(produced)
        m.verify_steps.inc(stats.verify_steps)
        m.accepted_tokens.inc(max(0, produced - 1))  # the first token comes from the prefill, not a verify step
        if stats.verify_steps:
            m.tau.observe(stats.tau)
        m.record_sources(stats.source_tested, stats.source_accepted)
        m.latency.labels(job.endpoint).observe(time.perf_counter() - job.arrived)
        logger.info("%s: %d prompt + %d new tokens, %s, tau %.2f over %d verify steps, %.1f tok/s",
                    job.endpoint, len(job.prompt_ids), produced, finish_reason, stats.tau, stats.verify_steps,
                    stats.tokens_per_s)


@dataclass
class _Running:
    """A job decoding in a batch: its request in the batch, its stop strings, what it has sent so far."""

    job: Job
    request_id: int
    scanner: StopScanner
    started: float
    sources: tuple[str, ...]
    placer: LogprobPlacer | None = None  # with log probabilities: which tokens' entries have gone out
    text: str = ""
    produced: int = 0
    cycles: int = 0


def _goose_stats(job: Job, sources: tuple[str, ...], result: GenerationResult | None, running: _Running) -> GooseStats:
    """The request's statistics from its result, or from our own counts when there is none (only tokens, steps
    and time are known then: ``partial``)."""
    common = {"sources": list(sources), "topology": job.decoding.topology, "budget": job.decoding.budget,
              "queue_s": round(running.started - job.arrived, 4)}
    if result is not None:
        fields = {key: value for key, value in result.stats.to_dict().items() if key in GooseStats.model_fields}
        return GooseStats(**fields, **common, seed=result.seed)
    wall_s, produced, steps = time.perf_counter() - running.started, running.produced, max(0, running.cycles - 1)
    return GooseStats(
        **common, tau=round((produced - 1) / steps, 4) if steps else 0.0, verify_steps=steps, new_tokens=produced,
        tokens_per_s=round(produced / wall_s, 3) if wall_s > 0 else 0.0, wall_s=round(wall_s, 4), prefill_s=0.0,
        mean_tree_size=0.0, source_acceptance={}, source_tested={}, source_accepted={}, path_kinds={}, partial=True,
    )
