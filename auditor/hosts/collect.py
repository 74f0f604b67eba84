"""Collect the files checks read as a tar sysroot: locally, or on a remote host in one command.

The checks declare every path they read as shell patterns (``Check.reads``).
The collector fetches exactly the paths those patterns match and writes them
as a tar sysroot that :class:`auditor.hosts.archive.ArchiveHost` reads the way
the live host reads (see :mod:`auditor.shipped.collector_script` for what is kept).

The same collector runs three ways:

- here, as a function (:func:`collect_tar`, :func:`write_tar`);
- on a remote host's own ``python3``, sent inside one shell command
  (:func:`remote_command`), nothing installed there;
- where the remote host has no ``python3``, as a POSIX ``sh`` script using
  ``readlink``, ``head``, ``od`` and ``ls`` (no ``tar``: tar trusts
  ``st_size``, which is 4096 for every sysfs file). It writes a framed stream
  that :func:`parse_output` turns into the same tar.

The remote command prints one line saying what it did (``sudo`` used, denied
or off), then the collector's own line (``python uid=0``), then the payload.
"""

from __future__ import annotations

import base64
import io
import os
import shlex
import tarfile
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import BinaryIO

from auditor import environment
from auditor.errors import CollectError
from auditor.shipped import collector_script, treeio
from auditor.text import printable

FILE_CAP = collector_script.FILE_CAP

#: Files every collection takes: the host's name and the facts a report shows, where the
#: audit runs among them.
BASE_READS: tuple[str, ...] = (
    "/etc/hostname",
    "/proc/sys/kernel/hostname",
    "/proc/sys/kernel/osrelease",
    "/etc/os-release",
    "/etc/machine-id",
    *environment.READS,
)

_MAGIC = b"audit-collect 1 "


def write_tar(out: BinaryIO, patterns: Sequence[str], *, compress: bool = False,
              cap: int = FILE_CAP, root: str = "", extra: Mapping[str, bytes] | None = None
              ) -> None:
    """Write a tar (gzip if ``compress``) of every path the patterns match on this machine.

    ``root``: match below this sysroot directory; the tar holds the sysroot's own paths.
    ``extra``: files made here (path -> bytes) written first, such as the GPU state NVML read.
    """
    collector_script.collect_to(out, list(patterns), compress=compress, cap=cap, root=root,
                                extra=dict(extra or {}))


def collect_tar(patterns: Sequence[str], *, compress: bool = False, cap: int = FILE_CAP,
                root: str = "", extra: Mapping[str, bytes] | None = None) -> bytes:
    """Return a tar (gzip if ``compress``) of every path the patterns match on this machine."""
    buffer = io.BytesIO()
    write_tar(buffer, patterns, compress=compress, cap=cap, root=root, extra=extra)
    return buffer.getvalue()


# -- the remote command ---------------------------------------------------------------

