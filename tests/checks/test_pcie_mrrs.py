"""pcie.mrrs on the real captures, problems planted by real setpci, checked against lspci.

The planted values are written into config space copies with ``setpci`` and read
back with ``lspci`` exactly as an administrator would on a live host (both take
``-A linux-sysfs -O sysfs.path=ROOT/sys/bus/pci``); the check's decoding must
agree with pciutils' on every device.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from auditor.checks.lib import pci, pciconfig
from auditor.checks.pcie_mrrs import PcieMrrs, mrrs_setpci_value
from auditor.cli import main
from auditor.errors import PolicyError
from auditor.hosts import DirectoryHost
from auditor.model import Finding, Status
from auditor.remedy import FixContext
from tests.support.recording import RecordingHost, undeclared
from tests.support.sysroot import Sysroot

GPU = "0000:00:06.0"
GPU_DIR = "/sys/devices/pci0000:00/0000:00:06.0"

needs_pciutils = pytest.mark.skipif(
    not (shutil.which("lspci") and shutil.which("setpci")), reason="pciutils not installed"
)


# -- real pciutils against a sysroot -----------------------------------------------------


def pciutils_args(root: Sysroot) -> list[str]:
    return ["-A", "linux-sysfs", "-O", f"sysfs.path={root.root}/sys/bus/pci"]


def setpci(root: Sysroot, address: str, *writes: str) -> str:
    """Run real setpci on the sysroot's device (it rewrites the config file in place)."""
    result = subprocess.run(
        ["setpci", *pciutils_args(root), "-s", address, *writes],
        capture_output=True, text=True, check=True,
    )
    return result.stdout.strip()


def lspci(root: Sysroot, address: str | None = None) -> dict[str, dict[str, str]]:
    """Run real lspci -vvv on the sysroot; return, per address, the values it decoded."""
    selector = ["-s", address] if address else []
    result = subprocess.run(
        ["lspci", *pciutils_args(root), "-D", "-vvv", *selector],
        capture_output=True, text=True, check=True,
    )
    devices: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in result.stdout.splitlines():
        head = re.match(r"^([0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ", line)
        if head:
            current = devices.setdefault(head.group(1), {})
            continue
        if match := re.search(
            r"Capabilities: \[([0-9a-f]+)\] Express \(v\d\) (.+?)(?: \(Slot[+-]\))?, MSI", line
        ):
            current["cap_offset"] = f"0x{match.group(1)}"
            current["port_type"] = match.group(2).lower()
        if "<access denied>" in line:
            current["denied"] = "yes"
        if match := re.search(r"DevCap:\s+MaxPayload (\d+) bytes", line):
            current["mps_supported"] = match.group(1)
        if match := re.search(r"MaxPayload (\d+) bytes, MaxReadReq (\d+) bytes", line):
            current["mps"], current["mrrs"] = match.groups()
        if match := re.search(r"LnkCap:.*Speed ([\d.]+GT/s), Width x(\d+)", line):
            current["max_link_speed"], current["max_link_width"] = match.groups()
        if match := re.search(r"LnkSta:\s+Speed ([\d.]+GT/s)[^,]*, Width x(\d+)", line):
            current["link_speed"], current["link_width"] = match.groups()
    return devices


def assert_agrees_with_lspci(finding: Finding, decoded: dict[str, str]) -> None:
    evidence = dict(finding.evidence)
    for key in ("cap_offset", "mps_supported", "mps", "mrrs", "max_link_speed",
                "max_link_width", "link_speed", "link_width"):
        assert evidence[key] == decoded[key], (finding.subject, key, evidence, decoded)
    # lspci says "Upstream Port" where the spec (and the check) say "switch upstream port".
    assert evidence["port_type"].endswith(decoded["port_type"])


# -- building sysroots -------------------------------------------------------------------


def run(root: Sysroot, **options: int) -> list[Finding]:
    return list(PcieMrrs.configured(**options).evaluate(DirectoryHost(str(root.root))))


def by_subject(findings: list[Finding]) -> dict[str, list[Finding]]:
    grouped: dict[str, list[Finding]] = {}
    for finding in findings:
        grouped.setdefault(finding.subject, []).append(finding)
    return grouped


