"""Thresholds and waivers: built-in profiles, overridden by a TOML policy file."""

from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from auditor import registry
from auditor.check import CheckClass, CheckOptions
from auditor.errors import PolicyError
from auditor.model import Finding, Status

#: Built-in profiles; each check declares its option values for the profiles where they
#: differ from its defaults (``Check.profiles``), which are ``gpu-inference``'s:
#:
#: - ``gpu-inference`` (default): a GPU serving host. Keep C-states to C1/C1E (an exit
#:   of at most 20 us), the ``performance`` governor and 4096-byte PCIe reads for the
#:   host-to-device copies.
#: - ``latency``: interactive, small-batch serving where a token's tail latency counts:
#:   only C1 (exit of at most 2 us) may be entered, the rest as above.
#: - ``throughput``: offline, large-batch work where bandwidth counts and a C-state
#:   wake-up hides behind long kernels: states up to 50 us exit (C6 on most servers
#:   stays off, deeper package states too), the rest as above.
PROFILES = registry.PROFILES
DEFAULT_PROFILE = registry.DEFAULT_PROFILE
#: The largest policy file read (a policy is a few kilobytes).
MAX_POLICY_BYTES = 4 << 20


@dataclass(frozen=True)
class Waiver:
    """Accept a known finding on a host or device, for a reason, until a date."""

    check: str
    reason: str
    host: str = "*"
    subject: str = "*"
    expires: dt.date | None = None

    def matches(self, finding: Finding) -> bool:
        """Return whether the waiver names this finding's check, host and subject.

        Host names compare without case (DNS names have none); subjects compare exactly.
        """
        return (
            finding.check == self.check
            and fnmatch.fnmatchcase(finding.host.lower(), self.host.lower())
            and fnmatch.fnmatchcase(finding.subject, self.subject)
        )

    def expired(self, today: dt.date) -> bool:
        """Return whether the waiver has lapsed: it holds through its ``expires`` day."""
        return self.expires is not None and self.expires < today


@dataclass(frozen=True)
class Policy:
    """The options every check runs with, and the waivers applied to its findings."""

    profile: str = DEFAULT_PROFILE
    #: Each check's validated options, by check id (a check not named runs its defaults).
    options: Mapping[str, CheckOptions] = field(default_factory=dict)
    waivers: tuple[Waiver, ...] = ()
    #: The policy file the values came from (None: the profile alone), and its SHA-256.
    source: str | None = None
    sha256: str = ""

    def provenance(self) -> tuple[tuple[str, str], ...]:
        """Return what a report records of the policy: the profile, the file and its hash."""
        if self.source is None:
            return (("profile", self.profile),)
        return (("profile", self.profile), ("file", self.source), ("sha256", self.sha256))

    def options_for(self, check: CheckClass) -> CheckOptions:
        """Return the check's options under this policy (its defaults if it names none)."""
        found = self.options.get(check.id)
        return found if found is not None else check.options_type()

    def apply_waivers(self, finding: Finding, today: dt.date | None = None) -> Finding:
        """Return the finding waived by the first live waiver that matches, else unchanged.

        A waived finding keeps its real status and is marked ``waived``, with the
        waiver's reason; it no longer counts as a problem. A matching waiver past its
        expiry date waives nothing: its message and evidence say which lapsed and when.
        """
        if finding.status not in (Status.WARN, Status.FAIL):
            return finding
        today = today or dt.date.today()
        lapsed: Waiver | None = None
        for waiver in self.waivers:
            if not waiver.matches(finding):
                continue
            if waiver.expired(today):
                lapsed = lapsed or waiver
                continue
            until = f" (until {waiver.expires.isoformat()})" if waiver.expires else ""
            return replace(finding, waived=True, waiver=f"{waiver.reason}{until}")
        if lapsed is not None and lapsed.expires is not None:
            expired = lapsed.expires.isoformat()
            return replace(
                finding,
                message=f"{finding.message} (waiver expired on {expired}: {lapsed.reason})",
                evidence=(*finding.evidence, ("waiver_expired", expired),
                          ("waiver_reason", lapsed.reason)),
            )
        return finding


def _check_table(source: str, check_id: Any, values: Any,
                 checks: Mapping[str, CheckClass]) -> Mapping[str, Any]:
    if not isinstance(check_id, str) or check_id not in checks:
        hint = ""
        if isinstance(values, Mapping) and isinstance(check_id, str) and any(
            f"{check_id}.{key}" in checks for key in values
        ):
            hint = f' (quote a dotted id: [checks."{check_id}.{next(iter(values))}"])'
        raise PolicyError(f"{source}: unknown check id {check_id!r}{hint}")
    if not isinstance(values, Mapping):
        raise PolicyError(f"{source}: [checks.{check_id!r}] must be a table")
    return values


