"""The inventory's watch: Nodes and non-terminal pods cached by watches (add, modify, delete,
410 Gone relists, resync), read by `inventory()` once synced, one watch per process.

Real-cluster twin and the request counts: tests/cluster/test_inventory_watch.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from portal.backends.kubernetes import KubernetesBackend
from portal.k8s import watch as watch_module
from portal.k8s.names import ACTIVE_SELECTOR
from portal.k8s.watch import WorkloadWatcher
from tests.fakes.fake_k8s import FakeCluster, FakeWatch, apis, foreign_pod
from tests.k8s.builders import a100_node, backend, cluster_with_nodes


def watcher(cluster: FakeCluster, **kw: Any) -> WorkloadWatcher:
    core, _ = apis(cluster)
    fw = kw.pop("watch", None) or FakeWatch(cluster)
    return WorkloadWatcher(core, None, (), watch_factory=lambda: fw, inventory=True, **kw)


def drive(w: WorkloadWatcher) -> None:
    for ns, kind in w.pairs():
        w.watch_once(ns, kind)


def listed(cluster: FakeCluster) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """What a fresh list gives (the polling inventory's view): names -> resourceVersion."""
    core, _ = apis(cluster)
    nodes = {n.metadata.name: n.metadata.resource_version for n in core.list_node().items}
    pods = {
        (p.metadata.namespace, p.metadata.name): p.metadata.resource_version
        for p in core.list_pod_for_all_namespaces(field_selector=ACTIVE_SELECTOR).items
    }
    return nodes, pods


def cached(w: WorkloadWatcher) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    nodes, pods = w.inventory_objects()
    return (
        {n.metadata.name: n.metadata.resource_version for n in nodes},
        {(p.metadata.namespace, p.metadata.name): p.metadata.resource_version for p in pods},
    )


def finish(cluster: FakeCluster, pod: Any, phase: str = "Succeeded") -> None:
    pod.status.phase = phase
    cluster._update_pod(pod)


def delete(cluster: FakeCluster, pod: Any) -> None:
    del cluster.pods[(pod.metadata.namespace, pod.metadata.name)]
    cluster._emit("pods", pod.metadata.namespace, "DELETED", pod)


def test_it_follows_nodes_and_pods_added_modified_and_deleted() -> None:
    cluster = cluster_with_nodes()
    w = watcher(cluster)
    drive(w)  # lists first
    assert w.streams[("", "nodes")].relists == 1
    cluster.add_node(a100_node("gpu-b"))
    cluster.set_node_labels("gpu-a", **{"quartermaster.io/pool": "other"})
    cluster.node_not_ready("gpu-mig")
    cluster.delete_node("gpu-ts")
    stays = foreign_pod("stays", "gpu-a", {"nvidia.com/gpu": "1"})
    ends = foreign_pod("ends", "gpu-a", {"nvidia.com/gpu": "1"}, namespace="batch")
    gone = foreign_pod("gone", "gpu-b", {"cpu": "1"})
    for pod in (stays, ends, gone):
        cluster.add_pod(pod)
    finish(cluster, ends)  # out of the field selector: arrives as DELETED
    delete(cluster, gone)
    drive(w)
    # Only events, no new list: the watch carried on from the list's resourceVersion.
    assert len(cluster.calls_of("list_node")) == 1
    assert w.streams[("", "nodes")].relists == 1 and w.streams[("", "active")].relists == 1
    assert cached(w) == listed(cluster)
    assert set(cached(w)[0]) == {"gpu-a", "gpu-b", "gpu-mig"}
    assert set(cached(w)[1]) == {("other", "stays")}
    assert w.nodes[("", "gpu-a")].metadata.labels["quartermaster.io/pool"] == "other"


def test_a_410_gone_relists_nodes_and_pods_and_misses_nothing() -> None:
    cluster = cluster_with_nodes()
    w = watcher(cluster)
    drive(w)
    cluster.add_node(a100_node("gpu-b"))
    cluster.add_pod(foreign_pod("p", "gpu-b", {"nvidia.com/gpu": "1"}))
    cluster.delete_node("gpu-ts")
    cluster.compact()  # the events above are gone from the server's history
    drive(w)
    assert w.streams[("", "nodes")].relists == 2 and w.streams[("", "active")].relists == 2
    assert cached(w) == listed(cluster)
    cluster.delete_node("gpu-b")
    drive(w)
    assert cached(w) == listed(cluster) and ("", "gpu-b") not in w.nodes


def test_a_410_in_the_middle_of_a_stream_relists() -> None:
    cluster = cluster_with_nodes()
    w = watcher(cluster, watch=FakeWatch(cluster, gone_after=1))
    drive(w)
    for name in ("gpu-b", "gpu-c", "gpu-d"):
        cluster.add_node(a100_node(name))
    w.watch_once("", "nodes")
    assert w.streams[("", "nodes")].relists == 2
    assert cached(w)[0] == listed(cluster)[0]


def test_a_resync_heals_what_a_watch_missed() -> None:
    clock = [0.0]
    cluster = cluster_with_nodes()
    w = watcher(cluster, clock=lambda: clock[0], resync_s=300)
    w.resync()
    # A change the watch never delivers (as if the stream had dropped it).
    cluster.nodes["gpu-a"].metadata.labels["quartermaster.io/pool"] = "other"
    cluster._bump(cluster.nodes["gpu-a"])
    assert not w.maybe_resync()
    clock[0] = 301
    assert w.maybe_resync()
    assert w.nodes[("", "gpu-a")].metadata.labels["quartermaster.io/pool"] == "other"


def test_it_watches_pods_per_namespace_when_not_allowed_cluster_wide() -> None:
    cluster = cluster_with_nodes()
    cluster.pod_read_namespaces = {"other"}
    fw = FakeWatch(cluster)
    w = watcher(cluster, watch=fw, pod_namespaces=["other"])
    drive(w)
    cluster.add_pod(foreign_pod("p", "gpu-a", {"nvidia.com/gpu": "1"}))
    cluster.add_pod(foreign_pod("elsewhere", "gpu-a", {"nvidia.com/gpu": "1"}, namespace="x"))
    drive(w)
    assert set(cached(w)[1]) == {("other", "p")}
    assert [c["field_selector"] for c in cluster.calls_of("list_namespaced_pod")] == [
        ACTIVE_SELECTOR
    ]
    assert {s["namespace"] for s in fw.streams if s["kind"] == "pods"} == {"other"}


class PacedWatch(FakeWatch):
    """A FakeWatch whose streams last a moment, so a watching thread does not spin."""

    def stream(self, func: Any, *args: Any, **kw: Any) -> Iterator[dict[str, Any]]:
        yield from super().stream(func, *args, **kw)
        time.sleep(0.05)


@pytest.fixture
def stops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[threading.Event]]:
    """Every watcher started in the test is stopped at its end."""
    events: list[threading.Event] = []
    run = watch_module.WorkloadWatcher.run

    def tracked(self: WorkloadWatcher, stop: threading.Event) -> list[threading.Thread]:
        events.append(stop)
        return run(self, stop)

    monkeypatch.setattr(watch_module.WorkloadWatcher, "run", tracked)
    yield events
    for e in events:
        e.set()


