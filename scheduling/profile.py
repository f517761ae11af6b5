"""Scheduling profiles: a named, versioned set of every `Policy` knob.

A profile is a TOML file of flat keys: `name`, `version` and one key per field of
`scheduling.types.Policy` (`scheduling/profiles/default.toml` is the shipped one). The
portal keeps profiles in its database and runs the active one; the benchmarks load one
by name or path (`--profile`). Both validate through here, so an unknown key, a wrong
type or a value out of range is refused the same way everywhere, naming the key.

Pure Python: no framework imports.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduling import packer
from scheduling.types import Policy

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
#: the shipped profile the portal starts with and the benchmarks run by default
DEFAULT_PROFILE = "default"
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$")
#: keys of a profile that are not knobs
META = ("name", "version")
_BIG = 10**9


class ProfileError(ValueError):
    """A profile refused: `key` names what is wrong (a knob, `name`, `version`, `profile`)."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


@dataclass(frozen=True, slots=True)
class Knob:
    name: str
    type: type
    default: object
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    help: str = ""
    #: the knob in words, for people (the name stays what profile files and the API say)
    label: str = ""


#: the bounds and one line of help per knob; a knob added to `Policy` without an entry
#: here gets "0 or more" (numbers) and no help
_RULES: dict[str, dict[str, Any]] = {
    "packer": {
        "label": "Device packing",
        "choices": ("default", *packer.POLICIES),
        "help": "Device packer (scheduling.packer); default is fgd-bestfit.",
    },
    "usage_half_life_s": {
        "label": "Fair-share usage half-life",
        "minimum": 1,
        "help": "Half-life of the usage that orders teams for fair share, seconds.",
    },
    "shape_half_life_s": {
        "label": "Request-shape history half-life",
        "help": "Half-life of the history of request shapes the packer plans for, seconds.",
    },
    "max_preemptions_per_tick": {
        "label": "Preemptions per tick at most",
        "help": "At most this many attempts preempted per tick.",
    },
    "escalate_after": {
        "label": "Escalate after (share of the class's queue time)",
        "maximum": 1.0,
        "help": "Escalate a request after this fraction of its class's maximum queue time.",
    },
    "max_reservations": {
        "label": "Reservations per tick at most",
        "help": "At most this many blocked requests hold nodes back per tick.",
    },
    "reserve_after_s": {
        "label": "Reserve nodes after waiting",
        "help": "A small blocked request gets a reservation after waiting this long, seconds.",
    },
    "reserve_min_devices": {
        "label": "Reserve at once from this many devices",
        "minimum": 1,
        "help": "A blocked request of at least this many devices gets a reservation at once.",
    },
    "preempt_after_s": {
        "label": "Preempt only after waiting",
        "help": "An entitled request preempts only after waiting this long, seconds (0 = at once).",
    },
    "max_victim_loss_gpu_s": {
        "label": "Most work a victim may lose",
        "help": "No victim loses more GPU-seconds than this since its last checkpoint (0 = no limit).",
    },
    "victim_loss_per_gpu_s": {
        "label": "Most work a victim may lose per GPU asked",
        "help": "No victim loses more GPU-seconds than this per GPU of the request that "
        "preempts it, nor more than the victim loss cap (0 = the cap alone).",
    },
    "starvation_after": {
        "label": "Starving after (share of the class's queue time)",
        "maximum": 100.0,
        "help": "A request within quota that waited this fraction of its class's maximum queue "
        "time may preempt any team's same or lower band (0 = never).",
    },
    "starving_loss_ratio": {
        "label": "Work a starving request may cost (times its wait)",
        "maximum": 100.0,
        "help": "Past its starvation bound, a request's victims may lose together up to this "
        "multiple of the GPU-time it waited, above the victim loss cap (0 = the cap only).",
    },
    "learned_kept_nodes": {
        "label": "Nodes kept for a whole-node shape not waiting now",
        "maximum": 1000,
        "help": "A whole-node shape seen in the pool's history but not pending now keeps at "
        "most this many of its hosts free of never-preempted work (0 = as many as a pending "
        "one: 5 % of the pool's nodes).",
    },
    "overload_queue_ratio": {
        "label": "Overloaded when the queue asks (times the pool's GPUs)",
        "maximum": 1000.0,
        "help": "Where more requests wait than may hold reservations, asking at least this "
        "multiple of the pool's GPUs, a request past its starvation bound waits for a "
        "reservation instead of preempting (0 = off: only more starving requests than "
        "reservations make a pool overloaded).",
    },
}


