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
    HostKeyRejected,
    HostUnreachable,
    UsageError,
)
from auditor.hosts.archive import ArchiveHost
from auditor.hosts.base import Entry, Host, HostKind, ScriptResult
from auditor.hosts.collect import Collection, parse_output, remote_command

if TYPE_CHECKING:
    import fabric
    import paramiko

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
#: The most bytes one host's collection may send back.
MAX_OUTPUT = 256 << 20

_TARGET = re.compile(
    r"^(?:(?P<user>[^@\s/]+)@)?(?:\[(?P<v6>[0-9A-Fa-f:.%a-z]+)\]|(?P<host>[^:@\s/\[\]]+))"
    r"(?::(?P<port>\d{1,5}))?$"
)
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


def parse_target(text: str) -> SshTarget:
    """Parse ``[user@]host[:port]`` (``[v6addr]:port`` for IPv6), or raise a usage error."""
    spec = text.strip()
    if spec.startswith("ssh://"):
        spec = spec[len("ssh://"):].rstrip("/")
    match = _TARGET.match(spec)
    if match is None:
        if spec.count(":") >= 2 and "@" not in spec and "[" not in spec:
            return SshTarget(host=spec, label=text.strip())  # a bare IPv6 address
        raise UsageError(f"{text!r} is not a host: expected [user@]host[:port]")
    port = int(match["port"]) if match["port"] else None
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"{text!r}: port {port} is out of range")
    return SshTarget(host=match["v6"] or match["host"], user=match["user"], port=port,
                     label=text.strip())


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
        self._host_keys: dict[tuple[str, ...], paramiko.HostKeys] = {}

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

    def _keys(self, files: tuple[str, ...]) -> paramiko.HostKeys:
        import paramiko

        keys = self._host_keys.get(files)
        if keys is None:
            keys = paramiko.HostKeys()
            for path in files:
                if os.path.isfile(path):
                    try:
                        keys.load(path)
                    except (OSError, paramiko.SSHException, ValueError):
                        continue  # a malformed line elsewhere must not stop the audit
            self._host_keys[files] = keys
        return keys

    def known_keys(self, files: Sequence[str], name: str) -> list[tuple[str, paramiko.PKey]]:
        """Return the (key type, key) pairs the known_hosts ``files`` hold for ``name``."""
        with self._lock:
            found = self._keys(tuple(files)).lookup(name)
            if found is None:
                return []
            # keys() is in file order; a type's first key wins, as in paramiko.
            return [(keytype, found[keytype]) for keytype in dict.fromkeys(found.keys())]

    def remember(self, files: Sequence[str], name: str, key: paramiko.PKey) -> None:
        """Trust ``key`` for ``name`` in this run too (it was recorded in known_hosts)."""
        with self._lock:
            self._keys(tuple(files)).add(name, key.get_name(), key)


def _make_policy(record_to: str | None, context: SshContext | None = None,
                 files: Sequence[str] = ()) -> Any:
    """Return the paramiko policy for a key known_hosts does not hold."""
    import paramiko

    class RefuseUnknown(paramiko.MissingHostKeyPolicy):
        """Refuse a key known_hosts does not hold, with the fingerprint to check."""

        def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                             key: paramiko.PKey) -> None:
            raise HostKeyRejected(
                f"host key for {hostname} is not in known_hosts ({key.get_name()} "
                f"{key.fingerprint}); check it and add it, or pass --accept-new-host-keys"
            )

    class AcceptNew(paramiko.MissingHostKeyPolicy):
        """Trust a key on first use and append it to known_hosts (like accept-new)."""

        def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                             key: paramiko.PKey) -> None:
            assert record_to is not None
            line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
            with _known_hosts_lock:
                directory = os.path.dirname(record_to)
                if directory and not os.path.isdir(directory):
                    os.makedirs(directory, mode=0o700, exist_ok=True)
                with open(record_to, "a", encoding="ascii") as handle:
                    handle.write(line)
            client.get_host_keys().add(hostname, key.get_name(), key)
            if context is not None:
                context.remember(files, hostname, key)

    return AcceptNew() if record_to else RefuseUnknown()


