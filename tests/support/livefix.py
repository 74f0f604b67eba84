"""Run a booted machine's fix and rollback scripts, unchanged, against a host tree.

The bash scripts ``templates/fix.sh.j2`` renders are what operators run on real
machines: they write ``/sys``, ``/proc/sys`` and ``/etc`` by those names and keep their
state in ``/var/lib/host-auditor``. To run that very script against a test's tree, it runs
as root in a private mount namespace, chrooted into a root made for it on a tmpfs:

- the tree's ``/etc``, ``/sys``, ``/boot`` and ``/proc/sys`` at those paths, and the
  tree's directory of any other path the plan writes (``/var/lib/lxc/NAME``), read-write;
- the machine's ``/usr`` (and its ``/bin``, ``/lib``... links or directories) read-only,
  for bash, coreutils, ``sysctl`` and ``setpci``; ``/dev/null``; nothing else of the
  machine, so a step that went astray finds nothing of it to change;
- a directory of the test at ``/var/lib/host-auditor`` (the fix's state, kept out of the
  tree as the sysroot engine keeps its own), and the plan's host name in a private UTS
  namespace (what ``hostname`` answers where the tree has no ``/proc/sys``).

A command the fix runs after a change (``update-grub``, ``udevadm``, ``systemctl``) would
act on the machine, not the tree: each one the plan names is a stub earlier on ``PATH``
that records its argv, so the test still sees which commands the script ran.

Chosen over rendering the script with a path prefix (the templates have none: the
sysroot scripts hand their plan to python3 instead) because this runs the production
script byte for byte, and over a bare chroot into the tree (which holds no bash, and
whose ``/usr`` the checks read) because nothing of the tree is hidden or added.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from auditor.fix import FixPlan

#: The tree's directories bound in place whether or not the plan writes them: the guard
#: reads /etc and /proc/sys, setpci finds devices through /sys.
TREE_DIRS = ("etc", "sys", "boot", "proc/sys")
#: The machine's directories bound read-only for the tools the script calls.
TOOL_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")

_SETUP = r"""
set -euo pipefail
new=$1 tree=$2 state=$3 stubs=$4 log=$5 name=$6 script=$7
shift 7
mount -t tmpfs -o mode=0755 host-auditor-live "$new"
for dir in TOOL_DIRS; do
    if [ -L "/$dir" ]; then ln -s -- "$(readlink -- "/$dir")" "$new/$dir"
    elif [ -d "/$dir" ]; then
        mkdir -- "$new/$dir"
        mount --bind -- "/$dir" "$new/$dir"
        mount -o remount,bind,ro -- "$new/$dir"
    fi
done
mkdir -m 1777 -- "$new/tmp"
mkdir -- "$new/dev"
for unit in "$@"; do
    mkdir -p -- "$new/$unit"
    mount --bind -- "$tree/$unit" "$new/$unit"
done
# The machine's /dev/null, over the tree's node where its /dev is bound (give_dev_null):
# a node on a nodev file system cannot be opened, and every `2> /dev/null` would fail.
[ -e "$new/dev/null" ] || : > "$new/dev/null"
mount --bind /dev/null "$new/dev/null"
mkdir -p -- "$new/var/lib/host-auditor" "$new/.host-auditor-stubs" "$new/.host-auditor-log"
mount --bind -- "$state" "$new/var/lib/host-auditor"
mount --bind -- "$stubs" "$new/.host-auditor-stubs"
mount --bind -- "$log" "$new/.host-auditor-log"
cp -- "$script" "$new/.host-auditor-script"
hostname -- "$name"
exec chroot -- "$new" /usr/bin/env -i PATH=/.host-auditor-stubs:/usr/sbin:/usr/bin:/sbin:/bin \
    LC_ALL=C.UTF-8 bash /.host-auditor-script
