"""Host inventories: a plain host-per-line file, an Ansible INI or YAML inventory, and, where
Ansible is installed, anything ``ansible-inventory -i SRC --list`` takes.

Only what reaching a host needs is read: the name, ``ansible_host``, ``ansible_port``
and ``ansible_user`` (on the host, or in a group's vars). Groups and children only
gather hosts; every host is audited once.

Plain, INI and YAML files are read here (YAML through PyYAML's ``safe_load``), so they
need nothing installed. What only Ansible can evaluate goes through its own
``ansible-inventory``: a directory, an executable inventory script, a YAML file that
names an inventory ``plugin``, and a file with ``group_vars``/``host_vars`` beside it
(whose variables Ansible layers over the file's). An inventory that cannot be read is
a usage error: one line naming the file.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from auditor.errors import UsageError
from auditor.hosts.ssh import SshTarget, check_names, parse_target
from auditor.text import printable

_RANGE = re.compile(r"\[(\d+):(\d+)(?::(\d+))?\]|\[([a-z]):([a-z])\]")
_GROUP = re.compile(r"^\[([^\]:]+)(?::(vars|children))?\]$")
#: A YAML document's first line: a mapping key (``all:``, ``gpu: {...}``), a flow
#: mapping, or a document marker. A plain host line (``ops@gpu-02:2222``) has no ``: ``.
_YAML_START = re.compile(r"^(?:---|\{|[^\s#\[][^:\s]*:(?:\s|$))")
#: The largest inventory file read, and the most hosts one inventory may name.
MAX_INVENTORY_BYTES = 16 << 20
MAX_HOSTS = 100_000
#: Most groups and hosts a YAML document may hold, counted while walking it (anchors can
#: make a small document name one group many times over).
MAX_YAML_NODES = 1_000_000
#: How long ``ansible-inventory`` may take (a dynamic inventory asks a cloud API), and
#: the most it may print.
ANSIBLE_TIMEOUT_S = 300
MAX_ANSIBLE_OUTPUT = 256 << 20
YAML_SUFFIXES = (".yml", ".yaml", ".json")

Note = Callable[[str], None]


@dataclass
class _Group:
    hosts: dict[str, dict[str, str]] = field(default_factory=dict)
    vars: dict[str, str] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)


def expand_range(name: str, label: str = "inventory") -> list[str]:
    """Expand Ansible host ranges: ``gpu[01:03]`` is gpu01, gpu02, gpu03 (``[1:9:2]`` steps)."""
    match = _RANGE.search(name)
    if match is None:
        return [name]
    head, tail = name[: match.start()], name[match.end():]
    if match.group(1) is not None:
        start, end = match.group(1), match.group(2)
        step = int(match.group(3) or 1)
        width = len(start) if start.startswith("0") else 0
        if step < 1 or int(end) < int(start) or (int(end) - int(start)) // step >= MAX_HOSTS:
            raise UsageError(f"{label}: host range {match.group(0)!r} in {name!r} is not a "
                             f"range of at most {MAX_HOSTS} hosts")
        values = [str(n).zfill(width) for n in range(int(start), int(end) + 1, step)]
    else:
        values = [chr(c) for c in range(ord(match.group(4)), ord(match.group(5)) + 1)]
    expanded: list[str] = []
    for value in values:
        expanded.extend(expand_range(head + value + tail, label))
        if len(expanded) > MAX_HOSTS:
            raise UsageError(f"{label}: {name!r} names more than {MAX_HOSTS} hosts")
    return expanded


def _target(name: str, variables: Mapping[str, str], label: str) -> SshTarget:
    address = variables.get("ansible_host") or variables.get("ansible_ssh_host")
    port_text = variables.get("ansible_port") or variables.get("ansible_ssh_port")
    # Host and user names are held to OpenSSH's rules here, before any ssh config is read
    # (its Match exec runs them in a shell): one line naming the inventory, exit 2.
    try:
        base = parse_target(address if address else name)
        user = variables.get("ansible_user") or variables.get("ansible_ssh_user") or base.user
        check_names(base.host, user, name)
    except UsageError as exc:
        raise UsageError(f"{label}: host {printable(name)!r}: {exc}") from exc
    port = base.port
    if port_text:
        if not str(port_text).isdigit() or not 0 < int(port_text) < 65536:
            raise UsageError(f"{label}: host {name}: ansible_port {port_text!r} is not a port "
                             "number")
        port = int(port_text)
    display = name if address else base.label
    return SshTarget(host=base.host, user=user, port=port, label=display)


def _targets(hosts: Iterable[tuple[str, Mapping[str, str]]], label: str) -> list[SshTarget]:
    """Return one target per (address, port, user): a host listed twice is audited once."""
    targets: dict[tuple[str, int | None, str | None], SshTarget] = {}
    for name, variables in hosts:
        target = _target(name, variables, label)
        targets.setdefault((target.host, target.port, target.user), target)
    return list(targets.values())


def _resolve(groups: dict[str, _Group], label: str) -> list[SshTarget]:
    # Variables: all < parent groups < child groups < host, as Ansible layers them.
    parents: dict[str, list[str]] = {}
    for name, group in groups.items():
        for child in group.children:
            parents.setdefault(child, []).append(name)
    memo: dict[str, dict[str, str]] = {}

    def group_vars(name: str, seen: frozenset[str] = frozenset()) -> dict[str, str]:
        if name in memo:
            return memo[name]
        merged: dict[str, str] = {}
        for parent in parents.get(name, []):
            if parent not in seen:
                merged.update(group_vars(parent, seen | {name}))
        merged.update(groups[name].vars if name in groups else {})
        memo[name] = merged
        return merged

    base_vars = groups["all"].vars if "all" in groups else {}
    hosts: dict[str, dict[str, str]] = {}
    for name, group in groups.items():
        layered = {**base_vars, **group_vars(name)}
        for host, host_vars in group.hosts.items():
            hosts.setdefault(host, {}).update({**layered, **host_vars})
    return _targets(hosts.items(), label)


def parse_ini(text: str, label: str = "inventory") -> list[SshTarget]:
    """Parse an Ansible INI inventory (or a plain host-per-line file) into targets."""
    groups: dict[str, _Group] = {"ungrouped": _Group()}
    current, section = "ungrouped", "hosts"
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        header = _GROUP.match(line)
        if header:
            current, section = header.group(1), header.group(2) or "hosts"
            groups.setdefault(current, _Group())
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise UsageError(f"{label}:{number}: {exc}") from exc
        if not words:
            continue
        group = groups[current]
        if section == "children":
            group.children.append(words[0])
        elif section == "vars":
            key, sep, value = line.partition("=")
            if not sep:
                raise UsageError(f"{label}:{number}: expected key=value in [{current}:vars]")
            group.vars[key.strip()] = value.strip().strip("'\"")
        else:
            host_vars: dict[str, str] = {}
            for word in words[1:]:
                key, sep, value = word.partition("=")
                if not sep:
                    raise UsageError(f"{label}:{number}: expected key=value after the host name")
                host_vars[key] = value
            for name in expand_range(words[0], f"{label}:{number}"):
                group.hosts.setdefault(name, {}).update(host_vars)
    return _resolve(groups, label)


def _yaml_problem(exc: Exception) -> str:
    """Return a YAML error in one line: what is wrong, and where."""
    problem = getattr(exc, "problem", None) or str(exc)
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())


def load_yaml(text: str, label: str = "inventory") -> Any:
    """Parse YAML with PyYAML's ``safe_load`` (no object construction); one-line errors."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"{label}: not valid YAML ({_yaml_problem(exc)})") from exc
    except RecursionError as exc:
        raise UsageError(f"{label}: not valid YAML (nested too deeply)") from exc


