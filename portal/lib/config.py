"""The site configuration file: its JSON Schema, reading it, and every error at its path."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from django.core.exceptions import ValidationError

from portal.lib import validation

SCHEMA_PATH = Path(__file__).with_name("config_schema.json")


class ConfigError(Exception):
    """An invalid configuration file: `errors` are "path: message" lines, all of them."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


@cache
def schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return data


def path_of(parts: Any) -> str:
    """`pools[0].node_selector` from a jsonschema path."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top)"


def parse(text: str, source: str = "config") -> dict[str, Any]:
    """The document in `text`, checked against the schema and the Kubernetes rules; raises
    ConfigError with every problem found."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{source}: not YAML: {exc}"]) from None
    if data is None:
        data = {}
    problem = validation.json_problem(data)
    if problem:
        raise ConfigError([f"{source}: {problem}"])
    errors = check(data)
    if errors:
        raise ConfigError(errors)
    assert isinstance(data, dict)
    return data


def check(data: Any) -> list[str]:
    """Every error in a parsed document, each "path: message", in document order."""
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    found = [f"{path_of(e.absolute_path)}: {_message(e)}" for e in errors]
    if found:
        return found
    return _duplicates(data) + _rules(data)


def _message(e: jsonschema.ValidationError) -> str:
    title = e.schema.get("title") if isinstance(e.schema, dict) else None
    if e.validator in ("pattern", "maxLength") and title:
        return f"{e.instance!r} is not {title}"
    return str(e.message)


def _duplicates(data: dict[str, Any]) -> list[str]:
    found = []
    for section in ("profiles", "pools", "classes", "teams"):
        seen: set[str] = set()
        for i, item in enumerate(data.get(section, [])):
            if item["name"] in seen:
                found.append(f"{section}[{i}].name: {item['name']!r} appears twice")
            seen.add(item["name"])
    return found


def _rules(data: dict[str, Any]) -> list[str]:
    """What the schema cannot say: selectors and taints as Kubernetes takes them, references."""
    found = []
    for i, pool in enumerate(data.get("pools", [])):
        for field, rule in (
            ("node_selector", validation.validate_node_selector),
            ("taints", validation.validate_taints),
            ("mig_layout", validation.validate_mig_layout),
        ):
            if field in pool:
                try:
                    rule(pool[field], f"pools[{i}].{field}")
                except ValidationError as exc:
                    found += [f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items()]
        if pool.get("partitioning") == "mig" and not pool.get("mig_layout"):
            found.append(f"pools[{i}].mig_layout: a MIG pool needs a layout")
    profiles = {p["name"] for p in data.get("profiles", [])}
    for i, wc in enumerate(data.get("classes", [])):
        ref = wc.get("default_profile")
        if ref and "profiles" in data and ref not in profiles:
            found.append(f"classes[{i}].default_profile: no profile {ref!r} in profiles")
    return found
