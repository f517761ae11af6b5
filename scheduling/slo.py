"""The queue-time promise: a class's `max_queue_s` is how long a request of it may wait
before it starts. Measured the same way by the replay (`scheduling.bench.replay`) and
the portal's metrics and queue page:

- `slo_attainment`: the share of requests that started within their class's
  `max_queue_s` (1.0 when there are none);
- `slo_overrun_max_s`: the longest wait beyond it (0 when every request kept it).

A class without a maximum queue time (`max_queue_s` 0) promises nothing: its requests
count as kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Promise:
    """How well one class (or all of them) kept its queue-time promise."""

    requests: int = 0
    kept: int = 0
    overrun_max_s: float = 0.0

    @property
    def attainment(self) -> float:
        return self.kept / self.requests if self.requests else 1.0

    def add(self, waited_s: float, max_queue_s: int) -> Promise:
        over = waited_s - max_queue_s if max_queue_s > 0 else 0.0
        return Promise(
            self.requests + 1,
            self.kept + (over <= 0),
            max(self.overrun_max_s, over),
        )


def promises(
    waits: Iterable[tuple[str, float]], max_queue_s: Mapping[str, int]
) -> tuple[Promise, dict[str, Promise]]:
    """Return the promise kept over all requests and per class, from (class, seconds
    waited until its first start) pairs; classes not in `max_queue_s` promise nothing."""
    overall = Promise()
    by_class: dict[str, Promise] = {}
    for cls, waited in waits:
        limit = max_queue_s.get(cls, 0)
        overall = overall.add(waited, limit)
        by_class[cls] = by_class.get(cls, Promise()).add(waited, limit)
    return overall, dict(sorted(by_class.items()))
