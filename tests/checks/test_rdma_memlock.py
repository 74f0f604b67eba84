"""rdma.memlock: limits as pam_limits, systemd and the kernel write them, and which wins."""

from __future__ import annotations

from pathlib import Path

from auditor.checks.rdma_memlock import (
    UNLIMITED,
    limits_kib,
    login_limit,
    systemd_size,
    unit_limit,
)
from auditor.hosts import DirectoryHost
from tests.support.hostgen.serving import base, dgx_class


def test_value_syntaxes() -> None:
    assert limits_kib("8192") == 8 << 20
    assert limits_kib("unlimited") == UNLIMITED
    assert limits_kib("infinity") == UNLIMITED
    assert limits_kib("lots") is None
    assert systemd_size("infinity") == UNLIMITED
    assert systemd_size("64M") == 64 << 20
    assert systemd_size("8M:infinity") == 8 << 20  # soft:hard, the soft is what a process has
    assert systemd_size("1073741824") == 1 << 30
    assert systemd_size("lots") is None


def test_limits_d_after_limits_conf_and_narrower_lines(tmp_path: Path) -> None:
    root = base(dgx_class, "dgx")(tmp_path)
    root.write("/etc/security/limits.conf", "*  soft  memlock  8192\n@hpc  -  memlock  unlimited\n")
    root.write("/etc/security/limits.d/50-rdma.conf", "* - memlock unlimited # rdma\n")
    root.write("/etc/security/limits.d/99-late.conf", "* hard memlock 16384\n")
    found = login_limit(DirectoryHost(str(root.root)))
    assert found.soft == UNLIMITED
    assert found.where == "/etc/security/limits.d/50-rdma.conf:1"
    assert found.narrower == ("/etc/security/limits.conf:2 (@hpc)",)


def test_unit_drop_in_overrides_the_unit(tmp_path: Path) -> None:
    root = base(dgx_class, "dgx")(tmp_path)
    root.write("/usr/lib/systemd/system/sglang.service",
               "[Service]\nLimitMEMLOCK=infinity\nExecStart=/bin/true\n")
    root.write("/etc/systemd/system/sglang.service.d/override.conf",
               "[Service]\nLimitMEMLOCK=64M\n")
    limit = unit_limit(DirectoryHost(str(root.root)), "/usr/lib/systemd/system/sglang.service")
    assert limit.size == 64 << 20
    assert limit.where == "/etc/systemd/system/sglang.service.d/override.conf:2"
