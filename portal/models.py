"""Domain models. Quantities are integers: milli-GPU, MiB, millicores."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from portal import validation
from portal.shapes import request_shape
from scheduling import profile as scheduling_profile

slug_validator = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    "Use lower-case letters, digits and dashes (a Kubernetes name).",
)
positive = [MinValueValidator(0)]


class Team(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    display_name = models.CharField(max_length=200, blank=True)
    #: Kubernetes namespace the team's workloads run in; set by admins only.
    namespace = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    #: fair-share weight
    weight = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    #: most pending requests at once; 0 = the site default
    max_pending = models.PositiveIntegerField(default=0, help_text="0 = the site default")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        MEMBER = "member"
        LEAD = "lead"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)

    class Source(models.TextChoices):
        #: added by a lead or an admin; single sign-on leaves it alone
        MANUAL = "manual"
        #: from the identity provider's groups (OIDC_GROUP_MAP); synced at each sign-in
        SSO = "sso"

    #: most GPU milli this member may hold at once; null = no cap beyond the team's
    gpu_cap_milli = models.PositiveIntegerField(null=True, blank=True)
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.MANUAL)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="membership_unique")]
        ordering = ["team__name", "user__username"]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


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
        """For people: "whole GPU", "MIG 3g.40gb: 3/7 of a GPU, 40 GB", "shared: 0.5 GPU, 10 GB"."""
        if self.kind == self.Kind.MIG:
            compute, _, memory = self.mig_profile.partition(".")
            return f"MIG {self.mig_profile}: {compute.rstrip('g')}/7 of a GPU, {memory.upper().replace('GB', ' GB')}"
        if self.kind == self.Kind.SHARED:
            cap = f", {self.gpu_memory_mib / 1024:g} GB memory" if self.gpu_memory_mib else ""
            return f"shared: {self.milli / 1000:g} GPU{cap}"
        return "whole GPU"

    def clean(self) -> None:
        if self.kind == self.Kind.MIG and not self.mig_profile:
            raise ValidationError(
                {"mig_profile": "A MIG profile needs a profile name such as 3g.40gb."}
            )
        if self.kind == self.Kind.SHARED and not 0 < self.milli < 1000:
            raise ValidationError({"milli": "A shared slice takes between 1 and 999 milli-GPU."})
        if self.kind == self.Kind.WHOLE and self.milli != 1000:
            raise ValidationError({"milli": "A whole GPU is 1000 milli-GPU."})


class WorkloadClass(models.Model):
    class Preemption(models.TextChoices):
        NEVER = "never"
        WHEN_BORROWING = "when-borrowing", "only when borrowing"
        ALWAYS = "always", "yes"

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
    priority_class_name = models.CharField(max_length=63, blank=True)
    #: only the listed teams may submit to a restricted class (e.g. production inference)
    restricted = models.BooleanField(
        default=False, help_text="Only the teams listed may use this class."
    )
    teams = models.ManyToManyField(
        "Team",
        blank=True,
        related_name="allowed_classes",
        help_text="Teams that may use a restricted class.",
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

    def open_to(self, team: Team) -> bool:
        return not self.restricted or self.teams.filter(pk=team.pk).exists()


class Pool(models.Model):
    class Partitioning(models.TextChoices):
        EXCLUSIVE = "exclusive"
        TIME_SLICING = "time-slicing"
        MIG = "mig"

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
    #: MIG: the profiles each device is cut into, e.g. ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    mig_layout = models.JSONField(default=list, blank=True)
    node_selector = models.JSONField(default=dict, blank=True)
    #: [{"key": ..., "value": ..., "effect": ...}]
    taints = models.JSONField(default=list, blank=True)
    lifecycle = models.CharField(
        max_length=20, choices=Lifecycle.choices, default=Lifecycle.PRODUCTION
    )
    inference_floor_milli = models.PositiveIntegerField(default=0)
    # Autoscaling (portal/autoscale.py): the pool asks for nodes of one shape, between
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
        if self.autoscaled and self.max_nodes < max(1, self.min_nodes):
            errors.setdefault("max_nodes", []).append(
                "An autoscaled pool needs max_nodes of at least 1 and at least min_nodes."
            )
        if errors:
            raise ValidationError(errors)

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
    #: software versions from its labels (`portal.lifecycle.node_software`), set at each sync
    software = models.JSONField(default=dict, blank=True)
    #: why it is cordoned, where the portal cordoned it (a failed validation, a rollout)
    maintenance_reason = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["pool__name", "name"]

    def __str__(self) -> str:
        return self.name


class DeviceCondition(models.TextChoices):
    """Why a device can or cannot take work now, worst first. The one usable-device rule."""

    QUARANTINED = "quarantined"  # a critical Xid; only an admin clears it
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


class Quota(models.Model):
    """A team's share of a pool, in GPU milli. Null limits are unlimited."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="quotas")
    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="quotas")
    nominal_milli = models.PositiveIntegerField(default=0)
    borrowing_limit_milli = models.PositiveIntegerField(null=True, blank=True)
    lending_limit_milli = models.PositiveIntegerField(null=True, blank=True)
    #: the most the lead may set nominal to; admins set it (0 = nominal is admin-only)
    granted_milli = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["team__name", "pool__name"]
        constraints = [models.UniqueConstraint(fields=["team", "pool"], name="quota_unique")]

    def __str__(self) -> str:
        return f"{self.team}@{self.pool}"


