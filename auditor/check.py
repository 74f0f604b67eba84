"""The check base class: everything about a check declared on one class.

A check declares its id, severity, one-line docstring, rationale and remedy, the
paths it reads, its options (a frozen value, with values per profile), and a
pure ``evaluate``. A check that software can fix also declares ``remediate`` and
the extra paths that reads (``fix_reads``); one that a device event can change
declares the ``events`` that re-run it under ``audit watch``. The registry
derives the fixable set, the fix reads, the watched set and the profile keys
from these declarations: nothing about a check is written down twice.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

from auditor.errors import PolicyError
from auditor.hosts.base import Host
from auditor.model import Finding, Severity, Status

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform

    from auditor.remedy import FixContext, Remedy
else:
    def dataclass_transform(**_: object) -> Any:
        """Only type checkers read PEP 681's marker: at run time, leave the class as it is."""
        return lambda cls: cls


class Trigger(str, enum.Enum):
    """A kind of device event that can change what a check finds (``audit watch``)."""

    #: Any PCI event: hot-plug, driver bind or unbind, ``udevadm trigger``.
    PCI = "pci"
    #: A GPU driver module loaded or unloaded, or a GPU bound to or unbound from it.
    GPU_MODULE = "gpu-module"
    #: A GPU device node appeared or went away (its major may have moved).
    GPU_NODE = "gpu-node"


# -- options ------------------------------------------------------------------------------

_CHOICES, _MINIMUM, _MAXIMUM, _HELP = "choices", "minimum", "maximum", "help"


def option(
    default: Any,
    *,
    help: str = "",
    choices: Sequence[Any] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
) -> Any:
    """Declare one option of a check's options class, with what values it takes."""
    metadata = {_HELP: help, _CHOICES: tuple(choices) if choices is not None else None,
                _MINIMUM: minimum, _MAXIMUM: maximum}
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class OptionSpec:
    """One option as the policy and ``audit explain`` see it."""

    name: str
    type: type
    default: Any
    help: str = ""
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None

    def allowed(self) -> str:
        """Return the values the option takes, in words."""
        if self.choices is not None:
            return "one of " + ", ".join(str(c) for c in self.choices)
        kind = _TYPE_WORDS.get(self.type, self.type.__name__)
        if self.minimum is not None and self.maximum is not None:
            return f"{kind} from {self.minimum:g} to {self.maximum:g}"
        if self.minimum is not None:
            return f"{kind} of at least {self.minimum:g}"
        if self.maximum is not None:
            return f"{kind} of at most {self.maximum:g}"
        return kind

    def coerce(self, value: Any, where: str) -> Any:
        """Return ``value`` as this option's type, or raise PolicyError naming ``where``."""
        def wrong() -> PolicyError:
            return PolicyError(f"{where} must be {self.allowed()}, got {value!r}")

        if self.type is bool:
            if not isinstance(value, bool):
                raise wrong()
        elif self.type is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise wrong()
        elif self.type is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise wrong()
            value = float(value)
        elif self.type is str:
            if not isinstance(value, str):
                raise wrong()
        elif self.type is tuple:
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
                raise wrong()
            value = tuple(items)
        if self.choices is not None and value not in self.choices:
            raise wrong()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and (
            (self.minimum is not None and value < self.minimum)
            or (self.maximum is not None and value > self.maximum)
        ):
            raise wrong()
        return value


_TYPE_WORDS = {bool: "a boolean (true or false)", int: "an integer", float: "a number",
               str: "a string", tuple: "a list of strings"}
_TYPES: dict[Any, type] = {"bool": bool, "int": int, "float": float, "str": str,
                           "tuple[str, ...]": tuple, bool: bool, int: int, float: float,
                           str: str}


#: What an options class holds for each of its options: annotation, default, metadata.
_Field = tuple[Any, Any, Mapping[str, Any]]


