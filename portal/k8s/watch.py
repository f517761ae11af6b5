"""The watch: Quartermaster's Jobs and pods, and the inventory's nodes and non-terminal pods,
kept current, relisting on `410 Gone`."""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from portal.backends.base import WorkloadStatus
from portal.k8s.names import ACTIVE_SELECTOR, L_INSTANCE, MANAGED_SELECTOR, TERMINAL_PHASES
from portal.k8s.status import classify, condition

log = logging.getLogger(__name__)

WORKLOAD_KINDS = ("jobs", "pods")


@dataclass
class _Stream:
    resource_version: str = ""
    relists: int = 0
    events: int = 0


@dataclass
class WorkloadWatcher:
    """A cache of Quartermaster's Jobs and pods in some namespaces, kept by watches.

    `relist()` lists and remembers the list's resourceVersion; `watch_once()`
    streams events from there. When the server answers `410 Gone` (the
    version was compacted away, kubernetes-client/python#728) the stream
    relists and carries on from the new version, so no event is lost for long;
    `resync_s` forces a full relist now and then anyway, to heal anything a
    watch missed. `run()` drives all of it from threads.

    With `inventory`, it keeps every Node (`nodes`) and the non-terminal pods
    (`active`: cluster-wide, or of `pod_namespaces`) instead: a stream that
    ends because a pod turned terminal ends in DELETED, as the field selector
    no longer matches it.
    """

    core: Any
    batch: Any
    namespaces: Sequence[str]
    watch_factory: Callable[[], Any] | None = None
    resync_s: float = 300.0
    timeout_s: int = 60
    clock: Callable[[], float] = time.monotonic
    jobs: dict[tuple[str, str], Any] = field(default_factory=dict)
    pods: dict[tuple[str, str], Any] = field(default_factory=dict)
    inventory: bool = False
    pod_namespaces: Sequence[str] | None = None
    #: {("", name): Node}
    nodes: dict[tuple[str, str], Any] = field(default_factory=dict)
    #: {(pod namespace, name): pod} of non-terminal pods
    active: dict[tuple[str, str], Any] = field(default_factory=dict)
    #: final state of deleted pods that ended for a telling reason (preempted,
    #: evicted, node lost): the Job replaces such a pod, and without this the
    #: reason would leave with it. Kept `tombstone_s` seconds.
    gone: dict[tuple[str, str], tuple[float, Any]] = field(default_factory=dict)
    tombstone_s: float = 3600.0
    streams: dict[tuple[str, str], _Stream] = field(default_factory=dict)
    last_resync: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: set by `run()`: what stops its threads, the threads, and each stream's open watch
    #: response (what `close()` cuts to wake a thread waiting on an idle stream)
    _stop: threading.Event | None = field(default=None, init=False, repr=False)
    _threads: list[threading.Thread] = field(default_factory=list, init=False, repr=False)
    _open: dict[tuple[str, str], Any] = field(default_factory=dict, init=False, repr=False)

    def _watch(self) -> Any:
        if self.watch_factory is not None:
            return self.watch_factory()
        from kubernetes import watch

        return watch.Watch()  # type: ignore[no-untyped-call]

    def pairs(self) -> list[tuple[str, str]]:
        """The (namespace, kind) streams this watcher keeps; "" is cluster-wide."""
        if not self.inventory:
            return [(ns, kind) for ns in self.namespaces for kind in WORKLOAD_KINDS]
        pod_ns = [""] if self.pod_namespaces is None else list(self.pod_namespaces)
        return [("", "nodes")] + [(ns, "active") for ns in pod_ns]

    def _lister(self, kind: str, namespace: str = "") -> Callable[..., Any]:
        lister: Callable[..., Any]
        if kind == "jobs":
            lister = self.batch.list_namespaced_job
        elif kind == "nodes":
            lister = self.core.list_node
        elif kind == "active" and not namespace:
            lister = self.core.list_pod_for_all_namespaces
        else:
            lister = self.core.list_namespaced_pod
        return lister

    def _args(self, namespace: str, kind: str) -> tuple[tuple[str, ...], dict[str, str]]:
        """Positional and selector arguments of the list (and watch) of one stream."""
        if kind == "nodes":
            return (), {}
        if kind == "active":
            return ((namespace,) if namespace else ()), {"field_selector": ACTIVE_SELECTOR}
        return (namespace,), {"label_selector": MANAGED_SELECTOR}

    def _store(self, kind: str) -> dict[tuple[str, str], Any]:
        stores = {"jobs": self.jobs, "pods": self.pods, "nodes": self.nodes, "active": self.active}
        return stores[kind]

    @staticmethod
    def _key(namespace: str, kind: str, obj: Any) -> tuple[str, str]:
        if kind == "active":
            return (obj.metadata.namespace or namespace, obj.metadata.name)
        return (namespace, obj.metadata.name)

    def relist(self, namespace: str, kind: str) -> None:
        """Replace the cache for (namespace, kind) with a fresh list."""
        args, selectors = self._args(namespace, kind)
        result = self._lister(kind, namespace)(*args, **selectors)
        store = self._store(kind)
        with self.lock:
            for key in [k for k in store if not namespace or k[0] == namespace]:
                del store[key]
            for obj in result.items:
                store[self._key(namespace, kind, obj)] = obj
            stream = self.streams.setdefault((namespace, kind), _Stream())
            stream.resource_version = result.metadata.resource_version or ""
            stream.relists += 1

    def resync(self) -> None:
        horizon = self.clock() - self.tombstone_s
        with self.lock:
            for key in [k for k, (at, _) in self.gone.items() if at < horizon]:
                del self.gone[key]
        for ns, kind in self.pairs():
            self.relist(ns, kind)
        self.last_resync = self.clock()

    def apply(self, namespace: str, kind: str, event: Mapping[str, Any]) -> None:
        """Apply one watch event to the cache."""
        obj = event["object"]
        etype = event["type"]
        stream = self.streams.setdefault((namespace, kind), _Stream())
        rv = getattr(obj.metadata, "resource_version", None) if hasattr(obj, "metadata") else None
        with self.lock:
            if etype in ("ADDED", "MODIFIED"):
                self._store(kind)[self._key(namespace, kind, obj)] = obj
            elif etype == "DELETED":
                self._store(kind).pop(self._key(namespace, kind, obj), None)
                if kind == "pods" and (
                    condition(obj, "DisruptionTarget") or obj.status.phase == "Failed"
                ):
                    final = obj.model_copy(deep=True)
                    # A deleted pod is gone: it no longer holds its devices.
                    if final.status.phase not in TERMINAL_PHASES:
                        final.status.phase = "Failed"
                    self.gone[(namespace, obj.metadata.name)] = (self.clock(), final)
            if rv:
                stream.resource_version = rv
            stream.events += 1

    def watch_once(self, namespace: str, kind: str) -> None:
        """Stream events until the server ends the watch; relist on 410 Gone."""
        stream = self.streams.get((namespace, kind))
        if stream is None or not stream.resource_version:
            self.relist(namespace, kind)
            stream = self.streams[(namespace, kind)]
        args, selectors = self._args(namespace, kind)
        lister = self._lister(kind, namespace)

        @functools.wraps(lister)  # the client reads the lister's docstring
        def opened(*a: Any, **kw: Any) -> Any:
            response = self._open[(namespace, kind)] = lister(*a, **kw)
            if self._stop is not None and self._stop.is_set():  # opened as `close()` swept
                _cut(response)
            return response

        w = self._watch()
        try:
            for event in w.stream(
                opened,
                *args,
                **selectors,
                resource_version=stream.resource_version,
                timeout_seconds=self.timeout_s,
                allow_watch_bookmarks=True,
            ):
                if event.get("type") == "BOOKMARK":
                    rv = (
                        event["object"].metadata.resource_version
                        if hasattr(event["object"], "metadata")
                        else event["raw_object"]["metadata"]["resourceVersion"]
                    )
                    stream.resource_version = rv
                    continue
                self.apply(namespace, kind, event)
        except ApiException as exc:
            if exc.status != 410:
                raise
            log.info(
                "watch %s/%s: 410 Gone at %s; relisting", namespace, kind, stream.resource_version
            )
            self.relist(namespace, kind)
        finally:
            self._open.pop((namespace, kind), None)

    def maybe_resync(self) -> bool:
        if self.clock() - self.last_resync >= self.resync_s:
            self.resync()
            return True
        return False

    def status(
        self,
        name: str,
        namespace: str,
        *,
        now: datetime | None = None,
        image_pull_timeout_s: int = 600,
        instance: str = "",
        labels: Mapping[str, str] | None = None,
    ) -> WorkloadStatus:
        """The Job `name` and its pods, classified. A JobSet's rank: its pods carry the
        JobSet's name as `instance` and the rank in `labels` (portal/k8s/jobset.py)."""
        want = {L_INSTANCE: instance or name, **(labels or {})}
        with self.lock:
            job = self.jobs.get((namespace, name))
            candidates = list(self.pods.items()) + [
                (k, p) for k, (_, p) in self.gone.items() if k not in self.pods
            ]
            pods = [
                p
                for (ns, _), p in candidates
                if ns == namespace
                and all((p.metadata.labels or {}).get(k) == v for k, v in want.items())
            ]
        return classify(
            name, namespace, job, pods, now=now, image_pull_timeout_s=image_pull_timeout_s
        )

    def synced(self) -> bool:
        """Every stream has been listed once: the cache can answer."""
        return all(pair in self.streams for pair in self.pairs())

    def inventory_objects(self) -> tuple[list[Any], list[Any]]:
        """The cached Nodes and non-terminal pods, as `inventory_from_nodes` takes them."""
        with self.lock:
            return list(self.nodes.values()), list(self.active.values())

    def run(self, stop: threading.Event) -> list[threading.Thread]:
        """Start one watching thread per namespace and kind, and a resync thread."""
        self.resync()
        threads = []
        for ns, kind in self.pairs():
            t = threading.Thread(
                target=self._loop,
                args=(ns, kind, stop),
                daemon=True,
                name=f"qm-watch-{ns or 'all'}-{kind}",
            )
            t.start()
            threads.append(t)
        t = threading.Thread(target=self._resync_loop, args=(stop,), daemon=True, name="qm-resync")
        t.start()
        threads.append(t)
        self._stop, self._threads = stop, threads
        # A daemon thread still inside the client when the interpreter finalizes is killed
        # as it next takes the GIL, and that forced unwind aborts the whole process (SIGABRT)
        # where it crosses the client's compiled argument validation.
        atexit.register(self.close)
        return threads

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the threads `run()` started and wait for them, at most `timeout_s`: an idle
        watch stream is cut rather than waited out."""
        atexit.unregister(self.close)
        if self._stop is None:
            return
        self._stop.set()
        for response in list(self._open.values()):
            _cut(response)
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _loop(self, ns: str, kind: str, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.watch_once(ns, kind)
            except Exception:  # keep watching; the resync heals the cache
                if stop.is_set():  # a stream cut short as the process stops
                    return
                log.exception("watch %s/%s failed; retrying", ns, kind)
                stop.wait(5)

    def _resync_loop(self, stop: threading.Event) -> None:
        while not stop.wait(min(self.resync_s, 30)):
            try:
                self.maybe_resync()
            except Exception:
                log.exception("resync failed")


def _cut(response: Any) -> None:
    """Wake the thread reading a watch response: shut the socket for reading (its read then
    ends), or close the response where it cannot."""
    try:
        response.shutdown()
    except Exception:  # noqa: BLE001 - released already, or not a socket's response
        try:
            response.close()
        except Exception:  # noqa: BLE001
            pass
