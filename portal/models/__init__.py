"""Domain models, one module per subject. Quantities are integers: milli-GPU, MiB, millicores.

Every model is re-exported here, so `from portal.models import Team` works wherever it is
defined.
"""

from portal.models.audit import AuditEvent, AuditEventQuerySet, PolicyVersion
from portal.models.lifecycle import Rollout, RolloutNode, ValidationRun
from portal.models.metrics import MetricsLease, UtilizationRollup, UtilizationSample
from portal.models.pools import (
    DEVICE_FAULTS,
    Device,
    DeviceCondition,
    DeviceProfile,
    DeviceQuerySet,
    Node,
    NodeProvision,
    Pool,
    ShapeHistory,
    WorkloadClass,
    heartbeat_stale_before,
    usable_q,
)
from portal.models.requests import Allocation, Attempt, GpuRequest, UsageRecord
from portal.models.scheduler import (
    Decision,
    DecisionTally,
    PolicyProfile,
    PolicyProfileQuerySet,
    SchedulerState,
    WhatIfRun,
)
from portal.models.serving import RevisionChange, ServingSample
from portal.models.simulated import SimulatedNode, SimulatedWorkload
from portal.models.teams import Membership, NotificationPreference, Quota, RequestTemplate, Team
from portal.models.tokens import IdempotencyKey, PersonalToken

__all__ = [
    "PersonalToken",
    "IdempotencyKey",
    "Team",
    "Membership",
    "Quota",
    "NotificationPreference",
    "RequestTemplate",
    "DeviceProfile",
    "WorkloadClass",
    "Pool",
    "ShapeHistory",
    "Node",
    "DeviceCondition",
    "heartbeat_stale_before",
    "DeviceQuerySet",
    "usable_q",
    "Device",
    "NodeProvision",
    "DEVICE_FAULTS",
    "GpuRequest",
    "Attempt",
    "Allocation",
    "UsageRecord",
    "AuditEventQuerySet",
    "AuditEvent",
    "PolicyVersion",
    "Decision",
    "PolicyProfileQuerySet",
    "PolicyProfile",
    "SchedulerState",
    "DecisionTally",
    "WhatIfRun",
    "ValidationRun",
    "Rollout",
    "RolloutNode",
    "RevisionChange",
    "ServingSample",
    "MetricsLease",
    "UtilizationSample",
    "UtilizationRollup",
    "SimulatedWorkload",
    "SimulatedNode",
]
