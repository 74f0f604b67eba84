"""Rendering: the one Jinja environment factory, and everything rendered to strings.

Reports of one or many hosts, the hosts-by-checks table, the fleet report of
``audit merge``, the fix and rollback scripts of a plan, and the before/after
lines of an applied fix. Every function returns text; the CLI writes it.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from auditor.model import (
    PROBLEMS,
    CheckResult,
    FailOn,
    Finding,
    Report,
    Status,
    count_by_status,
    worst,
)
from auditor.parsing import lazy_re
from auditor.text import visible

if TYPE_CHECKING:
    import jinja2

    from auditor.fix import FixPlan
    from auditor.fleet import FleetView, TextView

#: Report formats; ``line`` and ``nfd`` are the engines' own (:mod:`auditor.engines`).
FORMATS = ("text", "json", "markdown", "html", "junit", "prometheus", "line", "nfd", "nagios",
           "problems")
_TEMPLATES = {
    "text": "report.txt.j2",
    "markdown": "report.md.j2",
    "html": "report.html.j2",
    "junit": "report.junit.xml.j2",
}
Kind = Literal["text", "markdown", "html", "xml", "shell"]

_ANSI = {
    Status.PASS: "32",
    Status.SKIP: "2",
    Status.WARN: "33",
    Status.FAIL: "1;31",
    Status.ERROR: "1;35",
}


class ShellLiteral(str):
    """Text written by a template author, trusted to reach a shell as it is."""


def shell_quote(value: Any) -> str:
    """Quote a value for bash, whatever it holds (newlines, ``$(...)``, quotes)."""
    if isinstance(value, ShellLiteral):
        return str(value)
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return shlex.quote(str(value))


_COMMENT_UNSAFE = lazy_re("[\x00-\x1f\x7f\u2028\u2029]")


def shell_comment(value: Any) -> ShellLiteral:
    """Flatten a value to one line of printable text, safe after ``#`` in a script."""
    return ShellLiteral(_COMMENT_UNSAFE.sub("?", " ".join(str(value).split())))


def _shell_finalize(value: Any) -> str:
    # Every expression in a shell template is quoted unless marked with |literal.
    return shell_quote(value)


def printable_lines(text: str) -> str:
    """Return text with each line's control and format characters (ANSI escapes, bidi
    overrides) made visible."""
    return "".join(visible(line) + "\n" for line in text.splitlines())


def one_line(text: Any) -> str:
    """Fold a value onto one line, with control and format characters (ANSI escapes, bidi
    overrides, zero-width characters) made visible."""
    return visible(" ".join(str(text).split()))


class Safe(str):
    """Text a template made itself (a colour code, an escaped value): output as it is."""


def _text_finalize(value: Any) -> Any:
    # Every value a text template prints is one printable line: a host name, a message
    # or an error read from a host cannot move the cursor, recolour or clear the terminal,
    # nor reorder the line with a bidi override (every escape is made in auditor.text).
    if isinstance(value, str) and not isinstance(value, Safe):
        return visible(value)
    return value


#: What starts a markdown construct inline (emphasis, code, links, tables, HTML, entities).
_MD_SPECIAL = lazy_re(r"([\\`*_\[\]|~])")