class GpuRequest(models.Model):
    class State(models.TextChoices):
        PENDING = "pending"
        ADMITTED = "admitted"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    ACTIVE_STATES = (State.ADMITTED, State.RUNNING)
    TERMINAL_STATES = (State.SUCCEEDED, State.FAILED, State.CANCELLED)

    # Not indexed alone: the (team, state) index serves it, and the tick rewrites these rows.
    team = models.ForeignKey(
        Team, on_delete=models.PROTECT, related_name="requests", db_index=False
    )
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="gpu_requests"
    )
    name = models.CharField(max_length=100, blank=True)
    workload_class = models.ForeignKey(WorkloadClass, on_delete=models.PROTECT)
    #: null = any pool that offers the profile
    pool = models.ForeignKey(Pool, null=True, blank=True, on_delete=models.PROTECT)
    profile_kind = models.CharField(
        max_length=10, choices=DeviceProfile.Kind.choices, default="whole"
    )
    mig_profile = models.CharField(max_length=30, blank=True)
    milli = models.PositiveIntegerField(default=1000)
    gpu_memory_mib = models.PositiveIntegerField(default=0)
    count = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    #: gang size: number of nodes, each with `count` devices
    pods = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    cpu_milli = models.PositiveIntegerField(default=1000)
    memory_mib = models.PositiveIntegerField(default=4096)
    image = models.CharField(max_length=500)
    command = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    checkpoint_interval_s = models.PositiveIntegerField(default=0, help_text="0 = no checkpoints")
    max_runtime_s = models.PositiveIntegerField(default=0, help_text="0 = no limit")
    #: the submitter's estimate, used for start-time estimates and the simulated cluster
    estimated_runtime_s = models.PositiveIntegerField(default=3600)
    priority = models.IntegerField(default=0)
    state = models.CharField(
        max_length=20, choices=State.choices, default=State.PENDING
    )  # indexed as the first column of (state, created_at)
    requeue_count = models.PositiveIntegerField(default=0)
    requeue_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=300, blank=True)
    # The latest decision, kept on the row so lists need no join.
    status_code = models.CharField(max_length=50, blank=True)
    status_message = models.CharField(max_length=500, blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    #: why the queue position last changed ("moved from #4 to #6: 2 requests … arrived")
    position_note = models.CharField(max_length=300, blank=True)
    #: when the one "still waiting" notification went out (portal/notify.py)
    long_wait_notified_at = models.DateTimeField(null=True, blank=True)
    escalated = models.BooleanField(default=False)
    estimated_start = models.DateTimeField(null=True, blank=True)
    #: when the request's checkpoint storage (a PVC, a folder) was deleted after it ended
    checkpoints_deleted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Where the wait went (portal/capacity.py): the reason of the open stretch of waiting,
    # when it began, and the seconds of the closed stretches by reason.
    wait_reason = models.CharField(max_length=20, blank=True)
    wait_since = models.DateTimeField(null=True, blank=True)
    wait_unschedulable_s = models.PositiveIntegerField(default=0)
    wait_quota_s = models.PositiveIntegerField(default=0)
    wait_capacity_s = models.PositiveIntegerField(default=0)
    wait_provisioning_s = models.PositiveIntegerField(default=0)
    wait_backoff_s = models.PositiveIntegerField(default=0)

    class Kind(models.TextChoices):
        BATCH = "batch"
        #: runs until stopped, `pods` replicas placed apart (docs/serving.md)
        SERVING = "serving"

    class Runtime(models.TextChoices):
        VLLM = "vllm", "vLLM"
        TGI = "tgi", "TGI"
        TRITON = "triton", "Triton"

    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.BATCH)
    #: serving: the model served, its revision (a change rolls the replicas over), its server
    model_name = models.CharField(max_length=200, blank=True)
    model_revision = models.CharField(max_length=100, blank=True)
    runtime = models.CharField(max_length=10, choices=Runtime.choices, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["team", "state"]),
            models.Index(fields=["state", "created_at"]),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(count__gte=1), name="request_count_positive"),
            models.CheckConstraint(
                condition=Q(milli__gte=1) & Q(milli__lte=1000), name="request_milli_range"
            ),
        ]

    def __str__(self) -> str:
        return self.name or f"request {self.pk}"

    @property
    def gpus_milli(self) -> int:
        """GPU milli held in total, counted as the scheduling core's quotas count it."""
        return request_shape(self).gpus_milli

    @property
    def profile_label(self) -> str:
        if self.profile_kind == DeviceProfile.Kind.MIG:
            return f"MIG {self.mig_profile}"
        if self.profile_kind == DeviceProfile.Kind.SHARED:
            cap = f", {self.gpu_memory_mib} MiB" if self.gpu_memory_mib else ""
            return f"shared {self.milli}m{cap}"
        return "whole GPU"