def clone_device(
    root: Sysroot, parent: str, address: str, *, klass: str | None = None,
    vendor: str | None = None, driver: str | None = None,
) -> str:
    """Copy the real H200 function to a new address below ``parent`` and link it on the bus."""
    directory = f"{parent}/{address}"
    shutil.copytree(root.path(GPU_DIR), root.path(directory), symlinks=True)
    depth = directory.count("/") - 1  # ../ steps from the device dir back to /sys
    link = root.path(f"{directory}/driver")
    link.unlink()
    if driver:
        link.symlink_to("../" * depth + f"bus/pci/drivers/{driver}")
    root.symlink(f"/sys/bus/pci/devices/{address}", "../../.." + directory.removeprefix("/sys"))
    if klass is not None:
        root.write(f"{directory}/class", f"{klass}\n")
        # The class code in config space too, low byte first: prog-if, sub-class, base class.
        setpci(root, address, f"CLASS_PROG.b={klass[6:8]}", f"CLASS_DEVICE.w={klass[2:6]}")
    if vendor is not None:
        root.write(f"{directory}/vendor", f"{vendor}\n")
        setpci(root, address, f"VENDOR_ID.w={vendor[2:]}")
    return directory


def make_bridge(root: Sysroot, parent: str, address: str, port_type: int) -> str:
    """Make a PCIe bridge function (root port 4, switch up 5 / down 6) from the H200's bytes."""
    directory = clone_device(root, parent, address, klass="0x060400", driver="pcieport")
    setpci(root, address, "HEADER_TYPE.b=01", f"CAP_EXP+02.w={port_type << 4:04x}:00f0")
    return directory


# -- the real capture ----------------------------------------------------------------------


@needs_pciutils
def test_h200_gpu_passes_and_decoding_agrees_with_lspci(h200: Sysroot) -> None:
    [finding] = run(h200)
    assert finding.status is Status.PASS
    assert finding.subject == GPU
    evidence = dict(finding.evidence)
    assert evidence["class"] == "0x030200"
    assert evidence["driver"] == "nvidia"
    assert evidence["mrrs"] == "4096" and evidence["mps"] == "256"
    assert evidence["link_speed"] == "32GT/s" and evidence["link_width"] == "16"
    assert_agrees_with_lspci(finding, lspci(h200, GPU)[GPU])
    assert "NVIDIA GPU" in finding.message


def test_virtio_capture_without_pcie_endpoints_is_one_skip(virtio: Sysroot) -> None:
    [finding] = run(virtio)
    assert finding.status is Status.SKIP
    assert "no GPU or data-path NIC PCIe endpoints" in finding.message
    # The virtio NIC is a network controller the hypervisor emulates: counted, not judged.
    assert "1 emulated by the hypervisor" in finding.message


# -- MaxReadReq planted with real setpci ---------------------------------------------------


@needs_pciutils
def test_setpci_planted_512_fails_and_the_printed_fix_repairs_it(h200: Sysroot) -> None:
    original = int(setpci(h200, GPU, "CAP_EXP+08.w"), 16)
    setpci(h200, GPU, "CAP_EXP+08.w=2000:7000")
    [finding] = run(h200)
    assert finding.status is Status.FAIL
    assert dict(finding.evidence)["mrrs"] == "512"
    assert dict(finding.evidence)["problem"] == "mrrs"
    assert_agrees_with_lspci(finding, lspci(h200, GPU)[GPU])
    assert finding.fix == f"setpci -s {GPU} CAP_EXP+08.w=5000:7000"
    # Run the printed fix, word for word, against the sysroot.
    command, *args = finding.fix.split()
    assert command == "setpci"
    subprocess.run([command, *pciutils_args(h200), *args], check=True)
    [after] = run(h200)
    assert after.status is Status.PASS
    assert lspci(h200, GPU)[GPU]["mrrs"] == "4096"
    # Only MaxReadReq moved: MaxPayload and the rest of Device Control are untouched.
    assert dict(after.evidence)["mps"] == "256"
    assert int(setpci(h200, GPU, "CAP_EXP+08.w"), 16) == (original & ~0x7000) | 0x5000


@needs_pciutils
@pytest.mark.parametrize("code", range(8))
def test_every_mrrs_encoding_decodes_as_lspci_does(h200: Sysroot, code: int) -> None:
    setpci(h200, GPU, f"CAP_EXP+08.w={code << 12:04x}:7000")
    findings = run(h200)
    mrrs = next(f for f in findings if dict(f.evidence).get("problem") != "link")
    assert dict(mrrs.evidence)["mrrs"] == str(128 << code)
    assert_agrees_with_lspci(mrrs, lspci(h200, GPU)[GPU])
    # 4096 (code 5) is the target; 8192 and 16384 are reserved encodings, not "bigger".
    assert mrrs.status is (Status.PASS if code == 5 else Status.FAIL)
    if code > 5:
        assert "reserved" in mrrs.message


