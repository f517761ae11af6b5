"""Notifications: tell a request's submitter that it started, ended, failed, was preempted
or waits long, by email (Django's email backend) and by webhook (`{"text": ...}`, which
Slack and Teams incoming webhooks accept), as their NotificationPreference says.

Services call `notify_later()` inside their transaction; the task is enqueued only once
it commits (`on_commit`), by name through the Celery app as the tick is (portal/lib/wake.py),
and the Celery worker calls `deliver()`: mail and HTTP never run inside a tick.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import urllib.error
import urllib.request
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from celery.exceptions import NotRegistered
from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from portal.celery import app
from portal.lib import wake
from portal.models import GpuRequest, NotificationPreference

log = logging.getLogger(__name__)

Event = NotificationPreference.Event

_VERBS = {
    Event.START: "started",
    Event.END: "finished",
    Event.FAILURE: "failed",
    Event.PREEMPTION: "was preempted",
    Event.LONG_WAIT: "is still waiting",
}


def notify_later(request_id: int, event: str) -> None:
    """Send the notification after the caller's transaction commits (never if it rolls back)."""
    transaction.on_commit(lambda: _enqueue(request_id, event))


def notify_many_later(request_ids: list[int], event: str) -> None:
    """`notify_later` for many requests (a tick's rejections): one commit hook, no queries."""
    if request_ids:
        ids = list(request_ids)

        def enqueue_all() -> None:
            for pk in ids:
                _enqueue(pk, event)

        transaction.on_commit(enqueue_all)


def _enqueue(request_id: int, event: str) -> None:
    try:
        try:
            task = app.tasks[wake.NOTIFY_TASK]
        except NotRegistered:
            app.loader.import_default_modules()
            task = app.tasks[wake.NOTIFY_TASK]
        task.delay(request_id, event)
    except Exception:  # noqa: BLE001 - a lost notification must not fail the tick or reconcile
        log.warning("could not enqueue a %s notification for request %s", event, request_id)


def preference_for(user: Any) -> NotificationPreference:
    """The user's preferences, or the defaults (unsaved) when they never set any."""
    pref = NotificationPreference.objects.filter(user=user).first()
    return pref or NotificationPreference(user=user)


def message(req: GpuRequest, event: str) -> tuple[str, str]:
    """(subject, text) of a notification, in words."""
    label = f"Request {req.pk}" + (f" ({req.name})" if req.name else "")
    subject = f"{label} {_VERBS[Event(event)]}"
    lines = [f"{subject}."]
    if event == Event.LONG_WAIT:
        waited = timezone.now() - req.created_at
        lines.append(f"Submitted {int(waited.total_seconds() // 60)} min ago.")
        if req.queue_position:
            lines.append(f"Queue position #{req.queue_position}.")
    if req.status_message:
        lines.append(req.status_message)
    attempt = req.attempts.order_by("-number").first()
    if event == Event.FAILURE and attempt is not None and attempt.log_tail:
        last = attempt.log_tail.strip().splitlines()[-5:]
        lines.append("Last log lines:\n" + "\n".join(last))
    if settings.PORTAL_URL:
        lines.append(f"{settings.PORTAL_URL.rstrip('/')}/requests/{req.pk}/")
    return f"[Quartermaster] {subject}", "\n".join(lines)


def deliver(request_id: int, event: str) -> dict[str, int]:
    """Send one notification by every channel the submitter chose; returns what was sent."""
    req = GpuRequest.objects.select_related("submitted_by").filter(pk=request_id).first()
    sent = {"email": 0, "webhook": 0}
    if req is None:
        return sent
    user = req.submitted_by
    pref = preference_for(user)
    if not pref.wants(event):
        return sent
    subject, text = message(req, event)
    if pref.email and user.email:
        try:
            sent["email"] = send_mail(
                subject, text, settings.DEFAULT_FROM_EMAIL, [user.email], fail_silently=False
            )
        except Exception:  # noqa: BLE001 - one channel failing must not stop the other
            log.warning("mail to %s for request %s failed", user.email, req.pk, exc_info=True)
    if pref.webhook_url:
        sent["webhook"] = int(post_webhook(pref.webhook_url, text))
    return sent


def webhook_refused(url: str) -> str:
    """Why a webhook URL is not posted to ("" if it may be): users choose these URLs, and the
    worker must not become their way into the cluster's own network (SSRF). Loopback,
    private, link-local (cloud metadata) and reserved addresses are refused unless
    NOTIFY_WEBHOOK_ALLOW_PRIVATE is set (an on-premises chat server)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an http(s) URL"
    if settings.NOTIFY_WEBHOOK_ALLOW_PRIVATE:
        return ""
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 443, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return "the host does not resolve"
    for info in infos:
        addr = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if not addr.is_global:
            return f"{parts.hostname} is a private or local address"
    return ""


def post_webhook(url: str, text: str) -> bool:
    """POST `{"text": text}` as JSON; True on a 2xx answer. Only http(s) to public addresses
    (see `webhook_refused`), no redirects followed."""
    why = webhook_refused(url)
    if why:
        log.warning("webhook %s not posted: %s", urlsplit(url).netloc, why)
        return False
    body = json.dumps({"text": text}).encode()
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=settings.NOTIFY_WEBHOOK_TIMEOUT_SECONDS) as resp:
            return bool(200 <= resp.status < 300)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        log.warning("webhook %s failed: %s", urlsplit(url).netloc, exc)
        return False


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A webhook that redirects could send the POST anywhere: treat it as a failure.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def long_waits(now: datetime | None = None, limit: int = 200) -> int:
    """Notify each request pending longer than NOTIFY_LONG_WAIT_SECONDS, once. Returns how many.

    Claimed by a conditional UPDATE, so two beat runs never notify one request twice.
    """
    now = now or timezone.now()
    before = now - timedelta(seconds=settings.NOTIFY_LONG_WAIT_SECONDS)
    ids = list(
        GpuRequest.objects.filter(
            state=GpuRequest.State.PENDING, created_at__lt=before, long_wait_notified_at=None
        ).values_list("pk", flat=True)[:limit]
    )
    done = 0
    for pk in ids:
        with transaction.atomic():
            claimed = GpuRequest.objects.filter(pk=pk, long_wait_notified_at=None).update(
                long_wait_notified_at=now
            )
            if claimed:
                notify_later(pk, Event.LONG_WAIT)
                done += 1
    return done
