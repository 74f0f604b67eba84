"""The LXC config parser: rules, lines, sections, mount and dev entries."""

from __future__ import annotations

import pytest

from auditor.checks.lib.lxc_config import (
    ConfigLine,
    DeviceRule,
    format_line,
    parse_dev_entry,
    parse_device_rule,
    parse_line,
    parse_main_section,
    parse_mount_entry,
)

RWM = frozenset("rwm")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("c 195:* rwm", DeviceRule("c", 195, None, RWM)),
        ("c 509:0 rw", DeviceRule("c", 509, 0, frozenset("rw"))),
        ("a", DeviceRule("a", None, None, RWM)),
        ("a *:* rwm", DeviceRule("a", None, None, RWM)),
        ("c *:* m", DeviceRule("c", None, None, frozenset("m"))),
        ("b 7:* rwm", DeviceRule("b", 7, None, RWM)),
        ("  c 238:1 r  ", DeviceRule("c", 238, 1, frozenset("r"))),
        ("c 238:*", DeviceRule("c", 238, None, frozenset())),
        ("c 238:* rwx", None),
        ("x 238:* rwm", None),
        ("c 238 rwm", None),
        ("c -1:* rwm", None),
        ("c 238:*rwm", None),
        ("", None),
        ("c \x00:* rwm", None),
        ("c ٣:* rwm", None),  # a digit to str.isdigit, not to the kernel
    ],
)
def test_parse_device_rule(value: str, expected: DeviceRule | None) -> None:
    assert parse_device_rule(value) == expected


@pytest.mark.parametrize(
    ("rule", "major", "text"),
    [
        ("c 509:* rwm", 238, "c 238:* rwm"),
        ("c 509:1 rw", 238, "c 238:1 rw"),
        ("c 195:* rwm", None, "c 195:* rwm"),
        ("a", 1, "a"),
    ],
)
def test_device_rule_format_rewrites_the_major(rule: str, major: int | None, text: str) -> None:
    parsed = parse_device_rule(rule)
    assert parsed is not None
    assert parsed.format(major) == text


@pytest.mark.parametrize(
    ("line", "flavour", "expected"),
    [
        ("lxc.cgroup2.devices.allow: c 195:* rwm", "proxmox",
         ("lxc.cgroup2.devices.allow", "c 195:* rwm")),
        ("lxc.cgroup2.devices.allow = c 195:* rwm", "proxmox",
         ("lxc.cgroup2.devices.allow", "c 195:* rwm")),
        ("dev0: /dev/nvidia0,gid=44", "proxmox", ("dev0", "/dev/nvidia0,gid=44")),
        ("memory = 512", "proxmox", None),
        ("#lxc.cgroup2.devices.allow: c 509:* rwm", "proxmox", None),
        ("lxc.cgroup.devices.allow = c 195:* rwm", "lxc",
         ("lxc.cgroup.devices.allow", "c 195:* rwm")),
        ("  lxc.mount.entry   =   /dev/nvidia0 dev/nvidia0 none bind 0 0  ", "lxc",
         ("lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind 0 0")),
        ('lxc.uts.name = "gpu 1"', "lxc", ("lxc.uts.name", "gpu 1")),
        ("lxc.cgroup.devices.allow: c 195:* rwm", "lxc", None),
        ("   # comment = yes", "lxc", None),
        ("", "lxc", None),
        ("\x00\xff junk", "proxmox", None),
    ],
)
def test_parse_line(line: str, flavour: str, expected: tuple[str, str] | None) -> None:
    assert parse_line(line, flavour) == expected  # type: ignore[arg-type]


def test_main_section_stops_at_the_first_header_and_gives_its_offset() -> None:
    text = (
        "arch: amd64\n"
        "parent: before-upgrade\n"
        "lxc.cgroup2.devices.allow: c 238:* rwm\n"
        "\n"
        "[before-upgrade]\n"
        "lxc.cgroup2.devices.allow: c 509:* rwm\n"
        "[pve:pending]\n"
        "memory: 2048\n"
    )
    section = parse_main_section(text, "proxmox")
    assert section.header_line == 5
    assert text[section.header_offset :].startswith("[before-upgrade]\n")
    assert [line.number for line in section.lines] == [1, 2, 3, 4]
    assert section.entries("lxc.cgroup2.devices.allow") == [
        ConfigLine(3, "lxc.cgroup2.devices.allow: c 238:* rwm", "lxc.cgroup2.devices.allow",
                   "c 238:* rwm")
    ]


