"""Decayed usage: past GPU use that counts less the older it is (Slurm's fair-share decay).

A team's usage is kept as one number, "milli-GPU-seconds decayed to time `as_of`": every
`half_life_s` it halves. `decay_usage` moves such a number on in time; `interval_usage`
is the exact decayed integral of holding `milli` over an interval, so an attempt can be
folded in in one step however long it ran:

    usage_now = decay_usage(old, now - as_of, h) + interval_usage(milli, start, end, now, h)

`scheduling.queue` turns it into a share of what the cluster could give in one half-life
(`history_share_ppm`); the portal keeps `TeamUsage.decayed_milli_s` this way per attempt.
Pure arithmetic: no clock, no randomness.
"""

from __future__ import annotations

import math

#: ln 2, the area under a half-life curve is `half_life / ln 2`
LN2 = math.log(2)


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
