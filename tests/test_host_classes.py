"""Every registered check on every class of host the generator builds.

Each class of host was built for some checks; this runs all of them on all of them,
as an operator would: no check may crash (an ``error`` finding) on a host it was not
written against, every check yields a verdict, and a capture of the checks' declared
reads (what ``audit host`` and ``audit snapshot`` collect) replays the same findings.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from auditor.hosts import DirectoryHost
from auditor.hosts.archive import ArchiveHost
from auditor.hosts.collect import collect_tar
from auditor.model import Report, Status
from auditor.policy import load_policy
from auditor.registry import collected_paths, load_checks
from auditor.runner import audit
from tests.support.hostgen import HostSpec, Tree, build_host
from tests.support.hostgen.classes import dgx_h100, grace_hopper, kvm_guest, mi300x, pcie_box
from tests.support.hostgen.containers import build_lxc_host, build_pve9
from tests.support.hostgen.guests import build_container_audit, build_kvm_guest
from tests.support.hostgen.nvidia import build_driver_host
from tests.support.hostgen.platforms import build_epyc, build_grace
from tests.support.hostgen.serving import (
    dgx_class,
    docker_gpu_container,
    grace_blackwell,
    hyperv_vm,
    rhel_metal,
    suse_metal,
)

HOSTS: dict[str, Callable[[], Tree]] = {
    "proxmox-8gpu": lambda: build_host(HostSpec(cpus=32)),
    "proxmox-8gpu-tuned": lambda: build_host(HostSpec(
        cpus=32, bad_governor=False, deep_cstates=False, numa_balancing=False,
        old_kernel=False, low_mrrs=False, stale_lxc_major=False)),
    "pve9-containers": build_pve9,
    "plain-lxc-incus": build_lxc_host,
    "pcie-box": pcie_box,
    "dgx-h100": dgx_h100,
    "mi300x": mi300x,
    "gh200": grace_hopper,
    "kvm-guest-h100": kvm_guest,
    "kvm-guest": build_kvm_guest,
    "inside-a-container": build_container_audit,
    "epyc": build_epyc,
    "grace-arm64": build_grace,
    "nvidia-driver-host": build_driver_host,
    "docker-gpu-container": docker_gpu_container,
    "hyperv-vm": hyperv_vm,
    "grace-blackwell": grace_blackwell,
    "dgx-class": dgx_class,
    "rhel-metal": rhel_metal,
    "suse-metal": suse_metal,
}


def findings(report: Report) -> list[tuple[str, str, str, str]]:
    return sorted((f.check, f.subject, f.aspect, f.status.value) for f in report.findings)


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_every_check_judges_every_class_of_host(name: str, tmp_path: Path) -> None:
    root = HOSTS[name]().write_dir(tmp_path / name)
    checks = load_checks()
    policy = load_policy(checks)
    with DirectoryHost(str(root)) as host:
        report = audit(host, checks, policy)
    errors = [(f.check, f.subject, f.message) for f in report.findings
              if f.status is Status.ERROR]
    assert errors == []
    assert {r.check for r in report.results} == {c.id for c in checks}
    assert all(r.findings for r in report.results)
    # What the collector fetches for these checks is enough to judge alike.
    with ArchiveHost(collect_tar(collected_paths(checks), root=str(root)), name) as narrowed:
        replayed = audit(narrowed, checks, policy)
    assert findings(replayed) == findings(report)
