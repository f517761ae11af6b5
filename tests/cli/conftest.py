"""`qm` against a live test server: real HTTP, a real token, the portal's own answers."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from django.db import connection

from cli import main as qm_main
from portal.selectors import requests as request_selectors
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick
from tests.base import World, api_secret, make_world


@dataclass
class Qm:
    """Runs `qm` in-process as a user of the live server."""

    url: str
    token: str
    config_home: Path

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "QM_URL": self.url,
            "QM_TOKEN": self.token,
            "XDG_CONFIG_HOME": str(self.config_home),
            **extra,
        }

    def __call__(self, *args: str, input: str | None = None, **env: str) -> Result:
        return CliRunner().invoke(qm_main.cli, list(args), env=self.env(**env), input=input)

    def json(self, *args: str) -> Any:
        result = self(*args, "-o", "json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)


@pytest.fixture
def world(transactional_db: Any) -> World:
    return make_world()


@pytest.fixture
def as_user(live_server: Any, tmp_path: Path) -> Callable[[Any], Qm]:
    def make(user: Any) -> Qm:
        secret = api_secret(user)
        home = tmp_path / f"config-{user.username}"
        return Qm(url=live_server.url, token=secret, config_home=home)

    return make


@pytest.fixture
def qm(world: World, as_user: Callable[[Any], Qm]) -> Qm:
    """`qm` as bob, a member of vision."""
    return as_user(world.bob)


@pytest.fixture(autouse=True)
def _quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line and the followed log poll every 0.1 s, not every 2 s."""
    monkeypatch.setattr(qm_main, "POLL_S", 0.1)
    monkeypatch.setattr(qm_main, "FIRST_DECISION_S", 2.0)
    monkeypatch.setattr(request_selectors, "LOG_FOLLOW_POLL_S", 0.1)


@pytest.fixture
def beat() -> Iterator[Callable[[Callable[[], None] | None], None]]:
    """Runs the tick and the reconciler in the background, as Celery beat would, until the
    test ends; `start(also)` also calls `also()` at each beat."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(also: Callable[[], None] | None = None) -> None:
        def loop() -> None:
            try:
                while not stop.wait(0.2):
                    run_tick()
                    reconcile()
                    if also is not None:
                        also()
            finally:
                connection.close()

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        threads.append(t)

    yield start
    stop.set()
    for t in threads:
        t.join(timeout=10)