class Attempt(models.Model):
    class State(models.TextChoices):
        ADMITTED = "admitted"
        RUNNING = "running"
        #: asked to stop (preemption, cancel, drain); devices held until the pod is gone
        STOPPING = "stopping"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        PREEMPTED = "preempted"
        NODE_LOST = "node_lost"
        CANCELLED = "cancelled"

    ACTIVE_STATES = (State.ADMITTED, State.RUNNING, State.STOPPING)

    # Indexed as the first column of the unique (request, number).
    request = models.ForeignKey(
        GpuRequest, on_delete=models.CASCADE, related_name="attempts", db_index=False
    )
    number = models.PositiveIntegerField()
    state = models.CharField(
        max_length=20, choices=State.choices, default=State.ADMITTED
    )  # Meta.indexes: equality only, no LIKE index
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT)
    nodes = models.JSONField(default=list)
    workload_name = models.CharField(max_length=63)
    namespace = models.CharField(max_length=63)
    gpus_milli = models.PositiveIntegerField()
    borrowing = models.BooleanField(default=False)
    #: admitted into room made by preempting others; only a higher band may preempt it in turn
    admitted_by_preemption = models.BooleanField(default=False)
    admitted_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    #: the last checkpoint the workload reported finished; only ever moves forward
    last_checkpoint_at = models.DateTimeField(null=True, blank=True)
    #: checkpoints reported by the workload
    checkpoints = models.PositiveIntegerField(default=0)
    #: why the attempt is being stopped (set with STOPPING)
    stop_reason = models.CharField(max_length=30, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    end_reason = models.CharField(max_length=300, blank=True)
    #: set exactly once, when the attempt's devices and quota go back
    released_at = models.DateTimeField(null=True, blank=True)
    #: launches tried so far; the reconciler relaunches a lost one up to LAUNCH_RETRY_LIMIT
    launch_tries = models.PositiveIntegerField(default=0)
    #: no relaunch before this (exponential backoff between tries)
    next_launch_at = models.DateTimeField(null=True, blank=True)
    #: the last lines the workload printed, read when the attempt ended (the workload may be gone)
    log_tail = models.TextField(blank=True)

    class Meta:
        ordering = ["request_id", "number"]
        indexes = [models.Index(fields=["state"], name="portal_attempt_state")]
        constraints = [
            models.UniqueConstraint(fields=["request", "number"], name="attempt_unique_number"),
            models.UniqueConstraint(
                fields=["request"],
                condition=Q(state__in=["admitted", "running", "stopping"]),
                name="attempt_one_active_per_request",
            ),
        ]

    def __str__(self) -> str:
        return self.workload_name


class Allocation(models.Model):
    """One slot of one device held by an attempt.

    Slots: "gpu" for an exclusive device; "m0".."m7" for each MIG memory slot an
    instance covers; "s0".."s<replicas-1>" for time-slicing shares (a whole GPU on
    a shared device holds every share). The partial unique index makes a double
    booking impossible in the database, whatever the scheduler believed.
    """

    # Kept by the ORM only (deletes cascade): allocations are written with their attempt,
    # in its transaction; the device's constraint stays (devices come and go with nodes).
    attempt = models.ForeignKey(
        Attempt, on_delete=models.CASCADE, related_name="allocations", db_constraint=False
    )
    device = models.ForeignKey(Device, on_delete=models.PROTECT, related_name="allocations")
    slot = models.CharField(max_length=10)
    #: the grant this slot belongs to, as the packer made it
    milli = models.PositiveIntegerField(default=1000)
    gpu_memory_mib = models.PositiveIntegerField(default=0)
    mig_profile = models.CharField(max_length=30, blank=True)
    mig_start = models.IntegerField(default=-1)
    mig_size = models.IntegerField(default=0)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["device", "slot"],
                condition=Q(active=True),
                name="allocation_one_active_per_slot",
            )
        ]


