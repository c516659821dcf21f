"""Prometheus metrics of the server (prometheus_client writes the text format).

Each server gets its own registry, so two apps in one process (tests) never share counters.
Ratios are left to PromQL as counters (tau = rate(goose_accepted_tokens_total) /
rate(goose_verify_steps_total)); the cumulative per-source acceptance is also a gauge for a quick look.
"""

from __future__ import annotations

import threading

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 300)
TAU_BUCKETS = (1, 1.25, 1.5, 1.75, 2, 2.5, 3, 4, 6, 8, 12, 16)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)


class ServerMetrics:
    """Counters and histograms of one server, updated from the event loop and from the worker thread."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_requests = Counter("goose_http_requests", "HTTP requests answered, by route and status code",
                                     ["route", "code"], registry=r)
        self.generations = Counter("goose_generations", "generations finished, by endpoint and finish reason "
                                   "(stop, length, cancelled, error)", ["endpoint", "finish_reason"], registry=r)
        self.prompt_tokens = Counter("goose_prompt_tokens", "prompt tokens processed", registry=r)
        self.completion_tokens = Counter("goose_completion_tokens", "tokens generated", registry=r)
        self.verify_steps = Counter("goose_verify_steps", "verification forward passes (one per Goose cycle)",
                                    registry=r)
        self.accepted_tokens = Counter("goose_accepted_tokens", "tokens gained by verify steps (bonus included); "
                                       "divided by goose_verify_steps_total it is tau", registry=r)
        self.source_tested = Counter("goose_source_tested_tokens", "draft tokens tested, by source", ["source"],
                                     registry=r)
        self.source_accepted = Counter("goose_source_accepted_tokens", "draft tokens accepted, by source",
                                       ["source"], registry=r)
        self.source_acceptance = Gauge("goose_source_acceptance_ratio", "accepted / tested draft tokens since start, "
                                       "by source", ["source"], registry=r)
        self.tau = Histogram("goose_request_tau", "tau (tokens per verify step) of each generation",
                             buckets=TAU_BUCKETS, registry=r)
        self.latency = Histogram("goose_request_duration_seconds", "request time from arrival to the last token",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.first_token = Histogram("goose_time_to_first_token_seconds", "request time from arrival to the "
                                     "first token", ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("goose_queue_wait_seconds", "time a request waited for the model",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("goose_queue_depth", "requests waiting for the model", registry=r)
        self.busy = Gauge("goose_busy", "1 while the model is generating", registry=r)
        self.batch_size = Histogram("goose_batch_size", "requests decoding together in each batched verify pass "
                                    "(goose serve --max-batch)", buckets=BATCH_BUCKETS, registry=r)
        self._lock = threading.Lock()
        self._tested: dict[str, float] = {}
        self._accepted: dict[str, float] = {}

    def record_sources(self, tested: dict[str, int], accepted: dict[str, int]) -> None:
        with self._lock:
            for name, count in tested.items():
                self.source_tested.labels(name).inc(count)
                self.source_accepted.labels(name).inc(accepted.get(name, 0))
                self._tested[name] = self._tested.get(name, 0) + count
                self._accepted[name] = self._accepted.get(name, 0) + accepted.get(name, 0)
                if self._tested[name]:
                    self.source_acceptance.labels(name).set(self._accepted[name] / self._tested[name])

    def render(self) -> bytes:
        return generate_latest(self.registry)
