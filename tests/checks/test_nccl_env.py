"""nccl.env: assignments as files write them, and lines shared with other settings."""

from __future__ import annotations

from pathlib import Path

from auditor.checks.nccl_env import NcclEnv, settings
from auditor.fix import build_fix
from auditor.hosts import DirectoryHost
from auditor.policy import load_policy
from auditor.runner import audit
from tests.support.hostgen.serving import base, dgx_class


def test_assignment_forms(tmp_path: Path) -> None:
    root = base(dgx_class, "dgx")(tmp_path)
    root.write("/etc/nccl.conf", "NCCL_P2P_DISABLE = 1\n#NCCL_IB_DISABLE=1\n")
    root.write("/etc/profile.d/a.sh", "export NCCL_SHM_DISABLE='1'  # hang\nPATH=/x\n")
    root.write("/etc/environment", 'NCCL_P2P_LEVEL="LOC"\n')
    found = {(s.name, s.value, s.path, s.line) for s in settings(DirectoryHost(str(root.root)))[0]}
    assert found == {("NCCL_P2P_DISABLE", "1", "/etc/nccl.conf", 1),
                     ("NCCL_SHM_DISABLE", "1", "/etc/profile.d/a.sh", 1),
                     ("NCCL_P2P_LEVEL", "LOC", "/etc/environment", 1)}


def test_a_unit_line_with_other_settings_is_left_to_the_operator(tmp_path: Path) -> None:
    root = base(dgx_class, "dgx")(tmp_path)
    root.write("/etc/systemd/system/vllm.service", "[Service]\nEnvironment=NCCL_P2P_DISABLE=1 "
               "NCCL_SHM_DISABLE=1 HF_HOME=/m\n")
    host = DirectoryHost(str(root.root))
    policy = load_policy([NcclEnv])
    report = audit(host, [NcclEnv], policy)
    assert len([f for f in report.findings if f.status.value == "warn"]) == 2
    plan = build_fix(host, report, [NcclEnv], policy)
    remedies = [s.remedy for s in plan.sections]
    assert len(remedies) == 1  # one line, one remedy
    assert not remedies[0].persistent and remedies[0].advice
