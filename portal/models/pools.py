"""Hardware: pools, their nodes and devices, device profiles and workload classes."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from portal.lib import validation, words

if TYPE_CHECKING:
    from portal.models.teams import Team

slug_validator = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    "Use lower-case letters, digits and dashes (a Kubernetes name).",
)


class DeviceProfile(models.Model):
    """What a request consumes on one device."""

    class Kind(models.TextChoices):
        WHOLE = "whole", "whole GPU"
        MIG = "mig", "MIG instance"
        SHARED = "shared", "shared slice"

    name = models.CharField(max_length=63, unique=True)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    mig_profile = models.CharField(max_length=30, blank=True)
    #: compute share per device for shared slices (1000 = whole)
    milli = models.PositiveIntegerField(default=1000, validators=[MinValueValidator(1)])
    #: GPU-memory cap for shared slices, MiB
    gpu_memory_mib = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["kind", "name"]

    def __str__(self) -> str:
        return self.name

    @property
    def label(self) -> str:
        """For people: "whole GPU", "MIG 3g.40gb: 3/7 of a GPU, 40 GB", "shared: 0.5 GPU, 10 GB memory"."""
        return words.device_slice(self.kind, self.mig_profile, self.milli, self.gpu_memory_mib or 0)

    def clean(self) -> None:
        if self.kind == self.Kind.MIG and not self.mig_profile:
            raise ValidationError(
                {"mig_profile": "A MIG profile needs a profile name such as 3g.40gb."}
            )
        if self.kind == self.Kind.SHARED and not 0 < self.milli < 1000:
            raise ValidationError({"milli": "A shared slice takes between 1 and 999 milli-GPU."})
        if self.kind == self.Kind.WHOLE and self.milli != 1000:
            raise ValidationError({"milli": "A whole GPU is 1000 milli-GPU."})


#: GpuRequest.Kind's values (models/requests.py imports this module, not the other way round)
WORKLOAD_KINDS = ("batch", "serving")


class WorkloadClass(models.Model):
    class Preemption(models.TextChoices):
        NEVER = "never", "never"
        WHEN_BORROWING = "when-borrowing", "only when borrowing"
        ALWAYS = "always", "always"

    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    description = models.CharField(max_length=300, blank=True)
    #: higher bands are served first; requests never leave their band
    band = models.IntegerField(default=0)
    preemption = models.CharField(
        max_length=20, choices=Preemption.choices, default=Preemption.ALWAYS
    )
    min_runtime_s = models.PositiveIntegerField(default=0)
    max_queue_s = models.PositiveIntegerField(default=0, help_text="0 = no limit")
    latency_objective_ms = models.PositiveIntegerField(null=True, blank=True)
    default_profile = models.ForeignKey(
        DeviceProfile, null=True, blank=True, on_delete=models.SET_NULL
    )
    #: counts against a pool's production-inference floor
    inference = models.BooleanField(default=False)
    priority_class_name = models.CharField(
        max_length=63, blank=True, validators=[validation.kubernetes_name]
    )
    #: only the listed teams may submit to a restricted class (e.g. production inference)
    restricted = models.BooleanField(
        default=False, help_text="Only the teams listed may use this class."
    )
    teams: models.ManyToManyField[Team, Any] = models.ManyToManyField(
        "Team",
        blank=True,
        related_name="allowed_classes",
        help_text="Teams that may use a restricted class.",
    )
    #: retired: no new requests; the row stays for the audit and decision logs
    retired_at = models.DateTimeField(null=True, blank=True)
    #: written by `manage.py config apply`: a change in the pages is drift the next apply reverts
    config_managed = models.BooleanField(default=False)
    #: the workload kinds the class takes (GpuRequest.Kind values); empty: every kind
    kinds = models.JSONField(
        default=list,
        blank=True,
        help_text="Workload kinds this class takes (batch, serving); none ticked: every kind.",
    )
    #: the pools the class runs in; empty: every pool
    pools: models.ManyToManyField[Pool, Any] = models.ManyToManyField(
        "Pool",
        blank=True,
        related_name="bound_classes",
        help_text="Pools this class runs in; none ticked: every pool.",
    )

    class Meta:
        ordering = ["-band", "name"]
        verbose_name_plural = "workload classes"

    def __str__(self) -> str:
        return self.name

    #: bands run from 0 (lowest) up; the chart's PriorityClass values are derived from them
    MAX_BAND = 1_000_000

    def clean(self) -> None:
        if not 0 <= self.band <= self.MAX_BAND:
            raise ValidationError({"band": f"A band is a whole number from 0 to {self.MAX_BAND}."})
        if not isinstance(self.kinds, list) or any(k not in WORKLOAD_KINDS for k in self.kinds):
            raise ValidationError({"kinds": f"Kinds are a list of {', '.join(WORKLOAD_KINDS)}."})

    def open_to(self, team: Team) -> bool:
        return not self.restricted or self.teams.filter(pk=team.pk).exists()

    def refusal(self, *, team: Team, kind: str, pool: Pool | None) -> tuple[str, str] | None:
        """(field, message) when this class does not take the request, else None:

        1. a restricted class not granted to the team;
        2. a kind the class is not bound to (e.g. batch work in a serving-only class);
        3. a pool the class is not bound to, or "any pool" when it is bound to some.
        """
        if not self.open_to(team):
            return (
                "workload_class",
                f"Team {team.name} may not use the {self.name} class; a platform admin grants it.",
            )
        if self.kinds and kind not in self.kinds:
            return (
                "workload_class",
                f"The {self.name} class takes {' and '.join(self.kinds)} workloads only, "
                f"not {kind}: choose another class.",
            )
        bound = sorted(self.pools.values_list("name", flat=True))
        if bound and (pool is None or pool.name not in bound):
            where = f"pool {pool.name}" if pool is not None else "any pool"
            return (
                "pool",
                f"The {self.name} class runs only in {', '.join(bound)}, not {where}: choose "
                f"{'it' if len(bound) == 1 else 'one of them'}.",
            )
        return None


class Pool(models.Model):
    class Partitioning(models.TextChoices):
        EXCLUSIVE = "exclusive", "exclusive"
        TIME_SLICING = "time-slicing", "time-slicing"
        MIG = "mig", "MIG"

    class SharingEngine(models.TextChoices):
        """What shares a GPU between a time-slicing pool's slices (docs/kubernetes.md)."""

        #: whole GPUs or MIG; on a time-slicing pool, as `time-slicing`
        NONE = "none", "none"
        #: the device plugin's time-slicing: memory is not isolated
        TIME_SLICING = "time-slicing", "time-slicing"
        #: the device plugin's MPS: per-client memory limit and active-thread share
        MPS = "mps", "MPS"
        #: HAMi: `nvidia.com/gpumem` and `nvidia.com/gpucores` requests, enforced in the container
        HAMI = "hami", "HAMi"

    class Lifecycle(models.TextChoices):
        CANARY = "canary"
        PRODUCTION = "production"
        MAINTENANCE = "maintenance"

    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    gpu_model = models.CharField(max_length=100)
    gpu_memory_mib = models.PositiveIntegerField()
    architecture = models.CharField(max_length=50, blank=True)
    interconnect = models.CharField(max_length=20, default="pcie")
    partitioning = models.CharField(
        max_length=20, choices=Partitioning.choices, default=Partitioning.EXCLUSIVE
    )
    time_slicing_replicas = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1)]
    )
    sharing_engine = models.CharField(
        max_length=20, choices=SharingEngine.choices, default=SharingEngine.NONE
    )
    #: MIG: the profiles each device is cut into, e.g. ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    mig_layout = models.JSONField(default=list, blank=True)
    node_selector = models.JSONField(default=dict, blank=True)
    #: [{"key": ..., "value": ..., "effect": ...}]
    taints = models.JSONField(default=list, blank=True)
    lifecycle = models.CharField(
        max_length=20, choices=Lifecycle.choices, default=Lifecycle.PRODUCTION
    )
    inference_floor_milli = models.PositiveIntegerField(default=0)
    # Autoscaling (portal/services/autoscale.py): the pool asks for nodes of one shape, between
    # min_nodes and max_nodes, when pending demand outgrows it.
    autoscaled = models.BooleanField(default=False)
    min_nodes = models.PositiveIntegerField(default=0)
    max_nodes = models.PositiveIntegerField(default=0)
    #: the node shape it adds: GPUs, CPU and host memory per node (the GPU is the pool's)
    node_gpus = models.PositiveIntegerField(default=8)
    node_cpu_milli = models.PositiveIntegerField(default=96000)
    node_memory_mib = models.PositiveIntegerField(default=1024 * 1024)
    #: an added node with nothing allocated is given back after this many seconds
    idle_release_s = models.PositiveIntegerField(default=600)
    #: retired: in maintenance for good; the row stays for the audit and decision logs
    retired_at = models.DateTimeField(null=True, blank=True)
    #: written by `manage.py config apply`: a change in the pages is drift the next apply reverts
    config_managed = models.BooleanField(default=False)
    #: a node joining the pool (new, moved in, or back after BURN_IN_RETURN_AFTER_SECONDS
    #: not ready) stays cordoned until its burn-in passes (docs/lifecycle.md)
    burn_in_new_nodes = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        # The tick, the preview and the Kubernetes backend read these; one bad entry broke them all.
        errors: dict[str, list[str]] = {}
        for field, check in (
            ("taints", validation.validate_taints),
            ("node_selector", validation.validate_node_selector),
            ("mig_layout", validation.validate_mig_layout),
        ):
            try:
                check(getattr(self, field), field)
            except ValidationError as exc:
                # One key per form field; the message says where inside it.
                for key, messages in exc.message_dict.items():
                    where = "" if key == field else f"{key}: "
                    errors.setdefault(field, []).extend(where + m for m in messages)
        if (
            self.sharing_engine != self.SharingEngine.NONE
            and self.partitioning != self.Partitioning.TIME_SLICING
        ):
            errors.setdefault("sharing_engine", []).append(
                "A sharing engine shares GPUs between slices: it needs a time-slicing pool."
            )
        if self.autoscaled and self.max_nodes < max(1, self.min_nodes):
            errors.setdefault("max_nodes", []).append(
                "An autoscaled pool needs max_nodes of at least 1 and at least min_nodes."
            )
        if errors:
            raise ValidationError(errors)

    @property
    def sharing_words(self) -> str:
        """How the pool's GPUs are shared, for its pages ("" when they are not)."""
        if self.partitioning != self.Partitioning.TIME_SLICING:
            return ""
        if self.sharing_engine == self.SharingEngine.MPS:
            return "MPS — per-slice memory limit and compute share enforced"
        if self.sharing_engine == self.SharingEngine.HAMI:
            return "HAMi — per-slice memory and compute caps enforced"
        return "time-slicing — memory is not isolated"

    def offers(self, kind: str, mig_profile: str = "") -> bool:
        """Whether devices of this pool can serve a device profile."""
        if self.partitioning == self.Partitioning.MIG:
            return kind == DeviceProfile.Kind.MIG and mig_profile in (self.mig_layout or [])
        if self.partitioning == self.Partitioning.TIME_SLICING:
            return kind in (DeviceProfile.Kind.SHARED, DeviceProfile.Kind.WHOLE)
        return kind == DeviceProfile.Kind.WHOLE

    @classmethod
    def offering(cls, pool: Pool | None) -> list[Pool]:
        """The named pool, or every production pool: where a request may land."""
        return (
            [pool]
            if pool is not None
            else list(cls.objects.filter(lifecycle=cls.Lifecycle.PRODUCTION))
        )


