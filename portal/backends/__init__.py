"""Cluster backends; `get_backend()` returns the configured one."""

from __future__ import annotations

from functools import cache

from django.conf import settings

from portal.backends.base import ClusterBackend


@cache
def _backend(name: str) -> ClusterBackend:
    if name == "kubernetes":
        from portal.backends.kubernetes import KubernetesBackend

        return KubernetesBackend.from_settings()
    from portal.backends.simulated import SimulatedBackend

    return SimulatedBackend(settings.SIMULATED_CLUSTER)


def get_backend() -> ClusterBackend:
    return _backend(settings.CLUSTER_BACKEND)
