"""The fast tar index agrees with tarfile, and hands every unusual archive back to it."""

from __future__ import annotations

import gzip
import posixpath
import tarfile

import pytest

from auditor.errors import SnapshotError
from auditor.hosts.archive import ArchiveHost, _member_path
from auditor.hosts.base import Entry
from auditor.hosts.collect import collect_tar
from auditor.hosts.tarindex import Member, fast_index
from tests.support.factories import tar_of_members
from tests.support.sysroot import CAPTURES


def by_tarfile(data: bytes) -> list[Member]:
    """Index with tarfile, the reference."""
    host = ArchiveHost.__new__(ArchiveHost)
    host._data = data
    return host._tarfile_members("reference")


def tar_of(*members: tuple[tarfile.TarInfo, bytes | None], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    return tar_of_members(members, fmt)


def info(name: str, kind: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    result = tarfile.TarInfo(name)
    result.type = kind
    for key, value in fields.items():
        setattr(result, key, value)
    return result


@pytest.mark.parametrize("capture", sorted(CAPTURES))
def test_matches_tarfile_on_the_real_captures(capture: str) -> None:
    data = gzip.decompress(CAPTURES[capture].read_bytes())
    fast = fast_index(data)
    assert fast is not None and len(fast) > 100
    assert fast == by_tarfile(data)


def test_matches_tarfile_on_a_collection_of_this_machine() -> None:
    data = collect_tar(["/proc/sys/kernel/*", "/sys/bus/pci/devices/*/class", "/dev/null",
                        "/sys/devices/system/cpu/cpu0/*"])
    fast = fast_index(data)
    assert fast is not None
    assert fast == by_tarfile(data)
    assert any(m.type == ord("3") and (m.devmajor, m.devminor) == (1, 3) for m in fast)


def test_long_and_non_ascii_names_through_pax_headers_match_tarfile() -> None:
    deep = "sys/devices/" + "/".join(f"pci0000:{i:02x}" for i in range(30)) + "/config"
    data = tar_of(
        (info(deep), b"\x01" * 700),
        (info("etc/h\u00f6st\nname"), b"x\n"),
        (info("dev/link", tarfile.SYMTYPE, linkname="../" * 60 + "target"), None),
        (info("dev/sda", tarfile.BLKTYPE, devmajor=8, devminor=0), None),
        (info("etc/dir", tarfile.DIRTYPE), None),
        (info("etc/hard", tarfile.LNKTYPE, linkname="etc/dir"), None),
    )
    fast = fast_index(data)
    assert fast is not None
    assert fast == by_tarfile(data)
    assert fast[0].name == deep and fast[0].size == 700
    host = ArchiveHost(data, "t")
    assert host.read_bytes("/" + deep) == b"\x01" * 700


def test_modification_times_match_tarfile_and_zero_is_not_known() -> None:
    """A file's time comes from its header or a pax ``mtime`` (whole seconds), as tarfile
    reads it; a writer that keeps none writes 0, which the host reports as not known."""
    data = tar_of(
        (info("boot/initrd.img-6.8.0-45-generic", mtime=1768132800), b"\x1f\x8b"),
        (info("etc/modprobe.d/nvidia.conf", mtime=1768046400.75), b"options nvidia\n"),
        (info("etc/modprobe.d/old.conf", mtime=0), b""),
        (info("etc/modprobe.d", tarfile.DIRTYPE, mtime=1768046400), None),
    )
    fast = fast_index(data)
    assert fast is not None and fast == by_tarfile(data)
    assert [m.mtime for m in fast] == [1768132800, 1768046400, 0, 1768046400]
    host = ArchiveHost(data, "t")
    assert host.mtime("/boot/initrd.img-6.8.0-45-generic") == 1768132800.0
    assert host.mtime("/etc/modprobe.d/nvidia.conf") == 1768046400.0
    assert host.mtime("/etc/modprobe.d/old.conf") is None
    assert host.mtime("/etc/modprobe.d/missing.conf") is None
    # Times are not part of what an entry is: equality is unchanged.
    assert host.lstat("/etc/modprobe.d/old.conf") == Entry("file")


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_other_formats_agree_or_go_to_tarfile(fmt: int) -> None:
    data = tar_of((info("a/" * 60 + "f"), b"data"), (info("b"), b"more"), fmt=fmt) \
        if fmt == tarfile.GNU_FORMAT else tar_of((info("a/b/f"), b"data"), fmt=fmt)
    fast = fast_index(data)
    if fmt == tarfile.GNU_FORMAT:
        assert fast is None  # GNU long names: tarfile reads them
    else:
        assert fast == by_tarfile(data)
    assert ArchiveHost(data, "t").members()


def corrupt(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value):]


def test_unusual_or_broken_archives_are_left_to_tarfile() -> None:
    good = tar_of((info("etc/a"), b"1" * 600), (info("etc/b"), b"2"))
    assert fast_index(good) == by_tarfile(good)
    second = 512 + 1024  # the second header: after a's header and its two data blocks
    left_to_tarfile = {
        "bad checksum": corrupt(good, second + 148, b"000000"),
        "base-256 size": corrupt(good, second + 124, b"\x80"),
        "garbage mode": corrupt(good, second + 100, b"zz"),
        "truncated data": good[: second + 512 + 10],
        "empty": b"\0" * 1024,
        "not a tar": b"hello world" * 100,
        "global pax header": tar_of((info("g", tarfile.XGLTYPE, pax_headers={"comment": "x"}),
                                     None), (info("etc/a"), b"1")),
    }
    for label, data in left_to_tarfile.items():
        assert fast_index(data) is None, label
    # What tarfile makes of them is what ArchiveHost makes of them.
    assert ArchiveHost(left_to_tarfile["bad checksum"], "t").members() == ["/", "/etc",
                                                                          "/etc/a"]
    assert ArchiveHost(left_to_tarfile["empty"], "t").members() == ["/"]
    for label in ("truncated data", "not a tar"):
        with pytest.raises(SnapshotError):
            ArchiveHost(left_to_tarfile[label], label)
    # A short last header ends the archive, as in tarfile.
    short = good[: second + 100]
    assert fast_index(short) == by_tarfile(short)
    fifo = tar_of((info("run/fifo", tarfile.FIFOTYPE), None))
    assert fast_index(fifo) == by_tarfile(fifo)
    assert ArchiveHost(fifo, "t").lstat("/run/fifo") == Entry("other")


@pytest.mark.parametrize("name", ["a", "a/b", "./a", "/a", "a/../b", "a/./b", "a//b", "a/", "..",
                                  "a/..", "a/.hidden", ".hidden", "a/b..c", "...", "", "//x",
                                  "x/..", "../../etc/passwd", "a/b/../../.."])
def test_member_paths_are_normalised_as_posixpath_does(name: str) -> None:
    expected = posixpath.normpath("/" + name.lstrip("/"))
    assert _member_path(name) == ("/" if expected == "//" else expected)
