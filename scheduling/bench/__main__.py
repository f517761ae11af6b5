"""Dispatch `python -m scheduling.bench <name> [options]` to scheduling.bench.<name>.main."""

from __future__ import annotations

import importlib
import sys

COMMANDS = ("packing", "replay", "tick")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(
            f"usage: python -m scheduling.bench {{{','.join(COMMANDS)}}} [options]", file=sys.stderr
        )
        return 2
    module = importlib.import_module(f"scheduling.bench.{argv[0]}")
    result: int = module.main(argv[1:])
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
