"""``--format line`` and ``--format nfd``: the contracts of node-problem-detector, Slurm and
node-feature-discovery, held on the output of real audits of generated hosts."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from auditor import engines
from auditor.cli import main
from auditor.model import PROBLEMS, Severity, Status
from tests.support.factories import make_finding, make_report
from tests.support.sshd import free_port
from tests.support.sysroot import CAPTURES

# k8s.io/apimachinery/pkg/util/validation: qualified name and label value.
LABEL_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def json_report(capsys: pytest.CaptureFixture[str], root: Path, *extra: str) -> dict[str, Any]:
    _code, out, _err = run(capsys, "local", "--root", str(root), "--format", "json", *extra)
    document: dict[str, Any] = json.loads(out)
    return document


# -- line: one line, worst first, at most 80 bytes, exit codes unchanged --------------------


def test_line_names_the_worst_finding_and_counts_the_rest(
    capsys: pytest.CaptureFixture[str], failing_host: Path
) -> None:
    report = json_report(capsys, failing_host)
    problems = [f for f in report["findings"] if f["status"] in ("warn", "fail", "error")]
    order = [s.value for s in Status]
    ranks = [s.value for s in Severity]
    worst = max(problems, key=lambda f: (order.index(f["status"]), ranks.index(f["severity"])))
    code, out, err = run(capsys, "local", "--root", str(failing_host), "--format", "line")
    assert code == 1, err
    assert out.endswith("\n") and out.count("\n") == 1
    line = out.rstrip("\n")
    assert len(line.encode()) <= engines.LINE_BYTES
    assert line.startswith(f"{worst['status'].upper()} {worst['check']} {worst['subject']} ")
    assert line.endswith(f" (+{len(problems) - 1} more)")


@pytest.mark.parametrize("capture", sorted(CAPTURES))
def test_line_of_a_clean_host_is_ok_with_the_count_of_checks(
    capsys: pytest.CaptureFixture[str], capture: str
) -> None:
    report = json_report(capsys, CAPTURES[capture])
    skipped = sum(1 for c in report["checks"] if c["status"] == "skip")
    code, out, _err = run(capsys, "local", "--root", str(CAPTURES[capture]), "--format", "line")
    assert code == 0
    assert out == f"OK {len(report['checks'])} checks ({skipped} skipped)\n"


def ok_line(report: dict[str, Any]) -> str:
    """Return the line of a host without problems: its checks, and how many skipped."""
    skipped = sum(1 for c in report["checks"] if c["status"] == "skip")
    return f"OK {len(report['checks'])} checks" + (f" ({skipped} skipped)" if skipped else "")


def test_line_of_a_tuned_host_and_fail_on(capsys: pytest.CaptureFixture[str],
                                          clean_host: Path) -> None:
    report = json_report(capsys, clean_host, "--skip", "numa.balancing")
    code, out, _err = run(capsys, "local", "--root", str(clean_host), "--format", "line",
                          "--skip", "numa.balancing")
    assert (code, out) == (0, ok_line(report) + "\n")
    # The tuned host still warns that NUMA balancing is on at boot: shown, exit 0 below
    # --fail-on warning, 1 at it.
    code, out, _err = run(capsys, "local", "--root", str(clean_host), "--format", "line")
    assert code == 0 and out.startswith("WARN numa.balancing kernel ")
    code, _out, _err = run(capsys, "local", "--root", str(clean_host), "--format", "line",
                           "--fail-on", "warning")
    assert code == 1


def test_line_usage_error_is_exit_2_and_nothing_on_stdout(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for args in (["--check", "no.such"], ["--root", str(tmp_path / "absent")]):
        code, out, err = run(capsys, "local", "--format", "line", *args)
        assert code == 2 and out == ""
        assert len(err.strip().splitlines()) == 1 and err.startswith("audit: error:")


def test_line_of_an_unreachable_host_is_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    target = f"127.0.0.1:{free_port()}"
    code, out, _err = run(capsys, "host", target, "--timeout", "2", "--format", "line")
    assert code == 3
    assert out.startswith("ERROR ") and "refused" in out
    assert len(out.rstrip("\n").encode()) <= engines.LINE_BYTES


def test_line_of_many_hosts_names_each(capsys: pytest.CaptureFixture[str], failing_host: Path,
                                       tmp_path: Path) -> None:
    for name, root in (("a", failing_host), ("b", CAPTURES["h200"])):
        run(capsys, "local", "--root", str(root), "--format", "json", "-o",
            str(tmp_path / f"{name}.json"))
    code, out, _err = run(capsys, "merge", str(tmp_path), "--format", "line")
    assert code == 1
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("pve-gpu-01 FAIL ")
    assert lines[1] == f"{lines[1].split()[0]} {ok_line(json_report(capsys, CAPTURES['h200']))}"
    assert all(len(line.encode()) <= engines.LINE_BYTES for line in lines)


def test_line_from_hostile_values_stays_one_short_ascii_line() -> None:
    nasty = "ctr-\u00e9\u2028\x1b[31m$(reboot)\n" + "x" * 300
    report = make_report([
        make_finding(subject=nasty, observed=nasty, expected="0"),
        make_finding(check="pcie.mrrs", status=Status.WARN, subject="0000:41:00.0"),
    ])
    line = engines.render_line([report]).rstrip("\n")
    assert "\n" not in line and line.isascii() and line.isprintable()
    assert len(line.encode()) <= engines.LINE_BYTES
    assert line.startswith("FAIL numa.balancing ctr-?") and line.endswith("... (+1 more)")


def test_line_orders_by_status_then_severity() -> None:
    report = make_report([
        make_finding(check="a.warn", status=Status.WARN, severity=Severity.CRITICAL),
        make_finding(check="b.low", status=Status.FAIL, severity=Severity.LOW),
        make_finding(check="c.high", status=Status.FAIL, severity=Severity.HIGH),
        make_finding(check="d.error", status=Status.ERROR, severity=Severity.INFO,
                     observed="", message="check raised ValueError: bad"),
    ])
    assert engines.report_line(report) == (
        "ERROR d.error kernel check raised ValueError: bad (+3 more)")
    assert all(f.status in PROBLEMS for f in report.findings)


# -- nfd: a feature file node-feature-discovery accepts -------------------------------------


def parse_feature_file(text: str) -> tuple[dt.datetime | None, dict[str, str]]:
    """Parse as NFD's local source does (source/local/local.go parseFeatureFile)."""
    expiry: dt.datetime | None = None
    labels: dict[str, str] = {}
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if line.startswith("# +"):
                key, _, value = line[3:].partition("=")
                assert key == "expiry-time", f"unknown directive {line!r}"
                expiry = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            continue
        name, sep, value = line.partition("=")
        labels[name] = value if sep else "true"
    return expiry, labels


