"""One machine is one host: a fleet of six ssh aliases on five machines, over real sshd.

Five loopback sshd run as five machines (each in mount and UTS namespaces of its own,
with its own hostname and ``/etc/machine-id``: :func:`tests.support.sshd.machine_command`):
two fresh nodes both called ``ubuntu``, and ``gpu-03`` reached under two aliases. The
fleet is five machines in every format, and Debian's node_exporter scrapes its
Prometheus output without an error.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.cli import main
from auditor.fleet import view_of_reports
from auditor.model import Report
from auditor.render import render_merge
from tests.engines.conftest import NodeExporter
from tests.support.sshd import SshLab

#: Each machine: its hostname and /etc/machine-id.
MACHINES = {
    "m1": ("ubuntu", "0c1b7a4f5e2d4b9a8c7d6e5f4a3b2c11"),
    "m2": ("ubuntu", "0c1b7a4f5e2d4b9a8c7d6e5f4a3b2c22"),
    "m3": ("gpu-03", "0c1b7a4f5e2d4b9a8c7d6e5f4a3b2c33"),
    "m4": ("gpu-04", "0c1b7a4f5e2d4b9a8c7d6e5f4a3b2c44"),
    "m5": ("gpu-05", "0c1b7a4f5e2d4b9a8c7d6e5f4a3b2c55"),
}
#: The six names the operator audits, and the machine each reaches.
ALIASES = {"node-a": "m1", "node-b": "m2", "gpu-03": "m3", "gpu-03-bmc": "m3",
           "gpu-04": "m4", "gpu-05": "m5"}
CHECKS = ("--check", "numa.balancing", "--check", "kernel.version")


@dataclass
class Fleet:
    config: Path
    known_hosts: Path

    def args(self) -> list[str]:
        return ["host", *ALIASES, "--ssh-config", str(self.config), "--known-hosts",
                str(self.known_hosts), *CHECKS]


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the machines are sshd in namespaces of their own")
    lab = SshLab(Path(tempfile.mkdtemp(prefix="ha-identity-")))
    try:
        servers = {key: lab.start(machine=machine) for key, machine in MACHINES.items()}
        config = lab.root / "ssh_config"
        config.write_text("".join(
            f"Host {alias}\n    HostName 127.0.0.1\n    Port {servers[key].port}\n"
            f"    User root\n    IdentityFile {lab.client_key}\n"
            for alias, key in ALIASES.items()))
        yield Fleet(config, lab.known_hosts(lab.root / "known_hosts"))
    finally:
        lab.close()
        shutil.rmtree(lab.root, ignore_errors=True)


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_names_five_machines_and_the_target_of_each(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = audit(capsys, *fleet.args(), "--format", "json")
    assert code in (0, 1), err
    document = json.loads(out)
    assert document["summary"]["hosts"] == 5 and document["summary"]["targets"] == 6
    hosts = {h["name"]: h for h in document["hosts"]}
    assert sorted(hosts) == ["gpu-03", "gpu-04", "gpu-05", "node-a", "node-b"]
    # Two fresh nodes called ubuntu stay two machines, told apart by their machine ids.
    assert hosts["node-a"]["host"] == hosts["node-b"]["host"] == "ubuntu"
    ids = [h["facts"]["machine_id"] for h in document["hosts"]]
    assert len(set(ids)) == 5 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    # The machine ids are app-specific: never the machine's own /etc/machine-id.
    assert not {m for _, m in MACHINES.values()} & set(ids)
    # One machine under two names is said once, as such.
    assert hosts["gpu-03"]["aliases"] == ["gpu-03-bmc"]
    assert "aliases" not in hosts["gpu-04"]
    notes = [line for line in err.splitlines() if "one machine" in line]
    assert len(notes) == 1 and "gpu-03, gpu-03-bmc are one machine" in notes[0]
    # Progress names the target asked for, with the hostname it turned out to have.
    progress = [line for line in err.splitlines() if re.match(r"audit: \[\d/6\] ", line)]
    assert len(progress) == 6
    assert any(" node-a (ubuntu): " in line for line in progress)
    assert any(" gpu-03-bmc (gpu-03): " in line for line in progress)
    assert any(" gpu-04: " in line for line in progress)


def test_line_and_html_list_each_machine_once_by_its_target(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = audit(capsys, *fleet.args(), "--format", "line")
    assert code in (0, 1), err
    names = [line.split()[0] for line in out.splitlines()]
    assert names == ["node-a", "node-b", "gpu-03", "gpu-04", "gpu-05"]
    assert all(len(line.encode()) <= 80 for line in out.splitlines())
    code, out, _ = audit(capsys, *fleet.args(), "--format", "json")
    reports = [Report.from_dict(h) for h in json.loads(out)["hosts"]]
    page = render_merge(view_of_reports(reports), "html")
    rows = re.findall(r'data-host="([^"]*)"', page)
    assert sorted(rows) == ["gpu-03 = gpu-03-bmc", "gpu-04", "gpu-05", "node-a (ubuntu)",
                            "node-b (ubuntu)"]


def test_node_exporter_scrapes_the_fleet_without_an_error(
    fleet: Fleet, node_exporter: NodeExporter, capsys: pytest.CaptureFixture[str]
) -> None:
    target = node_exporter.textfiles / "fleet.prom"
    code, _, err = audit(capsys, *fleet.args(), "--format", "prometheus", "-o", str(target))
    assert code in (0, 1), err
    written = target.read_text()
    samples = [(s.name, tuple(sorted(s.labels.items())))
               for f in text_string_to_metric_families(written) for s in f.samples]
    assert len(samples) == len(set(samples))  # no series twice
    text = node_exporter.scrape()
    assert node_exporter.value(text, "node_textfile_scrape_error") == 0
    up = [s for f in text_string_to_metric_families(text) for s in f.samples
          if s.name == "host_auditor_up"]
    assert sorted((s.labels["target"], s.labels["host"]) for s in up) == [
        ("gpu-03", "gpu-03"), ("gpu-04", "gpu-04"), ("gpu-05", "gpu-05"),
        ("node-a", "ubuntu"), ("node-b", "ubuntu")]
    assert len({s.labels["machine_id"] for s in up}) == 5
    assert node_exporter.log is not None
    assert "collected before" not in node_exporter.log.read_text()