class UsageRecord(models.Model):
    """Accounting for one attempt: GPU milli-seconds by team, class and pool."""

    # The foreign keys are kept by the ORM only (deletes still cascade or are refused):
    # a record is written with its attempt, in the same transaction, and the attempt's
    # own constraints (request -> team, class; pool) already hold what these would.
    # Checking four more per admission at commit took a twelfth of a 4,000-admission tick.
    attempt = models.OneToOneField(
        Attempt, on_delete=models.CASCADE, related_name="usage", db_constraint=False
    )
    team = models.ForeignKey(
        Team, on_delete=models.PROTECT, related_name="usage_records", db_constraint=False
    )
    workload_class = models.ForeignKey(WorkloadClass, on_delete=models.PROTECT, db_constraint=False)
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, db_constraint=False)
    gpus_milli = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    gpu_milli_seconds = models.BigIntegerField(default=0)
    #: of those, the work thrown away: a preempted or node-lost attempt's time since its
    #: last checkpoint (or since it started)
    lost_gpu_milli_seconds = models.BigIntegerField(default=0)
    #: preempted and infrastructure-lost attempts are recorded but not charged to the team
    charged = models.BooleanField(default=True)

    class Meta:
        indexes = [models.Index(fields=["team", "ended_at"])]


class Decision(models.Model):
    class Kind(models.TextChoices):
        ADMIT = "admit"
        WAIT = "wait"
        PREEMPT = "preempt"
        REJECT = "reject"
        REQUEUE = "requeue"
        END = "end"

    # A tick writes thousands of rows here: only the indexes that reads use (Meta.indexes,
    # created_at for pruning, attempt and pool for their deletes). Team and request are
    # the first columns of the composite indexes; node is searched by substring.
    # The log's foreign keys are not database constraints: checking four per row at
    # commit took a tenth of a 10,000-request tick. The tick writes ids it has just read
    # in its own transaction, and deletes cascade (or set null) through the ORM as before.
    tick = models.BigIntegerField(default=0)
    request = models.ForeignKey(
        GpuRequest,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="decisions",
        db_index=False,
        db_constraint=False,
    )
    attempt = models.ForeignKey(
        Attempt, null=True, blank=True, on_delete=models.SET_NULL, db_constraint=False
    )
    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.CASCADE, db_index=False, db_constraint=False
    )
    pool = models.ForeignKey(
        Pool, null=True, blank=True, on_delete=models.SET_NULL, db_constraint=False
    )
    node = models.CharField(max_length=253, blank=True)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    code = models.CharField(max_length=50)
    message = models.CharField(max_length=500)
    facts = models.JSONField(default=dict, blank=True)
    #: the scheduling profile in force when the tick decided (blank: not a tick's decision)
    profile_name = models.CharField(max_length=63, blank=True)
    profile_version = models.PositiveIntegerField(null=True, blank=True)
    #: the policy version in force (`PolicyVersion.number`): quotas, classes, pools, profiles
    policy_version = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["team", "-created_at"]),
            models.Index(fields=["request", "-created_at"]),
            models.Index(fields=["kind"], name="portal_decision_kind"),
        ]


