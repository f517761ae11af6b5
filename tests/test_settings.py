from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    dropped = ("DEBUG", "SECRET_KEY", "SECURE_COOKIES", "DJANGO_ALLOW_ASYNC_UNSAFE")
    base = {k: v for k, v in os.environ.items() if k not in dropped}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_it_passes_check_deploy_with_production_settings(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("x" * 30 + "-a-long-random-production-secret-" + "y" * 20)
    result = _manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        SECRET_KEY_FILE=str(secret),
        SECURE_COOKIES="true",
        DEBUG="false",
        ALLOWED_HOSTS="gpu.example.com",
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_it_refuses_a_bad_boolean_with_one_clear_line() -> None:
    result = _manage("check", DEBUG="maybe")
    assert result.returncode != 0
    assert "DEBUG must be true or false" in result.stderr


def test_it_reads_secrets_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from portal import settings as s

    path = tmp_path / "token"
    path.write_text("s3cret\n")
    monkeypatch.setenv("NODE_AGENT_TOKEN_FILE", str(path))
    assert s.env("NODE_AGENT_TOKEN") == "s3cret"


def test_tests_hash_passwords_fast() -> None:
    """PBKDF2's rounds were 82 % of each test's setup; tests/conftest.py switches to MD5."""
    from django.contrib.auth.hashers import get_hasher

    assert get_hasher().algorithm == "md5"


def test_the_production_settings_keep_a_slow_hasher() -> None:
    result = _manage(
        "shell",
        "-c",
        "from django.contrib.auth.hashers import get_hasher; print(get_hasher().algorithm)",
    )
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.strip().splitlines()[-1].startswith(("pbkdf2", "argon2", "bcrypt", "scrypt"))
    )


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("CHECKPOINT_ACCESS_MODE", "ReadOnlyMany", "CHECKPOINT_ACCESS_MODE must be"),
        ("CHECKPOINT_SIZE", "lots", "CHECKPOINT_SIZE must be a quantity"),
    ],
)
def test_it_refuses_bad_checkpoint_storage_settings(name: str, value: str, says: str) -> None:
    result = _manage("check", **{name: value})
    assert result.returncode != 0
    assert says in result.stderr


def test_it_refuses_an_unknown_gang_api() -> None:
    result = _manage("check", K8S_GANG_API="jobsets")
    assert result.returncode != 0
    assert "K8S_GANG_API must be auto, jobs or jobset, not 'jobsets'" in result.stderr


def test_it_refuses_two_ways_to_authenticate_to_prometheus() -> None:
    result = _manage(
        "check", PROMETHEUS_BEARER_TOKEN_FILE="/var/run/token", PROMETHEUS_USERNAME="portal"
    )
    assert result.returncode != 0
    assert "PROMETHEUS_BEARER_TOKEN_FILE or PROMETHEUS_USERNAME" in result.stderr