def _check_host_keys(conn: fabric.Connection, options: SshOptions,
                     context: SshContext | None = None) -> None:
    """Make a connection, and every ProxyJump hop before it, verify host keys."""
    import fabric

    context = context or SshContext(options)
    hop: Any = conn
    while isinstance(hop, fabric.Connection):
        files = _known_hosts_files(options, dict(hop.ssh_config))
        # The name paramiko looks the server's key up by (OpenSSH's known_hosts form).
        port = int(hop.port)
        name = hop.host if port == 22 else f"[{hop.host}]:{port}"
        # Only this host's keys go into the client: paramiko checks the server's
        # key against them (a changed key is refused), and a missing one goes to
        # the policy below.
        known = hop.client.get_host_keys()
        for keytype, key in context.known_keys(files, name):
            known.add(name, keytype, key)
        # Trust on first use records the key in the first known_hosts file named
        # (--known-hosts, then UserKnownHostsFile, then ~/.ssh/known_hosts).
        record = files[0] if options.accept_new_host_keys else None
        # fabric trusts any new key (AutoAddPolicy), gateways included: replace it.
        hop.client.set_missing_host_key_policy(_make_policy(record, context, files))
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
        self._conn: fabric.Connection | None = None
        self._sock: socket.socket | None = None
        self._archive: ArchiveHost | None = None

    # -- connecting ----------------------------------------------------------------------

    def _connection(self) -> fabric.Connection:
        import fabric

        config = self.context.config()
        connect_kwargs: dict[str, Any] = {
            "transport_factory": _transport,
            "banner_timeout": self.options.timeout,
            "auth_timeout": self.options.timeout,
            "channel_timeout": self.options.timeout,
            **self.options.extra_connect_kwargs,
        }
        if self.options.identity:
            connect_kwargs["key_filename"] = [os.path.expanduser(self.options.identity)]
        timeout = max(1, round(self.options.timeout))
        return fabric.Connection(self.spec.host, user=self.user, port=self.port, config=config,
                                 connect_timeout=timeout, connect_kwargs=connect_kwargs)

    def connect(self) -> None:
        """Open the SSH connection, checking the host key; map failures to auditor errors."""
        import paramiko

        started = time.perf_counter()
        try:
            conn = self._connection()
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
                                                timeout=self.options.timeout)
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
        """Run the one collecting command and load its answer.

        The connection is then closed, unless ``keep_open`` (a fix runs on it next).
        """
        import paramiko

        if self._conn is None:
            raise HostUnreachable(f"{self.spec.display}: not connected")
        started = time.perf_counter()
        command = remote_command(patterns, sudo=self.options.sudo, compress=self.options.compress,
                                 root=self.root)
        try:
            transport = self._conn.client.get_transport()
            if transport is None or not transport.is_active():
                raise EOFError("the connection closed")
            channel = transport.open_session(timeout=self.options.timeout)
            channel.settimeout(self.options.timeout)
            channel.exec_command(command)
            output, status = _read_all(channel, self.options.timeout)
            stderr = b""
            while channel.recv_stderr_ready():
                stderr += channel.recv_stderr(65536)
        except AuditorError:
            self.close()
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise _map_error(exc, self.spec.display, self.options.timeout, "collect") from exc
        if not keep_open:
            self.close()
        if status != 0:
            detail = stderr.decode("utf-8", "replace").strip().splitlines()
            raise HostUnreachable(
                f"{self.spec.display}: the collecting command exited {status}"
                + (f": {detail[-1][:200]}" if detail else "")
            )
        collection = parse_output(output, self.spec.display)
        self.collection = collection
        self.privilege_note = collection.privilege_note
        self._archive = ArchiveHost(collection.tar, self.spec.display, name=None)
        self.forget()  # a second collection (the audit after a fix) starts afresh
        hostname = (self._archive.read_optional("/etc/hostname")
                    or self._archive.read_optional("/proc/sys/kernel/hostname"))
        self.name = _clean_name(hostname) or self.spec.display
        self.collect_s = time.perf_counter() - started

    def run_script(self, script: str, *, sudo: bool = False) -> ScriptResult:
        """Run a bash script on the connected host (script on stdin); return code and output.

        The script travels as data on stdin: nothing of it is put on a command line.
        """
        import paramiko

        if self._conn is None:
            raise HostUnreachable(f"{self.spec.display}: not connected")
        command = "sudo -n bash -s" if sudo and self.user != "root" else "bash -s"
        try:
            transport = self._conn.client.get_transport()
            if transport is None or not transport.is_active():
                raise EOFError("the connection closed")
            channel = transport.open_session(timeout=self.options.timeout)
            channel.set_combine_stderr(True)
            channel.exec_command(command)
            channel.sendall(script.encode())
            channel.shutdown_write()
            chunks: list[bytes] = []
            while True:
                data = channel.recv(65536)
                if not data:
                    break
                chunks.append(data)
            status = channel.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise _map_error(exc, self.spec.display, self.options.timeout, "run") from exc
        return ScriptResult(status, b"".join(chunks).decode("utf-8", "replace"))

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


def _clean_name(text: str | None) -> str:
    # A hostname from the host is untrusted: keep one printable token.
    if not text:
        return ""
    first = text.split()[0] if text.split() else ""
    return "".join(c for c in first if c.isprintable())[:253]


def _read_all(channel: paramiko.Channel, timeout: float) -> tuple[bytes, int]:
    """Read a command's whole stdout and its exit status; a dropped connection is EOFError."""
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = channel.recv(1 << 20)
        except TimeoutError as exc:
            raise TimeoutError(f"no answer within {timeout:g} s") from exc
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_OUTPUT:
            raise HostUnreachable(f"the collection exceeded {MAX_OUTPUT >> 20} MiB")
    if not channel.status_event.wait(timeout):
        raise TimeoutError(f"no exit status within {timeout:g} s")
    # A channel closed by a dying transport has its status event set with no status.
    if channel.exit_status == -1:
        raise EOFError("the connection dropped during the audit")
    return b"".join(chunks), channel.exit_status


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
