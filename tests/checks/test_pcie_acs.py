"""pcie.acs on generated hosts: real lspci agrees, the printed and scripted fixes work with
real setpci, the boot token merges, and the rules for fabrics, VFIO and guests hold."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from auditor.checks.pcie_acs import PcieAcs
from auditor.fix import build_fix
from auditor.hosts import DirectoryHost
from auditor.model import Finding, Status
from auditor.policy import load_policy
from auditor.remedy import FixContext, SetPciBits
from auditor.runner import audit
from tests.support.fixkit import copy_tree, run, write_scripts
from tests.support.hostgen.classes import (
    PCIE_BOX_ROOT_PORTS,
    PcieBoxSpec,
    dgx_h100,
    kvm_guest,
    mi300x,
    pcie_box,
)
from tests.support.pciutils import args, lspci, needs_pciutils, setpci

OS = {"ID": "ubuntu", "ID_LIKE": "debian"}


def findings(root: Path) -> dict[str, Finding]:
    return {f.subject: f for f in PcieAcs().evaluate(DirectoryHost(str(root)))}


def remedies(root: Path) -> list[object]:
    host = DirectoryHost(str(root))
    found = list(PcieAcs().evaluate(host))
    problems = [f for f in found if f.status in (Status.WARN, Status.FAIL)]
    return list(PcieAcs().remediate(host, problems, FixContext(sysroot=True, os_release=OS)))


def boot_token(root: Path) -> str:
    tokens: list[str] = [p for r in remedies(root) for p in getattr(r, "boot_params", ())]
    [token] = tokens
    return token


@pytest.fixture
def box(tmp_path: Path) -> Path:
    return pcie_box().write_dir(tmp_path / "box")


@needs_pciutils
def test_every_port_agrees_with_lspci_and_the_printed_fix_clears_only_r_c_e(box: Path) -> None:
    found = findings(box)
    decoded = lspci(box)
    ports = [s for s, f in found.items() if f.status is Status.FAIL]
    assert sorted(ports) == sorted([*PCIE_BOX_ROOT_PORTS, "0000:42:00.0", "0000:42:01.0",
                                    "0000:42:02.0", "0000:62:00.0", "0000:62:01.0",
                                    "0000:c2:00.0", "0000:c2:01.0", "0000:c2:02.0",
                                    "0000:e2:00.0", "0000:e2:01.0"])
    for subject in ports:
        evidence = dict(found[subject].evidence)
        assert evidence["acs_flags"] == decoded[subject].acs_ctl
        assert evidence["acs_ctl"] == "0x001d"
        assert "config-state restore" in found[subject].message
        command, *words = found[subject].fix.split()
        subprocess.run([command, *args(box), *words], check=True)
        assert lspci(box, subject)[subject].acs_ctl == (
            "SrcValid+ TransBlk- ReqRedir- CmpltRedir- UpstreamFwd+ EgressCtrl- DirectTrans-")
    # Cleared by hand, not by the command line, with an IOMMU active: held until a restore.
    after = findings(box)
    assert {after[s].status for s in ports} == {Status.WARN}
    assert all(dict(after[s].evidence)["problem"] == "runtime-only" for s in ports)


def test_switch_ports_above_gpus_fail_and_the_reasons_are_named(box: Path) -> None:
    found = findings(box)
    assert "GPU peer traffic goes up to the root complex" in found["0000:42:00.0"].message
    assert dict(found["0000:42:00.0"].evidence)["gpus_below"] == "0000:43:00.0"
    assert dict(found["0000:40:01.1"].evidence)["nics_below"] == "0000:45:00.0"
    # The NIC's own port: GPUDirect RDMA between it and the GPUs of its switch.
    assert "GPUDirect RDMA" in found["0000:42:02.0"].message
    # Upstream ports have no ACS capability here; the BMC's port is not on any GPU path.
    assert found["0000:41:00.0"].status is Status.PASS
    assert "0000:00:07.1" not in found


def test_the_boot_token_keeps_every_pci_option_and_merges_the_device_lists(box: Path) -> None:
    cmdline = (box / "proc/cmdline").read_text().strip()
    (box / "proc/cmdline").write_text(
        cmdline + " pci=realloc,disable_acs_redir=0000:40:01.1 pci=noaer\n")
    grub = (box / "etc/default/grub").read_text()
    (box / "etc/default/grub").write_text(grub.replace(
        'amd_iommu=pt"', 'amd_iommu=pt pci=hpmemsize=64M,disable_acs_redir=pci:8086:0"'))
    token = boot_token(box)
    options = token.removeprefix("pci=").split(",")
    assert options[:3] == ["realloc", "noaer", "hpmemsize=64M"]
    [devices] = [o for o in options if o.startswith("disable_acs_redir=")]
    listed = devices.partition("=")[2].split("\\;")
    # The lists already on the line come first, then every port found, once.
    assert listed[:2] == ["0000:40:01.1", "pci:8086:0"]
    assert sorted(listed[2:]) == sorted(set(listed[2:]))
    assert len(listed) == 2 + 13
    assert ";" not in devices.replace("\\;", "")  # GRUB: every separator escaped


def test_systemd_boot_takes_the_list_unescaped(box: Path) -> None:
    (box / "etc/kernel").mkdir(parents=True, exist_ok=True)
    (box / "etc/kernel/proxmox-boot-uuids").write_text("2A4B-1C3D\n")
    (box / "etc/kernel/cmdline").write_text("root=ZFS=rpool/ROOT/pve-1 boot=zfs\n")
    (box / "proc/cmdline").write_text("initrd=\\EFI\\proxmox\\initrd.img root=ZFS=rpool "
                                      "amd_iommu=pt\n")
    token = boot_token(box)
    assert "\\;" not in token and token.count(";") == 13  # 14 ports


def test_no_runtime_change_where_devices_are_bound_to_vfio(box: Path) -> None:
    driver = box / "sys/bus/pci/devices/0000:e4:00.0/driver"
    target = driver.readlink()
    driver.unlink()
    driver.symlink_to(str(target).replace("drivers/nvidia", "drivers/vfio-pci"))
    planned = remedies(box)
    assert not any(isinstance(s, SetPciBits) for r in planned for s in getattr(r, "runtime", ()))
    notes = [n for r in planned for n in getattr(r, "notes", ())]
    assert any("bound to vfio-pci" in n for n in notes)


def test_a_list_naming_the_port_while_its_bits_stay_set_is_called_out(box: Path) -> None:
    cmdline = (box / "proc/cmdline").read_text().strip()
    (box / "proc/cmdline").write_text(cmdline + " pci=disable_acs_redir=0000:40:01.1\n")
    found = findings(box)["0000:40:01.1"]
    assert found.status is Status.FAIL
    assert "pci=disable_acs_redir= names this port but the bits are still set" in found.message
    (box / "proc/sys/kernel/osrelease").write_text("6.12.9-amd64\n")
    assert "fails to parse a list of several devices" in findings(box)["0000:40:01.1"].message


@needs_pciutils
def test_egress_control_alone_warns(tmp_path: Path) -> None:
    root = pcie_box(PcieBoxSpec(acs=False, translated=False)).write_dir(tmp_path / "box")
    setpci(root, "0000:62:00.0", "ECAP_ACS+06.w=0020:002c")
    found = findings(root)["0000:62:00.0"]
    assert found.status is Status.WARN and "Egress Control" in found.message


@needs_pciutils
def test_an_nvlink_fabric_makes_root_port_redirect_a_warning(tmp_path: Path) -> None:
    root = dgx_h100().write_dir(tmp_path / "dgx")
    setpci(root, "0000:14:01.0", "ECAP_ACS+06.w=001d")
    setpci(root, "0000:16:00.0", "ECAP_ACS+06.w=001d")
    found = findings(root)
    assert found["0000:14:01.0"].status is Status.WARN
    assert "NVLink (4 NVSwitches)" in found["0000:14:01.0"].message
    # GPUDirect RDMA between the GPU and the NIC of the same switch still fails.
    assert found["0000:16:00.0"].status is Status.FAIL


def test_an_xgmi_hive_is_a_fabric_too(tmp_path: Path) -> None:
    found = findings(mi300x(acs_covered=False).write_dir(tmp_path / "mi"))
    assert found["0000:04:01.1"].status is Status.WARN
    assert "xGMI (one hive)" in found["0000:04:01.1"].message
    assert found["0000:06:00.0"].status is Status.FAIL


def test_guests_and_containers_are_told_to_audit_the_host(tmp_path: Path) -> None:
    [guest] = findings(kvm_guest().write_dir(tmp_path / "vm")).values()
    assert guest.status is Status.SKIP and "VM (qemu)" in guest.message
    root = pcie_box().write_dir(tmp_path / "ct")
    (root / "run/systemd").mkdir(parents=True)
    (root / "run/systemd/container").write_text("lxc\n")
    [inside] = findings(root).values()
    assert inside.status is Status.SKIP and "audit the host" in inside.message


@needs_pciutils
def test_the_fix_script_uses_real_setpci_and_rolls_back(box: Path, tmp_path: Path) -> None:
    policy = load_policy([PcieAcs])
    report = audit(DirectoryHost(str(box)), [PcieAcs], policy)
    plan = build_fix(DirectoryHost(str(box)), report, [PcieAcs], policy)
    fix, rollback = write_scripts(plan, tmp_path)
    copy = copy_tree(box, tmp_path / "copy")
    assert run(fix, copy).returncode == 0
    assert lspci(copy, "0000:60:01.1")["0000:60:01.1"].acs_ctl.startswith(
        "SrcValid+ TransBlk- ReqRedir- CmpltRedir-")
    assert "pci=disable_acs_redir=" in (copy / "etc/default/grub").read_text()
    assert run(rollback, copy).returncode == 0
    assert lspci(copy, "0000:60:01.1")["0000:60:01.1"].acs_ctl.startswith(
        "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+")


def test_repeated_lists_are_merged_into_the_one_token_that_counts(tmp_path: Path) -> None:
    root = pcie_box(PcieBoxSpec(acs=False, translated=False)).write_dir(tmp_path / "box")
    tokens = ("iommu=pt pci=disable_acs_redir=pci:1022:14ab "
              "pci=disable_acs_redir=pci:1000:c030")
    (root / "proc/cmdline").write_text(f"BOOT_IMAGE=/boot/vmlinuz ro {tokens}\n")
    # Configured as booted: the next boot repeats the lists too.
    (root / "etc/default/grub").write_text(f'GRUB_CMDLINE_LINUX_DEFAULT="{tokens}"\n')
    found = findings(root)
    assert "2 pci=disable_acs_redir= options: only the last one counts" in \
        found["cmdline"].message
    # The root ports (named by the first list only) were cleared by hand, not at boot.
    assert dict(found["0000:40:01.1"].evidence)["problem"] == "runtime-only"
    assert found["0000:42:00.0"].status is Status.PASS
    token = boot_token(root)
    assert token.startswith("pci=disable_acs_redir=pci:1022:14ab\\;pci:1000:c030\\;")
    assert token.count("disable_acs_redir=") == 1


def test_ports_the_next_boot_covers_are_pending_and_not_written_again(tmp_path: Path) -> None:
    """The configured line (one merged list) covers the root ports the running line's second
    list left out: pending a reboot, and no second pci= token is planned."""
    root = pcie_box(PcieBoxSpec(acs=False, translated=False)).write_dir(tmp_path / "box")
    (root / "proc/cmdline").write_text("BOOT_IMAGE=/boot/vmlinuz ro iommu=pt "
                                       "pci=disable_acs_redir=pci:1022:14ab "
                                       "pci=disable_acs_redir=pci:1000:c030\n")
    found = findings(root)["0000:40:01.1"]
    assert found.status is Status.WARN
    assert dict(found.evidence)["next_boot_cover"] == "pci=disable_acs_redir="
    assert "pending a reboot" in found.message and "/etc/default/grub" in found.message
    planned = remedies(root)
    assert not [p for r in planned for p in getattr(r, "boot_params", ())]
    assert any("pending a reboot" in getattr(r, "title", "") for r in planned)
