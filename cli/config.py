"""Where `qm` finds the portal and its token: QM_URL / QM_TOKEN, else the user's config file.

The file is `$XDG_CONFIG_HOME/quartermaster/config` (`~/.config/...` by default), an INI file
with one `[default]` section, written readable by its owner only (0600): it holds a secret.
"""

from __future__ import annotations

import configparser
import os
from dataclasses import dataclass
from pathlib import Path

SECTION = "default"


@dataclass(frozen=True)
class Settings:
    url: str
    token: str


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "quartermaster" / "config"


def load() -> Settings:
    """The stored settings, each overridden by its environment variable when that is set."""
    parser = configparser.ConfigParser()
    parser.read(config_path())
    stored = parser[SECTION] if parser.has_section(SECTION) else {}
    url = os.environ.get("QM_URL") or stored.get("url", "")
    token = os.environ.get("QM_TOKEN") or stored.get("token", "")
    return Settings(url=url.rstrip("/"), token=token)


def save(settings: Settings) -> Path:
    """Write the file with mode 0600 (created so: never readable by others, even for a moment)."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    parser = configparser.ConfigParser()
    parser[SECTION] = {"url": settings.url, "token": settings.token}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    # An existing file keeps its mode on open: set it again.
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        parser.write(f)
    return path
