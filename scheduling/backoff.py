"""Pure helpers the portal uses around a tick: requeue delays and usage decay.

Both are plain arithmetic on numbers the caller passes in; nothing here reads a clock
or draws a random number, so the same arguments always give the same answer.
"""

from __future__ import annotations

import math

#: ln 2, the area under a half-life curve is `half_life / ln 2`
LN2 = math.log(2)


def requeue_delay_s(attempt: int, base_s: int, cap_s: int, jitter: float) -> float:
    """Return how long a preempted or node-lost request waits before it may start again.

    Kueue's rule (RELIABILITY.md §2): `base · 2^(n-1) + jitter`, capped at `cap_s`,
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


def decay_usage(usage_milli_s: int, elapsed_ms: int, half_life_s: int) -> int:
    """Return usage recorded `elapsed_ms` ago as it counts now: halved every `half_life_s`.

    A half-life of 0 forgets everything at once; negative elapsed time counts as 0.
    """
    if half_life_s <= 0:
        return 0 if elapsed_ms > 0 else usage_milli_s
    if elapsed_ms <= 0:
        return usage_milli_s
    return int(usage_milli_s * 0.5 ** (elapsed_ms / (half_life_s * 1000)))


def interval_usage(milli: int, start_ms: int, end_ms: int, now_ms: int, half_life_s: int) -> int:
    """Return the decayed usage (milli-GPU-seconds) of holding `milli` from start to end, seen at now.

    This is the exact integral of `milli · 2^(-(now - t) / half_life)` over the interval,
    so an attempt's accounting row can be folded into a team's decayed usage in one step
    however long it ran: `decay_usage(old, now - as_of, h) + interval_usage(...)`.
    """
    end_ms = min(end_ms, now_ms)
    if end_ms <= start_ms or milli <= 0 or half_life_s <= 0:
        return 0
    h_ms = half_life_s * 1000
    late = 0.5 ** (max(now_ms - end_ms, 0) / h_ms)
    early = 0.5 ** (max(now_ms - start_ms, 0) / h_ms)
    return int(milli * (half_life_s / LN2) * (late - early))
