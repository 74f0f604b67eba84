"""Host inventories: a plain host-per-line file, an Ansible INI inventory, an Ansible YAML one.

Only what reaching a host needs is read: the name, ``ansible_host``,
``ansible_port`` and ``ansible_user`` (on the host, or in a group's vars).
Groups and children only gather hosts; every host is audited once.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from auditor.errors import UsageError
from auditor.hosts.ssh import SshTarget, parse_target

_RANGE = re.compile(r"\[(\d+):(\d+)\]|\[([a-z]):([a-z])\]")
_KEY_VALUE = re.compile(r"^(.*?):(?:\s+(.*))?$")
_GROUP = re.compile(r"^\[([^\]:]+)(?::(vars|children))?\]$")


@dataclass
class _Group:
    hosts: dict[str, dict[str, str]] = field(default_factory=dict)
    vars: dict[str, str] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)


def expand_range(name: str) -> list[str]:
    """Expand Ansible host ranges: ``gpu[01:03]`` is gpu01, gpu02, gpu03."""
    match = _RANGE.search(name)
    if match is None:
        return [name]
    head, tail = name[: match.start()], name[match.end():]
    if match.group(1) is not None:
        start, end = match.group(1), match.group(2)
        width = len(start) if start.startswith("0") else 0
        values = [str(n).zfill(width) for n in range(int(start), int(end) + 1)]
    else:
        values = [chr(c) for c in range(ord(match.group(3)), ord(match.group(4)) + 1)]
    return [expanded for value in values for expanded in expand_range(head + value + tail)]


def _target(name: str, variables: dict[str, str], label: str) -> SshTarget:
    address = variables.get("ansible_host") or variables.get("ansible_ssh_host")
    base = parse_target(address if address else name)
    port_text = variables.get("ansible_port") or variables.get("ansible_ssh_port")
    user = variables.get("ansible_user") or variables.get("ansible_ssh_user") or base.user
    port = base.port
    if port_text:
        if not str(port_text).isdigit():
            raise UsageError(f"{label}: host {name}: ansible_port {port_text!r} is not a number")
        port = int(port_text)
    display = name if address else base.label
    return SshTarget(host=base.host, user=user, port=port, label=display)


def _resolve(groups: dict[str, _Group], label: str) -> list[SshTarget]:
    # Variables: all < parent groups < child groups < host, as Ansible layers them.
    parents: dict[str, list[str]] = {}
    for name, group in groups.items():
        for child in group.children:
            parents.setdefault(child, []).append(name)

    def group_vars(name: str, seen: frozenset[str] = frozenset()) -> dict[str, str]:
        merged: dict[str, str] = {}
        for parent in parents.get(name, []):
            if parent not in seen:
                merged.update(group_vars(parent, seen | {name}))
        merged.update(groups[name].vars if name in groups else {})
        return merged

    base_vars = groups["all"].vars if "all" in groups else {}
    hosts: dict[str, dict[str, str]] = {}
    for name, group in groups.items():
        layered = {**base_vars, **group_vars(name)}
        for host, host_vars in group.hosts.items():
            hosts.setdefault(host, {}).update({**layered, **host_vars})
    targets: dict[tuple[str, int | None, str | None], SshTarget] = {}
    for host, variables in hosts.items():
        target = _target(host, variables, label)
        targets.setdefault((target.host, target.port, target.user), target)
    return list(targets.values())


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
            for name in expand_range(words[0]):
                group.hosts.setdefault(name, {}).update(host_vars)
    return _resolve(groups, label)


def _scalar(text: str) -> str:
    text = text.strip()
    if text[:1] not in "'\"":
        text = text.split(" #", 1)[0].strip()
    elif " #" in text and text.rstrip()[-1:] != text[:1]:
        text = text.rsplit(" #", 1)[0].strip()
    if text[:1] in "'\"" and text[-1:] == text[:1] and len(text) >= 2:
        return text[1:-1]
    if text in ("~", "null", "Null", "NULL"):
        return ""
    return text


def read_yaml_mapping(text: str, label: str = "inventory") -> dict[str, Any]:
    """Read the block-mapping subset of YAML that Ansible inventories use."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    pending: tuple[int, dict[str, Any], str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.split("#", 1)[0] if raw.lstrip().startswith("#") else raw
        if not stripped.strip() or stripped.strip() in ("---", "..."):
            continue
        indent = len(stripped) - len(stripped.lstrip(" "))
        line = stripped.strip()
        if line.startswith("- "):
            raise UsageError(f"{label}:{number}: lists are not used in an inventory")
        pair = _KEY_VALUE.match(line)
        if pair is None:
            raise UsageError(f"{label}:{number}: expected 'key:' or 'key: value'")
        key, value = pair.group(1), pair.group(2) or ""
        if pending is not None:
            parent_indent, parent, parent_key = pending
            if indent > parent_indent:
                child: dict[str, Any] = {}
                parent[parent_key] = child
                stack.append((parent_indent, child))
            pending = None
        while stack and indent <= stack[-1][0]:
            stack.pop()
        if not stack:
            raise UsageError(f"{label}:{number}: bad indentation")
        mapping = stack[-1][1]
        name = _scalar(key)
        if value.strip() and _scalar(value) not in ("{}",):
            mapping[name] = _scalar(value)
        else:
            mapping[name] = None
            pending = (indent, mapping, name)
    return root


def parse_yaml(text: str, label: str = "inventory") -> list[SshTarget]:
    """Parse an Ansible YAML inventory (``all: hosts: ... children: ...``) into targets."""
    document = read_yaml_mapping(text, label)
    groups: dict[str, _Group] = {}

    def walk(name: str, body: Any) -> None:
        group = groups.setdefault(name, _Group())
        if not isinstance(body, dict):
            return
        for host, host_vars in (body.get("hosts") or {}).items():
            values = {k: str(v) for k, v in (host_vars or {}).items() if v is not None}
            for expanded in expand_range(host):
                group.hosts.setdefault(expanded, {}).update(values)
        group.vars.update({k: str(v) for k, v in (body.get("vars") or {}).items()
                           if v is not None})
        for child, child_body in (body.get("children") or {}).items():
            group.children.append(child)
            walk(child, child_body)

    for name, body in document.items():
        walk(name, body)
    return _resolve(groups, label)


def load_inventory(path: str) -> list[SshTarget]:
    """Read an inventory file of any of the three kinds; raise a usage error if unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read inventory ({exc})") from exc
    if path.endswith((".yml", ".yaml")) or _looks_like_yaml(text):
        targets = parse_yaml(text, path)
    else:
        targets = parse_ini(text, path)
    if not targets:
        raise UsageError(f"{path}: the inventory names no hosts")
    return targets


def _looks_like_yaml(text: str) -> bool:
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or line == "---":
            continue
        return line.endswith(":") and not line.startswith("[")
    return False