class PolicyProfileQuerySet(models.QuerySet["PolicyProfile"]):
    def active_profile(self) -> scheduling_profile.Profile:
        """The active profile's knobs; the shipped default when none is stored yet (reads only:
        the tick stores it, `services.policy_profile_ensure`)."""
        row = self.filter(active=True).first()
        return row.profile() if row is not None else scheduling_profile.load()


class PolicyProfile(models.Model):
    """A named, versioned set of the scheduling core's knobs (`scheduling.profile`).

    Exactly one is active: the tick runs it and every decision records its name and
    version. Changed only through the services, which validate, bump `version` and audit.
    """

    name = models.CharField(
        max_length=63,
        unique=True,
        validators=[
            RegexValidator(
                scheduling_profile.NAME_RE.pattern,
                "Use lower-case letters, digits, '-', '_' or '.'.",
            )
        ],
    )
    version = models.PositiveIntegerField(default=1)
    #: every knob of `scheduling.types.Policy`, by name
    knobs = models.JSONField(default=dict)
    active = models.BooleanField(default=False)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    updated_at = models.DateTimeField(auto_now=True)

    objects = PolicyProfileQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            # at most one active; the services keep at least one
            models.UniqueConstraint(
                fields=["active"], condition=Q(active=True), name="policyprofile_one_active"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    def profile(self) -> scheduling_profile.Profile:
        return scheduling_profile.parse({"name": self.name, "version": self.version, **self.knobs})


class AuditEventQuerySet(models.QuerySet["AuditEvent"]):
    def update(self, **kwargs: Any) -> int:
        raise PermissionError("audit events are append-only")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise PermissionError("audit events are append-only")


class AuditEvent(models.Model):
    """Who changed what, before and after. Append-only, in Python and in the database."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=50, db_index=True)
    object_type = models.CharField(max_length=50)
    object_id = models.CharField(max_length=50)
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.SET_NULL)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    #: why, in the actor's words (asked for cancel, cordon, drain and quota changes)
    reason = models.CharField(max_length=500, blank=True, default="")

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise PermissionError("audit events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise PermissionError("audit events are append-only")


class SchedulerState(models.Model):
    """One row: tick counters, and the tick lease used where advisory locks do not exist."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    ticks = models.BigIntegerField(default=0)
    skipped_ticks = models.BigIntegerField(default=0)
    last_tick_at = models.DateTimeField(null=True, blank=True)
    last_tick_ms = models.PositiveIntegerField(default=0)
    failed_ticks = models.BigIntegerField(default=0)
    reconciler_repairs = models.BigIntegerField(default=0)
    #: tick durations: {"le-bound-in-seconds": count}, cumulative like a Prometheus histogram
    tick_histogram = models.JSONField(default=dict)
    tick_seconds_sum = models.FloatField(default=0.0)
    lease_until = models.DateTimeField(null=True, blank=True)


class SimulatedWorkload(models.Model):
    """A workload of the simulated cluster. Its life is a function of time."""

    name = models.CharField(max_length=63)
    namespace = models.CharField(max_length=63)
    node = models.CharField(max_length=253)
    spec = models.JSONField(default=dict)
    created_at = models.DateTimeField()
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    exit_code = models.IntegerField(default=0)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="simworkload_unique")
        ]