def assert_valid_label(name: str, value: str) -> None:
    prefix, sep, base = name.partition("/")
    assert sep and SUBDOMAIN.match(prefix) and len(prefix) <= 253, name
    assert not prefix.endswith("kubernetes.io") or prefix.endswith("feature.node.kubernetes.io")
    assert LABEL_PART.match(base) and len(base) <= 63, name
    assert LABEL_PART.match(value) and len(value) <= 63, (name, value)
    assert ":" not in value and not value.startswith("@")


def test_nfd_labels_are_valid_with_an_expiry(capsys: pytest.CaptureFixture[str],
                                            failing_host: Path) -> None:
    report = json_report(capsys, failing_host)
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    code, out, _err = run(capsys, "local", "--root", str(failing_host), "--format", "nfd")
    after = dt.datetime.now(dt.timezone.utc)
    assert code == 1
    assert len(out.encode()) <= engines.NFD_MAX_BYTES
    expiry, labels = parse_feature_file(out)
    assert out.index("# +expiry-time=") < out.index("=fail")  # expiry governs every label
    assert expiry is not None
    assert before + dt.timedelta(seconds=engines.NFD_TTL_S) <= expiry \
        <= after + dt.timedelta(seconds=engines.NFD_TTL_S)
    for name, value in labels.items():
        assert_valid_label(name, value)
    ns = engines.NFD_NAMESPACE
    _code, stamp, _err = run(capsys, "fingerprint", "--root", str(failing_host))
    expected = {f"{ns}/status": "fail", f"{ns}/fingerprint": stamp.strip()}
    expected.update({f"{ns}/{c['check']}": c["status"] for c in report["checks"]})
    assert labels == expected
    assert not any(re.search(r"[0-9a-f]{4}:[0-9a-f]{2}:", v) for v in labels.values())


def test_nfd_status_of_a_tuned_host_counts_skips_as_pass(
    capsys: pytest.CaptureFixture[str]
) -> None:
    _code, out, _err = run(capsys, "local", "--root", str(CAPTURES["virtio"]), "--format", "nfd")
    _expiry, labels = parse_feature_file(out)
    assert labels[f"{engines.NFD_NAMESPACE}/status"] == "pass"
    assert "skip" in labels.values()