@needs_pciutils
def test_payload_and_link_fields_decode_as_lspci_does_across_their_ranges(h200: Sysroot) -> None:
    plants = [
        *(f"CAP_EXP+08.w={code << 5:04x}:00e0" for code in range(6)),  # DevCtl MaxPayload
        *(f"CAP_EXP+04.l={code:08x}:00000007" for code in range(6)),  # DevCap MaxPayload
        *(f"CAP_EXP+12.w={width << 4 | speed:04x}:03ff"  # LnkSta speed, width
          for width, speed in [(1, 1), (2, 2), (4, 3), (8, 4), (12, 5), (32, 6)]),
        *(f"CAP_EXP+0c.l={width << 4 | speed:08x}:000003ff"  # LnkCap speed, width
          for width, speed in [(1, 1), (4, 2), (8, 3), (16, 4), (32, 6)]),
    ]
    for write in plants:
        setpci(h200, GPU, write)
        mrrs = next(f for f in run(h200) if dict(f.evidence).get("problem") != "link")
        assert_agrees_with_lspci(mrrs, lspci(h200, GPU)[GPU])


@needs_pciutils
@pytest.mark.parametrize(("target", "value"), [(512, "2000:7000"), (2048, "4000:7000")])
def test_policy_target_sets_the_threshold_and_the_fix_value(
    h200: Sysroot, target: int, value: str
) -> None:
    setpci(h200, GPU, "CAP_EXP+08.w=1000:7000")  # 256 bytes
    [finding] = run(h200, min_read_request_bytes=target)
    assert finding.status is Status.FAIL
    assert finding.fix.endswith(f"CAP_EXP+08.w={value}")
    assert mrrs_setpci_value(target) == value
    subprocess.run(["setpci", *pciutils_args(h200), *finding.fix.split()[1:]], check=True)
    assert lspci(h200, GPU)[GPU]["mrrs"] == str(target)
    assert run(h200, min_read_request_bytes=target)[0].status is Status.PASS


def test_a_target_that_is_not_an_encodable_size_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match="min_read_request_bytes must be one of 128, 256, "
                       "512, 1024, 2048, 4096, got 3000"):
        PcieMrrs.configured(min_read_request_bytes=3000)


# -- config space that cannot be judged ----------------------------------------------------


@needs_pciutils
def test_config_cut_at_64_bytes_is_skip_needs_root(h200: Sysroot) -> None:
    config = h200.path(f"{GPU_DIR}/config")
    config.write_bytes(config.read_bytes()[:64])
    [finding] = run(h200)
    assert finding.status is Status.SKIP
    assert finding.subject == GPU
    assert "needs root" in finding.message
    # pciutils sees the same thing an unprivileged lspci does.
    assert lspci(h200, GPU)[GPU].get("denied") == "yes"


@needs_pciutils
@pytest.mark.parametrize(
    ("writes", "reason"),
    [
        (("CAP_MSI+01.b=40",), "loops"),  # MSI's next pointer back to the first capability
        (("CAP_PM+01.b=48", "CAP_MSI+01.b=48"), "loops"),  # MSI points at itself
        (("CAP_MSI+01.b=20",), "outside 0x40-0xfc"),  # into the standard header
        (("HEADER_TYPE.b=02",), "header type 2"),
    ],
)
def test_corrupt_capability_lists_are_skips_not_crashes(
    h200: Sysroot, writes: tuple[str, ...], reason: str
) -> None:
    setpci(h200, GPU, *writes)
    [finding] = run(h200)
    assert finding.status is Status.SKIP
    assert reason in finding.message


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (b"", "shorter than the 64-byte header"),
        (b"\xde\x10\x35\x23" + b"\x00" * 10, "shorter than the 64-byte header"),
        (None, "cannot be read"),
    ],
)
def test_missing_or_garbage_config_is_skip(
    h200: Sysroot, config: bytes | None, reason: str
) -> None:
    if config is None:
        h200.remove(f"{GPU_DIR}/config")
    else:
        h200.write(f"{GPU_DIR}/config", config)
    [finding] = run(h200)
    assert finding.status is Status.SKIP
    assert reason in finding.message


