"""Personal access token secrets: how one is made, recognised and hashed.

A secret is `qm_` and 43 URL-safe characters (256 random bits), so a leaked one is
recognisable in logs and by secret scanners; the database keeps only its sha256.
"""

from __future__ import annotations

import hashlib
import secrets

SECRET_PREFIX = "qm_"
#: how much of a secret is kept and shown to tell tokens apart (`qm_` and 8 characters)
SHOWN_CHARS = 11


def token_secret_new() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def token_digest(secret: str) -> str:
    """The stored form of a secret. A plain sha256 suffices: the secret is high-entropy, so
    no dictionary or salt matters, and a lookup by digest stays one index probe."""
    return hashlib.sha256(secret.encode()).hexdigest()


def token_shown(secret: str) -> str:
    return secret[:SHOWN_CHARS]
