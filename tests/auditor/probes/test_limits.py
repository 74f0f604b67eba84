"""The payload limit of every PCIe link generation, and the verdict thresholds."""

from __future__ import annotations

from fractions import Fraction

import pytest

from auditor.model import Status
from auditor.probes.limits import (
    FAIL_BELOW,
    WARN_BELOW,
    Link,
    expected_link,
    parse_speed,
    parse_width,
    payload_gbps,
    verdict,
)


@pytest.mark.parametrize(
    ("speed", "generation", "x16_gbps"),
    [
        # 8b/10b: rate x 16 x 0.8 / 8
        ("2.5 GT/s PCIe", 1, 4.0),
        ("5.0 GT/s PCIe", 2, 8.0),
        # 128b/130b: rate x 16 x 128/130 / 8
        ("8.0 GT/s PCIe", 3, 15.753846153846155),
        ("16.0 GT/s PCIe", 4, 31.50769230769231),
        ("32.0 GT/s PCIe", 5, 63.01538461538462),
        # PAM4 FLIT: rate x 16 / 8 x 236/256 (TLP bytes of a flit)
        ("64.0 GT/s PCIe", 6, 118.0),
        ("128.0 GT/s PCIe", 7, 236.0),
    ],
)
def test_payload_limit_of_every_generation(speed: str, generation: int, x16_gbps: float) -> None:
    link = Link.parse(speed, "16")
    assert link is not None
    assert link.generation == generation
    assert link.payload_gbps == pytest.approx(x16_gbps, rel=1e-12)
    assert link.label == f"Gen{generation} x16"
    half = Link.parse(speed, "8")
    assert half is not None and half.payload_gbps == pytest.approx(x16_gbps / 2, rel=1e-12)


def test_gen5_x16_is_the_63_gbps_the_h200_is_judged_by() -> None:
    assert round(payload_gbps(Fraction(32), 16), 1) == 63.0
    assert round(payload_gbps(Fraction(16), 16), 1) == 31.5
    assert round(payload_gbps(Fraction(8), 16), 2) == 15.75


@pytest.mark.parametrize("text", ["Unknown", "", None, "2.4 GT/s PCIe", "33.0 GT/s PCIe",
                                  "32.0", "9" * 5000])
def test_speeds_sysfs_cannot_mean_are_none(text: str | None) -> None:
    assert parse_speed(text) is None


def test_speed_spellings() -> None:
    assert parse_speed("2.5 GT/s") == Fraction(5, 2)
    assert parse_speed("8 GT/s") == Fraction(8)
    assert parse_speed("32GT/s") == Fraction(32)


@pytest.mark.parametrize(("text", "width"), [("16", 16), ("x8", 8), ("1", 1), ("0", None),
                                             ("3", None), ("", None), (None, None),
                                             ("sixteen", None), ("1" * 40, None)])
def test_widths(text: str | None, width: int | None) -> None:
    assert parse_width(text) == width


def test_expected_link_is_the_lower_of_both_ends() -> None:
    gpu = Link(Fraction(32), 16)
    port = Link(Fraction(16), 16)
    assert expected_link(gpu, port) == Link(Fraction(16), 16)
    assert expected_link(gpu, Link(Fraction(32), 8)) == Link(Fraction(32), 8)
    assert expected_link(gpu, None) == gpu
    assert expected_link(None, port) is None


@pytest.mark.parametrize(
    ("fraction", "status"),
    [(0.88, Status.PASS), (WARN_BELOW, Status.PASS), (0.7999, Status.WARN),
     (FAIL_BELOW, Status.WARN), (0.4999, Status.FAIL), (0.0, Status.FAIL)],
)
def test_thresholds(fraction: float, status: Status) -> None:
    assert verdict(fraction) is status


def test_thresholds_can_be_moved() -> None:
    assert verdict(0.77, warn_below=0.75, fail_below=0.60) is Status.PASS
    assert verdict(0.65, warn_below=0.75, fail_below=0.60) is Status.WARN


def test_links_of_generation_numbers() -> None:
    assert Link.of_generation(5, 16) == Link(Fraction(32), 16)
    assert Link.of_generation(6, 8) == Link(Fraction(64), 8)
    for generation, width in ((0, 16), (8, 16), (5, 3), (True, 16), ("5", 16), (5, None)):
        assert Link.of_generation(generation, width) is None