def test_capability_past_a_short_read_is_skip(h200: Sysroot) -> None:
    config = h200.path(f"{GPU_DIR}/config")
    config.write_bytes(config.read_bytes()[:0x64])  # ends inside the Express capability at 0x60
    [finding] = run(h200)
    assert finding.status is Status.SKIP
    assert "runs past the 100 bytes read" in finding.message


def test_random_bytes_in_every_sysfs_file_never_crash(h200: Sysroot) -> None:
    noise = bytes(range(256)) * 16
    for name in ("class", "vendor", "device", "config"):
        h200.write(f"{GPU_DIR}/{name}", noise[7:])
    findings = run(h200)
    assert findings and all(f.status in (Status.SKIP, Status.PASS, Status.FAIL) for f in findings)


# -- class from sysfs, falling back to config --------------------------------------------


def test_class_falls_back_to_config_when_the_sysfs_file_is_missing_or_garbage(
    h200: Sysroot,
) -> None:
    h200.remove(f"{GPU_DIR}/class")
    [finding] = run(h200)
    assert finding.status is Status.PASS and dict(finding.evidence)["class"] == "0x030200"
    h200.write(f"{GPU_DIR}/class", "not hex\n")
    assert run(h200)[0].status is Status.PASS


def test_sysfs_class_wins_over_config(h200: Sysroot) -> None:
    h200.write(f"{GPU_DIR}/class", "0x040300\n")  # an audio function: not judged
    [finding] = run(h200)
    assert finding.status is Status.SKIP
    assert "no GPU or data-path NIC PCIe endpoints" in finding.message


# -- more devices ------------------------------------------------------------------------


@needs_pciutils
def test_second_gpu_with_low_mrrs_fails_alone(h200: Sysroot) -> None:
    clone_device(h200, "/sys/devices/pci0000:00", "0000:00:07.0", driver="nvidia")
    setpci(h200, "0000:00:07.0", "CAP_EXP+08.w=2000:7000")
    findings = run(h200)
    assert [(f.subject, f.status) for f in findings] == [
        (GPU, Status.PASS), ("0000:00:07.0", Status.FAIL),
    ]
    decoded = lspci(h200)
    for finding in findings:
        assert_agrees_with_lspci(finding, decoded[finding.subject])


@needs_pciutils
def test_bridge_with_low_mrrs_is_not_judged_but_the_gpu_behind_it_is(h200: Sysroot) -> None:
    port = make_bridge(h200, "/sys/devices/pci0000:00", "0000:00:07.0", port_type=4)
    setpci(h200, "0000:00:07.0", "CAP_EXP+08.w=0000:7000")  # 128 bytes on the root port
    clone_device(h200, port, "0000:01:00.0", driver="nvidia")
    decoded = lspci(h200)
    assert decoded["0000:00:07.0"]["port_type"] == "root port"
    assert decoded["0000:00:07.0"]["mrrs"] == "128"
    findings = run(h200)
    assert [(f.subject, f.status) for f in findings] == [
        (GPU, Status.PASS), ("0000:01:00.0", Status.PASS),
    ]


@needs_pciutils
def test_gpu_class_function_that_is_a_port_is_not_judged(h200: Sysroot) -> None:
    setpci(h200, GPU, "CAP_EXP+02.w=0060:00f0", "CAP_EXP+08.w=0000:7000")
    assert lspci(h200, GPU)[GPU]["port_type"] == "downstream port"  # a switch's
    [finding] = run(h200)
    assert finding.status is Status.SKIP
    assert "1 not endpoints" in finding.message


@needs_pciutils
def test_legacy_endpoint_is_judged(h200: Sysroot) -> None:
    setpci(h200, GPU, "CAP_EXP+02.w=0010:00f0", "CAP_EXP+08.w=2000:7000")
    [finding] = run(h200)
    assert finding.status is Status.FAIL
    assert dict(finding.evidence)["port_type"] == "legacy endpoint"
    assert lspci(h200, GPU)[GPU]["port_type"] == "legacy endpoint"


# -- link training ---------------------------------------------------------------------------


