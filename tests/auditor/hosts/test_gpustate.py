"""The GPU-state collector: NVML in a child process, nvidia-smi, SSH, captures, and every failure.

The NVML child is started for real (``python -m auditor.shipped.nvml_child``) against a stand-in
``pynvml`` put on its path (tests/fixtures/fake_nvml): the lent H200's values, each error class
of ``nvmlInit``, a lost GPU, a crash of the interpreter and a hang past the deadline. nvidia-smi
is a script on PATH printing a document of tests/support/hostgen/smi.py; over SSH the same
script sits on the PATH of a real loopback sshd's session, for the python3 and the sh
collectors. The same XML gives the same findings whichever way it arrives.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from auditor.check import Check
from auditor.checks.gpu_clocks import GpuClocks
from auditor.checks.gpu_memory import GpuMemory
from auditor.checks.gpu_pcie_live import GpuPcieLive
from auditor.checks.gpu_xid import GpuXid
from auditor.checks.lib import gpustate
from auditor.checks.nvidia_driver import NvidiaDriver
from auditor.checks.nvidia_persistence import NvidiaPersistence
from auditor.hosts import DirectoryHost, LocalHost
from auditor.hosts import gpustate as collector
from auditor.hosts.archive import ArchiveHost
from auditor.hosts.base import Host
from auditor.model import Severity, Status
from tests.support.hostgen.smi import H200_NVML, SmiGpu, a100, rtx, smi_xml, v100
from tests.support.sysroot import Sysroot

FAKE_NVML = Path(__file__).resolve().parents[2] / "fixtures" / "fake_nvml"
STATE_CHECKS: list[type[Check]] = [GpuMemory, GpuClocks, GpuPcieLive]  # type: ignore[type-arg]
AUDIT = str(Path(sys.executable).with_name("audit"))


def findings(host: Host, checks: list[type[Check]] | None = None  # type: ignore[type-arg]
             ) -> list[tuple[str, str, str, str]]:
    """Return (check, status, subject, message) of the checks on a host."""
    return [(f.check, f.status.value, f.subject, f.message)
            for check in (checks or STATE_CHECKS) for f in check().evaluate(host)]


def planted(root: Sysroot, files: dict[str, bytes]) -> DirectoryHost:
    for path, data in files.items():
        root.write(path, data)
    return DirectoryHost(str(root.root))


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Put the stand-in pynvml on the child's path."""
    monkeypatch.setenv("PYTHONPATH", str(FAKE_NVML) + os.pathsep + os.environ.get(
        "PYTHONPATH", ""))
    monkeypatch.setenv("HA_FAKE_NVML", "ok")
    return monkeypatch


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory first on PATH, where a test writes its ``nvidia-smi``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def write_smi(bin_dir: Path, xml: bytes | None = None, *, exit_code: int = 0,
              said: str = "", sleep: float = 0) -> None:
    """Write a fake ``nvidia-smi`` that prints a document (or a message) and exits."""
    document = bin_dir / "nvidia-smi.xml"
    if xml is not None:
        document.write_bytes(xml)
    lines = ["#!/bin/sh"]
    if sleep:
        lines.append(f"sleep {sleep}")
    if said:
        (bin_dir / "nvidia-smi.said").write_text(said + "\n")
        lines.append(f"/bin/cat '{bin_dir / 'nvidia-smi.said'}'")
    if xml is not None:
        lines.append(f"/bin/cat '{document}'")
    lines.append(f"exit {exit_code}")
    script = bin_dir / "nvidia-smi"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)


# -- nvidia-smi -q -x of every branch, read defensively ------------------------------------------


@pytest.mark.parametrize(("branch", "gpu", "expect"), [
    ("470", v100(retired=(2, 1, "No")), {"retired_sbe": 2, "retired_dbe": 1, "remap_pending": None,
                                         "power_limit_w": 300.0, "reason_counters_us": None}),
    ("535", a100(unc_volatile=3), {"ecc_unc_volatile": 3, "remap_pending": False,
                                   "power_default_w": 400.0, "recovery_action": None}),
    ("550", a100(), {"pcie_gen_device_max": 4, "reasons_active": ("gpu_idle",)}),
    ("580", SmiGpu(), {"recovery_action": "None", "ecc_unc_aggregate": 0,
                       "pcie_width_max": 16, "persistence_mode": True}),
    ("580", rtx(), {"ecc_current": None, "remap_corr": None}),
])
def test_every_branch_reads_into_the_same_record(branch: str, gpu: SmiGpu,
                                                 expect: dict[str, object]) -> None:
    state = gpustate.state_from_xml(smi_xml(branch, [gpu]))
    assert state.error is None and len(state.gpus) == 1
    record = state.gpus[0]._asdict()
    assert {key: record[key] for key in expect} == expect
    assert state.driver.startswith(branch + ".")