class ShapeHistory(models.Model):
    """The request shapes a pool has seen, decayed (`scheduling.workload.ShapeHistory`).

    FGD's target workload for the pool: every submit adds its shape (`services.
    gpu_request_submit`), the tick passes it in the snapshot. No row: the pool's prior.
    """

    pool = models.OneToOneField(Pool, on_delete=models.CASCADE, related_name="shape_history")
    #: `scheduling.workload.ShapeHistory.to_dict()`
    histogram = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"shapes of {self.pool_id}"


class Node(models.Model):
    name = models.CharField(max_length=253, unique=True)
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="nodes")
    cpu_milli = models.PositiveIntegerField()
    memory_mib = models.PositiveIntegerField()
    labels = models.JSONField(default=dict, blank=True)
    taints = models.JSONField(default=list, blank=True)
    interconnect = models.CharField(max_length=20, default="pcie")
    ready = models.BooleanField(default=True)
    cordoned = models.BooleanField(default=False)
    #: draining: cordoned, and running work is being moved off
    draining = models.BooleanField(default=False)
    #: last node-agent report; null where no agent runs (the simulated cluster)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    #: the node agent's latest report as sent (see docs/node-agent.md)
    agent_report = models.JSONField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    #: software versions from its labels (`portal.lib.lifecycle.node_software`), set at each sync
    software = models.JSONField(default=dict, blank=True)
    #: why it is cordoned, where the portal cordoned it (a failed validation, a rollout)
    maintenance_reason = models.CharField(max_length=300, blank=True)
    #: since when the cluster has reported it not ready (None: ready); a long absence means
    #: a burn-in before it serves again
    not_ready_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["pool__name", "name"]

    def __str__(self) -> str:
        return self.name