@needs_pciutils
def test_link_trained_below_max_width_warns_beside_the_mrrs_pass(h200: Sysroot) -> None:
    setpci(h200, GPU, "CAP_EXP+12.w=0085:03ff")  # Link Status: 32GT/s x8
    findings = run(h200)
    assert [f.status for f in findings] == [Status.PASS, Status.WARN]
    warn = findings[1]
    assert dict(warn.evidence)["problem"] == "link"
    # one subject, two judgements: the aspect keeps their keys apart
    assert [f.key for f in findings] == [("pcie.mrrs", GPU, ""), ("pcie.mrrs", GPU, "link")]
    assert "x8 of x16" in warn.message
    assert warn.fix == ""  # nothing a script can do about lanes
    assert_agrees_with_lspci(warn, lspci(h200, GPU)[GPU])


@needs_pciutils
def test_idle_gpu_link_speed_is_information_only(h200: Sysroot) -> None:
    setpci(h200, GPU, "CAP_EXP+12.w=0101:03ff")  # Link Status: 2.5GT/s x16
    [finding] = run(h200)
    assert finding.status is Status.PASS
    assert "below its top speed" in finding.message
    assert dict(finding.evidence)["link_speed"] == "2.5GT/s"
    assert_agrees_with_lspci(finding, lspci(h200, GPU)[GPU])


@needs_pciutils
def test_nic_below_its_link_speed_warns(h200: Sysroot) -> None:
    nic = "0000:00:07.0"
    clone_device(h200, "/sys/devices/pci0000:00", nic, klass="0x020700", vendor="0x15b3",
                 driver="mlx5_core")
    setpci(h200, nic, "CAP_EXP+12.w=0104:03ff")  # 16GT/s of 32GT/s
    found = by_subject(run(h200))
    assert [f.status for f in found[nic]] == [Status.PASS, Status.WARN]
    assert "Mellanox network controller" in found[nic][1].message
    assert "16GT/s of 32GT/s" in found[nic][1].message


# -- a big host ------------------------------------------------------------------------------


def build_eight_gpu_host(root: Sysroot) -> dict[str, str]:
    """Eight GPUs and four NICs behind four switches, as on an HGX board.

    Returns the judged endpoints with their expected verdicts.
    """
    expected: dict[str, str] = {}
    for socket_index, bus in enumerate((0x10, 0x30, 0x50, 0x70)):
        rp = f"0000:00:{0x10 + socket_index:02x}.0"
        port = make_bridge(root, "/sys/devices/pci0000:00", rp, port_type=4)
        up = f"0000:{bus:02x}:00.0"
        switch = make_bridge(root, port, up, port_type=5)
        for slot in range(3):
            down = f"0000:{bus + 1:02x}:{slot:02x}.0"
            leg = make_bridge(root, switch, down, port_type=6)
            setpci(root, down, "CAP_EXP+08.w=0000:7000")  # ports at 128: never judged
            endpoint = f"0000:{bus + 2 + slot:02x}:00.0"
            if slot < 2:
                clone_device(root, leg, endpoint, driver="nvidia")
            else:
                clone_device(root, leg, endpoint, klass="0x020700", vendor="0x15b3",
                             driver="mlx5_core")
            expected[endpoint] = "pass"
    # Planted: a NIC left at 512, a GPU trained to x8, and an SR-IOV VF of a NIC.
    setpci(root, "0000:34:00.0", "CAP_EXP+08.w=2000:7000")
    expected["0000:34:00.0"] = "fail"
    setpci(root, "0000:53:00.0", "CAP_EXP+12.w=0085:03ff")
    expected["0000:53:00.0"] = "pass+warn"
    vf_parent = "/sys/devices/pci0000:00/0000:00:13.0/0000:70:00.0/0000:71:02.0"
    clone_device(root, vf_parent, "0000:74:00.1", klass="0x020700", vendor="0x15b3",
                 driver="mlx5_core")
    setpci(root, "0000:74:00.1", "CAP_EXP+08.w=0000:7000")
    root.symlink(f"{vf_parent}/0000:74:00.1/physfn", "../0000:74:00.0")
    # The capture's own GPU was the template; the board has only the cloned ones.
    root.remove(GPU_DIR)
    root.remove(f"/sys/bus/pci/devices/{GPU}")
    return expected