def test_the_r580_document_is_what_the_lent_h200_reported() -> None:
    """The R580 builder writes, value for value, what the H200's nvidia-smi -q printed."""
    text = (Path(__file__).resolve().parents[2] / "fixtures" / "hosts"
            / "h200-lent-vm.nvidia-smi-q.txt").read_text()
    gpu = gpustate.state_from_xml(smi_xml("580")).gpus[0]

    def said(label: str, after: str = "") -> str:
        start = text.index(after) if after else 0
        line = next(row for row in text[start:].splitlines() if row.strip().startswith(label))
        return line.split(":", 1)[1].strip()

    assert gpu.bus_id == said("Bus Id").lower()[4:]
    assert gpu.persistence_mode is (said("Persistence Mode") == "Enabled")
    assert (gpu.ecc_current, gpu.ecc_pending) == (True, True)
    assert said("Current", "ECC Mode") == said("Pending", "ECC Mode") == "Enabled"
    assert gpu.remap_pending is (said("Pending", "Remapped Rows") == "Yes")
    assert gpu.recovery_action == said("GPU Recovery Action")
    assert f"{gpu.power_limit_w:.2f} W" == said("Current Power Limit")
    assert f"{gpu.power_default_w:.2f} W" == said("Default Power Limit")
    assert f"{gpu.app_clock_graphics} MHz" == said("Graphics", "\n    Applications Clocks\n")
    assert str(gpu.pcie_gen_max) == said("Max", "PCIe Generation")
    assert f"{gpu.pcie_width_current}x" == said("Current", "Link Width")
    assert gpu.counters()["hw_thermal_slowdown"] == int(said("HW Thermal Slowdown",
                                                             "Counters").split()[0])


def test_the_real_r580_xml_reads_as_the_builder_writes() -> None:
    """nvidia-smi -q -x of the lent H200 (580.159.04), taken on the machine."""
    real = (Path(__file__).resolve().parents[2] / "fixtures" / "hosts"
            / "h200-lent-vm.nvidia-smi-q-x.xml").read_bytes()
    state = gpustate.state_from_xml(real)
    assert state.error is None and state.driver == "580.159.04"
    built = gpustate.state_from_xml(smi_xml("580")).gpus[0]
    assert state.gpus[0]._replace(uuid="") == built._replace(uuid="")
    assert collector.sanitise_xml(real) == real  # no process ran: nothing to take out


def test_the_lent_h200s_kernel_log_holds_no_xid(make_sysroot: object) -> None:
    """Its NVIDIA lines (the module's banner, the persistence-mode deprecation) are no Xid."""
    kmsg = (Path(__file__).resolve().parents[2] / "fixtures" / "hosts"
            / "h200-lent-vm.kmsg").read_bytes()
    assert b"Persistence mode is deprecated" in kmsg
    host = planted(make_sysroot("h200"), {collector.KMSG: kmsg})  # type: ignore[operator]
    assert [(f.status, f.subject) for f in GpuXid().evaluate(host)] == [
        (Status.PASS, "kernel-log")]


def test_where_dev_kmsg_is_closed_the_journal_is_read(fake_smi: Path,
                                                       make_sysroot: object) -> None:
    from auditor.shipped.collector_script import read_kmsg

    journal = fake_smi / "journalctl"
    journal.write_text("#!/bin/sh\nprintf '%s\\n' '[  812.000001] gpu-01 kernel: NVRM: Xid "
                       "(PCI:0000:00:06): 79, pid=1, GPU has fallen off the bus.' "
                       "'[  813.000000] gpu-01 kernel: eth0: link up'\n")
    journal.chmod(0o755)
    lines = read_kmsg("/nonexistent/kmsg")
    assert lines is not None and lines.count(b"\n") == 1 and b"Xid" in lines
    host = planted(make_sysroot("h200"), {collector.KMSG: lines})  # type: ignore[operator]
    found = list(GpuXid().evaluate(host))
    assert [(f.status, f.subject) for f in found] == [(Status.FAIL, "0000:00:06.0")]


