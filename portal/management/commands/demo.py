from __future__ import annotations

import random
from typing import Any

from django.core.management.base import BaseCommand

from portal.demo.lifecycle import start_demo_rollouts
from portal.demo.seed import seed, submit_burst, submit_synthetic


class Command(BaseCommand):
    help = "Create the demo pools, teams, users and a few requests (safe to run twice)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--requests", type=int, default=6, help="synthetic requests to submit now"
        )
        parser.add_argument(
            "--no-rollouts",
            action="store_true",
            help="do not start the demo driver rollouts (docs/lifecycle.md)",
        )
        parser.add_argument(
            "--burst",
            type=int,
            default=0,
            help="whole-node requests for the autoscaled pool h100-burst: more than it holds",
        )

    def handle(
        self, *args: Any, requests: int, no_rollouts: bool, burst: int, **options: Any
    ) -> None:
        info = seed()
        rng = random.Random(7)
        submitted = sum(submit_synthetic(rng=rng) for _ in range(requests))
        submitted += submit_burst(requests=burst)
        if not no_rollouts:
            for r in start_demo_rollouts():
                self.stdout.write(f"rollout {r.pk} started: /ops/rollouts/{r.pk}/")
        self.stdout.write(
            f"demo ready: users {', '.join(info['users'])} (password {info['password']}); {submitted} requests submitted"
        )
