"""cpu.isolation: parameter syntaxes, irqbalance masks, and the boot parameters the fix writes."""

from __future__ import annotations

from pathlib import Path

from auditor.checks.cpu_isolation import CpuIsolation, banned_mask, cpus_of, split_isolcpus
from auditor.fix import build_fix
from auditor.hosts import DirectoryHost
from auditor.policy import load_policy
from auditor.runner import audit
from tests.checks.cases.cpu_isolation import nodewright_profile
from tests.support.hostgen.serving import base, dgx_class


def test_isolcpus_flags_and_lists() -> None:
    assert split_isolcpus("managed_irq,domain,2-5,9") == (("managed_irq", "domain"), "2-5,9")
    assert cpus_of("nohz,3,7-8") == {3, 7, 8}
    assert cpus_of("(null)") == set()
    assert cpus_of("bogus") == set()


def test_irqbalance_masks_are_hex_words() -> None:
    assert banned_mask("f0000000") == {28, 29, 30, 31}
    assert banned_mask("0x1,00000001") == {0, 32}
    assert banned_mask("zz") == set()


def test_fix_hands_cpu0_back_keeping_the_rest(tmp_path: Path) -> None:
    root = base(dgx_class, "dgx")(tmp_path)
    nodewright_profile(root)
    host = DirectoryHost(str(root.root))
    policy = load_policy([CpuIsolation])
    report = audit(host, [CpuIsolation], policy)
    plan = build_fix(host, report, [CpuIsolation], policy)
    params = {p for s in plan.sections for p in s.remedy.boot_params}
    assert params == {"isolcpus=1,48-49", "nohz_full=1,48-49", "rcu_nocbs=1,48-49"}
