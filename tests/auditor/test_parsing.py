"""Small parsers: CPU lists, os-release, plain words, and patterns compiled on first use."""

from __future__ import annotations

import re

import pytest

from auditor.parsing import (
    LazyPattern,
    format_cpulist,
    lazy_re,
    parse_cpulist,
    parse_os_release,
    safe_word,
)


def test_a_lazy_pattern_compiles_on_first_use_and_answers_as_re_does() -> None:
    pattern = lazy_re(r"cpu([0-9]+)", re.ASCII)
    assert isinstance(pattern, LazyPattern)
    assert pattern._compiled is None  # nothing compiled at import
    text = "cpu12 cpu3 policy0"
    compiled = re.compile(r"cpu([0-9]+)", re.ASCII)
    match = pattern.match(text)
    assert match is not None and match.group(1) == "12"
    assert pattern._compiled is compiled  # re's own cache: the same object
    assert pattern.fullmatch("cpu7") is not None and pattern.fullmatch("cpu7x") is None
    assert pattern.search("x cpu9").group(0) == "cpu9"
    assert [m.group(1) for m in pattern.finditer(text)] == ["12", "3"]
    assert pattern.findall(text) == compiled.findall(text) == ["12", "3"]
    assert pattern.sub("C", text) == compiled.sub("C", text)
    assert pattern.sub(lambda m: m.group(1), text, 1) == "12 cpu3 policy0"
    assert pattern.split(text) == compiled.split(text)
    assert pattern.match(text, 6, 10) is not None and pattern.match(text, 6, 9) is None
    assert pattern.pattern == r"cpu([0-9]+)" and pattern.flags & re.ASCII


def test_a_bad_lazy_pattern_fails_where_it_is_used() -> None:
    pattern = lazy_re(r"(unclosed")
    with pytest.raises(re.error):
        pattern.match("x")


@pytest.mark.parametrize(("text", "cpus"), [("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
                                            ("0-6:2", [0, 2, 4, 6]), ("\n", [])])
def test_cpu_lists_round_trip(text: str, cpus: list[int]) -> None:
    assert parse_cpulist(text) == cpus
    assert parse_cpulist(format_cpulist(cpus)) == cpus


def test_os_release_values_are_unquoted_and_odd_keys_ignored() -> None:
    text = 'ID=ubuntu\nVERSION_ID="24.04"\nNAME=\'Ubuntu\'\nbad key=x\n# comment\nPRETTY'
    assert parse_os_release(text) == {"ID": "ubuntu", "VERSION_ID": "24.04", "NAME": "Ubuntu"}


@pytest.mark.parametrize(("word", "plain"), [("6.8.0-45-generic", True), ("noble", True),
                                             ("1.2;rm", False), ("-x", False), ("", False),
                                             ("a b", False), ("$(id)", False)])
def test_safe_words(word: str, plain: bool) -> None:
    assert safe_word(word) is plain