@pytest.mark.parametrize(("data", "why"), [
    (b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaa">]><nvidia_smi_log>&a;</nvidia_smi_log>',
     "entities"),
    (b'<!DOCTYPE nvidia_smi_log [<!ELEMENT x ANY>]><nvidia_smi_log/>', "internal subset"),
    (b'<nvidia_smi_log><gpu id="0000:00:06.0">', "not well-formed"),
    (b"<" + b"a" * (collector.MAX_XML + 1), "larger than"),
])
def test_hostile_xml_is_refused_and_said(data: bytes, why: str) -> None:
    state = gpustate.state_from_xml(data)
    assert state.error is not None and state.error[0] == "failed"
    assert why in state.error[1]


def test_a_gpu_nvidia_smi_could_not_open_is_named_lost() -> None:
    said = (b"Unable to determine the device handle for GPU0000:41:00.0: GPU is lost.  "
            b"Reboot the system to recover this GPU\n")
    state = gpustate.state_from_xml(smi_xml("580") + said)
    assert state.error is None
    assert [(g.bus_id, g.error[0] if g.error else "") for g in state.gpus] == [
        ("0000:00:06.0", ""), ("0000:41:00.0", "gpu_lost")]


def test_a_document_of_another_kind_is_not_judged() -> None:
    state = gpustate.state_from_xml(b"<html><gpu/></html>")
    assert state.error is not None and "not nvidia-smi" in state.error[1]


def test_the_process_list_never_reaches_a_capture() -> None:
    secret = "/opt/serve --api-key=sk-12345"
    raw = smi_xml("580", [SmiGpu(processes=((4242, secret),))])
    assert secret.encode() in raw
    kept = collector.sanitise_xml(raw)
    assert secret.encode() not in kept and b"<processes>" not in kept
    assert gpustate.state_from_xml(kept) == gpustate.state_from_xml(raw)._replace()


# -- the NVML child: its answers and its failures -------------------------------------------


def test_the_nvml_child_reads_what_nvidia_smi_reads(fake_nvml: pytest.MonkeyPatch,
                                                     make_sysroot: object) -> None:
    files = collector.run_nvml(10.0)
    nvml_host = planted(make_sysroot("h200"), files)  # type: ignore[operator]
    smi_host = planted(make_sysroot("h200"), {collector.SMI_XML: smi_xml("580")})  # type: ignore[operator]
    nvml = gpustate.state(nvml_host)
    assert nvml is not None and nvml.source == "nvml" and nvml.error is None
    assert nvml.gpus[0] == gpustate.gpu_from_record(H200_NVML["gpus"][0], 0)  # type: ignore[index]
    assert [f[:3] for f in findings(nvml_host)] == [f[:3] for f in findings(smi_host)] == [
        ("gpu.memory", "pass", "0000:00:06.0"), ("gpu.clocks", "pass", "0000:00:06.0"),
        ("gpu.pcie_live", "pass", "0000:00:06.0")]


@pytest.mark.parametrize(("mode", "status", "words"), [
    ("library_not_found", Status.SKIP, "no NVIDIA userspace"),
    ("driver_not_loaded", Status.FAIL, "the driver does not answer"),
    ("version_mismatch", Status.SKIP, "nvidia.driver judges it"),
    ("no_permission", Status.SKIP, "refused to answer"),
    ("unknown", Status.ERROR, "GPU state unknown"),
    ("gpu_lost", Status.FAIL, "lost"),
    ("reset_required", Status.FAIL, "in need of a reset"),
    ("crash", Status.ERROR, "the NVML collector died (killed by signal 11)"),
])
def test_each_nvml_failure_is_a_verdict(mode: str, status: Status, words: str,
                                        fake_nvml: pytest.MonkeyPatch,
                                        make_sysroot: object) -> None:
    fake_nvml.setenv("HA_FAKE_NVML", mode)
    host = planted(make_sysroot("h200"), collector.run_nvml(10.0))  # type: ignore[operator]
    found = list(GpuMemory().evaluate(host))
    assert len(found) == 1
    assert found[0].status is status and words in found[0].message, found[0]
    if mode in ("gpu_lost", "reset_required"):
        assert found[0].subject == "0000:00:06.0" and found[0].severity is Severity.CRITICAL
    # the other GPU checks skip and point at gpu.memory, or at nvidia.driver
    for check in (GpuClocks, GpuPcieLive):
        assert {f.status for f in check().evaluate(host)} == {Status.SKIP}
    if mode == "version_mismatch":
        driver = {f.subject: f for f in NvidiaDriver().evaluate(host)}
        assert driver["userspace"].status is Status.FAIL
        assert "version mismatch" in driver["userspace"].message


