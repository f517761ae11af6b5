"""Shapes of untrusted input, checked before anything stores or acts on it.

Each check raises Django's ValidationError naming the field (a dotted path
for nested data), so pages, the API and the node-agent endpoint answer 400
with a message rather than 500 somewhere deeper (PostgreSQL refuses NUL in
text, recursion overflows, the tick or preview meets a taint with no key).
"""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ValidationError

#: deeper JSON than this is refused: nothing the portal accepts nests more than a few levels
MAX_JSON_DEPTH = 32
#: Kubernetes label keys ([prefix/]name) and values, and taint effects
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*"
LABEL_KEY = re.compile(rf"^({_PREFIX}/)?{_NAME}$")
LABEL_VALUE = re.compile(rf"^({_NAME})?$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
#: `+me`/`+me.all` (media engines), `-me` (none), `+gfx` (graphics, RTX PRO 6000 Blackwell)
MIG_PROFILE = re.compile(r"^[1-7]g\.[0-9]+gb(\+me|\+me\.all|-me|\+gfx)?$")
#: a Kubernetes object name that is a DNS subdomain (RFC 1123): PriorityClass, Namespace, ...
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def json_problem(value: Any, max_depth: int = MAX_JSON_DEPTH) -> str:
    """Why parsed JSON is refused ("" when it is fine): too deep, or a NUL in a string.

    Iterative, so that it cannot overflow the stack itself.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            return f"JSON nested deeper than {max_depth} levels is not accepted"
        if isinstance(item, str):
            if "\x00" in item:
                return "NUL bytes (\\u0000) are not accepted"
        elif isinstance(item, dict):
            for k, v in item.items():
                if "\x00" in k:
                    return "NUL bytes (\\u0000) are not accepted"
                stack.append((v, depth + 1))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return ""


def json_text_too_deep(text: str, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON text nests deeper than `max_depth`, found without parsing it: the parser
    recurses once a level and overflows near 1,000 (RecursionError, a 500)."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def _fail(path: str, message: str) -> None:
    raise ValidationError({path: message})


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def validate_taints(value: Any, field: str = "taints") -> None:
    """A list of {"key", "value"?, "effect"} as Kubernetes takes them."""
    if not isinstance(value, list):
        _fail(field, 'Taints are a list of {"key": ..., "value": ..., "effect": ...}.')
    for i, t in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(t, dict):
            _fail(where, 'A taint is an object {"key": ..., "value": ..., "effect": ...}.')
        unknown = set(t) - {"key", "value", "effect"}
        if unknown:
            _fail(where, f"Unknown taint field {sorted(unknown)[0]!r}.")
        key, val, effect = t.get("key"), t.get("value", ""), t.get("effect", "NoSchedule")
        if not isinstance(key, str) or not LABEL_KEY.match(key):
            _fail(f"{where}.key", "A taint key is a label key such as example.com/name.")
        if not isinstance(val, str) or not LABEL_VALUE.match(val):
            _fail(f"{where}.value", "A taint value is a label value (63 characters at most).")
        if effect not in TAINT_EFFECTS:
            _fail(f"{where}.effect", f"The effect is one of {', '.join(TAINT_EFFECTS)}.")


def validate_node_selector(value: Any, field: str = "node_selector") -> None:
    """A mapping of label key to label value."""
    if not isinstance(value, dict):
        _fail(field, 'A node selector is a mapping {"label-key": "value"}.')
    for key, val in value.items():
        if not LABEL_KEY.match(key):
            _fail(field, f"{key!r} is not a label key.")
        if not isinstance(val, str) or not LABEL_VALUE.match(val):
            _fail(field, f"The value of {key!r} is not a label value.")


def validate_mig_layout(value: Any, field: str = "mig_layout") -> None:
    """A list of MIG profile names such as "3g.40gb" (at most 7 slices a GPU)."""
    if not isinstance(value, list):
        _fail(field, 'A MIG layout is a list of profiles, e.g. ["3g.40gb", "2g.20gb"].')
    if len(value) > 7:
        _fail(field, "A GPU is cut into at most 7 MIG instances.")
    for i, p in enumerate(value):
        if not isinstance(p, str) or not MIG_PROFILE.match(p):
            _fail(f"{field}[{i}]", f"{p!r} is not a MIG profile such as 3g.40gb.")


# ---------------------------------------------------------------------------
# Node agent reports (portal/node_agent.py documents the shape)

_MAX_DEVICES = 64
_MAX_ITEMS = 256


def _opt_int(d: dict[str, Any], key: str, where: str, lo: int = 0, hi: int = 10**12) -> None:
    v = d.get(key)
    if v is not None and (not _is_int(v) or not lo <= v <= hi):
        _fail(f"{where}.{key}", f"Must be a whole number from {lo} to {hi}.")


def _opt_str(d: dict[str, Any], key: str, where: str, limit: int = 500) -> None:
    v = d.get(key)
    if v is not None and (not isinstance(v, str) or len(v) > limit):
        _fail(f"{where}.{key}", f"Must be text of at most {limit} characters.")


def _opt_bool(d: dict[str, Any], key: str, where: str) -> None:
    v = d.get(key)
    if v is not None and not isinstance(v, bool):
        _fail(f"{where}.{key}", "Must be true or false.")


def _list_of_objects(d: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    v = d.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or len(v) > _MAX_ITEMS:
        _fail(f"{where}.{key}", f"Must be a list of at most {_MAX_ITEMS} objects.")
    for i, item in enumerate(v):
        if not isinstance(item, dict):
            _fail(f"{where}.{key}[{i}]", "Must be an object.")
    return v


def _processes(d: dict[str, Any], where: str) -> None:
    for i, p in enumerate(_list_of_objects(d, "processes", where)):
        _opt_int(p, "pid", f"{where}.processes[{i}]", 0, 2**32)
        _opt_int(p, "used_memory_mib", f"{where}.processes[{i}]")


def validate_agent_report(report: Any) -> None:
    """The node agent's report, field by field, before it is stored or read."""
    if not isinstance(report, dict):
        _fail("report", "The body must be a JSON object.")
    problem = json_problem(report)
    if problem:
        _fail("report", problem)
    name = report.get("node")
    if not isinstance(name, str) or not name or len(name) > 253:
        _fail("node", "The report must name its node.")
    for key in ("agent_version", "sent_at", "driver_version"):
        _opt_str(report, key, "report", 100)
    devices = report.get("devices")
    if not isinstance(devices, list) or len(devices) > _MAX_DEVICES:
        _fail("devices", f"The report must list its devices (at most {_MAX_DEVICES}).")
    for i, dev in enumerate(devices):
        where = f"devices[{i}]"
        if not isinstance(dev, dict):
            _fail(where, "A device is an object.")
        if not _is_int(dev.get("index")) or not 0 <= dev["index"] < 1024:
            _fail(f"{where}.index", "Each device needs its index, a whole number from 0.")
        for key in ("uuid", "model", "error"):
            _opt_str(dev, key, where)
        for key in ("memory_total_mib", "memory_used_mib"):
            _opt_int(dev, key, where)
        _opt_int(dev, "utilization_pct", where, 0, 100)
        _opt_bool(dev, "healthy", where)
        _opt_bool(dev, "mig_mode", where)
        for j, x in enumerate(_list_of_objects(dev, "xids", where)):
            _opt_int(x, "xid", f"{where}.xids[{j}]", 0, 2**31)
            _opt_bool(x, "critical", f"{where}.xids[{j}]")
            _opt_str(x, "at", f"{where}.xids[{j}]", 100)
        _processes(dev, where)
        for j, m in enumerate(_list_of_objects(dev, "mig", where)):
            mw = f"{where}.mig[{j}]"
            _opt_str(m, "profile", mw, 30)
            _opt_str(m, "uuid", mw, 100)
            _opt_int(m, "start", mw, -1, 64)
            _opt_int(m, "size", mw, 0, 64)
            for key in ("memory_total_mib", "memory_used_mib"):
                _opt_int(m, key, mw)
            _processes(m, mw)


def kubernetes_name(value: str) -> None:
    """A DNS subdomain name (RFC 1123) as Kubernetes requires of a PriorityClass: lower-case
    letters, digits, '-' and '.', starting and ending with a letter or digit."""
    if value and (len(value) > 253 or not DNS_SUBDOMAIN.match(value)):
        raise ValidationError(
            f"{value[:80]!r} is not a Kubernetes name: use lower-case letters, digits, '-' and "
            "'.', starting and ending with a letter or digit."
        )


def webhook_url(value: str) -> None:
    """A notification webhook: http or https only (no file:, ftp:, gopher:)."""
    if value and not re.match(r"^https?://", value, re.IGNORECASE):
        raise ValidationError("A webhook URL starts with https:// (or http://).")
