"""``audit watch`` against a real udevd and real uevents, plus its two pure helpers."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from auditor.check import Check, Trigger
from auditor.hosts.base import Host
from auditor.model import Finding, Severity, Status
from auditor.policy import Policy
from auditor.registry import load_checks
from auditor.watch import DeviceEvent, changes, watch
from auditor.watch import affected_checks as affected_by
from tests.support.factories import make_finding


def affected_checks(event: DeviceEvent) -> frozenset[str]:
    return affected_by(event, load_checks())

UDEVD = next((p for p in ("/lib/systemd/systemd-udevd", "/usr/lib/systemd/systemd-udevd")
              if os.path.exists(p)), None)
AUDIT = str(Path(sys.executable).with_name("audit"))


DRIVER_CHECKS = {"kernel.version", "nvidia.uvm_hmm", "nvidia.modparams", "nvidia.driver",
                 "nvidia.persistence", "nvidia.fabricmanager", "rdma.peermem", "container.cdi"}


def test_pci_events_rerun_mrrs_and_nvidia_events_rerun_driver_checks() -> None:
    assert affected_checks(DeviceEvent("change", "pci", "0000:00:03.0")) == {
        "pcie.mrrs", "nvidia.fabricmanager", "rdma.peermem"}
    gpu_bind = DeviceEvent("bind", "pci", "0000:41:00.0", driver="nvidia", vendor="0x10de")
    assert affected_checks(gpu_bind) == {"pcie.mrrs", "lxc.device_majors", *DRIVER_CHECKS}
    module = DeviceEvent("add", "module", "nvidia_uvm")
    assert affected_checks(module) == {"lxc.device_majors", *DRIVER_CHECKS}
    node = DeviceEvent("add", "nvidia-caps", "nvidia-cap1", node="/dev/nvidia-caps/nvidia-cap1")
    assert affected_checks(node) == {"lxc.device_majors", "container.cdi"}
    assert affected_checks(DeviceEvent("add", "module", "virtio_net")) == frozenset()
    assert affected_checks(DeviceEvent("change", "block", "vda")) == frozenset()


def test_changes_lists_only_what_differs_one_line_each() -> None:
    dev = make_finding(check="pcie.mrrs", subject="0000:41:00.0", status=Status.PASS,
                       observed="4096", message="MaxReadReq 4096")
    same = make_finding(check="pcie.mrrs", subject="0000:c1:00.0", status=Status.PASS)
    worse = make_finding(check="pcie.mrrs", subject="0000:41:00.0", status=Status.FAIL,
                         observed="512", message="MaxReadReq 512\nbelow 4096")
    assert changes([dev, same], [dev, same]) == []
    assert changes([dev, same], [worse, same]) == [
        "pcie.mrrs 0000:41:00.0: pass -> fail, observed '4096' -> '512': "
        "MaxReadReq 512 below 4096"
    ]
    assert changes([dev], [dev, same])[0].startswith("pcie.mrrs 0000:c1:00.0: new pass")
    assert changes([dev, same], [dev]) == ["pcie.mrrs 0000:c1:00.0: gone (was pass)"]


def udevd_running() -> bool:
    ping = subprocess.run(["udevadm", "control", "--ping", "--timeout=2"],
                          capture_output=True, check=False)
    return ping.returncode == 0


@pytest.fixture
def udevd() -> Iterator[None]:
    """Use the running udevd, or start a real one for the test and stop it after."""
    if os.geteuid() != 0:
        pytest.skip("starting udevd and triggering uevents needs root")
    if UDEVD is None or shutil.which("udevadm") is None:
        pytest.skip("systemd-udevd/udevadm are not installed (apt-get install udev)")
    if not os.access("/sys/bus/pci/devices", os.W_OK) or not os.listdir("/sys/bus/pci/devices"):
        pytest.skip("no writable PCI devices in /sys: uevents cannot be triggered here")
    if udevd_running():
        yield
        return
    proc = subprocess.Popen([UDEVD], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            if udevd_running():
                break
            if proc.poll() is not None:
                pytest.skip(f"systemd-udevd exited with {proc.returncode} in this container")
            time.sleep(0.1)
        else:
            pytest.skip("systemd-udevd did not answer a ping within 5 s")
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.root
def test_watch_reruns_mrrs_on_a_real_pci_uevent(udevd: None) -> None:
    if "pcie.mrrs" not in {c.id for c in load_checks()}:
        pytest.skip("pcie.mrrs is not registered in this build")
    watch = subprocess.Popen(
        [AUDIT, "watch", "--check", "pcie.mrrs", "--count", "1", "--timeout", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert watch.stderr is not None
        started = watch.stderr.readline()
        assert "watching pcie.mrrs" in started and "on udev events" in started
        subprocess.run(["udevadm", "trigger", "--action=change", "--subsystem-match=pci"],
                       check=True)
        out, err = watch.communicate(timeout=40)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 0, err
    [event_line, stopped] = err.splitlines()
    assert "change pci 0000:" in event_line
    assert "re-ran pcie.mrrs" in event_line
    assert stopped == "audit watch: stopped after 1 event"
    # nothing changed on this machine, and only changes are printed
    assert "no changes" in event_line and out == ""


@pytest.mark.root
def test_watch_stops_at_its_timeout_without_events(udevd: None) -> None:
    watched = {c.id for c in load_checks()} & {"pcie.mrrs", "kernel.version",
                                                 "lxc.device_majors"}
    if not watched:
        pytest.skip("no watched check is registered in this build")
    proc = subprocess.run([AUDIT, "watch", "--timeout", "0.5"], capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 0
    assert proc.stderr.splitlines()[-1] == "audit watch: stopped after 0 events"


def test_watch_with_no_watched_check_is_a_usage_error() -> None:
    proc = subprocess.run([AUDIT, "watch", "--check", "numa.balancing", "--timeout", "0"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2
    assert "none of the selected checks reacts to device events" in proc.stderr


class CountingMrrs(Check):
    """Stands in for pcie.mrrs: reports how many times it ran as its observed value."""

    id: ClassVar[str] = "pcie.mrrs"
    severity: ClassVar[Severity] = Severity.LOW
    reads: ClassVar[tuple[str, ...]] = ("/sys/bus/pci/devices/*",)
    rationale: ClassVar[str] = "tests"
    remedy: ClassVar[str] = "none"
    runs: ClassVar[int] = 0
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.PCI})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        type(self).runs += 1
        devices = host.glob("/sys/bus/pci/devices/*")
        yield self.passed(devices[0].rsplit("/", 1)[1], "ran", observed=str(type(self).runs))


@pytest.mark.root
def test_watch_batches_a_trigger_burst_and_prints_the_change(udevd: None) -> None:
    out, log = io.StringIO(), io.StringIO()
    devices = len(os.listdir("/sys/bus/pci/devices"))

    def trigger() -> None:
        threading.Timer(0.2, subprocess.run, args=(
            ["udevadm", "trigger", "--action=change", "--subsystem-match=pci"],)).start()

    CountingMrrs.runs = 0
    seen = watch([CountingMrrs], Policy(), count=devices, timeout=20, out=out, log=log,
                 ready=trigger)
    assert seen == devices
    # one baseline run, then one re-run for the whole burst (or a few if it straggled)
    assert 2 <= CountingMrrs.runs <= 1 + devices
    lines = log.getvalue().splitlines()
    assert lines[0].endswith("watching pcie.mrrs (1 findings) on udev events")
    assert any("change pci 0000:" in line and "re-ran pcie.mrrs" in line for line in lines)
    changed = out.getvalue().splitlines()
    assert changed and "pcie.mrrs 0000:" in changed[0] and "observed '1' -> '2'" in changed[0]
