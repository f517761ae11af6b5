"""The Prometheus client authenticates as configured (PROMETHEUS_* settings): a bearer token
file re-read at each query, basic auth, a CA bundle for an https URL, extra headers such as
a tenant's `X-Scope-OrgID`, checked by a tiny local HTTPS server with a self-signed
certificate."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from portal.lib.prometheus import PrometheusError, parse_headers
from portal.services import prometheus
from tests.tls import self_signed

ANSWER = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An https endpoint answering /api/v1/query; `seen` holds each request's headers and body."""
    d = tmp_path_factory.mktemp("prom-tls")
    cert, key = self_signed(d, "127.0.0.1")
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
            seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
            data = ANSWER.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield {"url": f"https://127.0.0.1:{httpd.server_address[1]}", "ca": str(cert), "seen": seen}
    finally:
        httpd.shutdown()


def _query(server: dict[str, Any], **settings: Any) -> dict[str, str]:
    server["seen"].clear()
    with override_settings(
        PROMETHEUS_URL=server["url"], PROMETHEUS_CA_FILE=server["ca"], **settings
    ):
        client = prometheus.client()
        assert client is not None
        assert client.query('up{job="x"}') == []
    (req,) = server["seen"]
    assert req["path"] == "/api/v1/query" and "query=up%7Bjob%3D%22x%22%7D" in req["body"]
    return {k.lower(): v for k, v in req["headers"].items()}


def test_a_bearer_token_file_is_read_at_each_query(server: dict[str, Any], tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first-token\n")
    headers = _query(server, PROMETHEUS_BEARER_TOKEN_FILE=str(token))
    assert headers["authorization"] == "Bearer first-token"
    token.write_text("rotated-token")
    headers = _query(server, PROMETHEUS_BEARER_TOKEN_FILE=str(token))
    assert headers["authorization"] == "Bearer rotated-token"


def test_basic_auth_and_extra_headers(server: dict[str, Any]) -> None:
    headers = _query(
        server,
        PROMETHEUS_USERNAME="portal",
        PROMETHEUS_PASSWORD="s3cret:pw",
        PROMETHEUS_HEADERS="X-Scope-OrgID=gpu-cluster, X-Extra=a b",
    )
    assert headers["authorization"] == "Basic " + base64.b64encode(b"portal:s3cret:pw").decode()
    assert headers["x-scope-orgid"] == "gpu-cluster" and headers["x-extra"] == "a b"


def test_without_the_ca_bundle_the_self_signed_server_is_refused(server: dict[str, Any]) -> None:
    with override_settings(PROMETHEUS_URL=server["url"], PROMETHEUS_CA_FILE=""):
        client = prometheus.client()
        assert client is not None
        with pytest.raises(PrometheusError, match="CERTIFICATE_VERIFY_FAILED"):
            client.query("up")
    with override_settings(PROMETHEUS_URL=server["url"], PROMETHEUS_CA_FILE="/nonexistent.pem"):
        client = prometheus.client()
        assert client is not None
        with pytest.raises(PrometheusError, match="CA bundle"):
            client.query("up")


def test_a_bad_header_setting_names_itself() -> None:
    assert parse_headers("") == ()
    with pytest.raises(ValueError, match="'no-equals' is not Name=value"):
        parse_headers("X-Scope-OrgID=a,no-equals")
    bad = override_settings(PROMETHEUS_URL="http://127.0.0.1:9", PROMETHEUS_HEADERS="Bad Name=1")
    with bad, pytest.raises(ImproperlyConfigured, match="PROMETHEUS_HEADERS"):
        prometheus.client()
