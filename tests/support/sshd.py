"""Real OpenSSH servers for the SSH tests and benchmarks: on loopback or in a network namespace.

Everything lives in a temporary directory: fresh host keys, a client key, an
sshd_config with ``StrictModes no`` and ``UsePAM no``. Test users are made with
``useradd`` (root only) and removed again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def free_port(address: str = "127.0.0.1") -> int:
    """Return a TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def keygen(path: Path, kind: str = "ed25519") -> Path:
    """Make a key pair without a passphrase; return the private key's path."""
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL)
    return path


def wait_for_port(address: str, port: int, timeout: float = 10.0,
                  netns: str | None = None) -> None:
    """Wait until something accepts TCP connections on address:port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"sshd did not start on {address}:{port}")


@dataclass
class Sshd:
    """One running sshd."""

    workdir: Path
    address: str
    port: int
    host_key: Path
    process: subprocess.Popen[bytes] | None = None
    netns: str | None = None
    extra: list[str] = field(default_factory=list)

    @property
    def known_hosts_line(self) -> str:
        public = (self.host_key.with_suffix(".pub")).read_text().split()
        name = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{name} {public[0]} {public[1]}\n"

    @property
    def target(self) -> str:
        return f"{self.address}:{self.port}"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def machine_command(workdir: Path, hostname: str, machine_id: str,
                    command: list[str]) -> list[str]:
    """Return ``command`` run as another machine: in new mount and UTS namespaces where
    ``/etc/hostname`` and ``/etc/machine-id`` are bind-mounted from ``workdir`` and the
    kernel's hostname is ``hostname`` (unshare(1); the namespaces end with the process)."""
    import shlex

    (workdir / "hostname").write_text(hostname + "\n")
    (workdir / "machine-id").write_text(machine_id + "\n")
    for name in ("hostname", "machine-id"):
        os.chmod(workdir / name, 0o644)
    script = (f"mount --bind {shlex.quote(str(workdir / 'hostname'))} /etc/hostname && "
              f"mount --bind {shlex.quote(str(workdir / 'machine-id'))} /etc/machine-id && "
              f"hostname {shlex.quote(hostname)} && exec \"$@\"")
    return ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", script,
            "sh", *command]


@dataclass
class SshLab:
    """A directory of keys and configs from which sshd instances are started."""

    root: Path
    client_key: Path = field(init=False)
    host_key: Path = field(init=False)
    keys_dir: Path = field(init=False)
    servers: list[Sshd] = field(default_factory=list)
    users: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        self.keys_dir = self.root / "authorized"
        self.keys_dir.mkdir(exist_ok=True)
        os.chmod(self.keys_dir, 0o755)
        self.client_key = keygen(self.root / "client_key")
        self.host_key = keygen(self.root / "ssh_host_ed25519_key")
        self.authorize("root")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)

    def authorize(self, user: str) -> None:
        target = self.keys_dir / f"{user}.keys"
        target.write_text(self.client_key.with_suffix(".pub").read_text())
        os.chmod(target, 0o644)

    def add_user(self, user: str, sudo: bool = False) -> str:
        """Create a local user who may log in with the client key (root only)."""
        home = self.root / "home" / user
        home.mkdir(parents=True, exist_ok=True)
        subprocess.run(["userdel", "-f", user], capture_output=True)
        subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/bin/sh", user], check=True)
        # "*" is no password, not a locked account: sshd without PAM refuses locked ones.
        subprocess.run(["usermod", "-p", "*", user], check=True)
        shutil.chown(home, user)
        self.users.append(user)
        self.authorize(user)
        if sudo:
            drop_in = Path(f"/etc/sudoers.d/host-auditor-test-{user}")
            drop_in.write_text(f"{user} ALL=(ALL) NOPASSWD: ALL\n")
            os.chmod(drop_in, 0o440)
        return user

    def start(self, address: str = "127.0.0.1", port: int | None = None,
              extra: list[str] | None = None, netns: str | None = None,
              host_key: Path | None = None, machine: tuple[str, str] | None = None) -> Sshd:
        """Start one sshd listening on address:port (a free port when none is given).

        ``machine`` (hostname, machine-id; root only) makes it another machine: sshd runs
        in mount and UTS namespaces of its own, where ``/etc/hostname``,
        ``/etc/machine-id`` and the kernel's hostname are that machine's, for everything
        it starts (the audit's collector too).
        """
        port = port or free_port(address if netns is None else "127.0.0.1")
        index = len(self.servers)
        workdir = self.root / f"sshd{index}"
        workdir.mkdir(exist_ok=True)
        key = host_key or self.host_key
        lines = [
            f"Port {port}",
            f"ListenAddress {address}",
            f"HostKey {key}",
            f"PidFile {workdir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.keys_dir}/%u.keys",
            "StrictModes no",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "LogLevel ERROR",
            "MaxStartups 300:30:400",
            "MaxSessions 64",
            "UseDNS no",
        ]
        matches = [line for line in (extra or []) if line.startswith(("Match", " ", "\t"))]
        lines += [line for line in (extra or []) if line not in matches]
        lines += matches
        config = workdir / "sshd_config"
        config.write_text("\n".join(lines) + "\n")
        command = [SSHD, "-D", "-e", "-f", str(config)]
        if machine is not None:
            command = machine_command(workdir, *machine, command)
        if netns is not None:
            command = ["ip", "netns", "exec", netns, *command]
        with open(workdir / "sshd.log", "wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=log,
                                       stdin=subprocess.DEVNULL)
        server = Sshd(workdir, address, port, key, process, netns, list(extra or []))
        self.servers.append(server)
        try:
            if netns is None:
                wait_for_port(address, port)
            else:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    probe = subprocess.run(
                        ["ip", "netns", "exec", netns, "python3", "-c",
                         f"import socket; socket.create_connection(({address!r}, {port}), 1)"],
                        capture_output=True)
                    if probe.returncode == 0:
                        break
                    time.sleep(0.05)
        except RuntimeError:
            server.stop()
            raise RuntimeError((workdir / "sshd.log").read_text()) from None
        return server

    def known_hosts(self, path: Path, servers: list[Sshd] | None = None) -> Path:
        """Write a known_hosts file holding the host key of each server."""
        path.write_text("".join(s.known_hosts_line for s in (servers or self.servers)))
        return path

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        for user in self.users:
            subprocess.run(["userdel", "-f", user], capture_output=True)
            with contextlib.suppress(FileNotFoundError):
                Path(f"/etc/sudoers.d/host-auditor-test-{user}").unlink()


