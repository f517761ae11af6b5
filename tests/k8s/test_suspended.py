"""A portal Job that another controller (Kueue) suspended is named as such, not waited on
silently: the portal never suspends its own Jobs (docs/kubernetes.md, "Running beside Kueue").
Real-cluster twin: tests/cluster/test_kueue.py."""

from __future__ import annotations

from portal.backends.base import SUSPENDED_BY_OTHERS, Outcome
from tests.k8s.builders import NS, backend, cluster_with_nodes, spec

NAME = "qm-42-1"


def test_a_job_suspended_by_kueue_is_pending_and_says_who() -> None:
    cluster = cluster_with_nodes()
    b = backend(cluster)
    b.launch(spec())
    job = cluster.job(NS, NAME)
    assert not job.spec.suspend, "the portal creates its Jobs unsuspended"
    assert b.status(NAME, NS).reason == "NoPod"
    job.spec.suspend = True
    job.metadata.annotations = {"kueue.x-k8s.io/queue-name": "team-queue"}
    st = b.status(NAME, NS)
    assert (st.outcome, st.reason) == (Outcome.PENDING, SUSPENDED_BY_OTHERS)
    assert "suspended by Kueue" in st.message and "Running beside Kueue" in st.message
    job.metadata.annotations = {}
    assert "another controller" in b.status(NAME, NS).message
    # resumed: its pod starts and it runs as any other
    job.spec.suspend = False
    cluster.run_pod(cluster.start_pod(NS, NAME))
    assert b.status(NAME, NS).outcome is Outcome.RUNNING
