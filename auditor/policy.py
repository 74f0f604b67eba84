"""Thresholds and waivers: built-in profiles, overridden by a TOML policy file."""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from auditor.check import Check
from auditor.errors import PolicyError
from auditor.model import Finding, Status

DEFAULT_PROFILE = "gpu-inference"

#: Built-in profiles: per check id, option values laid over the checks' defaults. They
#: name only the option keys the checks define (a test holds them to it); a profile
#: entry for a check that is not registered is left out.
#:
#: - ``gpu-inference`` (default): a GPU serving host. Keep C-states to C1/C1E (an exit
#:   of at most 20 us), the ``performance`` governor and 4096-byte PCIe reads for the
#:   host-to-device copies; the kernel minimum stays kernel.version's own.
#: - ``latency``: interactive, small-batch serving where a token's tail latency counts:
#:   only C1 (exit of at most 2 us) may be entered, the rest as above.
#: - ``throughput``: offline, large-batch work where bandwidth counts and a C-state
#:   wake-up hides behind long kernels: states up to 50 us exit (C6 on most servers
#:   stays off, deeper package states too), ``performance`` governor, 4096-byte reads.
PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "gpu-inference": {
        "cpu.cstates": {"max_exit_latency_us": 20},
        "cpu.governor": {"governor": "performance"},
        "pcie.mrrs": {"min_read_request_bytes": 4096},
    },
    "latency": {
        "cpu.cstates": {"max_exit_latency_us": 2},
        "cpu.governor": {"governor": "performance"},
        "pcie.mrrs": {"min_read_request_bytes": 4096},
    },
    "throughput": {
        "cpu.cstates": {"max_exit_latency_us": 50},
        "cpu.governor": {"governor": "performance"},
        "pcie.mrrs": {"min_read_request_bytes": 4096},
    },
}


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
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    waivers: tuple[Waiver, ...] = ()

    def options_for(self, check: type[Check]) -> dict[str, Any]:
        """Return the check's defaults overlaid with this policy's values."""
        return {**check.defaults, **self.options.get(check.id, {})}

    def apply_waivers(self, finding: Finding, today: dt.date | None = None) -> Finding:
        """Return the finding waived by the first live waiver that matches, else unchanged.

        A matching waiver past its expiry date waives nothing: the finding keeps its
        status, and its message and evidence say which waiver lapsed and when.
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
            until = f" until {waiver.expires.isoformat()}" if waiver.expires else ""
            return replace(
                finding,
                status=Status.PASS,
                message=f"waived{until}: {waiver.reason} [{finding.status.value}: "
                f"{finding.message}]",
                evidence=(*finding.evidence, ("waived", finding.status.value),
                          ("waiver_reason", waiver.reason)),
            )
        if lapsed is not None and lapsed.expires is not None:
            expired = lapsed.expires.isoformat()
            return replace(
                finding,
                message=f"{finding.message} (waiver expired on {expired}: {lapsed.reason})",
                evidence=(*finding.evidence, ("waiver_expired", expired),
                          ("waiver_reason", lapsed.reason)),
            )
        return finding


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", tuple: "a list"}.get(type(value), type(value).__name__)


def _coerce(source: str, where: str, default: Any, value: Any) -> Any:
    """Return ``value`` in the type of ``default``, or raise PolicyError."""
    def wrong() -> PolicyError:
        return PolicyError(f"{source}: {where} must be {_type_name(default)}, got {value!r}")

    if default is None:  # no default: any scalar a TOML file can hold
        if isinstance(value, (str, int, float, bool)):
            return value
        raise wrong()
    if isinstance(default, bool) or isinstance(value, bool):
        if isinstance(default, bool) and isinstance(value, bool):
            return value
        raise wrong()
    if isinstance(default, float):
        if isinstance(value, (int, float)):
            return float(value)
        raise wrong()
    if isinstance(default, (list, tuple)):
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            raise wrong()
        kinds = {type(item) for item in default}
        if kinds and any(type(item) not in kinds for item in items):
            raise wrong()
        return type(default)(items)
    if isinstance(value, type(default)):
        return value
    raise wrong()


def _check_values(
    source: str, check_id: Any, values: Any, checks: Mapping[str, type[Check]]
) -> dict[str, Any]:
    if not isinstance(check_id, str) or check_id not in checks:
        hint = ""
        if isinstance(values, Mapping) and isinstance(check_id, str) and any(
            f"{check_id}.{key}" in checks for key in values
        ):
            hint = f' (quote a dotted id: [checks."{check_id}.{next(iter(values))}"])'
        raise PolicyError(f"{source}: unknown check id {check_id!r}{hint}")
    if not isinstance(values, Mapping):
        raise PolicyError(f"{source}: [checks.{check_id!r}] must be a table")
    defaults = checks[check_id].defaults
    result: dict[str, Any] = {}
    for key, value in values.items():
        if key not in defaults:
            known = ", ".join(sorted(defaults)) or "none"
            raise PolicyError(f"{source}: {check_id} has no option {key!r} (options: {known})")
        result[key] = _coerce(source, f"{check_id}.{key}", defaults[key], value)
    return result


def _waiver(source: str, index: int, data: Any, checks: Mapping[str, type[Check]]) -> Waiver:
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


def load_policy(
    checks: Sequence[type[Check]], path: str | None = None, profile: str | None = None
) -> Policy:
    """Build the policy from a profile name and an optional TOML file (the file wins)."""
    by_id = {c.id: c for c in checks}
    data: dict[str, Any] = {}
    if path is not None:
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib  # type: ignore[no-redef]
        try:
            with open(path, "rb") as handle:
                data = tomllib.load(handle)
        except OSError as exc:
            raise PolicyError(f"{path}: cannot read policy file ({exc.strerror})") from exc
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"{path}: not valid TOML ({' '.join(str(exc).split())})") from exc
        except UnicodeDecodeError as exc:
            raise PolicyError(f"{path}: not valid TOML (not UTF-8 text)") from exc
        unknown = set(data) - {"profile", "checks", "waivers"}
        if unknown:
            raise PolicyError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    name = profile or data.get("profile") or DEFAULT_PROFILE
    if not isinstance(name, str) or name not in PROFILES:
        raise PolicyError(f"unknown profile {name!r} (profiles: {', '.join(PROFILES)})")
    options: dict[str, dict[str, Any]] = {}
    for check_id, values in PROFILES[name].items():
        if check_id in by_id:
            options[check_id] = _check_values(f"profile {name}", check_id, values, by_id)
    source = path or "policy"
    table = data.get("checks", {})
    if not isinstance(table, Mapping):
        raise PolicyError(f"{source}: [checks] must be a table")
    for check_id, values in table.items():
        options.setdefault(check_id, {}).update(_check_values(source, check_id, values, by_id))
    raw_waivers = data.get("waivers", [])
    if not isinstance(raw_waivers, list):
        raise PolicyError(f"{source}: waivers must be an array of tables ([[waivers]])")
    waivers = tuple(_waiver(source, i, w, by_id) for i, w in enumerate(raw_waivers))
    return Policy(profile=name, options=options, waivers=waivers)
