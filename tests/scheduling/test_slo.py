"""The queue-time promise (`scheduling.slo`), as the replay and the portal measure it."""

from __future__ import annotations

import unittest

from scheduling.slo import Promise, promises


class PromiseTest(unittest.TestCase):
    def test_it_counts_a_wait_of_exactly_the_promise_as_kept(self) -> None:
        overall, by_class = promises([("a", 60.0), ("a", 61.5)], {"a": 60})
        self.assertEqual(overall, Promise(2, 1, 1.5))
        self.assertEqual(overall.attainment, 0.5)
        self.assertEqual(by_class, {"a": Promise(2, 1, 1.5)})

    def test_a_class_without_a_maximum_queue_time_promises_nothing(self) -> None:
        overall, by_class = promises([("batch", 10**6)], {"batch": 0})
        self.assertEqual(overall.attainment, 1.0)
        self.assertEqual(by_class["batch"].overrun_max_s, 0.0)

    def test_no_requests_kept_every_promise(self) -> None:
        overall, by_class = promises([], {"a": 60})
        self.assertEqual((overall.attainment, overall.overrun_max_s, by_class), (1.0, 0.0, {}))
