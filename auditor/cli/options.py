"""What the ``audit`` commands share: options, the error -> exit code table, output.

Exit codes: 0 nothing at or above ``--fail-on``; 1 findings at or above it (or a
fix that failed or was refused); 2 usage error (unknown check id, bad option,
unreadable root, policy or inventory); 3 a target could not be audited; 4 an
internal error (a defect of host-auditor; ``--debug`` shows the traceback);
130 interrupted (SIGINT), 143 terminated (SIGTERM).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from auditor.errors import AuditorError, UsageError
from auditor.model import FailOn, Report
from auditor.render import FORMATS
from auditor.text import printable

if TYPE_CHECKING:
    from auditor.check import CheckClass
    from auditor.hosts.ssh import SshOptions
    from auditor.policy import Policy

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERNAL = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130
#: Terminated by SIGTERM (128 + 15, as a shell reports a process SIGTERM ended).
EXIT_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: the run stops as on Ctrl-C (connections closed, the hosts finished
    reported, the rest listed as not audited) and exits 143."""


def raise_terminated(signum: int, frame: object) -> None:
    """The SIGTERM handler: stop the run where it is, in the main thread."""
    raise Terminated()


def signal_name(interruption: KeyboardInterrupt) -> str:
    """Return which signal stopped the run: ``SIGTERM`` or ``SIGINT``."""
    return "SIGTERM" if isinstance(interruption, Terminated) else "SIGINT"


def interrupted_exit(interruption: KeyboardInterrupt) -> int:
    """Return the exit code of a run stopped by a signal: 143 for SIGTERM, 130 for SIGINT."""
    return EXIT_TERMINATED if isinstance(interruption, Terminated) else EXIT_INTERRUPTED

#: Each error class's exit code, most specific first: the one place errors become codes.
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (UsageError, EXIT_USAGE),
    (AuditorError, EXIT_UNREACHABLE),
)


def exit_code_of(error: BaseException) -> int:
    """Return the exit code an error ends the command with."""
    for kind, code in EXIT_CODES:
        if isinstance(error, kind):
            return code
    return EXIT_INTERNAL


_stderr_lock = threading.Lock()
#: -1 with ``-q`` (errors only), 0 by default, 1 with ``-v``.
_verbosity = 0


def set_verbosity(quiet: bool, verbose: bool) -> None:
    """Set how much goes to stderr besides errors: ``-q`` nothing, ``-v`` what was chosen."""
    global _verbosity
    if quiet and verbose:
        raise UsageError("-q/--quiet and -v/--verbose contradict each other: choose one")
    _verbosity = -1 if quiet else (1 if verbose else 0)


def quiet() -> bool:
    """Return whether only errors go to stderr (``-q``)."""
    return _verbosity < 0


def verbose(message: str) -> None:
    """Print one line of detail to stderr with ``-v``."""
    if _verbosity > 0:
        say(f"audit: {printable(message)}")


def say(line: str) -> None:
    """Write one whole line to stderr at once: lines of hosts audited in parallel (threads,
    and worker processes sharing the descriptor) never run into each other."""
    data = (line.rstrip("\n") + "\n").encode("utf-8", "backslashreplace")
    with _stderr_lock:
        try:
            sys.stderr.flush()
            os.write(sys.stderr.fileno(), data)
        except (AttributeError, OSError, ValueError):
            # Not a real descriptor (captured in tests, closed): the stream's own write.
            sys.stderr.write(data.decode("utf-8"))
            sys.stderr.flush()


def fatal(message: str, code: int) -> NoReturn:
    """Print one line to stderr (made printable: it may quote a host) and exit with ``code``."""
    say(f"audit: error: {printable(message)}")
    raise typer.Exit(code)


def note(message: str) -> None:
    """Print one line of information to stderr (made printable; not with ``-q``)."""
    if _verbosity >= 0:
        say(f"audit: {printable(message)}")


@contextlib.contextmanager
def handle_errors(debug: bool = False) -> Iterator[None]:
    """Turn an auditor error into one line on stderr and its exit code (``--debug`` re-raises)."""
    try:
        yield
    except AuditorError as exc:
        if debug:
            raise
        fatal(" ".join(str(exc).split()), exit_code_of(exc))


# -- options every auditing command declares ------------------------------------------------

