"""The collector: exactly the matching paths, as a sysroot ArchiveHost reads like the real tree."""

from __future__ import annotations

import ast
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from auditor.errors import CollectError
from auditor.hosts import DirectoryHost
from auditor.hosts.archive import ArchiveHost
from auditor.hosts.collect import collect_tar, parse_output, remote_command
from auditor.registry import collected_paths, load_checks
from auditor.shipped import collector_script
from tests.support.sysroot import Sysroot

SH_TOOLS = ("sh", "id", "sudo", "readlink", "head", "od", "ls")


def members(tar: bytes) -> dict[str, tuple[object, ...]]:
    """Return every member's kind, link target, device numbers and bytes, by path."""
    found: dict[str, tuple[object, ...]] = {}
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        for member in archive:
            handle = archive.extractfile(member) if member.isfile() else None
            device = (member.devmajor, member.devminor) if member.isdev() else None
            found[member.name] = (member.type, member.linkname, device,
                                  handle.read() if handle else None)
    return found


def rooted(root: Path, patterns: list[str]) -> list[str]:
    return [f"{root}{p}" for p in patterns]


def no_python_path(tmp_path: Path) -> str:
    """Return a PATH with the sh collector's tools and no python3."""
    bin_dir = tmp_path / "nopy-bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in SH_TOOLS:
        found = shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin")
        if found and not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def run_remote_command(command: str, path: str | None = None) -> bytes:
    env = {"PATH": path} if path else {"PATH": "/usr/bin:/bin"}
    return subprocess.run(["sh", "-c", command], capture_output=True, check=True,
                          env=env).stdout


# Patterns every built-in check reads, and the PCI ones the pcie check will read.
PATTERNS = [
    *collected_paths(load_checks()),
    "/sys/bus/pci/devices/*/config",
    "/sys/bus/pci/devices/*/driver",
    "/sys/bus/pci/devices/*/current_link_speed",
    "/proc/devices",
    "/dev/nvidia*",
]


def test_capture_collected_reads_like_the_directory(h200: Sysroot) -> None:
    """Globs, bytes, links and devices read the same from the collection as from the tree."""
    tree = DirectoryHost(str(h200.root))
    archive = ArchiveHost(collect_tar(rooted(h200.root, PATTERNS)), "collected")
    prefix = str(h200.root)
    compared = 0
    for pattern in PATTERNS:
        expected = tree.glob(pattern)
        got = [p[len(prefix):] for p in archive.glob(prefix + pattern)]
        assert got == expected, pattern
        for path in expected:
            entry = tree.stat(path)
            if entry is not None and entry.kind == "file":
                assert archive.read_bytes(prefix + path) == tree.read_bytes(path), path
                compared += 1
            assert archive.readlink(prefix + path) == tree.readlink(path), path
            assert archive.device_numbers(prefix + path) == tree.device_numbers(path), path
    assert compared > 5


def test_pci_device_link_and_target_are_kept(h200: Sysroot) -> None:
    """/sys/bus/pci/devices/X stays a link; the config lands at the link target's path."""
    tar = collect_tar(rooted(h200.root, ["/sys/bus/pci/devices/*/config"]))
    found = members(tar)
    base = str(h200.root).lstrip("/")
    link = found[f"{base}/sys/bus/pci/devices/0000:00:06.0"]
    assert link[0] == tarfile.SYMTYPE
    assert link[1] == os.readlink(h200.path("/sys/bus/pci/devices/0000:00:06.0"))
    target = os.path.normpath(os.path.join(f"{base}/sys/bus/pci/devices", str(link[1])))
    config = found[f"{target}/config"]
    assert config[3] == h200.path("/sys/bus/pci/devices/0000:00:06.0/config").read_bytes()
    assert len(config[3]) == 4096
    # Exactly the matches: nothing else from the device directory came along.
    assert not [name for name in found if name.startswith(f"{target}/") and
                name != f"{target}/config"]


