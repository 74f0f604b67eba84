"""mem.thp: the fix selects a word (never writes the line back) and keeps it at boot."""

from __future__ import annotations

from pathlib import Path

from auditor.checks.mem_thp import DEFRAG, TMPFILES, MemThp
from auditor.fix import build_fix
from auditor.hosts import DirectoryHost
from auditor.policy import load_policy
from auditor.remedy import SetSelector, WriteFile
from auditor.runner import audit
from tests.checks.cases.mem_thp import thp
from tests.support.hostgen.serving import base, dgx_class


def test_defrag_fix_is_a_selector_step_and_a_tmpfiles_line(tmp_path: Path) -> None:
    root = base(dgx_class, "dgx")(tmp_path)
    thp("always", "always")(root)
    host = DirectoryHost(str(root.root))
    policy = load_policy([MemThp])
    report = audit(host, [MemThp], policy)
    plan = build_fix(host, report, [MemThp], policy)
    steps = [s for section in plan.sections for s in
             (*section.remedy.runtime, *section.remedy.persistent)]
    assert SetSelector(DEFRAG, "madvise") in steps
    written = [s for s in steps if isinstance(s, WriteFile)]
    assert [w.path for w in written] == [TMPFILES]
    assert f"w {DEFRAG} - - - - madvise" in written[0].content