@needs_pciutils
def test_eight_gpu_host_judges_each_endpoint_and_agrees_with_lspci(h200: Sysroot) -> None:
    expected = build_eight_gpu_host(h200)
    assert len(expected) == 12
    findings = run(h200)
    verdicts = {
        subject: "+".join(f.status.value for f in group)
        for subject, group in by_subject(findings).items()
    }
    assert verdicts == expected
    decoded = lspci(h200)
    ports = [a for a, d in decoded.items() if d.get("port_type", "").endswith("port")]
    assert len(ports) == 4 * 5  # per switch: a root port, the upstream port, 3 downstream
    assert all(decoded[p]["mrrs"] for p in ports)
    for finding in findings:
        assert_agrees_with_lspci(finding, decoded[finding.subject])
    failed = [f for f in findings if f.status is Status.FAIL]
    assert [f.fix for f in failed] == ["setpci -s 0000:34:00.0 CAP_EXP+08.w=5000:7000"]
    assert "Mellanox network controller" in failed[0].message
    assert dict(failed[0].evidence)["driver"] == "mlx5_core"


# -- hostile sysroots ------------------------------------------------------------------------


def test_hostile_names_in_the_bus_directory_are_ignored(h200: Sysroot) -> None:
    bus = "/sys/bus/pci/devices"
    h200.symlink(f"{bus}/$(touch pwned)", f"../../..{GPU_DIR.removeprefix('/sys')}")
    h200.symlink(f"{bus}/0000:00:08.0\n", f"../../..{GPU_DIR.removeprefix('/sys')}")
    h200.symlink(f"{bus}/..0000:00:06.0", f"../../..{GPU_DIR.removeprefix('/sys')}")
    h200.symlink(f"{bus}/0000:00:09.0", "0000:00:09.0")  # a link to itself
    h200.symlink(f"{bus}/0000:00:0a.0", "/nonexistent/escape")
    h200.write(f"{bus}/0000:00:0b.0", "a plain file, not a device\n")
    h200.path(f"{bus}/0000:00:0c.0").mkdir()  # an empty directory
    [finding] = run(h200)
    assert (finding.subject, finding.status) == (GPU, Status.PASS)
    assert not Path("pwned").exists()


def test_pci_address_names() -> None:
    assert pci.is_pci_address("0000:41:00.0")
    assert pci.is_pci_address("10000:e1:1f.7")  # behind Intel VMD
    for name in ("0000:41:00.0\n", "0000:41:20.0", "0000:41:00.8", "0000:4G:00.0",
                 "../0000:41:00.0", "0000:41:00.0/..", "", "\uff10000:41:00.0"):
        assert not pci.is_pci_address(name), name


def test_driver_name_that_is_not_printable_is_quoted(h200: Sysroot) -> None:
    h200.symlink(f"{GPU_DIR}/driver", "../../../bus/pci/drivers/nv\nidia")
    [finding] = run(h200)
    assert dict(finding.evidence)["driver"] == repr("nv\nidia")


# -- the decoder on its own ------------------------------------------------------------------


def header(status: int = 0x10, pointer: int = 0x40, size: int = 256) -> bytearray:
    config = bytearray(size)
    config[0:4] = b"\xde\x10\x35\x23"
    config[0x06:0x08] = status.to_bytes(2, "little")
    config[0x34] = pointer
    return config


def test_find_capability_walks_to_the_express_capability_wherever_it_is() -> None:
    config = header(pointer=0xC8)
    config[0xC8:0xCA] = bytes([0x01, 0x50])  # PM -> 0x50
    config[0x50:0x52] = bytes([0x05, 0xE0])  # MSI -> 0xe0
    config[0xE0:0xE2] = bytes([0x10, 0x00])  # Express, end
    assert pciconfig.find_capability(bytes(config), pciconfig.CAP_ID_PCIE) == 0xE0
    assert pciconfig.find_capability(bytes(config), 0x11) is None
    # The low two bits of a pointer are reserved and masked off.
    config[0x34] = 0xCB
    assert pciconfig.find_capability(bytes(config), pciconfig.CAP_ID_PCIE) == 0xE0