def test_device_nodes_keep_major_and_minor(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making device nodes needs root")
    os.mknod(tmp_path / "nvidia-uvm", 0o600 | 0o020000, os.makedev(238, 0))
    os.mknod(tmp_path / "nvme0n1", 0o600 | 0o060000, os.makedev(259, 1))
    found = members(collect_tar([f"{tmp_path}/nvidia-uvm", f"{tmp_path}/nvme*"]))
    base = str(tmp_path).lstrip("/")
    assert found[f"{base}/nvidia-uvm"][:3] == (tarfile.CHRTYPE, "", (238, 0))
    assert found[f"{base}/nvme0n1"][:3] == (tarfile.BLKTYPE, "", (259, 1))


def test_live_sysfs_is_read_not_sized() -> None:
    """A sysfs attribute claims 4096 bytes; the collection holds what a read returns."""
    path = "/proc/sys/kernel/osrelease"
    found = members(collect_tar([path]))
    with open(path, "rb") as handle:
        assert found[path.lstrip("/")][3] == handle.read()


def test_secrets_are_never_collected(tmp_path: Path) -> None:
    (tmp_path / "server.key").write_text("PRIVATE")
    (tmp_path / "notes.txt").write_text("fine")
    found = members(collect_tar(["/proc/self/environ", "/proc/1/cmdline", f"{tmp_path}/*"]))
    assert not [name for name in found if name.endswith(("environ", "cmdline", ".key"))]
    assert f"{str(tmp_path).lstrip('/')}/notes.txt" in found


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory any user can reach (pytest's tmp dirs are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="ha-collect-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_unreadable_files_are_skipped_not_fatal(open_dir: Path) -> None:
    """Run as nobody: a 0600 file is left out and the rest is still collected."""
    if os.geteuid() != 0:
        pytest.skip("switching to another user needs root")
    tmp_path = open_dir
    secret = tmp_path / "root-only"
    secret.write_text("x")
    os.chmod(secret, 0o600)
    (tmp_path / "public").write_text("y")
    os.chmod(tmp_path / "public", 0o644)
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-I",
         collector_script.__file__, f"{tmp_path}/*"],
        capture_output=True, check=True,
    )
    data = b"audit-collect 1 sudo=off\n" + result.stdout
    collection = parse_output(data)
    assert collection.uid == 65534 and not collection.root
    found = members(collection.tar)
    base = str(tmp_path).lstrip("/")
    assert f"{base}/public" in found
    assert f"{base}/root-only" not in found


def test_sh_fallback_gives_the_same_tar_as_python(h200: Sysroot, tmp_path: Path) -> None:
    """Without python3 the POSIX sh collector sends the same files, links and devices."""
    patterns = [
        *rooted(h200.root, PATTERNS),
        "/proc/sys/kernel/osrelease", "/etc/os-release", "/dev/null",
        "/sys/bus/pci/devices/*/config", "/sys/bus/pci/devices/*/driver",
    ]
    command = remote_command(patterns)
    python = parse_output(run_remote_command(command))
    shell = parse_output(run_remote_command(command, no_python_path(tmp_path)))
    assert (python.method, shell.method) == ("python", "sh")
    py_members, sh_members = members(python.tar), members(shell.tar)
    assert len(py_members) > 20
    assert sh_members == py_members


def test_collection_below_a_root_reads_like_the_directory(h200: Sysroot, tmp_path: Path) -> None:
    """With a root, paths are the sysroot's own and absolute links resolve inside it."""
    original = h200.read("/etc/sysctl.conf")
    h200.write("/etc/sysctl.d/99-sysctl.conf", original + "kernel.numa_balancing = 1\n")
    h200.remove("/etc/sysctl.conf")
    h200.symlink("/etc/sysctl.conf", "/etc/sysctl.d/99-sysctl.conf")
    patterns = [*PATTERNS, "/etc/sysctl.conf"]
    tree = DirectoryHost(str(h200.root))
    archive = ArchiveHost(collect_tar(patterns, root=str(h200.root) + "/"), "collected")
    for pattern in patterns:
        assert archive.glob(pattern) == tree.glob(pattern), pattern
    assert archive.readlink("/etc/sysctl.conf") == "/etc/sysctl.d/99-sysctl.conf"
    assert archive.read_text("/etc/sysctl.conf").endswith("kernel.numa_balancing = 1\n")
    for path in ("/proc/sys/kernel/osrelease", "/proc/devices", "/etc/hostname"):
        assert archive.read_bytes(path) == tree.read_bytes(path)


