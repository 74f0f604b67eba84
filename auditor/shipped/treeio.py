# ruff: noqa: UP031, UP035
"""Reach files inside a directory tree that someone else controls, never outside it.

A sysroot (a container's rootfs, an unpacked image, a capture from a ticket) is
owned by whoever made it, and it may change while it is read or fixed: any
component of any path may be, or become, a symlink, a FIFO or a device node.
:class:`Tree` opens every path relative to a file descriptor of the tree's root,
as if the root were ``/`` (a ``chroot``): symlinks are followed inside the tree,
absolute ones from its root, and ``..`` stops at the root.

- Where the kernel has it (Linux 5.6+), one ``openat2(2)`` call with
  ``RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`` resolves a path; the kernel refuses
  to leave the root even while the tree is renamed under it (it returns EAGAIN,
  and the path is tried again).
- Elsewhere (older kernels, a seccomp filter that refuses the call), the same is
  done component by component: ``openat(dirfd, name, O_PATH | O_NOFOLLOW)``, a
  symlink read with ``readlinkat`` and walked in the tree, ``..`` taken from the
  stack of directories already opened, never from the file system.
- The last component is never followed: a symlink there is an entry of its own.
  What is read or written must be a regular file; it is opened as ``O_PATH``
  first, checked with ``fstat``, and only then re-opened for reading or writing
  through ``/proc/self/fd`` (so a FIFO is never opened, which could hang, nor a
  device node, which could be the operator's disk). A file with more than one
  hard link is never written (it may be a name for a file outside the tree).

This module is sent as it is to remote hosts (with the collector and the
sysroot fix), so it imports only the standard library and keeps to what Python
3.6 accepts.
"""

import collections
import errno
import os
import stat
import threading
import weakref
from typing import Dict, List, Optional, Set, Tuple  # noqa: F401 - type comments

#: Symlinks followed in one path before giving up, as the kernel's limit (ELOOP).
MAX_LINKS = 40
#: Path components accepted in one path (a sysroot's deepest sysfs paths have ~15).
MAX_COMPONENTS = 256
#: Directories a tree keeps open (see :meth:`Tree.directory`): far below the usual limit
#: of 1024 descriptors a process may hold.
DIRECTORIES_KEPT = 256
#: The first read of a file asks for this much: a sysfs or /proc attribute is one page,
#: and asking for far more makes every read allocate (and free) a buffer that large.
FIRST_READ = 1 << 16
_O_PATH = getattr(os, "O_PATH", 0o10000000)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)

# openat2(2): the syscall number is 437 on every architecture that has it.
_SYS_OPENAT2 = 437
_RESOLVE_NO_XDEV = 0x01
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
#: How every path is resolved: inside the root, no /proc magic links, and never across a
#: mount point (a bind mount of the live /proc or /sys in an image's tree, a tracefs).
_RESOLVE = _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_XDEV
_FILES_AND_LINKS = (stat.S_IFREG, stat.S_IFLNK)
_CROSSING = "a mount point inside the tree is not crossed"


class _OpenAt2:
    """``openat2(2)`` through ctypes, or nothing where it cannot be called."""

    def __init__(self):
        # type: () -> None
        self.call = None  # type: Optional[object]
        try:
            import ctypes
        except ImportError:  # a Python built without ctypes: the component walk
            return

        class OpenHow(ctypes.Structure):
            _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                        ("resolve", ctypes.c_uint64)]

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            syscall = libc.syscall
        except (OSError, AttributeError):
            return
        syscall.restype = ctypes.c_long
        # syscall(2) is variadic; integer and pointer arguments pass as in a fixed call on
        # the ABIs Linux runs on, and declaring them spares building each on every call.
        syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p,
                            ctypes.c_size_t]
        self.ctypes = ctypes
        self.how = OpenHow
        self.size = ctypes.sizeof(OpenHow)
        # One open_how per set of flags, with its address (the kernel only reads it).
        self.hows = {}  # type: Dict[int, Tuple[object, int]]
        self.call = syscall

    def open(self, dirfd, path, flags):
        # type: (int, bytes, int) -> int
        built = self.hows.get(flags)
        if built is None:
            how = self.how(flags | _O_CLOEXEC, 0, _RESOLVE)
            built = self.hows[flags] = (how, self.ctypes.addressof(how))
        fd = self.call(_SYS_OPENAT2, dirfd, path, built[1], self.size)  # type: ignore
        if fd < 0:
            code = self.ctypes.get_errno()
            raise OSError(code, _CROSSING if code == errno.EXDEV else os.strerror(code),
                          os.fsdecode(path))
        return int(fd)


