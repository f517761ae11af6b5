"""`config export` and `config apply -f FILE [--dry-run] [--prune]`: the site's policy as code."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from django.core.management.base import BaseCommand, CommandError, CommandParser

from portal.lib.config import ConfigError, parse
from portal.services.config import config_apply, config_document


class Command(BaseCommand):
    help = (
        "Export the site's pools, classes, teams, quotas and scheduling profile, or apply a file."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("export", help="print the site as one YAML document")
        apply = sub.add_parser("apply", help="make the database match a file")
        apply.add_argument("-f", "--file", required=True, help="the YAML file ('-' reads stdin)")
        apply.add_argument("--dry-run", action="store_true", help="print the diff, change nothing")
        apply.add_argument(
            "--prune",
            action="store_true",
            help="retire pools, classes and teams the file leaves out; zero the quotas it leaves out",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "export":
            self.stdout.write(
                "# Quartermaster site configuration (schema: portal/lib/config_schema.json)\n"
                + yaml.safe_dump(config_document(), sort_keys=False),
                ending="",
            )
            return
        source = options["file"]
        try:
            text = sys.stdin.read() if source == "-" else Path(source).read_text()
        except OSError as exc:
            raise CommandError(f"{source}: {exc}") from None
        try:
            changes = config_apply(
                doc=parse(text, source), dry_run=options["dry_run"], prune=options["prune"]
            )
        except ConfigError as exc:
            raise CommandError(
                f"{source} is refused; nothing was changed:\n  " + "\n  ".join(exc.errors)
            ) from None
        for change in changes:
            for line in change.lines():
                self.stdout.write(line)
        made = [c for c in changes if not c.action.startswith("not in")]
        verb = "would change" if options["dry_run"] else "changed"
        self.stdout.write(f"{len(made) or 'no'} change(s); {verb}." if made else "No changes.")