def _scalar_vars(values: Any, where: str, label: str) -> dict[str, str]:
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise UsageError(f"{label}: {where} must be a mapping of variables, not "
                         f"{_kind(values)}")
    # Only scalars matter for reaching a host; lists and mappings are other tools' vars.
    return {str(k): str(v) for k, v in values.items()
            if v is not None and isinstance(v, (str, int, float, bool))}


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number",
            bool: "a boolean"}.get(type(value), type(value).__name__)


def parse_yaml(text: str, label: str = "inventory") -> list[SshTarget]:
    """Parse an Ansible YAML inventory (``all: hosts: ... children: ... vars: ...``)."""
    return yaml_targets(load_yaml(text, label), label)


def yaml_targets(document: Any, label: str = "inventory") -> list[SshTarget]:
    """Return the targets of a parsed Ansible YAML inventory."""
    if document is None:
        return []
    if not isinstance(document, Mapping):
        raise UsageError(f"{label}: not an Ansible YAML inventory (the top level is "
                         f"{_kind(document)}, not a mapping of groups)")
    groups: dict[str, _Group] = {}
    budget = [MAX_YAML_NODES]
    walked: set[tuple[str, int]] = set()

    def spend(count: int) -> None:
        budget[0] -= count
        if budget[0] < 0:
            raise UsageError(f"{label}: the inventory holds more than {MAX_YAML_NODES} groups "
                             "and hosts")

    def walk(name: str, body: Any) -> None:
        group = groups.setdefault(name, _Group())
        # A group listed under several parents (or, through an anchor, under itself) is
        # read once per body: a cycle ends here.
        if body is None or (name, id(body)) in walked:
            return
        walked.add((name, id(body)))
        if not isinstance(body, Mapping):
            raise UsageError(f"{label}: group {name!r} must be a mapping (hosts, vars, "
                             f"children), not {_kind(body)}")
        hosts = body.get("hosts")
        if hosts is not None and not isinstance(hosts, Mapping):
            raise UsageError(f"{label}: hosts of group {name!r} must be a mapping of host "
                             f"names, not {_kind(hosts)}")
        spend(len(hosts or {}))
        for host, host_vars in (hosts or {}).items():
            values = _scalar_vars(host_vars, f"host {host!r}", label)
            for expanded in expand_range(str(host), label):
                group.hosts.setdefault(expanded, {}).update(values)
        group.vars.update(_scalar_vars(body.get("vars"), f"vars of group {name!r}", label))
        children = body.get("children")
        if children is not None and not isinstance(children, Mapping):
            raise UsageError(f"{label}: children of group {name!r} must be a mapping of "
                             f"groups, not {_kind(children)}")
        spend(len(children or {}))
        for child, child_body in (children or {}).items():
            group.children.append(str(child))
            walk(str(child), child_body)

    try:
        for name, body in document.items():
            walk(str(name), body)
    except RecursionError as exc:
        raise UsageError(f"{label}: groups nested too deeply") from exc
    return _resolve(groups, label)


