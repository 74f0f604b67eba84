"""The NVIDIA driver checks on generated nodes: what each says, and what its fix writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.check import CheckClass
from auditor.checks.container_cdi import ContainerCdi
from auditor.checks.kernel_version import KernelVersion, upgrade_command
from auditor.checks.nvidia_driver import APT_KEEP, APT_KEEP_TEXT, NvidiaDriver
from auditor.checks.nvidia_fabricmanager import NvidiaFabricmanager
from auditor.checks.nvidia_modparams import NvidiaModparams
from auditor.checks.nvidia_persistence import DROP_IN, NvidiaPersistence
from auditor.checks.nvidia_uvm_hmm import CONF, NvidiaUvmHmm
from auditor.checks.rdma_peermem import RdmaPeermem
from auditor.fix import FixPlan, build_fix
from auditor.hosts import DirectoryHost
from auditor.model import Finding, Status
from auditor.policy import load_policy
from auditor.runner import audit
from tests.support.fixkit import copy_tree, needs_root, run, write_scripts
from tests.support.hostgen.nvidia import RTX_PRO_6000, DriverSpec, build_driver_host

NEXT = "6.8.0-50-generic"


def node(tmp_path: Path, spec: DriverSpec | None = None, name: str = "root") -> Path:
    return build_driver_host(spec).write_dir(tmp_path / name)


def judge(check: CheckClass, root: Path) -> dict[str, Finding]:
    return {f.subject: f for f in check().evaluate(DirectoryHost(str(root)))}


def plan(check: CheckClass, root: Path) -> FixPlan:
    host = DirectoryHost(str(root))
    policy = load_policy([check])
    return build_fix(host, audit(host, [check], policy), [check], policy)


# -- nvidia.uvm_hmm ----------------------------------------------------------------------


@needs_root
def test_uvm_hmm_fix_writes_the_option_and_says_how_to_reload(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(gpu_device=RTX_PRO_6000))
    before = judge(NvidiaUvmHmm, root)["nvidia_uvm"]
    assert before.status is Status.FAIL
    assert "8 NVIDIA GPU(s), 8 of them Blackwell" in before.message
    assert "err -34" in before.message
    fix, _ = write_scripts(plan(NvidiaUvmHmm, root), tmp_path)
    text = fix.read_text()
    assert "#   modprobe -r nvidia_uvm" in text and "#   modprobe nvidia_uvm" in text
    copy = copy_tree(root, tmp_path / "copy")
    assert run(fix, copy).returncode == 0
    assert (copy / CONF.lstrip("/")).read_text() == "options nvidia_uvm uvm_disable_hmm=1\n"
    after = judge(NvidiaUvmHmm, copy)["nvidia_uvm"]
    # Written, not live: judged by the live value (HMM on, Blackwell), the setting named.
    assert after.status is Status.FAIL
    assert (f"{CONF}:1 sets uvm_disable_hmm=1, not live yet: it applies once nvidia_uvm is "
            "reloaded (no CUDA process running) or the host reboots") in after.message
    assert after.fix.startswith("reload nvidia_uvm with no CUDA process running")
    # The fix does not write the option a second time: nothing left to change on disk.
    assert plan(NvidiaUvmHmm, copy).actions == ()


def test_uvm_hmm_fix_rebuilds_an_initramfs_that_carries_nvidia(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(distro="rhel", version_id="9.6", boot="bls",
                                     running="5.14.0-570.23.1.el9_6.x86_64",
                                     initramfs_nvidia=True))
    fixes = plan(NvidiaUvmHmm, root)
    [section] = fixes.sections
    commands = [a.step for a in section.actions if a.step.kind == "run_command"]
    assert [c.argv for c in commands] == [("dracut", "-f", "--regenerate-all")]  # type: ignore
    assert any("/etc/dracut.conf.d/nvidia.conf:1" in n for n in section.remedy.notes)


def test_uvm_hmm_pending_behind_an_old_initramfs_names_the_rebuild(tmp_path: Path) -> None:
    """Configured off, on live, the image that loads nvidia_uvm at boot built before the
    setting: the verdict is the live harm, the message names the setting and the image, and
    the fix rebuilds the image first without writing the option again."""
    setting = {CONF: "options nvidia_uvm uvm_disable_hmm=1\n"}
    root = node(tmp_path, DriverSpec(gpu_device=RTX_PRO_6000, initramfs_nvidia=True,
                                     initramfs_stale=True, modprobe=setting))
    found = judge(NvidiaUvmHmm, root)["nvidia_uvm"]
    assert found.status is Status.FAIL
    assert f"{CONF}:1 sets uvm_disable_hmm=1, not live yet" in found.message
    assert (f"/boot/initrd.img-6.8.0-45-generic, which loads the nvidia modules at boot, is "
            f"older than {CONF}: rebuild it (update-initramfs -u -k all) or a reboot brings "
            "HMM back") in found.message
    assert found.fix.startswith("update-initramfs -u -k all, then reload nvidia_uvm")
    fixes = plan(NvidiaUvmHmm, root)
    assert fixes.actions == ()  # no second uvm_disable_hmm=1, nothing written
    [section] = fixes.sections
    argvs = [a.argv for a in section.remedy.advice]
    assert argvs.index(("update-initramfs", "-u", "-k", "all")) < argvs.index(
        ("modprobe", "-r", "nvidia_uvm"))
    # Built after the setting: only the reload is pending, and the image is said to carry it.
    fresh = node(tmp_path, DriverSpec(gpu_device=RTX_PRO_6000, initramfs_nvidia=True,
                                      modprobe=setting), "fresh")
    found = judge(NvidiaUvmHmm, fresh)["nvidia_uvm"]
    assert found.status is Status.FAIL
    assert "(/boot/initrd.img-6.8.0-45-generic already carries it)" in found.message
    assert not [a for a in plan(NvidiaUvmHmm, fresh).sections[0].remedy.advice
                if a.argv and a.argv[0] == "update-initramfs"]


def test_uvm_hmm_pending_without_file_times_says_it_cannot_tell(tmp_path: Path) -> None:
    from auditor.hosts.archive import ArchiveHost

    tree = build_driver_host(DriverSpec(gpu_device=RTX_PRO_6000, initramfs_nvidia=True,
                                        modprobe={CONF: "options nvidia_uvm uvm_disable_hmm=1\n"}))
    tree.mtimes.clear()  # a capture that keeps no times (the sh collector, a snapshot)
    host = ArchiveHost.from_path(str(tree.write_tar(tmp_path / "node.tar.gz")))
    [found] = NvidiaUvmHmm().evaluate(host)
    assert found.status is Status.FAIL
    assert "whether it holds the setting cannot be told (the time " in found.message
    assert "older than" not in found.message


# -- nvidia.modparams ------------------------------------------------------------------------


def test_modparams_initramfs_older_than_the_options(tmp_path: Path) -> None:
    bar = {"/etc/modprobe.d/nvidia.conf": "options nvidia NVreg_EnableResizableBar=1\n"}
    root = node(tmp_path, DriverSpec(initramfs_nvidia=True, initramfs_stale=True, modprobe=bar,
                                     params={"EnableResizableBar": "1"}))
    found = judge(NvidiaModparams, root)
    assert found["nvidia"].status is Status.PASS  # live as configured: only the image lags
    image = found["initramfs"]
    assert image.status is Status.WARN
    assert image.message.startswith("/boot/initrd.img-6.8.0-45-generic is older than "
                                    "/etc/modprobe.d/nvidia.conf: the initramfs carries the "
                                    "nvidia modules (/etc/initramfs-tools/modules:2)")
    assert image.fix == "update-initramfs -u -k all"
    [section] = plan(NvidiaModparams, root).sections
    assert section.remedy.subject == "initramfs" and section.remedy.reboot
    assert ("update-initramfs", "-u", "-k", "all") in [a.argv for a in section.remedy.advice]
    # dracut hosts: the image is /boot/initramfs-<release>.img, rebuilt by dracut.
    rhel = node(tmp_path, DriverSpec(initramfs_nvidia=True, initramfs_stale=True, modprobe=bar,
                                     distro="rhel", version_id="9.6", boot="bls",
                                     running="5.14.0-570.23.1.el9_6.x86_64"), "rhel")
    image = judge(NvidiaModparams, rhel)["initramfs"]
    assert image.status is Status.WARN and image.fix == "dracut -f --regenerate-all"
    assert "/boot/initramfs-5.14.0-570.23.1.el9_6.x86_64.img is older" in image.message


def test_modparams_initramfs_image_missing_is_a_skip(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(initramfs_nvidia=True, modprobe={
        "/etc/modprobe.d/nvidia.conf": "options nvidia NVreg_EnableResizableBar=1\n"}))
    (root / "boot/initrd.img-6.8.0-45-generic").unlink()
    image = judge(NvidiaModparams, root)["initramfs"]
    assert image.status is Status.SKIP
    assert "cannot be told: no initramfs image for kernel 6.8.0-45-generic" in image.message
    # Modules loaded from the root file system read modprobe.d there: no image to judge.
    plain = node(tmp_path, DriverSpec(initramfs_stale=True, modprobe={
        "/etc/modprobe.d/nvidia.conf": "options nvidia NVreg_EnableResizableBar=1\n"}), "plain")
    assert "initramfs" not in judge(NvidiaModparams, plain)



def test_modparams_names_file_line_and_live_value(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(initramfs_nvidia=True, modprobe={
        "/etc/modprobe.d/nvidia.conf": "options nvidia NVreg_EnableResizableBar=1 "
                                       "NVreg_EnablePCIeRelaxedOrderingMode=1\n"}))
    found = judge(NvidiaModparams, root)["nvidia"]
    assert found.status is Status.WARN
    assert ("NVreg_EnableResizableBar=1 (/etc/modprobe.d/nvidia.conf:1) but the loaded module "
            "has 0") in found.message
    # The registry name is EnablePCIERelaxedOrderingMode: the misspelt option was ignored.
    assert "NVreg_EnablePCIeRelaxedOrderingMode=1 (/etc/modprobe.d/nvidia.conf:1) is not a " \
        "parameter of the loaded nvidia" in found.message
    assert "/boot/initrd.img-6.8.0-45-generic, which loads the nvidia modules at boot, was " \
        "built after them" in found.message
    assert judge(NvidiaModparams, root)["initramfs"].status is Status.PASS


# -- nvidia.driver ---------------------------------------------------------------------------


def test_mid_upgrade_says_the_new_module_waits(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(userspace="580.105.08",
                                     dkms_version={"6.8.0-45-generic": "580.105.08"}))
    found = judge(NvidiaDriver, root)["userspace"]
    assert found.status is Status.FAIL
    assert "the loaded NVIDIA module is 580.95.05 but the host userspace 580.105.08" in \
        found.message
    assert "Driver/library version mismatch" in found.message
    assert "the 580.105.08 module is installed for 6.8.0-45-generic: reload" in found.message


def test_operator_userspace_is_judged_apart(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(operator=True, userspace="570.172.08"))
    found = judge(NvidiaDriver, root)["userspace"]
    assert found.status is Status.FAIL and "gpu-operator userspace 570.172.08" in found.message


@needs_root
def test_unattended_upgrades_are_kept_off_the_driver(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(unattended=True))
    found = judge(NvidiaDriver, root)["upgrades"]
    assert found.status is Status.WARN
    assert "unattended-upgrades is on (/etc/apt/apt.conf.d/20auto-upgrades)" in found.message
    fix, _ = write_scripts(plan(NvidiaDriver, root), tmp_path)
    assert "#   apt-mark hold libnvidia-compute-580-server nvidia-dkms-580-server-open" in \
        fix.read_text()
    copy = copy_tree(root, tmp_path / "copy")
    assert run(fix, copy).returncode == 0
    assert (copy / APT_KEEP.lstrip("/")).read_text() == APT_KEEP_TEXT
    assert judge(NvidiaDriver, copy)["upgrades"].status is Status.PASS


def test_keeping_nvidia_packages_back_names_the_mechanism(tmp_path: Path) -> None:
    """The finding's fix and the remedy's title say how: the apt blacklist or a hold on
    Debian-family hosts, dnf versionlock on RHEL-family ones."""
    root = node(tmp_path, DriverSpec(unattended=True))
    found = judge(NvidiaDriver, root)["upgrades"]
    assert found.status is Status.WARN
    assert f"Unattended-Upgrade::Package-Blacklist in {APT_KEEP}, or apt-mark hold" in found.fix
    [section] = [s for s in plan(NvidiaDriver, root).sections if s.remedy.subject == "upgrades"]
    assert "Unattended-Upgrade::Package-Blacklist" in section.remedy.title
    rhel = node(tmp_path, DriverSpec(distro="rhel", version_id="9.6",
                                     running="5.14.0-570.23.1.el9_6.x86_64", boot="bls"), "rhel")
    (rhel / "etc/dnf").mkdir(parents=True, exist_ok=True)
    (rhel / "etc/dnf/automatic.conf").write_text("[commands]\napply_updates = yes\n")
    timers = rhel / "etc/systemd/system/timers.target.wants"
    timers.mkdir(parents=True, exist_ok=True)
    (timers / "dnf-automatic-install.timer").write_text("[Timer]\n")
    found = judge(NvidiaDriver, rhel)["upgrades"]
    assert found.status is Status.WARN and "dnf versionlock add" in found.fix
    [section] = [s for s in plan(NvidiaDriver, rhel).sections if s.remedy.subject == "upgrades"]
    assert "dnf versionlock" in section.remedy.title
    assert ("dnf", "versionlock", "add", "nvidia-*", "kmod-nvidia*", "cuda-drivers*") in [
        a.argv for a in section.remedy.advice]


# -- nvidia.persistence -----------------------------------------------------------------------


@pytest.mark.parametrize("pid", ["1; rm -rf /", "99999999999", "", "-1", "0"])
def test_persistence_hostile_pid_files(tmp_path: Path, pid: str) -> None:
    root = node(tmp_path)
    (root / "run/nvidia-persistenced/nvidia-persistenced.pid").write_text(pid)
    found = judge(NvidiaPersistence, root)["nvidia-persistenced"]
    assert found.status is Status.WARN and "not running" in found.message


def test_persistence_pid_of_another_process(tmp_path: Path) -> None:
    root = node(tmp_path)
    (root / "proc/2417/comm").write_text("bash\n")
    assert "not running" in judge(NvidiaPersistence, root)["nvidia-persistenced"].message


@needs_root
def test_persistence_drop_in_resets_exec_start(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(persistenced="no-persistence"))
    fix, _ = write_scripts(plan(NvidiaPersistence, root), tmp_path)
    copy = copy_tree(root, tmp_path / "copy")
    assert run(fix, copy).returncode == 0
    assert (copy / DROP_IN.lstrip("/")).read_text().endswith(
        "[Service]\nExecStart=\nExecStart=/usr/bin/nvidia-persistenced --user "
        "nvidia-persistenced --verbose\n")
    after = judge(NvidiaPersistence, copy)["nvidia-persistenced"]
    assert after.status is Status.WARN and "restart it" in after.message


# -- nvidia.fabricmanager, rdma.peermem, container.cdi ---------------------------------------


def test_fabricmanager_version_mismatch(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(nvswitches=4, fabricmanager="running",
                                     fabricmanager_version="570.172.08"))
    found = judge(NvidiaFabricmanager, root)["fabricmanager"]
    assert found.status is Status.FAIL
    assert "fabric manager 570.172.08 (nvidia-fabricmanager-570) runs against driver " \
        "580.95.05" in found.message
    [section] = plan(NvidiaFabricmanager, root).sections
    # The driver's branch has its own package, pinned at the driver's version.
    assert ("apt-get", "install", "nvidia-fabricmanager-580=580.95.05-1") in [
        a.argv for a in section.remedy.advice]


def test_fabricmanager_down_for_a_held_older_version_names_the_cause(tmp_path: Path) -> None:
    """It refuses to start against another driver version: the fix pins the version and
    releases the hold before starting it, never 'enable --now' alone."""
    root = node(tmp_path, DriverSpec(nvswitches=4, fabricmanager="stopped", held=True,
                                     fabricmanager_version="580.82.07"))
    found = judge(NvidiaFabricmanager, root)["fabricmanager"]
    assert found.status is Status.FAIL
    assert "its package nvidia-fabricmanager-580 is 580.82.07 and the loaded driver is " \
        "580.95.05; fabric manager refuses to start" in found.message
    assert "held (apt-mark hold)" in found.message
    assert "enable --now" not in found.fix and found.fix.startswith("apt-mark unhold")
    [section] = plan(NvidiaFabricmanager, root).sections
    argvs = [a.argv for a in section.remedy.advice]
    unhold = argvs.index(("apt-mark", "unhold", "nvidia-fabricmanager-580"))
    install = argvs.index(("apt-get", "install", "nvidia-fabricmanager-580=580.95.05-1"))
    start = argvs.index(("systemctl", "start", "nvidia-fabricmanager.service"))
    assert unhold < install < start


def test_persistence_down_for_a_held_other_version_names_the_cause(tmp_path: Path) -> None:
    """Its libraries refuse a module of another version: the message says so, and the fix
    releases the hold and pins the package before starting it (never restart or enable
    alone, which fail again)."""
    root = node(tmp_path, DriverSpec(persistenced="stopped", held=True,
                                     persistenced_version="580.82.07"))
    found = judge(NvidiaPersistence, root)["nvidia-persistenced"]
    assert found.status is Status.WARN
    assert ("its package nvidia-compute-utils-580-server is 580.82.07 and the loaded driver is "
            "580.95.05") in found.message
    assert "held (apt-mark hold)" in found.message and "API mismatch" in found.message
    assert found.fix.startswith("apt-mark unhold nvidia-compute-utils-580-server; ")
    assert "enable --now" not in found.fix
    [section] = plan(NvidiaPersistence, root).sections
    argvs = [a.argv for a in section.remedy.advice]
    unhold = argvs.index(("apt-mark", "unhold", "nvidia-compute-utils-580-server"))
    install = argvs.index(("apt-get", "install",
                           "nvidia-compute-utils-580-server=580.95.05-0ubuntu0.24.04.1"))
    hold = argvs.index(("apt-mark", "hold", "nvidia-compute-utils-580-server"))
    start = argvs.index(("systemctl", "start", "nvidia-persistenced.service"))
    assert unhold < install < hold < start
    assert ("systemctl", "restart", "nvidia-persistenced.service") not in argvs
    assert ("nvidia-smi", "-pm", "1") not in argvs  # NVML refuses the mismatch too


def test_persistence_package_of_another_branch_pins_the_drivers_branch(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(persistenced="stopped", persistenced_version="570.172.08"))
    found = judge(NvidiaPersistence, root)["nvidia-persistenced"]
    assert "nvidia-compute-utils-570-server is 570.172.08" in found.message
    assert "held" not in found.message and not found.fix.startswith("apt-mark unhold")
    [section] = plan(NvidiaPersistence, root).sections
    argvs = [a.argv for a in section.remedy.advice]
    assert ("apt-get", "install", "nvidia-compute-utils-580-server=580.95.05-0ubuntu0.24.04.1") \
        in argvs
    assert not [a for a in argvs if a and a[:2] == ("apt-mark", "unhold")]
    # At the driver's version the package is not the cause: stopped, started again.
    same = node(tmp_path, DriverSpec(persistenced="stopped", persistenced_version="580.95.05"),
                "same")
    found = judge(NvidiaPersistence, same)["nvidia-persistenced"]
    assert "is not running" in found.message and "package" not in found.message
    [section] = plan(NvidiaPersistence, same).sections
    assert ("systemctl", "restart", "nvidia-persistenced.service") in [
        a.argv for a in section.remedy.advice]


def test_peermem_proprietary_without_module(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(rdma_nics=2, flavour="proprietary"))
    found = judge(RdmaPeermem, root)["gpudirect"]
    assert "proprietary kernel module has no DMA-BUF export" in found.message


def test_cdi_stale_paths_and_missing_nodes(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(cdi=("550.90.07", 8)))
    found = judge(ContainerCdi, root)["/etc/cdi/nvidia.yaml"]
    assert found.status is Status.FAIL
    assert "5 driver file(s) of version 550.90.07 while driver 580.95.05" in found.message
    stale = dict(found.evidence)["stale_paths"].split()
    assert "/lib/firmware/nvidia/550.90.07/gsp_ga10x.bin" in stale
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07" in stale
    # The runtime would stat a device node that is gone: a GPU removed.
    root = node(tmp_path, DriverSpec(cdi=("580.95.05", 8)), "second")
    (root / "dev/nvidia7").unlink()
    found = judge(ContainerCdi, root)["/etc/cdi/nvidia.yaml"]
    assert found.status is Status.FAIL and "/dev/nvidia7" in found.message


# -- kernel.version: the next boot ---------------------------------------------------------


def test_next_kernel_without_module_advises_dkms(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(installed=(NEXT,), without_module=(NEXT,)))
    found = judge(KernelVersion, root)["nvidia-driver"]
    assert found.status is Status.FAIL
    assert f"the next boot starts {NEXT}" in found.message
    assert "the reboot comes up without GPUs" in found.message
    [*_, section] = plan(KernelVersion, root).sections
    assert ("dkms", "autoinstall", "-k", NEXT) in [a.argv for a in section.remedy.advice]


def test_next_kernel_without_precompiled_module_advises_its_package(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(installed=(NEXT,), module_origin="precompiled",
                                     without_module=(NEXT,)))
    advice = [a.argv for s in plan(KernelVersion, root).sections for a in s.remedy.advice]
    assert ("apt", "install", f"linux-modules-nvidia-580-server-open-{NEXT}") in advice
    assert not any("hwe" in " ".join(a) for a in advice)


def test_an_nvidia_line_never_gets_the_generic_hwe_kernel() -> None:
    ubuntu = {"ID": "ubuntu", "VERSION_ID": "24.04"}
    assert upgrade_command("6.8.0-1017-nvidia-64k", "6.8", ubuntu) == (
        "apt", "install", "--only-upgrade", "linux-nvidia-64k")
    assert upgrade_command("6.8.0-45-generic", "6.8", ubuntu)[-1] == "linux-generic-hwe-24.04"


def test_inside_a_container_no_kernel_is_advised(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(environment="container", running="6.1.55"))
    found = judge(KernelVersion, root)
    assert {f.status for f in found.values()} == {Status.SKIP}
    assert "the kernel and its modules are the host's" in found["kernel"].message


def test_ld_so_conf_directories_are_searched_or_named(tmp_path: Path) -> None:
    root = node(tmp_path)
    (root / "etc/ld.so.conf.d/nvidia.conf").write_text("/opt/nvidia/lib64\n/srv/custom/lib\n")
    lib = root / "opt/nvidia/lib64"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.550.90.07").write_bytes(b"\x7fELF")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.550.90.07")
    found = judge(NvidiaDriver, root)["userspace"]
    assert found.status is Status.FAIL
    assert "/opt/nvidia/lib64/libcuda.so.550.90.07" in found.message
    assert dict(found.evidence)["ld_so_conf_unsearched"] == "/srv/custom/lib"


DRIVER_CHECKS = (KernelVersion, NvidiaUvmHmm, NvidiaModparams, NvidiaDriver, NvidiaPersistence,
                 NvidiaFabricmanager, RdmaPeermem, ContainerCdi)


@pytest.mark.parametrize("spec", [
    DriverSpec(userspace="580.105.08", unattended=True, cdi=("550.90.07", 8), rdma_nics=2,
               flavour="proprietary", installed=(NEXT,), without_module=(NEXT,)),
    DriverSpec(nvswitches=4, fabricmanager="running", persistenced="no-persistence",
               gpu_device=RTX_PRO_6000, modprobe={
                   "/etc/modprobe.d/nvidia.conf": "options nvidia NVreg_EnableResizableBar=1\n"}),
    # File times travel with the collection: the image is judged older there too.
    DriverSpec(gpu_device=RTX_PRO_6000, initramfs_nvidia=True, initramfs_stale=True,
               persistenced="stopped", held=True, persistenced_version="580.82.07",
               modprobe={"/etc/modprobe.d/nvidia-uvm.conf":
                         "options nvidia_uvm uvm_disable_hmm=1\n"}),
], ids=["mid-upgrade", "hgx", "stale-initramfs"])
def test_a_collection_of_the_declared_reads_judges_alike(tmp_path: Path, spec: DriverSpec) -> None:
    """Collected by their reads alone (as over SSH or in a snapshot), the checks judge alike."""
    from auditor.hosts.archive import ArchiveHost
    from auditor.hosts.collect import collect_tar
    from auditor.registry import collected_paths

    root = node(tmp_path, spec)
    whole = {(f.check, f.subject): f.status for c in DRIVER_CHECKS
             for f in c().evaluate(DirectoryHost(str(root)))}
    narrowed = ArchiveHost(collect_tar(collected_paths(DRIVER_CHECKS), root=str(root)), "n")
    replayed = {(f.check, f.subject): f.status for c in DRIVER_CHECKS
                for f in c().evaluate(narrowed)}
    assert replayed == whole
    assert Status.FAIL in whole.values()
    if spec.initramfs_stale:
        assert whole[("nvidia.modparams", "initramfs")] is Status.WARN


def test_the_gpu_operator_brings_its_own_module(tmp_path: Path) -> None:
    root = node(tmp_path, DriverSpec(operator=True, installed=(NEXT,),
                                     without_module=("6.8.0-45-generic", NEXT)))
    found = judge(KernelVersion, root)["nvidia-driver"]
    assert found.status is Status.PASS
    assert "gets the module from the GPU Operator's driver container" in found.message


def test_fifos_devices_and_loops_where_files_belong_are_not_read(tmp_path: Path) -> None:
    """A FIFO would block a reader forever: every driver check reads regular files only."""
    import os
    import subprocess
    import sys

    spec = DriverSpec(nvswitches=2, fabricmanager="running", rdma_nics=2, unattended=True,
                      cdi=("550.90.07", 8), tuned=("a=1",))
    root = node(tmp_path, spec)
    for path in ("etc/cdi/nvidia.yaml", "etc/default/grub", "var/lib/dpkg/status",
                 "run/nvidia-persistenced/nvidia-persistenced.pid", "proc/2417/cmdline",
                 "lib/modules/6.8.0-45-generic/modules.dep", "etc/tuned/bootcmdline",
                 "proc/driver/nvidia/params", "etc/apt/apt.conf.d/20auto-upgrades"):
        (root / path).unlink()
        os.mkfifo(root / path)
    (root / "etc/modprobe.d").mkdir()
    os.mkfifo(root / "etc/modprobe.d/fifo.conf")
    (root / "etc/modprobe.d/loop.conf").symlink_to("loop.conf")
    (root / "boot/config-6.8.0-45-generic").write_bytes(b"\xff" * (5 << 20))
    ids = ",".join(c.id for c in DRIVER_CHECKS) + ",boot.cmdline"
    args = ["local", "--root", str(root), "--format", "json"]
    for check in ids.split(","):
        args += ["--check", check]
    proc = subprocess.run([sys.executable, "-m", "auditor", *args], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    assert '"status": "error"' not in proc.stdout


def test_inside_a_container_the_hosts_policy_is_not_read_from_the_image(tmp_path: Path) -> None:
    """The image's apt configuration (unattended upgrades on in it) and its modprobe.d say
    nothing of the host: those subjects skip as the host's; the libraries the container sees
    are still judged against the loaded module."""
    root = node(tmp_path, DriverSpec(environment="container", unattended=True))
    found = judge(NvidiaDriver, root)
    assert found["upgrades"].status is Status.SKIP
    assert "the host's upgrade policy is judged on the host" in found["upgrades"].message
    assert found["nouveau"].status is Status.SKIP
    assert found["userspace"].status is Status.PASS
    bare = judge(NvidiaDriver, node(tmp_path, DriverSpec(unattended=True), "bare"))
    assert bare["upgrades"].status is Status.WARN