@dataclass
class Netns:
    """A network namespace joined to this one by a veth pair: 10.200.N.1 here, .2 inside."""

    name: str
    index: int
    outside: str
    inside: str

    @property
    def address(self) -> str:
        return f"10.200.{self.index}.2"

    @property
    def local_address(self) -> str:
        return f"10.200.{self.index}.1"

    def exec(self, *command: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["ip", "netns", "exec", self.name, *command], capture_output=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def netns(index: int, delay_ms: int = 0) -> Iterator[Netns]:
    """Make a namespace with a veth pair (and netem delay on both ends when asked)."""
    tag = f"ha{os.getpid() % 10000}n{index}"
    ns = Netns(name=f"{tag}ns", index=index, outside=f"{tag}a", inside=f"{tag}b")
    _ip("netns", "add", ns.name)
    try:
        _ip("link", "add", ns.outside, "type", "veth", "peer", "name", ns.inside)
        _ip("link", "set", ns.inside, "netns", ns.name)
        _ip("addr", "add", f"{ns.local_address}/24", "dev", ns.outside)
        _ip("link", "set", ns.outside, "up")
        _ip("-n", ns.name, "addr", "add", f"{ns.address}/24", "dev", ns.inside)
        _ip("-n", ns.name, "link", "set", ns.inside, "up")
        _ip("-n", ns.name, "link", "set", "lo", "up")
        if delay_ms:
            for command in (["tc"], ["ip", "netns", "exec", ns.name, "tc"]):
                device = ns.outside if len(command) == 1 else ns.inside
                subprocess.run([*command, "qdisc", "add", "dev", device, "root", "netem",
                                "delay", f"{delay_ms}ms"], check=True, capture_output=True)
        yield ns
    finally:
        subprocess.run(["ip", "link", "del", ns.outside], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns.name], capture_output=True)


def netem_available() -> bool:
    """Return whether the kernel has the netem qdisc (needs root and sch_netem)."""
    if os.geteuid() != 0 or shutil.which("tc") is None:
        return False
    try:
        with netns(254, delay_ms=1):
            return True
    except (subprocess.CalledProcessError, OSError):
        return False


def netns_available() -> bool:
    """Return whether network namespaces and veth pairs can be made here."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    try:
        with netns(253):
            return True
    except (subprocess.CalledProcessError, OSError):
        return False


class DelayProxy:
    """A TCP relay on loopback that holds every chunk ``delay`` seconds in each direction.

    Used where the kernel has no netem qdisc: one-way delay is what netem adds,
    so a round trip through the relay costs ``2 * delay``.
    """

    def __init__(self, upstream: tuple[str, int], delay: float) -> None:
        import threading

        self.upstream = upstream
        self.delay = delay
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = int(self.listener.getsockname()[1])
        self._threads: list[threading.Thread] = []
        self._closed = False
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()

    def _accept(self) -> None:
        import threading

        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        import queue
        import threading

        held: queue.Queue[tuple[float, bytes]] = queue.Queue()

        def sender() -> None:
            while True:
                due, data = held.get()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                try:
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=sender, daemon=True).start()
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                data = b""
            held.put((time.monotonic() + self.delay, data))
            if not data:
                return

    def close(self) -> None:
        self._closed = True
        self.listener.close()


class SilentListener:
    """A TCP listener that accepts and never says a word (an SSH server that hangs)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])

    def close(self) -> None:
        self.sock.close()