#: Report formats of ``audit local`` and ``audit host``, and the file extensions ``-o``
#: infers them from when ``--format`` is not given.
REPORT_FORMATS = FORMATS
EXTENSIONS = {".txt": "text", ".json": "json", ".md": "markdown", ".markdown": "markdown",
              ".html": "html", ".htm": "html", ".xml": "junit", ".prom": "prometheus"}
PROFILE_NAMES = ("gpu-inference", "latency", "throughput")


def choice(what: str, values: Sequence[str],
           aliases: Mapping[str, str] | None = None) -> Callable[[str | None], str | None]:
    """Return a typer callback that accepts one of ``values`` (or an alias of one)."""
    def check(value: str | None) -> str | None:
        if value is None:
            return None
        value = (aliases or {}).get(value, value)
        if value not in values:
            raise typer.BadParameter(f"unknown {what} {value!r} (choose from "
                                     f"{', '.join(values)})")
        return value

    return check


def metavar(values: Sequence[str]) -> str:
    """Return the choices as help shows them: ``[a|b|c]``."""
    return "[" + "|".join(values) + "]"


def infer_format(fmt: str | None, output: str | None, formats: Sequence[str]) -> str:
    """Return ``--format``, else the format the output file's extension names, else text."""
    if fmt is not None:
        return fmt
    if output and output != "-":
        inferred = EXTENSIONS.get(os.path.splitext(output)[1].lower())
        if inferred is not None and inferred in formats:
            return inferred
    return "text"


