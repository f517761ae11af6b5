"""The submit/launch contract: what a request may carry into a workload.

One set of rules, checked twice: when a request is submitted (so that a user
learns at once, with the field named) and again when its workload is built
(so that a row changed behind the portal's back still cannot launch). Plain
Python with no Django, so the Kubernetes adapter uses it as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: names the platform sets; a request may not override them
RESERVED_ENV = re.compile(
    r"^(NVIDIA_.*|CUDA_VISIBLE_DEVICES|QUARTERMASTER_.*|QM_.*"
    r"|WORLD_SIZE|RANK|MASTER_ADDR|MASTER_PORT|PET_.*)$",
    re.IGNORECASE,
)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_ENV = 100
#: a longer name is no one's variable: it only makes the Job spec and the audit log huge
MAX_ENV_NAME = 128
MAX_ENV_VALUE = 4096
MAX_IMAGE = 500

DEFAULT_REGISTRY = "docker.io"

# The distribution reference grammar (github.com/distribution/reference), spelled out.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)"
_DOMAIN = rf"(?:{_HOST}(?:\.{_HOST})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?$"
)


class ContractError(ValueError):
    """A request asks for something no workload may carry. `field` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference: `registry/repository[:tag][@digest]`."""

    registry: str
    repository: str
    tag: str = ""
    digest: str = ""

    def __str__(self) -> str:
        out = f"{self.registry}/{self.repository}"
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def parse_image(reference: str) -> ImageRef:
    """Parse an image reference as container runtimes do.

    The first path component is a registry only when it contains a `.` or a `:`
    or is `localhost`; otherwise the image is on Docker Hub, where one-component
    names live under `library/`.
    """
    if not isinstance(reference, str) or not reference or len(reference) > MAX_IMAGE:
        raise ContractError(
            "image", "Give a container image such as registry.example.com/team/train:1.2."
        )
    m = _REFERENCE.match(reference)
    if m is None:
        raise ContractError(
            "image",
            f"{reference!r} is not an image reference "
            "(registry/repository[:tag][@sha256:digest], lower-case repository).",
        )
    domain, path = m.group("domain"), m.group("path")
    if domain is not None and not ("." in domain or ":" in domain or domain == "localhost"):
        # "team/train" is a Docker Hub repository, not a registry called "team".
        domain, path = None, f"{domain}/{path}"
    if domain is not None and domain.lower() != domain and "[" not in domain:
        domain = domain.lower()
    registry = domain or DEFAULT_REGISTRY
    if registry == DEFAULT_REGISTRY and "/" not in path:
        path = f"library/{path}"
    return ImageRef(registry, path, m.group("tag") or "", m.group("digest") or "")


@dataclass(frozen=True)
class AllowEntry:
    """One allowlist entry: a registry, optionally narrowed to a repository path prefix."""

    registry: str
    prefix: str = ""

    def admits(self, ref: ImageRef) -> bool:
        if ref.registry != self.registry:
            return False
        if not self.prefix:
            return True
        # Whole path components only: "team" admits "team/x", never "team-evil/x".
        return ref.repository == self.prefix or ref.repository.startswith(self.prefix + "/")


def parse_allow_entry(entry: str) -> AllowEntry:
    """`registry.example.com`, `registry.example.com/`, `nvcr.io/nvidia/` or `docker.io/library`."""
    text = entry.strip().rstrip("/")
    registry, _, prefix = text.partition("/")
    if not registry or not re.fullmatch(_DOMAIN, registry):
        raise ContractError("allowed_images", f"{entry!r} does not start with a registry host")
    return AllowEntry(registry.lower(), prefix.strip("/"))


def check_image(reference: str, allowed: Iterable[str] = ()) -> ImageRef:
    """Parse the image and, when an allowlist is set, require an entry to admit it."""
    ref = parse_image(reference)
    entries = [parse_allow_entry(e) for e in allowed if e.strip()]
    if entries and not any(e.admits(ref) for e in entries):
        where = ", ".join(
            sorted({e.registry + ("/" + e.prefix if e.prefix else "") for e in entries})
        )
        raise ContractError(
            "image", f"Image {reference} is not from an allowed registry ({where})."
        )
    return ref


def check_env(env: Mapping[str, object] | Iterable[tuple[str, object]]) -> dict[str, str]:
    """Names a shell and Kubernetes accept, none the platform sets; values as strings."""
    items = list(env.items()) if isinstance(env, Mapping) else list(env)
    clean: dict[str, str] = {}
    for key, value in items:
        if isinstance(key, str) and len(key) > MAX_ENV_NAME:
            raise ContractError(
                "env", f"{key[:40]}… is too long: a name has at most {MAX_ENV_NAME} characters."
            )
        if not isinstance(key, str) or not ENV_NAME.match(key):
            raise ContractError("env", f"{key!r} is not a valid environment variable name.")
        if RESERVED_ENV.match(key):
            raise ContractError("env", f"{key} is set by the platform and cannot be overridden.")
        if not isinstance(value, str | int | float):
            raise ContractError(
                "env", f"{key} must be a string of at most {MAX_ENV_VALUE} characters."
            )
        text = str(value)
        if len(text) > MAX_ENV_VALUE or "\x00" in text:
            raise ContractError(
                "env", f"{key} must be a string of at most {MAX_ENV_VALUE} characters, without NUL."
            )
        clean[key] = text
    if len(clean) > MAX_ENV:
        raise ContractError("env", f"At most {MAX_ENV} environment variables.")
    return clean
