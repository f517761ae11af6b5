"""What a proposed change would have done to this site's own history.

    python manage.py whatif --json --days 7 --set quota.vision.a100-train=24 \\
        --set policy.preempt_after_s=120

Replays the requests of the last N days under the current settings and under the
proposed ones (`--set KEY=VALUE`, repeatable; keys in scheduling/whatif.py and
docs/capacity.md) through the same `schedule()`, and prints
`{"current": {...}, "proposed": {...}, "teams": {...}}`. Nothing is changed.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduling.whatif import SettingError


def parse_sets(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"--set {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


class Command(BaseCommand):
    help = "Replay the site's recent history under current and proposed settings."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--days", type=int, default=7, help="how many days of history")
        parser.add_argument(
            "--set",
            action="append",
            default=[],
            dest="sets",
            metavar="KEY=VALUE",
            help="a proposed setting (repeatable), e.g. quota.vision.a100-train=24",
        )
        parser.add_argument(
            "--tick-s", type=float, default=60.0, help="replay tick period, seconds"
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        from portal.tick import whatif

        if not 1 <= opts["days"] <= 365:
            raise CommandError("--days must be between 1 and 365")
        if not opts["tick_s"] > 0:
            raise CommandError("--tick-s must be more than 0")
        sets = parse_sets(opts["sets"])
        try:
            result = whatif.run(days=opts["days"], settings=sets, tick_s=opts["tick_s"])
        except SettingError as exc:
            raise CommandError(f"--set {exc}") from None
        if opts["json"]:
            self.stdout.write(json.dumps(result, sort_keys=True))
            return
        for side in ("current", "proposed"):
            row = result[side]
            self.stdout.write(
                f"{side}: wait p50 {row['wait_p50_s']} s, p95 {row['wait_p95_s']} s, "
                f"max {row['wait_max_s']} s; utilization {row['utilization_pct']} %; "
                f"preemptions {row['preemptions']}; GPU-hours lost {row['gpu_hours_lost']}"
            )
