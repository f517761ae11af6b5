"""GPU nodes grouped by what GPU Feature Discovery and the GPU Operator label, each group
with a proposed pool in the configuration file's format (`manage.py discover`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from portal.backends import get_backend
from portal.backends.base import DiscoveredNode
from portal.models import Pool
from scheduling import mig

PRODUCT = "nvidia.com/gpu.product"
MEMORY = "nvidia.com/gpu.memory"
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_CONFIG = "nvidia.com/mig.config"
REPLICAS = "nvidia.com/gpu.replicas"
DRIVER = "nvidia.com/cuda.driver-version.full"
DRIVER_MAJOR = "nvidia.com/cuda.driver.major"

#: what a group is told apart by, in the order the page shows them
GROUP_LABELS = (PRODUCT, MEMORY, MIG_STRATEGY, MIG_CONFIG, REPLICAS, DRIVER)


@dataclass
class NodeRow:
    name: str
    gpus: int
    #: names of the pools whose node selector matches the node's labels
    pools: list[str]
    #: why the node's GPUs are not scheduled as they are labelled ("" when they are)
    problem: str = ""

    @property
    def flag(self) -> str:
        if self.problem:
            return self.problem
        if not self.pools:
            return "no pool selects it"
        if len(self.pools) > 1:
            return f"{len(self.pools)} pools select it: {', '.join(self.pools)}"
        return ""


@dataclass
class Group:
    labels: dict[str, str]
    nodes: list[NodeRow] = field(default_factory=list)
    #: a pool for the group, as a config-file entry; None when one pool selects every node
    proposal: dict[str, Any] | None = None

    @property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def problem(self) -> str:
        return mig_problem(self.labels)


def mig_mode(labels: Mapping[str, str]) -> bool:
    """Whether the GPU Operator runs the node's GPUs in MIG mode."""
    config = labels.get(MIG_CONFIG, "")
    return labels.get(MIG_STRATEGY, "") in ("single", "mixed") and config not in (
        "",
        "all-disabled",
    )


def mig_problem(labels: Mapping[str, str]) -> str:
    """ "unknown MIG GPU <product>: ..." for MIG GPUs the geometry table lacks, else ""."""
    if not mig_mode(labels):
        return ""
    memory = labels.get(MEMORY, "")
    product = labels.get(PRODUCT, "")
    if mig.family_for(product, int(memory) if memory.isdigit() else 0) is not None:
        return ""
    return mig.unknown_gpu_message(product)


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    # an empty selector would take every node: no pool means that
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def driver_of(labels: Mapping[str, str]) -> str:
    return labels.get(DRIVER) or labels.get(DRIVER_MAJOR, "")


def group_nodes(
    nodes: Iterable[DiscoveredNode], pools: Mapping[str, Mapping[str, str]]
) -> list[Group]:
    """Nodes grouped by their GPU labels (sorted), each node with the pools that select it,
    each group that some node of is unselected or doubly selected with a proposed pool."""
    groups: dict[tuple[str, ...], Group] = {}
    for n in sorted(nodes, key=lambda n: n.name):
        key_labels = {k: n.labels.get(k, "") for k in GROUP_LABELS}
        key_labels[DRIVER] = driver_of(n.labels)
        key = tuple(key_labels[k] for k in GROUP_LABELS)
        group = groups.setdefault(key, Group(labels=key_labels))
        chosen = sorted(p for p, sel in pools.items() if selects(sel, n.labels))
        group.nodes.append(NodeRow(n.name, n.gpus, chosen, group.problem))
    out = [groups[k] for k in sorted(groups)]
    taken = set(pools)
    for g in out:
        # a pool of an unknown MIG GPU would be refused: no geometry to pack it by
        if any(len(n.pools) != 1 for n in g.nodes) and not g.problem:
            g.proposal = propose(g, out, taken)
            taken.add(g.proposal["name"])
    return out


def propose(group: Group, groups: list[Group], taken: set[str]) -> dict[str, Any]:
    """A pool for the group: selected by the product label, plus the labels that tell this
    group from others of the same product (MIG configuration, sharing replicas)."""
    labels = group.labels
    product = labels[PRODUCT] or "unknown-gpu"
    selector = {PRODUCT: product}
    same = [g for g in groups if g is not group and g.labels[PRODUCT] == labels[PRODUCT]]
    for key in (MIG_CONFIG, REPLICAS, MEMORY):
        if any(g.labels[key] != labels[key] for g in same) and labels[key]:
            selector[key] = labels[key]
    memory = int(labels[MEMORY]) if labels[MEMORY].isdigit() else 0
    entry: dict[str, Any] = {
        "name": _name(product, selector, taken),
        "gpu_model": product,
        "gpu_memory_mib": memory or 1,
        "node_selector": selector,
    }
    replicas = int(labels[REPLICAS]) if labels[REPLICAS].isdigit() else 1
    config = labels[MIG_CONFIG]
    if mig_mode(labels):
        entry["partitioning"] = "mig"
        entry["mig_layout"] = mig_layout_for(product, memory, config)
    elif replicas > 1:
        entry["partitioning"] = "time-slicing"
        entry["replicas"] = replicas
    else:
        entry["partitioning"] = "exclusive"
    return entry


def mig_layout_for(product: str, memory_mib: int, config: str) -> list[str]:
    """The layout a mig-parted configuration name stands for ("all-1g.10gb", "all-balanced"),
    on this GPU's geometry; [] when it is a site's own name (the admin fills it in)."""
    family = mig.family_for(product, memory_mib)
    if family is None:
        return []
    if config.startswith("all-") and family.profile(config[4:]) is not None:
        one = config[4:]
        layout: list[str] = []
        while mig.fits(family, [*layout, one]):
            layout.append(one)
        return layout
    if config == "all-balanced":
        # mig-parted's balanced layout: one 3g, one 2g and two 1g instances (on a 4-slice
        # GPU one 2g and two 1g)
        by_compute: dict[int, str] = {}
        for p in family.profiles:
            if "+" not in p.name and "-" not in p.name:
                by_compute.setdefault(p.compute, p.name)
        sizes = (3, 2, 1, 1) if family.compute_slices == mig.COMPUTE_SLICES else (2, 1, 1)
        wanted = [by_compute.get(c) for c in sizes]
        if all(wanted) and mig.fits(family, [w for w in wanted if w]):
            return [w for w in wanted if w]
    return []


def _name(product: str, selector: Mapping[str, str], taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", product.lower()).strip("-")[:50] or "gpu"
    extra = selector.get(MIG_CONFIG) or (f"x{selector[REPLICAS]}" if REPLICAS in selector else "")
    if extra:
        base = f"{base}-{re.sub(r'[^a-z0-9]+', '-', extra.lower()).strip('-')}"[:60].strip("-")
    name, i = base, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    return name


def discovery() -> list[Group]:
    """The configured backend's GPU nodes against the live pools' node selectors."""
    pools = {
        p.name: {str(k): str(v) for k, v in (p.node_selector or {}).items()}
        for p in Pool.objects.filter(retired_at=None)
    }
    return group_nodes(get_backend().gpu_nodes(), pools)


def proposals_document(groups: list[Group]) -> dict[str, Any]:
    """The proposed pools as a configuration file `config apply` takes."""
    return {"version": 1, "pools": [g.proposal for g in groups if g.proposal]}
