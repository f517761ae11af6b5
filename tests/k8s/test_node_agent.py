"""The node agent against a fake NVML: MIG, a stray process, Xid events, an NVML error."""

from __future__ import annotations

import ast
import io
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from portal import node_agent
from tests.fakes.fake_pynvml import FakeNvml, Gpu, standard_node

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """The fake NVML, installed where the agent imports it."""
    fake = standard_node()
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    return fake


def report(fake: FakeNvml) -> dict[str, Any]:
    return node_agent.NodeAgent(node_agent.load_nvml(), "gpu-a").report()


def dev(rep: dict[str, Any], index: int) -> dict[str, Any]:
    return next(d for d in rep["devices"] if d["index"] == index)


def test_it_reports_every_device(nvml: FakeNvml) -> None:
    rep = report(nvml)
    assert nvml.initialised
    assert rep["node"] == "gpu-a" and rep["agent_version"] == node_agent.AGENT_VERSION
    assert rep["sent_at"].endswith("Z") and rep["driver_version"] == "550.107.02"
    assert [d["index"] for d in rep["devices"]] == [0, 1, 2, 3]
    idle = dev(rep, 0)
    assert idle == {
        **idle,
        "uuid": "GPU-0000",
        "memory_total_mib": 81920,
        "memory_used_mib": 3,
        "utilization_pct": 0,
        "healthy": True,
        "processes": [],
        "mig": [],
        "xids": [],
    }
    json.dumps(rep)  # it is JSON


def test_it_reads_mig_instances_with_placement_and_processes(nvml: FakeNvml) -> None:
    d = dev(report(nvml), 1)
    assert d["mig_mode"] and d["utilization_pct"] is None  # GPU_UTIL is not reported under MIG
    assert [(m["profile"], m["start"], m["size"], m["uuid"]) for m in d["mig"]] == [
        ("1g.10gb", 0, 1, "MIG-1a"),
        ("1g.10gb", 1, 1, "MIG-1b"),
        ("2g.20gb", 2, 2, "MIG-2a"),
        ("3g.40gb", 4, 4, "MIG-3a"),
    ]
    busy = d["mig"][3]
    assert (
        busy["processes"] == [{"pid": 777, "used_memory_mib": 30000}]
        and busy["memory_used_mib"] == 30000
    )


def test_it_reports_unknown_mig_placement_without_permission(nvml: FakeNvml) -> None:
    nvml.placement_permission = False
    assert {(m["start"], m["size"]) for m in dev(report(nvml), 1)["mig"]} == {(-1, 0)}


def test_it_lists_a_stray_process_holding_memory(nvml: FakeNvml) -> None:
    d = dev(report(nvml), 2)
    assert d["processes"] == [
        {"pid": 4242, "used_memory_mib": 20480},
        {"pid": 4243, "used_memory_mib": 0},
    ]
    assert d["utilization_pct"] == 97 and d["healthy"]


def test_an_nvml_error_on_one_device_marks_only_that_device(nvml: FakeNvml) -> None:
    rep = report(nvml)
    assert not dev(rep, 3)["healthy"] and "GPU is lost" in dev(rep, 3)["error"]
    assert dev(rep, 0)["healthy"] and dev(rep, 2)["healthy"]


def test_critical_and_application_xids() -> None:
    """FI-15 (agent side): Xid 79 marks the device unhealthy; Xid 13 is an application error
    and is reported without making the device unhealthy (no quarantine)."""
    assert all(node_agent.is_critical_xid(x) for x in (48, 63, 64, 74, 79, 92, 94, 95, 119, 120))
    assert not any(node_agent.is_critical_xid(x) for x in (13, 31, 43, 45, 68, 109))
    fake = standard_node()
    agent = node_agent.NodeAgent(fake.module(), "gpu-a")
    fake.xid(0, 13)
    assert agent.wait_for_events(0) is False
    fake.xid(2, 79)
    assert agent.wait_for_events(0) is True
    rep = agent.report()
    assert dev(rep, 0)["healthy"] and dev(rep, 0)["xids"][0]["xid"] == 13
    assert not dev(rep, 2)["healthy"]
    assert dev(rep, 2)["xids"][0] == {**dev(rep, 2)["xids"][0], "xid": 79, "critical": True}


def test_a_remap_failure_is_unhealthy() -> None:
    fake = FakeNvml(devices=[Gpu(0, "GPU-0", remap_failure=True)])
    rep = node_agent.NodeAgent(fake.module(), "n").report()
    assert not rep["devices"][0]["healthy"] and "row remapping" in rep["devices"][0]["error"]