def _knobs() -> dict[str, Knob]:
    hints = typing.get_type_hints(Policy)
    out = {}
    for f in dataclasses.fields(Policy):
        rules = dict(_RULES.get(f.name, {}))
        kind = hints[f.name]
        if kind in (int, float):
            rules.setdefault("minimum", 0)
            rules.setdefault("maximum", _BIG)
        rules.setdefault("label", f.name.replace("_", " ").capitalize())
        out[f.name] = Knob(f.name, kind, f.default, **rules)
    return out


#: every knob of `Policy`, in its field order
KNOBS: dict[str, Knob] = _knobs()


def check_knob(name: str, value: object) -> object:
    """Return the value for knob `name`, or raise ProfileError naming it."""
    knob = KNOBS.get(name)
    if knob is None:
        raise ProfileError(name, "unknown knob; the knobs are " + ", ".join(KNOBS))
    if knob.type is str:
        if not isinstance(value, str):
            raise ProfileError(name, "must be a string")
        if knob.choices and value not in knob.choices:
            raise ProfileError(name, "must be one of " + ", ".join(knob.choices))
        return value
    # bool is an int in Python; a profile that says `true` for a number is wrong
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(name, f"must be {'a whole number' if knob.type is int else 'a number'}")
    if knob.type is int:
        if isinstance(value, float):
            if not value.is_integer():
                raise ProfileError(name, "must be a whole number")
            value = int(value)
    else:
        value = float(value)
    if knob.minimum is not None and value < knob.minimum:
        raise ProfileError(name, f"must be at least {knob.minimum:g}")
    if knob.maximum is not None and value > knob.maximum:
        raise ProfileError(name, f"must be at most {knob.maximum:g}")
    return value


def check_knobs(
    values: Mapping[str, object], base: Mapping[str, object] | None = None
) -> dict[str, object]:
    """Return every knob: `base` (default: `Policy()`'s values) updated with `values`,
    each checked. A knob missing from both takes `Policy()`'s value, so a profile saved
    before a knob existed still loads."""
    merged: dict[str, object] = {k.name: k.default for k in KNOBS.values()}
    merged.update({k: v for k, v in (base or {}).items() if k in KNOBS})
    # `values` may name an unknown knob: check_knob refuses it, naming it
    merged.update(values)
    return {key: check_knob(key, value) for key, value in merged.items()}


def check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ProfileError(
            "name", "use 1-63 lower-case letters, digits, '-', '_' or '.', starting with one"
        )
    return name


def check_version(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= _BIG:
        raise ProfileError("version", "must be a whole number, 1 or more")
    return version


@dataclass(frozen=True)
class Profile:
    name: str
    version: int
    #: every knob of `Policy`, by name
    knobs: Mapping[str, object]

    def policy(self) -> Policy:
        return Policy(**self.knobs)  # type: ignore[arg-type]

    def dump(self) -> dict[str, object]:
        """The profile as flat keys, as a profile file holds them."""
        return {"name": self.name, "version": self.version, **self.knobs}

    def to_toml(self) -> str:
        lines = []
        for key, value in self.dump().items():
            if isinstance(value, str):
                lines.append(f'{key} = "{value}"')
            else:
                lines.append(f"{key} = {value!r}")
        return "\n".join(lines) + "\n"


def parse(data: Mapping[str, object]) -> Profile:
    """A profile from flat keys (a parsed file, a stored row); unknown keys are refused."""
    for key in data:
        if key not in META and key not in KNOBS:
            raise ProfileError(key, "unknown key; a profile holds name, version and the knobs")
    if "name" not in data:
        raise ProfileError("name", "missing")
    name = check_name(data["name"])
    version = check_version(data.get("version", 1))
    knobs = check_knobs({k: v for k, v in data.items() if k in KNOBS})
    return Profile(name, version, knobs)


def shipped() -> list[str]:
    """Names of the profiles shipped under scheduling/profiles/."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def load(ref: str = DEFAULT_PROFILE) -> Profile:
    """Load a profile by shipped name (scheduling/profiles/NAME.toml) or by file path."""
    path = Path(ref)
    if not (ref.endswith(".toml") or "/" in ref or path.is_file()):
        path = PROFILE_DIR / f"{ref}.toml"
        if not path.is_file():
            raise ProfileError(
                "profile", f"no shipped profile {ref!r}; shipped: {', '.join(shipped())}"
            )
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ProfileError("profile", f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError("profile", f"{path} is not valid TOML: {exc}") from None
    return parse(data)
