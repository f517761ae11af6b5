"""The portal's API over HTTP, and its errors as exit codes a script can test.

| exit | when |
|---|---|
| 0 | done |
| 1 | the portal cannot be reached, or failed (5xx), or a wait ended without the request running |
| 2 | usage: a wrong flag or value, or no portal URL or token configured |
| 3 | not found or not allowed (401, 403, 404) |
| 4 | refused by the portal (400, 409, 429 ...), with its message |

Error bodies are DRF's (`detail`, or each field with its messages) or RFC 9457 problem
details (`title`, `detail`, `status`, `code`, `errors`); the message is taken from either.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx

from cli.config import Settings

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_REFUSED = 4

USER_AGENT = "qm/0.1"
TIMEOUT_S = 30.0


class QmError(Exception):
    """A failure with the exit code it ends `qm` with."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def _field_messages(field: str, value: Any) -> list[str]:
    if isinstance(value, list):
        items = [str(v) for v in value]
    elif isinstance(value, dict):
        return [m for k, v in value.items() for m in _field_messages(f"{field}.{k}", v)]
    else:
        items = [str(value)]
    if field in ("non_field_errors", "__all__", ""):
        return items
    return [f"{field}: {m}" for m in items]


def error_message(response: httpx.Response) -> str:
    """The portal's message from an error answer, whichever shape it has."""
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return text[:500] if text and "<html" not in text.lower() else response.reason_phrase
    if not isinstance(body, dict):
        return str(body)
    lines: list[str] = []
    # RFC 9457 problem details: the detail (or title), then each field error.
    detail = body.get("detail")
    if isinstance(detail, str) and detail:
        lines.append(detail)
    elif isinstance(body.get("title"), str) and body["title"]:
        lines.append(body["title"])
    errors = body.get("errors")
    fields = _error_lines(errors)
    # A detail that only joins the field errors (the portal's) would say each twice.
    if fields and lines and all(f in lines[0] for f in fields):
        lines = []
    lines.extend(fields)
    # DRF's field errors: every other key names a field.
    if "detail" not in body and "title" not in body and "errors" not in body:
        for field, value in body.items():
            lines.extend(_field_messages(field, value))
    return "\n".join(lines) or response.reason_phrase


def _error_lines(errors: Any) -> list[str]:
    """A problem's `errors`, a map of fields or a list of pointers, a line per message."""
    lines: list[str] = []
    if isinstance(errors, dict):
        for field, value in errors.items():
            lines.extend(_field_messages(field, value))
    elif isinstance(errors, list):
        for e in errors:
            if isinstance(e, dict):
                field = str(e.get("field") or e.get("pointer") or e.get("name") or "")
                field = field.removeprefix("#/").replace("/", ".")
                lines.extend(_field_messages(field, e.get("detail") or e.get("message") or e))
            else:
                lines.append(str(e))
    return lines


def exit_code_for(status: int) -> int:
    if status in (401, 403, 404):
        return EXIT_NOT_FOUND
    if 400 <= status < 500:
        return EXIT_REFUSED
    return EXIT_FAILED


class Api:
    """A client of one portal with one token; every call raises QmError on failure."""

    def __init__(self, settings: Settings, transport: httpx.BaseTransport | None = None) -> None:
        if not settings.url:
            raise QmError("No portal URL: run `qm login`, or set QM_URL and QM_TOKEN.", EXIT_USAGE)
        if not settings.token:
            raise QmError("No token: run `qm login`, or set QM_TOKEN.", EXIT_USAGE)
        self.url = settings.url
        self.http = httpx.Client(
            base_url=f"{settings.url}/api/v1/",
            headers={
                "Authorization": f"Bearer {settings.token}",
                "Accept": "application/json",
                "User-Agent": USER_AGENT,
            },
            timeout=TIMEOUT_S,
            transport=transport,
        )

    def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise QmError(f"Cannot reach the portal at {self.url}: {exc}") from None
        self._check(response)
        return response

    @staticmethod
    def _check(response: httpx.Response) -> None:
        if response.is_success:
            return
        message = error_message(response)
        if response.status_code == 401:
            message = f"{message} (the token was not accepted: run `qm login`)"
        raise QmError(message, exit_code_for(response.status_code))

    def get(self, path: str, **params: Any) -> Any:
        query = {k: v for k, v in params.items() if v is not None and v != ""}
        return self._send("GET", path, params=query).json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self._send("POST", path, json=body).json()

    def pages(self, path: str, limit: int, **params: Any) -> list[dict[str, Any]]:
        """Rows of a paginated list, following `next` until `limit` rows (0: all)."""
        rows: list[dict[str, Any]] = []
        page = self.get(path, **params)
        while True:
            rows.extend(page["results"])
            if not page.get("next") or (limit and len(rows) >= limit):
                return rows[:limit] if limit else rows
            page = self._send("GET", page["next"]).json()

    def stream_lines(self, path: str, **params: Any) -> Iterator[str]:
        """A text/plain stream, a line at a time as the portal sends it."""
        query = {k: v for k, v in params.items() if v is not None}
        timeout = httpx.Timeout(TIMEOUT_S, read=None)
        try:
            with self.http.stream("GET", path, params=query, timeout=timeout) as response:
                if not response.is_success:
                    response.read()
                    self._check(response)
                yield from response.iter_lines()
        except httpx.HTTPError as exc:
            raise QmError(f"The log stream from {self.url} broke: {exc}") from None
