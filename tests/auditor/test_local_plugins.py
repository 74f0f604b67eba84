"""A site's own check named in the policy file (``[local-plugins]``), with no packaging.

Each test writes a real plug-in module and policy file and runs the real ``audit``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.sysroot import CAPTURES

AUDIT = str(Path(sys.executable).with_name("audit"))

SITE_CHECK = '''
"""The site's own check: the GPU hosts of this site keep a hostname of gpu-*."""

from collections.abc import Iterable
from typing import ClassVar

from auditor.check import Check
from auditor.hosts.base import Host
from auditor.model import Finding, Severity


class SiteHostname(Check):
    """The site names its GPU hosts gpu-*."""

    id: ClassVar[str] = "site.hostname"
    severity: ClassVar[Severity] = Severity.LOW
    version_added: ClassVar[str] = "2.3"
    reads: ClassVar[tuple[str, ...]] = ("/etc/hostname",)
    rationale: ClassVar[str] = "The scheduler finds GPU hosts by name."
    remedy: ClassVar[str] = "Rename the host."

    def evaluate(self, host: Host) -> Iterable[Finding]:
        name = (host.read_optional("/etc/hostname") or "").strip()
        if name.startswith("gpu-"):
            yield self.passed("hostname", f"{name} is a GPU host's name", observed=name)
        else:
            yield self.failed("hostname", f"{name!r} is not named gpu-*", observed=name,
                              expected="gpu-*")