_OPENAT2 = None  # type: Optional[_OpenAt2]
#: None until probed; then whether openat2 with RESOLVE_IN_ROOT works here.
_HAVE_OPENAT2 = None  # type: Optional[bool]


def _openat2():
    # type: () -> Optional[_OpenAt2]
    global _OPENAT2
    if _OPENAT2 is None:
        _OPENAT2 = _OpenAt2()
    return _OPENAT2 if _OPENAT2.call is not None else None


def components(path):
    # type: (bytes) -> List[bytes]
    """Return the components of a path (empty ones and "." dropped), bounded in number."""
    parts = [p for p in path.split(b"/") if p and p != b"."]
    if len(parts) > MAX_COMPONENTS:
        raise OSError(errno.ENAMETOOLONG, "too many path components", os.fsdecode(path))
    return parts


def _close_tree(fd, dirs):
    # type: (int, collections.OrderedDict[bytes, List[int]]) -> None
    _close([fd] + [entry[0] for entry in dirs.values()])
    dirs.clear()


def _close(fds):
    # type: (List[int]) -> None
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


#: [the process it was opened in, a descriptor of its /proc/self/fd or -1 without /proc].
_PROC_FD = [-1, -1]
_PROC_FD_LOCK = threading.Lock()
#: This process's id, kept by a fork hook: ``os.getpid()`` is a system call (glibc keeps
#: no cache since 2.25), on every file read. None where Python has no fork hooks (3.6).
_PID = None  # type: Optional[List[int]]


def _forked():
    # type: () -> None
    if _PID is not None:
        _PID[0] = os.getpid()


if hasattr(os, "register_at_fork"):
    _PID = [os.getpid()]
    os.register_at_fork(after_in_child=_forked)