def test_nfd_namespace_and_ttl_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(engines.NFD_NAMESPACE_ENV, "gpu.example.com")
    monkeypatch.setenv(engines.NFD_TTL_ENV, "3600")
    started = dt.datetime.now(dt.timezone.utc)
    _code, out, _err = run(capsys, "local", "--root", str(CAPTURES["h200"]), "--format", "nfd")
    expiry, labels = parse_feature_file(out)
    assert all(name.startswith("gpu.example.com/") for name in labels)
    assert expiry is not None and expiry - started > dt.timedelta(seconds=3590)
    for bad_ns, bad_ttl in (("Has_Caps", "600"), ("x.kubernetes.io", "600"),
                            ("ok.example", "5"), ("ok.example", "1e3")):
        monkeypatch.setenv(engines.NFD_NAMESPACE_ENV, bad_ns)
        monkeypatch.setenv(engines.NFD_TTL_ENV, bad_ttl)
        code, out, err = run(capsys, "local", "--root", str(CAPTURES["h200"]), "--format", "nfd")
        assert code == 2 and out == "" and err.startswith("audit: error: HOST_AUDITOR_NFD_")


def test_nfd_of_several_hosts_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    targets = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    code, out, err = run(capsys, "host", *targets, "--timeout", "2", "--format", "nfd")
    assert code == 2 and out == ""
    assert err.splitlines()[-1].startswith("audit: error: --format nfd labels one node")


def test_nfd_leaves_out_a_check_id_that_is_no_label_name() -> None:
    report = make_report([make_finding(check="plug.in_" + "x" * 70),
                          make_finding(check="numa.balancing", status=Status.PASS)])
    _expiry, labels = parse_feature_file(engines.render_nfd([report]))
    assert sorted(labels) == [f"{engines.NFD_NAMESPACE}/{n}" for n in
                              ("fingerprint", "numa.balancing", "status")]


# -- -o: written through a dot-file and a rename -------------------------------------------


def test_output_file_is_renamed_into_place_from_a_dot_file(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    features = tmp_path / "features.d"
    features.mkdir()
    target = features / "host-auditor"
    target.write_text("old labels\n")
    renames: list[tuple[str, str, str]] = []
    real_rename = os.rename

    def spy(src: str, dst: str, *, src_dir_fd: int, dst_dir_fd: int) -> None:
        # The rename is done in the directory the writer holds open (outfile.write_file).
        assert os.path.samestat(os.fstat(src_dir_fd), features.stat())
        assert src_dir_fd == dst_dir_fd
        fd = os.open(src, os.O_RDONLY, dir_fd=src_dir_fd)
        with os.fdopen(fd) as handle:
            renames.append((src, dst, handle.read()))
        real_rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr("auditor.outfile.os.rename", spy)
    code, out, _err = run(capsys, "local", "--root", str(CAPTURES["h200"]), "--format", "nfd",
                          "-o", str(target))
    assert code == 0 and out == ""
    [(src, dst, written)] = renames
    assert dst == target.name and "/" not in src
    assert Path(src).name.startswith(".")  # NFD skips dot-files; a rename is atomic
    assert written == target.read_text() and "+expiry-time=" in written
    assert sorted(p.name for p in features.iterdir()) == ["host-auditor"]
    mode = target.stat().st_mode & 0o777
    assert mode == 0o666 & ~_umask()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_output_to_a_special_file_is_refused(tmp_path: Path) -> None:
    """A FIFO (or a device) where the report goes is never written: a write could hang, or
    land on a disk (tests/hostile/test_output_paths.py plants the rest)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(OSError, match="not a regular file"):
            engines.write_atomic(str(fifo), "OK 6 checks\n")
        assert os.read(reader, 100) == b""
    finally:
        os.close(reader)
    assert fifo.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_output_through_a_symlink_replaces_the_file_it_names(tmp_path: Path) -> None:
    real = tmp_path / "real" / "host_auditor.prom"
    real.parent.mkdir()
    real.write_text("old\n")
    link = tmp_path / "link.prom"
    link.symlink_to(real)
    engines.write_atomic(str(link), "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"
    assert sorted(p.name for p in real.parent.iterdir()) == ["host_auditor.prom"]


def test_output_into_a_missing_directory_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _out, err = run(capsys, "local", "--root", str(CAPTURES["h200"]), "--format", "line",
                          "-o", str(tmp_path / "absent" / "x"))
    assert code == 2 and err.startswith("audit: error:") and len(err.splitlines()) == 1
