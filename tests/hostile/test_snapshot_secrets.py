"""Secrets a host keeps in files the checks read never reach a snapshot.

A sysroot is planted with secrets in root's crontab, /etc/cron.d, a unit's ``Environment=``
and ``EnvironmentFile=``, apt's proxy credentials and LXC/Proxmox ``lxc.environment``;
the snapshot is made on the real path (the collector's tar of the checks' reads, rebuilt),
and must hold none of them, while replaying it gives the same findings, naming the same
lines, as the audit of the tree itself.
"""

from __future__ import annotations

import gzip
import json
import tarfile
from pathlib import Path

from tests.hostile.conftest import audit_cmd, run_limited
from tests.support.sysroot import Sysroot

SECRETS = ("HUNTER2-cron", "AKIA-cron-d", "TOKEN-unit", "envfile-secret",
           "PROXYPASS", "lxc-API-KEY", "pve-DB-PASS", "MAILTO-secret")


def plant(root: Sysroot) -> None:
    root.write("/var/spool/cron/crontabs/root",
               "MAILTO=ops+MAILTO-secret@example.com\n"
               "AWS_SECRET_ACCESS_KEY=HUNTER2-cron\n"
               "0 3 * * * /usr/local/bin/backup --password HUNTER2-cron\n"
               "@reboot curl -u admin:HUNTER2-cron https://x/ping; "
               "sysctl -w kernel.numa_balancing=1\n")
    root.write("/etc/cron.d/backup", "TOKEN=AKIA-cron-d\n"
               "@reboot root /usr/bin/sync-keys --key AKIA-cron-d\n")
    root.write("/etc/systemd/system/agent.service",
               "[Service]\nEnvironment=\"API_TOKEN=TOKEN-unit\" DEBUG=1\n"
               "Environment=OTHER=TOKEN-unit \\\n  MORE=TOKEN-unit\n"
               "EnvironmentFile=/etc/envfile-secret.env\n"
               "ExecStart=/usr/bin/agent\n[Install]\nWantedBy=multi-user.target\n")
    root.symlink("/etc/systemd/system/multi-user.target.wants/agent.service",
                 "/etc/systemd/system/agent.service")
    root.write("/etc/apt/apt.conf.d/01proxy",
               'Acquire::http::Proxy "http://builder:PROXYPASS@proxy.example:3128";\n')
    root.write("/var/lib/lxc/ml/config",
               "lxc.uts.name = ml\nlxc.environment = API_KEY=lxc-API-KEY\n"
               "lxc.environment = NVIDIA_VISIBLE_DEVICES=all\n"
               "lxc.hook.mount = /usr/share/lxc/hooks/nvidia\n")
    root.write("/etc/pve/lxc/101.conf", "arch: amd64\nhostname: ct101\n"
               "lxc.environment: DB_PASS=pve-DB-PASS\n")


def test_a_snapshot_withholds_every_planted_secret_and_replays_alike(
        h200: Sysroot, tmp_path: Path) -> None:
    from auditor.hosts.archive import ArchiveHost
    from auditor.hosts.collect import collect_tar
    from auditor.registry import collected_paths, load_checks
    from auditor.snapshot import daemons_of, manifest_files, rebuild, write_capture

    plant(h200)
    checks = load_checks()
    patterns = collected_paths(checks)
    source = ArchiveHost(collect_tar(patterns, root=str(h200.root)), "planted")
    raw = tmp_path / "collected.tar"
    raw.write_bytes(collect_tar(patterns, root=str(h200.root)))
    # The control: the collector did read every planted secret.
    assert all(secret.encode() in raw.read_bytes() for secret in SECRETS)
    rebuilt = rebuild(source, patterns, daemons_of(checks), manifest_files(checks, patterns))
    capture = tmp_path / "snap.tar.gz"
    write_capture(str(capture), rebuilt.data)

    whole = gzip.decompress(capture.read_bytes())
    assert [s for s in SECRETS if s.encode() in whole] == []
    with tarfile.open(capture) as archive:
        names = set(archive.getnames())

        def text(name: str) -> str:
            member = archive.extractfile(name)
            assert member is not None
            return member.read().decode()

        assert "etc/cron.d/backup" not in names  # nothing in it a check reads
        cron = text("var/spool/cron/crontabs/root").split("\n")
        assert cron[3] == "@reboot sysctl -w kernel.numa_balancing=1" and cron[:3] == ["#"] * 3
        unit = text("etc/systemd/system/agent.service")
        assert "Environment=API_TOKEN=(withheld) DEBUG=(withheld)" in unit
        assert "EnvironmentFile=(withheld)" in unit and "ExecStart=/usr/bin/agent" in unit
        assert "http://(withheld)@proxy.example:3128" in text("etc/apt/apt.conf.d/01proxy")
        lxc = text("var/lib/lxc/ml/config")
        assert "API_KEY=(withheld)" in lxc and "NVIDIA_VISIBLE_DEVICES=all" in lxc
        assert "lxc.environment: DB_PASS=(withheld)" in text("etc/pve/lxc/101.conf")

    def findings(root: str) -> list[tuple[str, str, str, str]]:
        result = run_limited(audit_cmd("local", "--root", root, "--format", "json",
                                       "--check", "numa.balancing",
                                       "--check", "lxc.device_majors"), timeout=120)
        assert result.code in (0, 1), result.err
        return sorted((f["check"], f["subject"], f["status"], f["message"])
                      for f in json.loads(result.out)["findings"])

    direct = findings(str(h200.root))
    assert any("crontabs/root:4" in message for *_, message in direct), direct
    assert findings(str(capture)) == direct