# The POSIX sh collector, for hosts without python3. Records are NUL-separated
# (no path holds a NUL): "D<path>", "L<path>" "<target>", "C<path>" / "B<path>"
# "<major> <minor>", "F<path>" "<od hex dump>" "<exit status of the read>".
# fd 4 is the real stdout, so a read's exit status can travel back through $(...).
SH_COLLECTOR = r"""
set -f
cap=1048576
exec 4>&1
denied() {
    case $1 in
        /proc/*/environ|/proc/*/mem|/proc/*/cmdline|/proc/kcore|/proc/kmsg) return 0 ;;
        /dev/mem|/dev/kmem|/dev/port|/etc/shadow*|/etc/gshadow*|/etc/ssh/*key*) return 0 ;;
        */.ssh/*|*.key|*.pem) return 0 ;;
    esac
    return 1
}
emit_file() {
    [ -r "$R$1" ] || return 0
    printf 'F%s\0' "$1"
    rc=$( { { head -c "$cap" "$R$1" 2>/dev/null; echo "$?" >&3; } | od -An -v -tx1 >&4; } 3>&1 )
    printf '\0%s\0' "$rc"
}
emit_dev() {
    kind=$1 node=$2
    IFS=' '
    set -- $(ls -lnd "$R$node" 2>/dev/null)
    IFS=
    [ -n "$6" ] || return 0
    printf '%s%s\0%s %s\0' "$kind" "$node" "${5%,}" "$6"
}
walk() {
    rest=$1 cur= hops=0
    while :; do
        while :; do case $rest in /*) rest=${rest#/} ;; *) break ;; esac; done
        [ -n "$rest" ] || return 0
        case $rest in
            */*) part=${rest%%/*} rest=${rest#*/} ;;
            *) part=$rest rest= ;;
        esac
        case $part in
            .) continue ;;
            ..) cur=${cur%/*}; continue ;;
        esac
        cand=$cur/$part
        if denied "$cand"; then return 0; fi
        if [ -L "$R$cand" ]; then
            if [ "$cand" = /proc/self ]; then
                # Reached through a link (/proc/mounts -> self/mounts): readlink would
                # name its own, finished process; this shell's is the reader's.
                target=$$
            else
                target=$(readlink "$R$cand" && printf x)
                [ -n "$target" ] || return 0
                target=${target%x}
                target=${target%?}
            fi
            printf 'L%s\0%s\0' "$cand" "$target"
            hops=$((hops + 1))
            [ "$hops" -le 40 ] || return 0
            case $target in /*) cur= ;; esac
            rest=$target/$rest
            continue
        fi
        case $rest in *[!/]*) more=1 ;; *) more= ;; esac
        if [ -d "$R$cand" ]; then
            printf 'D%s\0' "$cand"
        elif [ -n "$more" ]; then
            return 0
        elif [ -f "$R$cand" ]; then
            emit_file "$cand"
        elif [ -c "$R$cand" ]; then
            emit_dev C "$cand"
        elif [ -b "$R$cand" ]; then
            emit_dev B "$cand"
        fi
        [ -n "$more" ] || return 0
        cur=$cand
    done
}
# The GPU state (auditor.hosts.gpustate): nvidia-smi's XML and how it ended, the kernel
# log's NVIDIA lines. Emitted as files of the virtual /host-auditor directory.
virtual_smi() {
    [ -z "$smi_done" ] || return 0
    smi_done=1
    smi=$(command -v nvidia-smi 2>/dev/null) || smi=
    if [ -z "$smi" ]; then
        rc=127
    else
        printf 'F%s\0' /host-auditor/nvidia-smi.xml
        if command -v timeout >/dev/null 2>&1; then
            rc=$( { { timeout -s KILL 10 "$smi" -q -x 2>&1; echo "$?" >&3; } \
                | head -c 8388608 | od -An -v -tx1 >&4; } 3>&1 )
            [ "$rc" != 137 ] || rc=timeout
        else
            rc=$( { { "$smi" -q -x 2>&1; echo "$?" >&3; } \
                | head -c 8388608 | od -An -v -tx1 >&4; } 3>&1 )
        fi
        printf '\0%s\0' 0
    fi
    printf 'F%s\0' /host-auditor/nvidia-smi.status
    case $rc in
        timeout) printf 'timeout 10\n' | od -An -v -tx1 ;;
        127) printf 'exit 127\nnvidia-smi: command not found\n' | od -An -v -tx1 ;;
        *) printf 'exit %s\n' "$rc" | od -An -v -tx1 ;;
    esac
    printf '\0%s\0' 0
}
virtual_kmsg() {
    # dmesg where the ring buffer is open to the user, else this boot's journal.
    if command -v dmesg >/dev/null 2>&1 && dmesg >/dev/null 2>&1; then
        set -- dmesg
    elif command -v journalctl >/dev/null 2>&1; then
        set -- journalctl -k -b --no-pager -q -o short-monotonic
    else
        return 0
    fi
    printf 'F%s\0' /host-auditor/kmsg
    rc=$( { { "$@" 2>/dev/null; echo "$?" >&3; } | grep -e NVRM -e 'fallen off the bus' \
        | tail -n 2000 | od -An -v -tx1 >&4; } 3>&1 )
    printf '\0%s\0' "$rc"
}
[ "$1" != -z ] || shift
R=
if [ "$1" = -r ]; then
    R=${2%/}
    shift 2
    if [ ! -d "$R/" ]; then printf '%s: no such directory\n' "$R" >&2; exit 2; fi
    # sh can only open a path by name: a tree that changes under it could send a read
    # outside. Reading a sysroot safely needs openat, which the python3 collector has.
    printf '%s: reading a sysroot needs python3 on the host\n' "$R" >&2
    exit 2
fi
printf 'sh uid=%s\n' "$(id -u)"
IFS=
smi_done=
for pattern in "$@"; do
    case $pattern in
        /host-auditor/nvidia-smi.xml|/host-auditor/nvidia-smi.status) virtual_smi; continue ;;
        /host-auditor/kmsg) virtual_kmsg; continue ;;
        /host-auditor/*) continue ;;
    esac
    set +f
    set -- "$R"$pattern
    set -f
    for path in "$@"; do
        if [ -e "$path" ] || [ -L "$path" ]; then
            path=${path#"$R"}
            case $path in
                /proc/self/*)
                    # /proc/self names whichever process reads it (a readlink here):
                    # walk this shell's own entry, recorded as the link python records.
                    printf 'L/proc/self\0%s\0' "$$"
                    path=/proc/$$/${path#/proc/self/} ;;
            esac
            denied "$path" || walk "$path"
        fi
    done
done
"""

