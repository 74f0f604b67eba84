"""checks/lib/cdi: specs parsed with PyYAML or json, bounded; priorities, conflicts, lazy import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from auditor.checks.lib import cdi
from auditor.hosts import DirectoryHost
from tests.support.sysroot import Sysroot

SPEC = """\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
"""


def test_yaml_and_json_specs_give_the_same_paths() -> None:
    from_yaml = cdi.parse(SPEC, "/etc/cdi/nvidia.yaml", 0)
    import yaml

    from_json = cdi.parse(json.dumps(yaml.safe_load(SPEC)), "/etc/cdi/nvidia.json", 0)
    for spec in (from_yaml, from_json):
        assert spec.error == "" and spec.vendor == "nvidia.com" and spec.devices == ["0"]
        assert [(p.path, p.role, p.device) for p in spec.paths] == [
            ("/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", "mount", ""),
            ("/usr/bin/nvidia-cdi-hook", "hook", ""),
            ("/dev/nvidia0", "device", "0")]


def test_hostile_documents_are_errors_not_crashes() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(20))
    for text, path in [("[" * 100_000, "/etc/cdi/x.json"), ("- " * 50_000, "/etc/cdi/x.yaml"),
                       ("!!python/object/apply:os.system ['touch /tmp/pwned']", "/etc/cdi/x.yaml"),
                       (bomb, "/etc/cdi/x.yaml"), ("kind: 3\n", "/etc/cdi/x.yaml"),
                       ("\x00\xff", "/etc/cdi/x.yaml")]:
        spec = cdi.parse(text, path, 0)
        assert spec.error, text[:40]
    assert not Path("/tmp/pwned").exists()


def test_priorities_and_conflicts(h200: Sysroot) -> None:
    h200.write("/etc/cdi/nvidia.yaml", SPEC)
    h200.write("/etc/cdi/other.yaml", SPEC)
    h200.write("/var/run/cdi/nvidia.yaml", SPEC)
    specs = cdi.read_specs(DirectoryHost(str(h200.root)))
    assert [(s.path, s.priority) for s in specs] == [
        ("/etc/cdi/nvidia.yaml", 0), ("/etc/cdi/other.yaml", 0), ("/var/run/cdi/nvidia.yaml", 1)]
    assert cdi.conflicts(specs) == {"nvidia.com/gpu=0": ["/etc/cdi/nvidia.yaml",
                                                         "/etc/cdi/other.yaml"]}


def test_an_audit_without_cdi_specs_does_not_import_yaml(h200: Sysroot) -> None:
    code = ("import sys, io, contextlib\nfrom auditor.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    main(['local', '--root', {str(h200.root)!r}, '--format', 'json'])\n"
            "print('yaml' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"
    h200.write("/etc/cdi/nvidia.yaml", SPEC)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "True"