def test_main_section_without_header_is_the_whole_text() -> None:
    text = "lxc.cgroup2.devices.allow: c 238:* rwm\r\n# note\n"
    section = parse_main_section(text, "proxmox")
    assert section.header_line is None
    assert section.header_offset == len(text)
    assert [(line.number, line.key, line.value) for line in section.lines] == [
        (1, "lxc.cgroup2.devices.allow", "c 238:* rwm"),
        (2, None, None),
    ]


def test_plain_lxc_has_no_sections() -> None:
    section = parse_main_section("[x]\nlxc.cgroup.devices.allow = a\n", "lxc")
    assert section.header_line is None
    assert section.entries("lxc.cgroup.devices.allow")[0].number == 2


def test_pending_section_is_a_boundary_too() -> None:
    section = parse_main_section("swap: 0\n[pve:pending]\nswap: 512\n", "proxmox")
    assert section.header_line == 2
    assert [line.value for line in section.lines] == ["0"]


@pytest.mark.parametrize(
    ("key", "value", "flavour", "line"),
    [
        ("lxc.cgroup2.devices.allow", "c 238:* rwm", "proxmox",
         "lxc.cgroup2.devices.allow: c 238:* rwm"),
        ("lxc.cgroup.devices.allow", "c 238:* rwm", "lxc",
         "lxc.cgroup.devices.allow = c 238:* rwm"),
    ],
)
def test_format_line_round_trips(key: str, value: str, flavour: str, line: str) -> None:
    assert format_line(key, value, flavour) == line  # type: ignore[arg-type]
    assert parse_line(line, flavour) == (key, value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "source", "bind"),
    [
        ("/dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file", "/dev/nvidia-uvm",
         True),
        ("/dev/dri dev/dri none rbind,create=dir 0 0", "/dev/dri", True),
        ("/dev/my\\040gpu dev/gpu none bind 0 0", "/dev/my gpu", True),
        ("proc proc proc nodev,noexec,nosuid 0 0", "proc", False),
    ],
)
def test_parse_mount_entry(value: str, source: str, bind: bool) -> None:
    entry = parse_mount_entry(value)
    assert entry is not None
    assert (entry.source, entry.is_bind) == (source, bind)


def test_parse_mount_entry_rejects_short_lines() -> None:
    assert parse_mount_entry("/dev/nvidia0 dev/nvidia0") is None


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ("/dev/nvidia0,gid=44", "/dev/nvidia0"),
        ("path=/dev/nvidia-uvm,mode=0666", "/dev/nvidia-uvm"),
        ("mode=0666,path=/dev/nvidiactl", "/dev/nvidiactl"),
        ("mode=0666", None),
        ("", None),
    ],
)
def test_parse_dev_entry(value: str, path: str | None) -> None:
    assert parse_dev_entry(value) == path


# -- what LXC reads --------------------------------------------------------------------------


def test_config_entries_keep_only_lxc_keys_and_unquote() -> None:
    from auditor.checks.lib.lxc_config import config_entries

    entries = config_entries("# c\nlxc.uts.name = a\nmartian = 1\n"
                             "lxc.environment = \"NVIDIA_VISIBLE_DEVICES=all\"\n", "/x/config")
    assert [(e.key, e.value, e.origin) for e in entries] == [
        ("lxc.uts.name", "a", "/x/config:2"),
        ("lxc.environment", "NVIDIA_VISIBLE_DEVICES=all", "/x/config:4"),
    ]


