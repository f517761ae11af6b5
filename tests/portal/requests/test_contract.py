"""Submit refuses exactly what launch refuses; refused launches end; relaunches are bounded."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from portal.backends.base import LaunchRefused
from portal.k8s.jobs import job_build
from portal.lib import contract
from portal.models import Allocation, Attempt, Decision, GpuRequest, SimulatedWorkload
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick
from tests.base import make_world, submit
from tests.k8s.builders import OPTIONS, spec

# --- image references ---------------------------------------------------------------


@pytest.mark.parametrize(
    "reference,registry,repository,tag,digest",
    [
        ("registry.example.com/team/train:1.2", "registry.example.com", "team/train", "1.2", ""),
        ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io", "nvidia/pytorch", "24.05-py3", ""),
        ("localhost:5000/x", "localhost:5000", "x", "", ""),
        ("ubuntu", "docker.io", "library/ubuntu", "", ""),
        ("team/train:2", "docker.io", "team/train", "2", ""),
        (
            "registry.example.com/a/b@sha256:" + "a" * 64,
            "registry.example.com",
            "a/b",
            "",
            "sha256:" + "a" * 64,
        ),
        (
            "registry.example.com:443/a:1@sha256:" + "b" * 64,
            "registry.example.com:443",
            "a",
            "1",
            "sha256:" + "b" * 64,
        ),
    ],
)
def test_it_parses_image_references(
    reference: str, registry: str, repository: str, tag: str, digest: str
) -> None:
    ref = contract.parse_image(reference)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (
        registry,
        repository,
        tag,
        digest,
    )


@pytest.mark.parametrize(
    "reference",
    ["", "Registry.example.com/Team/x", "a b", "x:", "x@sha256:zz", "-x", "a//b", "x\x00y"],
)
def test_it_refuses_what_is_not_an_image_reference(reference: str) -> None:
    with pytest.raises(contract.ContractError) as exc:
        contract.parse_image(reference)
    assert exc.value.field == "image"


@pytest.mark.parametrize(
    "reference,allowed",
    [
        ("registry.example.com/team/x:1", True),
        ("registry.example.com.evil.io/team/x:1", False),
        ("registry.example.com:5000/team/x", False),
        ("evil.io/registry.example.com/x", False),
        ("nvcr.io/nvidia/pytorch:24.05", True),
        ("nvcr.io/nvidia-evil/pytorch:1", False),
        ("nvcr.io/other/pytorch:1", False),
        ("docker.io/library/ubuntu", False),
    ],
)
def test_the_allowlist_matches_registries_and_whole_path_components(
    reference: str, allowed: bool
) -> None:
    allowlist = ("registry.example.com/", "nvcr.io/nvidia/")
    if allowed:
        contract.check_image(reference, allowlist)
    else:
        with pytest.raises(contract.ContractError):
            contract.check_image(reference, allowlist)


# --- one contract, two places ----------------------------------------------------------

ALLOWED = ("registry.example.com/", "nvcr.io/nvidia/")
CASES: list[tuple[str, Any]] = [
    ("env", {"QM_READY_TOKEN": "x"}),
    ("env", {"qm_ready_url": "x"}),
    ("env", {"QUARTERMASTER_REQUEST_ID": "1"}),
    ("env", {"NVIDIA_VISIBLE_DEVICES": "all"}),
    ("env", {"CUDA_VISIBLE_DEVICES": "0"}),
    ("env", {"MASTER_ADDR": "evil"}),
    ("env", {"RANK": "0"}),
    ("env", {"bad-name": "x"}),
    ("image", "registry.example.com.evil.io/team/train:1"),
    ("image", "evil.io/team/train:1"),
    ("image", "Registry.example.com/UPPER:1"),
    ("env", {"OK": "fine"}),  # accepted by both
    ("image", "nvcr.io/nvidia/pytorch:24.05-py3"),  # accepted by both
]


@pytest.mark.django_db
@pytest.mark.parametrize("field,value", CASES)
def test_submit_refuses_exactly_what_launch_refuses(field: str, value: Any, settings: Any) -> None:
    settings.K8S_ALLOWED_IMAGES = list(ALLOWED)
    w = make_world()
    kwargs = {field: value}
    if field == "image":
        launch = replace(spec(), image=value)
    else:
        launch = replace(spec(), env=tuple(value.items()))
    try:
        job_build(launch, replace(OPTIONS, allowed_images=ALLOWED))
        launch_refused = False
    except LaunchRefused:
        launch_refused = True
    try:
        submit(w.bob, w.vision, **kwargs)
        submit_refused = False
    except ValidationError as exc:
        assert field in exc.message_dict
        submit_refused = True
    assert submit_refused == launch_refused


@pytest.mark.django_db
def test_the_api_refuses_reserved_env_with_a_400_naming_the_field(settings: Any) -> None:
    from rest_framework.test import APIClient

    w = make_world()
    api = APIClient()
    api.force_authenticate(w.bob)
    body = {
        "team": "vision",
        "workload_class": "training",
        "pool": "a100-train",
        "image": "registry.example.com/vision/train:1",
        "env": {"QM_READY_URL": "http://evil"},
    }
    r = api.post("/api/v1/requests/", body, format="json")
    assert r.status_code == 400 and "env" in r.json()["errors"]
    settings.K8S_ALLOWED_IMAGES = ["registry.example.com"]
    body.update(env={}, image="registry.example.com.evil.io/x:1")
    r = api.post("/api/v1/requests/", body, format="json")
    assert r.status_code == 400 and "image" in r.json()["errors"]
    assert not GpuRequest.objects.exists()


# --- launches the backend refuses, and lost ones -----------------------------------------


class _Refusing:
    name = "refusing"

    def __init__(self, inner: Any) -> None:
        self.inner, self.launches = inner, 0

    def inventory(self) -> Any:
        return self.inner.inventory()

    def launch(self, spec: Any) -> None:
        self.launches += 1
        raise LaunchRefused("image nope is not from an allowed registry")

    def stop(self, *a: Any, **kw: Any) -> None:
        self.inner.stop(*a, **kw)

    def status(self, *a: Any, **kw: Any) -> Any:
        return self.inner.status(*a, **kw)


class _Failing(_Refusing):
    def launch(self, spec: Any) -> None:
        self.launches += 1
        raise ConnectionError("apiserver unreachable")


def _use(monkeypatch: pytest.MonkeyPatch, cls: type) -> Any:
    from portal import backends

    backend = cls(backends.get_backend())
    monkeypatch.setattr("portal.services.attempts.get_backend", lambda: backend)
    monkeypatch.setattr(backends, "get_backend", lambda: backend)
    return backend


@pytest.mark.django_db(transaction=True)
def test_a_refused_launch_ends_the_attempt_with_its_reason_and_frees_the_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = make_world()
    backend = _use(monkeypatch, _Refusing)
    req = submit(w.bob, w.vision, count=2)
    run_tick()
    req.refresh_from_db()
    attempt = req.attempts.get()
    assert attempt.state == Attempt.State.FAILED
    assert "refused to launch" in attempt.end_reason
    assert not Allocation.objects.filter(attempt=attempt, active=True).exists()
    assert req.state == GpuRequest.State.FAILED and req.status_code == "launch-refused"
    assert "not from an allowed registry" in req.end_reason
    assert Decision.objects.filter(request=req, code="launch-refused").count() == 1
    # The reconciler does not relaunch it, ever.
    for _ in range(3):
        reconcile()
    assert backend.launches == 1


@pytest.mark.django_db(transaction=True)
def test_lost_launches_are_retried_with_backoff_then_given_up(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.LAUNCH_RETRY_LIMIT = 3
    w = make_world()
    backend = _use(monkeypatch, _Failing)
    req = submit(w.bob, w.vision)
    run_tick()
    attempt = req.attempts.get()
    assert attempt.launch_tries == 1 and attempt.state == Attempt.State.ADMITTED
    # Within the backoff: no relaunch.
    assert reconcile().get("launch_backoff") == 1
    assert backend.launches == 1
    now = timezone.now()
    for n in (2, 3):
        now += timedelta(hours=1)
        assert reconcile(now=now).get("relaunched") == 1
        attempt.refresh_from_db()
        assert attempt.launch_tries == n
        # Backoff doubles: 10 s, 20 s, ...
        gap = (attempt.next_launch_at - now).total_seconds()
        assert gap == pytest.approx(10 * 2 ** (n - 1), abs=1)
    now += timedelta(hours=1)
    assert reconcile(now=now).get("launch_gave_up") == 1
    attempt.refresh_from_db()
    req.refresh_from_db()
    assert attempt.state == Attempt.State.FAILED and attempt.released_at is not None
    assert not Allocation.objects.filter(attempt=attempt, active=True).exists()
    assert req.state == GpuRequest.State.PENDING and req.requeue_count == 1
    assert "could not be created after 3 tries" in req.status_message
    assert backend.launches == 3
    assert not SimulatedWorkload.objects.exists()
