"""Write the files the tool makes (``-o``, fix and rollback scripts, captures), never through
a path another user controls.

A report is often written where others may write too (``/tmp``, a shared results
directory), and often as root. :func:`write_file` therefore:

- opens the target's directory once and works relative to that descriptor;
- never follows a symlink at the target that another user owns (a symlink of our own
  is followed, its target checked the same way), and never writes onto anything but a
  regular file: a device node, a FIFO, a socket or a directory there is refused;
- writes a new file under a random name made with ``O_CREAT | O_EXCL | O_NOFOLLOW``
  beside the target, syncs it, and renames it over the target, so a reader never sees
  half a file; the rename is done only where nobody else may rename or remove our
  entries: a directory writable by no other user, or a sticky one (``/tmp``);
- refuses a directory that another user may change otherwise (writable by others, or by
  a group not our own or root's, without the sticky bit; or owned by another user than
  us or root).

Every refusal is an :class:`UnsafeOutput` (an OSError) with one line saying why.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterable

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: Symlinks of our own followed from one target before giving up (the kernel's limit).
_MAX_LINKS = 40


class UnsafeOutput(OSError):
    """The target of a write is one the tool must not write (a line says why)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EPERM, message)
        self.strerror = message


def _directory_is_safe(st: os.stat_result, directory: str) -> None:
    """Refuse a directory whose entries another user may rename or remove."""
    me = os.geteuid()
    if st.st_uid not in (0, me):
        raise UnsafeOutput(f"the directory {directory} belongs to another user (uid "
                           f"{st.st_uid}): refused")
    # A directory writable by its group is ours alone when the group is our own (a user's
    # private group, umask 002) or root's.
    group_shared = st.st_mode & 0o020 and st.st_gid not in (0, os.getegid())
    if (st.st_mode & 0o002 or group_shared) and not st.st_mode & stat.S_ISVTX:
        raise UnsafeOutput(f"the directory {directory} may be changed by other users (mode "
                           f"{stat.S_IMODE(st.st_mode):04o}, not sticky): refused")


def _open_directory(directory: str) -> int:
    """Open a directory component by component, following only symlinks that root or we
    own (``/var/run``; never a link another user planted on the way), and check it."""
    fd = os.open("/" if directory.startswith("/") else ".", _DIR_FLAGS)
    pending = [p for p in directory.split("/") if p and p != "."]
    hops = 0
    try:
        while pending:
            part = pending.pop(0)
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    if st.st_uid not in (0, os.geteuid()):
                        raise UnsafeOutput(f"{directory}: {part} is a symlink of another user "
                                           f"(uid {st.st_uid}): not followed")
                    hops += 1
                    if hops > _MAX_LINKS:
                        raise OSError(errno.ELOOP, "too many levels of symbolic links")
                    target = os.readlink(part, dir_fd=fd)
                    if target.startswith("/"):
                        os.close(fd)
                        fd = os.open("/", _DIR_FLAGS)
                    pending[:0] = [p for p in target.split("/") if p and p != "."]
                    continue
                opened = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except UnsafeOutput:
                raise
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, directory) from None
            os.close(fd)
            fd = opened
        _directory_is_safe(os.fstat(fd), directory or ".")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _resolve(path: str) -> tuple[int, str, os.stat_result | None]:
    """Return (a descriptor of the target's directory, its name there, what is there now),
    following only our own symlinks."""
    for _ in range(_MAX_LINKS):
        directory, name = os.path.split(path)
        if not name or name in (".", ".."):
            raise UnsafeOutput(f"{path} names no file")
        dirfd = _open_directory(directory)
        try:
            existing = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError:
            return dirfd, name, None
        except BaseException:
            os.close(dirfd)
            raise
        if not stat.S_ISLNK(existing.st_mode):
            if not stat.S_ISREG(existing.st_mode):
                os.close(dirfd)
                raise UnsafeOutput(f"{path} is not a regular file ({_kind(existing)}): "
                                   "refused")
            return dirfd, name, existing
        try:
            if existing.st_uid != os.geteuid():
                raise UnsafeOutput(f"{path} is a symlink of another user (uid "
                                   f"{existing.st_uid}): not followed")
            target = os.readlink(name, dir_fd=dirfd)
        finally:
            os.close(dirfd)
        path = os.path.join(directory, target)
    raise OSError(errno.ELOOP, "too many levels of symbolic links", path)


def _kind(st: os.stat_result) -> str:
    mode = st.st_mode
    for test, word in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return word
    return "not a file"


def write_file(path: str, data: bytes | Iterable[bytes], mode: int | None = None) -> None:
    """Make ``path`` hold ``data`` whole, never writing through another user's path.

    The new file gets ``mode`` (default: ``0o666`` less the umask, so a collector running
    as another user can read a report). Raise OSError (:class:`UnsafeOutput` for a target
    that is refused).
    """
    if mode is None:
        umask = os.umask(0o022)
        os.umask(umask)
        mode = 0o666 & ~umask
    dirfd, name, existing = _resolve(path)
    try:
        temporary = f".{name[:200]}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
        except PermissionError:
            if existing is None:
                raise
            # A file we may write in a directory we may not: written in place.
            _write_in_place(dirfd, name, existing, data)
            return
        try:
            try:
                _write_all(fd, data)
                os.fchmod(fd, mode)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temporary, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        except BaseException:
            try:
                os.unlink(temporary, dir_fd=dirfd)
            except OSError:
                pass
            raise
        try:
            os.fsync(dirfd)
        except OSError:
            pass  # a directory some file systems cannot sync: the file is whole anyway
    finally:
        os.close(dirfd)


def write_text(path: str, text: str, mode: int | None = None) -> None:
    """Write text (UTF-8) as :func:`write_file` does."""
    write_file(path, text.encode("utf-8"), mode)


def _write_in_place(dirfd: int, name: str, existing: os.stat_result,
                    data: bytes | Iterable[bytes]) -> None:
    """Rewrite the regular file found at ``name`` (the same one: its inode is checked)."""
    fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                 | os.O_CLOEXEC, dir_fd=dirfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (existing.st_dev,
                                                                      existing.st_ino):
            raise UnsafeOutput(f"{name} changed while it was opened: refused")
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | Iterable[bytes]) -> None:
    for chunk in (data,) if isinstance(data, bytes) else data:
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]
