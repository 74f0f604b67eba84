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

#: Built-in profiles: per check id, the options that differ from the checks' defaults.
#: ``gpu-inference`` is the checks' own defaults.
PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "gpu-inference": {},
    "latency": {
        "cpu.cstates": {"max_exit_latency_us": 2},
        "pcie.mrrs": {"min_read_request_bytes": 4096},
    },
    "throughput": {
        "cpu.cstates": {"max_exit_latency_us": 50},
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
        """Return whether the waiver names this finding's check, host and subject."""
        return (
            finding.check == self.check
            and fnmatch.fnmatchcase(finding.host, self.host)
            and fnmatch.fnmatchcase(finding.subject, self.subject)
        )


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
        """Return the finding as waived, or noting an expired waiver, or unchanged."""
        if finding.status not in (Status.WARN, Status.FAIL):
            return finding
        today = today or dt.date.today()
        for waiver in self.waivers:
            if not waiver.matches(finding):
                continue
            until = f" until {waiver.expires.isoformat()}" if waiver.expires else ""
            if waiver.expires is not None and waiver.expires < today:
                return replace(
                    finding,
                    message=f"{finding.message} (waiver expired on {waiver.expires.isoformat()}:"
                    f" {waiver.reason})",
                )
            return replace(
                finding,
                status=Status.PASS,
                message=f"waived{until}: {waiver.reason} [{finding.status.value}: "
                f"{finding.message}]",
                evidence=(*finding.evidence, ("waived", finding.status.value)),
            )
        return finding


def _check_values(
    source: str, check_id: str, values: Any, checks: Mapping[str, type[Check]]
) -> dict[str, Any]:
    if check_id not in checks:
        raise PolicyError(f"{source}: unknown check id {check_id!r}")
    if not isinstance(values, Mapping):
        raise PolicyError(f"{source}: [checks.{check_id!r}] must be a table")
    defaults = checks[check_id].defaults
    result: dict[str, Any] = {}
    for key, value in values.items():
        if key not in defaults:
            known = ", ".join(sorted(defaults)) or "none"
            raise PolicyError(f"{source}: {check_id} has no option {key!r} (options: {known})")
        default = defaults[key]
        if isinstance(default, bool) != isinstance(value, bool) or not isinstance(
            value, (type(default), int) if isinstance(default, float) else type(default)
        ):
            raise PolicyError(
                f"{source}: {check_id}.{key} must be {type(default).__name__}, "
                f"got {value!r}"
            )
        result[key] = value
    return result


def _waiver(source: str, index: int, data: Any, checks: Mapping[str, type[Check]]) -> Waiver:
    where = f"{source}: waivers[{index}]"
    if not isinstance(data, Mapping):
        raise PolicyError(f"{where} must be a table")
    unknown = set(data) - {"check", "reason", "host", "subject", "expires"}
    if unknown:
        raise PolicyError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    check_id = data.get("check")
    if check_id not in checks:
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
        raise PolicyError(f"{where}: expires must be a date")
    for key in ("host", "subject"):
        if not isinstance(data.get(key, "*"), str):
            raise PolicyError(f"{where}: {key} must be a string")
    return Waiver(
        check=str(check_id),
        reason=reason.strip(),
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
            raise PolicyError(f"{path}: not valid TOML ({exc})") from exc
        unknown = set(data) - {"profile", "checks", "waivers"}
        if unknown:
            raise PolicyError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    name = profile or data.get("profile") or DEFAULT_PROFILE
    if name not in PROFILES:
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
