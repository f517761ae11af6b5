"""Errors under /api/ as RFC 9457 problem details (`application/problem+json`).

Every error answer carries `type` (a URN naming `code`), `title`, `status`, `detail` (one
sentence, naming the fields at fault), a stable `code` for scripts, and `errors` (field →
messages) for invalid input.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from django.http import HttpResponse

CONTENT_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:quartermaster:problem:"

#: the code an error gets when nothing more precise names it
CODES = {
    400: "invalid",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "unprocessable",
    429: "throttled",
    500: "server_error",
    503: "unavailable",
}


def code_for(status: int) -> str:
    return CODES.get(status, "client_error" if status < 500 else "server_error")


def title_for(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _messages(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def summary(errors: Mapping[str, Any]) -> str:
    """One sentence naming each field and its first message: `count: Ensure …; image: …`."""
    parts = []
    for field, value in errors.items():
        first = _messages(value)[0] if _messages(value) else ""
        if isinstance(first, Mapping):
            first = summary(first)
        name = "" if field == "non_field_errors" else f"{field}: "
        parts.append(f"{name}{first}")
    return "; ".join(parts)


def problem(
    status: int,
    *,
    detail: str = "",
    code: str = "",
    errors: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    code = code or code_for(status)
    body: dict[str, Any] = {
        "type": TYPE_PREFIX + code,
        "title": title_for(status),
        "status": status,
        "detail": detail or (summary(errors) if errors else title_for(status)),
        "code": code,
    }
    if errors:
        body["errors"] = {k: _messages(v) for k, v in errors.items()}
    return body


def problem_response(
    status: int,
    *,
    detail: str = "",
    code: str = "",
    errors: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> HttpResponse:
    body = problem(status, detail=detail, code=code, errors=errors)
    return HttpResponse(
        json.dumps(body, default=str),
        status=status,
        content_type=CONTENT_TYPE,
        headers=dict(headers or {}),
    )


def is_problem(response: HttpResponse) -> bool:
    return str(response.get("Content-Type", "")).startswith(CONTENT_TYPE)


def from_response(response: HttpResponse) -> HttpResponse:
    """Any error answer under /api/ (an HTML 404 or 500, a JSON `{"detail"}`, an empty 405) as
    a problem, keeping its status and the headers a client acts on."""
    status = response.status_code
    ctype = str(response.get("Content-Type", ""))
    detail, errors = "", None
    if "json" in ctype and not getattr(response, "streaming", False):
        try:
            data = json.loads(response.content or b"null")
        except ValueError:
            data = None
        if isinstance(data, dict):
            text = data.pop("detail", "") or data.pop("error", "")
            detail = text if isinstance(text, str) else ""
            code = data.pop("code", "")
            nested = data.pop("errors", None)
            errors = nested if isinstance(nested, dict) else None
            errors = errors or {k: v for k, v in data.items() if k not in ("ok",)} or None
            return problem_response(
                status,
                detail=detail,
                code=code if isinstance(code, str) else "",
                errors=errors,
                headers=_kept_headers(response),
            )
    elif ctype.startswith("text/plain") and not getattr(response, "streaming", False):
        text = response.content.decode(errors="replace").strip()
        detail = text if len(text) <= 500 else ""
    return problem_response(status, detail=detail, errors=errors, headers=_kept_headers(response))


def _kept_headers(response: HttpResponse) -> dict[str, str]:
    keep = ("Allow", "Retry-After", "WWW-Authenticate", "Vary")
    return {h: str(response[h]) for h in keep if response.has_header(h)}