def test_unknown_error_in_a_container_is_the_lost_device_cgroup(
        fake_nvml: pytest.MonkeyPatch, make_sysroot: object) -> None:
    fake_nvml.setenv("HA_FAKE_NVML", "unknown")
    root = make_sysroot("h200")  # type: ignore[operator]
    root.write("/run/systemd/container", "docker\n")
    found = list(GpuMemory().evaluate(planted(root, collector.run_nvml(10.0))))
    assert found[0].status is Status.FAIL and "device-cgroup" in found[0].message
    assert "create-dev-char-symlinks" in found[0].fix


def test_a_hung_nvml_is_an_error_at_the_deadline_not_a_hung_audit(
        fake_nvml: pytest.MonkeyPatch, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.setenv("HA_FAKE_NVML", "hang")
    monkeypatch.setattr(collector, "nvidia_gpu_bound", lambda: True)
    host = LocalHost()
    host.gpu_use_nvml, host.gpu_deadline = True, 1.5
    started = time.monotonic()
    found = list(GpuMemory().evaluate(host))
    assert time.monotonic() - started < 8
    assert [(f.status, f.subject) for f in found] == [(Status.ERROR, "gpu-state")]
    assert "NVML did not answer in 1.5 s" in found[0].message
    # every other GPU check of the audit reuses the one answer: no second wait
    started = time.monotonic()
    assert {f.status for f in GpuClocks().evaluate(host)} == {Status.SKIP}
    assert time.monotonic() - started < 0.5


def test_the_live_machine_reads_nvml_only_where_it_is_asked(
        fake_nvml: pytest.MonkeyPatch, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collector, "nvidia_gpu_bound", lambda: True)
    host = LocalHost()
    host.gpu_use_nvml = True
    assert host._gpu_state is None
    found = list(GpuMemory().evaluate(host))
    assert [(f.status, f.subject) for f in found] == [(Status.PASS, "0000:00:06.0")]
    listing = host.listdir("/host-auditor")
    assert "nvml.json" in listing and "nvidia-smi.xml" not in listing  # NVML only, no nvidia-smi


def test_without_a_gpu_bound_to_nvidia_nvml_is_never_started(
        fake_smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collector, "nvidia_gpu_bound", lambda: False)
    monkeypatch.setattr(collector, "nvml_available", lambda: True)
    monkeypatch.setattr(collector, "run_nvml", lambda *a: pytest.fail("NVML started"))
    write_smi(fake_smi, exit_code=6, said="No devices were found")
    state = gpustate.state(LocalHost())
    assert state is not None and state.error is not None and state.error[0] == "no_gpu"


# -- nvidia-smi here, over SSH, in a capture: the same findings -----------------------------


def test_nvidia_smi_here_gives_the_findings_of_the_same_xml_in_a_sysroot(
        fake_smi: Path, monkeypatch: pytest.MonkeyPatch, make_sysroot: object) -> None:
    xml = smi_xml("535", [a100(remap=(0, 2, "Yes", "No"), power=(300.0, 400.0),
                               width=(8, 16))])
    write_smi(fake_smi, xml)
    monkeypatch.setattr(collector, "nvidia_gpu_bound", lambda: True)
    local = LocalHost()
    local.gpu_use_nvml = False
    sysroot = planted(make_sysroot("h200"), {collector.SMI_XML: xml})  # type: ignore[operator]
    assert findings(local) == findings(sysroot)
    assert [f[1] for f in findings(local)] == ["warn", "warn", "fail"]


@pytest.mark.parametrize(("said", "code", "status"), [
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9,
     Status.FAIL),
    ("Failed to initialize NVML: Driver/library version mismatch", 18, Status.SKIP),
    ("Failed to initialize NVML: Unknown Error", 255, Status.ERROR),
])
def test_a_failing_nvidia_smi_is_judged_by_what_it_said(
        said: str, code: int, status: Status, fake_smi: Path, monkeypatch: pytest.MonkeyPatch,
        make_sysroot: object) -> None:
    write_smi(fake_smi, exit_code=code, said=said)
    files = collector.run_nvidia_smi(5.0)
    assert collector.SMI_XML not in files
    host = planted(make_sysroot("h200"), files)  # type: ignore[operator]
    assert [f.status for f in GpuMemory().evaluate(host)] == [status]


