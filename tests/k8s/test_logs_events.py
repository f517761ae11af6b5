"""Logs and events through KubernetesBackend against the in-memory fake API."""

from __future__ import annotations

from tests.fakes.fake_k8s import FakeCluster
from tests.k8s.builders import NS, backend, cluster_with_nodes, spec

NAME = "qm-42-1"


def _running(cluster: FakeCluster):  # noqa: ANN202
    b = backend(cluster)
    b.launch(spec())
    pod = cluster.start_pod(NS, NAME)
    cluster.run_pod(pod)
    return b, pod


def test_it_reads_the_tail_of_the_newest_pods_main_container() -> None:
    cluster = cluster_with_nodes()
    b, pod = _running(cluster)
    cluster.pod_logs[(NS, pod.metadata.name)] = "".join(f"step {i}\n" for i in range(1, 11))
    assert b.logs(NAME, NS, tail_lines=3) == "step 8\nstep 9\nstep 10\n"
    call = cluster.calls_of("read_namespaced_pod_log")[-1]
    assert (call["name"], call["container"], call["tail_lines"]) == (pod.metadata.name, "main", 3)


def test_a_retried_pod_shows_its_own_log_not_the_first_ones() -> None:
    cluster = cluster_with_nodes()
    b, first = _running(cluster)
    cluster.pod_logs[(NS, first.metadata.name)] = "first try\n"
    cluster.terminate(first, 3)
    cluster.tick(5)
    second = cluster.start_pod(NS, NAME)
    cluster.run_pod(second)
    cluster.pod_logs[(NS, second.metadata.name)] = "second try\n"
    assert b.logs(NAME, NS) == "second try\n"


def test_no_pod_or_a_pending_one_has_an_empty_log() -> None:
    cluster = cluster_with_nodes()
    b = backend(cluster)
    assert b.logs(NAME, NS) == ""
    b.launch(spec())
    cluster.start_pod(NS, NAME)  # Pending: the API answers 400
    assert b.logs(NAME, NS) == ""


def test_a_forbidden_log_read_is_empty_not_an_error() -> None:
    cluster = cluster_with_nodes()
    b, pod = _running(cluster)
    cluster.pod_logs[(NS, pod.metadata.name)] = "secret\n"
    cluster.fail("read_namespaced_pod_log", 403)
    assert b.logs(NAME, NS) == ""


def test_it_lists_the_jobs_and_its_pods_events_oldest_first() -> None:
    cluster = cluster_with_nodes()
    b, pod = _running(cluster)
    cluster.record_event("Job", NAME, NS, "SuccessfulCreate", f"Created pod: {pod.metadata.name}")
    cluster.tick(2)
    cluster.record_event("Pod", pod.metadata.name, NS, "Pulled", "image pulled")
    cluster.tick(2)
    cluster.terminate(pod, 1)
    cluster.record_event(
        "Job", NAME, NS, "BackoffLimitExceeded", "Job has reached the limit", "Warning"
    )
    cluster.record_event("Pod", "qm-other-1-00009", NS, "Pulled", "someone else's")
    events = b.events(NAME, NS)
    assert [(e.object, e.reason) for e in events] == [
        (f"Job/{NAME}", "SuccessfulCreate"),
        (f"Pod/{pod.metadata.name}", "Pulled"),
        (f"Job/{NAME}", "BackoffLimitExceeded"),
    ]
    assert events[-1].type == "Warning"


def test_a_gangs_logs_are_rank_zeros_unless_a_pod_is_named() -> None:
    cluster = cluster_with_nodes()
    b = backend(cluster)
    for rank in (0, 1):
        member = f"{NAME}-{rank}"
        b.launch(spec(name=member))
        pod = cluster.start_pod(NS, member)
        cluster.run_pod(pod)
        cluster.pod_logs[(NS, pod.metadata.name)] = f"rank {rank}\n"
    assert b.logs(NAME, NS, pods=2) == "rank 0\n"
    # Each pod of the gang on its own, by rank (the API's ?pod=N).
    assert b.logs(NAME, NS, pods=2, pod=1) == "rank 1\n"
