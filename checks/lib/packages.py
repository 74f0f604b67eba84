"""Installed packages and who upgrades them: dpkg's status file, apt's and dnf's automatic upgrades.

Shared by ``nvidia.driver`` (driver packages, held or not, upgraded unattended or not),
``nvidia.fabricmanager`` (the fabric manager's package version) and ``kernel.version``
(the precompiled NVIDIA module package of a kernel).

- ``/var/lib/dpkg/status``: RFC 822 stanzas; ``Status: <want> <flag> <state>``, where
  ``hold`` as the want is ``apt-mark hold``. Read bounded (a large desktop's status file is a
  few MiB; a collection keeps its first MiB): a package past the cut is not seen, and
  :attr:`Packages.truncated` says so.
- apt's periodic upgrades (``apt.conf(5)``, unattended-upgrades' README): files in
  ``/etc/apt/apt.conf.d`` are read in name order, ``APT::Periodic::Unattended-Upgrade "1";``
  turns it on, a later file can turn it off; ``Unattended-Upgrade::Package-Blacklist`` holds
  regular expressions (prefixes in practice) of packages it never upgrades.
- dnf-automatic: ``/etc/dnf/automatic.conf`` ``apply_updates = yes`` with its timer enabled;
  ``/etc/dnf/plugins/versionlock.list`` and ``exclude=`` in ``/etc/dnf/dnf.conf`` keep packages.
- ``/var/run/reboot-required.pkgs``: packages that asked for a reboot (Ubuntu's
  update-notifier hooks).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from auditor.checks.lib import files
from auditor.hosts.base import Host
from auditor.parsing import lazy_re

DPKG_STATUS = "/var/lib/dpkg/status"
APT_CONF_D = "/etc/apt/apt.conf.d/*"
APT_CONF = "/etc/apt/apt.conf"
UNATTENDED_BINARY = "/usr/bin/unattended-upgrade"
DNF_AUTOMATIC = "/etc/dnf/automatic.conf"
DNF_CONF = "/etc/dnf/dnf.conf"
VERSIONLOCK = "/etc/dnf/plugins/versionlock.list"
DNF_TIMERS = "/etc/systemd/system/timers.target.wants/dnf-automatic*.timer"
REBOOT_REQUIRED = ("/var/run/reboot-required.pkgs", "/run/reboot-required.pkgs")

#: What :func:`dpkg_packages` reads.
DPKG_READS: tuple[str, ...] = (DPKG_STATUS,)
#: What :func:`upgrade_policy` reads.
UPGRADE_READS: tuple[str, ...] = (APT_CONF, APT_CONF_D, UNATTENDED_BINARY, DNF_AUTOMATIC,
                                  DNF_CONF, VERSIONLOCK, DNF_TIMERS, *REBOOT_REQUIRED)

_STATUS_LIMIT = 8 << 20
_MAX_PACKAGES = 20000
_NAME = lazy_re(r"[a-z0-9][a-z0-9+.-]{0,127}")


class Package(NamedTuple):
    """One package dpkg knows."""

    name: str
    version: str
    #: ``install``, ``hold``, ``deinstall``, ``purge``.
    want: str
    #: ``installed``, ``config-files``, ``half-installed``...
    state: str

    @property
    def installed(self) -> bool:
        """Return whether the package is installed (held or not)."""
        return self.state in ("installed", "half-configured", "unpacked", "triggers-awaited",
                              "triggers-pending")

    @property
    def held(self) -> bool:
        """Return whether ``apt-mark hold`` keeps the package."""
        return self.want == "hold"


class Packages(NamedTuple):
    """The packages of a dpkg status file."""

    by_name: dict[str, Package]
    #: The file was cut at the read limit: packages past it are missing.
    truncated: bool = False
    #: The file exists (this is a dpkg system).
    present: bool = False

    def installed(self, prefix: str = "") -> list[Package]:
        """Return the installed packages whose name starts with ``prefix``."""
        return [p for name, p in sorted(self.by_name.items())
                if name.startswith(prefix) and p.installed]


def parse_dpkg_status(text: str) -> dict[str, Package]:
    """Parse dpkg status stanzas (Package, Version, Status), bounded."""
    found: dict[str, Package] = {}
    name = version = status = ""
    for line in text.split("\n"):
        if not line.strip():
            if name and _NAME.fullmatch(name) and len(found) < _MAX_PACKAGES:
                words = status.split()
                if len(words) == 3:
                    found[name] = Package(name, version[:128], words[0], words[2])
            name = version = status = ""
            continue
        if line[0] in " \t":
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue
        if key == "Package":
            name = value.strip()
        elif key == "Version":
            version = value.strip()
        elif key == "Status":
            status = value.strip()[:128]
    if name and _NAME.fullmatch(name):
        words = status.split()
        if len(words) == 3:
            found[name] = Package(name, version[:128], words[0], words[2])
    return found


def _read_dpkg(host: Host) -> Packages:
    raw = files.read_bytes(host, DPKG_STATUS, _STATUS_LIMIT)
    if raw is None:
        return Packages({}, False, False)
    truncated = len(raw) >= _STATUS_LIMIT
    if truncated or len(raw) == 1 << 20:
        # Cut at the limit (or at a collection's 1 MiB cap): drop the partial last stanza.
        raw = raw[: raw.rfind(b"\n\n") + 1]
        truncated = True
    return Packages(parse_dpkg_status(raw.decode("utf-8", "replace")), truncated, True)


def dpkg_packages(host: Host) -> Packages:
    """Return the host's dpkg packages, read once per host."""
    return host.fact("dpkg.packages", _read_dpkg)


