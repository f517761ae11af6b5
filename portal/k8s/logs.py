"""Logs and events of a workload: its pod's container log, its Job's and pods' Events.

Reads only; every failure answers empty (a gone pod has no log, a namespace the
service account may not read has no events) so a page that shows them never fails.
The chart grants `pods/log` get and `events` list in the team namespaces.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes.client.exceptions import ApiException

from portal.backends.base import WorkloadEvent
from portal.k8s.jobs import pods_for_workload
from portal.k8s.names import MAIN_CONTAINER

log = logging.getLogger(__name__)


def _newest(pods: list[Any]) -> Any | None:
    """The pod whose log matters: the Job's latest try."""
    if not pods:
        return None

    def created(p: Any) -> float:
        ts = p.metadata.creation_timestamp
        return ts.timestamp() if ts is not None else 0.0

    return max(pods, key=lambda p: (created(p), p.metadata.name))


def pod_log(core: Any, name: str, namespace: str, tail_lines: int, selector: str = "") -> str:
    """The last `tail_lines` lines of the main container of the workload's newest pod (of
    those `selector` also matches: one rank of a JobSet)."""
    try:
        pod = _newest(pods_for_workload(core, name, namespace, selector))
        if pod is None:
            return ""
        text = core.read_namespaced_pod_log(
            name=pod.metadata.name,
            namespace=namespace,
            container=MAIN_CONTAINER,
            tail_lines=tail_lines,
        )
    except ApiException as exc:
        # 400: the container has not started; 404: gone; 403: not granted. None is an error here.
        if exc.status not in (400, 403, 404):
            log.warning("reading the log of %s/%s failed: %s", namespace, name, exc.status)
        return ""
    return str(text or "")


def workload_events(core: Any, name: str, namespace: str) -> list[WorkloadEvent]:
    """Events whose involved object is the Job or one of its pods, oldest first."""
    try:
        objects = [("Job", name)] + [
            ("Pod", p.metadata.name) for p in pods_for_workload(core, name, namespace)
        ]
        out: list[WorkloadEvent] = []
        for kind, obj in objects:
            selector = f"involvedObject.kind={kind},involvedObject.name={obj}"
            for e in core.list_namespaced_event(namespace, field_selector=selector).items:
                out.append(
                    WorkloadEvent(
                        at=e.last_timestamp or e.event_time or e.first_timestamp,
                        type=e.type or "Normal",
                        reason=e.reason or "",
                        message=(e.message or "")[:500],
                        object=f"{kind}/{obj}",
                    )
                )
    except ApiException as exc:
        if exc.status not in (403, 404):
            log.warning("listing events of %s/%s failed: %s", namespace, name, exc.status)
        return []
    return sorted(out, key=lambda e: e.at.timestamp() if e.at is not None else float("inf"))