class DecisionTally(models.Model):
    """Counts of decisions pruned from the log, so that metrics counters never go down.

    `decisions_prune` folds rows older than DECISION_RETENTION_DAYS in here before
    deleting them; /metrics adds these to the counts of the rows still kept.
    """

    kind = models.CharField(max_length=10)
    code = models.CharField(max_length=50)
    team_name = models.CharField(max_length=63, blank=True)
    pool_name = models.CharField(max_length=63, blank=True)
    n = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "code", "team_name", "pool_name"], name="decision_tally_unique"
            )
        ]


class MetricsLease(models.Model):
    """One row: which web replica exports the database-derived metrics.

    Every replica reads the same database, so each would export the same
    numbers and `sum()` would count them once per replica. The replica that
    holds this lease exports them; the others export only
    `quartermaster_metrics_exporter{replica_role="follower"}`.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    holder = models.CharField(max_length=253, blank=True)
    until = models.DateTimeField(null=True, blank=True)


class NotificationPreference(models.Model):
    """What a user is told about their requests, and how (portal/notify.py).

    A user without a row gets the defaults below (email, if they have an address).
    """

    class Event(models.TextChoices):
        START = "start", "started"
        END = "end", "finished"
        FAILURE = "failure", "failed"
        PREEMPTION = "preemption", "preempted"
        LONG_WAIT = "long_wait", "still waiting"

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preference"
    )
    email = models.BooleanField(default=True, help_text="to the address on your account")
    webhook_url = models.URLField(
        max_length=500,
        blank=True,
        help_text='Slack or Teams incoming webhook: a POST of {"text": …}',
        validators=[validation.webhook_url],
    )
    on_start = models.BooleanField(default=False, verbose_name="when a request starts")
    on_end = models.BooleanField(default=True, verbose_name="when it finishes")
    on_failure = models.BooleanField(default=True, verbose_name="when it fails")
    on_preemption = models.BooleanField(default=True, verbose_name="when it is preempted")
    on_long_wait = models.BooleanField(default=True, verbose_name="when it waits long")

    def __str__(self) -> str:
        return f"notifications of {self.user}"

    def wants(self, event: str) -> bool:
        return bool(getattr(self, f"on_{event}", False))


class RequestTemplate(models.Model):
    """A submit form saved under a name, to fill the form again later."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="request_templates"
    )
    name = models.CharField(max_length=100)
    #: the submit form's fields as posted (team and class by id, env as text)
    fields = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["user", "name"], name="request_template_unique")
        ]

    def __str__(self) -> str:
        return self.name


class RevisionChange(models.Model):
    """A serving workload's model revision changed: a mark on its timeline."""

    request = models.ForeignKey(
        GpuRequest, on_delete=models.CASCADE, related_name="revision_changes"
    )
    before = models.CharField(max_length=100, blank=True)
    after = models.CharField(max_length=100)
    at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["at", "id"]