FormatOpt = Annotated[
    str | None,
    typer.Option("--format", "-f", metavar=metavar(REPORT_FORMATS),
                 callback=choice("format", REPORT_FORMATS),
                 help="Report format; line: one line per host, at most 80 bytes; nfd: "
                      "node-feature-discovery labels; nagios: a Nagios/Icinga plugin's "
                      "output and exit code (default: from the --output file's "
                      "extension, else text)."),
]
OutputOpt = Annotated[
    str | None, typer.Option("--output", "-o", help="Write the report to FILE.", metavar="FILE")
]
CheckOpt = Annotated[
    list[str] | None, typer.Option("--check", metavar="ID", help="Run only this check id, or "
                                   "the ids a pattern such as 'pcie.*' matches (repeatable).")
]
SkipOpt = Annotated[
    list[str] | None, typer.Option("--skip", metavar="ID", help="Skip this check id, or the ids "
                                   "a pattern matches (repeatable).")
]
FailOnOpt = Annotated[
    str, typer.Option("--fail-on", metavar=metavar(("warn", "fail")),
                      callback=choice("level", ("warn", "fail"), {"warning": "warn"}),
                      help="Lowest status that exits 1 (warning: the same as warn).")
]
PolicyOpt = Annotated[
    str | None, typer.Option("--policy", help="TOML policy file of thresholds and waivers "
                             "(default: $HOST_AUDITOR_POLICY, else "
                             "/etc/host-auditor/policy.toml where it exists).",
                             metavar="FILE")
]
ProfileOpt = Annotated[
    str | None,
    typer.Option("--profile", metavar=metavar(PROFILE_NAMES),
                 callback=choice("profile", PROFILE_NAMES),
                 help="Built-in profile (default: the policy file's, else gpu-inference)."),
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Re-raise a failing check's exception.")]
ColorOpt = Annotated[
    str, typer.Option("--color", "--colour", metavar=metavar(("auto", "always", "never")),
                      callback=choice("colour", ("auto", "always", "never")),
                      help="Colour the text report: auto (on a terminal, unless NO_COLOR is "
                           "set), always or never.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Only errors on stderr: no "
                                        "progress, notes or warnings.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Also say on stderr what "
                                          "was chosen: checks, profile, policy file.")]
RootOpt = Annotated[
    str | None,
    typer.Option("--root", help="Audit a sysroot: a directory or a .tar.gz capture.",
                 metavar="PATH"),
]
FixScriptOpt = Annotated[
    str | None, typer.Option("--fix-script", help="Write a bash script that fixes the "
                             "findings (a dry run: nothing changes).", metavar="FILE")
]
RollbackScriptOpt = Annotated[
    str | None, typer.Option("--rollback-script", help="Write the script that undoes the "
                             "fix (default: FILE.rollback.sh beside --fix-script).",
                             metavar="FILE")
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Apply without asking.")]

# -- how to reach hosts over SSH (audit host, audit snapshot) --------------------------------

UserOpt = Annotated[str | None, typer.Option("--user", "-u", metavar="USER",
                                             help="Log in as USER.")]
PortOpt = Annotated[int | None, typer.Option(
    "--port", "-p", min=1, max=65535, metavar="PORT",
    help="SSH port (default 22 or the ssh config's).")]
IdentityOpt = Annotated[str | None, typer.Option(
    "--identity", metavar="KEYFILE", help="Private key to offer.")]
SudoOpt = Annotated[bool, typer.Option(
    "--sudo", help="Collect under 'sudo -n' (full PCI config space); without a password-less "
                   "sudo the audit goes on unprivileged and says so.")]
TimeoutOpt = Annotated[float, typer.Option(
    "--timeout", min=0.1, metavar="SECONDS", help="Seconds for connecting and for the command.")]
AcceptNewOpt = Annotated[bool, typer.Option(
    "--accept-new-host-keys",
    help="Trust an unknown host key on first use and record it in known_hosts (a changed key "
         "is still refused).")]
KnownHostsOpt = Annotated[str | None, typer.Option(
    "--known-hosts", metavar="FILE", help="Also trust the keys in FILE (and record new ones "
                                          "there).")]
SshConfigOpt = Annotated[str | None, typer.Option(
    "--ssh-config", metavar="FILE", help="Read this ssh config instead of ~/.ssh/config.")]


def _readable_file(path: str, what: str) -> None:
    """Raise a usage error naming ``path`` unless it is a file this process can read."""
    expanded = os.path.expanduser(path)
    if not os.path.exists(expanded):
        raise UsageError(f"{path}: no such {what}")
    if not os.path.isfile(expanded):
        raise UsageError(f"{path}: {what} is not a regular file")
    try:
        with open(expanded, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read {what} ({exc.strerror})") from exc


def ssh_options(user: str | None, port: int | None, identity: str | None, sudo: bool,
                timeout: float, accept_new_host_keys: bool, known_hosts: str | None,
                ssh_config: str | None, root: str | None = None) -> SshOptions:
    """Return the SSH options the command line asked for; a bad key or config file is a
    usage error naming it, before any host is tried."""
    try:
        import paramiko  # noqa: F401 - only to tell a build without SSH before any host

        from auditor.hosts.ssh import SshOptions
    except ImportError as exc:
        raise UsageError(f"auditing over SSH needs fabric and paramiko, which this audit "
                         f"lacks ({exc}; the single-file build carries no SSH): install the "
                         "package on this machine (pip install host-auditor)") from exc

    if identity is not None:
        _readable_file(identity, "identity key file")
    if ssh_config is not None:
        _readable_file(ssh_config, "ssh config file")
        _parse_ssh_config(ssh_config)

    return SshOptions(
        user=user, port=port, identity=identity, sudo=sudo, timeout=timeout,
        accept_new_host_keys=accept_new_host_keys,
        known_hosts=(known_hosts,) if known_hosts else (), ssh_config=ssh_config, root=root,
    )


def _parse_ssh_config(path: str) -> None:
    import paramiko

    try:
        with open(os.path.expanduser(path), encoding="utf-8") as handle:
            paramiko.SSHConfig().parse(handle)
    except (OSError, UnicodeDecodeError, ValueError, paramiko.SSHException) as exc:
        raise UsageError(f"{path}: not a valid ssh config ({' '.join(str(exc).split())})"
                         ) from exc


@dataclass(frozen=True)
class AuditOptions:
    """What every auditing command shares: selection, policy and output."""

    fmt: str = "text"
    output: str | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    fail_on: FailOn = FailOn.FAIL
    policy: str | None = None
    profile: str | None = None
    debug: bool = False
    #: ``--color``: auto (a terminal, and NO_COLOR not set), always or never.
    color: str = "auto"

    @classmethod
    def of(cls, fmt: str | None = "text", output: str | None = None,
           check: list[str] | None = None, skip: list[str] | None = None,
           fail_on: FailOn | str = FailOn.FAIL, policy: str | None = None,
           profile: str | None = None, debug: bool = False,
           color: str = "auto") -> AuditOptions:
        """Build the options from a command's parameters (lists as typer passes them; no
        format: the one ``output``'s extension names, else text)."""
        return cls(infer_format(fmt, output, REPORT_FORMATS), output, tuple(check or ()),
                   tuple(skip or ()), FailOn(fail_on), policy, profile, debug, color)

    def colour(self) -> bool:
        """Return whether the text report is coloured."""
        if self.fmt != "text" or self.color == "never":
            return False
        if self.color == "always":
            return True
        return (self.output in (None, "-") and sys.stdout.isatty()
                and "NO_COLOR" not in os.environ)


def prepare(options: AuditOptions, targets: int = 1) -> tuple[list[CheckClass], Policy]:
    """Return the selected check classes and the policy, or raise a usage error.

    Everything the command line says is checked here, before the first host is touched:
    the format for ``targets`` hosts, the output file, the checks and the policy.
    """
    from auditor.policy import load_policy, local_plugins, read_policy
    from auditor.registry import load_checks, select, validate
    from auditor.render import FORMATS

    if options.fmt not in FORMATS:
        raise UsageError(f"unknown format {options.fmt!r} (formats: {', '.join(FORMATS)})")
    if options.fmt == "nfd" and targets > 1:
        raise UsageError(f"--format nfd labels one node; {targets} hosts were named (run "
                         "audit local on each node)")
    check_output_path(options.output)
    path = options.policy if options.policy is not None else default_policy()
    document = read_policy(path) if path is not None else None
    every = load_checks()
    local = local_plugins(document)
    if local:  # a site's own checks, from the policy file: validated with every other one
        every = validate([*every, *local])
    checks = select(every, options.only, options.skip)
    if not checks:
        raise UsageError("no checks left to run after --check/--skip")
    policy = load_policy(every, path, options.profile, document=document)
    provenance = dict(policy.provenance())
    verbose(f"{len(checks)} checks; profile {provenance.get('profile', '-')}; policy "
            + (f"{path} (sha256 {provenance.get('sha256', '')[:12]})" if path else "none"))
    return checks, policy


#: The policy every command reads when ``--policy`` is not given, so that engines (Slurm,
#: NHC, node-problem-detector, the DaemonSet) need no extra argument.
DEFAULT_POLICY = "/etc/host-auditor/policy.toml"
#: Names the policy instead of :data:`DEFAULT_POLICY`; set empty, no policy file at all.
POLICY_ENV = "HOST_AUDITOR_POLICY"


def default_policy() -> str | None:
    """Return the policy file used without ``--policy``: ``$HOST_AUDITOR_POLICY`` (which
    must exist; empty: none), else :data:`DEFAULT_POLICY` where it exists, else none."""
    if POLICY_ENV in os.environ:
        chosen = os.environ[POLICY_ENV].strip()
        if chosen and not os.path.exists(chosen):
            raise UsageError(f"{POLICY_ENV}={chosen}: no such policy file")
        return chosen or None
    return DEFAULT_POLICY if os.path.exists(DEFAULT_POLICY) else None


def check_output_path(path: str | None, what: str = "report") -> None:
    """Raise a usage error unless ``path`` can be written: run before any work, so a typo in
    ``-o`` costs a second, not a fleet's audit.

    The file's directory must exist and be a directory this process may create files in
    (or the file exist and be writable: it is then written in place); the path must not be
    a directory. What only the write can tell (a full disk) is handled when writing.
    """
    if path is None or path == "-":
        return
    expanded = os.path.expanduser(path)
    if os.path.isdir(expanded):
        raise UsageError(f"{path}: is a directory; name the {what} file to write")
    directory = os.path.dirname(os.path.abspath(expanded))
    if not os.path.isdir(directory):
        raise UsageError(f"{path}: cannot write the {what}: directory {directory} does not "
                         "exist")
    if os.path.exists(expanded) and os.access(expanded, os.W_OK):
        return
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"{path}: cannot write the {what}: no permission to create files "
                         f"in {directory}")


#: Where reports are kept when their output cannot be written after the work (a full
#: disk): another file system than the output's, more often than not.
UNSAVED_ENV = "HOST_AUDITOR_UNSAVED_DIR"


def unsaved_dir() -> str:
    """Return where reports that could not be written are kept for this user."""
    configured = os.environ.get(UNSAVED_ENV)
    if configured:
        return os.path.abspath(configured)
    if os.geteuid() == 0:
        return "/var/lib/host-auditor/unsaved"
    home = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"),
                                                              ".local", "state")
    return os.path.join(os.path.abspath(home), "host-auditor", "unsaved")


def keep_unsaved(reports: Sequence[Report]) -> str:
    """Write every report as JSON into :func:`unsaved_dir`; return the file's path.

    The directory is made ``0700`` and must be this user's alone (never a path another
    user controls); the file is new (``O_EXCL``), ``0600``. Raise OSError.
    """
    import datetime as dt
    import json
    import stat

    directory = unsaved_dir()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise PermissionError(f"{directory} is not this user's alone (mode "
                                  f"{stat.S_IMODE(st.st_mode):o})")
        name = f"audit-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S}-{os.getpid()}.json"
        documents = [r.to_dict() for r in reports]
        body = documents[0] if len(documents) == 1 else {"hosts": documents}
        data = (json.dumps(body, indent=1, ensure_ascii=False) + "\n").encode("utf-8")
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                      dir_fd=fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
        except BaseException:
            os.close(out)
            os.unlink(name, dir_fd=fd)
            raise
        os.close(out)
        return os.path.join(directory, name)
    finally:
        os.close(fd)


#: Write errors no check before the work can foresee (the disk filled up meanwhile, a quota,
#: an I/O error): the reports are then kept elsewhere. A refused path (permissions, a
#: symlink) is the command line's fault and is said as such.
LATE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG})


