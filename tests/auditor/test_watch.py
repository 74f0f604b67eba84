"""``audit watch`` against a real udevd and real uevents, plus its two pure helpers."""

from __future__ import annotations

import io
import json
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

from auditor.check import Check, CheckOptions, Trigger
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


#: The checks of PCI devices and the paths between them: a PCI event re-runs them.
PCI_CHECKS = {"pcie.mrrs", "pcie.acs", "pcie.aspm", "iommu.mode", "numa.placement",
              "nvidia.fabricmanager", "rdma.peermem"}
#: The checks of the NVIDIA driver: a module event or a GPU bound re-runs them.
DRIVER_CHECKS = {"kernel.version", "nvidia.uvm_hmm", "nvidia.modparams", "nvidia.driver",
                 "nvidia.persistence", "nvidia.fabricmanager", "rdma.peermem", "container.cdi"}


def declaring(*triggers: Trigger) -> set[str]:
    """Return the ids of the registered checks that declare any of ``triggers``."""
    return {c.id for c in load_checks() if c.events & set(triggers)}


def test_pci_events_rerun_mrrs_and_nvidia_events_rerun_driver_checks() -> None:
    # Exactly the checks that declare the event's kinds; and among them, at least the
    # ones named here (a check added later that declares the event joins them).
    pci = affected_checks(DeviceEvent("change", "pci", "0000:00:03.0"))
    assert pci == declaring(Trigger.PCI) and PCI_CHECKS <= pci
    gpu_bind = DeviceEvent("bind", "pci", "0000:41:00.0", driver="nvidia", vendor="0x10de")
    bound = affected_checks(gpu_bind)
    assert bound == declaring(Trigger.PCI, Trigger.GPU_MODULE)
    assert {*PCI_CHECKS, "lxc.device_majors", *DRIVER_CHECKS} <= bound
    module = DeviceEvent("add", "module", "nvidia_uvm")
    loaded = affected_checks(module)
    assert loaded == declaring(Trigger.GPU_MODULE)
    assert {"lxc.device_majors", *DRIVER_CHECKS} <= loaded
    assert not (PCI_CHECKS - DRIVER_CHECKS) & loaded  # a module event is not a PCI event
    node = DeviceEvent("add", "nvidia-caps", "nvidia-cap1", node="/dev/nvidia-caps/nvidia-cap1")
    assert affected_checks(node) == declaring(Trigger.GPU_NODE) >= {"lxc.device_majors",
                                                                    "container.cdi"}
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


class CountingMrrs(Check[CheckOptions]):
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
    assert "watching pcie.mrrs (1 findings) on udev events (" in lines[0]
    assert any("change pci 0000:" in line and "re-ran pcie.mrrs" in line for line in lines)
    changed = out.getvalue().splitlines()
    assert changed and "pcie.mrrs 0000:" in changed[0] and "observed '1' -> '2'" in changed[0]


@pytest.mark.root
def test_auto_source_hears_the_kernel_when_udevd_stopped_and_left_its_socket() -> None:
    """A real udevd answers, then is stopped with /run/udev/control left behind: --source
    auto listens to udev while it answers and to the kernel after, and says which."""
    if os.geteuid() != 0:
        pytest.skip("starting udevd and triggering uevents needs root")
    if UDEVD is None or shutil.which("udevadm") is None or shutil.which("unshare") is None:
        pytest.skip("systemd-udevd, udevadm or unshare is not installed (apt-get install udev)")
    if not os.access("/sys/bus/pci/devices", os.W_OK) or not os.listdir("/sys/bus/pci/devices"):
        pytest.skip("no writable PCI devices in /sys: uevents cannot be triggered here")
    # A mount namespace with its own /run/udev: the machine's own udevd is left alone.
    lab = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-m",
         "tests.support.udevlab"],
        capture_output=True, text=True, timeout=180, check=False,
        cwd=Path(__file__).resolve().parents[2])
    assert lab.returncode == 0, lab.stderr[-3000:]
    result = json.loads(lab.stdout)
    assert result["answered"], "the lab's udevd never answered a ping"
    running = result["running"]
    assert "on udev events (udevd answered udevadm control --ping)" in running["first"]
    assert running["code"] == 0 and "re-ran pcie.mrrs" in running["err"], running
    assert result["socket_left"] and not result["answers_after"]
    stopped = result["stopped"]
    assert ("on kernel events (udevd did not answer udevadm control --ping)"
            in stopped["first"]), stopped
    assert stopped["code"] == 0, stopped
    assert "change pci 0000:" in stopped["err"] and "re-ran pcie.mrrs" in stopped["err"]
    assert stopped["err"].splitlines()[-1] == "audit watch: stopped after 1 event"


def test_changes_keep_two_aspects_of_one_subject_apart() -> None:
    mrrs = make_finding(check="pcie.mrrs", subject="0000:41:00.0", status=Status.PASS,
                        observed="4096")
    link = make_finding(check="pcie.mrrs", subject="0000:41:00.0", status=Status.PASS,
                        observed="x16", aspect="link", message="link x16")
    narrow = make_finding(check="pcie.mrrs", subject="0000:41:00.0", status=Status.WARN,
                          observed="x8", aspect="link", message="link x8 of x16")
    assert changes([mrrs, link], [mrrs, narrow]) == [
        "pcie.mrrs 0000:41:00.0 [link]: pass -> warn, observed 'x16' -> 'x8': link x8 of x16"]


def test_without_udevadm_a_socket_left_behind_refuses_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe used where udevadm cannot ask: connect to the control socket."""
    import socket

    import auditor.watch as watching

    monkeypatch.setattr("auditor.watch.shutil.which", lambda name: None)
    control = tmp_path / "control"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(control))
    listener.listen(1)
    try:
        assert watching.udev_answers(str(control)) == (
            True, f"udevd accepts connections on {control}")
    finally:
        listener.close()  # the file stays, as a stopped udevd leaves it
    alive, why = watching.udev_answers(str(control))
    assert not alive and why.startswith(f"no udevd answers on {control} (")
    assert watching.udev_answers(str(tmp_path / "none"))[0] is False


def test_a_udevd_process_is_found_by_its_name(tmp_path: Path) -> None:
    from auditor.watch import _udevd_running

    for pid, name in (("1", "init"), ("77", "systemd-udevd"), ("self", "x")):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "comm").write_text(name + "\n")
    assert _udevd_running(str(tmp_path))
    (tmp_path / "77" / "comm").write_text("sshd\n")
    assert not _udevd_running(str(tmp_path))
