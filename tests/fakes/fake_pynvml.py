"""A fake `pynvml` module (the API of nvidia-ml-py) for the node agent's tests.

Install it at the import site: `monkeypatch.setitem(sys.modules, "pynvml", fake)`
with `fake = FakeNvml(devices=[...]).module()`. Devices are plain dataclasses;
`raise_on` makes one call on one device raise an NVML error; `xid()` queues an
Xid event for `nvmlEventSetWait_v2`.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

MIB = 1024 * 1024

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
nvmlEventTypeXidCriticalError = 0x0000000000000008


class NVMLError(Exception):
    _map: dict[int, type] = {}

    def __new__(cls, value: int) -> NVMLError:
        typ = NVMLError._map.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        self.value = value

    def __str__(self) -> str:
        return {
            3: "Not Supported",
            4: "Insufficient Permissions",
            6: "Not Found",
            10: "Timeout",
            15: "GPU is lost",
            999: "Unknown Error",
        }.get(self.value, f"NVML error {self.value}")


def _sub(name: str, value: int) -> type:
    cls = type(name, (NVMLError,), {"__new__": lambda c, v=value: Exception.__new__(c)})
    cls.__init__ = lambda self, v=value: setattr(self, "value", value)
    NVMLError._map[value] = cls
    return cls


NVMLError_NotSupported = _sub("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _sub("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _sub("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_Timeout = _sub("NVMLError_Timeout", NVML_ERROR_TIMEOUT)
NVMLError_GpuIsLost = _sub("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Unknown = _sub("NVMLError_Unknown", NVML_ERROR_UNKNOWN)


@dataclass
class Proc:
    pid: int
    usedGpuMemory: int | None  # noqa: N815 (NVML's name)


@dataclass
class Mig:
    profile: str
    start: int
    size: int
    uuid: str
    memory_mib: int
    used_mib: int = 0
    procs: list[Proc] = field(default_factory=list)
    gi_id: int = 0
    parent: Any = None


@dataclass
class Gpu:
    index: int
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_mib: int = 81920
    used_mib: int = 0
    util: int = 0
    procs: list[Proc] = field(default_factory=list)
    migs: list[Mig] = field(default_factory=list)
    mig_enabled: bool = False
    remap_failure: bool = False


@dataclass
class _Mem:
    total: int
    free: int
    used: int


@dataclass
class _Util:
    gpu: int
    memory: int


@dataclass
class _Placement:
    start: int
    size: int


@dataclass
class _GiInfo:
    id: int
    profileId: int  # noqa: N815
    placement: _Placement


@dataclass
class _Event:
    device: Any
    eventType: int  # noqa: N815
    eventData: int  # noqa: N815
    gpuInstanceId: int = 0xFFFFFFFF  # noqa: N815
    computeInstanceId: int = 0xFFFFFFFF  # noqa: N815


@dataclass
class FakeNvml:
    devices: list[Gpu]
    #: (function name, device index) -> NVML error code raised by that call on that device
    raise_on: dict[tuple[str, int], int] = field(default_factory=dict)
    events: list[_Event] = field(default_factory=list)
    initialised: bool = False
    shutdowns: int = 0
    placement_permission: bool = True
    driver: str = "550.107.02"

    def xid(self, index: int, xid: int) -> None:
        self.events.append(
            _Event(
                device=self.devices[index], eventType=nvmlEventTypeXidCriticalError, eventData=xid
            )
        )

    def _check(self, fn: str, handle: Any) -> None:
        index = handle.index if isinstance(handle, Gpu) else handle.parent.index
        code = self.raise_on.get((fn, index))
        if code is not None:
            raise NVMLError(code)

    def module(self) -> types.ModuleType:
        m = types.ModuleType("pynvml")
        for name, value in globals().items():
            if name.startswith(("NVML", "nvmlEventType")):
                setattr(m, name, value)
        fake = self

        def init() -> None:
            fake.initialised = True

        def shutdown() -> None:
            fake.shutdowns += 1

        def count() -> int:
            return len(fake.devices)

        def handle(i: int) -> Gpu:
            fake._check("nvmlDeviceGetHandleByIndex", fake.devices[i])
            return fake.devices[i]

        def uuid(h: Any) -> str:
            fake._check("nvmlDeviceGetUUID", h)
            return h.uuid

        def name(h: Any) -> str:
            if isinstance(h, Mig):
                return f"{h.parent.name} MIG {h.profile}"
            fake._check("nvmlDeviceGetName", h)
            return h.name

        def meminfo(h: Any) -> _Mem:
            fake._check("nvmlDeviceGetMemoryInfo", h)
            total, used = h.memory_mib * MIB, h.used_mib * MIB
            return _Mem(total=total, free=total - used, used=used)

        def util(h: Gpu) -> _Util:
            if h.mig_enabled:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            fake._check("nvmlDeviceGetUtilizationRates", h)
            return _Util(gpu=h.util, memory=0)

        def mig_mode(h: Gpu) -> tuple[int, int]:
            mode = NVML_DEVICE_MIG_ENABLE if h.mig_enabled else NVML_DEVICE_MIG_DISABLE
            return mode, mode

        def max_mig(h: Gpu) -> int:
            return 7

        def mig_handle(h: Gpu, j: int) -> Mig:
            if j >= len(h.migs):
                raise NVMLError(NVML_ERROR_NOT_FOUND)
            h.migs[j].parent = h
            h.migs[j].gi_id = j + 1
            return h.migs[j]

        def gi_id(mh: Mig) -> int:
            return mh.gi_id

        def gi_by_id(h: Gpu, gid: int) -> Mig:
            if not fake.placement_permission:
                raise NVMLError(NVML_ERROR_NO_PERMISSION)
            return next(m for m in h.migs if m.gi_id == gid)

        def gi_info(gi: Mig) -> _GiInfo:
            return _GiInfo(id=gi.gi_id, profileId=0, placement=_Placement(gi.start, gi.size))

        def procs(h: Any) -> list[Proc]:
            fake._check("nvmlDeviceGetComputeRunningProcesses", h)
            return list(h.procs)

        def gprocs(h: Any) -> list[Proc]:
            return []

        def remap(h: Gpu) -> tuple[int, int, int, int]:
            return 0, 0, 0, int(h.remap_failure)

        def evset() -> list[_Event]:
            return []

        def register(h: Gpu, types_: int, s: Any) -> None:
            fake._check("nvmlDeviceRegisterEvents", h)

        def wait(s: Any, timeout_ms: int) -> _Event:
            if not fake.events:
                raise NVMLError(NVML_ERROR_TIMEOUT)
            return fake.events.pop(0)

        def index_of(h: Gpu) -> int:
            return h.index

        def driver() -> str:
            return fake.driver

        for attr, fn in {
            "nvmlInit": init,
            "nvmlShutdown": shutdown,
            "nvmlDeviceGetCount": count,
            "nvmlDeviceGetHandleByIndex": handle,
            "nvmlDeviceGetUUID": uuid,
            "nvmlDeviceGetName": name,
            "nvmlDeviceGetMemoryInfo": meminfo,
            "nvmlDeviceGetUtilizationRates": util,
            "nvmlDeviceGetMigMode": mig_mode,
            "nvmlDeviceGetMaxMigDeviceCount": max_mig,
            "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
            "nvmlDeviceGetGpuInstanceId": gi_id,
            "nvmlDeviceGetGpuInstanceById": gi_by_id,
            "nvmlGpuInstanceGetInfo": gi_info,
            "nvmlDeviceGetComputeRunningProcesses": procs,
            "nvmlDeviceGetGraphicsRunningProcesses": gprocs,
            "nvmlDeviceGetRemappedRows": remap,
            "nvmlEventSetCreate": evset,
            "nvmlDeviceRegisterEvents": register,
            "nvmlEventSetWait_v2": wait,
            "nvmlDeviceGetIndex": index_of,
            "nvmlSystemGetDriverVersion": driver,
        }.items():
            setattr(m, attr, fn)
        return m


def standard_node() -> FakeNvml:
    """Four GPUs: 0 idle; 1 in MIG (3g.40gb busy, 2g.20gb, 2× 1g.10gb); 2 with a stray
    process; 3 whose memory query fails (an NVML error on one device)."""
    mig = [
        Mig("1g.10gb", 0, 1, "MIG-1a", 9856),
        Mig("1g.10gb", 1, 1, "MIG-1b", 9856),
        Mig("2g.20gb", 2, 2, "MIG-2a", 19968),
        Mig("3g.40gb", 4, 4, "MIG-3a", 40192, used_mib=30000, procs=[Proc(777, 30000 * MIB)]),
    ]
    return FakeNvml(
        devices=[
            Gpu(0, "GPU-0000", used_mib=3, util=0),
            Gpu(1, "GPU-1111", mig_enabled=True, migs=mig, used_mib=30100),
            Gpu(
                2,
                "GPU-2222",
                used_mib=20480,
                util=97,
                procs=[Proc(4242, 20480 * MIB), Proc(4243, None)],
            ),
            Gpu(3, "GPU-3333"),
        ],
        raise_on={("nvmlDeviceGetMemoryInfo", 3): NVML_ERROR_GPU_IS_LOST},
    )