def _waiver(source: str, index: int, data: Any, checks: Mapping[str, CheckClass]) -> Waiver:
    where = f"{source}: waivers[{index}]"
    if not isinstance(data, Mapping):
        raise PolicyError(f"{where} must be a table")
    unknown = set(data) - {"check", "reason", "host", "subject", "expires"}
    if unknown:
        raise PolicyError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    check_id = data.get("check")
    if not isinstance(check_id, str) or check_id not in checks:
        raise PolicyError(f"{where}: unknown check id {check_id!r}")
    reason = data.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise PolicyError(f"{where}: a waiver needs a reason")
    expires = data.get("expires")
    if isinstance(expires, str):
        try:
            expires = dt.date.fromisoformat(expires)
        except ValueError as exc:
            raise PolicyError(f"{where}: expires {expires!r} is not a YYYY-MM-DD date") from exc
    if isinstance(expires, dt.datetime):
        expires = expires.date()
    if expires is not None and not isinstance(expires, dt.date):
        raise PolicyError(f"{where}: expires must be a date (YYYY-MM-DD), got {expires!r}")
    for key in ("host", "subject"):
        pattern = data.get(key, "*")
        if not isinstance(pattern, str) or not pattern:
            raise PolicyError(f"{where}: {key} must be a non-empty string (a glob)")
    return Waiver(
        check=check_id,
        reason=" ".join(reason.split()),
        host=str(data.get("host", "*")),
        subject=str(data.get("subject", "*")),
        expires=expires,
    )


@dataclass(frozen=True)
class PolicyFile:
    """A policy file as read: its path, its TOML tables and the SHA-256 of its bytes."""

    path: str
    data: Mapping[str, Any]
    sha256: str


#: The tables a policy file may hold.
POLICY_KEYS = frozenset({"profile", "checks", "waivers", "local-plugins"})


def read_policy(path: str) -> PolicyFile:
    """Read and parse a policy file (bounded); a file that is not one is a PolicyError."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_POLICY_BYTES + 1)
        if len(raw) > MAX_POLICY_BYTES:
            raise PolicyError(f"{path}: policy file larger than {MAX_POLICY_BYTES >> 20} MiB")
        digest = hashlib.sha256(raw).hexdigest()
        data = tomllib.loads(raw.decode("utf-8"))
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read policy file ({exc.strerror})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{path}: not valid TOML ({' '.join(str(exc).split())})") from exc
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{path}: not valid TOML (not UTF-8 text)") from exc
    except RecursionError as exc:
        raise PolicyError(f"{path}: not valid TOML (nested too deeply)") from exc
    unknown = set(data) - POLICY_KEYS
    if unknown:
        raise PolicyError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    return PolicyFile(path, data, digest)


def local_plugins(policy: PolicyFile | None) -> list[CheckClass]:
    """Return the site's own checks that a policy file names in ``[local-plugins]``.

    As flake8's ``local-plugins``: ``paths`` are directories (relative to the policy
    file's) to import from, ``checks`` entries ``"ID = module:Class"``, as an entry point
    would be written. The classes are loaded and validated here; the caller validates them
    with every other check (an id taken twice is refused).
    """
    if policy is None or "local-plugins" not in policy.data:
        return []
    import os

    where = f"{policy.path}: local-plugins"
    table = policy.data["local-plugins"]
    if not isinstance(table, Mapping):
        raise PolicyError(f"{where} must be a table")
    unknown = set(table) - {"paths", "checks"}
    if unknown:
        raise PolicyError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    paths, entries = table.get("paths", []), table.get("checks", [])
    for key, value in (("paths", paths), ("checks", entries)):
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise PolicyError(f"{where}: {key} must be a list of strings")
    base = os.path.dirname(os.path.abspath(policy.path))
    specs: list[tuple[str, str]] = []
    for entry in entries:
        check_id, sep, value = (part.strip() for part in entry.partition("="))
        if not sep or not check_id or ":" not in value:
            raise PolicyError(f"{where}: {entry!r} is not \"ID = module:Class\"")
        specs.append((check_id, value))
    return registry.load_local(specs, [os.path.normpath(os.path.join(base, p)) for p in paths],
                               where)


def load_policy(
    checks: Sequence[CheckClass], path: str | None = None, profile: str | None = None,
    *, document: PolicyFile | None = None,
) -> Policy:
    """Build the policy from a profile name and an optional TOML file (the file wins).

    ``document``: the file at ``path`` already read (:func:`read_policy`), so the policy and
    its local plug-ins come from the same bytes.
    """
    by_id = {c.id: c for c in checks}
    data: Mapping[str, Any] = {}
    digest = ""
    if path is not None:
        document = document if document is not None else read_policy(path)
        data, digest = document.data, document.sha256
    name = profile or data.get("profile") or DEFAULT_PROFILE
    if not isinstance(name, str) or name not in PROFILES:
        raise PolicyError(f"unknown profile {name!r} (profiles: {', '.join(PROFILES)})")
    source = path or "policy"
    table = data.get("checks", {})
    if not isinstance(table, Mapping):
        raise PolicyError(f"{source}: [checks] must be a table")
    overrides = {check_id: _check_table(source, check_id, values, by_id)
                 for check_id, values in table.items()}
    options: dict[str, CheckOptions] = {}
    for check in checks:
        profile_values = check.profiles.get(name, {})
        file_values = overrides.get(check.id, {})
        if not profile_values and not file_values:
            continue
        # Profile values were validated when the check was registered: an error here
        # is the file's.
        options[check.id] = check.options_type.build({**profile_values, **file_values},
                                                     source, check.id)
    raw_waivers = data.get("waivers", [])
    if not isinstance(raw_waivers, list):
        raise PolicyError(f"{source}: waivers must be an array of tables ([[waivers]])")
    waivers = tuple(_waiver(source, i, w, by_id) for i, w in enumerate(raw_waivers))
    return Policy(profile=name, options=options, waivers=waivers, source=path, sha256=digest)