def write_output(text: str, output: str | None,
                 reports: Sequence[Report] | None = None) -> None:
    """Write rendered text to stdout, or to a file through a dot-file and a rename.

    Where the file cannot be written after the work (a full disk), the ``reports`` are kept
    as JSON in :func:`unsaved_dir` and the one error line says where (exit 2).
    """
    if output is None or output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from auditor.engines import write_atomic

    try:
        write_atomic(output, text)
    except OSError as exc:
        kept = ""
        if reports and exc.errno in LATE_ERRNOS:
            try:
                kept = (f"; the {len(reports)} host{'s' if len(reports) != 1 else ''}' "
                        f"results are kept in {keep_unsaved(reports)}")
            except OSError as again:
                kept = f"; the results could not be kept either ({again})"
        fatal(f"{output}: cannot write report ({exc.strerror}){kept}", EXIT_USAGE)


def write_output_chunks(chunks: Iterable[bytes], output: str | None) -> None:
    """Write rendered output given in pieces (a large fleet report) as write_output does."""
    if output is None or output == "-":
        out = sys.stdout.buffer
        for chunk in chunks:
            out.write(chunk)
        out.flush()
        return
    from auditor.engines import write_atomic_chunks

    try:
        write_atomic_chunks(output, chunks)
    except OSError as exc:
        fatal(f"{output}: cannot write report ({exc.strerror})", EXIT_USAGE)


