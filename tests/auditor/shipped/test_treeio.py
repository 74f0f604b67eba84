"""treeio.Tree: every path resolves inside the tree, with openat2 and with the component walk."""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from auditor.shipped import treeio
from auditor.shipped.treeio import Tree


@pytest.fixture(params=[None, False], ids=["openat2", "walk"])
def mode(request: pytest.FixtureRequest) -> bool | None:
    if request.param is None:
        with Tree("/") as tree:
            tree.open(".")
        if not treeio._HAVE_OPENAT2:
            pytest.skip("this kernel has no openat2 (the walk is tested on its own)")
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A tree with symlinks leading out in every way, and a secret outside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("SECRET\n")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/hostname").write_text("inside\n")
    (root / "etc/abs").symlink_to(outside / "secret")
    (root / "etc/rel").symlink_to("../../outside/secret")
    (root / "etc/dotdot").symlink_to("../../../../../../../../etc/hostname")
    (root / "etc/dir").symlink_to(outside)
    (root / "etc/loop").symlink_to("loop")
    (root / "etc/self").symlink_to("/etc/hostname")
    os.mkfifo(root / "etc/fifo")
    return root, outside


def test_symlinks_resolve_inside_the_tree(layout: tuple[Path, Path], mode: bool | None) -> None:
    root, outside = layout
    with Tree(str(root), use_openat2=mode) as tree:
        assert tree.read("/etc/hostname", 100) == b"inside\n"
        # The last component is never followed; through a symlinked directory or one
        # followed on purpose, absolute targets start at the tree's root.
        for name in ("abs", "rel", "dir"):
            with pytest.raises(OSError):
                tree.read(f"/etc/{name}", 100)
        with pytest.raises(OSError):
            tree.read("/etc/dir/secret", 100)
        assert tree.stat("/etc/abs") is None and tree.stat("/etc/dir/secret") is None
        st = tree.stat("/etc/dotdot")  # "../" past the root stops at the root
        assert st is not None and stat.S_ISREG(st.st_mode)
        assert tree.read("/../../etc/hostname", 100) == b"inside\n"
        assert tree.stat("/etc/self") is not None
        with pytest.raises(OSError) as loop:
            tree.stat("/etc/loop/x") or tree.read("/etc/loop/x", 1)
        assert loop.value.errno in (errno.ELOOP, errno.ENOENT)
        assert tree.readlink("/etc/abs") == os.fsencode(outside / "secret")
        assert sorted(tree.listdir("/etc")) == sorted(os.fsencode(n) for n in os.listdir(
            root / "etc"))


def test_fifos_devices_and_hard_links_are_never_read_or_written(
    layout: tuple[Path, Path], mode: bool | None
) -> None:
    root, outside = layout
    os.link(outside / "secret", root / "etc/linked")
    with Tree(str(root), use_openat2=mode) as tree:
        with pytest.raises(OSError, match="not a regular file"):
            tree.read("/etc/fifo", 10)  # never opened: it would block
        with pytest.raises(OSError, match="other hard links"):
            tree.write("/etc/linked", b"x")
        with pytest.raises(OSError):
            tree.write("/etc/abs", b"x")  # a symlink is not written through
        with pytest.raises(FileExistsError):
            tree.create("/etc/abs", 0o644)
        assert tree.write("/etc/new", b"made\n", create_mode=0o640)
        assert stat.S_IMODE(os.stat(root / "etc/new").st_mode) == 0o640
        with pytest.raises(OSError):
            tree.unlink("/etc/dir/secret")
        with pytest.raises(OSError):
            tree.mkdir("/etc/dir/made")
    assert (outside / "secret").read_text() == "SECRET\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]


def test_a_directory_swapped_for_a_symlink_never_leads_out(
    layout: tuple[Path, Path], mode: bool | None
) -> None:
    root, outside = layout
    (root / "etc/sub").mkdir()
    (root / "etc/sub/file").write_text("inside\n")
    (outside / "file").write_text("SECRET\n")
    stop = threading.Event()

    def swap() -> None:
        # Absolute and relative: both lead out of the tree as the machine sees it.
        targets = (outside, Path(os.path.relpath(outside, root / "etc")))
        turn = 0
        while not stop.is_set():
            turn += 1
            try:
                os.rename(root / "etc/sub", root / "etc/sub.real")
                os.symlink(targets[turn % 2], root / "etc/sub")
                os.unlink(root / "etc/sub")
                os.rename(root / "etc/sub.real", root / "etc/sub")
            except OSError:
                pass

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    seen: set[bytes | None] = set()
    try:
        with Tree(str(root), use_openat2=mode) as tree:
            reads: tuple[Callable[[], bytes | None], ...] = (
                lambda: tree.read("/etc/sub/file", 100),
                lambda: tree.read_file(b"/etc/sub", b"file", 100))
            for _ in range(3000):
                for read in reads:
                    try:
                        seen.add(read())
                    except OSError:
                        pass
                try:
                    tree.write("/etc/sub/file", b"inside\n")
                except OSError:
                    pass
    finally:
        stop.set()
        thread.join()
    assert b"SECRET\n" not in seen
    assert (outside / "file").read_text() == "SECRET\n"


