"""The one fit rule (`scheduling.fit`): ever versus now, every dimension."""

from __future__ import annotations

import unittest
from dataclasses import replace

from scheduling import fit
from scheduling.types import Device, Node, Partitioning, ProfileKind, Shape, Taint


def gpu(i: int, model: str = "A100", part: Partitioning = Partitioning.EXCLUSIVE) -> Device:
    return Device(i, model, 80 * 1024, part)


NODE = Node("n1", "p", 64_000, 512 * 1024, tuple(gpu(i) for i in range(4)))


class FitTest(unittest.TestCase):
    def test_every_dimension(self) -> None:
        whole = Shape(count=4, cpu_milli=64_000, memory_mib=512 * 1024)
        cases = {
            "fits": (NODE, whole, True),
            "too many devices": (NODE, replace(whole, count=5), False),
            "too much CPU": (NODE, replace(whole, cpu_milli=64_001), False),
            "too much memory": (NODE, replace(whole, memory_mib=512 * 1024 + 1), False),
            "wrong model": (NODE, replace(whole, gpu_models=frozenset({"H100"})), False),
            "taint not tolerated": (replace(NODE, taints=(Taint("k", "v"),)), whole, False),
            "taint tolerated": (
                replace(NODE, taints=(Taint("k", "v"),)),
                replace(whole, tolerations=(Taint("k"),)),
                True,
            ),
            "PreferNoSchedule does not block": (
                replace(NODE, taints=(Taint("k", "v", "PreferNoSchedule"),)),
                whole,
                True,
            ),
            "shared needs time-slicing": (
                NODE,
                Shape(kind=ProfileKind.SHARED, count=1, milli=500),
                False,
            ),
            "MIG needs a known profile": (
                replace(NODE, devices=(gpu(0, "A100-80GB", Partitioning.MIG),)),
                Shape(kind=ProfileKind.MIG, count=2, mig_profile="3g.40gb"),
                True,
            ),
            "MIG profile the family lacks": (
                replace(NODE, devices=(gpu(0, "A100-80GB", Partitioning.MIG),)),
                Shape(kind=ProfileKind.MIG, count=1, mig_profile="9g.999gb"),
                False,
            ),
        }
        for name, (node, shape, want) in cases.items():
            with self.subTest(name):
                self.assertEqual(fit.can_ever_host(node, shape), want)

    def test_ever_ignores_passing_states_now_does_not(self) -> None:
        shape = Shape(count=4)
        down = replace(NODE, ready=False)
        sick = replace(NODE, devices=(*NODE.devices[:3], replace(NODE.devices[3], healthy=False)))
        for node in (down, replace(NODE, cordoned=True), sick):
            self.assertTrue(fit.can_ever_host(node, shape))
            self.assertFalse(fit.can_host_now(node, shape))

    def test_fits_free_counts_what_is_held(self) -> None:
        shape = Shape(count=2, memory_mib=100 * 1024)
        flags = fit.eligible_devices(NODE, shape)
        assert flags is not None
        self.assertTrue(fit.fits_free(NODE, shape, flags, {0: 1000, 1: 1000}))
        self.assertFalse(fit.fits_free(NODE, shape, flags, {0: 1000, 1: 1000, 2: 500}))
        self.assertFalse(fit.fits_free(NODE, shape, flags, {}, memory_held=420 * 1024))


if __name__ == "__main__":
    unittest.main()
