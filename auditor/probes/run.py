"""Run the probe program here or over SSH, and make a report of what it measured.

Each probe is one run of the program (:mod:`auditor.shipped.probe_agent`), which measures in a
child of its own with the probe's deadline. Here the program runs with this Python in a
session of its own, and is killed as a group a few seconds past the deadline should it
not answer (a child stuck in the kernel). Over SSH its text goes to the target's
``python3`` as a here-document on the connection already open: nothing is installed,
nothing is left behind, and no value reaches the remote shell unquoted.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from auditor import __version__
from auditor.errors import UsageError
from auditor.model import CheckResult, Finding, Report
from auditor.probes import judge
from auditor.shipped import probe_agent as agent

AGENT_PATH = os.path.abspath(agent.__file__)
#: What the program may print at most (its answer is bounded at 4 MiB).
MAX_OUTPUT = 8 << 20
#: Seconds past a probe's own deadline before the whole program is killed: starting
#: Python, the child's SIGKILL and the answer.
GRACE_S = 10.0


@dataclass(frozen=True)
class ProbeRequest:
    """What to measure and how."""

    probes: tuple[str, ...] = judge.PROBES
    timeout: float = 60.0
    force: bool = False
    gpus: tuple[int, ...] = ()
    #: Wake-ups per CPU group (the wakeup probe).
    wakeups: int = 3000
    #: Bytes of each copy (h2d/d2h and p2p; None: the program's 64 MiB).
    copy_bytes: int | None = None
    thresholds: judge.Thresholds = field(default_factory=judge.Thresholds)


def parse_probes(text: str | None) -> tuple[str, ...]:
    """Return the probes a ``--probe`` list names (all where none), or raise a usage error."""
    if not text:
        return judge.PROBES
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in judge.PROBES]
    if unknown or not names:
        raise UsageError(f"unknown probe {', '.join(unknown) or repr(text)} (probes: "
                         f"{', '.join(judge.PROBES)})")
    return tuple(name for name in judge.PROBES if name in names)


def program_runs(request: ProbeRequest) -> list[tuple[str, tuple[str, ...]]]:
    """Return the program's probes to run and the probes each answers: ``copy`` measures
    h2d and d2h in one driver session."""
    runs: list[tuple[str, tuple[str, ...]]] = []
    copies = tuple(p for p in ("h2d", "d2h") if p in request.probes)
    if copies:
        runs.append(("copy", copies))
    runs += [(p, (p,)) for p in ("p2p", "wakeup", "numa") if p in request.probes]
    return runs


def program_args(program_probe: str, answers: Sequence[str], request: ProbeRequest) -> list[str]:
    args = ["--probe", program_probe, "--timeout", f"{request.timeout:g}"]
    if program_probe == "copy":
        args += ["--directions", ",".join(answers)]
    if request.gpus:
        args += ["--gpus", ",".join(str(g) for g in request.gpus)]
    if request.copy_bytes:
        args += ["--bytes", str(request.copy_bytes)]
    if program_probe == "wakeup":
        args += ["--wakeups", str(request.wakeups)]
    if request.force:
        args.append("--force")
    return args


def parse_output(text: str) -> dict[str, Any]:
    """Return the program's answer from what it printed; a missing or foreign answer is one
    with status ``error``."""
    for line in reversed(text[-MAX_OUTPUT:].splitlines()):
        if line.startswith(agent.MARK):
            try:
                document = json.loads(line[len(agent.MARK):])
            except (ValueError, RecursionError):  # a host's answer nested to blow the stack
                break
            if not isinstance(document, dict) or document.get("protocol") != agent.PROTOCOL:
                return {"answer": {"status": "error",
                                   "reason": "the probe program spoke another protocol"}}
            if not isinstance(document.get("answer"), dict):
                break
            return document
    tail = " ".join(text.strip().splitlines()[-1:])[:200] if text.strip() else "nothing"
    return {"answer": {"status": "error", "reason": f"no answer from the probe program "
                                                    f"(it printed: {tail})"}}


class Runner(Protocol):
    """Where the program runs."""

    def run(self, args: Sequence[str], timeout: float) -> dict[str, Any]:
        """Run the program with ``args``; return its document (see :func:`parse_output`)."""


class LocalRunner:
    """This machine: the program under this Python, in a session of its own."""

    def __init__(self, python: str | None = None, env: Mapping[str, str] | None = None) -> None:
        self.python = python or sys.executable
        self.env = dict(env) if env is not None else None

    def run(self, args: Sequence[str], timeout: float) -> dict[str, Any]:
        # -I: no user site, no PYTHON* variables; the program needs nothing but stdlib.
        command = [self.python, "-I", AGENT_PATH, *args]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, start_new_session=True, env=self.env)
        try:
            out, err = process.communicate(timeout=timeout + GRACE_S)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            process.communicate()
            return {"answer": {"status": "timeout", "reason": f"the probe program did not "
                                                              f"answer in {timeout + GRACE_S:g} s"}}
        finally:
            _kill_group(process.pid)  # nothing it started outlives it
        return parse_output(out.decode("utf-8", "replace")
                            + err.decode("utf-8", "replace")[-4096:])


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class SshRunner:
    """A host over its open SSH connection: the program as a here-document to python3."""

    def __init__(self, host: Any) -> None:
        self.host = host

    def run(self, args: Sequence[str], timeout: float) -> dict[str, Any]:
        from auditor.render import heredoc_end

        with open(AGENT_PATH, encoding="utf-8") as handle:
            program = handle.read()
        end = heredoc_end("PROBE", program)
        quoted = " ".join(shlex.quote(a) for a in args)
        script = (
            "command -v python3 >/dev/null 2>&1 || "
            "{ echo 'host-auditor: no python3 on this host'; exit 127; }\n"
            f"exec python3 - {quoted} <<'{end}'\n{program}\n{end}\n"
        )
        result = self.host.run_script(script, timeout=timeout + GRACE_S)
        if result.returncode == 127:
            # The shell could not start: no python3 (the script's own line), or no bash.
            said = " ".join(result.output.strip().splitlines()[-1:])[:200]
            reason = ("no python3 on the host to run the probe" if "no python3" in said
                      else f"the host could not start the probe program ({said})")
            return {"answer": {"status": "skip", "reason": reason}}
        if result.returncode == 124:
            return {"answer": {"status": "timeout", "reason": f"the probe program did not "
                                                              f"answer in {timeout + GRACE_S:g} s"}}
        return parse_output(result.output)


#: What a broken p2p path would corroborate: called only once a p2p probe measured.
Related = Callable[[], Sequence[Finding]]


def _none() -> Sequence[Finding]:
    return ()


def judge_answer(probes: Sequence[str], answer: Mapping[str, Any], request: ProbeRequest,
                 related: Related = _none) -> list[Finding]:
    """Return the findings of one run of the program, for the probes it answers."""
    status = answer.get("status")
    if status != "ok" or not isinstance(answer.get("data"), Mapping):
        return [judge.not_run(p, answer) for p in probes]
    data: Mapping[str, Any] = answer["data"]
    if probes[0] in ("h2d", "d2h"):
        return judge.judge_copy(data, probes, request.thresholds)
    if probes[0] == "p2p":
        return judge.judge_p2p(data, related(), request.thresholds)
    if probes[0] == "wakeup":
        return judge.judge_wakeup(data, request.thresholds)
    return judge.judge_numa(data)


def _peak_gpu_memory(answer: Mapping[str, Any]) -> int:
    data = answer.get("data")
    peak = 0
    if isinstance(data, Mapping) and isinstance(data.get("gpus"), list):
        for item in data["gpus"]:
            if isinstance(item, Mapping):
                used = judge._number(item.get("gpu_mem_used_bytes"), 0, 1 << 50)
                peak = max(peak, int(used or 0))
    return peak


def run_probes(runner: Runner, request: ProbeRequest, *, target: str,
               say: Callable[[str], None] = lambda _: None,
               related: Related = _none) -> Report:
    """Run the requested probes one after another; return them as one report."""
    started_at = dt.datetime.now(dt.timezone.utc)
    started = time.perf_counter()
    results: list[CheckResult] = []
    facts: dict[str, str] = {}
    host = ""
    peak = 0
    for program_probe, answers in program_runs(request):
        names = ",".join(answers)
        say(f"probe {names}: running (deadline {request.timeout:g} s)")
        begun = time.perf_counter()
        document = runner.run(program_args(program_probe, answers, request), request.timeout)
        elapsed = time.perf_counter() - begun
        answer = document["answer"]
        host = host or judge._text(document.get("host"), 255)
        for key in ("kernel", "python"):
            if document.get(key):
                facts.setdefault(key, judge._text(document[key], 255))
        data = answer.get("data") if isinstance(answer.get("data"), Mapping) else {}
        if data.get("driver"):
            facts["gpu_driver"] = (f"{judge._text(data['driver'], 16)} "
                                   f"{judge._text(data.get('driver_version'), 16)}")
        peak = max(peak, _peak_gpu_memory(answer))
        findings = judge_answer(answers, answer, request, related)
        for probe in answers:
            own = tuple(f for f in findings if f.check == judge.check_id(probe))
            results.append(CheckResult(judge.check_id(probe), elapsed / len(answers), own))
        statuses = sorted({f.status.value for f in findings})
        say(f"probe {names}: {'/'.join(statuses) or 'nothing'} in {elapsed:.1f} s"
            + (f" ({judge._text(answer.get('reason'), 160)})"
               if answer.get("status") != "ok" else ""))
    duration = time.perf_counter() - started
    facts["probe_wall_s"] = f"{duration:.2f}"
    if peak:
        facts["probe_gpu_memory_peak_bytes"] = str(peak)
    findings_host = host or target
    results = [CheckResult(r.check, r.duration_s,
                           tuple(_with_host(f, findings_host) for f in r.findings))
               for r in results]
    return Report(host=findings_host, target=target, started=started_at.isoformat(),
                  duration_s=duration, results=tuple(results), facts=tuple(facts.items()),
                  version=__version__)


def _with_host(finding: Finding, host: str) -> Finding:
    return Finding(**{**finding.__dict__, "host": host})
