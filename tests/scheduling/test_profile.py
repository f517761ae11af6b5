"""Scheduling profiles: the shipped one holds every knob, and bad input names its key."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import tempfile
import tomllib
import unittest
from pathlib import Path

from scheduling import packer, profile
from scheduling.profile import ProfileError
from scheduling.types import Policy


class ShippedProfileTest(unittest.TestCase):
    def test_it_holds_every_knob_explicitly(self) -> None:
        data = tomllib.loads((profile.PROFILE_DIR / "default.toml").read_text())
        knobs = {f.name for f in dataclasses.fields(Policy)}
        self.assertEqual(set(data) - {"name", "version"}, knobs)
        self.assertEqual((data["name"], data["version"]), ("default", 7))

    def test_it_is_the_cores_defaults(self) -> None:
        # The core's defaults and the shipped profile never drift apart: what runs without a
        # profile (tests, a bare schedule() call) is what the portal and benchmarks run.
        shipped = profile.load().policy()
        self.assertEqual(shipped.packer, packer.DEFAULT_POLICY)
        self.assertEqual(dataclasses.replace(shipped, packer="default"), Policy())

    def test_it_round_trips(self) -> None:
        p = profile.load("default")
        self.assertEqual(profile.parse(p.dump()), p)
        self.assertEqual(profile.parse(tomllib.loads(p.to_toml())), p)


class ValidationTest(unittest.TestCase):
    def load_text(self, text: str) -> profile.Profile:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "mine.toml"
            path.write_text(text)
            return profile.load(str(path))

    def refused(self, data: dict[str, object]) -> ProfileError:
        with self.assertRaises(ProfileError) as caught:
            profile.parse(data)
        return caught.exception

    def test_it_loads_a_file_and_fills_missing_knobs_from_the_defaults(self) -> None:
        p = self.load_text('name = "tight"\nversion = 3\npreempt_after_s = 60\n')
        self.assertEqual((p.name, p.version), ("tight", 3))
        self.assertEqual(p.policy().preempt_after_s, 60)
        self.assertEqual(p.policy().max_reservations, Policy().max_reservations)

    def test_it_refuses_an_unknown_key_naming_it(self) -> None:
        exc = self.refused({"name": "x", "preempt_after": 60})
        self.assertEqual(exc.key, "preempt_after")
        self.assertIn("preempt_after", str(exc))

    def test_it_refuses_a_wrong_type_or_range_naming_the_key(self) -> None:
        cases = {
            "string for a number": ("preempt_after_s", "300"),
            "bool for a number": ("max_reservations", True),
            "fraction for a whole number": ("max_preemptions_per_tick", 1.5),
            "negative": ("reserve_after_s", -1),
            "above the range": ("escalate_after", 1.5),
            "below the minimum": ("reserve_min_devices", 0),
            "unknown packer": ("packer", "tetris"),
            "number for a string": ("packer", 3),
        }
        for name, (key, value) in cases.items():
            with self.subTest(name):
                self.assertEqual(self.refused({"name": "x", key: value}).key, key)

    def test_it_accepts_whole_floats_and_ints_for_fractions(self) -> None:
        p = profile.parse({"name": "x", "preempt_after_s": 60.0, "starvation_after": 2})
        self.assertEqual(p.knobs["preempt_after_s"], 60)
        self.assertIsInstance(p.knobs["preempt_after_s"], int)
        self.assertEqual(p.knobs["starvation_after"], 2.0)

    def test_it_refuses_bad_names_versions_and_files(self) -> None:
        self.assertEqual(self.refused({"name": "Bad Name"}).key, "name")
        self.assertEqual(self.refused({"version": 1}).key, "name")
        self.assertEqual(self.refused({"name": "x", "version": 0}).key, "version")
        with self.assertRaises(ProfileError) as caught:
            profile.load("no-such-profile")
        self.assertEqual(caught.exception.key, "profile")
        with self.assertRaises(ProfileError) as caught:
            self.load_text("name = \n")
        self.assertEqual(caught.exception.key, "profile")
        with self.assertRaises(ProfileError) as caught:
            self.load_text('name = "x"\nbogus = 1\n')
        self.assertEqual(caught.exception.key, "bogus")


class BenchmarkFlagTest(unittest.TestCase):
    def test_the_benchmarks_refuse_a_bad_profile_with_one_line(self) -> None:
        from scheduling.bench import replay, tick

        for main in (replay.main, tick.main):
            with self.subTest(main.__module__), contextlib.redirect_stderr(io.StringIO()) as err:
                with self.assertRaises(SystemExit) as caught:
                    main(["--profile", "no-such-profile"])
                self.assertEqual(caught.exception.code, 2)
                self.assertIn("no shipped profile 'no-such-profile'", err.getvalue())

    def test_the_tick_benchmark_runs_a_profile_file(self) -> None:
        from scheduling.bench import tick

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "eager.toml"
            path.write_text('name = "eager"\nversion = 2\npreempt_after_s = 0\n')
            with contextlib.redirect_stdout(io.StringIO()) as out:
                tick.main(["--json", "--pending", "20", "--gpus", "64", "--profile", str(path)])
        result = json.loads(out.getvalue())
        self.assertEqual(result["profile"], "eager v2")
        # one decision per pending request, plus any preemptions
        self.assertGreaterEqual(result["decisions"], 20)


if __name__ == "__main__":
    unittest.main()