def test_a_root_is_read_by_python_and_refused_by_sh(h200: Sysroot, tmp_path: Path) -> None:
    """The python3 collector takes a root, even one whose name holds a newline and $(...);
    the sh collector refuses one (sh cannot open a path inside a tree it does not own)."""
    odd = tmp_path / "img $(touch PWNED)\n'x"
    os.rename(h200.root, odd)
    command = remote_command(PATTERNS, root=str(odd))
    python = parse_output(run_remote_command(command))
    assert python.method == "python"
    assert "proc/sys/kernel/osrelease" in members(python.tar)
    result = subprocess.run(["sh", "-c", command], capture_output=True, check=False,
                            env={"PATH": no_python_path(tmp_path)})
    assert result.returncode == 2
    assert result.stderr.endswith(b": reading a sysroot needs python3 on the host\n")
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


def test_missing_root_is_an_error_from_both_collectors(tmp_path: Path) -> None:
    command = remote_command(["/etc/hostname"], root=str(tmp_path / "absent"))
    for path in ("/usr/bin:/bin", no_python_path(tmp_path)):
        result = subprocess.run(["sh", "-c", command], capture_output=True, env={"PATH": path},
                                check=False)
        assert result.returncode == 2
        assert b"absent: no such directory" in result.stderr


def test_hostile_file_names_are_data_not_commands(tmp_path: Path) -> None:
    """A name holding quotes, a newline and $(...) is collected; nothing runs."""
    hostile = "a b'\"$(touch PWNED)`touch PWNED2`\nc"
    (tmp_path / hostile).write_text("odd")
    command = remote_command([f"{tmp_path}/a*"])
    for path in (None, no_python_path(tmp_path)):
        found = members(parse_output(run_remote_command(command, path)).tar)
        assert found[f"{str(tmp_path).lstrip('/')}/{hostile}"][3] == b"odd"
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED2").exists()


def test_gzip_collection_opens_as_a_capture(h200: Sysroot, tmp_path: Path) -> None:
    data = collect_tar(rooted(h200.root, ["/proc/sys/kernel/numa_balancing"]), compress=True)
    assert data[:2] == b"\x1f\x8b"
    capture = tmp_path / "c.tar.gz"
    capture.write_bytes(data)
    host = ArchiveHost.from_path(str(capture))
    assert host.read_optional(f"{h200.root}/proc/sys/kernel/numa_balancing") == (
        h200.read("/proc/sys/kernel/numa_balancing").strip())


def test_file_cap_limits_each_file(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 5000)
    found = members(collect_tar([f"{tmp_path}/big"], cap=4096))
    assert found[f"{str(tmp_path).lstrip('/')}/big"][3] == b"x" * 4096


def test_collector_script_runs_on_python_3_6() -> None:
    """The program sent to targets parses as Python 3.6 and needs no __future__ import;
    it imports only the standard library (treeio's names are defined before the collector)."""
    from auditor.hosts.collect import module_sources
    from auditor.shipped import treeio

    source = module_sources(treeio, collector_script).decode()
    tree = ast.parse(source, feature_version=(3, 6))
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and n.module == "__future__"]
    guarded = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try)
               for h in t.handlers for n in ast.walk(h)}
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module and id(n) not in guarded}
    assert imported <= set(sys.stdlib_module_names)
    namespace: dict[str, object] = {"__name__": "collector"}
    exec(compile(source, "collector", "exec"), namespace)
    assert namespace["Tree"].__module__ == "collector"


@pytest.mark.parametrize("garbage", [
    b"",
    b"Welcome to the host!\n",
    b"audit-collect 1 sudo=off\nperl uid=0\n",
    b"audit-collect 1 sudo=off\nsh uid=0\nF/etc/hostname\x00",
    b"audit-collect 1 sudo=off\nsh uid=0\nQ/x\x00",
    b"audit-collect 1 sudo=off\nsh uid=0\nF/x\x00zz\x000\x00",
])
def test_garbage_answers_are_collect_errors(garbage: bytes) -> None:
    with pytest.raises(CollectError):
        parse_output(garbage, "gpu-01")


def test_a_greeting_before_the_answer_is_skipped(h200: Sysroot) -> None:
    """An rc file that prints on a non-interactive login does not break the collection."""
    command = remote_command(rooted(h200.root, ["/proc/sys/kernel/numa_balancing"]))
    answer = run_remote_command(command)
    collection = parse_output(b"Welcome to gpu-01\nlast login: never\n" + answer)
    assert collection.tar == parse_output(answer).tar


def test_collected_paths_join_the_checks_reads_once() -> None:
    checks = load_checks()
    patterns = collected_paths(checks)
    assert len(patterns) == len(set(patterns))
    for check in checks:
        assert set(check.reads) <= set(patterns)
    assert "/etc/hostname" in patterns