# Chooses sudo and python3 or sh in the same round trip. Arguments: want_sudo,
# the collector's zlib+base64 source, the sh collector, then the collector's arguments.
_WRAPPER = """
want_sudo=$1 source=$2 shcollector=$3
shift 3
run= state=off
if [ "$want_sudo" = 1 ]; then
    if [ "$(id -u)" = 0 ]; then
        state=root
    elif sudo -n true 2>/dev/null; then
        run='sudo -n' state=used
    else
        state=denied
    fi
fi
printf 'audit-collect 1 sudo=%s\\n' "$state"
boot='import base64,sys,zlib;exec(zlib.decompress(base64.b64decode(sys.argv.pop(1))))'
python=$(command -v python3 2>/dev/null) || python=
case $python in
    /*) exec $run "$python" -I -S -c "$boot" "$source" "$@" ;;
esac
exec $run sh -c "$shcollector" sh "$@"
"""


def module_sources(*modules: ModuleType) -> bytes:
    """Return the modules' sources joined into one program (sent to a remote ``python3``).

    A later module finds the names an earlier one defined already in place of its import.
    """
    parts: list[bytes] = []
    for module in modules:
        path = module.__file__
        assert path is not None
        # Through the module's loader: a file, or a member of the single-file build's zip.
        loader = getattr(module, "__loader__", None)
        if loader is not None and hasattr(loader, "get_data"):
            parts.append(loader.get_data(path))
            continue
        with open(path, "rb") as handle:  # pragma: no cover - every loader above has one
            parts.append(handle.read())
    return b"\n".join(parts)


def _collector_source() -> bytes:
    # treeio first: the collector reads a remote sysroot (--root) through it.
    source = module_sources(treeio, collector_script)
    # Docstrings and comments stay: they cost a few hundred bytes after zlib.
    return base64.b64encode(zlib.compress(source, 9))


def remote_command(patterns: Sequence[str], *, sudo: bool = False, compress: bool = False,
                   root: str | None = None) -> str:
    """Return the one shell command that collects ``patterns`` on a remote host.

    ``root``: a sysroot directory on that host to collect from instead of its ``/``.
    """
    arguments = [
        "1" if sudo else "0",
        _collector_source().decode("ascii"),
        SH_COLLECTOR,
        *(["-z"] if compress else []),
        *(["-r", root] if root and root != "/" else []),
        *patterns,
    ]
    return "exec sh -c " + " ".join(shlex.quote(a) for a in [_WRAPPER, "audit-collect", *arguments])


@dataclass(frozen=True)
class Collection:
    """What a remote collection returned: the tar, and how it was made."""

    tar: bytes
    method: str  # "python" or "sh"
    uid: int | None
    sudo: str  # "off", "root", "used" or "denied"

    @property
    def root(self) -> bool:
        """Return whether the collector ran as root."""
        return self.uid == 0

    @property
    def privilege_note(self) -> str:
        """Return why the collection lacks root, or "" when it ran as root."""
        if self.root:
            return ""
        if self.sudo == "denied":
            return "sudo -n asked for a password"
        return "read as a non-root user; --sudo reads as root"


def _split_line(data: bytes, start: int, label: str) -> tuple[bytes, int]:
    end = data.find(b"\n", start, start + 256)
    if end < 0:
        raise CollectError(f"{label}: the collector's answer has no header line")
    return data[start:end], end + 1


#: The most records the sh collector's answer may hold (a 128-CPU host's has about 4,500).
MAX_RECORDS = 100_000
#: The most characters of one file's hex dump (od writes 3 per byte, and a newline per 16).
_MAX_HEX = FILE_CAP * 3 + FILE_CAP // 16 + 64


def parse_output(data: bytes, label: str = "remote", *, cap: int = 64 << 20,
                 deadline: float | None = None) -> Collection:
    """Turn what the remote command printed into a tar sysroot and its provenance."""
    # A login shell's rc files may print a greeting first: skip whole lines up to ours.
    start = 0 if data.startswith(_MAGIC) else data.find(b"\n" + _MAGIC, 0, 1 << 16) + 1
    if start == 0 and not data.startswith(_MAGIC):
        snippet = printable(data[:80].decode("utf-8", "replace").strip())
        raise CollectError(f"{label}: the collector did not start (output: {snippet!r})")
    head, offset = _split_line(data, start, label)
    sudo = head[len(_MAGIC):].decode("ascii", "replace").partition("=")[2] or "off"
    if sudo not in ("off", "root", "used", "denied"):
        raise CollectError(f"{label}: the collector's answer has a malformed header line")
    line, offset = _split_line(data, offset, label)
    method, _, uid_text = line.decode("ascii", "replace").partition(" uid=")
    try:
        uid: int | None = int(uid_text) if uid_text.isdigit() and len(uid_text) < 12 else None
    except ValueError:
        uid = None
    if method == "python":
        tar = data[offset:]
    elif method == "sh":
        tar = frames_to_tar(data, label, start=offset, cap=cap, deadline=deadline)
    else:
        raise CollectError(f"{label}: unknown collector {printable(method[:40])!r}")
    return Collection(tar=tar, method=method, uid=uid, sudo=sudo)