class DeviceCondition(models.TextChoices):
    """Why a device can or cannot take work now, worst first. The one usable-device rule."""

    QUARANTINED = "quarantined"  # a critical Xid; only an admin clears it
    FOREIGN = "foreign"  # the cluster gave it to a pod Quartermaster did not create
    UNHEALTHY = "unhealthy"  # the device plugin or the node agent says so
    STALE = "stale"  # the node agent stopped reporting
    NOT_READY = "not_ready"  # the node is not Ready
    CORDONED = "cordoned"  # an admin took the node out
    USABLE = "usable"


#: conditions of the device itself; the others belong to its node
DEVICE_FAULTS = (DeviceCondition.QUARANTINED, DeviceCondition.UNHEALTHY)


def heartbeat_stale_before(now: datetime) -> datetime:
    """A node whose agent last reported before this is stale (nodes with no agent never are)."""
    return now - timedelta(seconds=settings.HEARTBEAT_STALE_SECONDS)


class DeviceQuerySet(models.QuerySet["Device"]):
    """The usable-device rule in SQL; `Device.condition` is the same rule row by row."""

    def usable(self, now: datetime) -> DeviceQuerySet:
        return self.filter(usable_q(now))

    def unusable(self, now: datetime) -> DeviceQuerySet:
        return self.exclude(usable_q(now))


