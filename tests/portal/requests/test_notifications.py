"""Notifications, delivered for real: mail through Django's SMTP backend to an aiosmtpd
server on loopback, webhooks to an http.server in a thread. Celery runs eagerly, so the
task runs when the service's transaction commits."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.db import transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from portal.models import GpuRequest, NotificationPreference, SimulatedWorkload
from portal.services import notify
from portal.services.attempts import attempt_stop
from portal.services.me import notification_preference_set
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db(transaction=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        msg = message_from_bytes(envelope.content)
        self.messages.append((envelope.rcpt_tos, msg))
        return "250 OK"


@pytest.fixture
def smtp(settings: Any) -> Iterator[_Inbox]:
    inbox = _Inbox()
    port = _free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.PORTAL_URL = "https://gpus.example.org"
    try:
        yield inbox
    finally:
        controller.stop()


class _Receiver(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(
            {"type": self.headers["Content-Type"], "body": json.loads(body), "path": self.path}
        )
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook(settings: Any) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    # The receiver listens on loopback, which webhooks may reach only when allowed.
    settings.NOTIFY_WEBHOOK_ALLOW_PRIVATE = True
    received: list[dict[str, Any]] = []
    handler = type("Receiver", (_Receiver,), {"received": received})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hooks/T000/B000", received
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def world() -> World:
    w = make_world()
    w.bob.email = "bob@example.org"
    w.bob.save(update_fields=["email"])
    return w


def _advance(req: GpuRequest, seconds: float) -> None:
    w = SimulatedWorkload.objects.get(name=req.attempts.get().workload_name)
    SimulatedWorkload.objects.filter(pk=w.pk).update(
        starts_at=w.starts_at - timedelta(seconds=seconds),
        ends_at=w.ends_at - timedelta(seconds=seconds),
    )


def _prefs(user: Any, **kw: Any) -> None:
    notification_preference_set(user=user, **kw)


def test_a_failure_is_mailed_and_posted_with_the_last_log_lines(
    world: World, smtp: _Inbox, hook: tuple[str, list[dict[str, Any]]]
) -> None:
    url, received = hook
    _prefs(world.bob, webhook_url=url)
    req = submit(
        world.bob, world.vision, name="resnet", command=["python", "train.py", "exit", "3"]
    )
    run_tick()
    _advance(req, 4000)
    reconcile()
    reconcile()
    # One mail and one post: a failure (no "started" by default).
    assert len(smtp.messages) == 1
    rcpt, msg = smtp.messages[0]
    assert rcpt == ["bob@example.org"]
    assert msg["Subject"] == f"[Quartermaster] Request {req.pk} (resnet) failed"
    body = msg.get_payload(decode=True).decode()
    assert "exited with code 3" in body and "Last log lines:" in body
    assert "RuntimeError: CUDA error" in body
    assert f"https://gpus.example.org/requests/{req.pk}/" in body
    assert len(received) == 1
    assert received[0]["type"] == "application/json"
    assert set(received[0]["body"]) == {"text"}  # what Slack and Teams accept
    assert received[0]["body"]["text"].startswith(f"Request {req.pk} (resnet) failed.")


def test_start_and_end_are_sent_when_chosen(world: World, smtp: _Inbox) -> None:
    _prefs(world.bob, on_start=True)
    req = submit(world.bob, world.vision)
    run_tick()
    _advance(req, 2)
    reconcile()
    assert [m["Subject"] for _, m in smtp.messages] == [f"[Quartermaster] Request {req.pk} started"]
    _advance(req, 4000)
    reconcile()
    assert smtp.messages[-1][1]["Subject"] == f"[Quartermaster] Request {req.pk} finished"


def test_a_preemption_is_sent(world: World, smtp: _Inbox) -> None:
    req = submit(world.bob, world.vision)
    run_tick()
    with transaction.atomic():
        attempt_stop(req.attempts.get(), reason="preempted")
    reconcile()
    req.refresh_from_db()
    assert req.state == GpuRequest.State.PENDING
    assert [m["Subject"] for _, m in smtp.messages] == [
        f"[Quartermaster] Request {req.pk} was preempted"
    ]


def test_nothing_is_sent_when_opted_out(
    world: World, smtp: _Inbox, hook: tuple[str, list[dict[str, Any]]]
) -> None:
    url, received = hook
    _prefs(world.bob, email=False, webhook_url=url, on_failure=False)
    req = submit(world.bob, world.vision, command=["python", "train.py", "exit", "3"])
    run_tick()
    _advance(req, 4000)
    reconcile()
    reconcile()
    req.refresh_from_db()
    assert req.state == GpuRequest.State.FAILED
    assert smtp.messages == [] and received == []


def test_a_rolled_back_change_sends_nothing(world: World, smtp: _Inbox) -> None:
    req = submit(world.bob, world.vision)
    with pytest.raises(RuntimeError), transaction.atomic():
        notify.notify_later(req.pk, "failure")
        raise RuntimeError("rolled back")
    assert smtp.messages == []


def test_a_long_wait_is_sent_once(world: World, smtp: _Inbox, settings: Any) -> None:
    settings.NOTIFY_LONG_WAIT_SECONDS = 600
    for i in range(5):
        submit(world.bob, world.vision, count=8, name=f"big-{i}")
    run_tick()
    waiting = list(GpuRequest.objects.filter(state=GpuRequest.State.PENDING))
    assert waiting
    later = timezone.now() + timedelta(seconds=601)
    assert notify.long_waits(now=later) == len(waiting)
    assert notify.long_waits(now=later + timedelta(hours=1)) == 0
    subjects = sorted(m["Subject"] for _, m in smtp.messages)
    assert subjects == sorted(
        f"[Quartermaster] Request {r.pk} ({r.name}) is still waiting" for r in waiting
    )


def test_a_webhook_to_a_private_address_is_refused_by_default(
    world: World, hook: tuple[str, list[dict[str, Any]]], settings: Any
) -> None:
    url, received = hook
    settings.NOTIFY_WEBHOOK_ALLOW_PRIVATE = False
    for target in (url, "http://169.254.169.254/latest/meta-data", "http://10.0.0.5/hook"):
        assert notify.webhook_refused(target).endswith("is a private or local address")
        assert notify.post_webhook(target, "hello") is False
    assert received == []
    assert notify.webhook_refused("file:///etc/passwd") == "not an http(s) URL"
    settings.NOTIFY_WEBHOOK_ALLOW_PRIVATE = True
    assert notify.post_webhook(url, "hello") is True
    assert received == [
        {"type": "application/json", "body": {"text": "hello"}, "path": "/hooks/T000/B000"}
    ]


def test_a_webhook_that_fails_does_not_stop_the_mail(
    world: World, smtp: _Inbox, settings: Any
) -> None:
    settings.NOTIFY_WEBHOOK_ALLOW_PRIVATE = True
    _prefs(world.bob, webhook_url=f"http://127.0.0.1:{_free_port()}/nothing-listens")
    req = submit(world.bob, world.vision, command=["python", "train.py", "exit", "3"])
    run_tick()
    _advance(req, 4000)
    reconcile()
    reconcile()
    assert len(smtp.messages) == 1


def test_the_preferences_page_saves_and_refuses_a_non_http_webhook(world: World) -> None:
    c = Client()
    c.force_login(world.bob)
    url = reverse("portal:notifications")
    r = c.get(url)
    assert r.status_code == 200 and b"bob@example.org" in r.content
    r = c.post(url, {"email": "on", "webhook_url": "ftp://example.org/x", "on_failure": "on"})
    assert r.status_code == 400
    assert not NotificationPreference.objects.filter(user=world.bob).exists()
    r = c.post(
        url,
        {"webhook_url": "https://hooks.slack.com/services/T0/B0/x", "on_start": "on"},
        follow=True,
    )
    assert r.status_code == 200 and b"Notification settings saved." in r.content
    pref = NotificationPreference.objects.get(user=world.bob)
    assert (pref.email, pref.on_start, pref.on_failure) == (False, True, False)
    assert pref.webhook_url == "https://hooks.slack.com/services/T0/B0/x"
