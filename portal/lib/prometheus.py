"""A small client of Prometheus's HTTP API (/api/v1/query and /api/v1/query_range), with the
ways a Prometheus, Thanos or Mimir in front of a cluster asks to be called: a bearer token
read from a file at each call (projected service account tokens rotate), basic auth, a CA
bundle for its certificate, and extra headers such as Mimir's `X-Scope-OrgID` tenant.
Queries are POSTed as a form, so a long selector (a pool's node names) fits."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any


class PrometheusError(Exception):
    pass


def parse_headers(text: str) -> tuple[tuple[str, str], ...]:
    """`Name=value,Other=value` as header pairs; raises ValueError naming a bad item."""
    out = []
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not all(c.isalnum() or c in "-_" for c in name):
            raise ValueError(f"{item.strip()!r} is not Name=value")
        out.append((name, value))
    return tuple(out)


@dataclass
class Prometheus:
    url: str
    timeout_s: float = 5.0
    #: read at every call: a rotated token is picked up without a restart
    bearer_token_file: str = ""
    username: str = ""
    password: str = ""
    #: a PEM bundle to verify the server's certificate with (empty: the system's)
    ca_file: str = ""
    headers: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def _auth_headers(self) -> dict[str, str]:
        out = dict(self.headers)
        if self.bearer_token_file:
            try:
                token = Path(self.bearer_token_file).read_text().strip()
            except OSError as exc:
                raise PrometheusError(f"bearer token file: {exc}") from exc
            out["Authorization"] = f"Bearer {token}"
        elif self.username:
            pair = f"{self.username}:{self.password}".encode()
            out["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        return out

    def _context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https:"):
            return None
        try:
            return ssl.create_default_context(cafile=self.ca_file or None)
        except (OSError, ssl.SSLError) as exc:
            raise PrometheusError(f"CA bundle {self.ca_file}: {exc}") from exc

    def _post(self, path: str, params: dict[str, str]) -> Any:
        req = urllib.request.Request(  # noqa: S310 - the configured Prometheus URL
            f"{self.url.rstrip('/')}{path}",
            data=urllib.parse.urlencode(params).encode(),
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                **self._auth_headers(),
            },
            method="POST",
        )
        try:
            with urllib.request.urlopen(  # noqa: S310
                req, timeout=self.timeout_s, context=self._context()
            ) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise PrometheusError(f"{path}: HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise PrometheusError(f"{path}: {exc}") from exc
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error", "failed") if isinstance(body, dict) else "failed"
            raise PrometheusError(f"{path}: {error}")
        return body["data"]

    def query(self, expr: str, at: datetime | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at.timestamp():.3f}"
        return list(self._post("/api/v1/query", params)["result"])

    def query_range(
        self, expr: str, start: datetime, end: datetime, step_s: int
    ) -> list[dict[str, Any]]:
        params = {
            "query": expr,
            "start": f"{start.timestamp():.3f}",
            "end": f"{end.timestamp():.3f}",
            "step": str(step_s),
        }
        return list(self._post("/api/v1/query_range", params)["result"])
