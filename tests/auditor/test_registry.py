"""The registry: built-ins and plug-ins through one entry-point group, validated at load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from auditor import registry
from auditor.check import Trigger
from auditor.checks.numa_balancing import NumaBalancing
from auditor.errors import RegistryError, UsageError
from auditor.model import Severity, Status
from auditor.registry import fix_reads, fixable, load_checks, select, validate, watched
from tests.support.cases import Case, check_case, check_fix
from tests.support.factories import write_dist_info

#: What the built-in distribution registers: the checks the README documents.
BUILTIN = {"cpu.governor", "cpu.cstates", "numa.balancing", "kernel.version", "pcie.mrrs",
           "lxc.device_majors"}


def test_builtins_come_from_the_entry_point_group() -> None:
    ids = [c.id for c in load_checks()]
    assert BUILTIN <= set(ids)
    builtin = [i for i in ids if i in BUILTIN]
    assert builtin == sorted(builtin)  # report order: built-ins by id


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"id": "NoDot"}, "not of the form"),
        ({"id": "numa.balancing"}, "already taken"),
        ({"__doc__": None}, "docstring"),
        ({"severity": "high"}, "Severity"),
        ({"reads": ("relative/path",)}, "absolute"),
        ({"reads": ()}, "reads"),
        ({"fix_reads": ("relative",)}, "fix_reads"),
        ({"events": frozenset({"pci"})}, "Trigger"),
        ({"profiles": {"fast": {}}}, "profile 'fast' is not one of"),
        ({"profiles": {"latency": {"nope": 1}}}, "has no option 'nope'"),
        ({"version_added": "1.x"}, "version_added must be a release number"),
        ({"version_added": "v1.0"}, "version_added must be a release number"),
        ({"version_added": 1.0}, "version_added must be a release number"),
    ],
)
def test_validation_rejects_bad_declarations(attrs: dict[str, object], message: str) -> None:
    namespace: dict[str, object] = {
        "__doc__": "A check.", "id": "test.ok", "severity": Severity.LOW,
        "reads": ("/proc/devices",), "rationale": "", "remedy": "",
    }
    namespace.update(attrs)
    bad = type("Bad", (NumaBalancing,), namespace)
    with pytest.raises(RegistryError, match=message):
        validate([NumaBalancing, bad])


class Unversioned(NumaBalancing):
    """A built-in that forgot the release that added it."""

    version_added: ClassVar[str] = ""


class FromTheFuture(NumaBalancing):
    """A built-in claiming a release after this one."""

    version_added: ClassVar[str] = "99.0"


def test_every_builtin_declares_the_release_that_added_it() -> None:
    from auditor import __version__

    def release(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in text.split("."))

    builtins = [c for c in load_checks() if c.__module__.startswith("auditor.checks.")]
    assert len(builtins) >= 20
    assert [c.id for c in builtins if not c.version_added] == []
    assert all(release(c.version_added) <= release(__version__) for c in builtins)


def test_a_builtin_is_held_to_its_version_added() -> None:
    from auditor.entrypoints import Point

    point = Point(registry.DISTRIBUTION, "numa.balancing", f"{__name__}:FromTheFuture")
    with pytest.raises(RegistryError, match=r"version_added 99\.0 is later than this release"):
        registry._load_points([point])
    # One without loads (every command keeps working); the test above fails for it.
    unversioned = Point(registry.DISTRIBUTION, "numa.balancing", f"{__name__}:Unversioned")
    assert registry._load_points([unversioned]) == [Unversioned]
    # A plug-in's version is its own distribution's: not compared with host-auditor's.
    real = Point(registry.DISTRIBUTION, "numa.balancing",
                 "auditor.checks.numa_balancing:NumaBalancing")
    assert registry._load_points([real, Point("other", "numa.balancing", point.value)])[
        1] is FromTheFuture


def test_validation_rejects_what_is_not_a_check() -> None:
    with pytest.raises(RegistryError, match="not a Check class"):
        validate([NumaBalancing, dict])


def test_select_rejects_unknown_ids() -> None:
    checks = load_checks()
    assert [c.id for c in select(checks, only=["numa.balancing"])] == ["numa.balancing"]
    assert "numa.balancing" not in [c.id for c in select(checks, skip=["numa.balancing"])]
    with pytest.raises(UsageError, match="unknown check id 'nope'"):
        select(checks, only=["nope"])


def test_fixable_watched_and_fix_reads_derive_from_the_classes() -> None:
    checks = load_checks()
    assert {c.id for c in fixable(checks)} == {c.id for c in checks if c.fixable()}
    assert "kernel.version" in {c.id for c in watched(checks, Trigger.GPU_MODULE)}
    assert [c.id for c in watched(checks, Trigger.PCI)] == [
        c.id for c in checks if Trigger.PCI in c.events]
    reads = fix_reads(checks)
    assert "/etc/machine-id" in reads and "/etc/default/grub" in reads
    for check in fixable(checks):
        assert set(check.fix_reads) <= set(reads)


# -- a plug-in from another distribution ----------------------------------------------------

PLUGIN = '''
"""A plug-in check: vm.swappiness must be low on an inference host."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from auditor.check import Check, CheckOptions, Trigger, option
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.remedy import FixContext, Remedy, SetValue

PATH = "/proc/sys/vm/swappiness"


class SwappinessOptions(CheckOptions):
    """Options of vm.swappiness."""

    maximum: int = option(10, minimum=0, maximum=200, help="the highest swappiness that passes")