"""

_STUB = """#!/bin/sh
printf '%s\\n' "${0##*/} $*" >> /.host-auditor-log/commands
"""


@dataclass(frozen=True)
class LiveRun:
    """What a run of a booted machine's script did: its process, and the commands it ran."""

    process: subprocess.CompletedProcess[str]
    commands: tuple[str, ...]

    @property
    def output(self) -> str:
        return self.process.stdout + self.process.stderr


def units(plan: FixPlan, tree: Path) -> list[str]:
    """Return the tree's directories to bind in place for a plan, relative to its root."""
    found = [d for d in TREE_DIRS if (tree / d).is_dir()]
    for action in plan.actions:
        path = getattr(action.step, "path", None)
        if not isinstance(path, str) or any(
                path.strip("/") == d or path.strip("/").startswith(d + "/") for d in found):
            continue
        # The deepest directory the tree has above the path: the fix may make the rest.
        parent = Path(path.strip("/")).parent
        while parent != Path(".") and not (tree / parent).is_dir():
            parent = parent.parent
        if parent == Path(".") or (parent.parts[0] in TOOL_DIRS and len(parent.parts) < 2):
            raise ValueError(f"{path}: no directory of the tree to bind it in")
        if str(parent) not in found:
            found.append(str(parent))
    return sorted(found, key=lambda u: u.count("/"))


def commands_of(plan: FixPlan) -> set[str]:
    """Return the commands a plan's scripts may run (fix and undo), each to be stubbed."""
    names: set[str] = set()
    for action in plan.actions:
        for argv in (getattr(action.step, "argv", ()), getattr(action.step, "undo", ())):
            if argv:
                names.add(argv[0])
    return names


def give_dev_null(tree: Path) -> None:
    """Give a tree that has a ``/dev`` (bound in place when a plan writes under it) the
    ``/dev/null`` node every booted machine has: :func:`run_live` binds the machine's
    ``/dev/null`` over it, so the scripts' redirections never make a file in the tree."""
    dev = tree / "dev"
    null = dev / "null"
    if dev.is_dir() and not dev.is_symlink() and not os.path.lexists(null):
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


def run_live(script: Path, tree: Path, plan: FixPlan, work: Path,
             bind: Sequence[str] | None = None) -> LiveRun:
    """Run a booted machine's fix or rollback script against ``tree`` (as root).

    ``bind`` names the tree's directories to bind in place (:func:`units` of the tree as
    it was before the fix, for every run of one cycle: a directory the fix made must stay
    a plain directory for the rollback, which removes it, not a mount point).
    """
    state, stubs, log, new = (work / "state", work / "stubs", work / "log", work / "root")
    for directory in (state, stubs, log, new):
        directory.mkdir(parents=True, exist_ok=True)
    state.chmod(0o755)
    for name in commands_of(plan):
        if "/" in name or not name:
            raise ValueError(f"{name!r}: a command is named, not a path")
        stub = stubs / name
        stub.write_text(_STUB)
        stub.chmod(0o755)
    (log / "commands").unlink(missing_ok=True)
    setup = _SETUP.replace("TOOL_DIRS", " ".join(TOOL_DIRS))
    argv = ["unshare", "--mount", "--uts", "--propagation", "private", "--",
            "bash", "-c", setup, "live-fix", str(new), str(tree), str(state), str(stubs),
            str(log), plan.hostname or "localhost", str(script),
            *(units(plan, tree) if bind is None else bind)]
    process = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    recorded = log / "commands"
    commands = tuple(recorded.read_text().splitlines()) if recorded.exists() else ()
    return LiveRun(process, commands)


def leftovers(work: Path) -> list[str]:
    """Return what a rollback left in the bash state directory (nothing, when it is done)."""
    return sorted(os.listdir(work / "state")) if (work / "state").exists() else []


def available() -> str:
    """Return why live scripts cannot run here ("" when they can)."""
    if os.geteuid() != 0:
        return "needs root (a private mount namespace and chroot)"
    for tool in ("unshare", "chroot", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return ""


def describe(argv: Iterable[str]) -> str:
    """Return a command line as a shell would read it (for failure messages)."""
    return " ".join(shlex.quote(a) for a in argv)
