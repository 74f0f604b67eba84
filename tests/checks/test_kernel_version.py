"""kernel.version against the real captures, with kernels and drivers planted in copies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auditor.checks.kernel_version import KernelVersion, nvidia_driver
from auditor.checks.lib.kernels import installed_kernels, newest_installed
from auditor.checks.lib.nvidia import is_blackwell
from auditor.cli import main
from auditor.errors import PolicyError
from auditor.hosts import DirectoryHost
from auditor.model import Finding, Status
from tests.support.recording import RecordingHost, undeclared
from tests.support.sysroot import Sysroot

GPU_DIR = "/sys/devices/pci0000:00/0000:00:06.0"
OPEN_580 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build"
    "  (nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n"
)
PROPRIETARY_550 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
)


def run(root: Sysroot, **options: object) -> dict[str, Finding]:
    findings = list(KernelVersion.configured(**options).evaluate(DirectoryHost(str(root.root))))
    assert [f.subject for f in findings] == ["kernel", "nvidia-driver"]
    return {f.subject: f for f in findings}


def install(root: Sysroot, *releases: str, where: str = "/boot/vmlinuz-{}") -> None:
    for release in releases:
        path = where.format(release)
        if "/modules/" in where:
            root.path(path).mkdir(parents=True, exist_ok=True)
        else:
            root.write(path, b"\x7fELF kernel image")


def make_blackwell(root: Sysroot, device_id: str = "0x2901") -> None:
    root.write(f"{GPU_DIR}/device", f"{device_id}\n")


# -- the running kernel ------------------------------------------------------------------


def test_h200_capture_passes_both_subjects(h200: Sysroot) -> None:
    found = run(h200)
    kernel, driver = found["kernel"], found["nvidia-driver"]
    assert kernel.status is Status.PASS
    assert dict(kernel.evidence) == {"running": "6.18.44", "minimum": "6.14", "distro": "debian"}
    assert driver.status is Status.PASS
    evidence = dict(driver.evidence)
    assert (evidence["version"], evidence["flavour"]) == ("580.159.04", "open")
    assert evidence["distro"] == "debian" and evidence["gpus"] == "1"
    assert "no Blackwell GPU" in driver.message


def test_old_vanilla_kernel_fails(h200: Sysroot) -> None:
    h200.write("/proc/sys/kernel/osrelease", "6.8.5\n")
    kernel = run(h200)["kernel"]
    assert kernel.status is Status.FAIL
    assert kernel.observed == "6.8.5"
    assert "older than 6.14" in kernel.message and "upstream (vanilla)" in kernel.message
    assert "installed_newer" not in dict(kernel.evidence)


UBUNTU_2404 = 'NAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\nID_LIKE=debian\n'


ROCKY_96 = 'ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.6"\n'
RHEL_94 = 'ID="rhel"\nID_LIKE="fedora"\nVERSION_ID="9.4"\n'
SLES_156 = 'NAME="SLES"\nVERSION_ID="15.6"\nID="sles"\nID_LIKE="suse"\n'
BOOKWORM = 'ID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\n'
ARCH = "ID=arch\nBUILD_ID=rolling\n"


@pytest.mark.parametrize(
    ("release", "os_release", "as_of", "status", "words"),
    [
        # Ubuntu's GA kernel of its release is current whatever its upstream number.
        ("6.8.0-45-generic", UBUNTU_2404, "2026-03-01", Status.PASS,
         "GA kernel series of Ubuntu 24.04"),
        ("6.17.0-8-generic", UBUNTU_2404, "2026-03-01", Status.PASS, "current HWE"),
        ("6.11.0-29-generic", UBUNTU_2404, "2026-03-01", Status.WARN, "superseded HWE series"),
        # ... judged on its date: 6.11 was the HWE series before 24.04.3 brought 6.14.
        ("6.11.0-29-generic", UBUNTU_2404, "2025-06-01", Status.PASS, "current HWE"),
        # Vendor lines: -nvidia, -nvidia-64k and cloud kernels have their GA series, and
        # roll with the HWE steps: a superseded step is behind whatever its name.
        ("6.8.0-1017-nvidia", UBUNTU_2404, "2026-03-01", Status.PASS,
         "-nvidia GA kernel series"),
        ("6.8.0-1017-nvidia-64k", UBUNTU_2404, "2026-03-01", Status.PASS, "-nvidia-64k GA"),
        ("6.8.0-1021-aws", UBUNTU_2404, "2026-03-01", Status.PASS, "-aws GA"),
        ("6.5.0-1025-azure", 'ID=ubuntu\nVERSION_ID="22.04"\n', "2025-01-10", Status.WARN,
         "the -azure kernel rolled to 6.8 on 2024-09-12"),
        ("6.14.0-1012-aws", UBUNTU_2404, "2026-03-01", Status.WARN, "superseded HWE"),
        ("6.14.0-1012-aws", UBUNTU_2404, "2025-12-01", Status.PASS, "current HWE"),
        ("6.8.0-1017-fips", UBUNTU_2404, "2026-03-01", Status.PASS, "Canonical maintains"),
        # A release out of standard support: fixes only with ESM.
        ("5.15.0-140-generic", 'ID=ubuntu\nVERSION_ID="20.04"\n', "2025-08-01", Status.WARN,
         "left standard support on 2025-05-31"),
        # RHEL's streams follow the release's minor version, and end when the next ships.
        ("5.14.0-570.23.1.el9_6.x86_64", ROCKY_96, "2025-09-01", Status.PASS,
         "el9 kernel stream of release 9.6"),
        ("5.14.0-570.23.1.el9_6.x86_64", ROCKY_96, "2025-12-01", Status.WARN,
         "stopped getting fixes when 9.7 shipped on 2025-11-12"),
        ("5.14.0-427.13.1.el9_4.x86_64", ROCKY_96, "2025-09-01", Status.WARN,
         "older than the release"),
        ("5.14.0-427.13.1.el9_4.x86_64", RHEL_94, "2025-09-01", Status.PASS,
         "Extended Update Support"),
        ("5.14.0-592.el9.x86_64", 'ID="centos"\nVERSION_ID="9"\n', "2025-09-01", Status.PASS,
         "el9 kernel stream"),
        ("5.15.0-300.163.18.el9uek.x86_64", 'ID="ol"\nVERSION_ID="9.5"\n', "2025-09-01",
         Status.PASS, "UEK"),
        # SUSE: 150600 is SLE 15 SP6, current until its general support ends.
        ("6.4.0-150600.23.25-default", SLES_156, "2025-09-01", Status.PASS,
         "SLE 15 SP6 (general support until 2025-12-31)"),
        ("6.4.0-150600.23.25-default", SLES_156, "2026-03-01", Status.WARN,
         "SLE 15 SP6 left general support on 2025-12-31"),
        ("5.14.21-150500.55.83-default", SLES_156, "2025-09-01", Status.WARN,
         "SLE 15.5 kernel on a 15.6 system"),
        # Debian's stable kernel of its release, and backports.
        ("6.1.0-28-amd64", BOOKWORM, "2025-09-01", Status.PASS,
         "kernel series of Debian bookworm"),
        ("6.12.12+bpo-amd64", BOOKWORM, "2025-09-01", Status.PASS, "backports"),
        # Fedora rolls with upstream until its release's end of life.
        ("6.14.5-100.fc40.x86_64", 'ID=fedora\nVERSION_ID=40\n', "2025-09-01", Status.WARN,
         "Fedora 40 reached its end of life on 2025-05-13"),
        # Arch's LTS kernel follows an upstream longterm series.
        ("6.12.41-1-lts", ARCH, "2025-09-01", Status.PASS, "upstream longterm 6.12"),
        # The minimum applies to the Proxmox line, Arch, upstream builds and unknown lines.
        ("6.8.12-4-pve", 'ID=debian\nVERSION_CODENAME=bookworm\n', "2025-09-01", Status.FAIL,
         "Proxmox VE kernel 6.8"),
        ("6.12.8-arch1-1", ARCH, "2025-09-01", Status.FAIL, "Arch Linux kernel 6.12"),
        ("6.12.9-custom-gpu", UBUNTU_2404, "2025-09-01", Status.FAIL,
         "kernel of an unknown line 6.12"),
    ],
)
def test_kernels_are_judged_by_their_line(h200: Sysroot, release: str, os_release: str,
                                          as_of: str, status: Status, words: str) -> None:
    h200.write("/proc/sys/kernel/osrelease", release + "\n")
    h200.write("/etc/os-release", os_release)
    kernel = run(h200, as_of=as_of)["kernel"]
    assert kernel.status is status, kernel.message
    assert words in kernel.message, kernel.message
    if status is not Status.FAIL:
        assert dict(kernel.evidence)["judged_on"] == as_of


def test_a_policy_sets_a_minimum_per_line(h200: Sysroot) -> None:
    h200.write("/proc/sys/kernel/osrelease", "6.8.0-1017-nvidia\n")
    h200.write("/etc/os-release", UBUNTU_2404)
    kernel = run(h200, line_minimums=("ubuntu-nvidia=6.11",))["kernel"]
    assert kernel.status is Status.FAIL and "older than 6.11" in kernel.message
    assert run(h200, line_minimums=("ubuntu-generic=6.11",))["kernel"].status is Status.PASS
    with pytest.raises(PolicyError, match="LINE=VERSION"):
        KernelVersion.configured(line_minimums=("6.11",))


def test_a_newer_kernel_of_another_line_is_not_the_pending_one(h200: Sysroot) -> None:
    """A generic kernel on an -nvidia host is no upgrade: GRUB would boot it, and says so."""
    h200.write("/proc/sys/kernel/osrelease", "6.8.0-1017-nvidia\n")
    h200.write("/etc/os-release", UBUNTU_2404)
    install(h200, "6.8.0-1017-nvidia", "6.8.0-1020-nvidia")
    kernel = run(h200)["kernel"]
    assert kernel.status is Status.WARN and "reboot pending" in kernel.message
    assert dict(kernel.evidence)["installed_newer"] == "6.8.0-1020-nvidia"
    h200.remove("/boot/vmlinuz-6.8.0-1020-nvidia")
    install(h200, "6.8.0-2000-generic")
    kernel = run(h200)["kernel"]
    assert kernel.status is Status.WARN
    assert "another line" in kernel.message and "6.8.0-2000-generic" in kernel.message
    assert "installed_newer" not in dict(kernel.evidence)


@pytest.mark.parametrize(
    ("release", "minimum", "status"),
    [
        ("6.14.0-1-pve", "6.14", Status.PASS),
        ("6.14", "6.14", Status.PASS),
        ("6.13.12", "6.14", Status.FAIL),
        ("6.14.0", "6.14.1", Status.FAIL),
        ("6.100.0", "6.14", Status.PASS),  # compared as numbers, not strings
        ("6.13.12-1-pve", "6.14", Status.FAIL),
    ],
)
def test_minimum_comparison(h200: Sysroot, release: str, minimum: str, status: Status) -> None:
    h200.write("/proc/sys/kernel/osrelease", release + "\n")
    assert run(h200, minimum=minimum)["kernel"].status is status


def test_falls_back_to_proc_version(h200: Sysroot) -> None:
    h200.remove("/proc/sys/kernel/osrelease")
    h200.write("/proc/version", "Linux version 6.8.12-4-pve (build@proxmox) (gcc 12) #1 SMP\n")
    kernel = run(h200)["kernel"]
    assert kernel.status is Status.FAIL
    assert dict(kernel.evidence)["running"] == "6.8.12-4-pve"


@pytest.mark.parametrize("garbage", [None, "", "\x00\xff garbage", "$(reboot)"])
def test_unreadable_running_kernel_is_skip(h200: Sysroot, garbage: str | None) -> None:
    h200.remove("/proc/sys/kernel/osrelease")
    if garbage is None:
        h200.remove("/proc/version")
    else:
        h200.write("/proc/version", garbage)
    assert run(h200)["kernel"].status is Status.SKIP


# -- installed kernels -------------------------------------------------------------------


def test_newer_proxmox_kernel_installed_is_reboot_pending(h200: Sysroot) -> None:
    h200.write("/proc/sys/kernel/osrelease", "6.14.8-1-pve\n")
    install(h200, "6.14.8-1-pve", "6.14.8-2-pve", "6.8.12-9-pve")
    kernel = run(h200)["kernel"]
    assert kernel.status is Status.WARN
    assert "reboot pending" in kernel.message
    assert dict(kernel.evidence)["installed_newer"] == "6.14.8-2-pve"
    assert kernel.fix == "reboot into 6.14.8-2-pve"


@pytest.mark.parametrize("where", ["/lib/modules/{}", "/usr/lib/modules/{}"])
def test_module_directories_count_as_installed(h200: Sysroot, where: str) -> None:
    h200.write("/proc/sys/kernel/osrelease", "6.15.0-45-generic\n")
    install(h200, "6.15.0-45-generic", "6.15.0-100-generic", where=where)
    kernel = run(h200)["kernel"]
    assert kernel.status is Status.WARN
    assert dict(kernel.evidence)["installed_newer"] == "6.15.0-100-generic"


def test_only_older_or_same_kernels_installed_passes(h200: Sysroot) -> None:
    h200.write("/proc/sys/kernel/osrelease", "6.14.8-2-pve\n")
    install(h200, "6.14.8-2-pve", "6.14.8-1-pve", "0-rescue-4f1a2b")
    install(h200, "6.14.8-2-pve", where="/lib/modules/{}")
    h200.write("/lib/modules/7.0.0-stray-file", "not a directory\n")
    assert run(h200)["kernel"].status is Status.PASS


def test_old_running_kernel_with_a_good_one_installed_says_reboot(h200: Sysroot) -> None:
    h200.write("/proc/sys/kernel/osrelease", "6.8.12-4-pve\n")
    install(h200, "6.8.12-4-pve", "6.14.8-2-pve")
    kernel = run(h200)["kernel"]
    assert kernel.status is Status.FAIL
    assert "reboot into it" in kernel.message
    assert kernel.fix == "reboot into 6.14.8-2-pve"
    assert dict(kernel.evidence)["installed_newer"] == "6.14.8-2-pve"


def test_old_running_kernel_with_a_newer_but_still_old_one_installed(h200: Sysroot) -> None:
    h200.write("/proc/sys/kernel/osrelease", "6.8.12-4-pve\n")
    install(h200, "6.8.12-9-pve")
    kernel = run(h200)["kernel"]
    assert kernel.status is Status.FAIL
    assert "below 6.14 too" in kernel.message
    assert kernel.fix == "install a kernel >= 6.14 and reboot"


def test_hostile_kernel_names_are_ignored(h200: Sysroot) -> None:
    install(h200, "6.99$(touch pwned)", "7.0\nrm -rf", "../../etc", "7.1 x")
    host = DirectoryHost(str(h200.root))
    assert installed_kernels(host) == []
    assert run(h200)["kernel"].status is Status.PASS
    assert not Path("pwned").exists()


def test_newest_installed_picks_by_number() -> None:
    assert newest_installed("6.8.0-45-generic", ["6.8.0-9-generic", "6.8.0-100-generic",
                                                 "6.8.0-45-generic"]) == "6.8.0-100-generic"
    assert newest_installed("6.14.8-2-pve", ["6.14.8-1-pve", "6.8.12-9-pve"]) is None


# -- the NVIDIA driver -------------------------------------------------------------------


def test_blackwell_with_open_580_passes(h200: Sysroot) -> None:
    make_blackwell(h200)
    driver = run(h200)["nvidia-driver"]
    assert driver.status is Status.PASS
    assert dict(driver.evidence)["blackwell"] == "0000:00:06.0=0x2901"


def test_blackwell_with_proprietary_550_fails_on_both_counts(h200: Sysroot) -> None:
    make_blackwell(h200, "0x2b85")
    h200.write("/proc/driver/nvidia/version", PROPRIETARY_550)
    driver = run(h200)["nvidia-driver"]
    assert driver.status is Status.FAIL
    assert "only by the open kernel module" in driver.message
    assert "R570" in driver.message
    evidence = dict(driver.evidence)
    assert (evidence["version"], evidence["flavour"]) == ("550.54.14", "proprietary")
    assert evidence["distro"] == "debian"


def test_blackwell_with_open_565_fails_on_version(h200: Sysroot) -> None:
    make_blackwell(h200, "0x3182")
    h200.write("/proc/driver/nvidia/version", OPEN_580.replace("580.159.04", "565.57.01"))
    driver = run(h200)["nvidia-driver"]
    assert driver.status is Status.FAIL
    assert "only by the open" not in driver.message
    assert run(h200, blackwell_min_driver="560")["nvidia-driver"].status is Status.PASS


def test_proprietary_driver_without_blackwell_passes(h200: Sysroot) -> None:
    h200.write("/proc/driver/nvidia/version", PROPRIETARY_550)
    assert run(h200)["nvidia-driver"].status is Status.PASS


@pytest.mark.parametrize(
    ("taint", "flavour", "status"),
    [("POE", "proprietary", Status.FAIL), ("OE", "open", Status.PASS), (None, "unknown",
                                                                        Status.SKIP)],
)
def test_sys_module_fallback_reads_the_flavour_from_the_taint(
    h200: Sysroot, taint: str | None, flavour: str, status: Status
) -> None:
    make_blackwell(h200)
    h200.remove("/proc/driver/nvidia")
    h200.write("/sys/module/nvidia/version", "575.51.03\n")
    if taint is not None:
        h200.write("/sys/module/nvidia/taint", taint + "\n")
    driver = run(h200)["nvidia-driver"]
    assert dict(driver.evidence)["flavour"] == flavour
    assert dict(driver.evidence)["version"] == "575.51.03"
    assert driver.status is status


def test_gpu_without_driver_warns(h200: Sysroot) -> None:
    h200.remove("/proc/driver/nvidia")
    h200.remove(f"{GPU_DIR}/driver")
    driver = run(h200)["nvidia-driver"]
    assert driver.status is Status.WARN
    assert "no NVIDIA driver is loaded" in driver.message


def test_gpu_held_by_vfio_for_passthrough_is_skip(h200: Sysroot) -> None:
    h200.remove("/proc/driver/nvidia")
    h200.symlink(f"{GPU_DIR}/driver", "../../../bus/pci/drivers/vfio-pci")
    driver = run(h200)["nvidia-driver"]
    assert driver.status is Status.SKIP
    assert "vfio-pci" in driver.message


def test_virtio_capture_has_no_nvidia_driver_to_judge(virtio: Sysroot) -> None:
    found = run(virtio)
    assert found["kernel"].status is Status.PASS
    assert found["nvidia-driver"].status is Status.SKIP


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (OPEN_580, ("580.159.04", "open")),
        (PROPRIETARY_550, ("550.54.14", "proprietary")),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.133.20  Release Build",
         ("570.133.20", "open")),
        ("NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.247.01  Tue Apr 8 2025",
         ("535.247.01", "proprietary")),
        ("\x00\xffgarbage", None),
    ],
)
def test_driver_version_strings(
    h200: Sysroot, text: str, expected: tuple[str, str] | None
) -> None:
    h200.write("/proc/driver/nvidia/version", text)
    assert nvidia_driver(DirectoryHost(str(h200.root))) == expected


def test_blackwell_table() -> None:
    for device in (0x2901, 0x2941, 0x29BC, 0x2B85, 0x2BB1, 0x2C02, 0x2D04, 0x2E12, 0x2F04,
                   0x3182, 0x31C2):
        assert is_blackwell(device), hex(device)
    for device in (0x2335, 0x2330, 0x26B9, 0x2684, 0x20B0, 0x2A00, 0x3000):
        assert not is_blackwell(device), hex(device)


# -- the CLI, policy and the reads contract ------------------------------------------------


def test_cli_json_with_policy_minimum(h200: Sysroot, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[checks."kernel.version"]\nminimum = "6.19"\n')
    out = tmp_path / "report.json"
    code = main(["local", "--root", str(h200.root), "--check", "kernel.version",
                 "--format", "json", "--policy", str(policy), "--output", str(out)])
    assert code == 1
    findings = {f["subject"]: f for f in json.loads(out.read_text())["findings"]}
    assert findings["kernel"]["status"] == "fail"
    assert findings["kernel"]["severity"] == "medium"
    assert findings["kernel"]["evidence"]["minimum"] == "6.19"
    assert findings["nvidia-driver"]["evidence"]["flavour"] == "open"


def test_every_path_read_is_declared_in_reads(h200: Sysroot) -> None:
    install(h200, "6.19.1")
    install(h200, "6.19.1", where="/lib/modules/{}")
    h200.remove("/proc/driver/nvidia")
    h200.write("/sys/module/nvidia/version", "580.1\n")
    host = RecordingHost(str(h200.root))
    list(KernelVersion().evaluate(host))
    assert undeclared(host.asked, KernelVersion.reads) == []


# -- lifecycle dates and what keeps a kernel back -------------------------------------------


def test_a_replayed_capture_is_judged_on_its_own_date(tmp_path: Path) -> None:
    import datetime as dt

    from auditor.manifest import PATH, make_manifest
    from tests.support.hostgen.nvidia import DriverSpec, build_driver_host

    root = build_driver_host(DriverSpec(running="6.11.0-29-generic")).write_dir(tmp_path / "t")
    today = run(Sysroot(root))["kernel"]
    assert today.status is Status.WARN and "superseded HWE series" in today.message
    assert dict(today.evidence)["judged_on_source"].startswith("today (the capture carries no")
    manifest = make_manifest([KernelVersion], KernelVersion.reads, (),
                             created=dt.datetime(2025, 6, 1, 12, tzinfo=dt.timezone.utc))
    (root / PATH.lstrip("/")).parent.mkdir()
    (root / PATH.lstrip("/")).write_bytes(manifest.to_json())
    then = run(Sysroot(root))["kernel"]
    assert then.status is Status.PASS, then.message
    ev = dict(then.evidence)
    assert ev["judged_on"] == "2025-06-01"
    assert ev["judged_on_source"] == "the capture's date (host-auditor/manifest.json)"
    # A policy date wins over the capture's.
    assert dict(run(Sysroot(root), as_of="2026-03-01")["kernel"].evidence)[
        "judged_on_source"] == "the policy's as_of"
    with pytest.raises(PolicyError, match="as_of must be a date"):
        KernelVersion.configured(as_of="yesterday")


def test_a_held_kernel_and_upgrades_off_are_named(tmp_path: Path) -> None:
    from tests.support.hostgen.nvidia import DriverSpec, build_driver_host

    spec = DriverSpec(version_id="22.04", running="6.5.0-1025-azure", kernel_held=True)
    root = Sysroot(build_driver_host(spec).write_dir(tmp_path / "t"))
    kernel = run(root, as_of="2025-01-10")["kernel"]
    assert kernel.status is Status.WARN
    assert "held back (linux-azure, linux-image-6.5.0-1025-azure)" in kernel.message
    assert "no unattended upgrade tool is on" in kernel.message
    ev = dict(kernel.evidence)
    assert ev["kernel_held"] == "linux-azure linux-image-6.5.0-1025-azure"
    assert ev["unattended_upgrades"] == "off"
    assert kernel.fix.startswith("release the hold")
    # Without the hold, only the upgrade policy is said.
    spec.kernel_held = False
    spec.unattended = True
    root = Sysroot(build_driver_host(spec).write_dir(tmp_path / "u"))
    kernel = run(root, as_of="2025-01-10")["kernel"]
    assert "held back" not in kernel.message and "kernel_held" not in dict(kernel.evidence)
    assert dict(kernel.evidence)["unattended_upgrades"].startswith("unattended-upgrades (")


def test_a_dnf_versionlock_on_the_kernel_is_named(tmp_path: Path) -> None:
    from tests.support.hostgen.serving import rhel_metal

    root = Sysroot(rhel_metal().write_dir(tmp_path / "t"))
    root.write("/etc/dnf/plugins/versionlock.list",
               "# Added lock on Mon Jun  2 2025\nkernel-0:5.14.0-570.23.1.el9_6.*\n"
               "kernel-core-0:5.14.0-570.23.1.el9_6.*\nnvidia-driver-3:580.95.05-1.el9.*\n")
    kernel = run(root, as_of="2025-12-01")["kernel"]
    assert kernel.status is Status.WARN and "9.7 shipped on 2025-11-12" in kernel.message
    held = dict(kernel.evidence)["kernel_held"]
    assert "kernel-0:5.14.0-570.23.1.el9_6.* (/etc/dnf/plugins/versionlock.list)" in held
    assert "kernel-core-0:" in held and "nvidia" not in held
