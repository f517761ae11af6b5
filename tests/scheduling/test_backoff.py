from __future__ import annotations

import unittest

from scheduling.backoff import requeue_delay_s
from scheduling.usage_decay import decay_usage, interval_usage


class RequeueDelayTest(unittest.TestCase):
    def test_it_doubles_from_base_up_to_the_cap(self) -> None:
        cases = {
            "first attempt": ((1, 60, 3600, 0.0), 60.0),
            "second attempt": ((2, 60, 3600, 0.0), 120.0),
            "third with jitter": ((3, 60, 3600, 5.5), 245.5),
            "capped": ((7, 60, 3600, 0.0), 3600.0),
            "capped with jitter": ((7, 60, 3600, 9.0), 3600.0),
            "huge attempt": ((10_000, 60, 3600, 0.0), 3600.0),
            "attempt 0 counts as 1": ((0, 60, 3600, 0.0), 60.0),
        }
        for name, (args, want) in cases.items():
            with self.subTest(name):
                self.assertEqual(requeue_delay_s(*args), want)

    def test_it_refuses_negative_inputs(self) -> None:
        with self.assertRaises(ValueError):
            requeue_delay_s(1, -1, 10, 0.0)


class DecayTest(unittest.TestCase):
    def test_it_halves_every_half_life(self) -> None:
        cases = {
            "no time": ((1000, 0, 60), 1000),
            "one half-life": ((1000, 60_000, 60), 500),
            "two half-lives": ((1000, 120_000, 60), 250),
            "no half-life forgets": ((1000, 1, 0), 0),
        }
        for name, (args, want) in cases.items():
            with self.subTest(name):
                self.assertEqual(decay_usage(*args), want)

    def test_interval_usage_matches_the_integral(self) -> None:
        # Holding 1000 milli for a very short while just now counts almost fully.
        self.assertAlmostEqual(interval_usage(1000, 0, 1000, 1000, 3600), 1000, delta=1)
        # One half-life ago, for one second: about half.
        self.assertAlmostEqual(interval_usage(1000, 0, 1000, 3_601_000, 3600), 500, delta=1)
        # Folding in steps gives the same as one step.
        whole = interval_usage(1000, 0, 7_200_000, 7_200_000, 3600)
        first = interval_usage(1000, 0, 3_600_000, 3_600_000, 3600)
        folded = decay_usage(first, 3_600_000, 3600) + interval_usage(
            1000, 3_600_000, 7_200_000, 7_200_000, 3600
        )
        self.assertAlmostEqual(folded, whole, delta=2)