@dataclass_transform(kw_only_default=True, frozen_default=True)
class CheckOptions:
    """A check's options: a frozen value whose fields are declared with :func:`option`.

    A subclass is declared as a plain class (no decorator): type checkers see a frozen,
    keyword-only dataclass (PEP 681), while at run time every options class shares the
    methods below instead of having a dataclass's generated for it: each command defines
    every check's options at start-up, and generating them cost more than the rest of
    the class. (A subclass decorated with ``@dataclass(frozen=True)`` still works.)

    The base class has none. Supported types: ``bool``, ``int``, ``float``, ``str`` and
    ``tuple[str, ...]`` (all immutable, so a default is shared safely); values are
    checked against the type, ``choices`` and range when a policy is loaded, so
    ``evaluate`` reads typed, valid values.
    """

    #: Each option's annotation, default and metadata, in declaration order (bases first).
    _fields: ClassVar[dict[str, _Field]] = {}
    #: What :meth:`specs` found, kept on the class it was found for.
    _specs: ClassVar[dict[str, OptionSpec] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields = dict(cls._fields)
        for name, annotation in getattr(cls, "__annotations__", {}).items():
            if _is_class_var(annotation):
                continue
            declared = cls.__dict__.get(name, dataclasses.MISSING)
            metadata: Mapping[str, Any] = {}
            default = declared
            if isinstance(declared, dataclasses.Field):
                default, metadata = declared.default, declared.metadata
            if default is dataclasses.MISSING:
                raise TypeError(f"{cls.__qualname__}.{name}: an option needs a default")
            # The class attribute reads as the default, as on a dataclass.
            setattr(cls, name, default)
            fields[name] = (annotation, default, metadata)
        cls._fields = fields

    def __init__(self, **values: Any) -> None:
        for name, (_, default, _) in self._fields.items():
            object.__setattr__(self, name, values.pop(name, default))
        if values:
            raise TypeError(f"{type(self).__qualname__}() got unexpected options: "
                            f"{', '.join(sorted(values))}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CheckOptions) or other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((self.__class__, self._values()))

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__qualname__}({shown})"

    @classmethod
    def specs(cls) -> dict[str, OptionSpec]:
        """Return each option's name, type, default and allowed values."""
        cached: dict[str, OptionSpec] | None = cls.__dict__.get("_specs")
        if cached is not None:
            return dict(cached)
        # Annotations are strings (``from __future__ import annotations``): the plain ones
        # are looked up as written; only others are evaluated (get_type_hints is costly).
        hints: dict[str, Any] | None = None
        found: dict[str, OptionSpec] = {}
        for name, field in cls._fields.items():
            annotation: Any = field[0]
            default, meta = field[1], field[2]
            if annotation not in _TYPES:
                if hints is None:
                    hints = typing.get_type_hints(cls)
                annotation = hints.get(name, annotation)
            kind = _TYPES.get(annotation) or _TYPES.get(str(annotation).replace("typing.", ""))
            if kind is None and typing.get_origin(annotation) is tuple:
                kind = tuple
            if kind is None:
                raise TypeError(f"{cls.__qualname__}.{name}: unsupported option type "
                                f"{annotation!r}")
            found[name] = OptionSpec(
                name=name, type=kind, default=default, help=meta.get(_HELP, ""),
                choices=meta.get(_CHOICES), minimum=meta.get(_MINIMUM),
                maximum=meta.get(_MAXIMUM),
            )
        cls._specs = found  # on this class only: a subclass has its own fields
        return dict(found)

    @classmethod
    def build(cls, values: Mapping[str, Any], source: str, check_id: str) -> CheckOptions:
        """Return the options with ``values`` laid over the defaults, each one validated."""
        specs = cls.specs()
        typed: dict[str, Any] = {}
        for key, value in values.items():
            spec = specs.get(key)
            if spec is None:
                known = ", ".join(sorted(specs)) or "none"
                raise PolicyError(f"{source}: {check_id} has no option {key!r} (options: {known})")
            typed[key] = spec.coerce(value, f"{source}: {check_id}.{key}")
        built = cls(**typed)
        built.validate(f"{source}: {check_id}")
        return built

    def validate(self, where: str) -> None:
        """Raise PolicyError when options are valid one by one but not together."""

    def to_dict(self) -> dict[str, Any]:
        """Return the values by option name."""
        return {name: getattr(self, name) for name in self._fields}


def _is_class_var(annotation: Any) -> bool:
    """Return whether an annotation (a string, or evaluated) declares a ``ClassVar``."""
    if isinstance(annotation, str):
        return annotation.replace("typing.", "").startswith("ClassVar")
    return annotation is ClassVar or typing.get_origin(annotation) is ClassVar


OptionsT = TypeVar("OptionsT", bound=CheckOptions)


# -- the check ----------------------------------------------------------------------------


class Check(ABC, Generic[OptionsT]):
    """One check agent: reads a host through the seam and yields findings.

    The first line of a subclass's docstring is its one-line summary.
    """

    #: Dotted lower-case id, ``area.name``.
    id: ClassVar[str]
    #: How much a problem this check finds costs an inference workload.
    severity: ClassVar[Severity]
    #: Shell patterns of every path the check may read (the SSH collector and
    #: ``audit snapshot`` fetch exactly these).
    reads: ClassVar[tuple[str, ...]]
    #: Why it matters for inference (``audit explain``).
    rationale: ClassVar[str]
    #: How it is fixed (``audit explain``).
    remedy: ClassVar[str]
    #: The options dataclass; a policy file overrides its defaults.
    options_type: ClassVar[type[CheckOptions]] = CheckOptions
    #: Option values per built-in profile (``latency``, ``throughput``) where they differ
    #: from the defaults, which are the ``gpu-inference`` profile's.
    profiles: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    #: Paths ``remediate`` reads beyond ``reads`` (the collector fetches them for a fix).
    fix_reads: ClassVar[tuple[str, ...]] = ()
    #: Device events that re-run the check under ``audit watch``.
    events: ClassVar[frozenset[Trigger]] = frozenset()
    #: The version of the distribution that first shipped the check (``N.N`` or ``N.N.N``):
    #: a built-in's is a host-auditor version, a plug-in's its own distribution's.
    version_added: ClassVar[str] = ""
    #: Names of the processes the check looks for among the running ones (``/proc/PID/comm``):
    #: a snapshot keeps these processes' entries and no other part of the process list.
    daemons: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, options: OptionsT | None = None) -> None:
        chosen = options if options is not None else self.options_type()
        self.options: OptionsT = cast(OptionsT, chosen)

    @classmethod
    def configured(cls, **values: Any) -> Check[Any]:
        """Return the check with these option values laid over its defaults, validated."""
        return cls(cast(OptionsT, cls.options_type.build(values, "options", cls.id)))

    @classmethod
    def summary(cls) -> str:
        """Return the first line of the check's docstring."""
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    @classmethod
    def fixable(cls) -> bool:
        """Return whether the check declares a remediation."""
        return cls.remediate is not Check.remediate

    @abstractmethod
    def evaluate(self, host: Host) -> Iterable[Finding]:
        """Yield the findings for ``host``; at least one, a skip when nothing can be judged."""

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> Sequence[Remedy]:
        """Return the remedies for this check's problem findings (only fixable checks)."""
        raise NotImplementedError(f"{self.id} has no remediation")

    def advice_on_the_host(self, findings: Sequence[Finding], where: str,
                           title: str = "on the host: {subject}") -> list[Remedy]:
        """Return remedies that change nothing here and say what to do on the host.

        Inside a container ``/sys`` and ``/proc/sys`` are the host's and read-only, and a
        unit installed in the container changes nothing: each finding's own fix is
        advice for the host. ``where`` is :meth:`Environment.describe`.
        """
        from auditor.remedy import Advice, Remedy

        return [Remedy(
            check=self.id, subject=f.subject, title=title.format(subject=f.subject),
            advice=(Advice(f"on the host, not in this {where}: "
                           f"{f.fix.removeprefix('on the host: ')}"),),
        ) for f in findings if f.fix]

    # -- finding factories: the runner stamps the host ----------------------------------

    def finding(
        self,
        status: Status,
        subject: str,
        message: str,
        *,
        observed: str = "",
        expected: str = "",
        fix: str = "",
        severity: Severity | None = None,
        evidence: Mapping[str, str] | None = None,
        aspect: str = "",
    ) -> Finding:
        """Build a finding of this check (``aspect``: which of several judgements of one
        subject it is, such as a device's ``link`` beside its MaxReadReq)."""
        return Finding(
            check=self.id,
            status=status,
            severity=severity or self.severity,
            subject=subject,
            message=message,
            observed=observed,
            expected=expected,
            fix=fix,
            evidence=tuple((evidence or {}).items()),
            aspect=aspect,
        )

    def passed(self, subject: str, message: str, **kw: Any) -> Finding:
        """Build a ``pass`` finding."""
        return self.finding(Status.PASS, subject, message, **kw)

    def failed(self, subject: str, message: str, **kw: Any) -> Finding:
        """Build a ``fail`` finding."""
        return self.finding(Status.FAIL, subject, message, **kw)

    def warned(self, subject: str, message: str, **kw: Any) -> Finding:
        """Build a ``warn`` finding."""
        return self.finding(Status.WARN, subject, message, **kw)

    def skipped(self, subject: str, reason: str, **kw: Any) -> Finding:
        """Build a ``skip`` finding: the check cannot judge, and says why."""
        return self.finding(Status.SKIP, subject, reason, **kw)


#: A check class whatever its options.
CheckClass = type[Check[Any]]