class UtilizationSample(models.Model):
    """One device's utilization at one minute, as the node agent (or the simulated cluster)
    read it. Kept UTILIZATION_RAW_HOURS, then folded into `UtilizationRollup`."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField()
    #: denormalised so that rollups group without joins
    node = models.CharField(max_length=253)
    pool = models.CharField(max_length=63)
    #: the team holding the device then ("" = idle)
    team = models.CharField(max_length=63, blank=True)
    utilization_pct = models.PositiveSmallIntegerField(default=0)
    memory_used_mib = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["at"]), models.Index(fields=["pool", "at"])]


class UtilizationRollup(models.Model):
    """Mean and peak utilization of a node, pool or team over one bucket (5 min or 1 h)."""

    class Scope(models.TextChoices):
        NODE = "node"
        POOL = "pool"
        TEAM = "team"

    scope = models.CharField(max_length=4, choices=Scope.choices)
    key = models.CharField(max_length=253)
    resolution_s = models.PositiveIntegerField()
    start = models.DateTimeField()
    utilization_avg = models.FloatField(default=0.0)
    utilization_max = models.FloatField(default=0.0)
    memory_used_mib_avg = models.FloatField(default=0.0)
    #: device-minutes folded in
    samples = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["scope", "key", "resolution_s", "start"], name="rollup_unique"
            )
        ]


class ServingSample(models.Model):
    """A serving workload's request path at one moment, read from its replicas' /metrics:
    the fallback history when no Prometheus is configured (portal/serving_metrics.py)."""

    request = models.ForeignKey(
        GpuRequest, on_delete=models.CASCADE, related_name="serving_samples"
    )
    at = models.DateTimeField()
    model_revision = models.CharField(max_length=100, blank=True)
    ttft_p50_seconds = models.FloatField(null=True)
    ttft_p95_seconds = models.FloatField(null=True)
    e2e_p95_seconds = models.FloatField(null=True)
    batch_size = models.FloatField(null=True)
    queue_depth = models.FloatField(null=True)
    running = models.FloatField(null=True)
    tokens_per_second = models.FloatField(null=True)
    gpu_utilization = models.FloatField(null=True)
    gpu_memory_used_mib = models.FloatField(null=True)

    class Meta:
        ordering = ["at"]
        indexes = [models.Index(fields=["request", "at"])]


class ValidationRun(models.Model):
    """One burn-in of one node: device visibility, NCCL all-reduce, DCGM diag level 1, a short
    model warm-up (docs/lifecycle.md). A failed node stays cordoned with the reason."""

    class State(models.TextChoices):
        RUNNING = "running"
        PASSED = "passed"
        FAILED = "failed"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="validations")
    rollout = models.ForeignKey(
        "Rollout", null=True, blank=True, on_delete=models.SET_NULL, related_name="validations"
    )
    #: the burn-in workload's name (a Job on Kubernetes)
    name = models.CharField(max_length=63)
    state = models.CharField(max_length=10, choices=State.choices, default=State.RUNNING)
    #: `portal.lifecycle.DEFAULT_THRESHOLDS` keys
    thresholds = models.JSONField(default=dict)
    #: devices_visible, nccl_busbw_gbps, dcgm_diag, warmup_s
    results = models.JSONField(default=dict, blank=True)
    reason = models.CharField(max_length=300, blank=True)
    #: whether the validation cordoned the node (it returns it only then, on a pass)
    cordoned_it = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"validation {self.pk} of {self.node_id}"


class Rollout(models.Model):
    """A driver, GPU Operator, device-plugin or MIG-layout change to a pool, in waves: canary
    nodes first, then `wave_percent` % at a time; each wave is cordoned, drained, changed,
    validated and returned (`portal.rollouts`)."""

    class Kind(models.TextChoices):
        DRIVER = "driver"
        GPU_OPERATOR = "gpu-operator", "GPU Operator"
        DEVICE_PLUGIN = "device-plugin", "device plugin"
        MIG_LAYOUT = "mig-layout", "MIG layout"

    class State(models.TextChoices):
        RUNNING = "running"
        HALTED = "halted"
        SUCCEEDED = "succeeded"

    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="rollouts")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    #: the driver version, operator version, device-plugin config or mig-parted config
    target = models.CharField(max_length=100)
    canary_nodes = models.PositiveIntegerField(default=1)
    wave_percent = models.PositiveIntegerField(default=25)
    #: more failed nodes than this halts the rollout after the wave
    max_failed_nodes = models.PositiveIntegerField(default=0)
    #: a node whose work has not drained by then fails (nothing is stopped without a checkpoint)
    drain_timeout_s = models.PositiveIntegerField(default=3600)
    #: a node whose change has not taken by then fails
    apply_timeout_s = models.PositiveIntegerField(default=900)
    thresholds = models.JSONField(default=dict)
    state = models.CharField(max_length=10, choices=State.choices, default=State.RUNNING)
    #: node names per wave, wave 0 the canary
    waves = models.JSONField(default=list)
    current_wave = models.PositiveIntegerField(default=0)
    halt_reason = models.CharField(max_length=300, blank=True)
    rollback_criteria = models.TextField(blank=True)
    #: GPU milli out of service per wave, as planned (the capacity impact)
    impact = models.JSONField(default=dict)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # One rollout at a time per pool: two would cordon each other's waves.
            models.UniqueConstraint(
                fields=["pool"], condition=Q(state="running"), name="rollout_one_running_per_pool"
            )
        ]

    def __str__(self) -> str:
        return f"rollout {self.pk}: {self.kind} {self.target} on {self.pool_id}"


class RolloutNode(models.Model):
    """One node of a rollout and the step it is at."""

    class Step(models.TextChoices):
        WAITING = "waiting"
        DRAINING = "draining"
        APPLYING = "applying"
        VALIDATING = "validating"
        RETURNED = "returned"
        FAILED = "failed"

    DONE = (Step.RETURNED, Step.FAILED)

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="members")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="rollout_steps")
    wave = models.PositiveIntegerField()
    step = models.CharField(max_length=12, choices=Step.choices, default=Step.WAITING)
    reason = models.CharField(max_length=300, blank=True)
    #: the labels the change overwrote, as they were (None: absent): what a rollback restores
    previous = models.JSONField(default=dict, blank=True)
    #: attempts the drain stopped (each after its last checkpoint)
    stopped_attempts = models.JSONField(default=list, blank=True)
    validation = models.ForeignKey(
        ValidationRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    step_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["wave", "node__name"]
        constraints = [
            models.UniqueConstraint(fields=["rollout", "node"], name="rollout_node_unique")
        ]

    def __str__(self) -> str:
        return f"{self.node_id} in rollout {self.rollout_id}"


class SimulatedNode(models.Model):
    """What was changed on a simulated node (labels, cordon): the simulated cluster's state
    beyond its YAML file, shared by the web, worker and beat processes."""

    name = models.CharField(max_length=253, unique=True)
    labels = models.JSONField(default=dict)
    unschedulable = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.name


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


class PolicyVersion(models.Model):
    """One applied change of scheduling policy: a quota, a workload class, a pool's
    settings, or a scheduling profile (created, changed, activated). Numbered in order;
    every decision records the number in force (`Decision.policy_version`), so a decision
    can be read against the settings it was made under. Written with the audit event
    (`services.audit`), whose before and after it keeps."""

    number = models.PositiveIntegerField(unique=True)
    action = models.CharField(max_length=50)
    object_type = models.CharField(max_length=50)
    object_id = models.CharField(max_length=50)
    actor_name = models.CharField(max_length=150, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-number"]

    def __str__(self) -> str:
        return f"policy v{self.number}: {self.action}"


class WhatIfRun(models.Model):
    """An admin's drafted policy change, replayed on the site's history (portal/whatif.py)
    by a Celery task, compared, and perhaps applied (audited with this result)."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    days = models.PositiveIntegerField(default=7)
    #: the proposed change, KEY=VALUE as `manage.py whatif --set` takes them
    changes = models.JSONField(default=dict)
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    progress = models.PositiveIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    applied_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"what-if {self.pk}"
