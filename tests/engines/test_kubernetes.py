"""contrib/kubernetes: the DaemonSet manifest and node-problem-detector's plugin config.

Neither Kubernetes nor NPD runs here: the manifest is held to the fields the API server
and the kubelet require, the NPD config to NPD's own validation (ported below from
kubernetes/node-problem-detector pkg/custompluginmonitor/types/config.go), and the
commands both run are run for real against generated hosts.
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from auditor.registry import load_checks
from tests.engines.test_formats import assert_valid_label, parse_feature_file
from tests.support.sysroot import CAPTURES

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "contrib" / "kubernetes"
BIN = Path(sys.executable).parent

# -- the DaemonSet ---------------------------------------------------------------------------


def daemonset() -> dict[str, Any]:
    documents = list(yaml.safe_load_all((KUBERNETES / "daemonset.yaml").read_text()))
    [found] = [d for d in documents if d["kind"] == "DaemonSet"]
    assert found["apiVersion"] == "apps/v1"
    namespaces = [d["metadata"]["name"] for d in documents if d["kind"] == "Namespace"]
    assert found["metadata"]["namespace"] in namespaces
    result: dict[str, Any] = found
    return result


def memory_bytes(quantity: str) -> int:
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", quantity)
    assert match, quantity
    return int(match[1]) << {"Ki": 10, "Mi": 20, "Gi": 30}[match[2]]


def millicores(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def test_daemonset_has_what_the_api_server_and_the_audit_need() -> None:
    spec = daemonset()["spec"]
    template = spec["template"]
    assert spec["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    pod = template["spec"]
    [container] = pod["containers"]
    assert container["name"] and container["image"]
    assert container["securityContext"]["privileged"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    host = mounts["/host"]
    assert host["readOnly"] is True and volumes[host["name"]]["hostPath"]["path"] == "/"
    for mount in mounts.values():
        assert mount["name"] in volumes
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HOST_ROOT"] == "/host"
    script = container["args"][0]
    assert 'audit local --root "$HOST_ROOT"' in script
    written = {env["TEXTFILE_DIR"]: "/var/lib/node_exporter/textfile",
               env["FEATURES_DIR"]: "/etc/kubernetes/node-feature-discovery/features.d",
               env["RESULTS_DIR"]: "/var/lib/host-auditor"}
    for path, host_path in written.items():
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == host_path
        assert not mounts[path].get("readOnly")
    tolerated = {(t["key"], t.get("effect")) for t in pod["tolerations"]}
    assert ("nvidia.com/gpu", "NoSchedule") in tolerated


def test_daemonset_limits_cover_a_measured_audit(failing_host: Path, tmp_path: Path) -> None:
    """Peak memory and CPU time of one audit of the 8-GPU, 128-CPU node, measured now."""
    # A fresh parent whose only child is the audit: its children's usage is the audit's.
    measure = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=False); "
               "r = resource.getrusage(resource.RUSAGE_CHILDREN); "
               "print(r.ru_maxrss, r.ru_utime + r.ru_stime)")
    proc = subprocess.run([sys.executable, "-c", measure, str(BIN / "audit"), "local", "--root",
                           str(failing_host), "--format", "prometheus", "-o",
                           str(tmp_path / "x.prom")], capture_output=True, text=True, check=True)
    kib, cpu_text = proc.stdout.split()
    peak, cpu_s = int(kib) << 10, float(cpu_text)  # ru_maxrss is in KiB on Linux
    resources = daemonset()["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert memory_bytes(resources["limits"]["memory"]) >= 2 * peak, peak
    assert memory_bytes(resources["requests"]["memory"]) >= peak
    # At the CPU limit an audit still ends well within NPD's and the loop's time.
    assert cpu_s / (millicores(resources["limits"]["cpu"]) / 1000) < 10, cpu_s


def test_daemonset_loop_writes_what_the_engines_read(failing_host: Path, tmp_path: Path) -> None:
    container = daemonset()["spec"]["template"]["spec"]["containers"][0]
    dirs = {name: tmp_path / name for name in ("textfile", "features", "results")}
    for path in dirs.values():
        path.mkdir()
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOST_ROOT": str(failing_host),
           "TEXTFILE_DIR": str(dirs["textfile"]), "FEATURES_DIR": str(dirs["features"]),
           "RESULTS_DIR": str(dirs["results"]), "NODE_NAME": "node-7", "INTERVAL": "0"}
    proc = subprocess.run([*container["command"], container["args"][0]], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in dirs["textfile"].iterdir()] == ["host_auditor.prom"]
    assert [p.name for p in dirs["features"].iterdir()] == ["host-auditor"]
    report = json.loads((dirs["results"] / "node-7.json").read_text())
    assert report["host"] == "pve-gpu-01"
    expiry, labels = parse_feature_file((dirs["features"] / "host-auditor").read_text())
    assert expiry is not None and labels
    for name, value in labels.items():
        assert_valid_label(name, value)


# -- node-problem-detector -------------------------------------------------------------------

_DURATION = re.compile(r"((?:\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration(text: str) -> float:
    """Parse a Go time.ParseDuration string (as NPD does) into seconds."""
    if text == "0":
        return 0.0
    assert _DURATION.fullmatch(text), f"not a Go duration: {text!r}"
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", text)
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def npd_config() -> dict[str, Any]:
    config: dict[str, Any] = json.loads((KUBERNETES / "npd" / "host-auditor.json").read_text())
    return config


def validate_npd(config: dict[str, Any]) -> None:
    """NPD's ApplyConfiguration and Validate (pkg/custompluginmonitor/types/config.go)."""
    assert config.get("plugin") == "custom"
    global_config = config.get("pluginConfig", {})
    timeout = go_duration(global_config.get("timeout", "5s"))
    interval = go_duration(global_config.get("invoke_interval", "30s"))
    assert interval > 0
    assert isinstance(config["source"], str) and config["source"]
    conditions = {c["type"] for c in config["conditions"]}
    for rule in config["rules"]:
        assert rule["type"] in ("temporary", "permanent")
        if "invoke_interval" in rule:
            assert go_duration(rule["invoke_interval"]) > 0
        if rule.get("timeout") is not None:
            assert go_duration(rule["timeout"]) <= timeout, "rule timeout above the global one"
        assert isinstance(rule["path"], str) and rule["path"].startswith("/")
        assert all(isinstance(a, str) for a in rule.get("args", []))
        if rule["type"] == "permanent":
            assert rule["condition"] in conditions, "permanent problem without a default"
            assert rule["reason"]
    for condition in config["conditions"]:
        assert condition["type"] and condition["reason"] and condition["message"]


