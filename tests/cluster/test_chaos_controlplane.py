"""The control plane rows of the fault table (docs/reliability.md): kube-apiserver, then etcd,
restarted while a stream of submits is admitted and its Jobs created. No attempt gets two Jobs,
none is left unlaunched, and the time to recover is bounded. `manage.py chaos --kubeconfig`
prints the same rows."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import override_settings

import portal.backends
from portal.backends.kubernetes import KubernetesBackend
from portal.management.chaos_cluster import StreamWorld, restart_under_launches
from tests.cluster.kube import Cluster
from tests.cluster.nodes import POOL_SELECTORS
from tests.cluster.world import training_world

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def world(watching: KubernetesBackend, monkeypatch: pytest.MonkeyPatch) -> Iterator[StreamWorld]:
    monkeypatch.setattr(portal.backends, "_backend", lambda name: watching)
    w = training_world("a100", POOL_SELECTORS["a100"])
    # a launch lost to the restart is retried 2 s later, not 10 (the default): a lean test
    with override_settings(LAUNCH_RETRY_BASE_SECONDS=2, LAUNCH_RETRY_MAX_SECONDS=4):
        yield StreamWorld(user=w["user"], team=w["team"], workload_class=w["cls"], pool=w["pool"])


@pytest.mark.parametrize(
    ("fault", "command"),
    [("API server restart", "restart-apiserver"), ("etcd restart", "restart-etcd")],
)
def test_a_control_plane_restart_under_launches_launches_each_attempt_once(
    world: StreamWorld, cluster: Cluster, fault: str, command: str
) -> None:
    row = restart_under_launches(
        fault, lambda: cluster.script(command), world, batch=cluster.batch(), settle_s=40
    )
    print(row)
    assert row["double"] == 0, row
    assert row["jobs"] == row["attempts"] == row["requests"], row
    assert row["stuck"] == 0, row
    assert row["launched_s"] is not None and row["launched_s"] <= 30, row
    assert row["outage_s"] > 0, row