class _Portal(BaseHTTPRequestHandler):
    received: list[tuple[str, str, dict[str, Any]]] = []
    status = 200

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).received.append((self.path, self.headers["Authorization"], body))
        self.send_response(type(self).status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def portal() -> Any:
    _Portal.received = []
    _Portal.status = 200
    server = HTTPServer(("127.0.0.1", 0), _Portal)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", _Portal
    server.shutdown()


def test_it_posts_the_report_with_the_bearer_token(nvml: FakeNvml, portal: Any) -> None:
    url, handler = portal
    rc = node_agent.run(portal=url, node="gpu-a", token="s3cret", once=True)
    assert rc == 0
    [(path, auth, body)] = handler.received
    assert path == "/api/v1/agent/report/" and auth == "Bearer s3cret"
    assert body["node"] == "gpu-a" and len(body["devices"]) == 4
    assert nvml.shutdowns == 1


def test_xids_are_kept_until_a_report_is_accepted(nvml: FakeNvml) -> None:
    """A report the portal did not accept loses no Xid: the next one carries it again."""
    nvml.xid(0, 79)
    answers = iter([200, 503, 200, 200])
    seen: list[list[int]] = []

    def post(portal: str, token: str, rep: dict[str, Any]) -> int:
        seen.append([x["xid"] for x in dev(rep, 0)["xids"]])
        return next(answers)

    node_agent.run(
        portal="http://x", node="gpu-a", token="t", interval_s=0, post=post, max_reports=4
    )
    # the first report goes out before the event is read; then 503, resent, accepted, gone
    assert seen == [[], [79], [79], []]


def test_it_keeps_reporting_when_the_portal_is_down(nvml: FakeNvml) -> None:
    statuses = iter([0, 500, 200])
    calls: list[dict[str, Any]] = []

    def post(portal: str, token: str, rep: dict[str, Any]) -> int:
        calls.append(rep)
        return next(statuses)

    assert (
        node_agent.run(
            portal="http://x", node="n", token="t", interval_s=0, post=post, max_reports=3
        )
        == 0
    )
    assert len(calls) == 3


def test_it_refuses_to_report_without_a_token(nvml: FakeNvml) -> None:
    assert node_agent.run(portal="http://x", node="n", token="", once=True) == 2


def test_the_management_command_prints_a_report(nvml: FakeNvml) -> None:
    out = io.StringIO()
    call_command("node_agent", "--once", "--print", "--node", "gpu-a", stdout=out)
    rep = json.loads(out.getvalue())
    assert rep["node"] == "gpu-a" and len(rep["devices"]) == 4


def test_the_management_command_posts(
    nvml: FakeNvml, portal: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, handler = portal
    monkeypatch.setenv("NODE_AGENT_TOKEN", "from-env")
    call_command("node_agent", "--portal", url, "--node", "gpu-b", "--interval", "5", "--once")
    assert handler.received[0][1] == "Bearer from-env"


def test_the_management_command_fails_without_a_token(
    nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, settings: Any, tmp_path: Path
) -> None:
    monkeypatch.delenv("NODE_AGENT_TOKEN", raising=False)
    monkeypatch.delenv("NODE_AGENT_TOKEN_FILE", raising=False)
    settings.NODE_AGENT_TOKEN = ""
    with pytest.raises(CommandError):
        call_command("node_agent", "--portal", "http://x", "--once")
    token = tmp_path / "token"
    token.write_text("from-file\n")
    monkeypatch.setenv("NODE_AGENT_TOKEN_FILE", str(token))
    assert node_agent.token_from_env() == "from-file"


def test_only_the_agent_imports_pynvml() -> None:
    """NVML is imported by the node agent only: no other module of portal/ or scheduling/
    imports pynvml."""
    offenders = []
    for path in list((ROOT / "portal").rglob("*.py")) + list((ROOT / "scheduling").rglob("*.py")):
        if path.name == "node_agent.py" and path.parent.name == "portal":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n.split(".")[0] == "pynvml" for n in names):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_it_touches_its_heartbeat_after_every_round_even_when_the_portal_is_down(
    nvml: FakeNvml, tmp_path: Any
) -> None:
    """The chart's liveness probe reads the heartbeat's age."""
    import os

    beat = tmp_path / "heartbeat"
    stamps: list[float] = []

    def post(portal: str, token: str, rep: dict[str, Any]) -> int:
        if beat.exists():
            stamps.append(beat.stat().st_mtime_ns)
            os.utime(beat, ns=(0, 0))
        return 503

    node_agent.run(
        portal="http://x",
        node="n",
        token="t",
        interval_s=0,
        post=post,
        max_reports=3,
        heartbeat=str(beat),
    )
    assert stamps and all(s > 0 for s in stamps)  # touched again after each failed round
    assert beat.stat().st_mtime_ns > 0
