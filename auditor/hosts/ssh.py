"""A remote Linux host over SSH: one command collects every file the checks read.

:class:`SshHost` connects with fabric (so ``~/.ssh/config`` aliases, keys,
``ProxyJump`` and the agent work as fabric supports them), runs the single
command built by :func:`auditor.hosts.collect.remote_command` on a fresh channel, and
serves every read from the tar it gets back. Nothing is installed on the host
and nothing it sends reaches a local shell.

Host keys are checked against ``known_hosts`` (the user's file, the system file
and the ssh config's ``UserKnownHostsFile``); an unknown key is refused unless
trust on first use is asked for, and a changed key is always refused.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from auditor.errors import (
    AuditorError,
    AuthenticationFailed,
    CollectError,
    HostKeyRejected,
    HostUnreachable,
    UsageError,
)
from auditor.hosts.archive import ArchiveHost
from auditor.hosts.base import Entry, Host, HostKind, ScriptResult, clean_host_name, printable
from auditor.hosts.collect import Collection, parse_output, remote_command
from auditor.hosts.known_hosts import KnownHosts, to_pkey
from auditor.shipped.collector_script import denied

if TYPE_CHECKING:
    import fabric
    import paramiko

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
#: The most bytes one host's collection may send back, and may expand to (a real
#: collection is 20 KB to a few MB).
MAX_OUTPUT = 64 << 20
#: The memory the collections of one run may hold at once, over every host in flight
#: (raw answers, what they expand to, and their index); a host waits for room, within
#: its deadline. Spread over worker processes, each has its share.
FLEET_MEMORY = 1 << 30
#: Index memory counted per archive member (dict entries, the Entry, the name).
MEMBER_COST = 512
#: The most bytes of a command's stderr kept (its last line names what went wrong).
MAX_STDERR = 64 << 10
#: How long ``--apply`` may take on a remote host: upload, run and output of the fix.
APPLY_LIMIT_S = 600.0
#: The most bytes of a fix script's output kept (its end, where the summary is).
MAX_SCRIPT_OUTPUT = 1 << 20

_TARGET = re.compile(
    r"^(?:(?P<user>[^@\s/]+)@)?(?:\[(?P<v6>[0-9A-Fa-f:.%a-z]+)\]|(?P<host>[^:@\s/\[\]]+))"
    r"(?::(?P<port>\d{1,5}))?$"
)
#: What OpenSSH refuses in a host or user name given to it, before it reads any ssh config
#: (misc.c ``valid_hostname`` and ``valid_ruser``, since 9.6: CVE-2023-51385): the name is
#: expanded into ``%h`` / ``%r`` of ``Match exec`` and ``ProxyCommand``, which a shell runs.
#: paramiko evaluates ``Match exec`` the same way (through invoke, in a shell), so a name
#: from an inventory such as ``gpu01$(cmd)`` would run ``cmd`` here.
_HOST_UNSAFE = frozenset("'`\"$\\;&<>|(){},")
_USER_UNSAFE = frozenset("'`\";&<>|(){}")
_known_hosts_lock = threading.Lock()
# paramiko logs transport failures itself; with no handler they would reach stderr
# through logging's last resort, beside the one line the CLI prints per host.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


@dataclass(frozen=True)
class SshTarget:
    """One host to audit: an address or ssh config alias, with optional user and port."""

    host: str
    user: str | None = None
    port: int | None = None
    #: What the user wrote (an inventory name, or ``user@host:port``).
    label: str = ""

    @property
    def display(self) -> str:
        """Return the name used for this target before its hostname is known."""
        return self.label or self.host


def host_name_problem(name: str) -> str:
    """Return why OpenSSH would refuse ``name`` as a host name, or "" where it would not.

    As ``valid_hostname`` (OpenSSH misc.c): no leading ``-`` (an option to a command it
    reaches), no shell metacharacter, whitespace or control character; here also no other
    character that is not printable (bidi overrides, zero-width and other format characters).
    """
    if not name:
        return "it is empty"
    if name.startswith("-"):
        return "it starts with '-'"
    for char in name:
        if char in _HOST_UNSAFE:
            return f"it holds {char!r}"
        if char.isspace() or not char.isprintable():
            return f"it holds the character U+{ord(char):04X}"
    return ""


def user_name_problem(user: str) -> str:
    """Return why OpenSSH would refuse ``user`` as a remote user name, or "" where it would not.

    As ``valid_ruser`` (OpenSSH misc.c): no leading ``-``, no shell metacharacter or control
    character, no ``-`` after whitespace, no ``\\`` at the end; here also no whitespace or
    other character that is not printable.
    """
    if not user:
        return "it is empty"
    if user.startswith("-"):
        return "it starts with '-'"
    if user.endswith("\\"):
        return "it ends with '\\'"
    for char in user:
        if char in _USER_UNSAFE:
            return f"it holds {char!r}"
        if char.isspace() or not char.isprintable():
            return f"it holds the character U+{ord(char):04X}"
    return ""


def check_names(host: str, user: str | None, label: str) -> None:
    """Raise a usage error where OpenSSH would refuse the host or user name (CVE-2023-51385).

    Called before any ssh config is evaluated: its ``Match exec`` would run the name in a
    shell.
    """
    problem = host_name_problem(host)
    if problem:
        raise UsageError(f"{printable(label)!r}: refused as a host name ({problem}; OpenSSH "
                         "refuses such names too)")
    if user is not None:
        problem = user_name_problem(user)
        if problem:
            raise UsageError(f"{printable(label)!r}: refused as a user name ({problem}; "
                             "OpenSSH refuses such names too)")


def parse_target(text: str) -> SshTarget:
    """Parse ``[user@]host[:port]`` (``[v6addr]:port`` for IPv6), or raise a usage error.

    The host and user names are held to OpenSSH's rules (:func:`check_names`).
    """
    spec = text.strip()
    if spec.startswith("ssh://"):
        spec = spec[len("ssh://"):].rstrip("/")
    match = _TARGET.match(spec)
    if match is None:
        if spec.count(":") >= 2 and "@" not in spec and "[" not in spec:
            check_names(spec, None, text.strip())
            return SshTarget(host=spec, label=text.strip())  # a bare IPv6 address
        check_names(spec.rpartition("@")[2], spec.rpartition("@")[0] or None, text.strip())
        raise UsageError(f"{printable(text)!r} is not a host: expected [user@]host[:port]")
    port = int(match["port"]) if match["port"] else None
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"{printable(text)!r}: port {port} is out of range")
    host = match["v6"] or match["host"]
    check_names(host, match["user"], text.strip())
    return SshTarget(host=host, user=match["user"], port=port, label=text.strip())


@dataclass(frozen=True)
class SshOptions:
    """How to reach hosts: credentials, privilege, time limits and host-key trust."""

    user: str | None = None
    port: int | None = None
    identity: str | None = None
    sudo: bool = False
    timeout: float = 10.0
    accept_new_host_keys: bool = False
    #: Extra known_hosts files to trust (read), before the user's own.
    known_hosts: tuple[str, ...] = ()
    #: An ssh config file to use instead of ~/.ssh/config and /etc/ssh/ssh_config.
    ssh_config: str | None = None
    #: A sysroot directory on the host (an image being prepared) to audit instead of the host.
    root: str | None = None
    compress: bool = False
    extra_connect_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.user is not None:
            problem = user_name_problem(self.user)
            if problem:
                raise UsageError(f"--user {printable(self.user)!r}: refused as a user name "
                                 f"({problem}; OpenSSH refuses such names too)")


def _known_hosts_files(options: SshOptions, ssh_config: dict[str, Any]) -> list[str]:
    files = list(options.known_hosts)
    configured = ssh_config.get("userknownhostsfile")
    if configured:
        files.extend(str(configured).split())
    files.append(DEFAULT_KNOWN_HOSTS)
    files.append(SYSTEM_KNOWN_HOSTS)
    seen: dict[str, None] = {}
    for path in files:
        seen.setdefault(os.path.expanduser(path), None)
    return list(seen)


class MemoryBudget:
    """Bytes the hosts of one run may hold at once; a host waits for room until its deadline."""

    def __init__(self, total: int = FLEET_MEMORY) -> None:
        self.total = max(1, total)
        self.used = 0
        self._cond = threading.Condition()

    def acquire(self, size: int, deadline: float, label: str) -> None:
        """Take ``size`` bytes, waiting (until ``deadline``) while other hosts hold too much."""
        if size > self.total:
            raise HostUnreachable(f"{label}: the collection needs more than the run's memory "
                                  f"budget ({self.total >> 20} MiB)")
        with self._cond:
            while self.used + size > self.total:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HostUnreachable(f"{label}: timed out waiting for memory held by other "
                                          "hosts' collections")
                self._cond.wait(min(left, 1.0))
            self.used += size

    def release(self, size: int) -> None:
        """Give back bytes taken with :meth:`acquire`."""
        if size <= 0:
            return
        with self._cond:
            self.used = max(0, self.used - size)
            self._cond.notify_all()


class SshContext:
    """What the connections of one run share: the fabric config and the known_hosts keys.

    An audit of many hosts would otherwise build a fabric config (reading the ssh
    config files) and parse every known_hosts file once per host: CPU that grows
    with the fleet times the size of known_hosts. Both are read once here, on
    first use, and only read afterwards (so threads share them safely); a key
    trusted on first use is added to the shared keys too.
    """

    def __init__(self, options: SshOptions) -> None:
        self.options = options
        self._lock = threading.Lock()
        self._config: fabric.Config | None = None
        self._host_keys: dict[tuple[str, ...], KnownHosts] = {}
        #: Memory the collections of this run may hold at once.
        self.budget = MemoryBudget()

    def config(self) -> fabric.Config:
        """Return a fabric config of one connection's own.

        The ssh config and fabric's own config files are read once per run, into a base
        config no connection ever holds: ``fabric.Connection`` writes to the config it is
        given (setting ``inline_ssh_env`` merges the whole config again, emptying it
        meanwhile), so a config shared by threads makes a healthy host fail with
        "No attribute or config key found". Each connection gets a fresh config with the
        base's values for what it reads, and the parsed ssh config (only looked up).
        """
        import fabric

        with self._lock:
            if self._config is None:
                config = fabric.Config(overrides={"load_ssh_configs": True},
                                       runtime_ssh_path=self.options.ssh_config)
                if self.options.ssh_config is not None:
                    config.set_runtime_ssh_path(self.options.ssh_config)
                    config.load_ssh_config()
                self._config = config
            base = self._config
            # lazy: no file is read again; about 0.2 ms where a clone() takes 2.5 ms.
            return fabric.Config(lazy=True, ssh_config=base.base_ssh_config, overrides={
                "load_ssh_configs": True,
                "user": base.user,
                "port": base.port,
                "forward_agent": base.forward_agent,
                "gateway": base.gateway,
                "timeouts": dict(base.timeouts),
                "connect_kwargs": copy.deepcopy(dict(base.connect_kwargs)),
            })

    def _keys(self, files: tuple[str, ...]) -> KnownHosts:
        keys = self._host_keys.get(files)
        if keys is None:
            keys = KnownHosts()
            for path in files:
                keys.load(path)  # line by line: one odd line never costs the file
            self._host_keys[files] = keys
        return keys

    def known_keys(self, files: Sequence[str], name: str) -> list[tuple[str, paramiko.PKey]]:
        """Return the (key type, key) pairs the known_hosts ``files`` trust for ``name``.

        A key listed ``@revoked`` is never among them.
        """
        with self._lock:
            found = self._keys(tuple(files)).lookup(name)
        pairs: dict[str, paramiko.PKey] = {}
        for known in found:
            key = to_pkey(known)
            # keys are in file order; a type's first key wins, as in OpenSSH.
            if key is not None and key.get_name() not in pairs:
                pairs[key.get_name()] = key
        return list(pairs.items())

    def revoked(self, files: Sequence[str], key: paramiko.PKey) -> bool:
        """Return whether the known_hosts ``files`` list ``key`` as ``@revoked``."""
        with self._lock:
            return self._keys(tuple(files)).is_revoked(key)

    def remember(self, files: Sequence[str], name: str, key: paramiko.PKey) -> None:
        """Trust ``key`` for ``name`` in this run too (it was recorded in known_hosts)."""
        with self._lock:
            self._keys(tuple(files)).add_line(f"{name} {key.get_name()} {key.get_base64()}")


def _make_policy(record_to: str | None, context: SshContext | None = None,
                 files: Sequence[str] = (), alias: str | None = None) -> Any:
    """Return the paramiko policy for a key known_hosts does not hold.

    ``alias``: the ssh config's ``HostKeyAlias``, under which a new key is recorded.
    """
    import paramiko

    def refuse_revoked(hostname: str, key: paramiko.PKey) -> None:
        if context is not None and context.revoked(files, key):
            raise HostKeyRejected(f"host key for {alias or hostname} is REVOKED in known_hosts "
                                  f"({key.get_name()} {key.fingerprint}): refused")

    class RefuseUnknown(paramiko.MissingHostKeyPolicy):
        """Refuse a key known_hosts does not hold, with the fingerprint to check."""

        def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                             key: paramiko.PKey) -> None:
            refuse_revoked(hostname, key)
            raise HostKeyRejected(
                f"host key for {alias or hostname} is not in known_hosts ({key.get_name()} "
                f"{key.fingerprint}); check it and add it, or pass --accept-new-host-keys"
            )

    class AcceptNew(paramiko.MissingHostKeyPolicy):
        """Trust a key on first use and append it to known_hosts (like accept-new)."""

        def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                             key: paramiko.PKey) -> None:
            assert record_to is not None
            refuse_revoked(hostname, key)
            name = alias or hostname
            line = f"{name} {key.get_name()} {key.get_base64()}\n"
            with _known_hosts_lock:
                directory = os.path.dirname(record_to)
                if directory and not os.path.isdir(directory):
                    os.makedirs(directory, mode=0o700, exist_ok=True)
                with open(record_to, "a", encoding="ascii") as handle:
                    handle.write(line)
            client.get_host_keys().add(hostname, key.get_name(), key)
            if context is not None:
                context.remember(files, name, key)

    return AcceptNew() if record_to else RefuseUnknown()


def _check_host_keys(conn: fabric.Connection, options: SshOptions,
                     context: SshContext | None = None) -> None:
    """Make a connection, and every ProxyJump hop before it, verify host keys."""
    import fabric

    context = context or SshContext(options)
    hop: Any = conn
    while isinstance(hop, fabric.Connection):
        ssh_config = dict(hop.ssh_config)
        files = _known_hosts_files(options, ssh_config)
        # The name paramiko looks the server's key up by (OpenSSH's known_hosts form).
        port = int(hop.port)
        name = hop.host if port == 22 else f"[{hop.host}]:{port}"
        # HostKeyAlias: keys are looked up, and recorded, under the alias instead.
        alias = str(ssh_config.get("hostkeyalias") or "") or None
        # Only this host's keys go into the client: paramiko checks the server's
        # key against them (a changed key is refused), and a missing or revoked one
        # goes to the policy below.
        known = hop.client.get_host_keys()
        for keytype, key in context.known_keys(files, alias or name):
            known.add(name, keytype, key)
        # Trust on first use records the key in the first known_hosts file named
        # (--known-hosts, then UserKnownHostsFile, then ~/.ssh/known_hosts).
        record = files[0] if options.accept_new_host_keys else None
        # fabric trusts any new key (AutoAddPolicy), gateways included: replace it.
        hop.client.set_missing_host_key_policy(_make_policy(record, context, files, alias))
        hop = hop.gateway


#: Ciphers tried first: AES-GCM decrypts and authenticates in one call into OpenSSL,
#: where paramiko's default first choice (AES-CTR) adds an HMAC computed per
#: packet. Both are in OpenSSH's defaults; the rest of paramiko's order follows.
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _transport(sock: Any, **kwargs: Any) -> paramiko.Transport:
    """Return a paramiko transport that offers AES-GCM first (paramiko's ``transport_factory``)."""
    import paramiko

    transport = paramiko.Transport(sock, **kwargs)
    options = transport.get_security_options()
    offered = tuple(options.ciphers)
    first = tuple(c for c in PREFERRED_CIPHERS if c in offered)
    options.ciphers = first + tuple(c for c in offered if c not in first)
    return transport


class QuickAckSocket:
    """A socket that acknowledges every segment at once (Linux ``TCP_QUICKACK``).

    sshd leaves Nagle on for sessions without a terminal, so when it answers with
    two small packets in a row the second waits for our ACK, which Linux delays
    by up to 40 ms. QUICKACK is not sticky, so it is set again before each read.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._quickack = getattr(socket, "TCP_QUICKACK", None)

    def recv(self, size: int) -> bytes:
        """Read from the socket, acknowledging what arrives without delay."""
        if self._quickack is not None:
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, self._quickack, 1)
            except OSError:
                self._quickack = None
        return self._sock.recv(size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def sysroot_path(root: str | None) -> str | None:
    """Return a remote sysroot path normalised (None for the host's own ``/``)."""
    if root is None:
        return None
    if not root.startswith("/") or "\x00" in root:
        raise UsageError(f"--root {root!r}: a sysroot on a remote host must be an absolute path")
    path = "/" + "/".join(p for p in root.split("/") if p and p != ".")
    if ".." in path.split("/"):
        raise UsageError(f"--root {root!r}: '..' is not allowed in a remote sysroot path")
    return None if path == "/" else path


class SshHost(Host):
    """A remote host read over SSH: collected in one command, then read from memory."""

    kind: HostKind = "ssh"

    def __init__(self, target: SshTarget, options: SshOptions | None = None,
                 context: SshContext | None = None) -> None:
        self.spec = target
        self.options = options or SshOptions()
        #: Shared by the hosts of one run (config and known_hosts read once); one's own if None.
        self.context = context or SshContext(self.options)
        self.user = target.user or self.options.user
        self.port = target.port or self.options.port
        # However the target was made, no name OpenSSH refuses reaches the ssh config.
        check_names(target.host, self.user, target.display)
        self.name = target.display
        #: The sysroot directory audited on the host, or None for the host itself.
        self.root = sysroot_path(self.options.root)
        if self.root is not None:
            self.kind = "sysroot"
        self.target = f"ssh://{target.host}"
        #: Why root-only files may be missing ("" when the collector ran as root).
        self.privilege_note = ""
        self.collection: Collection | None = None
        #: Seconds spent connecting (TCP, key exchange, authentication) and collecting.
        self.connect_s = 0.0
        self.collect_s = 0.0
        #: When this audit of the host must be over (``time.monotonic()``): connecting,
        #: collecting, reading the answer and the checks share ``--timeout``.
        self.deadline: float | None = None
        self._conn: fabric.Connection | None = None
        self._sock: socket.socket | None = None
        self._archive: ArchiveHost | None = None
        self._watchdog: threading.Timer | None = None
        self._expired = False
        #: Bytes of the run's memory budget this host holds.
        self._reserved = 0

    # -- the deadline ----------------------------------------------------------------------

    def start_clock(self) -> float:
        """Start this host's deadline (if not running) and the watchdog that enforces it."""
        if self.deadline is None:
            self.deadline = time.monotonic() + self.options.timeout
            self._expired = False
        if self._watchdog is None:
            # Whatever paramiko waits on (a banner trickled a byte at a time, a key
            # exchange, a channel), closing the connection at the deadline ends it.
            watchdog = threading.Timer(max(0.0, self.deadline - time.monotonic()), self._expire)
            watchdog.daemon = True
            watchdog.start()
            self._watchdog = watchdog
        return self.deadline

    def _expire(self) -> None:
        self._expired = True
        self._drop_connection()

    def remaining(self) -> float:
        """Return the seconds left before the deadline (raise when it has passed)."""
        deadline = self.start_clock()
        left = deadline - time.monotonic()
        if left <= 0 or self._expired:
            raise self._timed_out()
        return left

    def _timed_out(self) -> HostUnreachable:
        return HostUnreachable(f"{self.spec.display}: timed out after {self.options.timeout:g} s "
                               "(connecting, collecting and checking share --timeout)")

    def stop_clock(self) -> None:
        """Stop the watchdog; the next audit of this host gets a deadline of its own."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
        self.deadline = None

    # -- connecting ----------------------------------------------------------------------

    def _connection(self, left: float) -> fabric.Connection:
        import fabric

        config = self.context.config()
        # paramiko's own timers run a little past the deadline: the watchdog ends the
        # connection at the deadline, so that a timeout always says so.
        left += 1.0
        connect_kwargs: dict[str, Any] = {
            "transport_factory": _transport,
            "banner_timeout": left,
            "auth_timeout": left,
            "channel_timeout": left,
            **self.options.extra_connect_kwargs,
        }
        if self.options.identity:
            connect_kwargs["key_filename"] = [os.path.expanduser(self.options.identity)]
        timeout = max(1, round(left))
        return fabric.Connection(self.spec.host, user=self.user, port=self.port, config=config,
                                 connect_timeout=timeout, connect_kwargs=connect_kwargs)

    def connect(self) -> None:
        """Open the SSH connection, checking the host key; map failures to auditor errors."""
        import paramiko

        started = time.perf_counter()
        left = self.remaining()
        try:
            conn = self._connection(left)
        except (ValueError, OSError, paramiko.SSHException) as exc:
            raise UsageError(f"{self.spec.display}: bad ssh configuration ({exc})") from exc
        self._conn = conn
        user = conn.user
        self.target = f"ssh://{user}@{self.spec.host}:{conn.port}" + (
            f":{self.root}" if self.root else "")
        _check_host_keys(conn, self.options, self.context)
        try:
            if not conn.gateway:
                # A socket of our own, so TCP_NODELAY is on from the first packet:
                # with Nagle and delayed ACKs every request would wait ~40 ms.
                sock = socket.create_connection((conn.host, int(conn.port)),
                                                timeout=self.remaining())
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._sock = sock
                conn.connect_kwargs["sock"] = QuickAckSocket(sock)
            conn.open()
        except AuditorError:
            self.close()
            raise
        except Exception as exc:
            self.close()
            elapsed = time.perf_counter() - started
            if self._expired or (self.deadline is not None
                                 and time.monotonic() >= self.deadline - 0.05):
                raise self._timed_out() from exc
            if isinstance(exc, paramiko.SSHException) and elapsed >= self.options.timeout * 0.9:
                # A server that accepts and then says nothing surfaces as "No existing
                # session" or a banner error once paramiko's timers run out.
                raise HostUnreachable(
                    f"{self.spec.display}: connection timed out after "
                    f"{self.options.timeout:g} s (no answer from the SSH server)"
                ) from exc
            raise _map_error(exc, self.spec.display, self.options.timeout, "connect") from exc
        transport = conn.client.get_transport()
        if transport is not None and conn.gateway:
            try:
                transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except (OSError, AttributeError):
                pass  # a ProxyCommand pipe or a gateway channel is not a TCP socket
        self.connect_s = time.perf_counter() - started

    def collect(self, patterns: list[str], *, keep_open: bool = False) -> None:
        """Run the one collecting command and load its answer, within the host's deadline.

        The connection is then closed, unless ``keep_open`` (a fix runs on it next).
        """
        import paramiko

        if self._conn is None:
            raise HostUnreachable(f"{self.spec.display}: not connected")
        started = time.perf_counter()
        label = self.spec.display
        command = remote_command(patterns, sudo=self.options.sudo, compress=self.options.compress,
                                 root=self.root)
        self.release_memory()  # a second collection (the re-audit of a fix) replaces the first
        try:
            transport = self._conn.client.get_transport()
            if transport is None or not transport.is_active():
                raise EOFError("the connection closed")
            channel = transport.open_session(timeout=self.remaining())
            channel.exec_command(command)
            output, status, stderr = self._read_all(channel)
        except AuditorError:
            self.close()
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            if self._expired:
                raise self._timed_out() from exc
            raise _map_error(exc, label, self.options.timeout, "collect") from exc
        if not keep_open:
            self.close()
        if status != 0:
            detail = stderr.decode("utf-8", "replace").strip().splitlines()
            raise HostUnreachable(
                f"{label}: the collecting command exited {status}"
                + (f": {printable(detail[-1][:200])}" if detail else "")
            )
        deadline = self.start_clock()
        collection = parse_output(output, label, cap=MAX_OUTPUT, deadline=deadline)
        del output
        # gzip only when it was asked for: an answer compressed unasked is refused.
        # What the collector never collects is not read from an answer that holds it.
        archive = ArchiveHost(collection.tar, label, name=None,
                              allowed={"gzip"} if self.options.compress else {"none"},
                              cap=MAX_OUTPUT, deadline=deadline, error=CollectError,
                              skip=denied)
        if collection.method == "sh" or self.options.compress:
            self._hold(archive.size, deadline)  # what the answer expanded to
        self._hold(archive.entry_count * MEMBER_COST, deadline)
        self.collection = collection
        self.privilege_note = collection.privilege_note
        self._archive = archive
        self.forget()  # a second collection (the audit after a fix) starts afresh
        hostname = (archive.read_optional("/etc/hostname")
                    or archive.read_optional("/proc/sys/kernel/hostname"))
        self.name = clean_host_name(hostname) or self.spec.display
        self.collect_s = time.perf_counter() - started
        if time.monotonic() > deadline:
            raise self._timed_out()

    def _hold(self, size: int, deadline: float) -> None:
        self.context.budget.acquire(size, deadline, self.spec.display)
        self._reserved += size

    def release_memory(self) -> None:
        """Give this host's share of the run's memory budget back (its collection is done with)."""
        reserved, self._reserved = self._reserved, 0
        self.context.budget.release(reserved)

    def _read_all(self, channel: paramiko.Channel) -> tuple[bytes, int, bytes]:
        """Read a command's stdout (at most MAX_OUTPUT bytes, counted against the run's memory
        budget), the end of its stderr and its exit status, all before the deadline."""
        label = self.spec.display
        deadline = self.start_clock()
        chunks: list[bytes] = []
        size = 0
        stderr = bytearray()
        while True:
            # Short waits: the deadline is checked, and stderr drained, between them.
            channel.settimeout(max(0.05, min(self.remaining(), 1.0)))
            try:
                chunk: bytes | None = channel.recv(1 << 20)
            except TimeoutError:
                chunk = None
            while channel.recv_stderr_ready():
                stderr += channel.recv_stderr(65536)
                del stderr[:-MAX_STDERR]
            if chunk is None:
                continue
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_OUTPUT:
                raise HostUnreachable(f"{label}: the collection exceeded {MAX_OUTPUT >> 20} MiB")
            self._hold(len(chunk), deadline)
            chunks.append(chunk)
        if not channel.status_event.wait(self.remaining()):
            raise self._timed_out()
        # A channel closed by a dying transport has its status event set with no status.
        if channel.exit_status == -1:
            raise EOFError("the connection dropped during the audit")
        while channel.recv_stderr_ready():
            stderr += channel.recv_stderr(65536)
            del stderr[:-MAX_STDERR]
        return b"".join(chunks), channel.exit_status, bytes(stderr)

    def run_script(self, script: str, *, sudo: bool = False,
                   timeout: float = APPLY_LIMIT_S) -> ScriptResult:
        """Run a bash script on the connected host (script on stdin); return code and output.

        The script travels as data on stdin: nothing of it is put on a command line. It has
        ``timeout`` seconds (``--apply``'s own limit) to be sent, run and answer; then the
        channel is closed and the result is exit status 124.
        """
        import paramiko

        if self._conn is None:
            raise HostUnreachable(f"{self.spec.display}: not connected")
        self.stop_clock()  # the fix has its own limit; the re-audit gets a new deadline
        deadline = time.monotonic() + timeout
        command = "sudo -n bash -s" if sudo and self.user != "root" else "bash -s"
        kept = bytearray()
        channel: paramiko.Channel | None = None
        try:
            transport = self._conn.client.get_transport()
            if transport is None or not transport.is_active():
                raise EOFError("the connection closed")
            channel = transport.open_session(timeout=min(timeout, self.options.timeout))
            channel.set_combine_stderr(True)
            channel.settimeout(timeout)
            channel.exec_command(command)
            try:
                channel.sendall(script.encode())
                channel.shutdown_write()
            except OSError:
                # The command ended before it read its script (a shell that could not
                # start): the channel is closed under the sender. What it said and its
                # exit status tell why; a connection that broke has neither.
                if not channel.exit_status_ready():
                    raise
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                channel.settimeout(min(left, 1.0))
                try:
                    data = channel.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                kept += data
                del kept[:-MAX_SCRIPT_OUTPUT]
            if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError
            status = channel.recv_exit_status()
        except TimeoutError:
            if channel is not None:
                with contextlib.suppress(Exception):
                    channel.close()
            return ScriptResult(124, kept.decode("utf-8", "replace")
                                + f"host-auditor: error: stopped waiting for the fix after "
                                  f"{timeout:g} s\n")
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise _map_error(exc, self.spec.display, self.options.timeout, "run") from exc
        return ScriptResult(status, kept.decode("utf-8", "replace"))

    @classmethod
    def open(cls, target: SshTarget, options: SshOptions, patterns: list[str],
             context: SshContext | None = None) -> SshHost:
        """Connect to a host and collect ``patterns`` from it."""
        host = cls(target, options, context)
        host.connect()
        host.collect(patterns)
        return host

    def close(self) -> None:
        """Close the SSH connection, even one still being set up (reads keep working)."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
        self._drop_connection()

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        sock, self._sock = self._sock, None
        if sock is not None:
            # Closing our socket wakes a thread still waiting for the banner or a key
            # exchange; fabric's close() only acts on a connection already open.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.client.close()
            with contextlib.suppress(Exception):
                conn.close()

    # -- the host seam, served from the collection -----------------------------------------

    def _loaded(self) -> ArchiveHost:
        if self._archive is None:
            raise OSError(f"{self.spec.display}: nothing collected yet")
        return self._archive

    def lstat(self, path: str) -> Entry | None:
        return self._loaded().lstat(path)

    def _read_resolved(self, path: str, limit: int) -> bytes:
        return self._loaded()._read_resolved(path, limit)

    def _listdir_resolved(self, path: str) -> list[str]:
        return self._loaded()._listdir_resolved(path)

    def processes(self) -> frozenset[str] | None:
        """Return process names from collected ``/proc/<pid>/comm``, or None if none were."""
        archive = self._loaded()
        names: set[str] = set()
        try:
            pids = [p for p in archive.listdir("/proc") if p.isdigit()]
        except OSError:
            return None
        for pid in pids:
            name = archive.read_optional(f"/proc/{pid}/comm")
            if name:
                names.add(name)
        return frozenset(names) if names else None


def _map_error(exc: BaseException, label: str, timeout: float, stage: str) -> AuditorError:
    """Turn a paramiko or socket failure into the auditor's error for it."""
    import paramiko

    if isinstance(exc, paramiko.BadHostKeyException):
        return HostKeyRejected(
            f"{label}: host key has CHANGED ({exc.key.get_name()} {exc.key.fingerprint}, "
            f"known_hosts holds {exc.expected_key.fingerprint}): refused"
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return AuthenticationFailed(f"{label}: authentication refused ({exc})")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        what = "connection" if stage == "connect" else "the audit command"
        return HostUnreachable(f"{label}: {what} timed out after {timeout:g} s")
    if isinstance(exc, socket.gaierror):
        return HostUnreachable(f"{label}: cannot resolve the host name ({exc.strerror})")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return HostUnreachable(f"{label}: connection refused")
    if isinstance(exc, ConnectionRefusedError):
        return HostUnreachable(f"{label}: connection refused")
    if isinstance(exc, (EOFError, ConnectionResetError, BrokenPipeError)):
        return HostUnreachable(f"{label}: the connection dropped during the audit")
    if isinstance(exc, OSError) and exc.strerror:
        return HostUnreachable(f"{label}: {exc.strerror.lower()}")
    if isinstance(exc, paramiko.SSHException):
        message = str(exc) or type(exc).__name__
        if "timeout" in message.lower() or "timed out" in message.lower():
            return HostUnreachable(f"{label}: {stage} timed out after {timeout:g} s ({message})")
        return HostUnreachable(f"{label}: ssh failed ({message})")
    return HostUnreachable(f"{label}: {type(exc).__name__}: {exc}")
