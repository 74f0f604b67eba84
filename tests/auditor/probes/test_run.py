"""What the probe program printed, as a host may have sent it: bounded and checked."""

from __future__ import annotations

import json

import pytest

from auditor.errors import UsageError
from auditor.probes.run import ProbeRequest, parse_output, parse_probes, program_args
from auditor.shipped import probe_agent as agent


def test_the_answer_is_the_last_marked_line() -> None:
    document = {"protocol": agent.PROTOCOL, "answer": {"status": "ok", "data": {}}}
    text = f"probe: noise\n{agent.MARK}{{}}\n{agent.MARK}{json.dumps(document)}\n"
    assert parse_output(text) == document


@pytest.mark.parametrize("text", [
    "", "bash: python3: command not found\n", f"{agent.MARK}not json\n",
    f"{agent.MARK}{'[' * 100000}{']' * 100000}\n",
    f"{agent.MARK}{json.dumps({'protocol': agent.PROTOCOL, 'answer': 'ok'})}\n",
])
def test_no_answer_is_an_error(text: str) -> None:
    answer = parse_output(text)["answer"]
    assert answer["status"] == "error" and "no answer" in answer["reason"]


def test_another_protocol_is_refused() -> None:
    text = f"{agent.MARK}{json.dumps({'protocol': 99, 'answer': {'status': 'ok'}})}\n"
    assert parse_output(text)["answer"] == {
        "status": "error", "reason": "the probe program spoke another protocol"}


def test_probe_names() -> None:
    assert parse_probes(None) == ("h2d", "d2h", "p2p", "wakeup", "numa")
    assert parse_probes("wakeup, h2d") == ("h2d", "wakeup")
    for bad in ("h2d,disk", ",", "H2D"):
        with pytest.raises(UsageError):
            parse_probes(bad)


def test_the_program_gets_what_was_asked() -> None:
    request = ProbeRequest(probes=("d2h",), timeout=5, force=True, gpus=(0, 3))
    assert program_args("copy", ("d2h",), request) == [
        "--probe", "copy", "--timeout", "5", "--directions", "d2h", "--gpus", "0,3", "--force"]
    assert agent.parse_args(program_args("copy", ("d2h",), request)) == {
        "probe": "copy", "timeout": 5.0, "force": True, "directions": ["d2h"], "gpus": [0, 3]}
