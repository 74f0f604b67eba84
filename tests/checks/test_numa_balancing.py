"""numa.balancing against the real captures, with problems planted in copies."""

from __future__ import annotations

import pytest

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


# -- the mechanisms that keep it at boot ----------------------------------------------------


def two_nodes_off(root: Sysroot) -> None:
    add_node(root, 1)
    root.write("/proc/sys/kernel/numa_balancing", "0\n")


def test_sysctl_conf_without_a_link_is_not_read_at_boot(h200: Sysroot) -> None:
    two_nodes_off(h200)
    h200.write("/etc/sysctl.conf", "kernel.numa_balancing = 0\n")
    [(status, message)] = verdicts(h200)
    assert status is Status.WARN
    assert "/etc/sysctl.conf:1 sets 0, but systemd-sysctl has not read /etc/sysctl.conf" in message
    assert "99-sysctl.conf" in message
    h200.symlink("/etc/sysctl.d/99-sysctl.conf", "../sysctl.conf")
    [(status, message)] = verdicts(h200)
    assert status is Status.PASS
    assert "/etc/sysctl.d/99-sysctl.conf:1 (a link to /etc/sysctl.conf)" in message


def test_without_systemd_sysctl_system_reads_sysctl_conf_last(h200: Sysroot) -> None:
    two_nodes_off(h200)
    h200.write("/etc/sysctl.conf", "kernel.numa_balancing = 0\n")
    h200.write("/etc/init.d/sysctl", "#!/sbin/openrc-run\n")
    [(status, message)] = verdicts(h200)
    assert status is Status.PASS
    assert "/etc/sysctl.conf:1 (applied by sysctl --system)" in message


def test_root_reboot_crontab_is_named_as_what_keeps_it(h200: Sysroot) -> None:
    two_nodes_off(h200)
    h200.write("/var/spool/cron/crontabs/root",
               "@reboot echo 0 > /proc/sys/kernel/numa_balancing\n")
    [(status, message)] = verdicts(h200)
    assert status is Status.PASS
    assert "an @reboot line of root's crontab (/var/spool/cron/crontabs/root:1)" in message
    h200.write("/etc/cron.d/tiering", "@reboot root sysctl kernel.numa_balancing=2\n")
    [(status, message)] = verdicts(h200)
    assert status is Status.FAIL
    assert "the system crontab (/etc/cron.d/tiering:1)" in message


def test_enabled_unit_that_sets_1_fails_and_the_fix_names_it(h200: Sysroot) -> None:
    from tests.support.fixkit import plan_for

    two_nodes_off(h200)
    h200.write("/etc/sysctl.d/60-numa.conf", "kernel.numa_balancing = 0\n")
    h200.write("/etc/systemd/system/tier.service",
               "[Service]\nExecStart=/usr/sbin/sysctl -w kernel.numa_balancing=1\n")
    assert verdicts(h200)[0][0] is Status.PASS  # not enabled: it never runs
    h200.symlink("/etc/systemd/system/multi-user.target.wants/tier.service",
                 "../tier.service")
    [(status, message)] = verdicts(h200)
    assert status is Status.FAIL
    assert "the systemd unit tier.service (/etc/systemd/system/tier.service:2)" in message
    [section] = [s for s in plan_for(h200).sections if s.remedy.check == "numa.balancing"]
    assert not section.actions
    assert "tier.service" in section.remedy.advice[0].text


def tuned(root: Sysroot, value: str, reapply: bool = True) -> None:
    root.write("/etc/tuned/active_profile", "gpu\n")
    root.write("/etc/tuned/gpu/tuned.conf", f"[main]\nsummary=x\n[sysctl]\n"
               f"kernel.numa_balancing={value}\n")
    root.write("/etc/tuned/tuned-main.conf", f"reapply_sysctl = {int(reapply)}\n")
    root.write("/usr/lib/systemd/system/tuned.service", "[Unit]\n")
    root.symlink("/etc/systemd/system/multi-user.target.wants/tuned.service",
                 "/usr/lib/systemd/system/tuned.service")


def test_tuned_sysctl_and_its_reapply_of_etc_sysctl_d(h200: Sysroot) -> None:
    two_nodes_off(h200)
    tuned(h200, "0")
    [(status, message)] = verdicts(h200)
    assert status is Status.PASS
    assert "tuned's active profile gpu ([sysctl] in /etc/tuned/gpu/tuned.conf)" in message
    # tuned sets 1, then re-applies /etc/sysctl.d, whose 0 wins (reapply_sysctl=1).
    tuned(h200, "1")
    h200.write("/etc/sysctl.d/60-numa.conf", "kernel.numa_balancing = 0\n")
    [(status, message)] = verdicts(h200)
    assert status is Status.PASS
    assert "re-applied by tuned" in message
    tuned(h200, "1", reapply=False)
    [(status, message)] = verdicts(h200)
    assert status is Status.FAIL
    assert "tuned's active profile gpu" in message


def test_container_judges_the_hosts_value_and_writes_nothing(h200: Sysroot) -> None:
    from tests.support.fixkit import plan_for

    add_node(h200, 1)
    h200.write("/proc/sys/kernel/numa_balancing", "1\n")
    h200.write("/etc/sysctl.d/60-numa.conf", "kernel.numa_balancing = 0\n")
    h200.write("/run/systemd/container", "lxc\n")
    h200.write("/proc/1/uid_map", "0 100000 65536\n")
    [(status, message)] = verdicts(h200)
    assert status is Status.FAIL
    assert "the container's own sysctl.d does not set the host's boot value" in message
    [section] = [s for s in plan_for(h200).sections if s.remedy.check == "numa.balancing"]
    assert not section.actions
    assert section.remedy.advice[0].text.startswith("on the host")


@pytest.mark.parametrize(("command", "value"), [
    ("/usr/sbin/sysctl -w kernel.numa_balancing=0 >/dev/null 2>&1", "0"),
    ("sysctl -q kernel/numa_balancing=2; true", "2"),
    ("/bin/sh -c 'echo 1 > /proc/sys/kernel/numa_balancing'", "1"),
    ("echo -n 0 >/proc/sys/kernel/numa_balancing", "0"),
    ("echo 0 | tee /proc/sys/kernel/numa_balancing", "0"),
    ("cat /proc/sys/kernel/numa_balancing", None),
    ("sysctl -w kernel.numa_balancing_promote_rate_limit_MBps=10", None),
    ("echo $(reboot) > /proc/sys/kernel/numa_balancing", None),
    ("x" * 100_000, None),
])
def test_command_sets(command: str, value: str | None) -> None:
    from auditor.checks.lib.sysctl import command_sets

    assert command_sets(command, "kernel.numa_balancing") == value
