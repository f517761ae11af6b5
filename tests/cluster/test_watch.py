"""One watch per worker process: a Celery prefork child inherits the backend (and its watchers,
of Jobs and pods and of the inventory's nodes and pods) through fork but not the watchers'
threads, and must start its own list+watch. The fake-based twins are in tests/k8s/test_watch.py
and tests/k8s/test_inventory_watch.py."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

from kubernetes import client

from portal.backends.base import Outcome
from portal.backends.kubernetes import KubernetesBackend
from tests.cluster.conftest import JOB_OPTIONS
from tests.cluster.kube import Cluster, token_kubeconfig, wait_for
from tests.cluster.nodes import POOL_SELECTORS
from tests.cluster.specs import launch_spec


def test_a_forked_worker_process_watches_for_itself(
    qm_api: client.ApiClient, cluster: Cluster, gpu_nodes: Any, tmp_path: Path
) -> None:
    # As from_settings builds it: clients loaded lazily from a kubeconfig, auto_watch on.
    backend = KubernetesBackend(
        kubeconfig=str(token_kubeconfig(cluster, qm_api, tmp_path / "kubeconfig")),
        job_options=JOB_OPTIONS,
        pool_selectors=POOL_SELECTORS,
        watch_namespaces=["team-a"],
        auto_watch=True,
        watch_inventory=True,
    )
    spec = launch_spec(node="a100-0", image="qm.test/ok")
    parent_watcher = backend.current_watcher()
    assert parent_watcher is not None and backend.watch_pid == os.getpid()
    parent_inventory = sorted(n.name for n in backend.inventory())
    parent_nodes = backend.inventory_watcher
    assert parent_nodes is not None and backend.inventory_pid == os.getpid()
    backend.launch(spec)

    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            st = wait_for(
                "success in the child",
                lambda: (
                    (s := backend.status(spec.name, spec.namespace)).outcome == Outcome.SUCCEEDED
                    and s
                ),
                30,
            )
            w = backend.watcher
            inventory = sorted(n.name for n in backend.inventory())
            nodes = backend.inventory_watcher
            threads = [t.name for t in threading.enumerate() if t.name.startswith("qm-watch-")]
            send.send(
                {
                    "outcome": st.outcome.value,
                    "own_watcher": w is not None and w is not parent_watcher,
                    "watch_pid": backend.watch_pid == os.getpid(),
                    "inventory": inventory,
                    "own_nodes_watcher": nodes is not None
                    and nodes is not parent_nodes
                    and backend.inventory_pid == os.getpid(),
                    "threads": sorted(threads),
                    "events": w.streams[("team-a", "pods")].events if w else 0,
                }
            )
        except BaseException as exc:  # report, never hang the parent
            send.send({"error": repr(exc)})

    proc = ctx.Process(target=child)
    proc.start()
    assert recv.poll(60), "the child said nothing"
    got = recv.recv()
    proc.join(30)
    assert "error" not in got, got
    assert got["outcome"] == "succeeded"
    assert got["own_watcher"] and got["watch_pid"]
    assert got["own_nodes_watcher"] and got["inventory"] == parent_inventory
    assert got["threads"] == [
        "qm-watch-all-active",
        "qm-watch-all-nodes",
        "qm-watch-team-a-jobs",
        "qm-watch-team-a-pods",
    ]
    # the parent's watchers are untouched and still its own
    assert backend.watcher is parent_watcher and backend.watch_pid == os.getpid()
    assert backend.inventory_watcher is parent_nodes and backend.inventory_pid == os.getpid()
