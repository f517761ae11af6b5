"""Webhooks against local servers that try what an attacker would (issue 32, item 6):

- a resolver that answers a vetted address first and an internal one the second time (DNS
  rebinding): the delivery connects to the vetted address, the internal server hears nothing;
- https to the pinned address still sends the URL's host as SNI and in the Host header, and
  checks the certificate against it;
- a redirect to another host is refused; one to the same host (307/308) is followed;
- Slack gets `{"text": …}`, Teams Workflows a message with an Adaptive Card.

The servers listen on 127.0.0.1 ("the chat server", allowed by
NOTIFY_WEBHOOK_ALLOWED_NETWORKS) and 127.0.0.2 ("the internal service", never allowed).
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from portal.models import NotificationPreference
from portal.services import notify
from tests.base import World, make_world, submit
from tests.tls import self_signed

HOST = "hooks.example.test"
TEAMS_HOST = "prod-42.westeurope.logic.azure.com"


class _Server:
    """An HTTP(S) server in a thread that records what it receives and answers as told."""

    def __init__(self, address: str, port: int = 0, tls: ssl.SSLContext | None = None) -> None:
        self.received: list[dict[str, Any]] = []
        self.answer: Callable[[str], tuple[int, dict[str, str]]] = lambda path: (200, {})
        self.sni: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.received.append(
                    {"host": self.headers["Host"], "path": self.path, "body": json.loads(body)}
                )
                status, headers = outer.answer(self.path)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = HTTPServer((address, port), Handler)
        if tls is not None:
            tls.sni_callback = lambda sock, name, ctx: self.sni.append(name)  # type: ignore[assignment,misc]
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = int(self.httpd.server_port)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def chat(settings: Any) -> Iterator[_Server]:
    settings.NOTIFY_WEBHOOK_ALLOW_PRIVATE = False
    settings.NOTIFY_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    server = _Server("127.0.0.1")
    yield server
    server.close()


@pytest.fixture
def internal(chat: _Server) -> Iterator[_Server]:
    """An internal service on 127.0.0.2, on the chat server's port (what a rebinding aims at)."""
    server = _Server("127.0.0.2", chat.port)
    yield server
    server.close()


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Names the tests own resolve to the addresses listed, one answer per question (the last
    answer repeats); every other name resolves as usual. Returns the questions asked."""
    real = socket.getaddrinfo
    answers: dict[str, list[str]] = {}
    asked: dict[str, list[str]] = {"questions": []}

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host in answers:
            asked["questions"].append(host)
            queue = answers[host]
            address = queue.pop(0) if len(queue) > 1 else queue[0]
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 0)))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    asked["answers"] = answers  # type: ignore[assignment]
    return asked


def _answers(resolver: dict[str, Any]) -> dict[str, list[str]]:
    answers: dict[str, list[str]] = resolver["answers"]
    return answers


def test_a_dns_rebinding_reaches_only_the_vetted_address(
    chat: _Server, internal: _Server, resolver: dict[str, Any]
) -> None:
    _answers(resolver)[HOST] = ["127.0.0.1", "127.0.0.2"]
    url = f"http://{HOST}:{chat.port}/hooks/T1"
    assert notify.post_webhook(url, "hello") is True
    assert internal.received == []
    assert chat.received == [
        {"host": f"{HOST}:{chat.port}", "path": "/hooks/T1", "body": {"text": "hello"}}
    ]
    # One question, vetted and pinned: the rebinding answer was never asked for.
    assert resolver["questions"] == [HOST]


def test_a_host_with_any_internal_address_is_refused(
    chat: _Server, internal: _Server, resolver: dict[str, Any]
) -> None:
    _answers(resolver)[HOST] = ["127.0.0.2"]
    assert (
        notify.webhook_refused(f"http://{HOST}:{chat.port}/")
        == f"{HOST} is a private or local address"
    )
    assert notify.post_webhook(f"http://{HOST}:{internal.port}/", "hello") is False
    assert internal.received == [] and chat.received == []


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_host_is_refused(
    chat: _Server, internal: _Server, resolver: dict[str, Any], status: int
) -> None:
    _answers(resolver)[HOST] = ["127.0.0.1"]
    chat.answer = lambda path: (status, {"Location": f"http://127.0.0.2:{internal.port}/steal"})
    assert notify.post_webhook(f"http://{HOST}:{chat.port}/hooks/T1", "hello") is False
    assert len(chat.received) == 1
    assert internal.received == []


def test_a_redirect_to_the_same_host_is_followed_within_bounds(
    chat: _Server, resolver: dict[str, Any]
) -> None:
    _answers(resolver)[HOST] = ["127.0.0.1"]
    chat.answer = lambda path: (
        (307, {"Location": "/hooks/moved"})
        if path == "/hooks/T1"
        else (
            200,
            {},
        )
    )
    assert notify.post_webhook(f"http://{HOST}:{chat.port}/hooks/T1", "hello") is True
    assert [r["path"] for r in chat.received] == ["/hooks/T1", "/hooks/moved"]
    assert chat.received[1]["body"] == {"text": "hello"}
    # A redirect loop ends as a failure.
    chat.received.clear()
    chat.answer = lambda path: (308, {"Location": path})
    assert notify.post_webhook(f"http://{HOST}:{chat.port}/loop", "hello") is False
    assert len(chat.received) == notify.MAX_WEBHOOK_REDIRECTS + 1


def test_https_to_the_pinned_address_sends_the_host_as_sni_and_checks_its_certificate(
    settings: Any, tmp_path: Path, resolver: dict[str, Any]
) -> None:
    settings.NOTIFY_WEBHOOK_ALLOW_PRIVATE = False
    settings.NOTIFY_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    cert, key = self_signed(tmp_path, HOST)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server = _Server("127.0.0.1", tls=tls)
    try:
        _answers(resolver)[HOST] = ["127.0.0.1", "127.0.0.2"]
        _answers(resolver)["other.example.test"] = ["127.0.0.1"]
        settings.NOTIFY_WEBHOOK_CA_FILE = str(cert)
        assert notify.post_webhook(f"https://{HOST}:{server.port}/hooks/T1", "hello") is True
        assert server.sni == [HOST]
        assert server.received[0]["host"] == f"{HOST}:{server.port}"
        # The certificate is checked against the URL's host, not the address connected to.
        url = f"https://other.example.test:{server.port}/hooks/T1"
        assert notify.post_webhook(url, "hello") is False
        assert len(server.received) == 1
        # Without the CA the self-signed certificate is refused.
        settings.NOTIFY_WEBHOOK_CA_FILE = ""
        assert notify.post_webhook(f"https://{HOST}:{server.port}/hooks/T1", "hello") is False
        assert len(server.received) == 1
    finally:
        server.close()


def test_slack_gets_text_and_teams_workflows_an_adaptive_card(
    chat: _Server, resolver: dict[str, Any]
) -> None:
    _answers(resolver)["hooks.slack.com"] = ["127.0.0.1"]
    _answers(resolver)[TEAMS_HOST] = ["127.0.0.1"]
    text = "Request 7 (bert) failed.\nExit code 3.\nhttps://gpus.example.org/requests/7/"
    link = "https://gpus.example.org/requests/7/"
    subject = "[Quartermaster] Request 7 (bert) failed"
    slack = f"http://hooks.slack.com:{chat.port}/services/T0/B0/x"
    teams = f"http://{TEAMS_HOST}:{chat.port}/workflows/abc/triggers/manual/paths/invoke"
    assert notify.post_webhook(slack, text, subject=subject, link=link) is True
    assert notify.post_webhook(teams, text, subject=subject, link=link) is True
    assert chat.received[0]["body"] == {"text": text}
    message = chat.received[1]["body"]
    assert message["type"] == "message"
    (attachment,) = message["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert card["type"] == "AdaptiveCard" and card["version"] == "1.4"
    assert card["body"][0] == {
        "type": "TextBlock",
        "text": "Request 7 (bert) failed",
        "weight": "Bolder",
        "size": "Medium",
        "wrap": True,
    }
    assert {"type": "TextBlock", "text": "Exit code 3.", "wrap": True} in card["body"]
    assert card["actions"] == [{"type": "Action.OpenUrl", "title": "Open the request", "url": link}]
    assert notify.webhook_format(slack) == "slack"
    assert notify.webhook_format(teams) == "teams"
    assert notify.webhook_format(slack, "teams") == "teams"


@pytest.mark.django_db
def test_a_users_chosen_format_is_what_they_get(
    chat: _Server, resolver: dict[str, Any], settings: Any
) -> None:
    world: World = make_world()
    settings.PORTAL_URL = "https://gpus.example.org"
    _answers(resolver)["chat.example.test"] = ["127.0.0.1"]
    NotificationPreference.objects.create(
        user=world.bob,
        email=False,
        webhook_url=f"http://chat.example.test:{chat.port}/hook",
        webhook_format=NotificationPreference.WebhookFormat.TEAMS,
        on_start=True,
    )
    req = submit(world.bob, world.vision)
    assert notify.deliver(req.pk, "start") == {"email": 0, "webhook": 1}
    card = chat.received[0]["body"]["attachments"][0]["content"]
    assert card["body"][0]["text"] == f"Request {req.pk} started"
    assert card["actions"][0]["url"] == f"https://gpus.example.org/requests/{req.pk}/"