def test_find_capability_guards() -> None:
    assert pciconfig.find_capability(bytes(header(status=0)), pciconfig.CAP_ID_PCIE) is None
    looping = header()
    looping[0x40:0x42] = bytes([0x01, 0x40])
    with pytest.raises(pciconfig.ConfigSpaceError, match="loops"):
        pciconfig.find_capability(bytes(looping), pciconfig.CAP_ID_PCIE)
    with pytest.raises(pciconfig.NeedsRoot):
        pciconfig.find_capability(bytes(header(size=64)), pciconfig.CAP_ID_PCIE)
    with pytest.raises(pciconfig.ConfigSpaceError, match="past the 65 bytes"):
        pciconfig.find_capability(bytes(header(size=65)), pciconfig.CAP_ID_PCIE)
    with pytest.raises(pciconfig.ConfigSpaceError, match="outside"):
        pciconfig.find_capability(bytes(header(pointer=0x3C)), pciconfig.CAP_ID_PCIE)
    with pytest.raises(pciconfig.ConfigSpaceError, match="shorter"):
        pciconfig.find_capability(b"\xff" * 63, pciconfig.CAP_ID_PCIE)


# -- the CLI, and the reads contract ---------------------------------------------------------


@needs_pciutils
def test_cli_json_reports_the_planted_failure(
    h200: Sysroot, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["local", "--root", str(h200.root), "--check", "pcie.mrrs",
                 "--format", "json"]) == 0
    capsys.readouterr()
    setpci(h200, GPU, "CAP_EXP+08.w=2000:7000")
    out = tmp_path / "report.json"
    code = main(["local", "--root", str(h200.root), "--check", "pcie.mrrs", "--format", "json",
                 "--output", str(out)])
    assert code == 1
    report = json.loads(out.read_text())
    [finding] = report["findings"]
    assert finding["check"] == "pcie.mrrs"
    assert finding["status"] == "fail" and finding["severity"] == "high"
    assert finding["subject"] == GPU
    assert finding["evidence"]["mrrs"] == "512"
    assert (finding["observed"], finding["expected"]) == ("512", "4096")
    assert finding["evidence"]["cap_offset"] == "0x60"
    for key in ("class", "mps", "link_speed", "link_width", "max_link_speed",
                "max_link_width", "driver"):
        assert finding["evidence"][key]


@needs_pciutils
def test_cli_policy_file_lowers_the_target(h200: Sysroot, tmp_path: Path) -> None:
    setpci(h200, GPU, "CAP_EXP+08.w=2000:7000")
    policy = tmp_path / "policy.toml"
    policy.write_text('[checks."pcie.mrrs"]\nmin_read_request_bytes = 512\n')
    out = tmp_path / "report.json"
    code = main(["local", "--root", str(h200.root), "--check", "pcie.mrrs", "--format", "json",
                 "--policy", str(policy), "--output", str(out)])
    assert code == 0
    assert json.loads(out.read_text())["findings"][0]["status"] == "pass"


@needs_pciutils
def test_every_path_read_is_declared_in_reads(h200: Sysroot) -> None:
    build_eight_gpu_host(h200)
    host = RecordingHost(str(h200.root))
    list(PcieMrrs().evaluate(host))
    assert len(host.asked) > 12 * 5
    assert undeclared(host.asked, PcieMrrs.reads) == []


# -- functions whose MaxReadReq governs no traffic, and the path to the root port -------------


def test_a_switch_uplink_trained_at_x8_is_reported_on_every_gpu_below_it(tmp_path: Path) -> None:
    from tests.support.hostgen.classes import pcie_box
    from tests.support.pciutils import lspci as decode

    root = pcie_box().write_dir(tmp_path / "box")
    findings = list(PcieMrrs().evaluate(DirectoryHost(str(root))))
    path = [f for f in findings if dict(f.evidence).get("problem") == "path"]
    assert sorted(f.subject for f in path) == ["0000:63:00.0", "0000:64:00.0"]
    for finding in path:
        assert finding.status is Status.WARN
        assert "switch upstream port 0000:61:00.0 to 0000:60:01.1 trained to x8 of x16" in \
            finding.message
        evidence = dict(finding.evidence)
        assert (evidence["bridge"], evidence["bridge_link"]) == ("0000:61:00.0", "32GT/s x8")
    assert "Width x8" in decode(root, "0000:61:00.0")["0000:61:00.0"].text
    # Their own links read x16, and MaxReadReq passes.
    own = [f for f in findings if f.subject == "0000:63:00.0" and f not in path]
    assert [f.status for f in own] == [Status.PASS]
    # The BMC's display is VGA class but not a GPU: its MaxReadReq 512 is not judged.
    assert "0000:01:00.0" not in {f.subject for f in findings}
    [remedy] = PcieMrrs().remediate(DirectoryHost(str(root)), path, FixContext(sysroot=True))
    assert not remedy.runtime and "0000:61:00.0 (above 0000:63:00.0)" in remedy.advice[0].text


