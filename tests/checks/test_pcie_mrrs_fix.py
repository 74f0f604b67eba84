"""pcie.mrrs remediation: real setpci against a copy of the H200 capture."""

from __future__ import annotations

from pathlib import Path

from tests.support.factories import make_report
from tests.support.fixkit import assert_idempotent_and_reversible, fix_cycle, needs_root
from tests.support.plant import GPU, mrrs, plant_mrrs, setpci
from tests.support.sysroot import Sysroot


@needs_root
def test_mrrs_raised_to_4096_payload_untouched_and_kept_by_udev(
    h200: Sysroot, tmp_path: Path
) -> None:
    findings = plant_mrrs(h200)
    assert mrrs(h200) == 512
    control_before = int(setpci(h200, "-s", GPU, "CAP_EXP+08.w"), 16)
    plan, fix, rollback, copy, before = fix_cycle(h200, tmp_path, make_report(findings))
    fixed = Sysroot(copy)
    assert mrrs(fixed) == 4096
    control_after = int(setpci(fixed, "-s", GPU, "CAP_EXP+08.w"), 16)
    assert control_after & ~0x7000 == control_before & ~0x7000  # MaxPayload and the rest kept
    rule = (copy / "etc/udev/rules.d/99-host-auditor-pcie-mrrs.rules").read_text()
    assert f'KERNEL=="{GPU}"' in rule and 'ATTR{vendor}=="0x10de"' in rule
    assert "CAP_EXP+08.w=5000:7000" in rule and "RUN+=" in rule
    # A sysroot's fix never runs a command: udevadm appears as what to do on the booted system.
    assert [a for a in plan.document()["actions"] if a["kind"] == "run_command"] == []
    assert "then, on the booted system, run udevadm control --reload-rules" in fix.read_text()
    assert_idempotent_and_reversible(fix, rollback, copy, before)
    assert mrrs(Sysroot(copy)) == 512


def test_a_subject_that_is_not_an_address_gets_no_step(h200: Sysroot) -> None:
    from dataclasses import replace

    from tests.support.fixkit import plan_for

    [finding] = plant_mrrs(h200)
    bad = replace(finding, subject="$(touch /tmp/x)")
    assert not plan_for(h200, make_report([bad])).actions


def test_a_downtrained_link_warning_gets_no_step(h200: Sysroot) -> None:
    from dataclasses import replace

    from auditor.model import Status
    from tests.support.fixkit import plan_for

    [finding] = plant_mrrs(h200)
    link = replace(finding, status=Status.WARN,
                   evidence=(*finding.evidence, ("problem", "link")))
    assert not plan_for(h200, make_report([link])).actions
