"""Write docs/metrics.md from code (portal/metrics/catalog.py); --check: fail if stale."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from portal.metrics import catalog


class Command(BaseCommand):
    help = "Generate docs/metrics.md: every series, its labels and meaning, the alerts using it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--check", action="store_true", help="fail if docs/metrics.md is stale")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            # The exporter declares its families as it reads the (empty or not) database.
            text = catalog.render()
        except DatabaseError as exc:
            raise CommandError(f"cannot read the database ({exc}): run manage.py migrate") from None
        path = catalog.DOC
        if opts["check"]:
            current = path.read_text() if path.exists() else ""
            if current != text:
                raise CommandError(f"{path.name} is stale: run python manage.py metrics_catalog")
            self.stdout.write(f"{path.name} is current")
            return
        path.write_text(text)
        self.stdout.write(f"wrote {path}")
