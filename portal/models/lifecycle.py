"""Pool lifecycle: node burn-in validations and rollouts in waves."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from portal.models.pools import Node, Pool


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
    #: `portal.lib.lifecycle.DEFAULT_THRESHOLDS` keys
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