# -- through Ansible ----------------------------------------------------------------------------


def ansible_inventory_command() -> str | None:
    """Return Ansible's ``ansible-inventory``: on PATH, or beside this Python (a venv)."""
    found = shutil.which("ansible-inventory")
    if found is not None:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "ansible-inventory")
    return beside if os.access(beside, os.X_OK) else None


def _ansible_failure(stderr: str) -> str:
    lines = [" ".join(line.split()) for line in stderr.splitlines() if line.strip()]
    # Ansible tries each plugin; the first "Failed to parse" says what was wrong.
    for line in lines:
        if "Failed to parse" in line and ":" in line.partition("Failed to parse")[2]:
            return line.removeprefix("[WARNING]: ")[:300]
    errors = [line for line in lines if line.startswith(("[ERROR]", "ERROR"))]
    return (errors or lines or ["no output"])[-1][:300]


def read_ansible_json(text: str, label: str) -> list[SshTarget]:
    """Return the targets of ``ansible-inventory --list`` output (host vars already merged)."""
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise UsageError(f"{label}: ansible-inventory printed no inventory JSON") from exc
    if not isinstance(document, Mapping):
        raise UsageError(f"{label}: ansible-inventory printed no inventory JSON")
    meta = document.get("_meta")
    hostvars = meta.get("hostvars") if isinstance(meta, Mapping) else None
    if not isinstance(hostvars, Mapping):
        hostvars = {}
    names: dict[str, None] = {}
    for group, body in document.items():
        if group == "_meta" or not isinstance(body, Mapping):
            continue
        hosts = body.get("hosts", [])
        if not isinstance(hosts, list):
            raise UsageError(f"{label}: ansible-inventory listed group {group!r} oddly")
        names.update(dict.fromkeys(str(h) for h in hosts))
    names.update(dict.fromkeys(str(h) for h in hostvars))
    if len(names) > MAX_HOSTS:
        raise UsageError(f"{label}: the inventory names more than {MAX_HOSTS} hosts")
    return _targets(((name, _scalar_vars(hostvars.get(name), f"host {name!r}", label))
                     for name in names), label)


