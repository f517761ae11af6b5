"""GPU requests and their attempts: the allocations each attempt holds and its accounting."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from portal.lib import words
from portal.lib.shapes import request_shape
from portal.models.pools import Device, DeviceProfile, Pool, WorkloadClass
from portal.models.teams import Team


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
    #: when the one "still waiting" notification went out (portal/services/notify.py)
    long_wait_notified_at = models.DateTimeField(null=True, blank=True)
    escalated = models.BooleanField(default=False)
    estimated_start = models.DateTimeField(null=True, blank=True)
    #: when the request's checkpoint storage (a PVC, a folder) was deleted after it ended
    checkpoints_deleted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Where the wait went (portal/tick/waits.py): the reason of the open stretch of waiting,
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
        """The profile as the form offered it (one way of writing a slice everywhere)."""
        return words.device_slice(
            self.profile_kind, self.mig_profile, self.milli, self.gpu_memory_mib or 0
        )


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