def md_escape(value: Any) -> Safe:
    """Return a value as inert markdown on one line: no HTML, links, emphasis or table cells."""
    text = one_line(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return Safe(_MD_SPECIAL.sub(r"\\\1", text))


def md_code(value: Any) -> Safe:
    """Return a value as a markdown code span where that is inert, else as escaped text."""
    text = one_line(value)
    if text and "`" not in text and "\\" not in text:
        return Safe(f"`{text}`")
    return md_escape(text)


def _markdown_finalize(value: Any) -> Any:
    if isinstance(value, str) and not isinstance(value, Safe):
        return md_escape(value)
    return value


def _markup_finalize(value: Any) -> Any:
    # HTML and XML: format characters (bidi overrides, zero-width) would reorder or hide
    # text even as character references, and XML 1.0 forbids most control characters
    # even escaped; each is shown as its escape (auditor.text). Markup the template made
    # stays markup (the escapes are plain ASCII).
    if isinstance(value, str):
        shown = visible(value, keep="\n\t")
        if shown is not value and hasattr(value, "__html__"):
            from markupsafe import Markup

            return Markup(shown)  # noqa: S704 - it was markup; only ASCII escapes were added
        return shown
    return value


def make_environment(kind: Kind = "text", colour: bool = False) -> jinja2.Environment:
    """Return a Jinja environment: strict undefined always; HTML/XML autoescaped; shell quoted."""
    import jinja2  # here, not at import: JSON and Prometheus reports need no templates

    options: dict[str, Any] = {
        "loader": jinja2.PackageLoader("auditor", "templates"),
        "undefined": jinja2.StrictUndefined,
        "keep_trailing_newline": True,
        "trim_blocks": True,
        "lstrip_blocks": True,
        "autoescape": kind in ("html", "xml"),
    }
    if kind == "shell":
        options["finalize"] = _shell_finalize
    elif kind in ("xml", "html"):
        options["finalize"] = _markup_finalize
    elif kind == "text":
        options["finalize"] = _text_finalize
    elif kind == "markdown":
        options["finalize"] = _markdown_finalize
    env = jinja2.Environment(**options)  # noqa: S701 - autoescape set per kind above
    env.filters["tojson_pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
    env.filters["paint"] = lambda text, status: (
        Safe(f"\x1b[{_ANSI[Status(status)]}m{_text_finalize(str(text))}\x1b[0m") if colour
        else str(text)
    )
    env.filters["literal"] = ShellLiteral
    env.filters["quote"] = lambda value: ShellLiteral(shell_quote(value))
    env.filters["comment"] = shell_comment
    env.filters["one_line"] = one_line
    env.filters["md"] = md_escape
    env.filters["code"] = md_code
    return env


def check_line(result: CheckResult) -> str:
    """Summarise one check's findings in one line."""
    findings = result.findings
    bad = [f for f in findings if f.counted in PROBLEMS]
    if not bad:
        line = findings[0].message if len(findings) == 1 else (
            f"{len(findings)} subjects: " + "; ".join(
                dict.fromkeys(f"{f.status.value} {f.label}" for f in findings)
            )
        )
    elif len(bad) == 1:
        line = f"{bad[0].label}: {bad[0].message}"
    else:
        subjects = ", ".join(f.label for f in bad[:6]) + (" ..." if len(bad) > 6 else "")
        line = f"{len(bad)} of {len(findings)} subjects: {subjects}"
    waived = sum(1 for f in findings if f.waived)
    if waived and len(findings) == 1:
        return f"waived {findings[0].status.value}: {line}"
    return line + (f" ({waived} waived)" if waived else "")


def _problems(report: Report) -> list[Finding]:
    return [f for f in report.findings if f.counted in PROBLEMS]


def _waived(report: Report) -> list[Finding]:
    return [f for f in report.findings if f.waived]


def provenance(report: Report) -> str:
    """Return one line saying what made the report: the version, profile and policy file."""
    policy = dict(report.policy)
    parts = [f"host-auditor {report.version}" if report.version else "host-auditor"]
    if "profile" in policy:
        parts.append(f"profile {policy['profile']}")
    if "file" in policy:
        parts.append(f"policy {policy['file']} (sha256 {policy.get('sha256', '')[:12]})")
    return ", ".join(parts)


def timing_line(report: Report) -> str:
    """Return the run time, with a remote audit's connect, collect and checks phases."""
    total = f"{report.duration_s:.2f} s"
    if not report.timing:
        return total
    return total + " (" + ", ".join(f"{name} {seconds:.2f} s"
                                    for name, seconds in report.timing) + ")"


def render_report(
    report: Report,
    fmt: str,
    *,
    fail_on: FailOn = FailOn.FAIL,
    colour: bool = False,
) -> str:
    """Render one host's report in a format (text, json, markdown, html, junit)."""
    return render_reports([report], fmt, fail_on=fail_on, colour=colour)


def render_reports(
    reports: Sequence[Report],
    fmt: str,
    *,
    fail_on: FailOn = FailOn.FAIL,
    colour: bool = False,
    incomplete: str = "",
) -> str:
    """Render the reports of one or more hosts in a format.

    ``incomplete`` (the signal that stopped the run) marks a report whose hosts were not all
    audited; those hosts are error entries whose error starts ``not audited``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}")
    if fmt == "json":
        documents = [r.to_dict() for r in reports]
        if len(documents) == 1 and not incomplete:
            body: Any = documents[0]
        else:
            body = {"hosts": documents, "summary": _fleet_summary(reports, incomplete)}
        return json.dumps(body, indent=2, ensure_ascii=False) + "\n"
    if incomplete and fmt == "text":
        missing = not_audited(reports)
        head = (f"INCOMPLETE: stopped by {incomplete}; {len(reports) - len(missing)} of "
                f"{len(reports)} hosts audited; not audited: {', '.join(missing) or 'none'}")
        return one_line(head) + "\n\n" + render_reports(reports, fmt, fail_on=fail_on,
                                                         colour=colour)
    if fmt == "prometheus":
        from auditor.prom import render_prometheus

        return render_prometheus(reports)
    if fmt == "problems":
        return render_problems(reports)
    if fmt in ("line", "nfd", "nagios"):
        from auditor import engines

        if fmt == "nagios":
            return engines.render_nagios(reports)
        return engines.render_line(reports) if fmt == "line" else engines.render_nfd(reports)
    kind: Kind = {"html": "html", "junit": "xml",  # type: ignore[assignment]
                  "markdown": "markdown"}.get(fmt, "text")
    env = make_environment(kind, colour=colour and fmt == "text")
    template = env.get_template(_TEMPLATES[fmt])
    return template.render(
        reports=reports,
        problems={id(r): _problems(r) for r in reports},
        waived={id(r): _waived(r) for r in reports},
        check_line=check_line,
        provenance=provenance,
        timing_line=timing_line,
        fail_on=fail_on,
        Status=Status,
        id=id,
    )


#: How the error of a host a stopped run never audited starts.
NOT_AUDITED = "not audited"


def not_audited(reports: Sequence[Report]) -> list[str]:
    """Return the names of the hosts a stopped run did not audit."""
    return [r.label for r in reports if r.error.startswith(NOT_AUDITED)]


def _fleet_summary(reports: Sequence[Report], incomplete: str = "") -> dict[str, Any]:
    findings = count_by_status(f.status for r in reports for f in r.findings if not f.waived)
    findings["waived"] = sum(r.waived for r in reports)
    marks: dict[str, Any] = {}
    if incomplete:
        marks = {"incomplete": True, "stopped_by": incomplete,
                 "not_audited": not_audited(reports)}
    return {
        **marks,
        "hosts": len(reports),
        "targets": len(reports) + sum(len(r.aliases) for r in reports),
        "unreachable": sum(1 for r in reports if r.error),
        "findings": findings,
    }


# -- many hosts -------------------------------------------------------------------------


def _fit_line(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 3)].rstrip() + "..."


def render_problems(reports: Sequence[Report], width: int | None = None) -> str:
    """Render only what is wrong, one line each, cut to the terminal's width: a count of
    hosts by status, then each problem (status, check, subject) with the hosts that have it,
    worst and most widespread first, then the hosts that could not be audited."""
    import shutil

    from auditor.fleet import view_of_reports

    if width is None:
        width = max(40, shutil.get_terminal_size((120, 24)).columns)
    view = view_of_reports(reports)
    counts = view.host_counts()
    hosts = len(view.hosts)
    down = [r for r in view.hosts if r.error]
    head = (f"{hosts} host{'s' if hosts != 1 else ''}: {counts['pass'] + counts['skip']} "
            f"clean, {counts['warn']} warn, {counts['fail']} fail, {len(down)} not audited")
    lines = [head]
    for status, check, subject, names in view.problems():
        shown = ""
        for index, name in enumerate(names):
            more = f" (+{len(names) - index} more)"
            candidate = f"{shown}, {one_line(name)}" if shown else one_line(name)
            line = f"{status.upper():<5} {check} {one_line(subject)}: {candidate}"
            if len(line) + (len(more) if index + 1 < len(names) else 0) > width and shown:
                shown += more
                break
            shown = candidate
        lines.append(_fit_line(f"{status.upper():<5} {check} {one_line(subject)}: {shown}",
                               width))
    for report in down:
        lines.append(_fit_line(f"ERROR {one_line(report.host)}: {one_line(report.error)}",
                               width))
    if len(lines) == 1:
        lines.append("no problems")
    return "\n".join(lines) + "\n"


def fleet_rows(reports: Sequence[Report]) -> tuple[list[str], list[dict[str, Any]]]:
    """Return the check ids and one row per host (status per check) for the fleet table."""
    checks: dict[str, None] = {}
    for report in reports:
        for result in report.results:
            checks.setdefault(result.check, None)
    rows = []
    for report in reports:
        statuses = {r.check: r.status.value for r in report.results}
        rows.append({
            "host": report.host,
            "target": ", ".join([report.label, *report.aliases]),
            "error": report.error,
            "cells": [statuses.get(check, "-") for check in checks],
            "status": report.status.value,
        })
    return list(checks), rows


def render_fleet_table(reports: Sequence[Report], colour: bool = False) -> str:
    """Render the hosts-by-checks table that follows several hosts' text reports."""
    checks, rows = fleet_rows(reports)
    env = make_environment("text", colour=colour)
    return env.get_template("fleet.txt.j2").render(
        checks=checks,
        rows=rows,
        counts=count_by_status(r.status for r in reports),
        unreachable=sum(1 for r in reports if r.error),
        host_width=max([len("HOST"), *(len(r["host"]) for r in rows)]),
        target_width=max([len("TARGET"), *(len(r["target"]) for r in rows)]),
        widths=[max(len(c), 5) for c in checks],
    )


FLEET_FORMATS = ("text", "json", "html", "prometheus", "line")


def render_merged_text(view: TextView, *, limit: int = 10) -> str:
    """Render the text report of ``audit merge`` (a fleet merged from result files): the
    first ``limit`` hosts of a list (at most the groups ``view`` holds)."""
    return make_environment("text").get_template("merge.txt.j2").render(view=view, limit=limit)


def render_merge(view: FleetView, fmt: str, *, limit: int = 10) -> str:
    """Render the fleet report of ``audit merge``: text, json, html, prometheus or line."""
    if fmt == "json":
        # One host at a time: the whole fleet as dicts at once would triple the memory.
        head = json.dumps(view.to_dict(hosts=False), indent=1, ensure_ascii=False)
        hosts = ",\n".join(json.dumps(view.host_dict(r), ensure_ascii=False) for r in view.hosts)
        return f'{head[:-2]},\n "hosts": [\n{hosts}\n ]\n}}\n'
    if fmt == "prometheus":
        from auditor.prom import render_prometheus

        return render_prometheus(view.hosts)
    if fmt == "line":
        from auditor.engines import render_line

        return render_line(view.hosts)
    if fmt not in FLEET_FORMATS:
        raise ValueError(f"unknown fleet format {fmt!r}")
    if fmt == "text":
        raise ValueError("the text fleet report is render_merged_text's (auditor.merge)")
    env = make_environment("html")
    groups = [(stamp, len(hosts), hosts) for stamp, hosts in view.groups]
    return env.get_template("fleet.html.j2").render(view=view, groups=groups, limit=limit)


# -- fix scripts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RenderedFix:
    """A plan as scripts: the fix (which keeps a copy of its rollback) and the rollback."""

    script: str
    rollback: str


def heredoc_end(name: str, text: str) -> str:
    """Return a here-document delimiter that no line of ``text`` equals.

    It carries a hash of the text, so no line of the text (a value read from the host
    holding a newline and the delimiter included) can be it.
    """
    import hashlib

    lines = set(text.split("\n"))
    digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest().upper()
    for width in (12, 24, 64):
        end = f"HOST_AUDITOR_{name}_{digest[:width]}"
        if end not in lines:
            return end
    raise ValueError("no here-document delimiter fits")  # pragma: no cover


def sysroot_program() -> str:
    """Return the sysroot fix program: treeio, the selector parse, then sysroot_fix.

    One program, standard library only, for the host's own ``python3``; the selector parse
    is :mod:`auditor.parsing`'s own source, so the fix of a sysroot parses as the audit does.
    """
    import inspect

    from auditor import parsing
    from auditor.hosts.collect import module_sources
    from auditor.shipped import sysroot_fix, treeio

    shared = "\n\n".join(inspect.getsource(f) for f in (parsing.parse_selector,
                                                        parsing.select_word))
    return "\n\n".join((module_sources(treeio).decode("utf-8"), shared,
                         module_sources(sysroot_fix).decode("utf-8")))


def render_fix(plan: FixPlan) -> RenderedFix:
    """Render the bash scripts that apply the plan and undo it.

    A booted machine's scripts are bash. A sysroot's hand the plan to python3, which opens
    every path inside the sysroot (:mod:`auditor.shipped.sysroot_fix`): bash cannot.
    """
    from auditor.remedy import describe

    env = make_environment("shell")
    env.globals["describe"] = describe
    if not plan.sysroot:
        rollback = env.get_template("rollback.sh.j2").render(plan=plan)
        script = env.get_template("fix.sh.j2").render(
            plan=plan, rollback_text=rollback, rollback_end=heredoc_end("ROLLBACK", rollback))
        return RenderedFix(script, rollback)
    program = sysroot_program()
    plan_json = json.dumps(plan.document(), ensure_ascii=True, sort_keys=True,
                           separators=(",", ":"))
    common: dict[str, Any] = {
        "plan": plan, "plan_json": plan_json, "program": program,
        "plan_end": heredoc_end("PLAN", plan_json),
        "program_end": heredoc_end("PROGRAM", program),
    }
    template = env.get_template("fix_sysroot.sh.j2")
    rollback = template.render(mode="rollback", **common)
    script = template.render(mode="fix", rollback_text=rollback,
                             rollback_end=heredoc_end("ROLLBACK", rollback), **common)
    return RenderedFix(script, rollback)


def render_comparison(before: Report, after: Report) -> str:
    """Return each check's worst status before and after, naming subjects still at fault."""
    checks = list(dict.fromkeys([r.check for r in before.results]
                                + [r.check for r in after.results]))
    if not checks:
        return "before -> after: no checks ran\n"
    width = max(len(c) for c in checks)
    lines = ["before -> after:"]
    for check in checks:
        was = worst(f.counted for f in before.findings if f.check == check).value
        now_findings = [f for f in after.findings if f.check == check]
        now = worst(f.counted for f in now_findings).value
        left = [f.label for f in now_findings if f.counted in PROBLEMS]
        still = f"  ({', '.join(left)})" if left else ""
        lines.append(f"  {check.ljust(width)}  {was:>5} -> {now}{still}")
    return "\n".join(lines) + "\n"
