"""`Shape` keeps its hash: equal shapes hash alike, and a copy made in another way
(pickled, replaced, copied) hashes as one built directly."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import unittest
import unittest.mock
from typing import Any

import scheduling.types
from scheduling.types import ProfileKind, Shape, Taint


def _shape(**kw: object) -> Shape:
    base: dict[str, object] = {
        "kind": ProfileKind.SHARED,
        "count": 2,
        "milli": 500,
        "gpu_memory_mib": 8192,
        "cpu_milli": 4000,
        "memory_mib": 16384,
        "gpu_models": frozenset({"NVIDIA-H100-80GB-HBM3"}),
        "tolerations": (Taint("nvidia.com/gpu", "present", "NoSchedule"),),
        "pods": 2,
        "placement": "spread",
    }
    base.update(kw)
    return Shape(**base)  # type: ignore[arg-type]


class ShapeHashTest(unittest.TestCase):
    def test_equal_shapes_hash_alike_and_every_compared_field_counts(self) -> None:
        a, b = _shape(), _shape()
        self.assertEqual(a, b)
        self.assertEqual(hash(a), hash(b))
        for f in dataclasses.fields(Shape):
            if not f.compare:
                continue
            other = dataclasses.replace(a, **{f.name: _other(getattr(a, f.name))})
            with self.subTest(field=f.name):
                self.assertNotEqual(other, a)
                self.assertNotEqual(hash(other), hash(a))
                self.assertEqual(hash(other), hash(dataclasses.replace(other)))

    def test_pickle_and_copy_rebuild_the_shape(self) -> None:
        a = _shape()
        for b in (pickle.loads(pickle.dumps(a)), copy.copy(a), copy.deepcopy(a)):
            self.assertEqual(b, a)
            self.assertEqual(hash(b), hash(a))
            self.assertEqual(b.gpus_milli, a.gpus_milli)
        self.assertEqual({a: 1}[pickle.loads(pickle.dumps(a))], 1)

    def test_equal_shapes_share_a_number_and_stay_equal_across_a_clear(self) -> None:
        a, b = _shape(), _shape()
        self.assertEqual(a.number, b.number)
        c = dataclasses.replace(a, count=a.count + 1)
        self.assertNotEqual(c.number, a.number)
        with unittest.mock.patch.object(scheduling.types, "_SHAPE_NUMBERS", {}):
            after = _shape()  # the table started over: a number of its own
            other = dataclasses.replace(c)
        self.assertNotEqual(after.number, a.number)
        self.assertEqual(after, a)
        self.assertEqual(a, after)
        self.assertEqual({a: 1}[after], 1)
        self.assertNotEqual(other.number, c.number)
        self.assertEqual(other, c)
        self.assertNotEqual(after, c)
        self.assertNotEqual(a, other)


def _other(value: object) -> Any:
    if isinstance(value, ProfileKind):
        return ProfileKind.WHOLE if value is not ProfileKind.WHOLE else ProfileKind.SHARED
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, frozenset):
        return value | {"other"}
    if isinstance(value, tuple):
        return (*value, Taint("other", "", "NoExecute"))
    raise AssertionError(f"no other value for {value!r}")