def usable_q(now: datetime, prefix: str = "") -> Q:
    """Devices that may take work now (`prefix` = "device__" from a related model)."""
    p = prefix
    return Q(
        **{
            f"{p}healthy": True,
            f"{p}foreign": False,
            f"{p}agent_healthy": True,
            f"{p}quarantined": False,
            f"{p}node__ready": True,
            f"{p}node__cordoned": False,
        }
    ) & (
        Q(**{f"{p}node__last_heartbeat__isnull": True})
        | Q(**{f"{p}node__last_heartbeat__gte": heartbeat_stale_before(now)})
    )


class Device(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveIntegerField()
    uuid = models.CharField(max_length=100, blank=True)
    model = models.CharField(max_length=100)
    memory_mib = models.PositiveIntegerField()
    partitioning = models.CharField(
        max_length=20, choices=Pool.Partitioning.choices, default="exclusive"
    )
    replicas = models.PositiveIntegerField(default=1)
    #: MIG instances that exist on the device: [{"profile": "3g.40gb", "start": 0, "size": 4}]
    mig_instances = models.JSONField(default=list, blank=True)
    #: as the cluster reports it (device plugin / allocatable)
    healthy = models.BooleanField(default=True)
    #: held by a pod Quartermaster did not create (another scheduler, Kueue, a bare pod):
    #: `healthy` is False with it (not usable, never booked), but it is not a fault
    foreign = models.BooleanField(default=False)
    #: as the node agent last read it through NVML
    agent_healthy = models.BooleanField(default=True)
    #: set on a critical Xid; only an admin clears it
    quarantined = models.BooleanField(default=False)
    health_reason = models.CharField(max_length=200, blank=True)
    # What the node agent last read through NVML.
    memory_used_mib = models.PositiveIntegerField(default=0)
    utilization_pct = models.PositiveIntegerField(default=0)
    processes = models.JSONField(default=list, blank=True)
    xids = models.JSONField(default=list, blank=True)
    reported_at = models.DateTimeField(null=True, blank=True)

    objects = DeviceQuerySet.as_manager()

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="device_unique_index")
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"

    def condition(self, now: datetime) -> DeviceCondition:
        """The usable-device rule for this row (with its node); agrees with `usable_q`."""
        if self.quarantined:
            return DeviceCondition.QUARANTINED
        if self.foreign and self.agent_healthy:
            return DeviceCondition.FOREIGN
        if not (self.healthy and self.agent_healthy):
            return DeviceCondition.UNHEALTHY
        node = self.node
        if node.last_heartbeat is not None and node.last_heartbeat < heartbeat_stale_before(now):
            return DeviceCondition.STALE
        if not node.ready:
            return DeviceCondition.NOT_READY
        if node.cordoned:
            return DeviceCondition.CORDONED
        return DeviceCondition.USABLE


class NodeProvision(models.Model):
    """Nodes an autoscaled pool asked for, for the pending requests it names.

    The Kubernetes backend turns one into a ProvisioningRequest (autoscaling.x-k8s.io/v1);
    the simulated backend adds the nodes once `ready_at` has passed.
    """

    class State(models.TextChoices):
        REQUESTED = "requested"
        PROVISIONED = "provisioned"
        FAILED = "failed"

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="provisions")
    name = models.CharField(max_length=63, unique=True)
    nodes = models.PositiveIntegerField()
    #: a gang's nodes come all together or not at all (best-effort-atomic-scale-up)
    atomic = models.BooleanField(default=False)
    #: the pending requests the nodes are for (their wait counts as `provisioning`)
    request_ids = models.JSONField(default=list)
    state = models.CharField(max_length=20, choices=State.choices, default=State.REQUESTED)
    message = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    #: simulated backend: when the nodes appear
    ready_at = models.DateTimeField(null=True, blank=True)
    done_at = models.DateTimeField(null=True, blank=True)
    #: where its ProvisioningRequests live: the namespace of the team whose requests it
    #: names (the autoscaler reads a pod's consume annotation in the pod's namespace);
    #: empty: no request named, the backend's own (K8S_PROVISIONING_NAMESPACE)
    namespace = models.CharField(max_length=63, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name
