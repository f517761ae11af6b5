"""Printing what the portal answered: a table for people, JSON or YAML for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

FORMATS = ("table", "json", "yaml")
#: a pipe or a file gets whole lines, not lines cut to 80 columns
WIDTH_NOT_A_TERMINAL = 250


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else WIDTH_NOT_A_TERMINAL
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def dump(data: Any, fmt: str) -> None:
    """Print `data` as JSON or YAML (the portal's own field names)."""
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), nl=False)


def table(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[tuple[str, Callable[[dict[str, Any]], Any]]],
    *,
    empty: str = "",
) -> None:
    """A table of `rows`: each column a heading and how to get its cell from a row."""
    out = console()
    if not rows and empty:
        out.print(Text(empty))
        return
    t = Table(box=None, pad_edge=False, header_style="bold")
    for heading, _ in columns:
        t.add_column(heading, overflow="fold")
    for row in rows:
        # Text, not markup: a name like "[a]" is printed as it is.
        t.add_row(*(Text("" if (v := cell(row)) is None else str(v)) for _, cell in columns))
    out.print(t)


def when(value: str | None) -> str:
    """An ISO time from the API as local "YYYY-MM-DD HH:MM" ("" for none)."""
    if not value:
        return ""
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    return at.astimezone().strftime("%Y-%m-%d %H:%M")


def duration(seconds: int) -> str:
    """Seconds in words: "0s", "42s", "5m 3s", "2h 5m", "3d 4h"."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def asks(row: dict[str, Any]) -> str:
    """What a request asks for: "2x8 whole" is a gang of two pods of eight whole GPUs each."""
    pods = int(row.get("pods") or 1)
    count = row.get("count", 1)
    profile = row.get("profile", "")
    return f"{pods}x{count} {profile}" if pods > 1 else f"{count} {profile}"