def test_read_file_resolves_the_directory_inside_the_tree_and_never_follows_the_name(
        layout: tuple[Path, Path], mode: bool | None) -> None:
    """``read_file`` hands the kernel a directory's path as it is (checked once per
    directory): its symlinks, ".", ".." and empty components resolve inside the tree."""
    root, outside = layout
    (root / "etc/sub").mkdir()
    (root / "etc/sub/file").write_text("sub\n")
    (root / "link").symlink_to("/etc")  # absolute: from the tree's root
    (root / "out").symlink_to(outside)
    (root / "up").symlink_to("../../../../outside")
    (outside / "file").write_text("SECRET\n")
    with Tree(str(root), use_openat2=mode) as tree:
        for parent in (b"/etc", b"etc", b"/etc/", b"//etc", b"/./etc", b"/etc/sub/..",
                       b"/../../etc", b"/link", b"/link/sub/.."):
            for _ in range(2):  # the directory's path is kept after the first read
                assert tree.read_file(parent, b"hostname", 100) == b"inside\n", parent
        assert tree.read_file(b"/", b"link", 100) is None  # a symlink: resolved by the caller
        assert tree.read_file(b"/etc", b"abs", 100) is None
        assert tree.read_file(b"/etc", b"sub/file", 100) == b"sub\n"
        for parent, name in ((b"/out", b"file"), (b"/up", b"file"), (b"/etc/dir", b"secret"),
                             (b"/etc", b"fifo"), (b"/etc/sub", b".."), (b"/etc", b"")):
            with pytest.raises(OSError):
                tree.read_file(parent, name, 100)
        for parent, name in ((b"/etc", b"hostname\0/x"), (b"/etc\0/x", b"hostname")):
            with pytest.raises(OSError) as raised:
                tree.read_file(parent, name, 100)
            assert raised.value.errno == errno.EINVAL  # never cut at the NUL


def test_paths_are_bounded(layout: tuple[Path, Path], mode: bool | None) -> None:
    root, _ = layout
    with Tree(str(root), use_openat2=mode) as tree, pytest.raises(OSError):
        tree.read("/a" * (treeio.MAX_COMPONENTS + 1), 1)


def test_the_sysroot_fix_program_runs_on_python_3_6_with_the_standard_library() -> None:
    """What a sysroot's scripts embed: treeio, the selector parse and sysroot_fix, one
    stdlib-only program."""
    import ast
    import sys

    from auditor.render import sysroot_program

    source = sysroot_program()
    tree = ast.parse(source, feature_version=(3, 6))
    guarded = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try)
               for h in t.handlers for n in ast.walk(h)}
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module and id(n) not in guarded}
    assert imported <= set(sys.stdlib_module_names)


def test_without_proc_the_name_is_opened_again_and_checked(
    layout: tuple[Path, Path], mode: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where /proc is not mounted, a file is reopened by name below its directory; what is
    opened must be the inode that was checked, and a FIFO is still never waited on."""
    root, outside = layout
    real_open = os.open

    def no_proc(path: object, *args: object, **kwargs: object) -> int:
        if isinstance(path, str) and path.startswith("/proc/self/fd"):
            raise FileNotFoundError(errno.ENOENT, "no /proc here", path)
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", no_proc)
    monkeypatch.setattr(treeio, "_PROC_FD", [-1, -1])  # not yet looked for
    with Tree(str(root), use_openat2=mode) as tree:
        assert tree.read("/etc/hostname", 100) == b"inside\n"
        tree.write("/etc/hostname", b"changed\n")
        with pytest.raises(OSError):
            tree.read("/etc/fifo", 10)
        with pytest.raises(OSError):
            tree.read("/etc/abs", 10)
    assert (root / "etc/hostname").read_text() == "changed\n"
    assert (outside / "secret").read_text() == "SECRET\n"
    assert treeio._PROC_FD == [os.getpid(), -1]


def test_a_trailing_slash_or_dot_never_follows_the_last_component(
        layout: tuple[Path, Path], mode: bool | None) -> None:
    root, _ = layout
    with Tree(str(root), use_openat2=mode) as tree:
        for path in ("/etc/abs/", "/etc/abs/.", "etc//abs//", "./etc/./abs"):
            st = tree.lstat(path)
            assert st is not None and stat.S_ISLNK(st.st_mode), path
        st = tree.lstat("/etc/../etc/hostname")
        assert st is not None and stat.S_ISREG(st.st_mode)


def test_a_path_with_a_nul_byte_is_refused(layout: tuple[Path, Path], mode: bool | None) -> None:
    root, _ = layout
    with Tree(str(root), use_openat2=mode) as tree, pytest.raises(OSError) as raised:
        tree.open(b"/etc/hostname\0/x")
    assert raised.value.errno == errno.EINVAL


def test_a_forked_child_reopens_files_through_its_own_proc(layout: tuple[Path, Path]) -> None:
    """The held /proc/self/fd names the process that opened it: a child opens its own."""
    root, _ = layout
    with Tree(str(root)) as tree:
        assert tree.read_file(b"/etc", b"hostname", 100) == b"inside\n"
        parent = list(treeio._PROC_FD)
        assert parent[0] == os.getpid() and parent[1] >= 0
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through its exit status
            ok = False
            try:
                ok = (tree.read_file(b"/etc", b"hostname", 100) == b"inside\n"
                      and treeio._PROC_FD[0] == os.getpid() and treeio._PROC_FD != parent)
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
