"""The fields of a serving request (docs/serving.md), checked before anything is stored."""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ValidationError

from portal.models import GpuRequest

#: most replicas one serving workload may ask for (a gang's pod bound applies too)
MAX_REPLICAS = 64
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/]{0,99}$")
MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/]{0,199}$")


def check_revision(revision: str) -> str:
    if not REVISION_RE.match(revision or ""):
        raise ValidationError(
            {"model_revision": "A revision is 1-100 letters, digits, '.', '_', '-' or '/'."}
        )
    return revision


def check_replicas(replicas: Any) -> int:
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise ValidationError({"replicas": "A whole number of replicas."})
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ValidationError({"replicas": f"Between 1 and {MAX_REPLICAS} replicas."})
    return int(replicas)


def check(
    *,
    kind: str,
    model_name: str,
    model_revision: str,
    runtime: str,
    max_runtime_s: int,
    checkpoint_interval_s: int,
) -> dict[str, str]:
    """The serving fields to store on the request; raises ValidationError naming a field."""
    if kind not in GpuRequest.Kind.values:
        raise ValidationError({"kind": f"Choose one of {', '.join(GpuRequest.Kind.values)}."})
    if kind == GpuRequest.Kind.BATCH:
        if model_name or model_revision or runtime:
            field = (
                "model_name" if model_name else "model_revision" if model_revision else "runtime"
            )
            raise ValidationError({field: "Only a serving request names a model."})
        return {"kind": kind}
    if not MODEL_RE.match(model_name or ""):
        raise ValidationError(
            {"model_name": "Name the model served (letters, digits, '.', '_', '-', '/')."}
        )
    if runtime not in GpuRequest.Runtime.values:
        raise ValidationError({"runtime": f"Choose one of {', '.join(GpuRequest.Runtime.values)}."})
    if max_runtime_s:
        raise ValidationError({"max_runtime_s": "A serving workload runs until stopped."})
    if checkpoint_interval_s:
        raise ValidationError({"checkpoint_interval_s": "A serving workload does not checkpoint."})
    return {
        "kind": kind,
        "model_name": model_name,
        "model_revision": check_revision(model_revision or "main"),
        "runtime": runtime,
    }