'''


def site(tmp_path: Path, policy: str = "", module: str = SITE_CHECK) -> Path:
    """Write ``site/plugins/site_checks.py`` and ``site/policy.toml``; return the policy."""
    plugins = tmp_path / "site" / "plugins"
    plugins.mkdir(parents=True)
    (plugins / "site_checks.py").write_text(module)
    path = tmp_path / "site" / "policy.toml"
    path.write_text(policy or '[local-plugins]\npaths = ["plugins"]\n'
                    'checks = ["site.hostname = site_checks:SiteHostname"]\n')
    return path


def audit(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AUDIT, *args], capture_output=True, text=True, check=False,
                          timeout=120, cwd=cwd)


def test_a_site_check_runs_from_the_policy_file(tmp_path: Path) -> None:
    policy = site(tmp_path)
    # Run from elsewhere: the paths are the policy file's, not the working directory's.
    proc = audit("local", "--root", str(CAPTURES["virtio"]), "--policy", str(policy),
                 "--format", "json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # this host is vm-virtio, not gpu-*
    report = json.loads(proc.stdout)
    ours = [f for f in report["findings"] if f["check"] == "site.hostname"]
    assert [(f["status"], f["observed"]) for f in ours] == [("fail", "vm-virtio")]
    assert report["checks"][-1]["check"] == "site.hostname"  # after every registered one
    named = audit("local", "--root", str(CAPTURES["h200"]), "--policy", str(policy),
                  "--check", "site.*", "--format", "json")
    assert [(f["check"], f["status"], f["observed"]) for f in json.loads(named.stdout)[
        "findings"]] == [("site.hostname", "pass", "gpu-h200-vm")]
    # Its options, waivers and selection work as any check's.
    policy.write_text(policy.read_text() + '[[waivers]]\ncheck = "site.hostname"\n'
                      'reason = "lab machine"\n')
    waived = audit("local", "--root", str(CAPTURES["virtio"]), "--policy", str(policy),
                   "--check", "site.hostname", "--format", "json")
    assert waived.returncode == 0, waived.stderr
    assert json.loads(waived.stdout)["findings"][0]["waived"] is True


def test_checks_and_explain_show_it_with_its_version(tmp_path: Path) -> None:
    policy = site(tmp_path)
    listed = audit("checks", "--format", "json", "--policy", str(policy))
    assert listed.returncode == 0, listed.stderr
    described = {c["id"]: c for c in json.loads(listed.stdout)}
    assert described["site.hostname"]["version_added"] == "2.3"
    assert described["site.hostname"]["reads"] == ["/etc/hostname"]
    explained = audit("explain", "site.hostname", "--policy", str(policy))
    assert explained.returncode == 0, explained.stderr
    assert "Added in version 2.3." in explained.stdout
    # Without the policy file the site's check does not exist.
    assert audit("explain", "site.hostname").returncode == 2


def test_snapshot_with_the_policy_captures_the_site_checks_reads(tmp_path: Path) -> None:
    policy = site(tmp_path)
    capture = tmp_path / "c.tar.gz"
    proc = audit("snapshot", "local", "-o", str(capture), "--check", "site.hostname",
                 "--policy", str(policy))
    assert proc.returncode == 0, proc.stderr
    replay = audit("local", "--root", str(capture), "--policy", str(policy), "--check",
                   "site.hostname", "--format", "json")
    assert replay.returncode in (0, 1), replay.stderr
    assert json.loads(replay.stdout)["findings"][0]["subject"] == "hostname"


BAD = [
    ('[local-plugins]\npaths = ["plugins"]\nchecks = ["site_checks:SiteHostname"]\n',
     "is not \"ID = module:Class\""),
    ('[local-plugins]\npaths = "plugins"\n', "paths must be a list of strings"),
    ('[local-plugins]\npath = ["plugins"]\n', "unknown key(s) path"),
    ('[local-plugins]\npaths = ["missing"]\nchecks = []\n', "No such file or directory"),
    ('[local-plugins]\npaths = ["plugins"]\nchecks = ["site.hostname = nowhere:X"]\n',
     "no module 'nowhere'"),
    ('[local-plugins]\npaths = []\nchecks = ["site.hostname = site_checks:SiteHostname"]\n',
     "no module 'site_checks'"),
    ('[local-plugins]\npaths = ["plugins"]\nchecks = ["site.name = site_checks:SiteHostname"]\n',
     "must be the check's id"),
    ('[local-plugins]\npaths = ["plugins"]\nchecks = ["pcie.mrrs = site_checks:Mrrs"]\n',
     "already taken"),
    ('[local-plugins]\npaths = ["plugins"]\nchecks = ["site.hostname = site_checks:Missing"]\n',
     "AttributeError"),
]


@pytest.mark.parametrize(("policy", "message"), BAD)
def test_a_bad_local_plugin_is_one_usage_error_line(tmp_path: Path, policy: str,
                                                    message: str) -> None:
    module = SITE_CHECK + (
        "\n\nfrom auditor.checks.pcie_mrrs import PcieMrrs\n\n\n"
        "class Mrrs(PcieMrrs):\n    \"\"\"The site's MRRS.\"\"\"\n")
    path = site(tmp_path, policy, module)
    proc = audit("local", "--root", str(CAPTURES["virtio"]), "--policy", str(path))
    assert proc.returncode == 2, proc.stdout
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert "local-plugins" in proc.stderr or "already taken" in proc.stderr


def test_a_plugin_is_validated_like_any_check(tmp_path: Path) -> None:
    path = site(tmp_path, module=SITE_CHECK.replace('"2.3"', '"two"'))
    proc = audit("checks", "--policy", str(path))
    assert proc.returncode == 2
    assert "version_added must be a release number" in proc.stderr


@pytest.mark.parametrize("writable", ["plugins", "plugins/site_checks.py"])
def test_a_plugin_another_user_can_write_is_refused(tmp_path: Path, writable: str) -> None:
    path = site(tmp_path)
    target = path.parent / writable
    os.chmod(target, target.stat().st_mode | 0o002)
    marker = tmp_path / "ran"
    (path.parent / "plugins" / "site_checks.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n" + SITE_CHECK)
    os.chmod(target, target.stat().st_mode | 0o002)
    proc = audit("checks", "--policy", str(path))
    assert proc.returncode == 2
    assert "can be written by another user: refused" in proc.stderr
    assert not marker.exists()  # refused before anything of it ran