def rule_checks(rule: dict[str, Any]) -> list[str]:
    args = rule["args"]
    return [args[i + 1] for i, arg in enumerate(args) if arg == "--check"]


def test_npd_config_passes_npds_validation_with_one_condition_per_group() -> None:
    config = npd_config()
    validate_npd(config)
    rules = config["rules"]
    assert all(r["type"] == "permanent" for r in rules)
    assert len({r["condition"] for r in rules}) == len(rules) == len(config["conditions"])
    assert config["pluginConfig"].get("max_output_length", 80) >= 80
    for rule in rules:
        groups = {check.split(".")[0] for check in rule_checks(rule)}
        assert len(groups) == 1, rule["condition"]  # one check group (area) per condition
        assert rule["args"][-2:] == ["--format", "line"]


def test_npd_config_covers_every_registered_check_once() -> None:
    """Each rule names areas (``pcie.*``): a new check of a known area is covered as it is."""
    from auditor.registry import select

    checks = load_checks()
    covered = [c.id for rule in npd_config()["rules"]
               for c in select(checks, only=rule_checks(rule))]
    assert len(covered) == len(set(covered))
    assert set(covered) == {c.id for c in checks}, (
        "contrib/kubernetes/npd/host-auditor.json: no rule covers "
        f"{sorted({c.id for c in checks} - set(covered))}")
    assert all(pattern.endswith(".*") for rule in npd_config()["rules"]
               for pattern in rule_checks(rule))


def npd_run(rule: dict[str, Any], root: Path, max_output: int) -> tuple[str, str, float]:
    """Run a rule as NPD's plugin.go does; return its status, message and seconds."""
    args = [str(root) if a == "/host" else a for a in rule["args"]]
    started = time.monotonic()
    proc = subprocess.run([str(BIN / "audit"), *args], capture_output=True,
                          timeout=go_duration(rule["timeout"]), check=False)
    elapsed = time.monotonic() - started
    output = proc.stdout[:4096].decode("utf-8", "replace").strip()
    status = {0: "OK", 1: "NonOK"}.get(proc.returncode, "Unknown")
    return status, output[:max_output], elapsed


@pytest.mark.parametrize("host", ["failing", "h200", "absent"])
def test_npd_rules_run_within_their_timeout_and_fit_the_message(
    host: str, failing_host: Path, tmp_path: Path
) -> None:
    config = npd_config()
    root = {"failing": failing_host, "h200": CAPTURES["h200"], "absent": tmp_path / "absent"}[
        host]
    limit = config["pluginConfig"]["max_output_length"]
    # On the failing host a rule is NonOK where the audit finds a problem of its checks at
    # the rule's --fail-on level (fail unless the rule says warning).
    found = json.loads(subprocess.run([str(BIN / "audit"), "local", "--root", str(root),
                                       "--format", "json"], capture_output=True, text=True,
                                      check=False).stdout or "{}") if host == "failing" else {}
    for rule in config["rules"]:
        status, message, elapsed = npd_run(rule, root, limit)
        levels = ("fail", "warn") if "warning" in rule["args"] else ("fail",)
        problem = any(fnmatch.fnmatchcase(f["check"], pattern) and f["status"] in levels
                      for f in found.get("findings", []) for pattern in rule_checks(rule))
        full = subprocess.run([str(BIN / "audit"), *[str(root) if a == "/host" else a
                                                      for a in rule["args"]]],
                              capture_output=True, text=True, check=False).stdout.strip()
        assert message == full  # nothing was cut: the whole line fits
        assert elapsed < go_duration(rule["timeout"]) / 2
        if host == "failing" and problem:
            assert status == "NonOK" and message.startswith(("FAIL ", "WARN ")), rule["condition"]
        elif host == "failing":
            assert status == "OK" and message.startswith(("OK ", "WARN ")), rule["condition"]
        elif host == "h200":
            assert status == "OK" and message.startswith("OK "), rule["condition"]
        else:
            assert status == "Unknown" and message == ""  # exit 2: usage error, on stderr