# -- automatic upgrades ----------------------------------------------------------------------

_APT_SETTING = lazy_re(r'^\s*([A-Za-z0-9:_-]{1,128})\s+"([^"]{0,256})"\s*;')
_QUOTED = lazy_re(r'"([^"]{0,256})"')


class UpgradePolicy(NamedTuple):
    """Who upgrades packages unattended, and what they leave alone."""

    #: ``unattended-upgrades``, ``dnf-automatic`` or "" (none found on).
    tool: str
    #: Where it is turned on (``file``).
    where: str = ""
    #: Patterns the tool never upgrades (apt Package-Blacklist, dnf exclude / versionlock).
    kept: tuple[str, ...] = ()
    #: Packages listed in reboot-required.pkgs.
    reboot_required: tuple[str, ...] = ()


def _apt_files(host: Host) -> list[str]:
    files = [APT_CONF] if host.exists(APT_CONF) else []
    # apt reads the parts directory in name order, skipping names with other characters
    # (apt.conf(5): only [A-Za-z0-9_.-] and no extension but .conf or none).
    for path in host.glob(APT_CONF_D)[:256]:
        name = path.rsplit("/", 1)[1]
        if re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", name) and (
            "." not in name or name.endswith(".conf")
        ):
            files.append(path)
    return files


def _apt_policy(host: Host) -> UpgradePolicy | None:
    enabled, where = False, ""
    kept: list[str] = []
    for path in _apt_files(host):
        text = files.read_optional(host, path) or ""
        in_blacklist = False
        for raw in text.split("\n")[:2048]:
            line = raw.split("//", 1)[0][:1024]
            setting = _APT_SETTING.match(line)
            if setting and setting.group(1) == "APT::Periodic::Unattended-Upgrade":
                enabled, where = setting.group(2).strip() not in ("0", ""), path
            if "Unattended-Upgrade::Package-Blacklist" in line:
                in_blacklist = True
            if in_blacklist:
                kept.extend(_QUOTED.findall(line.split("Package-Blacklist", 1)[-1]))
                if "};" in line:
                    in_blacklist = False
    if not enabled:
        return None
    if not host.exists(UNATTENDED_BINARY):
        return None
    return UpgradePolicy("unattended-upgrades", where, tuple(kept))


def _dnf_policy(host: Host) -> UpgradePolicy | None:
    text = files.read_optional(host, DNF_AUTOMATIC)
    if text is None or not host.glob(DNF_TIMERS):
        return None
    apply = False
    for line in text.split("\n")[:1024]:
        key, sep, value = line.partition("=")
        if sep and key.strip() == "apply_updates":
            apply = value.strip().lower() in ("yes", "true", "1", "on")
    if not apply:
        return None
    kept: list[str] = []
    for line in (files.read_optional(host, DNF_CONF) or "").split("\n")[:1024]:
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("exclude", "excludepkgs"):
            kept.extend(w for w in value.replace(",", " ").split()[:256])
    for line in (files.read_optional(host, VERSIONLOCK) or "").split("\n")[:4096]:
        line = line.strip()
        if line and not line.startswith("#"):
            kept.append(line.lstrip("!")[:256])
    return UpgradePolicy("dnf-automatic", DNF_AUTOMATIC, tuple(kept))


def upgrade_policy(host: Host) -> UpgradePolicy:
    """Return the unattended upgrade tool that is on, and what it keeps back."""
    reboot: list[str] = []
    for path in REBOOT_REQUIRED:
        text = files.read_optional(host, path)
        if text is not None:
            reboot = [w for w in text.split()[:1024] if _NAME.fullmatch(w)]
            break
    found = _apt_policy(host) or _dnf_policy(host) or UpgradePolicy("")
    return UpgradePolicy(found.tool, found.where, found.kept, tuple(reboot))


def kept_back(policy: UpgradePolicy, package: str) -> bool:
    """Return whether the policy's patterns keep ``package`` from unattended upgrades."""
    for pattern in policy.kept:
        text = pattern.strip()
        if not text:
            continue
        # apt's blacklist entries are regular expressions matched from the start; dnf's are
        # globs. Both are taken as prefixes here: "nvidia-", "nvidia-*", "^nvidia-".
        prefix = text.lstrip("^").rstrip("*$").replace(".*", "")
        if prefix and package.startswith(prefix):
            return True
        # A dnf versionlock entry is name-[epoch:]version-release.arch.
        if text.startswith(package + "-") and text[len(package) + 1:][:1].isdigit():
            return True
    return False