def load_with_ansible(source: str, why: str) -> list[SshTarget]:
    """Read an inventory source through ``ansible-inventory -i SOURCE --list``."""
    command = ansible_inventory_command()
    if command is None:
        raise UsageError(f"{source}: {why}, which needs Ansible's ansible-inventory "
                         "(pip install ansible-core): it is not installed")
    environment = {
        **os.environ,
        # Fail, not warn, when the source cannot be parsed (else it lists no hosts, rc 0).
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
        "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
    }
    try:
        result = subprocess.run([command, "-i", source, "--list"], capture_output=True,
                                stdin=subprocess.DEVNULL, timeout=ANSIBLE_TIMEOUT_S,
                                env=environment, check=False)
    except subprocess.TimeoutExpired as exc:
        raise UsageError(f"{source}: ansible-inventory took more than {ANSIBLE_TIMEOUT_S} s"
                         ) from exc
    except OSError as exc:
        raise UsageError(f"{source}: cannot run ansible-inventory ({exc.strerror})") from exc
    if result.returncode != 0:
        reason = _ansible_failure(result.stderr.decode("utf-8", "replace"))
        raise UsageError(f"{source}: ansible-inventory cannot read it ({reason})")
    if len(result.stdout) > MAX_ANSIBLE_OUTPUT:
        raise UsageError(f"{source}: ansible-inventory printed more than "
                         f"{MAX_ANSIBLE_OUTPUT >> 20} MiB")
    return read_ansible_json(result.stdout.decode("utf-8", "replace"), source)


# -- one inventory, whatever its kind -----------------------------------------------------------


def _vars_beside(path: str) -> list[str]:
    directory = os.path.dirname(os.path.abspath(path))
    return [name for name in ("group_vars", "host_vars")
            if os.path.isdir(os.path.join(directory, name))]


def _is_script(path: str) -> bool:
    if not os.access(path, os.X_OK):
        return False
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return False


def looks_like_yaml(text: str) -> bool:
    """Return whether a file's first meaningful line starts a YAML mapping, not INI."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        return _YAML_START.match(line) is not None
    return False


def load_inventory(path: str, note: Note | None = None) -> list[SshTarget]:
    """Read an inventory of any kind; raise a usage error (one line naming it) if unreadable.

    ``path`` may also be a comma-separated host list (``gpu01,gpu02,``), as Ansible's
    ``-i`` takes one. ``note`` gets one line where the inventory is read with less than
    Ansible would use.
    """
    if "," in path and not os.path.exists(path):
        # A host list, as Ansible's -i takes one: "gpu01,gpu02:2222," (no file).
        targets = _targets(((name.strip(), {}) for name in path.split(",") if name.strip()),
                           "host list")
    elif os.path.isdir(path):
        targets = load_with_ansible(path, "a directory inventory")
    elif _is_script(path):
        targets = load_with_ansible(path, "an executable inventory script")
    else:
        text = _read(path)
        yaml_file = path.endswith(YAML_SUFFIXES) or looks_like_yaml(text)
        document = load_yaml(text, path) if yaml_file else None
        beside = _vars_beside(path)
        if isinstance(document, Mapping) and isinstance(document.get("_meta"), Mapping):
            # What ansible-inventory --list printed, saved to a file.
            targets = read_ansible_json(text, path)
        elif isinstance(document, Mapping) and isinstance(document.get("plugin"), str):
            targets = load_with_ansible(path, f"an inventory plugin config "
                                              f"({document['plugin']})")
        elif beside and ansible_inventory_command() is not None:
            # Ansible layers group_vars/host_vars beside the file over its variables.
            targets = load_with_ansible(path, "an inventory with " + " and ".join(beside))
        else:
            if beside and note is not None:
                note(f"{path}: {' and '.join(beside)} beside it are not read without "
                     "ansible-inventory (pip install ansible-core)")
            targets = yaml_targets(document, path) if yaml_file else parse_ini(text, path)
    if not targets:
        raise UsageError(f"{path}: the inventory names no hosts")
    return targets


def _read(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_INVENTORY_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read inventory ({exc.strerror})") from exc
    if len(data) > MAX_INVENTORY_BYTES:
        raise UsageError(f"{path}: inventory larger than {MAX_INVENTORY_BYTES >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: cannot read inventory (not UTF-8 text)") from exc
