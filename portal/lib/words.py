"""Words for numbers people read: lengths of time and GPU counts, for pages and the audit log alike."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal


def duration(seconds: float | int | None) -> str:
    """A length of time as people read it: 45 s, 12 min, 2 h 5 min, 3 d 4 h; "" for None."""
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(s // 3600, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def gpus(milli: int | str | None) -> str:
    """Milli-GPU for people, to two decimals: 16000 -> "16", 1500 -> "1.5", 4666 -> "4.67",
    None -> "". Below 0.01 GPU the third decimal stays (5 -> "0.005"). A missing value
    (a template variable that does not resolve, such as a quota a team has not got) is ""."""
    if milli is None or milli == "":
        return ""
    value = Decimal(int(milli)) / 1000
    step = Decimal("0.01") if value >= Decimal("0.01") or not value else Decimal("0.001")
    text = str(value.quantize(step, rounding=ROUND_HALF_UP))
    return text.rstrip("0").rstrip(".") if "." in text else text


def gpu_count(milli: int | str | None) -> str:
    """With the unit, singular when it is one: "1 GPU", "0.5 GPU", "2 GPUs", "1.5 GPUs"."""
    if milli is None or milli == "":
        return ""
    text = gpus(milli)
    return f"{text} GPU" if float(text) <= 1 else f"{text} GPUs"


def _trim(value: Decimal) -> str:
    text = str(value.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))
    return text.rstrip("0").rstrip(".") if "." in text else text


def cpus(milli: int | None) -> str:
    """Milli-CPU for people: 8000 -> "8 CPUs", 500 -> "0.5 CPU", 1000 -> "1 CPU"."""
    if milli is None:
        return ""
    text = _trim(Decimal(int(milli)) / 1000)
    return f"{text} CPU" if float(text) <= 1 else f"{text} CPUs"


def memory(mib: int | None) -> str:
    """MiB for people: 65536 -> "64 GiB", 1536 -> "1.5 GiB", 512 -> "512 MiB"."""
    if mib is None:
        return ""
    if int(mib) < 1024:
        return f"{int(mib)} MiB"
    return f"{_trim(Decimal(int(mib)) / 1024)} GiB"


def device_slice(kind: str, mig_profile: str = "", milli: int = 1000, memory_mib: int = 0) -> str:
    """A device profile in one way for every page and the API: "whole GPU",
    "MIG 3g.40gb: 3/7 of a GPU, 40 GB", "shared: 0.25 GPU, 5 GB memory" (never "250m, 5120 MiB")."""
    if kind == "mig":
        compute, _, mem = mig_profile.partition(".")
        return f"MIG {mig_profile}: {compute.rstrip('g')}/7 of a GPU, {mem.upper().replace('GB', ' GB')}"
    if kind == "shared":
        cap = f", {memory_mib / 1024:g} GB memory" if memory_mib else ""
        return f"shared: {milli / 1000:g} GPU{cap}"
    return "whole GPU"
