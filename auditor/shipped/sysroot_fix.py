# ruff: noqa: UP031, UP035
"""Apply a fix plan to a sysroot directory, and roll it back: never outside the sysroot.

A sysroot (a container's rootfs, an image being prepared) may belong to someone
else and change while it is fixed. bash can only open a file by its name, so a
symlink swapped in between a check and a write sends the write wherever the
link points. The fix and rollback scripts of a sysroot therefore hand their plan
to this program (run by the host's own ``python3``, nothing installed there),
which:

- opens every path through :class:`treeio.Tree`: relative to a descriptor of the
  sysroot's root, symlinks followed only inside it, the last component never
  followed; reads and writes regular files only (a FIFO or device node where a
  file is expected fails the step, it is never opened), and never writes a file
  with other hard links;
- keeps its state (old values, backups, the directories it made, a copy of the
  rollback) on the side of whoever runs it, never in the sysroot: below
  ``/var/lib/host-auditor/sysroots/`` as root, else
  ``$XDG_STATE_HOME/host-auditor/sysroots/`` (``~/.local/state``), or
  ``$HOST_AUDITOR_STATE_DIR``; one directory per sysroot, named by a hash of its
  real path, and in it one per fix, made with ``mkdir`` (exclusive) and mode 0700.
  A state directory is used only when it is a directory owned by the user running
  the fix and writable by nobody else;
- writes each state file whole (a temporary name, fsync, then its name) and keeps
  with each backup a record of its size and digest, and of the file's inode, owner
  and mode: a backup that is not whole is never trusted, and the rollback writes
  back only onto the inode the fix left (a file made again after its removal is
  its old owner's, never setuid or setgid);
- checks the host name and (a salted hash of) the machine-id the audit saw before
  it changes anything.

It keeps to what Python 3.6 accepts and imports only the standard library: it is
sent to remote hosts (``audit host --root DIR --apply``) after :mod:`treeio`.

Exit status: 0 done (or nothing to do), 1 a step failed (the rest went on; the
state is kept for the rollback), 2 refused before any change (another host, a
bad root, a state directory that is not safe).
"""

import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import struct
import sys
from typing import Any, Dict, List, Optional, Set, Tuple  # noqa: F401 - type comments

try:
    # Sent to a remote host, this program follows treeio's source and the selector parse of
    # auditor.parsing (auditor.render.sysroot_program).
    Tree  # noqa: B018
except NameError:
    from auditor.parsing import parse_selector, select_word
    from auditor.shipped.treeio import Tree, read_fd, write_fd

PLAN_FORMAT = 2  # 2: each action names its fix and undo verbs
STATE_ENV = "HOST_AUDITOR_STATE_DIR"
#: The most bytes of one file a step reads or edits (config files and kernel values).
MAX_FILE = 16 << 20
#: The most bytes of the guard files read (/etc/hostname, /etc/machine-id).
MAX_GUARD = 64 << 10
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
_REGISTER = re.compile(r"(?:(E?CAP)_([A-Z]+)\+)?([0-9a-fA-F]{1,3})\.([bwl])\Z")
_HEX = re.compile(r"[0-9a-fA-F]{1,8}\Z")
#: PCI capability ids setpci knows by name (pciutils lib/header.h), those a fix may use.
_CAPABILITIES = {"PM": 0x01, "MSI": 0x05, "EXP": 0x10, "MSIX": 0x11}
#: Extended capability ids setpci knows by name (``ECAP_...``), those a fix may use.
_EXTENDED = {"AER": 0x0001, "ACS": 0x000D, "REBAR": 0x0015}
_WIDTHS = {"b": 1, "w": 2, "l": 4}
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class Refused(Exception):
    """The fix must not run here at all (exit 2, nothing changed)."""


class StepFailed(Exception):
    """One step could not be done; the others go on (exit 1)."""


def say(message):
    # type: (str) -> None
    sys.stdout.write("host-auditor: %s\n" % message)
    sys.stdout.flush()


def warn(message):
    # type: (str) -> None
    sys.stderr.write("host-auditor: warning: %s\n" % message)
    sys.stderr.flush()


def show(value):
    # type: (object) -> str
    """Return a value as a log line shows it: as it is, or bash-quoted ($'...') where it
    holds a control character (a newline, an escape sequence)."""
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)
    if not _CONTROL.search(text):
        return text
    out = []
    for char in text:
        if char in "\\'":
            out.append("\\" + char)
        elif _CONTROL.match(char):
            out.append("\\x%02x" % ord(char) if ord(char) < 0x100 else "\\u%04x" % ord(char))
        else:
            out.append(char)
    return "$'" + "".join(out) + "'"


def first_line(text):
    # type: (str) -> str
    """Return the first line of a text with its blanks trimmed ("" if none)."""
    lines = text.strip().splitlines()
    return lines[0].strip() if lines else ""


def machine_id_digest(salt, machine_id):
    # type: (str, str) -> str
    """Return the salted hash of a machine-id that a fix's guard compares."""
    return hashlib.sha256(("%s:%s" % (salt, machine_id)).encode("utf-8")).hexdigest()


def state_base():
    # type: () -> str
    """Return where this user keeps the state of sysroot fixes."""
    configured = os.environ.get(STATE_ENV)
    if configured:
        return os.path.abspath(configured)
    if os.geteuid() == 0:
        return "/var/lib/host-auditor/sysroots"
    home = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"),
                                                              ".local", "state")
    return os.path.join(os.path.abspath(home), "host-auditor", "sysroots")


