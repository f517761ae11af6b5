"""How the cluster backend launches a gang (a request of several pods), for the settings page."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from portal.backends import get_backend


@dataclass(frozen=True)
class GangLaunch:
    #: "jobset", "jobs" or "simulated"
    api: str
    #: K8S_GANG_API as configured ("auto", "jobs" or "jobset")
    setting: str

    @property
    def sentence(self) -> str:
        if self.api == "jobset":
            return (
                "one JobSet (jobset.x-k8s.io/v1alpha2) of one replicated Job, with its headless "
                "Service; a gang whose pods differ in size or share a node is still one Job per pod"
            )
        if self.api == "jobs":
            return "one Job per pod, owned by a headless Service"
        return "simulated pods (the simulated backend)"


def gang_launch() -> GangLaunch:
    """What the backend uses now: on Kubernetes with K8S_GANG_API=auto, what discovery found
    (asked once per process, at the first launch or this page)."""
    setting = str(getattr(settings, "K8S_GANG_API", "auto"))
    backend = get_backend()
    in_use = getattr(backend, "gang_api_in_use", None)
    if in_use is None:
        return GangLaunch("simulated", setting)
    return GangLaunch(str(in_use()), setting)
