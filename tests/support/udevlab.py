"""A udevd that is stopped with its socket left behind, in a mount namespace of its own.

Run as ``unshare --mount --propagation private python -m tests.support.udevlab`` (root):
a tmpfs on ``/run/udev`` keeps the scenario from touching any udevd the machine runs.
It starts a real systemd-udevd, runs ``audit watch`` while it answers, stops it
(SIGTERM, as ``systemctl stop`` does; the control socket stays), runs ``audit watch``
again and triggers a real PCI uevent. What each step printed goes to stdout as JSON.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

UDEVD = next((p for p in ("/lib/systemd/systemd-udevd", "/usr/lib/systemd/systemd-udevd")
              if os.path.exists(p)), "systemd-udevd")
AUDIT = str(Path(sys.executable).with_name("audit"))
CONTROL = Path("/run/udev/control")


def ping() -> bool:
    return subprocess.run(["udevadm", "control", "--ping", "--timeout=2"], capture_output=True,
                          check=False).returncode == 0


def watch_once(*args: str) -> dict[str, Any]:
    """Run ``audit watch`` until its first event (or timeout), triggering one PCI uevent."""
    process = subprocess.Popen([AUDIT, "watch", "--check", "pcie.mrrs", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    first = process.stderr.readline()
    subprocess.run(["udevadm", "trigger", "--action=change", "--subsystem-match=pci"],
                   check=True)
    try:
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return {"first": first, "out": out, "err": err, "code": process.returncode}


def main() -> int:
    os.makedirs("/run/udev", exist_ok=True)  # a machine that never ran udevd has none
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run/udev"], check=True)
    udevd = subprocess.Popen([UDEVD], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result: dict[str, Any] = {}
    try:
        for _ in range(100):
            if ping():
                break
            time.sleep(0.05)
        result["answered"] = ping()
        result["running"] = watch_once("--count", "1", "--timeout", "20")
    finally:
        udevd.send_signal(signal.SIGTERM)
        udevd.wait(timeout=10)
    result["socket_left"] = CONTROL.is_socket()
    result["answers_after"] = ping()
    result["stopped"] = watch_once("--count", "1", "--timeout", "20")
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