def exit_code(reports: Sequence[Report], fail_on: FailOn) -> int:
    """Return 3 if a host could not be audited, else 1 if a finding trips ``fail_on``, else 0."""
    codes = [r.exit_code(fail_on) for r in reports]
    if EXIT_UNREACHABLE in codes:
        return EXIT_UNREACHABLE
    return max(codes, default=EXIT_OK)


#: Set once a Nagios plugin report was written: its exit code is the plugin's state (2 is
#: CRITICAL there), not host-auditor's (2: usage error, made UNKNOWN for the plugin).
nagios_emitted = False


def emit(reports: Sequence[Report], options: AuditOptions, incomplete: str = "") -> int:
    """Render and write the reports (several hosts: and the fleet table); return the exit code.

    Several hosts are reported one machine once (:func:`auditor.fleet.one_per_machine`);
    the exit code counts every target. ``incomplete`` (the signal that stopped the run)
    marks the report as such: JSON's ``summary`` says ``incomplete`` and lists the hosts
    ``not_audited`` (each also an error entry), text opens with it.
    """
    from auditor.render import render_fleet_table, render_reports

    code = exit_code(reports, options.fail_on)
    if options.fmt == "nagios":
        from auditor.engines import nagios_state

        global nagios_emitted
        code = nagios_state(reports)
        nagios_emitted = True
    if len(reports) > 1:
        from auditor.fleet import one_per_machine

        reports, same = one_per_machine(reports)
        for line in same:
            note(f"note: {line}")

    colour = options.colour()
    if options.fmt == "html" and len(reports) > 1:
        # Several hosts: the fleet page audit merge -f html makes, from this run's reports.
        from auditor.fleet import view_of_reports
        from auditor.render import render_merge

        write_output(render_merge(view_of_reports(reports), "html"), options.output, reports)
        return code
    with handle_errors(options.debug):
        text = render_reports(reports, options.fmt, fail_on=options.fail_on, colour=colour,
                              incomplete=incomplete)
    if options.fmt == "text" and len(reports) > 1:
        text += "\n" + render_fleet_table(reports, colour=colour)
    write_output(text, options.output, reports)
    return code
