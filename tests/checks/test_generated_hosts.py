"""The generated classes of host, collected by the declared reads alone (as over SSH or in a
snapshot), give the same findings as the whole tree, and no check errs on any of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from auditor.hosts import DirectoryHost
from auditor.hosts.archive import ArchiveHost
from auditor.hosts.collect import collect_tar
from auditor.model import Status
from auditor.registry import collected_paths, load_checks
from tests.support.hostgen.base import Tree
from tests.support.hostgen.containers import LxcSpec, PveSpec, build_lxc_host, build_pve9
from tests.support.hostgen.guests import (
    ContainerAuditSpec,
    KvmGuestSpec,
    build_container_audit,
    build_kvm_guest,
)
from tests.support.hostgen.platforms import EpycSpec, GraceSpec, build_epyc, build_grace

HOSTS: dict[str, Callable[[], Tree]] = {
    "pve9-all-broken": lambda: build_pve9(PveSpec(
        stale_bind=True, stale_include=True, hook_allowlist=True, stale_running=True,
        stale_amd=True, stale_nested=True, broken_after_start=True)),
    "pve9": lambda: build_pve9(PveSpec()),
    "lxc-incus-broken": lambda: build_lxc_host(LxcSpec(
        stale_plain=True, stale_hook=True, stale_incus=True, escaping_include=True)),
    "kvm-guest": lambda: build_kvm_guest(KvmGuestSpec(numa_balancing=True)),
    "container-audit": lambda: build_container_audit(ContainerAuditSpec(
        host_powersave=True, host_cc6=True, host_numa=True)),
    "epyc": lambda: build_epyc(EpycSpec()),
    "epyc-tuned": lambda: build_epyc(EpycSpec(tuned_latency=True)),
    "grace": lambda: build_grace(GraceSpec()),
}
MINE = ("cpu.governor", "cpu.cstates", "numa.balancing", "lxc.device_majors")


@pytest.mark.parametrize("name", sorted(HOSTS))
@pytest.mark.parametrize("check_id", MINE)
def test_declared_reads_replay_the_same_findings(name: str, check_id: str,
                                                 tmp_path: Path) -> None:
    [check] = [c for c in load_checks() if c.id == check_id]
    root = HOSTS[name]().write_dir(tmp_path / name)
    whole = [(f.status, f.subject, f.message) for f in check().evaluate(DirectoryHost(str(root)))]
    assert whole and all(status is not Status.ERROR for status, _, _ in whole)
    narrowed = ArchiveHost(collect_tar(collected_paths([check]), root=str(root)), "narrowed")
    assert [(f.status, f.subject, f.message) for f in check().evaluate(narrowed)] == whole