def state_key(real_root):
    # type: (str) -> str
    """Return the name of a sysroot's state directory: a hash of its real path."""
    return hashlib.sha256(os.fsencode(real_root)).hexdigest()[:32]


def state_dir(real_root, fix_id):
    # type: (str, str) -> str
    """Return where a fix of the sysroot at ``real_root`` keeps its state here."""
    return os.path.join(state_base(), state_key(real_root), fix_id)


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) \
    | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _own_dir(path, parent_fd=None, create=False):
    # type: (str, Optional[int], bool) -> int
    """Open a directory of the state (making it, mode 0700, when asked); refuse one that
    is a symlink, owned by someone else or writable by others."""
    if create:
        try:
            os.mkdir(path, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(path, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        raise Refused("state directory %s: %s" % (show(path), exc.strerror)) from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise Refused("state directory %s is not this user's alone (owner uid %d, mode %o): "
                      "refused" % (show(path), st.st_uid, stat.S_IMODE(st.st_mode)))
    return fd


class State:
    """The state of one fix of one sysroot, on the side of whoever runs it."""

    def __init__(self, real_root, fix_id):
        # type: (str, str) -> None
        self.real_root = real_root
        self.fix_id = fix_id
        self.path = state_dir(real_root, fix_id)
        self.key_fd = -1
        self.fd = -1

    def open_key(self, create):
        # type: (bool) -> bool
        """Open (or make) this sysroot's directory and lock it; False if it is not there."""
        base = state_base()
        if create:
            missing = []
            probe = base
            while not os.path.isdir(probe):
                missing.append(probe)
                probe = os.path.dirname(probe)
            for path in reversed(missing):
                try:
                    os.mkdir(path, 0o700)
                except FileExistsError:
                    pass
        elif not os.path.isdir(base):
            return False
        base_fd = _own_dir(base)
        try:
            key = state_key(self.real_root)
            if not create:
                try:
                    os.stat(key, dir_fd=base_fd, follow_symlinks=False)
                except FileNotFoundError:
                    return False
            self.key_fd = _own_dir(key, base_fd, create)
        finally:
            os.close(base_fd)
        # One fix or rollback of a sysroot at a time.
        fcntl.flock(self.key_fd, fcntl.LOCK_EX)
        return True

    def exists(self):
        # type: () -> bool
        """Return whether this fix has state (it changed something); open it if so."""
        if self.fd >= 0:
            return True
        if self.key_fd < 0 and not self.open_key(create=False):
            return False
        try:
            os.stat(self.fix_id, dir_fd=self.key_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        self.fd = _own_dir(self.fix_id, self.key_fd)
        recorded = self.read("root")
        if recorded is None or recorded.decode("utf-8", "surrogateescape") != self.real_root:
            raise Refused("state directory %s belongs to another sysroot" % show(self.path))
        return True

    def init(self, rollback):
        # type: (Optional[bytes]) -> None
        """Make the state directory before the first change (exclusively), with the root's
        path and a copy of the rollback."""
        if self.exists():
            if rollback is not None and not self.has("rollback.sh"):
                self.write_new("rollback.sh", rollback, 0o700)  # a first run cut short
            return
        if self.key_fd < 0:
            self.open_key(create=True)
        os.mkdir(self.fix_id, 0o700, dir_fd=self.key_fd)
        self.fd = _own_dir(self.fix_id, self.key_fd)
        self.write_new("root", os.fsencode(self.real_root))
        if rollback is not None:
            self.write_new("rollback.sh", rollback, 0o700)
        say("state and rollback.sh kept in %s (outside the sysroot)" % show(self.path))

    def has(self, name):
        # type: (str) -> bool
        if self.fd < 0:
            return False
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False

    def read(self, name):
        # type: (str) -> Optional[bytes]
        try:
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise Refused("state file %s/%s is not a regular file" % (show(self.path), name))
            return read_fd(fd, MAX_FILE + 1)
        finally:
            os.close(fd)

    def write_new(self, name, data, mode=0o600):
        # type: (str, bytes, int) -> None
        """Keep ``data`` under a new ``name``, whole or not at all.

        The bytes go to a temporary name first, are synced, and only then take ``name``
        (a hard link: ``name`` must not exist yet): a file cut short (ENOSPC, a crash) is
        never found under ``name``, so a re-run or a rollback never takes it for a backup.
        """
        temporary = ".new-%s-%s" % (name, os.urandom(6).hex())
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode,
                     dir_fd=self.fd)
        try:
            try:
                write_fd(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(temporary, name, src_dir_fd=self.fd, dst_dir_fd=self.fd,
                        follow_symlinks=False)
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
                    raise
                # A file system without hard links: the name must still be new.
                if self.has(name):
                    raise FileExistsError(errno.EEXIST, "state file exists", name) from None
                os.rename(temporary, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        finally:
            try:
                os.unlink(temporary, dir_fd=self.fd)
            except OSError:
                pass
        os.fsync(self.fd)

    def write_record(self, name, record):
        # type: (str, Dict[str, Any]) -> None
        """Keep a small JSON record (written whole, see :meth:`write_new`)."""
        self.write_new(name, json.dumps(record, sort_keys=True).encode("ascii"))

    def read_record(self, name):
        # type: (str) -> Optional[Dict[str, Any]]
        """Return a record :meth:`write_record` kept, None if there is none; refuse one that
        is not whole."""
        raw = self.read(name)
        if raw is None:
            return None
        try:
            record = json.loads(raw.decode("ascii"))
        except ValueError:
            record = None
        if not isinstance(record, dict):
            raise StepFailed("state file %s/%s is not whole: not trusted" % (show(self.path),
                                                                             name))
        return record

    def write_backup(self, name, data, record):
        # type: (str, bytes, Dict[str, Any]) -> None
        """Keep ``data`` under ``name`` and, last, its record with its size and digest:
        the record's presence says the backup is whole."""
        self.write_new(name, data)
        record = dict(record, size=len(data), sha256=hashlib.sha256(data).hexdigest())
        self.write_record(name + ".meta", record)

    def read_backup(self, name):
        # type: (str) -> Optional[Tuple[bytes, Dict[str, Any]]]
        """Return a backup and its record, None if there is none; refuse one whose bytes
        are not those its record describes (cut short, or changed since)."""
        record = self.read_record(name + ".meta")
        if record is None:
            if self.has(name):
                raise StepFailed("state file %s/%s has no record (cut short?): not trusted"
                                 % (show(self.path), name))
            return None
        data = self.read(name)
        if data is None or len(data) != record.get("size") \
                or hashlib.sha256(data).hexdigest() != record.get("sha256"):
            raise StepFailed("state file %s/%s is not the backup its record describes (cut "
                             "short or changed): not trusted" % (show(self.path), name))
        return data, record

    def discard(self, name):
        # type: (str) -> None
        """Remove a state file (a backup left unfinished by an earlier run)."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass

    def save_once(self, name, data):
        # type: (str, bytes) -> None
        """Keep ``data`` under ``name`` unless a first run kept it whole already."""
        if self.has(name + ".meta"):
            return
        self.discard(name)  # an earlier run stopped before its record: nothing changed since
        self.write_backup(name, data, {})

    def append(self, name, data):
        # type: (str, bytes) -> None
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NOFOLLOW, 0o600,
                     dir_fd=self.fd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise Refused("state file %s/%s is not a regular file" % (show(self.path), name))
            write_fd(fd, data)
        finally:
            os.close(fd)

    def remove(self):
        # type: () -> None
        """Remove this fix's state directory, then the sysroot's if it is empty."""
        if self.fd < 0:
            return
        for name in os.listdir(self.fd):
            os.unlink(name, dir_fd=self.fd)
        os.close(self.fd)
        self.fd = -1
        os.rmdir(self.fix_id, dir_fd=self.key_fd)
        try:
            base_fd = _own_dir(state_base())
        except Refused:
            return
        try:
            os.rmdir(state_key(self.real_root), dir_fd=base_fd)
        except OSError:
            pass  # another fix of this sysroot keeps its state there
        finally:
            os.close(base_fd)

    def close(self):
        # type: () -> None
        for fd in (self.fd, self.key_fd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.key_fd = -1


#: FS_IOC_GETVERSION, _IOR('v', 1, long) (linux/fs.h) as x86 and arm number it.
_FS_IOC_GETVERSION = (2 << 30) | (struct.calcsize("l") << 16) | (ord("v") << 8) | 1


def _generation(fd):
    # type: (int) -> Optional[int]
    """Return an open file's inode generation, or None where the file system has none.

    An inode number is reused as soon as its file is removed: a file the tenant made
    after removing the fixed one often gets its number. The generation (ext4, XFS, btrfs,
    tmpfs) tells them apart.
    """
    try:
        buffer = bytearray(8)
        fcntl.ioctl(fd, _FS_IOC_GETVERSION, buffer)
    except (OSError, ValueError):
        return None
    return int(struct.unpack("=I", bytes(buffer[:4]))[0])


def _identity(st, fd=-1):
    # type: (os.stat_result, int) -> Dict[str, Any]
    """Return what identifies a file and what it may do: its inode (and the inode's
    generation, given an open descriptor), owner and mode."""
    record = {"dev": st.st_dev, "ino": st.st_ino, "uid": st.st_uid, "gid": st.st_gid,
              "mode": stat.S_IMODE(st.st_mode)}  # type: Dict[str, Any]
    generation = _generation(fd) if fd >= 0 else None
    if generation is not None:
        record["gen"] = generation
    return record


def _int(record, key):
    # type: (Dict[str, Any], str) -> int
    value = record.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise StepFailed("the saved state lacks the file's %s: not restored" % key)
    return value


def _same(st, record, fd=-1):
    # type: (os.stat_result, Dict[str, Any], int) -> bool
    """Return whether ``st`` (of the open ``fd``) is the inode a record names."""
    if (st.st_dev, st.st_ino) != (_int(record, "dev"), _int(record, "ino")):
        return False
    if "gen" in record and fd >= 0:
        return bool(_generation(fd) == record["gen"])
    return True


# -- text edits, byte for byte as the live host's bash does them ---------------------------


def _lines(data):
    # type: (bytes) -> List[Tuple[int, int, int]]
    """Return (start, end of text, end with its newline) of each line of ``data``."""
    found = []
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        if end < 0:
            found.append((start, len(data), len(data)))
            break
        found.append((start, end, end + 1))
        start = end + 1
    return found


def line_at(data, number):
    # type: (bytes, int) -> bytes
    """Return line ``number`` (1-based) without its newline; b"" past the end."""
    lines = _lines(data)
    if 1 <= number <= len(lines):
        start, end, _ = lines[number - 1]
        return data[start:end]
    return b""


def _offset_after(data, count):
    # type: (bytes, int) -> int
    """Return where the text after the first ``count`` lines starts."""
    lines = _lines(data)
    if count <= 0:
        return 0
    if count >= len(lines):
        return len(data)
    return lines[count - 1][2]


def replaced_line(data, number, new):
    # type: (bytes, int, bytes) -> bytes
    """Return ``data`` with line ``number`` replaced by ``new`` (and a newline)."""
    return data[:_offset_after(data, number - 1)] + new + b"\n" + data[_offset_after(data,
                                                                                      number):]


def inserted_line(data, after, text):
    # type: (bytes, int, bytes) -> bytes
    """Return ``data`` with ``text`` (and a newline) inserted after line ``after``."""
    head = data[:_offset_after(data, after)]
    if after > 0 and head and not head.endswith(b"\n"):
        head += b"\n"  # the anchor was a last line without a newline of its own
    return head + text + b"\n" + data[_offset_after(data, after):]


def strip_newline(data):
    # type: (bytes) -> bytes
    return data[:-1] if data.endswith(b"\n") else data


# -- PCI config space ------------------------------------------------------------------------


def capability_offset(config, cap_id):
    # type: (bytes, int) -> Optional[int]
    """Return where capability ``cap_id`` starts in config space, or None.

    The kernel's walk (drivers/pci/pci.c, ``__pci_find_next_cap_ttl``): a pointer under
    0x40 or an id of 0xff ends the list; pciutils' setpci walks alike from 0x34. A list
    the audit's decoder (checks/lib/pci.py) would refuse is never written through: a
    loop, or a header other than a device's or a bridge's (a CardBus bridge keeps its
    list at 0x14 for the kernel but at 0x34 for setpci)."""
    if len(config) < 0x40 or not (config[0x06] | config[0x07] << 8) & 0x10:
        return None  # no capability list
    if config[0x0E] & 0x7F not in (0, 1):
        return None
    where = config[0x34] & ~3
    seen = set()
    while where >= 0x40 and where + 1 < len(config):
        if where in seen:
            return None  # a loop: the decoder refuses the list, the fixer writes nothing
        seen.add(where)
        found, where_next = config[where], config[where + 1] & ~3
        if found == 0xFF:
            return None
        if found == cap_id:
            return where
        where = where_next
    return None


def extended_capability_offset(config, cap_id):
    # type: (bytes, int) -> Optional[int]
    """Return where extended capability ``cap_id`` starts (pciutils' walk from 0x100)."""
    where = 0x100
    seen = set()  # type: Set[int]
    while where and where not in seen and where + 4 <= len(config) and len(seen) < 1024:
        seen.add(where)
        header = int.from_bytes(config[where:where + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == cap_id:
            return where
        where = (header >> 20) & 0xFFC
        if where and where < 0x100:
            return None
    return None


def register_span(config, register):
    # type: (bytes, str) -> Tuple[int, int]
    """Return (offset, width) of a setpci register name: ``CAP_EXP+08.w``, ``ECAP_ACS+06.w``."""
    match = _REGISTER.match(register)
    table = _EXTENDED if match is not None and match.group(1) == "ECAP" else _CAPABILITIES
    if match is None or (match.group(2) and match.group(2) not in table):
        raise StepFailed("register %s is not one this fix knows" % show(register))
    offset = int(match.group(3), 16)
    width = _WIDTHS[match.group(4)]
    if match.group(2):
        if match.group(1) == "ECAP":
            base = extended_capability_offset(config, table[match.group(2)])
        else:
            base = capability_offset(config, table[match.group(2)])
        if base is None:
            raise StepFailed("no %s_%s capability in config space"
                             % (match.group(1), match.group(2)))
        offset += base
    if offset + width > len(config):
        raise StepFailed("register %s lies past the config space read" % show(register))
    return offset, width


# -- the fix and the rollback ------------------------------------------------------------------


class Applier:
    """Run the steps of one plan on one sysroot."""

    def __init__(self, tree, plan, state, rollback=None):
        # type: (Tree, Dict[str, Any], State, Optional[bytes]) -> None
        self.tree = tree
        self.plan = plan
        self.state = state
        self.rollback_text = rollback
        self.failures = 0

    # helpers ---------------------------------------------------------------------------

    def fail(self, message):
        # type: (str) -> None
        warn(message)
        self.failures += 1

    def regular(self, path, missing_ok=False):
        # type: (str, bool) -> Optional[os.stat_result]
        st = self.tree.lstat(path)
        if st is None:
            if missing_ok:
                return None
            raise StepFailed("%s is gone: not edited" % show(path))
        if not stat.S_ISREG(st.st_mode):
            raise StepFailed("%s is not a regular file: not edited" % show(path))
        return st

    def read(self, path):
        # type: (str) -> bytes
        data = self.tree.read(path, MAX_FILE + 1)
        if len(data) > MAX_FILE:
            raise StepFailed("%s is larger than %d MiB: not edited" % (show(path),
                                                                       MAX_FILE >> 20))
        return data

    def changed(self, message):
        # type: (str) -> None
        say(message)
        self.state.append("changes.log", (message + "\n").encode("utf-8", "backslashreplace"))

    def backup(self, step_id, path):
        # type: (str, str) -> None
        """Keep a file's bytes, owner, mode and inode (or that it was absent) before its
        first change; the rollback restores only onto that very file."""
        self.state.init(self.rollback_text)
        if self.state.has(step_id + ".orig.meta") or self.state.has(step_id + ".absent"):
            return
        # A backup without its record was cut short (ENOSPC, a crash) before the file was
        # changed: it is taken again, never trusted.
        self.state.discard(step_id + ".orig")
        if self.regular(path, missing_ok=True) is None:
            self.state.write_new(step_id + ".absent", b"")
            return
        fd = self.tree.open_regular(path)  # the bytes and the identity of one inode
        try:
            st = os.fstat(fd)
            data = read_fd(fd, MAX_FILE + 1)
            identity = _identity(st, fd)
        finally:
            os.close(fd)
        if len(data) > MAX_FILE:
            raise StepFailed("%s is larger than %d MiB: not edited" % (show(path),
                                                                       MAX_FILE >> 20))
        self.state.write_backup(step_id + ".orig", data, identity)

    def made(self, step_id, identity):
        # type: (str, Dict[str, Any]) -> None
        """Record which inode the fix left at a step's path (what the rollback may touch)."""
        self.state.discard(step_id + ".after")
        self.state.write_record(step_id + ".after", identity)

    def ensure_dir(self, path):
        # type: (str) -> None
        """Make the missing directories of ``path``, each recorded for the rollback."""
        parts = [p for p in path.split("/") if p]
        current = ""
        for part in parts:
            current += "/" + part
            st = self.tree.lstat(current)
            if st is None:
                self.tree.mkdir(current, 0o755)
                self.state.append("created-dirs", current.encode("utf-8", "surrogateescape")
                                  + b"\0")
            elif not stat.S_ISDIR(st.st_mode):
                raise StepFailed("%s is not a directory: nothing made below it" % show(current))

    def write_in_place(self, path, data):
        # type: (str, bytes) -> Dict[str, Any]
        """Make a regular file hold ``data``, its inode, owner and mode kept; return its
        identity (:func:`_identity`)."""
        fd = self.tree.open_regular(path, os.O_WRONLY, single_link=True)
        try:
            identity = _identity(os.fstat(fd), fd)
            os.ftruncate(fd, 0)
            write_fd(fd, data)
        finally:
            os.close(fd)
        return identity

    # the steps -------------------------------------------------------------------------

    def step_set_value(self, a):
        # type: (Dict[str, Any]) -> None
        path, want = a["path"], a["value"].encode("utf-8")
        st = self.tree.lstat(path)
        if st is None:
            say("skip %s: not present" % show(path))
            return
        self.regular(path)
        raw = self.read(path)
        cur = strip_newline(raw)
        if cur == want:
            say("ok: %s is %s" % (show(path), show(want)))
            return
        self.state.init(self.rollback_text)
        self.state.save_once(a["id"] + ".old", raw)
        self.write_in_place(path, want + b"\n")
        now = strip_newline(self.read(path))
        if now != want:
            raise StepFailed("%s reads %s after writing %s" % (show(path), show(now), show(want)))
        self.changed("%s: %s -> %s" % (show(path), show(cur), show(want)))

    def read_text(self, path):
        # type: (str) -> str
        """Return a one-value file as text, less one trailing newline (as bash reads it)."""
        return strip_newline(self.read(path)).decode("utf-8", "replace")

    def select(self, path, text, want):
        # type: (str, str, str) -> None
        """Write a word to a selector file (which read ``text``) and read the selection back.

        The kernel answers with the line it shows; a plain file (a sysroot's copy of sysfs)
        took the word as written, and is given the line the kernel would show instead.
        """
        self.write_in_place(path, want.encode("utf-8") + b"\n")
        now = self.read_text(path)
        if now == want:
            self.write_in_place(path, select_word(text, want).encode("utf-8") + b"\n")
            now = self.read_text(path)
        found = parse_selector(now + "\n")  # as the file reads: one newline allowed
        if found is None or found[1] != want:
            raise StepFailed("%s reads %s after selecting %s" % (show(path), show(now),
                                                                 show(want)))

    def step_set_selector(self, a):
        # type: (Dict[str, Any]) -> None
        path, want = a["path"], a["value"]
        if self.tree.lstat(path) is None:
            say("skip %s: not present" % show(path))
            return
        self.regular(path)
        text = self.read_text(path)
        found = parse_selector(text + "\n")  # as the file reads: one newline allowed
        if found is None:
            raise StepFailed("%s is not a selector file" % show(path))
        words, was = found
        if was == want:
            say("ok: %s selects %s" % (show(path), show(want)))
            return
        if want not in words:
            raise StepFailed("%s offers no %s (only %s)" % (show(path), show(want),
                                                            show(" ".join(words))))
        self.state.init(self.rollback_text)
        self.state.save_once(a["id"] + ".old", was.encode("utf-8") + b"\n")
        self.select(path, text, want)
        self.changed("%s: %s -> %s" % (show(path), show(was), show(want)))

    def _pci(self, a):
        # type: (Dict[str, Any]) -> Optional[Tuple[str, int, int]]
        address = a["address"]
        if not _PCI_ADDRESS.match(address):
            raise StepFailed("%s is not a PCI address" % show(address))
        config = "/sys/bus/pci/devices/%s/config" % address
        if self.tree.lstat(config) is None:
            say("skip %s: no such device" % address)
            return None
        self.regular(config)
        data = self.tree.read(config, 4096)
        offset, width = register_span(data, a["register"])
        return config, offset, width

    def _pci_read(self, config, offset, width):
        # type: (str, int, int) -> int
        data = self.tree.read(config, offset + width)
        if len(data) < offset + width:
            raise StepFailed("cannot read %s" % show(config))
        return int.from_bytes(data[offset:offset + width], "little")

    def _pci_write(self, config, offset, width, value):
        # type: (str, int, int, int) -> None
        fd = self.tree.open_regular(config, os.O_WRONLY, single_link=True)
        try:
            os.pwrite(fd, value.to_bytes(width, "little"), offset)
        finally:
            os.close(fd)

    def describe_pci(self, a, old, new):
        # type: (Dict[str, Any], int, int) -> str
        field = a.get("field")
        if field:
            name, shift = field[0], int(field[1])
            return "%s %s %d -> %d bytes" % (a["address"], name, 128 << ((old >> shift) & 7),
                                             128 << ((new >> shift) & 7))
        return "%s %s: %04x -> %04x (bits %s)" % (a["address"], a["register"], old, new,
                                                  a["mask"])

    def step_set_pci_bits(self, a):
        # type: (Dict[str, Any]) -> None
        if not (_HEX.match(a["value"]) and _HEX.match(a["mask"])):
            raise StepFailed("bad value or mask for %s" % show(a["register"]))
        where = self._pci(a)
        if where is None:
            return
        config, offset, width = where
        value, mask = int(a["value"], 16), int(a["mask"], 16)
        cur = self._pci_read(config, offset, width)
        if cur & mask == value & mask:
            say("ok: %s %s is %0*x" % (a["address"], a["register"], width * 2, cur))
            return
        self.state.init(self.rollback_text)
        self.state.save_once(a["id"] + ".old", ("%0*x\n" % (width * 2, cur)).encode())
        wanted = (cur & ~mask) | (value & mask)
        self._pci_write(config, offset, width, wanted)
        now = self._pci_read(config, offset, width)
        if now & mask != value & mask:
            raise StepFailed("%s %s reads %0*x after writing %s:%s" % (
                a["address"], a["register"], width * 2, now, a["value"], a["mask"]))
        self.changed(self.describe_pci(a, cur, now))

    def step_write_file(self, a):
        # type: (Dict[str, Any]) -> None
        path, content = a["path"], a["content"].encode("utf-8")
        st = self.tree.lstat(path)
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise StepFailed("%s is not a regular file: not replaced" % show(path))
        if st is not None and self.read(path) == content:
            say("ok: %s is in place" % show(path))
            return
        self.backup(a["id"], path)
        self.ensure_dir(path.rpartition("/")[0])
        if st is not None:
            self.made(a["id"], self.write_in_place(path, content))
        else:
            fd = self.tree.create(path, int(a.get("mode") or "0644", 8))
            try:
                self.made(a["id"], _identity(os.fstat(fd), fd))
                write_fd(fd, content)
            finally:
                os.close(fd)
        self.changed("wrote %s" % show(path))

    def step_replace_line(self, a):
        # type: (Dict[str, Any]) -> None
        path, number = a["path"], int(a["line"])
        old, new = a["old"].encode("utf-8"), a["new"].encode("utf-8")
        self.regular(path)
        data = self.read(path)
        cur = line_at(data, number)
        if cur == new:
            say("ok: %s:%d is in place" % (show(path), number))
            return
        if cur != old:
            raise StepFailed("%s:%d changed since the audit (%s): not edited" % (
                show(path), number, show(cur)))
        self.backup(a["id"], path)
        self.made(a["id"], self.write_in_place(path, replaced_line(data, number, new)))
        self.changed("%s:%d: %s -> %s" % (show(path), number, show(old), show(new)))

    def step_insert_line(self, a):
        # type: (Dict[str, Any]) -> None
        path, after = a["path"], int(a["after"])
        anchor, text = a["anchor"].encode("utf-8"), a["text"].encode("utf-8")
        self.regular(path)
        data = self.read(path)
        if line_at(data, after + 1) == text:
            say("ok: %s has the line" % show(path))
            return
        if after > 0 and line_at(data, after) != anchor:
            raise StepFailed("%s:%d changed since the audit (%s): not edited" % (
                show(path), after, show(line_at(data, after))))
        self.backup(a["id"], path)
        self.made(a["id"], self.write_in_place(path, inserted_line(data, after, text)))
        self.changed("%s:%d: added %s" % (show(path), after + 1, show(text)))

    def step_append_line(self, a):
        # type: (Dict[str, Any]) -> None
        path, text = a["path"], a["text"].encode("utf-8")
        self.regular(path)
        data = self.read(path)
        if any(data[s:e] == text for s, e, _ in _lines(data)):
            say("ok: %s has the line" % show(path))
            return
        self.backup(a["id"], path)
        tail = b"\n" if data and not data.endswith(b"\n") else b""
        self.made(a["id"], self.write_in_place(path, data + tail + text + b"\n"))
        self.changed("%s: added %s" % (show(path), show(text)))

    def step_make_symlink(self, a):
        # type: (Dict[str, Any]) -> None
        path, target = a["path"], a["target"]
        st = self.tree.lstat(path)
        if st is not None and stat.S_ISLNK(st.st_mode) \
                and self.tree.readlink(path) == os.fsencode(target):
            say("ok: %s is in place" % show(path))
            return
        if st is not None:
            raise StepFailed("%s exists: not replaced" % show(path))
        self.state.init(self.rollback_text)
        self.ensure_dir(path.rpartition("/")[0])
        self.tree.symlink(path, target)
        made = self.tree.lstat(path)
        self.state.discard(a["id"] + ".created")
        self.state.write_backup(a["id"] + ".created", b"", {} if made is None else
                                _identity(made))
        self.changed("linked %s -> %s" % (show(path), show(target)))

    # undoing ---------------------------------------------------------------------------

    def step_restore_value(self, a):
        # type: (Dict[str, Any]) -> None
        backup = self.state.read_backup(a["id"] + ".old")
        if backup is None:
            return
        saved = backup[0]
        self.regular(a["path"])
        self.write_in_place(a["path"], saved)
        say("restored %s to %s" % (show(a["path"]), show(strip_newline(saved))))

    def step_restore_selector(self, a):
        # type: (Dict[str, Any]) -> None
        backup = self.state.read_backup(a["id"] + ".old")
        if backup is None:
            return
        saved = backup[0]
        word = strip_newline(saved).decode("utf-8", "replace")
        if parse_selector("[%s]" % word) is None:
            raise StepFailed("saved selection of %s is unreadable" % show(a["path"]))
        self.regular(a["path"])
        self.select(a["path"], self.read_text(a["path"]), word)
        say("restored %s to %s" % (show(a["path"]), show(word)))

    def step_restore_pci_bits(self, a):
        # type: (Dict[str, Any]) -> None
        backup = self.state.read_backup(a["id"] + ".old")
        if backup is None:
            return
        saved = backup[0]
        old = strip_newline(saved).decode("ascii", "replace")
        if not (_HEX.match(old) and _HEX.match(a["mask"])):
            raise StepFailed("saved value of %s %s is unreadable" % (a["address"],
                                                                     a["register"]))
        where = self._pci(a)
        if where is None:
            raise StepFailed("%s is gone: not restored" % a["address"])
        config, offset, width = where
        mask = int(a["mask"], 16)
        cur = self._pci_read(config, offset, width)
        self._pci_write(config, offset, width, (cur & ~mask) | (int(old, 16) & mask))
        say("restored %s" % self.describe_pci(a, cur, self._pci_read(config, offset, width)))

    def step_restore_file(self, a):
        # type: (Dict[str, Any]) -> None
        """Put a file back as the fix found it, only onto the inode the fix left there.

        Whoever owns the sysroot may have removed or replaced the file since: a file of
        another inode or owner is left alone (the backup stays for the operator), and a
        removed one is made again as its old owner, without setuid or setgid bits, so a
        rollback run as root never makes a privileged program of a tenant's bytes.
        """
        path, step_id = a["path"], a["id"]
        backup = self.state.read_backup(step_id + ".orig")
        if backup is not None:
            original, record = backup
            after = self.state.read_record(step_id + ".after") or record
            if self.regular(path, missing_ok=True) is not None:
                self._restore_in_place(path, original, record, after)
                say("restored %s" % show(path))
                return
            mode = _int(record, "mode") & 0o777  # never setuid, setgid or sticky
            fd = self.tree.create(path, 0o600)
            try:
                write_fd(fd, original)
                os.fchown(fd, _int(record, "uid"), _int(record, "gid"))
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            dropped = _int(record, "mode") & 0o7000
            say("restored %s (removed since the fix: made again, owner %d:%d, mode %04o%s)" % (
                show(path), _int(record, "uid"), _int(record, "gid"), mode,
                ", its old %04o bits dropped" % dropped if dropped else ""))
        elif self.state.has(step_id + ".absent"):
            made = self.state.read_record(step_id + ".after")
            st = self.tree.lstat(path)
            if st is None:
                return
            same = False
            if made is not None and stat.S_ISREG(st.st_mode):
                fd = self.tree.open_regular(path)
                try:
                    same = _same(os.fstat(fd), made, fd)
                finally:
                    os.close(fd)
            if not same:
                raise StepFailed("%s is not the file the fix made (replaced since): not "
                                 "removed" % show(path))
            self.tree.unlink(path)
            say("removed %s" % show(path))

    def _restore_in_place(self, path, original, record, after):
        # type: (str, bytes, Dict[str, Any], Dict[str, Any]) -> None
        """Write a backup back into the very inode the fix left, owner and mode checked."""
        fd = self.tree.open_regular(path, os.O_WRONLY, single_link=True)
        try:
            now = os.fstat(fd)
            if not _same(now, after, fd) or now.st_uid != _int(record, "uid") \
                    or now.st_gid != _int(record, "gid"):
                raise StepFailed(
                    "%s was replaced since the fix (owner %d:%d, inode %d; the fix left "
                    "%d:%d, inode %d): not restored; the backup stays in %s" % (
                        show(path), now.st_uid, now.st_gid, now.st_ino, _int(record, "uid"),
                        _int(record, "gid"), _int(after, "ino"), show(self.state.path)))
            if now.st_mode & 0o6000 & ~_int(record, "mode"):
                raise StepFailed("%s is setuid or setgid now, which it was not: not restored"
                                 % show(path))
            os.ftruncate(fd, 0)
            write_fd(fd, original)
        finally:
            os.close(fd)

    def step_remove_symlink(self, a):
        # type: (Dict[str, Any]) -> None
        backup = self.state.read_backup(a["id"] + ".created")
        if backup is None:
            return
        st = self.tree.lstat(a["path"])
        if st is None:
            return
        if backup[1] and not _same(st, backup[1]):
            raise StepFailed("%s is not the link the fix made (replaced since): not removed"
                             % show(a["path"]))
        self.tree.unlink(a["path"], (stat.S_IFLNK,))
        say("removed %s" % show(a["path"]))

    # running ---------------------------------------------------------------------------

    def run(self, verb, actions):
        # type: (str, List[Dict[str, Any]]) -> None
        """Run each action's ``verb`` ("fix" or "undo"): the ``step_`` method the plan names
        for it (auditor/remedy.py, ``Verbs``: the one description of each step kind,
        which the bash scripts' functions of the same names follow)."""
        for action in actions:
            name = action.get(verb, "")
            method = getattr(self, "step_" + name, None) if isinstance(name, str) \
                and name.isidentifier() else None
            if method is None:
                self.fail("%s: no step %s %s in this engine: nothing %s" % (
                    action.get("id", "?"), verb, show(str(name)),
                    "restored" if verb == "undo" else "changed"))
                continue
            try:
                method(action)
            except StepFailed as exc:
                self.fail(str(exc))
            except OSError as exc:
                what = action.get("path") or action.get("address") or action["id"]
                self.fail("%s: %s: not %s" % (show(what), exc.strerror or exc,
                                              "restored" if verb == "undo" else "changed"))

    def preflight(self):
        # type: () -> None
        """Refuse the whole fix, before any change, where a directory on a planned path is
        a symlink now: the audit resolved every path, so the sysroot changed since (a write
        would still stay inside it, but not where the audit saw the file); or where a
        planned path crosses a mount point (a bind mount of the live /proc, /sys or of a
        directory outside the tree)."""
        for action in self.plan["actions"]:
            path = action.get("path")
            if not isinstance(path, str):
                continue
            current = ""
            parts = [p for p in path.split("/") if p]
            for index, part in enumerate(parts):
                current += "/" + part
                try:
                    st = self.tree.lstat(current)
                except OSError as exc:
                    if exc.errno != errno.EXDEV:
                        raise
                    raise Refused("%s: %s is a mount point (a fix stays on the sysroot's "
                                  "own mounts): nothing changed" % (show(path), show(current))
                                  ) from None
                if st is None or index == len(parts) - 1:
                    break  # the last name is the step's own business (a symlink made)
                if stat.S_ISLNK(st.st_mode):
                    raise Refused("%s: %s is a symlink now (the sysroot changed since the "
                                  "audit): nothing changed" % (show(path), show(current)))

    def fix(self):
        # type: () -> int
        self.preflight()
        self.run("fix", self.plan["actions"])
        if self.failures:
            warn("%d step(s) failed; see above" % self.failures)
            return 1
        say("done")
        return 0

    def undo(self):
        # type: () -> int
        if not self.state.exists():
            say("nothing to roll back: no state for fix %s of this sysroot in %s" % (
                self.plan["fix_id"], show(self.state.path)))
            return 0
        self.run("undo", list(reversed(self.plan["actions"])))
        if self.failures:
            warn("%d step(s) failed; the saved state stays in %s for another try" % (
                self.failures, show(self.state.path)))
            return 1
        created = (self.state.read("created-dirs") or b"").split(b"\0")
        self.state.remove()
        for raw in reversed([c for c in created if c]):
            parts = raw.split(b"/")
            if b".." in parts or not raw.startswith(b"/"):
                continue  # not a path this fix wrote
            self.tree.rmdir(raw)
        say("rolled back fix %s" % self.plan["fix_id"])
        return 0


def guard(tree, plan):
    # type: (Tree, Dict[str, Any]) -> None
    """Refuse a sysroot that is not the audited host's (its hostname or machine-id differ)."""
    def text(path):
        # type: (str) -> str
        try:
            return tree.read(path, MAX_GUARD).decode("utf-8", "replace")
        except OSError:
            return ""

    found = first_line(text("/etc/hostname"))
    if found != plan["hostname"]:
        raise Refused("%s holds host %s, not the audited %s" % (
            show(tree.root), show(found), show(plan["hostname"])))
    wanted = plan.get("machine_id_sha256")
    if wanted:
        found_id = first_line(text("/etc/machine-id"))
        if machine_id_digest(plan["machine_id_salt"], found_id) != wanted:
            raise Refused("the machine-id of %s is not the audited host's" % show(tree.root))


def _read_plan(fd):
    # type: (int) -> Dict[str, Any]
    with os.fdopen(fd, "rb") as handle:
        plan = json.loads(handle.read(64 << 20).decode("utf-8"))
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT \
            or not isinstance(plan.get("actions"), list):
        raise Refused("the fix plan is not one this program reads")
    return plan


def apply(mode, root, plan, rollback=None):
    # type: (str, str, Dict[str, Any], Optional[bytes]) -> int
    """Fix (``mode`` "fix") or roll back ("rollback") the sysroot ``root``; return the status."""
    try:
        tree = Tree(root)
    except OSError as exc:
        raise Refused("sysroot %s is not a directory (%s)" % (show(root), exc.strerror)) \
            from None
    with tree:
        # What the descriptor holds, opened once: the name may be swapped for a symlink
        # to / after any test of it, the directory held cannot.
        if tree.is_live_root():
            raise Refused("ROOT is /: this script is for a sysroot, not the booted machine")
        real = tree.root
        guard(tree, plan)
        state = State(real, plan["fix_id"])
        try:
            if mode == "rollback":
                return Applier(tree, plan, state).undo()
            # Re-running a fix finds the state of its first run (and its lock).
            if state.open_key(create=False):
                state.exists()
            return Applier(tree, plan, state, rollback).fix()
        finally:
            state.close()


def main(argv):
    # type: (List[str]) -> int
    """``fix ROOT`` or ``rollback ROOT``: the plan on fd 3, in fix mode the rollback on fd 4."""
    os.umask(0o022)
    if len(argv) != 2 or argv[0] not in ("fix", "rollback"):
        sys.stderr.write("host-auditor: error: usage: fix|rollback ROOT (the plan on fd 3)\n")
        return 2
    mode, root = argv
    try:
        plan = _read_plan(3)
        rollback = None
        if mode == "fix":
            with os.fdopen(4, "rb") as handle:
                rollback = handle.read(64 << 20)
        return apply(mode, root, plan, rollback)
    except Refused as exc:
        sys.stderr.write("host-auditor: error: %s\n" % exc)
        return 2
    except (OSError, ValueError) as exc:
        sys.stderr.write("host-auditor: error: %s\n" % show(str(exc)))
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