@needs_pciutils
def test_a_gen4_switch_below_a_gen5_root_port_is_not_degraded(tmp_path: Path) -> None:
    from tests.support.hostgen.classes import PcieBoxSpec, pcie_box

    root = pcie_box(PcieBoxSpec(degraded_uplink=False)).write_dir(tmp_path / "box")
    sysroot = Sysroot(root)
    # The switch supports 16GT/s only; its uplink runs at 16GT/s under a 32GT/s root port.
    setpci(sysroot, "0000:41:00.0", "CAP_EXP+0c.l=00000104:0000000f",
           "CAP_EXP+12.w=0004:000f")
    findings = list(PcieMrrs().evaluate(DirectoryHost(str(root))))
    assert not [f for f in findings if dict(f.evidence).get("problem") == "path"]
    setpci(sysroot, "0000:41:00.0", "CAP_EXP+12.w=0003:000f")  # 8GT/s: below both ends
    path = [f for f in PcieMrrs().evaluate(DirectoryHost(str(root)))
            if dict(f.evidence).get("problem") == "path"]
    assert sorted(f.subject for f in path) == ["0000:43:00.0", "0000:44:00.0", "0000:45:00.0"]
    assert "8GT/s of 16GT/s" in path[0].message


def test_a_guest_judges_passed_through_gpus_only(tmp_path: Path) -> None:
    from tests.support.hostgen.classes import KVM_GPUS, kvm_guest

    root = kvm_guest().write_dir(tmp_path / "vm")
    findings = list(PcieMrrs().evaluate(DirectoryHost(str(root))))
    # VFs (MaxReadReq reserved, reads 128) and emulated NICs are not judged; no path walk
    # over QEMU's emulated x1 root ports.
    assert [(f.subject, f.status) for f in findings] == [(a, Status.PASS) for a in KVM_GPUS]
    for address in ("0000:03:00.0", "0000:04:00.0"):
        (root / f"sys/bus/pci/devices/{address}").unlink()
    for address in KVM_GPUS:
        (root / f"sys/bus/pci/devices/{address}").unlink()
    [skip] = PcieMrrs().evaluate(DirectoryHost(str(root)))
    assert "2 emulated by the hypervisor" in skip.message


def test_a_grace_gpu_is_not_judged_on_its_pcie_link(tmp_path: Path) -> None:
    from tests.support.hostgen.classes import grace_hopper

    root = grace_hopper().write_dir(tmp_path / "gh")
    found = {f.subject: f for f in PcieMrrs().evaluate(DirectoryHost(str(root)))}
    assert found["0009:01:00.0"].status is Status.SKIP  # its MaxReadReq is 512
    assert "NVLink-C2C" in found["0009:01:00.0"].message
    assert found["0000:01:00.0"].status is Status.PASS


def test_inside_a_container_64_bytes_means_audit_the_host(h200: Sysroot) -> None:
    config = h200.path(f"{GPU_DIR}/config")
    config.write_bytes(config.read_bytes()[:64])
    h200.write("/run/systemd/container", "lxc\n")
    h200.write("/proc/1/uid_map", "         0     100000      65536\n")
    [finding] = run(h200)
    assert finding.status is Status.SKIP
    assert "unprivileged container (lxc)" in finding.message
    assert "audit the host" in finding.message and "needs root" not in finding.message


def test_a_grace_gpu_of_another_id_is_told_by_its_memory_node(tmp_path: Path) -> None:
    from tests.support.hostgen.classes import grace_hopper

    root = grace_hopper().write_dir(tmp_path / "gh")
    (root / "sys/devices/pci0009:00/0009:00:00.0/0009:01:00.0/device").write_text("0x2941\n")
    found = {f.subject: f for f in PcieMrrs().evaluate(DirectoryHost(str(root)))}
    assert "NVLink-C2C" in found["0009:01:00.0"].message
    # Not a Grace CPU (another arm64 part): the GPU's PCIe link is its host link.
    cpuinfo = root / "proc/cpuinfo"
    cpuinfo.write_text(cpuinfo.read_text().replace("0xd4f", "0xd0c"))
    found = {f.subject: f for f in PcieMrrs().evaluate(DirectoryHost(str(root)))}
    assert found["0009:01:00.0"].status is Status.FAIL  # its MaxReadReq 512 now counts