class Swappiness(Check[SwappinessOptions]):
    """Swapping out a server's pages stalls token generation."""

    id: ClassVar[str] = "vm.swappiness"
    severity: ClassVar[Severity] = Severity.LOW
    reads: ClassVar[tuple[str, ...]] = (PATH,)
    rationale: ClassVar[str] = "Swapped-out pages of an inference server stall it."
    remedy: ClassVar[str] = "sysctl -w vm.swappiness=1"
    options_type: ClassVar[type[CheckOptions]] = SwappinessOptions
    profiles: ClassVar[dict[str, dict[str, object]]] = {"latency": {"maximum": 1}}
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.PCI})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        value = host.read_optional(PATH)
        if value is None or not value.isdigit():
            yield self.skipped("vm", f"{PATH} cannot be read")
        elif int(value) > self.options.maximum:
            yield self.failed("vm", f"swappiness is {value}", observed=value,
                              expected=f"<= {self.options.maximum}")
        else:
            yield self.passed("vm", f"swappiness is {value}", observed=value)

    def remediate(self, host: Host, findings: Sequence[Finding],
                  context: FixContext) -> list[Remedy]:
        return [Remedy(check=self.id, subject="vm", title="lower swappiness",
                       runtime=(SetValue(PATH, "1", sysctl="vm.swappiness"),))]
'''


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[Path]:
    """Install a plug-in distribution as a bare dist-info directory on sys.path."""
    site = tmp_path / "site"
    (site / "swappiness_check").mkdir(parents=True)
    (site / "swappiness_check" / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    write_dist_info(site, "swappiness_check", "swappiness-check",
                    {"host_auditor.checks": {"vm.swappiness": "swappiness_check:Swappiness"}})
    sys.path.insert(0, str(site))
    registry.reset()
    try:
        yield site
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("swappiness_check", None)
        registry.reset()


def test_a_plugin_loads_validated_after_the_builtins(plugin: Path) -> None:
    checks = load_checks()
    ids = [c.id for c in checks]
    assert ids[-1] == "vm.swappiness"
    assert BUILTIN <= set(ids[:-1])
    swappiness = checks[-1]
    assert swappiness in fixable(checks)
    assert swappiness in watched(checks, Trigger.PCI)
    assert "/proc/sys/vm/swappiness" in swappiness.reads


def test_a_plugin_is_held_to_the_contract(plugin: Path, tmp_path: Path) -> None:
    swappiness = next(c for c in load_checks() if c.id == "vm.swappiness")

    def high(root: object) -> None:
        root.write("/proc/sys/vm/swappiness", "60\n")  # type: ignore[attr-defined]

    check_case(swappiness, Case("low", Status.PASS,
                                plant=lambda r: r.write("/proc/sys/vm/swappiness", "1\n")),
               tmp_path / "pass")
    check_case(swappiness, Case("high", Status.FAIL, plant=high), tmp_path / "fail")
    if os.geteuid() == 0:
        check_fix(swappiness, Case("high", Status.FAIL, plant=high, fixed=True),
                  tmp_path / "fix", load_checks())


def test_a_plugin_appears_in_the_cli(plugin: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(plugin)}
    listed = subprocess.run([sys.executable, "-m", "auditor", "checks"], env=env,
                            capture_output=True, text=True, check=True).stdout
    assert listed.splitlines()[-1].startswith("vm.swappiness")
    explained = subprocess.run([sys.executable, "-m", "auditor", "explain", "vm.swappiness"],
                               env=env, capture_output=True, text=True, check=True).stdout
    assert "maximum = 10" in explained and "latency: 1" in explained
    policy = tmp_path / "policy.toml"
    policy.write_text('[checks."vm.swappiness"]\nmaximum = 500\n')
    bad = subprocess.run([sys.executable, "-m", "auditor", "local", "--policy", str(policy),
                          "--check", "vm.swappiness"], env=env, capture_output=True,
                         text=True, check=False)
    assert bad.returncode == 2
    assert "vm.swappiness.maximum must be an integer from 0 to 200, got 500" in bad.stderr
    report = subprocess.run([sys.executable, "-m", "auditor", "local", "--check",
                             "vm.swappiness", "--format", "json"], env=env,
                            capture_output=True, text=True, check=False)
    assert report.returncode in (0, 1), report.stderr
    assert json.loads(report.stdout)["checks"][0]["check"] == "vm.swappiness"


def test_a_broken_plugin_is_one_usage_error_line(plugin: Path) -> None:
    (plugin / "swappiness_check" / "__init__.py").write_text("raise RuntimeError('boom')\n")
    env = {**os.environ, "PYTHONPATH": str(plugin)}
    proc = subprocess.run([sys.executable, "-m", "auditor", "checks"], env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert "entry point vm.swappiness" in proc.stderr and "RuntimeError: boom" in proc.stderr


def test_a_plugin_whose_entry_point_name_is_not_its_id_is_refused(plugin: Path) -> None:
    info = plugin / "swappiness_check-1.0.dist-info" / "entry_points.txt"
    info.write_text("[host_auditor.checks]\nswappiness = swappiness_check:Swappiness\n")
    with pytest.raises(RegistryError, match="must be the check's id"):
        load_checks()


def test_select_takes_patterns_of_ids() -> None:
    checks = load_checks()
    cpu = {c.id for c in select(checks, only=["cpu.*"])}
    assert cpu == {c.id for c in checks if c.id.startswith("cpu.")}
    assert {"cpu.governor", "cpu.cstates"} <= cpu
    rest = {c.id for c in select(checks, only=["*"], skip=["cpu.*", "pcie.*"])}
    assert rest == {c.id for c in checks} - {c.id for c in checks
                                             if c.id.startswith(("cpu.", "pcie."))}
    with pytest.raises(UsageError, match=r"unknown check id 'zz\.\*'"):
        select(checks, only=["zz.*"])
