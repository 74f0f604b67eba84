"""The HTML fleet report in a real headless Chromium: the grid renders and is coloured."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from auditor.cli import main
from tests.support.sysroot import Sysroot

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                       "(apt-get install chromium; tests/run.sh does it as root)"),
]
WIDTH, HEIGHT = 1200, 800
PASS_RGB, FAIL_RGB = (0x2D, 0xA4, 0x4E), (0xCF, 0x22, 0x2E)


def chromium(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """Run headless Chromium; return its exit status, stdout and stderr."""
    assert CHROMIUM is not None
    # Files, not pipes: Chromium's helper processes inherit the descriptors and can
    # outlive the browser, and a pipe would wait for them.
    out, err = tmp_path / "chromium.out", tmp_path / "chromium.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--disable-breakpad", "--disable-crash-reporter",
             f"--user-data-dir={tmp_path / 'chromium-profile'}",
             f"--window-size={WIDTH},{HEIGHT}", *args],
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, timeout=60, check=False,
        )
    return (proc.returncode, out.read_text(errors="replace"),
            err.read_text(errors="replace"))


def decode_png(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Decode an 8-bit RGB or RGBA, non-interlaced PNG into (width, height, pixels)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0
    channels = 4 if colour == 6 else 3
    stride = width * channels
    raw = zlib.decompress(idat)
    previous = bytearray(stride)
    pixels: list[tuple[int, int, int]] = []
    for row in range(height):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[i] = (line[i] + pred) & 0xFF
        pixels.extend(
            (line[i], line[i + 1], line[i + 2]) for i in range(0, stride, channels)
        )
        previous = line
    return width, height, pixels


@pytest.fixture
def fleet_html(make_sysroot: Callable[[str], Sysroot], tmp_path: Path,
               capsys: pytest.CaptureFixture[str]) -> Path:
    results = tmp_path / "results"
    results.mkdir()
    hosts = {"gpu-01": "h200", "gpu-02": "h200", "cpu-01": "virtio"}
    for host, capture in hosts.items():
        root = make_sysroot(capture)
        root.write("/etc/hostname", host + "\n")
        if host == "gpu-02":
            root.write("/sys/devices/system/node/node1/cpulist", "8-15\n")
            root.write("/proc/sys/kernel/numa_balancing", "1\n")
        # A few checks: the page's columns fit the screenshot however many checks exist.
        picked = [arg for check in ("kernel.version", "numa.balancing", "pcie.mrrs",
                                    "nvidia.driver", "cpu.governor") for arg in ("--check", check)]
        main(["local", "--root", str(root.root), "--format", "json", *picked,
              "-o", str(results / f"{host}.json")])
    page = tmp_path / "fleet.html"
    code = main(["merge", str(results), "--format", "html", "--golden", "gpu-01",
                 "-o", str(page)])
    capsys.readouterr()
    assert code == 1
    return page


def test_fleet_grid_renders_in_chromium(fleet_html: Path, tmp_path: Path) -> None:
    code, dom, err = chromium(tmp_path, "--dump-dom", fleet_html.as_uri())
    assert code == 0, err[-2000:]
    rows = re.findall(r'<tr class="host-row (\w+)[^"]*" data-host="([^"]+)"', dom)
    # worst hosts first
    assert rows[0] == ("fail", "gpu-02")
    assert sorted(host for _, host in rows) == ["cpu-01", "gpu-01", "gpu-02"]
    cells = re.findall(r'<td class="cell (\w+)[^"]*" data-check="([^"]+)" data-status="(\w+)"',
                       dom)
    columns = re.findall(r'<th class="check"><code>([^<]+)</code>', dom)
    assert "numa.balancing" in columns
    assert len(cells) == 3 * len(columns)
    assert ("fail", "numa.balancing", "fail") in cells
    assert {status for _, _, status in cells} >= {"pass", "fail"}
    assert re.search(r"<summary>fail ≠</summary>", dom)  # differs from the golden host
    assert "automatic NUMA balancing is enabled" in dom  # the details behind the cell
    assert "Differences from golden host" in dom


def test_fleet_grid_screenshot_shows_the_status_colours(fleet_html: Path,
                                                       tmp_path: Path) -> None:
    shot = tmp_path / "fleet.png"
    code, _, err = chromium(tmp_path, f"--screenshot={shot}", fleet_html.as_uri())
    assert code == 0, err[-2000:]
    width, height, pixels = decode_png(shot.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    assert len(set(pixels)) > 20  # text, borders and cells: not a blank page

    def near(rgb: tuple[int, int, int], want: tuple[int, int, int]) -> bool:
        return all(abs(a - b) <= 6 for a, b in zip(rgb, want, strict=True))

    passing = sum(1 for p in pixels if near(p, PASS_RGB))
    failing = sum(1 for p in pixels if near(p, FAIL_RGB))
    # each cell is at least ~80x28 px of solid colour; the fail badge adds a little red
    assert passing > 2 * 1000
    assert failing > 1000
