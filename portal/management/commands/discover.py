"""`discover`: the cluster's GPU nodes grouped by their GPU labels, flagged, with proposed pools.

python manage.py discover            # the groups, the flags, and the proposals as YAML
python manage.py discover --yaml > pools.yaml && python manage.py config apply -f pools.yaml
"""

from __future__ import annotations

from typing import Any

import yaml
from django.core.management.base import BaseCommand, CommandParser

from portal.selectors.discovery import GROUP_LABELS, discovery, proposals_document


class Command(BaseCommand):
    help = "List GPU nodes by what GPU Feature Discovery labels, and propose pools."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--yaml", action="store_true", help="print only the proposed pools, as a config file"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        groups = discovery()
        proposals = proposals_document(groups)
        if options["yaml"]:
            self.stdout.write(yaml.safe_dump(proposals, sort_keys=False), ending="")
            return
        if not groups:
            self.stdout.write("No nodes with NVIDIA GPUs.")
        for g in groups:
            described = ", ".join(
                f"{k.split('/')[-1]}={g.labels[k]}" for k in GROUP_LABELS if g.labels[k]
            )
            self.stdout.write(f"{len(g.nodes)} node(s), {g.gpus} GPU(s): {described}")
            for n in g.nodes:
                where = n.flag or f"pool {n.pools[0]}"
                self.stdout.write(f"    {n.name}  {n.gpus} GPU(s)  {where}")
        if proposals["pools"]:
            self.stdout.write("\nProposed pools (apply with `manage.py config apply -f FILE`):")
            self.stdout.write(yaml.safe_dump(proposals, sort_keys=False), ending="")
        else:
            self.stdout.write("Every GPU node is in exactly one pool.")
