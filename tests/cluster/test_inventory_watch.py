"""The inventory read from watches against the real apiserver, and what that saves: the
apiserver's own count of the requests (`apiserver_request_total`, by verb) for nodes and pods
while the portal ticks, polling (a LIST of each per tick) and then watching.

The figures in docs/kubernetes.md come from this test; it prints them (`-s`):

    QM_BENCH_SECONDS=60 .venv/bin/python -m pytest tests/cluster/test_inventory_watch.py -s

QM_BENCH_NODES (default 200) kwok nodes; QM_BENCH_SECONDS (default 15, short for CI) per phase;
QM_BENCH_TICK_SECONDS (default 3, the TICK_SECONDS default) between inventory reads.
The fake-based twins are in tests/k8s/test_inventory_watch.py."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from portal.backends.kubernetes import KubernetesBackend
from tests.cluster.kube import Cluster, node_settled, wait_for
from tests.cluster.nodes import POOL, a100

NODES = int(os.environ.get("QM_BENCH_NODES", "200"))
SECONDS = float(os.environ.get("QM_BENCH_SECONDS", "15"))
TICK_S = float(os.environ.get("QM_BENCH_TICK_SECONDS", "3"))
SELECTORS = {"bench": {POOL: "bench"}}
READS = ("LIST", "WATCH", "GET")


Key = tuple[str, str, str]


def requests_started(api: client.ApiClient) -> Counter[Key]:
    """Requests the apiserver has started for nodes and pods, by (verb, resource, scope).

    `apiserver_request_total` counts a watch when it ends; the open ones are
    `apiserver_longrunning_requests`, so their sum counts each watch from its start.
    """
    method, url, headers, body, _ = api.param_serialize("GET", "/metrics", auth_settings=[])
    resp = api.call_api(method, url, header_params=headers, body=body)
    text = resp.read().decode()
    out: Counter[Key] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name not in ("apiserver_request", "apiserver_longrunning_requests"):
            continue
        for s in family.samples:
            labels = s.labels
            if s.name.endswith("_created") or labels.get("subresource"):
                continue
            if labels.get("resource") in ("nodes", "pods") and labels.get("verb") in READS:
                out[(labels["verb"], labels["resource"], labels.get("scope", ""))] += int(s.value)
    return out


@pytest.fixture
def bench_nodes(cluster: Cluster) -> Iterator[list[str]]:
    core = cluster.core()
    names = [f"bench-a100-{i:03d}" for i in range(NODES)]
    for name in names:
        core.create_node(a100(name, pool="bench"))
    # kwok's start-up work on new nodes is not the portal's: let it finish before counting.
    wait_for(
        f"{NODES} nodes Ready",
        lambda: all(node_settled(n) for n in core.list_node(label_selector=f"{POOL}=bench").items),
        120,
    )
    yield names
    for name in names:
        core.delete_node(name)


def phase(api: client.ApiClient, read: Callable[[], object] | None) -> tuple[Counter[Key], int]:
    """Requests per minute while `read` runs every TICK_S for SECONDS (None: nobody reads)."""
    before = requests_started(api)
    start = time.monotonic()
    ticks = 0
    while time.monotonic() - start < SECONDS:
        if read is not None:
            read()
            ticks += 1
        time.sleep(max(0.0, start + ticks * TICK_S - time.monotonic()) if read else TICK_S)
    elapsed = time.monotonic() - start
    delta = requests_started(api) - before
    return Counter({k: round(v * 60 / elapsed) for k, v in delta.items()}), ticks


def test_watching_reads_the_same_inventory_with_far_fewer_requests(
    cluster: Cluster, bench_nodes: list[str]
) -> None:
    admin = cluster.api()
    core, batch = client.CoreV1Api(admin), client.BatchV1Api(admin)
    poll = KubernetesBackend(core=core, batch=batch, pool_selectors=SELECTORS)
    watch = KubernetesBackend(core=core, batch=batch, pool_selectors=SELECTORS)
    assert len(poll.inventory()) == NODES

    idle_before, _ = phase(admin, None)
    polling, ticks = phase(admin, poll.inventory)
    stop = threading.Event()

    def read_watching() -> object:
        if watch.inventory_watcher is None:
            # What the first inventory() of a worker process does (current_inventory_watcher).
            watch.start_watching_inventory(stop)
        return watch.inventory()

    try:
        watching, _ = phase(admin, read_watching)
        assert watch.inventory_watcher is not None and watch.inventory_watcher.synced()
        assert watch.inventory() == poll.inventory()
    finally:
        stop.set()
    idle_after, _ = phase(admin, None)
    # The rest of the control plane (kwok, controllers) reads too: its rate, idle before and
    # after, is the baseline.
    idle = Counter({k: (idle_before[k] + idle_after[k]) // 2 for k in idle_before | idle_after})

    def rate(c: Counter[Key], key: Key) -> int:
        return max(0, c[key] - idle[key])

    print(f"\n{NODES} nodes, {ticks} inventory reads in {SECONDS:.0f}s (one per {TICK_S:g}s)")
    print("requests/min of nodes and pods beyond the idle control plane's (verb resource scope):")
    for key in sorted({k for c in (polling, watching, idle) for k in c}):
        print(
            f"  {' '.join(key):28} polling {rate(polling, key):4}  watching {rate(watching, key):4}"
            f"  (idle {idle_before[key]}, {idle_after[key]})"
        )
    # Polling lists nodes and pods on every read; watching lists each once, then watches.
    per_min = 60 / SECONDS
    nodes = ("LIST", "nodes", "cluster")
    assert rate(polling, nodes) >= (ticks - 1) * per_min
    assert rate(watching, nodes) <= per_min
    assert rate(watching, ("WATCH", "nodes", "cluster")) <= per_min
