"""The Job/pod watch: events applied, 410 Gone relists, resync heals, deleted pods remembered.

Real-cluster twins: tests/cluster/test_failures.py (etcd compaction and an apiserver restart
give a real 410) and tests/cluster/test_watch.py (one watch per forked worker process)."""

from __future__ import annotations

import threading

from portal.backends.base import Outcome
from portal.k8s.names import MANAGED_SELECTOR
from portal.k8s.watch import WorkloadWatcher
from tests.fakes.fake_k8s import FakeCluster, FakeWatch, apis
from tests.k8s.builders import NS, backend, cluster_with_nodes, spec


def watcher(cluster: FakeCluster, **kw) -> WorkloadWatcher:  # noqa: ANN003
    core, batch = apis(cluster)
    fw = kw.pop("watch", None) or FakeWatch(cluster)
    return WorkloadWatcher(core, batch, [NS], watch_factory=lambda: fw, **kw)


def listed(cluster: FakeCluster) -> tuple[dict, dict]:
    """The list-based truth: what a fresh list would give (names -> resourceVersion)."""
    core, batch = apis(cluster)
    jobs = {
        j.metadata.name: j.metadata.resource_version
        for j in batch.list_namespaced_job(NS, label_selector=MANAGED_SELECTOR).items
    }
    pods = {
        p.metadata.name: p.metadata.resource_version
        for p in core.list_namespaced_pod(NS, label_selector=MANAGED_SELECTOR).items
    }
    return jobs, pods


def cached(w: WorkloadWatcher) -> tuple[dict, dict]:
    return (
        {n: j.metadata.resource_version for (_, n), j in w.jobs.items()},
        {n: p.metadata.resource_version for (_, n), p in w.pods.items()},
    )


def drive(w: WorkloadWatcher) -> None:
    for kind in ("jobs", "pods"):
        w.watch_once(NS, kind)


def test_it_follows_events_after_the_first_list() -> None:
    cluster = cluster_with_nodes()
    w = watcher(cluster)
    drive(w)  # lists first
    b = backend(cluster)
    b.launch(spec())
    pod = cluster.start_pod(NS, "qm-42-1")
    cluster.run_pod(pod)
    drive(w)
    assert cached(w) == listed(cluster)
    assert w.status("qm-42-1", NS, now=cluster.now).outcome is Outcome.RUNNING


def test_a_410_gone_relists_and_misses_nothing() -> None:
    """FI-08: the watch answers 410 Gone (resource version compacted); the watcher relists and
    its cache equals a list-based diff; later events are still seen."""
    cluster = cluster_with_nodes()
    w = watcher(cluster)
    drive(w)
    b = backend(cluster)
    b.launch(spec())
    cluster.run_pod(cluster.start_pod(NS, "qm-42-1"))
    b.launch(spec(name="qm-50-1", request_id=50, attempt_id=11))
    cluster.compact()  # the events above are gone from the server's history
    drive(w)
    assert cached(w) == listed(cluster)
    assert w.streams[(NS, "jobs")].relists == 2 and w.streams[(NS, "pods")].relists == 2
    cluster.complete_job(NS, "qm-42-1")
    drive(w)
    assert cached(w) == listed(cluster)
    assert w.status("qm-42-1", NS).outcome is Outcome.SUCCEEDED


def test_a_410_in_the_middle_of_a_stream_relists() -> None:
    """FI-08: Gone after some events of a stream; the relist picks up the rest."""
    cluster = cluster_with_nodes()
    fw = FakeWatch(cluster, gone_after=1)
    w = watcher(cluster, watch=fw)
    drive(w)
    b = backend(cluster)
    for n in range(3):
        b.launch(spec(name=f"qm-6{n}-1", request_id=60 + n, attempt_id=60 + n))
    w.watch_once(NS, "jobs")
    assert cached(w)[0] == listed(cluster)[0]
    assert w.streams[(NS, "jobs")].relists == 2


def test_the_watch_resumes_from_the_last_resource_version() -> None:
    cluster = cluster_with_nodes()
    fw = FakeWatch(cluster)
    w = watcher(cluster, watch=fw)
    drive(w)
    backend(cluster).launch(spec())
    w.watch_once(NS, "jobs")
    w.watch_once(NS, "jobs")
    first, second = [s for s in fw.streams if s["kind"] == "jobs"][-2:]
    assert second["resource_version"] > first["resource_version"]


def test_a_resync_heals_what_a_watch_missed() -> None:
    cluster = cluster_with_nodes()
    clock = [0.0]
    w = watcher(cluster, resync_s=300, clock=lambda: clock[0])
    w.resync()
    backend(cluster).launch(spec())
    assert not w.maybe_resync()
    clock[0] = 301
    assert w.maybe_resync()
    assert cached(w) == listed(cluster)


def test_it_remembers_why_a_deleted_pod_ended() -> None:
    """FI-09 / FI-13 with the watch: the preempted or node-lost pod is deleted and the Job
    replaces it; the watcher kept the final state, so the status still says why."""
    for reason, outcome in (
        ("DeletionByTaintManager", Outcome.NODE_LOST),
        ("PreemptionByScheduler", Outcome.PREEMPTED),
    ):
        cluster = cluster_with_nodes()
        w = watcher(cluster)
        drive(w)
        backend(cluster).launch(spec())
        pod = cluster.start_pod(NS, "qm-42-1")
        cluster.run_pod(pod)
        cluster.disrupt(pod, reason)
        drive(w)
        assert (
            w.status("qm-42-1", NS, now=cluster.now).outcome is Outcome.RUNNING
        )  # still terminating
        cluster.finish_pod_deletion(pod)
        cluster.reconcile_job(NS, "qm-42-1")
        drive(w)
        st = w.status("qm-42-1", NS, now=cluster.now)
        assert (st.outcome, st.reason) == (outcome, reason)


def test_the_backend_answers_from_the_watch_once_synced() -> None:
    cluster = cluster_with_nodes()
    b = backend(cluster, watch_namespaces=[NS])
    stop = threading.Event()
    threads = b.start_watching(stop, watch_factory=lambda: FakeWatch(cluster))
    try:
        assert b.watcher is not None and b.watcher.synced()
        before = len(cluster.calls_of("read_namespaced_job"))
        assert b.status("qm-42-1", NS).outcome is Outcome.MISSING
        assert len(cluster.calls_of("read_namespaced_job")) == before
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
