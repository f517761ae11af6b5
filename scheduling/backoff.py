"""Requeue delays for preempted and node-lost requests, a pure helper for the portal.

Plain arithmetic on numbers the caller passes in; nothing here reads a clock or draws a
random number, so the same arguments always give the same answer. Usage decay lives in
`scheduling.usage_decay`.
"""

from __future__ import annotations


def requeue_delay_s(attempt: int, base_s: int, cap_s: int, jitter: float) -> float:
    """Return how long a preempted or node-lost request waits before it may start again.

    Kueue's rule: `base · 2^(n-1) + jitter`, capped at `cap_s`,
    where `n` is the attempt that just ended (1 for the first). The caller draws
    `jitter` (seconds, e.g. `random.uniform(0, base_s / 10)`) so that this stays pure;
    requeues of many attempts at once then spread out instead of stampeding.

    >>> [requeue_delay_s(n, 60, 3600, 0.0) for n in (1, 2, 3, 7, 50)]
    [60.0, 120.0, 240.0, 3600.0, 3600.0]
    """
    if base_s < 0 or cap_s < 0 or jitter < 0:
        raise ValueError("base_s, cap_s and jitter must not be negative")
    n = max(attempt, 1)
    # 2^63 s is far past any cap: stop doubling before floats overflow.
    exponent = min(n - 1, 63)
    return float(min(base_s * 2.0**exponent + jitter, float(cap_s)))
