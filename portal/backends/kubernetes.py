"""The Kubernetes cluster backend: the ClusterBackend protocol over the portal/k8s package.

Loads kubeconfig (or the in-cluster service account) lazily, on the first
call, so that importing this module, or running with the simulated backend,
never needs a cluster. Every API call goes through the portal/k8s package; tests pass
the in-memory fake's CoreV1Api/BatchV1Api to the constructor.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from portal.backends.base import (
    DiscoveredNode,
    InventoryNode,
    LaunchSpec,
    Outcome,
    ValidationSpec,
    ValidationStatus,
    WorkloadEvent,
    WorkloadStatus,
    checkpoint_claim,
    gang_status,
    member_name,
)
from portal.k8s import gpu_operator, provisioning
from portal.k8s.inventory import (
    gpu_nodes_discovered,
    inventory_from_nodes,
    node_facts,
    nodes_list_gpu,
    pods_list_active,
)
from portal.k8s.jobs import (
    JobOptions,
    checkpoint_pvc_build,
    gang_build,
    job_build,
    job_create,
    job_delete,
    job_read,
    owner_reference,
    pods_for_workload,
    pvc_create,
    pvc_delete,
    service_create,
    service_delete,
)
from portal.k8s.jobset import (
    GANG_APIS,
    JOB_INDEX,
    jobset_build,
    jobset_create,
    jobset_delete,
    jobset_fits,
    jobset_installed,
    jobset_read,
    jobset_status,
    rank_selector,
    rank_status_read,
)
from portal.k8s.jobset import job_name as jobset_job_name
from portal.k8s.logs import pod_log, workload_events
from portal.k8s.names import built
from portal.k8s.serving import (
    deployment_build,
    rollout_patch,
    serving_replica_endpoints,
    serving_status,
)
from portal.k8s.status import workload_status
from portal.k8s.validation import validation_job_build, validation_status_from_job
from portal.k8s.watch import WorkloadWatcher

log = logging.getLogger(__name__)

PoolSelectors = Mapping[str, Mapping[str, str]]


class KubernetesBackend:
    """Inventory from Node objects, attempts as `batch/v1` Jobs, status from Jobs and pods.

    - `pool_selectors`: {pool: {label: value}} or a callable returning it (the
      Pool rows' `node_selector`); None uses each node's `quartermaster.io/pool` label.
    - `pod_namespaces`: where to read pods that hold capacity; None reads
      cluster-wide (needs the chart's `rbac.readPodsClusterWide`), else only
      these namespaces (a cluster whose GPU nodes run nothing else).
    - `watch_namespaces`: namespaces whose Jobs and pods `start_watching()`
      keeps in a cache; `status()` answers from it once synced.
    - `auto_watch`: start that watch on the first `status()` of each process. A watch
      belongs to the process that started it: a Celery prefork child inherits the parent's
      watcher object through fork but not its threads, so it starts its own (one watcher
      per worker process, list then watch).
    - `watch_inventory`: likewise keep every Node and the non-terminal pods (those
      `pod_namespaces` says) by watches, started on the first `inventory()` of each
      process; `inventory()` reads that cache once synced, and lists before.
    """

    name = "kubernetes"

    def __init__(
        self,
        *,
        core: Any = None,
        batch: Any = None,
        job_options: JobOptions | None = None,
        pool_selectors: PoolSelectors | Callable[[], PoolSelectors] | None = None,
        pod_namespaces: Sequence[str] | None = None,
        watch_namespaces: Sequence[str] = (),
        in_cluster: bool = False,
        kubeconfig: str | None = None,
        context: str | None = None,
        image_pull_timeout_s: int = 600,
        require_mig_state: bool = True,
        auto_watch: bool = False,
        watch_inventory: bool = False,
        watch_factory: Callable[[], Any] | None = None,
        custom: Any = None,
        provisioning_namespace: str = "quartermaster",
        now: Callable[[], datetime] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        apps: Any = None,
        validation_image: str = "",
        gang_api: str = "auto",
        driver_api: str = "auto",
        driver_repository: str = "",
        driver_image: str = "nvcr.io/nvidia/driver",
        dcgm_image: str = "",
        gpu_operator_namespace: str = "gpu-operator",
    ) -> None:
        if driver_api not in gpu_operator.DRIVER_APIS:
            raise ValueError(
                "GPU_OPERATOR_DRIVER_API must be one of "
                f"{', '.join(gpu_operator.DRIVER_APIS)}, not {driver_api!r}"
            )
        #: GPU_OPERATOR_DRIVER_API, and the NVIDIADriver image it writes (docs/lifecycle.md)
        self.driver_api = driver_api
        self.driver_repository = driver_repository
        self.driver_image = driver_image
        #: the burn-in's `dcgmi diag` image (VALIDATION_DCGM_IMAGE)
        self.dcgm_image = dcgm_image
        #: where the GPU Operator runs its operands (GPU_OPERATOR_NAMESPACE)
        self.gpu_operator_namespace = gpu_operator_namespace
        if gang_api not in GANG_APIS:
            raise ValueError(
                f"K8S_GANG_API must be one of {', '.join(GANG_APIS)}, not {gang_api!r}"
            )
        #: K8S_GANG_API: "auto" (a JobSet where its CRD is served), "jobs" or "jobset"
        self.gang_api = gang_api
        #: what "auto" found, once asked (None: not asked yet, or the question failed)
        self._jobset_found: bool | None = None
        self._core = core
        #: the burn-in image (nvidia-smi, nccl-tests, dcgmi, PyTorch): VALIDATION_IMAGE
        self.validation_image = validation_image
        self._batch = batch
        self._apps = apps
        self._custom = custom
        self.provisioning_namespace = provisioning_namespace
        self.job_options = job_options or JobOptions()
        self._pool_selectors = pool_selectors
        self.pod_namespaces = list(pod_namespaces) if pod_namespaces is not None else None
        self.watch_namespaces = list(watch_namespaces)
        self.in_cluster = in_cluster
        self.kubeconfig = kubeconfig
        self.context = context
        self.image_pull_timeout_s = image_pull_timeout_s
        self.require_mig_state = require_mig_state
        self._now = now
        self._sleep = sleep
        self._facts: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.watcher: WorkloadWatcher | None = None
        self.auto_watch = auto_watch
        #: the process whose threads keep `watcher` current
        self.watch_pid: int | None = None
        self.watch_inventory = watch_inventory
        self.inventory_watcher: WorkloadWatcher | None = None
        self.inventory_pid: int | None = None
        #: makes the `kubernetes.watch.Watch`es of watchers started here (tests pass a fake)
        self.watch_factory = watch_factory
        #: the process that loaded the clients from kubeconfig (None: passed in)
        self._load_pid: int | None = None

    # -- configuration -------------------------------------------------------------

    @classmethod
    def from_settings(cls) -> KubernetesBackend:
        """Build the backend from Django settings (called only when CLUSTER_BACKEND=kubernetes).

        Every K8S_* setting is optional; lists may be Python lists or comma-separated
        strings (as the chart's ConfigMap sets them).
        """
        from django.conf import settings

        def setting(name: str, default: Any) -> Any:
            return getattr(settings, name, default)

        from portal.lib.readiness import ready_token_key

        key = ready_token_key()
        options = JobOptions(
            portal_url=setting("K8S_PORTAL_URL", ""),
            ready_image=setting("K8S_READY_IMAGE", ""),
            ready_token_key=key,
            ready_timeout_s=int(setting("K8S_READY_TIMEOUT_SECONDS", 300)),
            fail_exit_codes=tuple(int(c) for c in _items(setting("K8S_FAIL_EXIT_CODES", (137,)))),
            backoff_limit=int(setting("K8S_BACKOFF_LIMIT", 2)),
            ttl_seconds_after_finished=int(setting("K8S_JOB_TTL_SECONDS", 86400)),
            termination_grace_s=int(setting("K8S_TERMINATION_GRACE_SECONDS", 30)),
            run_as_user=int(setting("K8S_RUN_AS_USER", 1000)),
            run_as_group=int(setting("K8S_RUN_AS_GROUP", 1000)),
            fs_group=int(setting("K8S_FS_GROUP", 1000)),
            service_account=setting("K8S_WORKLOAD_SERVICE_ACCOUNT", ""),
            image_pull_secrets=tuple(_items(setting("K8S_IMAGE_PULL_SECRETS", ()))),
            runtime_class=setting("K8S_RUNTIME_CLASS", ""),
            allowed_images=tuple(_items(setting("K8S_ALLOWED_IMAGES", ()))),
            checkpoint_storage_class=setting("CHECKPOINT_STORAGE_CLASS", ""),
            checkpoint_size=setting("CHECKPOINT_SIZE", "50Gi"),
            checkpoint_access_mode=setting("CHECKPOINT_ACCESS_MODE", "ReadWriteOnce"),
            checkpoint_portal_url=setting("CHECKPOINT_PORTAL_URL", ""),
        )
        pod_ns = _items(setting("K8S_POD_NAMESPACES", ()))
        return cls(
            job_options=options,
            pool_selectors=_pool_selectors_from_db,
            pod_namespaces=pod_ns or None,
            watch_namespaces=_items(setting("K8S_WATCH_NAMESPACES", ())),
            in_cluster=bool(setting("K8S_IN_CLUSTER", False)),
            kubeconfig=setting("KUBECONFIG", None) or None,
            image_pull_timeout_s=int(setting("IMAGE_PULL_TIMEOUT_SECONDS", 600)),
            require_mig_state=bool(setting("K8S_REQUIRE_MIG_CONFIG_STATE", True)),
            auto_watch=True,
            watch_inventory=bool(setting("K8S_WATCH_INVENTORY", True)),
            validation_image=setting("VALIDATION_IMAGE", ""),
            provisioning_namespace=setting("K8S_PROVISIONING_NAMESPACE", "quartermaster"),
            gang_api=setting("K8S_GANG_API", "auto"),
            driver_api=setting("GPU_OPERATOR_DRIVER_API", "auto"),
            driver_repository=setting("GPU_OPERATOR_DRIVER_REPOSITORY", ""),
            driver_image=setting("GPU_OPERATOR_DRIVER_IMAGE", "nvcr.io/nvidia/driver"),
            gpu_operator_namespace=setting("GPU_OPERATOR_NAMESPACE", "gpu-operator"),
            dcgm_image=setting("VALIDATION_DCGM_IMAGE", ""),
        )

    def _forget_if_forked(self) -> None:
        if self._load_pid is not None and self._load_pid != os.getpid():
            # Connections pooled before a fork are shared with the parent: load anew.
            with self._lock:
                self._core = self._batch = self._custom = None
                self._load_pid = None

    def _load(self) -> None:
        self._forget_if_forked()
        if self._core is not None and self._batch is not None:
            return
        from kubernetes import client, config

        with self._lock:
            if self._core is None or self._batch is None:
                if self.in_cluster:
                    config.load_incluster_config()  # type: ignore[no-untyped-call]
                else:
                    config.load_kube_config(config_file=self.kubeconfig, context=self.context)  # type: ignore[no-untyped-call]
                self._core = self._core or client.CoreV1Api()
                self._batch = self._batch or client.BatchV1Api()
                self._load_pid = os.getpid()

    @property
    def core(self) -> Any:
        self._load()
        return self._core

    @property
    def batch(self) -> Any:
        self._load()
        return self._batch

    @property
    def apps(self) -> Any:
        """AppsV1Api: the Deployments of serving workloads."""
        if self._apps is None:
            from kubernetes import client

            self._load()
            # Clients passed in without an API client (test fakes) have no Deployments.
            api_client = getattr(self._core, "api_client", None)
            self._apps = client.AppsV1Api(api_client) if api_client is not None else None
        return self._apps

    @property
    def custom(self) -> Any:
        """The CustomObjectsApi (ProvisioningRequests), on the core client's connection."""
        if self._custom is None:
            from kubernetes import client

            self._custom = client.CustomObjectsApi(self.core.api_client)
        return self._custom

    def provisioning_request_create(
        self, name: str, pool: Any, nodes: int, atomic: bool, namespace: str = ""
    ) -> None:
        """Ask the cluster autoscaler for `nodes` nodes of `pool` (portal/k8s/provisioning.py),
        in `namespace` (the team's whose pods consume them; "": the portal's own)."""
        provisioning.create(
            self.core,
            self.custom,
            namespace or self.provisioning_namespace,
            name,
            pool,
            nodes,
            atomic,
        )

    def provisioning_request_status(
        self, name: str, pool: Any, nodes: int, atomic: bool, namespace: str = ""
    ) -> tuple[str, str]:
        return provisioning.status(
            self.custom, namespace or self.provisioning_namespace, name, nodes, atomic
        )

    def pool_selectors(self) -> PoolSelectors | None:
        sel = self._pool_selectors
        return sel() if callable(sel) else sel

    # -- the protocol ----------------------------------------------------------------

    def gpu_nodes(self) -> list[DiscoveredNode]:
        return gpu_nodes_discovered(nodes_list_gpu(self.core))

    def inventory(self) -> list[InventoryNode]:
        watcher = self.current_inventory_watcher()
        if watcher is not None and watcher.synced():
            nodes, pods = watcher.inventory_objects()
        else:
            nodes = nodes_list_gpu(self.core)
            pods = pods_list_active(self.core, self.pod_namespaces)
        with self._lock:
            self._facts = {n.metadata.name: node_facts(n) for n in nodes}
        return inventory_from_nodes(
            nodes, pods, self.pool_selectors(), require_mig_state=self.require_mig_state
        )

    def _node_facts(self, node: str) -> dict[str, Any] | None:
        with self._lock:
            facts = self._facts.get(node)
        if facts is not None:
            return facts
        try:
            n = self.core.read_node(node)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        facts = node_facts(n)
        with self._lock:
            self._facts[node] = facts
        return facts

    # -- gangs: a JobSet where its CRD is served, else N Jobs --------------------------

    def gang_api_in_use(self) -> str:
        """ "jobset" or "jobs": how gangs are launched. With K8S_GANG_API=auto the API
        server is asked once (discovery) and the answer kept; a failed question is asked
        again next time, and gangs are Jobs meanwhile."""
        if self.gang_api != "auto":
            return self.gang_api
        if self._jobset_found is None:
            try:
                found = jobset_installed(self.custom)
            except Exception:  # noqa: BLE001 - Jobs work everywhere; ask again next time
                log.exception("could not ask the API server whether JobSets are served")
                return "jobs"
            with self._lock:
                self._jobset_found = found
            log.info("gangs launch as %s", "one JobSet" if found else "Jobs")
        return "jobset" if self._jobset_found else "jobs"

    def _jobset(self, name: str, namespace: str, pods: int) -> dict[str, Any] | None:
        """The gang's JobSet, when gangs may be JobSets and this one is (None otherwise:
        it was launched as Jobs, before the CRD came or because it did not fit one)."""
        if pods <= 1 or self.gang_api_in_use() != "jobset":
            return None
        return jobset_read(self.custom, name, namespace)

    def launch(self, spec: LaunchSpec) -> None:
        """One Job; for a gang, one JobSet (portal/k8s/jobset.py) where JobSets are in use
        and the gang fits one pod template, else its headless Service and one Job per pod,
        owned by the Service.

        A checkpointing request's PVC is created first (if missing), owned by nothing:
        it outlives the attempt, and its retries mount the same one.
        """
        if spec.serving is not None:
            self._launch_serving(spec)
            return
        pvc = checkpoint_pvc_build(spec, self.job_options) if spec.checkpoint_interval_s else None
        if not spec.is_gang:
            job = job_build(spec, self.job_options, self._node_facts(spec.node))
            if pvc is not None:
                pvc_create(self.core, pvc)
            job_create(self.batch, job, sleep=self._sleep)
            return
        if self.gang_api_in_use() == "jobset" and jobset_fits(
            spec, self.job_options, self._node_facts
        ):
            jobset = jobset_build(spec, self.job_options, self._node_facts)
            if pvc is not None:
                pvc_create(self.core, pvc)
            jobset_create(self.custom, jobset)
            return
        service, jobs = gang_build(spec, self.job_options, self._node_facts)
        if pvc is not None:
            pvc_create(self.core, pvc)
        owner = owner_reference(service_create(self.core, service))
        for job in jobs:
            built(job.metadata).owner_references = [owner]
            job_create(self.batch, job, sleep=self._sleep)

    def _launch_serving(self, spec: LaunchSpec) -> None:
        """A Deployment of the replicas and its Service (portal/k8s/serving.py); the Service
        owns the Deployment, so deleting it (`stop`) deletes everything."""
        deployment, service = deployment_build(spec, self.job_options, self._node_facts)
        owner = owner_reference(service_create(self.core, service))
        built(deployment.metadata).owner_references = [owner]
        try:
            self.apps.create_namespaced_deployment(spec.namespace, deployment)
        except ApiException as exc:
            if exc.status != 409:  # created before: a retried launch adopts it
                raise

    def rollout(self, name: str, namespace: str, pods: int, revision: str) -> None:
        """Move a serving workload to `revision`: the Deployment rolls its replicas over."""
        self.apps.patch_namespaced_deployment(name, namespace, rollout_patch(revision))

    def stop(self, name: str, namespace: str, grace_seconds: int = 30, pods: int = 1) -> None:
        """Delete every Job (all pods of a gang together), then a gang's Service; a serving
        workload's Deployment and Service; a gang's JobSet with its Jobs and pods."""
        jobset = pods > 1 and self.gang_api_in_use() == "jobset"
        if jobset and jobset_delete(self.custom, name, namespace, grace_seconds=grace_seconds):
            return
        for member in _member_names(name, pods):
            job_delete(self.batch, member, namespace, grace_seconds=grace_seconds)
        serving = self._serving_deployment(name, namespace) is not None
        if serving:
            self._delete_deployment(name, namespace)
        if pods > 1 or serving:
            service_delete(self.core, name, namespace)

    def serving_replicas(self, name: str, namespace: str, pods: int = 1) -> list[dict[str, Any]]:
        """The ready replicas of a serving workload, for the portal's own samples when no
        Prometheus is configured: where each serves /metrics and its revision."""
        return serving_replica_endpoints(pods_for_workload(self.core, name, namespace))

    def _serving_deployment(self, name: str, namespace: str) -> Any | None:
        if self.apps is None:
            return None
        try:
            return self.apps.read_namespaced_deployment(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _delete_deployment(self, name: str, namespace: str) -> None:
        try:
            self.apps.delete_namespaced_deployment(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def checkpoints_delete(self, request_id: int, namespace: str) -> None:
        pvc_delete(self.core, checkpoint_claim(request_id), namespace)

    def logs(
        self, name: str, namespace: str, tail_lines: int = 200, pods: int = 1, pod: int = 0
    ) -> str:
        """The main container's log of the workload's newest pod; of a gang, rank `pod`'s."""
        if self._jobset(name, namespace, pods) is not None:
            return pod_log(self.core, name, namespace, tail_lines, rank_selector(pod))
        return pod_log(self.core, _member_names(name, pods)[pod], namespace, tail_lines)

    def events(self, name: str, namespace: str, pods: int = 1) -> list[WorkloadEvent]:
        if self._jobset(name, namespace, pods) is not None:
            # Every rank's pods carry the JobSet's name as their instance; each rank's Job
            # has its own events (a quota's FailedCreate, BackoffLimitExceeded).
            found = workload_events(self.core, name, namespace) + [
                e
                for r in range(pods)
                for e in workload_events(self.core, jobset_job_name(name, r), namespace)
            ]
            return sorted(found, key=lambda e: e.at.timestamp() if e.at else float("inf"))
        return [
            e for m in _member_names(name, pods) for e in workload_events(self.core, m, namespace)
        ]

    # -- node changes and burn-in (docs/lifecycle.md) ------------------------------------

    def node_patch(
        self, name: str, labels: dict[str, str | None], unschedulable: bool | None = None
    ) -> None:
        """A merge patch: labels set (None removes them), and `spec.unschedulable`."""
        body: dict[str, Any] = {"metadata": {"labels": labels}}
        if unschedulable is not None:
            body["spec"] = {"unschedulable": unschedulable}
        self.core.patch_node(name, body)

    def validation_launch(self, spec: ValidationSpec, started_at: datetime) -> None:
        job = validation_job_build(spec, self.validation_image, self.dcgm_image)
        try:
            self.batch.create_namespaced_job(spec.namespace, job)
        except ApiException as exc:
            if exc.status != 409:  # created before: a retried launch adopts it
                raise

    def validation_status(self, spec: ValidationSpec, started_at: datetime) -> ValidationStatus:
        job = job_read(self.batch, spec.name, spec.namespace)
        text = pod_log(self.core, spec.name, spec.namespace, 50) if job is not None else ""
        return validation_status_from_job(job, text)

    def validation_stop(self, spec: ValidationSpec) -> None:
        job_delete(self.batch, spec.name, spec.namespace, grace_seconds=0)

    def driver_api_in_use(self) -> str:
        if self.driver_api != "auto":
            return self.driver_api
        # Asked at each rollout's start (rare): a CRD installed later is seen.
        found = gpu_operator.served(
            self.custom, gpu_operator.DRIVER_VERSION, gpu_operator.DRIVER_PLURAL
        )
        return "nvidiadriver" if found else "labels"

    def driver_version_write(self, api: str, name: str, version: str) -> None:
        if api == "nvidiadriver":
            body = gpu_operator.nvidiadriver_build(
                name, version, repository=self.driver_repository, image=self.driver_image
            )
            gpu_operator.nvidiadriver_apply(self.custom, body)
        elif api == "clusterpolicy":
            gpu_operator.cluster_policy_version(self.custom, "driver", version)

    def device_plugin_version_write(self, version: str) -> None:
        gpu_operator.cluster_policy_version(self.custom, "devicePlugin", version)

    def device_plugin_version(self, node: str) -> str:
        return gpu_operator.device_plugin_version(self.core, self.gpu_operator_namespace, node)

    def status(self, name: str, namespace: str, pods: int = 1) -> WorkloadStatus:
        status = self._status_jobs(name, namespace, pods)
        if status.outcome is Outcome.MISSING:
            # No Job: a serving workload is a Deployment, running until stopped.
            deployment = self._serving_deployment(name, namespace)
            if deployment is not None:
                return serving_status(deployment, name, namespace)
        return status

    def _status_jobs(self, name: str, namespace: str, pods: int) -> WorkloadStatus:
        jobset = self._jobset(name, namespace, pods)
        if jobset is not None:
            return jobset_status(
                jobset, pods, lambda rank: self._rank_status(name, namespace, rank)
            )
        if pods > 1:
            members = [self._status(m, namespace) for m in _member_names(name, pods)]
            return gang_status(name, namespace, members)
        return self._status(name, namespace)

    def _rank_status(self, name: str, namespace: str, rank: int) -> WorkloadStatus:
        """One rank of the JobSet `name`: from the watch's cache once synced (its Jobs and
        pods carry the portal's labels), else read now."""
        now = self._now() if self._now else None
        watcher = self.current_watcher()
        if watcher is not None and namespace in watcher.namespaces and watcher.synced():
            return watcher.status(
                jobset_job_name(name, rank),
                namespace,
                now=now,
                image_pull_timeout_s=self.image_pull_timeout_s,
                instance=name,
                labels={JOB_INDEX: str(rank)},
            )
        return rank_status_read(
            self.core,
            self.batch,
            name,
            namespace,
            rank,
            now=now,
            image_pull_timeout_s=self.image_pull_timeout_s,
        )

    def _status(self, name: str, namespace: str) -> WorkloadStatus:
        now = self._now() if self._now else None
        watcher = self.current_watcher()
        if watcher is not None and namespace in watcher.namespaces and watcher.synced():
            return watcher.status(
                name, namespace, now=now, image_pull_timeout_s=self.image_pull_timeout_s
            )
        return workload_status(
            self.core,
            self.batch,
            name,
            namespace,
            now=now,
            image_pull_timeout_s=self.image_pull_timeout_s,
        )

    # -- watching ------------------------------------------------------------------------

    def current_watcher(self) -> WorkloadWatcher | None:
        """This process's watcher: one inherited through fork is dropped (its threads stayed
        in the parent), and with `auto_watch` a new one is started here."""
        self._forget_if_forked()
        with self._lock:
            if self.watcher is not None and self.watch_pid != os.getpid():
                self.watcher = None
            start = self.watcher is None and self.auto_watch and bool(self.watch_namespaces)
        if start:
            try:
                self.start_watching(threading.Event())
            except Exception:  # noqa: BLE001 - reads fall back to GETs; next call retries
                log.exception("could not start watching %s", self.watch_namespaces)
                self.watcher = None
        return self.watcher

    def current_inventory_watcher(self) -> WorkloadWatcher | None:
        """This process's node and pod watcher, as `current_watcher()` for workloads."""
        self._forget_if_forked()
        with self._lock:
            if self.inventory_watcher is not None and self.inventory_pid != os.getpid():
                self.inventory_watcher = None
            start = self.inventory_watcher is None and self.watch_inventory
        if start:
            try:
                self.start_watching_inventory(threading.Event())
            except Exception:  # noqa: BLE001 - inventory() lists instead; next call retries
                log.exception("could not start watching nodes and pods")
                self.inventory_watcher = None
        return self.inventory_watcher

    def start_watching_inventory(
        self,
        stop: threading.Event,
        *,
        resync_s: float = 300.0,
        watch_factory: Callable[[], Any] | None = None,
    ) -> list[threading.Thread]:
        """Keep every Node and the non-terminal pods cached; `inventory()` then reads the cache."""
        watcher = WorkloadWatcher(
            self.core,
            None,
            (),
            watch_factory=watch_factory or self.watch_factory,
            resync_s=resync_s,
            inventory=True,
            pod_namespaces=self.pod_namespaces,
        )
        threads = watcher.run(stop)
        with self._lock:
            self.inventory_watcher, self.inventory_pid = watcher, os.getpid()
        return threads

    def start_watching(
        self,
        stop: threading.Event,
        *,
        resync_s: float = 300.0,
        watch_factory: Callable[[], Any] | None = None,
    ) -> list[threading.Thread]:
        """Keep Jobs and pods of `watch_namespaces` cached; `status()` then reads the cache."""
        watcher = WorkloadWatcher(
            self.core,
            self.batch,
            self.watch_namespaces,
            watch_factory=watch_factory or self.watch_factory,
            resync_s=resync_s,
        )
        threads = watcher.run(stop)
        with self._lock:
            self.watcher, self.watch_pid = watcher, os.getpid()
        return threads


def _member_names(name: str, pods: int) -> list[str]:
    return [member_name(name, r) for r in range(pods)] if pods > 1 else [name]


def _items(value: Any) -> list[str]:
    """A list setting given as a list or as a comma-separated string."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value or ()]


def _pool_selectors_from_db() -> dict[str, dict[str, str]]:
    from portal.models import Pool

    return {
        name: dict(sel or {}) for name, sel in Pool.objects.values_list("name", "node_selector")
    }