@pytest.mark.parametrize(("path", "readable"), [
    ("/usr/share/lxc/config/common.conf", True),
    ("/usr/share/lxc/config/common.conf.d/01-pve.conf", True),
    ("/etc/lxc/gpu.conf", True),
    ("/etc/lxc/profiles/gpu.conf", True),
    ("/var/lib/lxc/gpu1/gpu.conf", True),
    ("/etc/lxc/a/b/c.conf", True),
    ("/var/lib/lxc/gpu1/conf.d/10-gpu.conf", True),
    ("/etc/lxc/a/b/c/d.conf", False),
    ("/root/gpu.conf", False),
    ("/etc/shadow", False),
])
def test_readable_include(path: str, readable: bool) -> None:
    from auditor.checks.lib.lxc_config import readable_include

    assert readable_include(path) is readable


def test_environment_and_hooks_clear_on_an_empty_value() -> None:
    from auditor.checks.lib.lxc_config import Entry, environment_of, mount_hooks

    entries = [Entry("lxc.environment", "NVIDIA_VISIBLE_DEVICES=all"),
               Entry("lxc.hook.mount", "/usr/share/lxc/hooks/nvidia"),
               Entry("lxc.environment.hooks", "CUDA_VERSION=12.4"),
               Entry("lxc.environment", ""),
               Entry("lxc.environment", "NVIDIA_DRIVER_CAPABILITIES=compute"),
               Entry("lxc.environment", "PATH")]
    assert environment_of(entries) == {"NVIDIA_DRIVER_CAPABILITIES": "compute"}
    assert [e.value for e in mount_hooks(entries)] == ["/usr/share/lxc/hooks/nvidia"]
    assert mount_hooks([*entries, Entry("lxc.hook.mount", "")]) == []


def test_devices_list() -> None:
    from auditor.checks.lib.lxc_config import parse_devices_list

    assert parse_devices_list("a *:* rwm\n") == [DeviceRule("a", None, None, RWM)]
    assert parse_devices_list("c 1:3 rwm\ngarbage\nc 195:* rw\n") == [
        DeviceRule("c", 1, 3, RWM), DeviceRule("c", 195, None, frozenset("rw"))]


def test_proxmox_start_order() -> None:
    from auditor.checks.lib.lxc_config import proxmox_entries

    section = parse_main_section("ostype: debian\nunprivileged: 1\ndev0: /dev/kfd\n"
                                 "lxc.cgroup2.devices.deny: a\n"
                                 "lxc.environment.runtime: A=1\n", "proxmox")
    entries, unprivileged = proxmox_entries(section, "/etc/pve/lxc/9.conf",
                                            [("dev0", "c 234:0 rw", "")])
    assert unprivileged
    assert [(e.key, e.value) for e in entries] == [
        ("lxc.include", "/usr/share/lxc/config/debian.common.conf"),
        ("lxc.include", "/usr/share/lxc/config/debian.userns.conf"),
        ("lxc.cgroup2.devices.allow", "c 234:0 rw"),
        ("lxc.cgroup2.devices.deny", "a"),
    ]


def test_config_entries_end_a_line_at_a_carriage_return_as_lxc_does() -> None:
    from auditor.checks.lib.lxc_config import config_entries

    # parse.c splits on "\r\n\0": what follows a bare CR is a line of its own, even
    # after a comment, and keeps the editor's line number.
    text = ("# GPU rules\rlxc.cgroup2.devices.allow = c 238:* rwm\n"
            "lxc.uts.name = gpu1\r\n"
            "lxc.arch = linux64\rlxc.include = /etc/lxc/gpu.conf\n")
    entries = config_entries(text, "/var/lib/lxc/gpu1/config")
    assert [(e.key, e.value, e.origin) for e in entries] == [
        ("lxc.cgroup2.devices.allow", "c 238:* rwm", "/var/lib/lxc/gpu1/config:1"),
        ("lxc.uts.name", "gpu1", "/var/lib/lxc/gpu1/config:2"),
        ("lxc.arch", "linux64", "/var/lib/lxc/gpu1/config:3"),
        ("lxc.include", "/etc/lxc/gpu.conf", "/var/lib/lxc/gpu1/config:3"),
    ]
    # A piece is not the line as written: a fix matching whole lines leaves it alone.
    assert entries[0].line is not None
    assert entries[0].line.text == "lxc.cgroup2.devices.allow = c 238:* rwm"
