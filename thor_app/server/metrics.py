"""Prometheus metrics of one server (its own registry: two apps in one process never mix)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30)


class Metrics:
    def __init__(self, queue_depth, ready):
        """queue_depth, ready: callables read at scrape time."""
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "thor_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.prompt_tokens = Counter("thor_prompt_tokens", "prompt tokens prefilled", registry=r)
        self.generated_tokens = Counter(
            "thor_generated_tokens", "tokens generated (committed)", registry=r
        )
        self.drafted = Counter("thor_drafted_tokens", "draft tokens verified", registry=r)
        self.accepted = Counter("thor_accepted_tokens", "draft tokens accepted", registry=r)
        self.pos_offered = Counter(
            "thor_draft_position_offered",
            "cycles that verified a draft at this position",
            ["position"],
            registry=r,
        )
        self.pos_accepted = Counter(
            "thor_draft_position_accepted",
            "cycles that accepted the draft at this position",
            ["position"],
            registry=r,
        )
        self.cancelled = Counter(
            "thor_generations_cancelled",
            "generations stopped before the end",
            ["reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "thor_ttft_seconds", "time to first token (prefill)", buckets=_TTFT_BUCKETS, registry=r
        )
        self.latency = Histogram(
            "thor_request_latency_seconds",
            "request latency by route",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        Gauge(
            "thor_queue_depth", "requests waiting for the generation worker", registry=r
        ).set_function(queue_depth)
        Gauge(
            "thor_ready", "1 when the model is loaded and passed its self-test", registry=r
        ).set_function(lambda: 1.0 if ready() else 0.0)
        self._acceptance = Gauge(
            "thor_acceptance_by_position",
            "accepted / offered drafts at this position",
            ["position"],
            registry=r,
        )
        self._offered_sum: list[int] = []
        self._accepted_sum: list[int] = []

    def record_generation(self, stats) -> None:
        """One generation's (or one plan's merged) thor_runtime Stats."""
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generated_tokens.inc(stats.generated)
        self.drafted.inc(stats.drafted)
        self.accepted.inc(stats.accepted)
        if stats.generated:
            self.ttft.observe(stats.ttft_s)
        for j, (o, a) in enumerate(zip(stats.pos_offered, stats.pos_accepted)):
            if j >= len(self._offered_sum):
                self._offered_sum.append(0)
                self._accepted_sum.append(0)
            self._offered_sum[j] += o
            self._accepted_sum[j] += a
            self.pos_offered.labels(str(j)).inc(o)
            self.pos_accepted.labels(str(j)).inc(a)
            if self._offered_sum[j]:
                self._acceptance.labels(str(j)).set(self._accepted_sum[j] / self._offered_sum[j])

    def record_cancel(self, reason: str, tokens: int) -> None:
        self.cancelled.labels(reason).inc()
        self.generated_tokens.inc(tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
