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


#: a backend a command brought itself (`manage.py chaos` on a control plane of its own)
_override: list[ClusterBackend] = []


def use_backend(backend: ClusterBackend | None) -> None:
    """Make `get_backend()` answer `backend` in this process (None: the configured one again)."""
    _override[:] = [backend] if backend is not None else []


def get_backend() -> ClusterBackend:
    if _override:
        return _override[0]
    return _backend(settings.CLUSTER_BACKEND)
