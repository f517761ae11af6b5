"""Notifications: tell a request's submitter that it started, ended, failed, was preempted
or waits long, by email (Django's email backend) and by webhook (Slack's `{"text": ...}`
or a Teams Workflows Adaptive Card, connected to the address that was vetted), as their
NotificationPreference says.

Services call `notify_later()` inside their transaction; the task is enqueued only once
it commits (`on_commit`), by name through the Celery app as the tick is (portal/lib/wake.py),
and the Celery worker calls `deliver()`: mail and HTTP never run inside a tick.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import socket
import ssl
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urljoin, urlsplit

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
        lines.append(request_link(req))
    return f"[Quartermaster] {subject}", "\n".join(lines)


def request_link(req: GpuRequest) -> str:
    """The request's page ("" without PORTAL_URL)."""
    if not settings.PORTAL_URL:
        return ""
    return f"{settings.PORTAL_URL.rstrip('/')}/requests/{req.pk}/"


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
        sent["webhook"] = int(
            post_webhook(
                pref.webhook_url,
                text,
                fmt=pref.webhook_format,
                subject=subject,
                link=request_link(req),
            )
        )
    return sent


#: same-origin 307/308 redirects followed at most this many times; any other is a failure
MAX_WEBHOOK_REDIRECTS = 3
#: hosts of Microsoft Teams Workflows webhooks (Power Automate): they take an Adaptive Card
_TEAMS_HOSTS = (".logic.azure.com", ".powerplatform.com", ".powerautomate.com")


def _resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to: the one lookup a delivery makes (then pinned)."""
    infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]).split("%")[0] for info in infos))


def _address_allowed(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_global or settings.NOTIFY_WEBHOOK_ALLOW_PRIVATE:
        return True
    return any(
        ip in ipaddress.ip_network(net, strict=False)
        for net in settings.NOTIFY_WEBHOOK_ALLOWED_NETWORKS
    )


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def webhook_target(url: str) -> tuple[str, str]:
    """(address, "") to connect to for `url`, or ("", why it is refused).

    Users choose these URLs, and the worker must not become their way into the cluster's own
    network (SSRF): the host is resolved once, every address it resolves to is vetted, and
    the delivery connects to the vetted address itself, so a resolver that answers differently
    the second time (DNS rebinding) never gets a second question. Loopback, private,
    link-local (cloud metadata) and reserved addresses are refused unless
    NOTIFY_WEBHOOK_ALLOW_PRIVATE is set or NOTIFY_WEBHOOK_ALLOWED_NETWORKS holds them (an
    on-premises chat server)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "", "not an http(s) URL"
    try:
        addresses = _resolve(parts.hostname, parts.port or _default_port(parts.scheme))
    except (OSError, UnicodeError, ValueError):
        return "", "the host does not resolve"
    if not addresses:
        return "", "the host does not resolve"
    for address in addresses:
        if not _address_allowed(address):
            return "", f"{parts.hostname} is a private or local address"
    return addresses[0], ""


def webhook_refused(url: str) -> str:
    """Why a webhook URL is not posted to ("" if it may be): see `webhook_target`."""
    return webhook_target(url)[1]


def webhook_format(url: str, chosen: str = NotificationPreference.WebhookFormat.AUTO) -> str:
    """The payload format for `url`: the user's choice, else Teams Workflows by its host."""
    if chosen != NotificationPreference.WebhookFormat.AUTO:
        return chosen
    host = (urlsplit(url).hostname or "").lower()
    if host.endswith(_TEAMS_HOSTS):
        return NotificationPreference.WebhookFormat.TEAMS
    return NotificationPreference.WebhookFormat.SLACK


def webhook_payload(text: str, *, fmt: str, subject: str = "", link: str = "") -> dict[str, Any]:
    """The JSON body in the format the receiving service takes.

    - Slack (and servers speaking its format): `{"text": …}`.
    - Teams Workflows: a message whose one attachment is an Adaptive Card; the old Office 365
      connector webhooks that took `{"text": …}` are retired.
    """
    if fmt != NotificationPreference.WebhookFormat.TEAMS:
        return {"text": text}
    lines = text.splitlines()
    title = subject.removeprefix("[Quartermaster] ") or (lines[0] if lines else "Quartermaster")
    rest = [line for line in lines[1:] if line != link] if lines else []
    card: dict[str, Any] = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": [
            {
                "type": "TextBlock",
                "text": title,
                "weight": "Bolder",
                "size": "Medium",
                "wrap": True,
            },
            *({"type": "TextBlock", "text": line, "wrap": True} for line in rest if line.strip()),
        ],
    }
    if link:
        card["actions"] = [{"type": "Action.OpenUrl", "title": "Open the request", "url": link}]
    return {
        "type": "message",
        "attachments": [
            {
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": None,
                "content": card,
            }
        ],
    }


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to a vetted address; the Host header still names the URL's host."""

    def __init__(self, host: str, port: int, *, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """Connects to a vetted address; SNI, the certificate check and the Host header still
    name the URL's host."""

    def __init__(
        self, host: str, port: int, *, address: str, timeout: float, context: ssl.SSLContext
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self.address = address
        self.tls = context

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self.tls.wrap_socket(sock, server_hostname=self.host)


def _post_pinned(url: str, address: str, body: bytes) -> tuple[int, str]:
    """POST `body` to `url` over a connection to `address`; (status, Location header)."""
    parts = urlsplit(url)
    host, port = str(parts.hostname), parts.port or _default_port(parts.scheme)
    timeout = float(settings.NOTIFY_WEBHOOK_TIMEOUT_SECONDS)
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=settings.NOTIFY_WEBHOOK_CA_FILE or None)
        conn = _PinnedHTTPSConnection(host, port, address=address, timeout=timeout, context=context)
    else:
        conn = _PinnedHTTPConnection(host, port, address=address, timeout=timeout)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request(
            "POST",
            target,
            body=body,
            headers={"Content-Type": "application/json", "User-Agent": "Quartermaster"},
        )
        resp = conn.getresponse()
        resp.read(64 * 1024)
        return resp.status, resp.getheader("Location") or ""
    finally:
        conn.close()


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or _default_port(parts.scheme)


def post_webhook(
    url: str,
    text: str,
    *,
    fmt: str = NotificationPreference.WebhookFormat.AUTO,
    subject: str = "",
    link: str = "",
) -> bool:
    """POST the notification as JSON in the service's format; True on a 2xx answer.

    Only http(s) to vetted addresses, connected to the address that was vetted
    (`webhook_target`); a redirect is followed only to the same scheme, host and port
    (307/308, which keep the POST), anything else is a failure."""
    body = json.dumps(
        webhook_payload(text, fmt=webhook_format(url, fmt), subject=subject, link=link)
    ).encode()
    where = urlsplit(url).netloc
    for _ in range(MAX_WEBHOOK_REDIRECTS + 1):
        address, why = webhook_target(url)
        if why:
            log.warning("webhook %s not posted: %s", where, why)
            return False
        try:
            status, location = _post_pinned(url, address, body)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            log.warning("webhook %s failed: %s", where, exc)
            return False
        if 200 <= status < 300:
            return True
        following = urljoin(url, location) if location else ""
        if status in (307, 308) and following and _origin(following) == _origin(url):
            url = following
            continue
        if following and _origin(following) != _origin(url):
            log.warning("webhook %s refused: a redirect to another host", where)
        else:
            log.warning("webhook %s answered %s", where, status)
        return False
    log.warning("webhook %s refused: too many redirects", where)
    return False


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
