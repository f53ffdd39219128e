"""What a serving run measured: one record per request, and the run's totals.

Times are the executor's seconds since the threads started. Per request: arrival, when the
engine began the admission round that took it (``admitted``; queue wait = ``admitted -
arrival``), when that round's pass had its copies (``copies_landed``: copy wait = ``copies_landed
- admitted``, which holds the admission calls, its onboarding, and whatever the copy stream held
before it), its first token (the end of that pass: TTFT = ``first_token - arrival``) and its
end. Tiers are
the manager's levels by index (0 GPU, 1 host, 2 disk).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

LEVEL_NAMES = ("gpu", "host", "disk")


@dataclass
class RequestRecord:
    index: int
    arrival: float
    input_tokens: int
    output_tokens: int
    admitted: float | None = None
    copies_landed: float | None = None
    first_token: float | None = None
    finished: float | None = None
    cached_tokens: int = 0  # the prefix create_kv_cache adopted (reused, not recomputed)
    new_tokens: int = 0  # prefilled (recomputed) tokens
    onboarded_pages: list[int] = field(default_factory=lambda: [0, 0, 0])  # by source level
    failed: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    def to_row(self) -> dict:
        def ms(t: float | None) -> float | None:
            return None if t is None else round(t * 1e3, 6)

        return {"request": self.index, "arrival_ms": ms(self.arrival),
                "queue_ms": ms(None if self.admitted is None else self.admitted - self.arrival),
                "copy_wait_ms": ms(None if self.copies_landed is None
                                   else self.copies_landed - self.admitted),
                "ttft_ms": ms(self.ttft),
                "e2e_ms": ms(None if self.finished is None else self.finished - self.arrival),
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cached_tokens": self.cached_tokens, "new_tokens": self.new_tokens,
                "onboarded_pages": dict(zip(LEVEL_NAMES[1:], self.onboarded_pages[1:])),
                "failed": self.failed}


@dataclass
class ServingStats:
    """Filled in by the engine thread while it runs; read after the executor finished."""

    requests: list[RequestRecord] = field(default_factory=list)
    passes: int = 0
    gpu_busy_s: float = 0.0  # modelled compute of every pass
    copy_wait_s: float = 0.0  # pass time spent waiting for copies beyond the compute
    prefill_s: float = 0.0
    decode_s: float = 0.0
    moved_bytes: dict[str, int] = field(default_factory=dict)  # "host->gpu" -> bytes
    moved_pages: dict[str, int] = field(default_factory=dict)
    admission_retries: int = 0  # admissions undone for want of GPU room (retried later)

    def add_copies(self, plan) -> None:
        for b in plan.copies:
            key = f"{LEVEL_NAMES[b.src_level]}->{LEVEL_NAMES[b.dst_level]}"
            self.moved_bytes[key] = self.moved_bytes.get(key, 0) + b.num_bytes
            self.moved_pages[key] = self.moved_pages.get(key, 0) + b.num_pages

    def summary(self) -> dict:
        """The run's figures (the per-request rows under ``requests``)."""
        done = [r for r in self.requests if r.first_token is not None]
        ttft = np.array([r.ttft for r in done]) * 1e3 if done else np.array([])
        queue = [(r.admitted - r.arrival) * 1e3 for r in done]
        copy_wait = [(r.copies_landed - r.admitted) * 1e3 for r in done]

        def pct(values, q) -> float | None:
            return float(np.percentile(values, q)) if len(values) else None

        reused = sum(r.cached_tokens for r in done)
        new = sum(r.new_tokens for r in done)
        hits = [sum(r.onboarded_pages[lv] for r in done) for lv in range(3)]
        return {
            "requests": len(self.requests),
            "first_token": len(done),
            "finished": sum(1 for r in self.requests if r.finished is not None),
            "failed": sum(1 for r in self.requests if r.failed),
            "ttft_p50_ms": pct(ttft, 50), "ttft_p90_ms": pct(ttft, 90),
            "ttft_p99_ms": pct(ttft, 99), "ttft_mean_ms": float(ttft.mean()) if len(ttft) else None,
            "queue_p50_ms": pct(queue, 50), "queue_p99_ms": pct(queue, 99),
            "copy_wait_p50_ms": pct(copy_wait, 50), "copy_wait_p99_ms": pct(copy_wait, 99),
            "copy_wait_mean_ms": statistics.fmean(copy_wait) if copy_wait else None,
            "passes": self.passes, "gpu_busy_s": self.gpu_busy_s,
            "prefill_s": self.prefill_s, "decode_s": self.decode_s,
            "copy_wait_s": self.copy_wait_s,
            "reused_tokens": reused, "recomputed_tokens": new,
            "hit_rate": reused / (reused + new) if reused + new else 0.0,
            "onboarded_pages": dict(zip(LEVEL_NAMES[1:], hits[1:])),
            "moved_bytes": dict(sorted(self.moved_bytes.items())),
            "moved_pages": dict(sorted(self.moved_pages.items())),
            "admission_retries": self.admission_retries,
            "per_request": [r.to_row() for r in self.requests],
        }
