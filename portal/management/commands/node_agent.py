"""`manage.py node_agent`: report this node's GPUs to the portal (see portal/node_agent.py).

    manage.py node_agent --portal URL --node NAME --interval S [--once] [--print]

The token is NODE_AGENT_TOKEN (or NODE_AGENT_TOKEN_FILE) from the environment,
else settings.NODE_AGENT_TOKEN. The chart runs `python -m portal.node_agent`
instead, which takes the same options and needs no Django settings, so GPU
nodes hold no database credentials.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from portal import node_agent


class Command(BaseCommand):
    help = "Read every GPU on this node through NVML and report it to the portal."

    def add_arguments(self, parser: CommandParser) -> None:
        node_agent.build_parser(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        token = node_agent.token_from_env() or getattr(settings, "NODE_AGENT_TOKEN", "")
        rc = node_agent.run(
            portal=options["portal"],
            node=options["node"] or "localhost",
            token=token,
            interval_s=options["interval"],
            once=options["once"],
            print_only=options["print_only"],
            out=self.stdout,
        )
        if rc:
            raise CommandError(f"node agent stopped with exit code {rc}")