def _proc_fd():
    # type: () -> int
    """Return a held descriptor of this process's ``/proc/self/fd`` (-1 without /proc).

    Re-opening an ``O_PATH`` descriptor by its number there spares the kernel walking
    ``/proc/self`` for every file read. A forked child opens its own (the one it
    inherited names its parent's descriptors, and is left alone: its number may have
    been reused since).
    """
    pid = _PID[0] if _PID is not None else os.getpid()
    if _PROC_FD[0] == pid:
        return _PROC_FD[1]
    with _PROC_FD_LOCK:
        if _PROC_FD[0] != pid:
            try:
                fd = os.open("/proc/self/fd", os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
            except OSError:
                fd = -1
            _PROC_FD[1], _PROC_FD[0] = fd, pid
    return _PROC_FD[1]


def _open_magic(fd, flags):
    # type: (int, int) -> int
    """Open the very inode an ``O_PATH`` descriptor holds, through ``/proc/self/fd``
    (raise ENOENT where /proc is not mounted)."""
    proc = _proc_fd()
    if proc < 0:
        raise OSError(errno.ENOENT, "no /proc/self/fd")
    return os.open("%d" % fd, flags | _O_CLOEXEC, dir_fd=proc)


class Tree:
    """A directory tree opened once; every path below resolves inside it, as in a chroot.

    Paths are bytes or text, absolute or not, always taken from the tree's root.
    """

    def __init__(self, root, use_openat2=None):
        # type: (str, Optional[bool]) -> None
        # The root itself is the operator's own argument: followed once, then held. What
        # it is (is_live_root) and where it is (root) are taken from the descriptor, never
        # from the name again: the tree's owner may swap the name meanwhile.
        self.fd = os.open(root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        held = os.fstat(self.fd)
        #: The tree's own file system: the component walk never leaves it.
        self.dev = held.st_dev
        self.ino = held.st_ino
        # Its mount, for the component walk: a bind mount of the same file system has the
        # same st_dev (openat2 tells every mount apart itself).
        self.mount = _mount_id(self.fd)
        self.root = _held_path(self.fd) or os.path.realpath(root)
        self.use_openat2 = use_openat2
        # What resolves paths here (openat2, or None for the walk): probed on first use.
        self._impl = None  # type: Optional[_OpenAt2]
        self._probed = False
        # Directories resolved once (path -> [descriptor, users]), least recently used first.
        self._dirs = collections.OrderedDict()  # type: collections.OrderedDict[bytes, List[int]]
        self._dirs_lock = threading.Lock()
        # Directories read from once in the component walk: a second read from one keeps
        # it open (read_file).
        self._seen = set()  # type: Set[bytes]
        # Directories files were read from, with the path a name is appended to for
        # openat2 (the directory's path and a "/"), or b"" for one never handed to the
        # kernel as it is (a NUL byte, too many components) (read_file).
        self._bases = {}  # type: Dict[bytes, bytes]
        # A tree nobody closed gives its descriptors back when it is collected.
        self._finalizer = weakref.finalize(self, _close_tree, self.fd, self._dirs)

    def is_live_root(self):
        # type: () -> bool
        """Return whether the directory held is this machine's own ``/``."""
        st = os.stat("/")
        return (st.st_dev, st.st_ino) == (self.dev, self.ino)

    def _same_mount(self, fd, st=None):
        # type: (int, Optional[os.stat_result]) -> os.stat_result
        """Refuse a descriptor on another file system than the tree's (and close it): the
        component walk's mount check (openat2 refuses the crossing itself)."""
        if st is None:
            st = os.fstat(fd)
        if st.st_dev != self.dev or (self.mount is not None
                                     and _mount_id(fd) not in (self.mount, None)):
            os.close(fd)
            raise OSError(errno.EXDEV, _CROSSING)
        return st

    def close(self):
        # type: () -> None
        """Close the tree's root descriptor and the directories it kept open."""
        self._finalizer()
        self.fd = -1

    def __enter__(self):
        # type: () -> Tree
        return self

    def __exit__(self, *exc):
        # type: (object) -> None
        self.close()

    # -- resolution ---------------------------------------------------------------------

    def _kernel(self):
        # type: () -> Optional[_OpenAt2]
        if not self._probed:
            self._impl = self._probe()
            self._probed = True
        return self._impl

    def _probe(self):
        # type: () -> Optional[_OpenAt2]
        global _HAVE_OPENAT2
        if self.use_openat2 is False:
            return None
        impl = _openat2()
        if impl is None:
            return None
        if _HAVE_OPENAT2 is None:
            try:
                os.close(impl.open(self.fd, b".", _O_PATH))
                _HAVE_OPENAT2 = True
            except OSError:
                # ENOSYS (before 5.6), EPERM (a seccomp filter), EINVAL or E2BIG (an
                # older struct): the component walk does the same in user space.
                _HAVE_OPENAT2 = False
        return impl if _HAVE_OPENAT2 else None

    def _walk(self, parts, flags, follow=False):
        # type: (List[bytes], int, bool) -> int
        """Open ``parts`` below the root in user space: a symlink's target is walked in the
        tree, ``..`` pops the directories opened so far; the last part is followed only
        with ``follow``."""
        stack = [os.dup(self.fd)]
        pending = list(parts)
        hops = 0
        try:
            while pending:
                part = pending.pop(0)
                if part == b"..":
                    if len(stack) > 1:
                        os.close(stack.pop())
                    continue
                last = not pending
                fd = os.open(part, _O_PATH | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=stack[-1])
                mode = self._same_mount(fd).st_mode
                if stat.S_ISLNK(mode) and (follow or not last):
                    try:
                        target = os.readlink(part, dir_fd=stack[-1])
                    finally:
                        os.close(fd)
                    hops += 1
                    if hops > MAX_LINKS:
                        raise OSError(errno.ELOOP, "too many levels of symbolic links")
                    if target.startswith(b"/"):
                        _close(stack[1:])
                        del stack[1:]
                    pending = components(target) + pending
                    if len(pending) > MAX_COMPONENTS:
                        raise OSError(errno.ENAMETOOLONG, "too many path components")
                    continue
                if last:
                    if flags & _O_PATH:
                        return fd
                    try:
                        return os.open(part, flags | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=stack[-1])
                    finally:
                        os.close(fd)
                if not stat.S_ISDIR(mode):
                    os.close(fd)
                    raise OSError(errno.ENOTDIR, "not a directory")
                stack.append(fd)
            # The root itself (an empty path, or one that ".." brought back to it).
            return os.open(".", flags | _O_CLOEXEC, dir_fd=stack[-1])
        finally:
            _close(stack)

    def open(self, path, flags=_O_PATH, follow=False):
        # type: (object, int, bool) -> int
        """Return a descriptor of ``path`` in the tree, its last component not followed
        (unless ``follow``: then a symlink there is followed, inside the tree too).

        ``flags`` are ``os.open`` flags (``O_PATH`` by default).
        """
        raw = path if isinstance(path, bytes) else os.fsencode(str(path))
        if b"\0" in raw:
            # Never a file name; and ctypes would end the path at the NUL.
            raise OSError(errno.EINVAL, "a path with a NUL byte", os.fsdecode(raw))
        kernel = self._kernel()
        if kernel is not None:
            if (b"/." in raw or b"//" in raw or raw.endswith(b"/") or raw.startswith(b".")
                    or raw.count(b"/") > MAX_COMPONENTS):
                # "." and empty components dropped, so the last one named is never
                # followed (a trailing "/" or "/." would make the kernel follow it).
                relative = b"/".join(components(raw)) or b"."
            else:
                relative = raw.lstrip(b"/") or b"."  # a plain path, as checks name them
            for _ in range(8):
                try:
                    return kernel.open(self.fd, relative, flags | (0 if follow else _O_NOFOLLOW))
                except OSError as exc:
                    if exc.errno != errno.EAGAIN:
                        raise
            # The tree keeps being renamed under the resolution: walk it instead.
        return self._walk(components(raw), flags, follow)

    def parent(self, path):
        # type: (object) -> Tuple[int, bytes]
        """Return (an O_PATH descriptor of the directory holding ``path``, its last name).

        The name is never "", "." or "..": a path that ends so has no entry of its own.
        """
        raw = path if isinstance(path, bytes) else os.fsencode(str(path))
        parts = components(raw)
        if not parts or parts[-1] == b"..":
            raise OSError(errno.EINVAL, "no name to operate on", os.fsdecode(raw))
        fd = self.open(b"/".join(parts[:-1]), _O_PATH | _O_DIRECTORY)
        return fd, parts[-1]

    def hold(self, path):
        # type: (bytes) -> int
        """Return an ``O_PATH`` descriptor of a directory of the tree, every symlink on the
        way followed inside it (as :meth:`open`), for ``*at`` calls of names in it; give it
        back with :meth:`release`.

        Reading many files of one directory resolves it once: the descriptor is kept (the
        last :data:`DIRECTORIES_KEPT` used), and one held is never closed. A directory
        whose parent is kept is opened from it, one component with ``O_NOFOLLOW`` (a
        symlink there, or ``..``, is resolved from the root instead). A name opened
        relative to a held descriptor with ``O_NOFOLLOW`` cannot leave the tree: the
        descriptor is the directory itself, whatever happens to the path that led to it.
        """
        with self._dirs_lock:
            entry = self._dirs.get(path)
            if entry is not None:
                self._dirs.move_to_end(path)
                entry[1] += 1
                return entry[0]
        fd = self._open_directory(path)
        with self._dirs_lock:
            entry = self._dirs.get(path)
            if entry is None:
                entry = self._dirs[path] = [fd, 1]
                self._trim()
            else:
                os.close(fd)
                entry[1] += 1
            return entry[0]

    def release(self, path):
        # type: (bytes) -> None
        """Give back a descriptor :meth:`hold` returned."""
        with self._dirs_lock:
            entry = self._dirs.get(path)
            if entry is not None:
                entry[1] -= 1
                self._trim()

    def _open_directory(self, path):
        # type: (bytes) -> int
        """Open a directory from its parent's kept descriptor (kept in turn), one
        component with ``O_NOFOLLOW``; a symlink or ``..`` on the way is resolved from the
        root inside the tree instead."""
        parent, _, name = path.rstrip(b"/").rpartition(b"/")
        if not name:
            return os.open(".", _O_PATH | _O_DIRECTORY | _O_CLOEXEC, dir_fd=self.fd)
        if name in (b".", b"..") or b"/.." in parent or b"/./" in parent + b"/":
            return self.open(path, _O_PATH | _O_DIRECTORY, follow=True)
        parent = parent or b"/"
        above = self.hold(parent)
        kernel = self._kernel()
        try:
            if kernel is not None:  # one name, never across a mount point
                return kernel.open(above, name, _O_PATH | _O_DIRECTORY | _O_NOFOLLOW)
            fd = os.open(name, _O_PATH | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC,
                         dir_fd=above)
            self._same_mount(fd)
            return fd
        except OSError as exc:
            # ELOOP or ENOTDIR: a symlink, resolved from the root inside the tree.
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
        finally:
            self.release(parent)
        return self.open(path, _O_PATH | _O_DIRECTORY, follow=True)

    def _trim(self):
        # type: () -> None
        """Close the least recently used directories nobody holds (the lock is held)."""
        excess = len(self._dirs) - DIRECTORIES_KEPT
        if excess <= 0:
            return
        victims = []  # type: List[bytes]
        for key, entry in self._dirs.items():  # oldest first
            if len(victims) >= excess:
                break
            if not entry[1]:
                victims.append(key)
        for key in victims:
            os.close(self._dirs.pop(key)[0])

    def lstat_at(self, dirfd, name):
        # type: (int, bytes) -> Optional[os.stat_result]
        """Return what ``name`` in a held directory is (not followed); None if missing."""
        try:
            return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ENAMETOOLONG):
                return None
            raise

    def read_file(self, parent, name, limit):
        # type: (bytes, bytes, int) -> Optional[bytes]
        """Read the regular file ``name`` of the directory ``parent`` of the tree; None
        when ``name`` is a symlink (the caller resolves it inside the tree).

        Where the kernel resolves paths (openat2), every file is opened by its whole path,
        one call; the directory's path is checked once (:meth:`open` checks each path).
        In the component walk, the first file read from a directory is opened by its whole
        path; from the second on, the directory is held (:meth:`hold`) and its files
        opened from it. Never opens a FIFO or device node.
        """
        if name.count(b"\0") or name.count(b"/") or name in (b"", b".", b".."):
            # Not a name of a file in ``parent``: the whole path, as :meth:`open` takes any.
            return self._read_opath(self.open(parent + b"/" + name), name, limit)
        kernel = self._kernel()
        if kernel is not None:
            base = self._bases.get(parent)
            if base is None:
                base = self._base(parent)
            if not base:
                return self._read_opath(self.open(parent + b"/" + name), name, limit)
            try:
                fd = kernel.open(self.fd, base + name, _O_PATH | _O_NOFOLLOW)
            except OSError as exc:
                if exc.errno != errno.EAGAIN:
                    raise
                fd = self.open(parent + b"/" + name)  # renamed under it: tried again
            return self._read_opath(fd, name, limit)
        if parent not in self._seen:
            if len(self._seen) > 65536:
                self._seen.clear()
            self._seen.add(parent)
            return self._read_opath(self.open(parent + b"/" + name), name, limit)
        dirfd = self.hold(parent)
        try:
            fd = os.open(name, _O_PATH | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dirfd)
        finally:
            self.release(parent)
        self._same_mount(fd)
        return self._read_opath(fd, name, limit)

    def _base(self, parent):
        # type: (bytes) -> bytes
        """Return the path a name in ``parent`` is appended to for openat2, or b"" where
        the directory's path is not one to hand the kernel (see :meth:`read_file`)."""
        # Only the last component must never be followed (a trailing "/" or "/." would
        # make the kernel follow it); the name appended is one, so the directory's own
        # ".", ".." and empty components resolve in the kernel, inside the root.
        ok = parent.count(b"\0") == 0 and parent.count(b"/") < MAX_COMPONENTS
        base = parent.rstrip(b"/") + b"/" if ok else b""
        if len(self._bases) > 65536:
            self._bases.clear()
        self._bases[parent] = base
        return base

    def _read_opath(self, fd, name, limit):
        # type: (int, bytes, int) -> Optional[bytes]
        """Read the regular file an ``O_PATH`` descriptor holds (and close it)."""
        try:
            st = os.fstat(fd)
            if st.st_dev != self.dev:
                raise OSError(errno.EXDEV, _CROSSING,
                              os.fsdecode(name))
            kind = stat.S_IFMT(st.st_mode)
            if kind != stat.S_IFREG:
                if kind == stat.S_IFLNK:
                    return None
                if kind == stat.S_IFDIR:
                    raise OSError(errno.EISDIR, "is a directory", os.fsdecode(name))
                raise OSError(errno.EPERM, "not a regular file", os.fsdecode(name))
            try:
                # The magic link names the very inode the O_PATH descriptor holds. Opened
                # without waiting: a file that would block (a tracefs pipe) says EAGAIN.
                opened = _open_magic(fd, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                    raise
                return None  # no /proc here: the caller's way reopens by name and checks
        finally:
            os.close(fd)
        try:
            # A file of the tree is a file on a disk: its size says how much to ask for, and
            # a read shorter than asked is its end (one more byte is asked, so growth shows).
            first = os.read(opened, min(limit, st.st_size + 1 if st.st_size else FIRST_READ))
            if len(first) <= st.st_size or not first:
                return first
            return first + read_fd(opened, limit - len(first))
        finally:
            os.close(opened)

    # -- reading ------------------------------------------------------------------------

    def lstat(self, path):
        # type: (object) -> Optional[os.stat_result]
        """Return what ``path`` is, its last component not followed; None if missing."""
        try:
            fd = self.open(path)
        except OSError as exc:
            # EXDEV (a mount point on the way) is an error, not a missing file.
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EACCES,
                             errno.ENAMETOOLONG):
                return None
            raise
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def readlink(self, path):
        # type: (object) -> bytes
        """Return a symlink's target (raise OSError if ``path`` is not a symlink)."""
        fd = self.open(path)
        try:
            if not stat.S_ISLNK(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a symbolic link", str(path))
            # readlinkat(fd, ""): the link the descriptor holds, whatever its name is now.
            return os.readlink(b"", dir_fd=fd)
        finally:
            os.close(fd)

    def stat(self, path):
        # type: (object) -> Optional[os.stat_result]
        """Return what ``path`` is, every symlink followed inside the tree; None if missing."""
        try:
            fd = self.open(path, follow=True)
        except OSError:
            return None
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def listdir(self, path, follow=False):
        # type: (object, bool) -> List[bytes]
        """Return the names in a directory (raw bytes); its last component is followed only
        with ``follow``."""
        fd = self.open(path, os.O_RDONLY | _O_DIRECTORY, follow)
        try:
            return [os.fsencode(name) for name in os.listdir(fd)]
        finally:
            os.close(fd)

    def _reopen(self, fd, flags, path):
        # type: (int, int, object) -> int
        """Open the very inode an O_PATH descriptor holds, with ``flags``.

        Through /proc/self/fd, which names that inode whatever happened to its path. Where
        /proc is not mounted, the name is opened again below its directory (O_NOFOLLOW,
        O_NONBLOCK: a FIFO swapped in meanwhile is not waited on) and the caller checks
        that it is the same inode.
        """
        try:
            return _open_magic(fd, flags)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise
        parent, name = self.parent(path)
        try:
            return os.open(name, flags | _O_NOFOLLOW | _O_CLOEXEC | os.O_NONBLOCK
                           | getattr(os, "O_NOCTTY", 0), dir_fd=parent)
        finally:
            os.close(parent)

    def open_regular(self, path, flags=os.O_RDONLY, single_link=False):
        # type: (object, int, bool) -> int
        """Open a regular file (never a FIFO, device, socket or symlink) with ``flags``."""
        fd = self.open(path)
        try:
            st = os.fstat(fd)
            if st.st_dev != self.dev:
                raise OSError(errno.EXDEV, _CROSSING,
                              str(path))
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL if stat.S_ISLNK(st.st_mode) else errno.EPERM,
                              "not a regular file", str(path))
            if single_link and st.st_nlink != 1:
                raise OSError(errno.EMLINK, "a file with other hard links is not changed",
                              str(path))
            opened = self._reopen(fd, flags, path)
        finally:
            os.close(fd)
        again = os.fstat(opened)
        if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) \
                or not stat.S_ISREG(again.st_mode):
            os.close(opened)
            raise OSError(errno.EAGAIN, "the file changed while it was opened", str(path))
        if flags & os.O_NONBLOCK == 0 and hasattr(os, "set_blocking"):
            os.set_blocking(opened, True)
        return opened

    def read(self, path, limit):
        # type: (object, int) -> bytes
        """Read at most ``limit`` bytes of a regular file (until EOF: sysfs sizes lie)."""
        # Without waiting: a file that would block (a tracefs pipe) fails with EAGAIN.
        fd = self.open_regular(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            return read_fd(fd, limit)
        finally:
            os.close(fd)

    # -- changing -----------------------------------------------------------------------

    def write(self, path, data, create_mode=None):
        # type: (object, bytes, Optional[int]) -> bool
        """Make a regular file hold ``data``, in place (its inode and mode kept).

        A missing file is created (exclusively) with ``create_mode`` when that is given.
        Return True when the file was created.
        """
        try:
            fd = self.open_regular(path, os.O_WRONLY | os.O_TRUNC, single_link=True)
            created = False
        except OSError as exc:
            if exc.errno != errno.ENOENT or create_mode is None:
                raise
            fd = self.create(path, create_mode)
            created = True
        try:
            write_fd(fd, data)
        finally:
            os.close(fd)
        return created

    def create(self, path, mode):
        # type: (object, int) -> int
        """Create a new regular file exclusively (nothing, not even a symlink, may be there)."""
        parent, name = self.parent(path)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC,
                         mode, dir_fd=parent)
        finally:
            os.close(parent)
        os.fchmod(fd, mode)  # exactly the mode asked for, whatever the umask
        return fd

    def mkdir(self, path, mode=0o755):
        # type: (object, int) -> None
        """Make one directory (its parent must exist)."""
        parent, name = self.parent(path)
        try:
            os.mkdir(name, mode, dir_fd=parent)
        finally:
            os.close(parent)

    def symlink(self, path, target):
        # type: (object, str) -> None
        """Make a symlink (nothing may be there); its target is never followed here."""
        parent, name = self.parent(path)
        try:
            os.symlink(target, name, dir_fd=parent)
        finally:
            os.close(parent)

    def unlink(self, path, kinds=_FILES_AND_LINKS):
        # type: (object, Tuple[int, ...]) -> bool
        """Remove a file or symlink (never a directory); return whether it was there."""
        parent, name = self.parent(path)
        try:
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                return False
            if stat.S_IFMT(st.st_mode) not in kinds:
                raise OSError(errno.EPERM, "not a file the fix made", str(path))
            os.unlink(name, dir_fd=parent)
            return True
        finally:
            os.close(parent)

    def rmdir(self, path):
        # type: (object) -> bool
        """Remove an empty directory; return False when it is gone or not empty."""
        try:
            parent, name = self.parent(path)
        except OSError:
            return False
        try:
            os.rmdir(name, dir_fd=parent)
            return True
        except OSError:
            return False
        finally:
            os.close(parent)


def _mount_id(fd):
    # type: (int) -> Optional[int]
    """Return the id of the mount a descriptor is on (``/proc/self/fdinfo``), or None."""
    try:
        with open("/proc/self/fdinfo/%d" % fd, "rb") as handle:
            info = handle.read(4096)
    except OSError:
        return None
    for line in info.splitlines():
        if line.startswith(b"mnt_id:"):
            try:
                return int(line.split(b":", 1)[1])
            except ValueError:
                return None
    return None


def _held_path(fd):
    # type: (int) -> Optional[str]
    """Return the path of the directory a descriptor holds, as the kernel names it now."""
    try:
        path = os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        return None
    return path if path.startswith("/") and not path.endswith(" (deleted)") else None


def read_fd(fd, limit):
    # type: (int, int) -> bytes
    """Read from a descriptor until EOF or ``limit`` bytes."""
    chunks = []  # type: List[bytes]
    size = 0
    ask = FIRST_READ
    while size < limit:
        chunk = os.read(fd, min(limit - size, ask))
        ask = 1 << 20
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def write_fd(fd, data):
    # type: (int, bytes) -> None
    """Write all of ``data`` to a descriptor."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