_TYPES = {b"D": tarfile.DIRTYPE, b"L": tarfile.SYMTYPE, b"C": tarfile.CHRTYPE,
          b"B": tarfile.BLKTYPE, b"F": tarfile.REGTYPE}


def _header(path: bytes, kind: bytes, size: int = 0, linkname: bytes = b"",
            major: int = 0, minor: int = 0) -> bytes:
    """Return the tar header of one record: ustar written directly (tarfile's writer costs
    ~150 us a member), pax through tarfile where a name does not fit ustar."""
    name = path.lstrip(b"/")
    mode = 0o755 if kind in (b"D", b"L") else 0o644
    if len(name) > 99 or len(linkname) > 99 or major > 0o7777777 or minor > 0o7777777:
        info = tarfile.TarInfo(os.fsdecode(name))
        info.type, info.mode, info.size = _TYPES[kind], mode, size
        info.linkname = os.fsdecode(linkname)
        info.devmajor, info.devminor = major, minor
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    header = bytearray(512)
    header[0:len(name)] = name
    header[100:108] = b"%07o\0" % mode
    header[108:124] = b"0000000\x000000000\0"
    header[124:136] = b"%011o\0" % size
    header[136:148] = b"00000000000\0"
    header[148:156] = b" " * 8
    header[156:157] = _TYPES[kind]
    header[157:157 + len(linkname)] = linkname
    header[257:265] = b"ustar\x0000"
    header[329:345] = b"%07o\0%07o\0" % (major, minor)
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


_ARITY = {b"D": 0, b"L": 1, b"C": 1, b"B": 1, b"F": 2}


def frames_to_tar(payload: bytes, label: str = "remote", *, start: int = 0,
                  cap: int = 64 << 20, deadline: float | None = None) -> bytes:
    """Convert the sh collector's framed records (``payload[start:]``) into an uncompressed tar.

    The answer is read in place, one field at a time (never split into a list of copies):
    at most MAX_RECORDS records, a file's dump at most FILE_CAP bytes, the tar at most
    ``cap`` bytes, all before ``deadline``.
    """
    raw = payload
    end = len(raw)
    buffer = io.BytesIO()
    seen: set[str] = set()
    pos = start
    records = 0

    def field(at: int, limit: int) -> tuple[bytes, int]:
        stop = raw.find(b"\0", at, min(end, at + limit + 1))
        if stop < 0:
            raise CollectError(f"{label}: malformed or truncated record from the sh collector")
        return raw[at:stop], stop + 1

    while pos < end:
        records += 1
        if records > MAX_RECORDS:
            raise CollectError(f"{label}: more than {MAX_RECORDS} records from the sh "
                               "collector")
        if not records & 0x3FF and deadline is not None and time.monotonic() > deadline:
            raise CollectError(f"{label}: timed out reading the collection")
        record, pos = field(pos, 8192)
        kind, raw_path = record[:1], record[1:]
        arity = _ARITY.get(kind)
        if arity is None:
            raise CollectError(f"{label}: malformed or truncated record from the sh collector")
        values: list[bytes] = []
        for index in range(arity):
            value, pos = field(pos, _MAX_HEX if kind == b"F" and index == 0 else 8192)
            values.append(value)
        path = os.fsdecode(raw_path)
        if not path.startswith("/") or path in seen:
            continue
        content = b""
        if kind == b"D":
            header = _header(raw_path, kind)
        elif kind == b"L":
            header = _header(raw_path, kind, linkname=values[0][:8192])
        elif kind in (b"C", b"B"):
            numbers = values[0].split()
            if len(numbers) != 2 or not all(n.isdigit() and len(n) < 10 for n in numbers):
                continue
            header = _header(raw_path, kind, major=int(numbers[0]), minor=int(numbers[1]))
        else:
            if values[1].strip() != b"0":
                continue  # the read failed: skipped, as the python collector does
            try:
                content = bytes.fromhex(values[0].decode("ascii"))
            except (ValueError, UnicodeDecodeError) as exc:
                raise CollectError(f"{label}: bad file data for {printable(path)!r}") from exc
            header = _header(raw_path, kind, size=len(content))
        seen.add(path)
        buffer.write(header)
        if content:
            buffer.write(content)
            buffer.write(b"\0" * (-len(content) % 512))
        if buffer.tell() > cap:
            raise CollectError(f"{label}: the collection exceeded {cap >> 20} MiB")
    buffer.write(b"\0" * 1024)  # the end of the archive
    return buffer.getvalue()