def watching(cluster: FakeCluster, **kw: Any) -> KubernetesBackend:
    return backend(cluster, watch_inventory=True, watch_factory=lambda: PacedWatch(cluster), **kw)


def test_inventory_reads_the_cache_once_synced(stops: list[threading.Event]) -> None:
    cluster = cluster_with_nodes()
    cluster.add_pod(foreign_pod("p", "gpu-a", {"nvidia.com/gpu": "1"}))
    b = watching(cluster)
    polled = backend(cluster).inventory()
    lists = len(cluster.calls_of("list_node"))
    for _ in range(5):
        assert b.inventory() == polled
    # The watcher's first list, then nothing: every tick read the cache.
    assert len(cluster.calls_of("list_node")) == lists + 1
    assert len(cluster.calls_of("list_pod_for_all_namespaces")) == lists + 1
    cluster.add_node(a100_node("gpu-b"))

    def seen() -> bool:
        return "gpu-b" in {n.name for n in b.inventory()}

    deadline = time.monotonic() + 5
    while not seen() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen()
    assert len(cluster.calls_of("list_node")) == lists + 1


def test_inventory_lists_while_the_watch_cannot_start(stops: list[threading.Event]) -> None:
    cluster = cluster_with_nodes()
    cluster.fail("list_node", 500)  # the watcher's first list
    b = watching(cluster)
    assert {n.name for n in b.inventory()} == {"gpu-a", "gpu-mig", "gpu-ts"}
    assert b.inventory_watcher is None
    assert b.inventory() and b.inventory_watcher is not None  # the next call starts it


def test_a_forked_process_watches_for_itself(
    stops: list[threading.Event], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = cluster_with_nodes()
    b = watching(cluster)
    b.inventory()
    parent = b.inventory_watcher
    assert parent is not None and len(stops) == 1
    b.inventory()
    assert b.inventory_watcher is parent
    # A prefork child: same objects, another pid, none of the parent's threads.
    monkeypatch.setattr("portal.backends.kubernetes.os.getpid", lambda: 999_999)
    assert b.inventory()
    child = b.inventory_watcher
    assert child is not None and child is not parent and b.inventory_pid == 999_999
    assert len(stops) == 2 and child.streams[("", "nodes")].relists == 1
    assert len(cluster.calls_of("list_node")) == 2


def test_status_only_processes_start_no_inventory_watch(stops: list[threading.Event]) -> None:
    cluster = cluster_with_nodes()
    b = watching(cluster)
    b.status("qm-42-1", "team-a")
    assert b.inventory_watcher is None and stops == []
