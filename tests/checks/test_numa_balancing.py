"""numa.balancing against the real captures, with problems planted in copies."""

from __future__ import annotations

from auditor.checks.lib.sysctl import Setting
from auditor.checks.lib.sysctl import boot_value as boot_setting
from auditor.checks.numa_balancing import NumaBalancing
from auditor.hosts import DirectoryHost
from auditor.hosts.base import Host
from auditor.model import Status
from tests.support.plant import add_node
from tests.support.sysroot import Sysroot


def verdicts(root: Sysroot) -> list[tuple[Status, str]]:
    host = DirectoryHost(str(root.root))
    return [(f.status, f.message) for f in NumaBalancing().evaluate(host)]


def test_single_node_capture_passes(h200: Sysroot) -> None:
    [(status, message)] = verdicts(h200)
    assert status is Status.PASS
    assert "1 NUMA node" in message


def test_enabled_on_two_nodes_fails(h200: Sysroot) -> None:
    add_node(h200, 1)
    h200.write("/proc/sys/kernel/numa_balancing", "1\n")
    [(status, message)] = verdicts(h200)
    assert status is Status.FAIL
    assert "2 nodes" in message


def test_disabled_on_two_nodes_and_at_boot_passes(h200: Sysroot) -> None:
    add_node(h200, 1)
    h200.write("/proc/sys/kernel/numa_balancing", "0\n")
    h200.write("/etc/sysctl.d/60-numa.conf", "kernel.numa_balancing = 0\n")
    [(status, message)] = verdicts(h200)
    assert status is Status.PASS
    assert "/etc/sysctl.d/60-numa.conf:1" in message


def test_disabled_now_but_not_at_boot_warns(h200: Sysroot) -> None:
    add_node(h200, 1)
    h200.write("/proc/sys/kernel/numa_balancing", "0\n")
    [(status, message)] = verdicts(h200)
    assert status is Status.WARN
    assert "next boot" in message


def test_boot_command_line_or_kernel_default_keeps_it_off(h200: Sysroot) -> None:
    add_node(h200, 1)
    h200.write("/proc/sys/kernel/numa_balancing", "0\n")
    cmdline = h200.read("/proc/cmdline").strip()
    h200.write("/proc/cmdline", f"{cmdline} numa_balancing=disable\n")
    [(status, message)] = verdicts(h200)
    assert (status, "command line" in message) == (Status.PASS, True)
    h200.write("/proc/cmdline", f"{cmdline} numa_balancing=enable\n")
    [(status, message)] = verdicts(h200)
    assert status is Status.FAIL
    assert "numa_balancing=enable on the kernel command line sets it to 1" in message
    # kernel/sched/core.c setup_numabalancing takes "enable" or "disable", not numbers.
    h200.write("/proc/cmdline", f"{cmdline} numa_balancing=0\n")
    assert verdicts(h200)[0][0] is Status.WARN
    release = h200.read("/proc/sys/kernel/osrelease").strip()
    h200.write(f"/boot/config-{release}",
               "CONFIG_NUMA_BALANCING=y\n# CONFIG_NUMA_BALANCING_DEFAULT_ENABLED is not set\n")
    [(status, message)] = verdicts(h200)
    assert (status, "starts with it off" in message) == (Status.PASS, True)


def test_boot_file_that_reverts_runtime_fix_fails(h200: Sysroot) -> None:
    add_node(h200, 1)
    h200.write("/proc/sys/kernel/numa_balancing", "0\n")
    h200.write("/usr/lib/sysctl.d/50-numa.conf", "kernel.numa_balancing = 1\n")
    [(status, message)] = verdicts(h200)
    assert status is Status.FAIL
    assert "/usr/lib/sysctl.d/50-numa.conf:1" in message


def boot_value(host: Host, key: str, systemd: bool | None = None) -> tuple[str, str] | None:
    found: Setting | None = boot_setting(host, key, systemd=systemd)
    return (found.value, found.where) if found is not None else None


def test_boot_value_order_etc_masks_usr_lib_and_sysctl_conf_counts_only_through_a_link(
    h200: Sysroot,
) -> None:
    h200.write("/usr/lib/sysctl.d/50-numa.conf", "kernel.numa_balancing = 1\n")
    h200.write("/etc/sysctl.d/50-numa.conf", "kernel/numa_balancing=0\n")
    host = DirectoryHost(str(h200.root))
    assert boot_value(host, "kernel.numa_balancing") == ("0", "/etc/sysctl.d/50-numa.conf:1")
    h200.write("/etc/sysctl.d/70-z.conf", "-kernel.numa_balancing = 1\n")
    h200.write("/etc/sysctl.conf", "kernel.numa_balancing=0 \n")
    # systemd-sysctl has not read /etc/sysctl.conf since v207.
    assert boot_value(DirectoryHost(str(h200.root)), "kernel.numa_balancing") == (
        "1", "/etc/sysctl.d/70-z.conf:1"
    )
    # Through a 99-sysctl.conf link it counts, at the place that name sorts to.
    h200.symlink("/etc/sysctl.d/99-sysctl.conf", "../sysctl.conf")
    assert boot_value(DirectoryHost(str(h200.root)), "kernel.numa_balancing") == (
        "0", "/etc/sysctl.d/99-sysctl.conf:1"
    )
    h200.symlink("/etc/sysctl.d/10-sysctl.conf", "../sysctl.conf")
    h200.remove("/etc/sysctl.d/99-sysctl.conf")
    assert boot_value(DirectoryHost(str(h200.root)), "kernel.numa_balancing") == (
        "1", "/etc/sysctl.d/70-z.conf:1"
    )
    # procps' sysctl --system (an init without systemd) reads it last.
    h200.remove("/etc/sysctl.d/10-sysctl.conf")
    assert boot_value(DirectoryHost(str(h200.root)), "kernel.numa_balancing",
                      systemd=False) == ("0", "/etc/sysctl.conf:1")


def test_missing_runtime_file_is_skip(virtio: Sysroot) -> None:
    virtio.remove("/proc/sys/kernel/numa_balancing")
    assert verdicts(virtio)[0][0] is Status.SKIP