def test_a_hung_nvidia_smi_is_killed_at_the_deadline(fake_smi: Path,
                                                     make_sysroot: object) -> None:
    write_smi(fake_smi, smi_xml("580"), sleep=30)
    started = time.monotonic()
    files = collector.run_nvidia_smi(1.0)
    assert time.monotonic() - started < 5
    host = planted(make_sysroot("h200"), files)  # type: ignore[operator]
    found = list(GpuMemory().evaluate(host))
    assert found[0].status is Status.ERROR and "did not answer in 1 s" in found[0].message


def test_a_snapshot_keeps_the_xml_and_replays_the_verdicts(
        fake_smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from auditor.snapshot import capture_local

    secret = "/opt/serve --token=abc"
    xml = smi_xml("580", [SmiGpu(mig=("Disabled", "Enabled"), processes=((7, secret),))])
    write_smi(fake_smi, xml)
    monkeypatch.setattr(collector, "nvml_available", lambda: False)
    capture = capture_local([GpuMemory, GpuClocks, GpuPcieLive])
    replay = ArchiveHost(capture.data, "capture")
    kept = replay.read_bytes(collector.SMI_XML)
    assert secret.encode() not in kept and b"<mig_mode>" in kept
    assert replay.read_text(collector.SMI_STATUS).startswith("exit 0")
    assert [f[1] for f in findings(replay)] == ["warn", "pass", "pass"]


def test_a_capture_without_the_gpu_state_says_it_was_not_collected(make_sysroot: object) -> None:
    host = DirectoryHost(str(make_sysroot("h200").root))  # type: ignore[operator]
    for check in (GpuMemory, GpuClocks, GpuPcieLive):
        found = list(check().evaluate(host))
        assert [f.status for f in found] == [Status.SKIP]
        assert "not collected" in found[0].message


def test_persistence_is_judged_on_what_the_driver_reports(tmp_path: Path,
                                                         make_sysroot: object) -> None:
    """The lent H200: on, set by hand, not lasting; never "GPUs deinitialise"."""
    from tests.support.sysroot import FIXTURES, extract_capture

    lent = Sysroot(extract_capture(FIXTURES / "h200-lent-vm.tar.gz", tmp_path / "lent"))
    on = planted(lent, {collector.SMI_XML: smi_xml("580")})
    found = next(iter(NvidiaPersistence().evaluate(on)))
    assert found.status is Status.WARN and found.severity is Severity.LOW
    assert "persistence is on now" in found.message and "set by hand" in found.message
    assert "not kept across a reboot" in found.message and "deinitialise" not in found.message
    off = planted(lent, {collector.SMI_XML: smi_xml("580", [SmiGpu(persistence="Disabled")])})
    assert "deinitialises" in next(iter(NvidiaPersistence().evaluate(off))).message
    # a capture without /run: on is on, the lasting part cannot be told
    bare = planted(make_sysroot("h200"), {collector.SMI_XML: smi_xml("580")})  # type: ignore[operator]
    assert next(iter(NvidiaPersistence().evaluate(bare))).status is Status.PASS


# -- over SSH: the same XML through the python3 and the sh collector -------------------------------


@pytest.fixture(scope="module")
def smi_sshd() -> Iterator[tuple[object, Path, Path]]:
    """A loopback sshd whose root session finds a fake nvidia-smi (and dmesg) on its PATH."""
    if os.geteuid() != 0 or not os.path.exists("/usr/sbin/sshd"):
        pytest.skip("needs root and openssh-server (tests/run.sh installs it)")
    from tests.support.sshd import SshLab

    lab = SshLab(Path(tempfile.mkdtemp(prefix="ha-gpu-sshlab-")))
    bin_dir = lab.root / "bin"
    bin_dir.mkdir()
    os.chmod(bin_dir, 0o755)
    nopy = lab.root / "nopy"
    nopy.mkdir()
    for tool in ("sh", "id", "sudo", "readlink", "head", "od", "ls", "grep", "tail",
                 "timeout", "cat", "printf"):
        found = shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin")
        if found:
            (nopy / tool).symlink_to(found)
    user = lab.add_user(f"ha-gpu{os.getpid() % 100000:05d}")
    server = lab.start(extra=[
        "Match User root", f"    SetEnv PATH={bin_dir}:/usr/bin:/bin",
        f"Match User {user}", f"    SetEnv PATH={bin_dir}:{nopy}",
    ])
    known = lab.known_hosts(lab.root / "known_hosts")
    try:
        yield (lab, server, known), bin_dir, Path(user)
    finally:
        lab.close()
        shutil.rmtree(lab.root, ignore_errors=True)


def _ssh(env: tuple[object, object, Path], user: str, checks: list[str]) -> Host:
    from auditor.hosts.ssh import SshHost, SshOptions, parse_target
    from auditor.registry import collected_paths, load_checks

    lab, server, known = env
    options = SshOptions(user=user, identity=str(lab.client_key),  # type: ignore[attr-defined]
                         known_hosts=(str(known),), timeout=20.0)
    chosen = [c for c in load_checks() if c.id in checks]
    return SshHost.open(parse_target(server.target), options,  # type: ignore[attr-defined]
                        collected_paths(chosen))


@pytest.mark.ssh
@pytest.mark.parametrize("who", ["root (python3 collector)", "no python3 (sh collector)"])
def test_over_ssh_the_same_xml_gives_the_same_findings(
        who: str, smi_sshd: tuple[tuple[object, object, Path], Path, Path],
        make_sysroot: object) -> None:
    env, bin_dir, user = smi_sshd
    xml = smi_xml("580", [SmiGpu(remap=(0, 1, "Yes", "No"),
                                 counters={"sw_power_cap": 0, "sync_boost": 0,
                                           "sw_therm_slowdown": 0, "hw_therm_slowdown": 2_000_000,
                                           "hw_power_brake": 0})])
    write_smi(bin_dir, xml)
    kmsg = "NVRM: Xid (PCI:0000:00:06): 79, pid=1, GPU has fallen off the bus."
    dmesg = bin_dir / "dmesg"
    dmesg.write_text(f"#!/bin/sh\nprintf '%s\\n' '[  812.000001] {kmsg}'\n")
    dmesg.chmod(0o755)
    os.chmod(bin_dir / "nvidia-smi.xml", 0o644)
    name = "root" if who.startswith("root") else str(user)
    host = _ssh(env, name, ["gpu.memory", "gpu.clocks", "gpu.pcie_live", "gpu.xid"])
    method = host.collection.method  # type: ignore[attr-defined]
    assert method == ("python" if name == "root" else "sh")
    sysroot = planted(make_sysroot("h200"), {collector.SMI_XML: xml})  # type: ignore[operator]
    assert findings(host) == findings(sysroot)
    assert [f[1] for f in findings(host)] == ["warn", "warn", "pass"]
    if method == "sh":  # the python3 collector reads the real /dev/kmsg instead of dmesg
        xid = list(GpuXid().evaluate(host))
        assert xid[0].status is Status.FAIL and xid[0].subject == "0000:00:06.0"


@pytest.mark.ssh
def test_over_ssh_a_missing_nvidia_smi_is_said(
        smi_sshd: tuple[tuple[object, object, Path], Path, Path]) -> None:
    env, bin_dir, user = smi_sshd
    (bin_dir / "nvidia-smi").unlink(missing_ok=True)
    host = _ssh(env, str(user), ["gpu.memory"])
    state = gpustate.state(host)
    assert state is not None and state.error is not None
    assert state.error[0] == "library_not_found"


# -- start-up: nothing of this on a run that does not need it ------------------------------------


def test_audit_checks_imports_neither_the_collector_nor_xml() -> None:
    proc = subprocess.run([sys.executable, "-X", "importtime", AUDIT, "checks"],
                          capture_output=True, text=True, timeout=120, check=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()}
    assert "gpu.memory" in proc.stdout
    assert not imported & {"pynvml", "auditor.hosts.gpustate", "auditor.checks.lib.gpustate",
                           "xml.etree.ElementTree", "auditor.shipped.nvml_child"}


def test_audit_watch_reads_the_gpu_state_again_after_an_event(make_sysroot: object) -> None:
    from auditor.policy import load_policy
    from auditor.watch import Watcher

    root = make_sysroot("h200")  # type: ignore[operator]
    host = planted(root, {collector.SMI_XML: smi_xml("580")})
    watcher = Watcher(host, [GpuMemory], load_policy([GpuMemory]))
    assert watcher.run(["gpu.memory"]) == []
    root.write(collector.SMI_XML, smi_xml("580", [SmiGpu(remap=(0, 1, "Yes", "No"))]))
    changed = watcher.run(["gpu.memory"])
    assert len(changed) == 1 and "pass -> warn" in changed[0] and "remapping is pending" in \
        changed[0]
