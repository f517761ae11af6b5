"""The first-stage audit of the cluster: hardware, drivers, current usage per team, and who
needs what (pending demand). docs/lifecycle.md."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from portal.selectors.handover import audit, audit_text


class Command(BaseCommand):
    help = "Print the cluster audit: hardware, drivers, usage per team, pending demand."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--format", choices=["text", "json"], default="text")
        parser.add_argument("--pool", default="", help="only this pool")

    def handle(self, *args: Any, format: str, pool: str, **options: Any) -> None:
        data = audit()
        if pool:
            if pool not in {h["pool"] for h in data["hardware"]}:
                raise CommandError(f"--pool: no pool named {pool!r}")
            data = {
                "hardware": [h for h in data["hardware"] if h["pool"] == pool],
                "drivers": {pool: data["drivers"][pool]},
                "usage": [u for u in data["usage"] if u["pool"] == pool],
                "pending": [p for p in data["pending"] if p["pool"] == pool],
            }
        if format == "json":
            self.stdout.write(json.dumps(data, indent=2, sort_keys=True))
        else:
            self.stdout.write(audit_text(data), ending="")
