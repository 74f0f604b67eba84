"""The GPU state the driver reports: the third source beside files and commands.

Checks read files only. The live state of the NVIDIA driver (ECC mode, row remapping,
clocks-event reasons, the PCIe link it trained, persistence) is not in any file, so it is
collected once per audit into virtual files under ``/host-auditor/`` that the checks read
like any other path, on every kind of host:

- ``/host-auditor/nvidia-smi.xml``: the output of ``nvidia-smi -q -x`` (the ``<processes>``
  lists removed: a process's command line is never kept);
- ``/host-auditor/nvidia-smi.status``: how that command ended (``exit 0``, ``exit 9``,
  ``timeout 10``), then the first lines it printed where it failed;
- ``/host-auditor/nvml.json``: the same state read through NVML (``nvidia-ml-py``) by a child
  process, normalised (:mod:`auditor.shipped.nvml_child`), or how NVML failed;
- ``/host-auditor/kmsg``: the kernel log's NVIDIA lines (``NVRM:``), for the Xid history.

Where they come from:

- on this machine (:class:`LocalGpuState`), when a check first reads one: NVML in a child
  process with a deadline where ``pynvml`` is installed (``host-auditor[nvml]``) and a GPU is
  bound to ``nvidia``; else ``nvidia-smi -q -x``, with the same deadline (where it is not
  installed that costs a PATH lookup). A child that hangs
  (NVML blocks on a wedged GPU) or dies (a wrong ctypes call kills an interpreter) becomes a
  status saying so, never a hung audit;
- over SSH, from the collector itself, in the same single round trip
  (:mod:`auditor.shipped.collector_script`), with ``nvidia-smi`` only: nothing is installed on
  the target;
- in a capture or a sysroot they are plain files at ``host-auditor/`` in its root, so
  ``audit local --root`` replays the live verdicts; a capture made by hand with only
  ``host-auditor/nvidia-smi.xml`` is judged the same way.

Nothing here runs unless a check reads one of these paths: a run whose checks do not need
the GPU state neither imports NVML nor starts ``nvidia-smi``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from typing import NamedTuple

from auditor.hosts.gpufiles import KMSG, NVML_JSON, READS, SMI_STATUS, SMI_XML, STATE_DIR

__all__ = ["KMSG", "NVML_JSON", "READS", "SMI_STATUS", "SMI_XML", "STATE_DIR", "LocalGpuState",
           "parse_xml", "run_nvidia_smi", "run_nvml", "sanitise_xml"]

#: The most bytes kept of ``nvidia-smi -q -x`` (an 8-GPU node's is about 400 KB, most of it
#: the supported-clocks tables).
MAX_XML = 8 << 20
#: The most bytes of a failing command's output kept in the status file.
MAX_STATUS = 4096
#: How long the child (NVML or nvidia-smi) may take before the GPU state is unknown.
DEFAULT_DEADLINE = 10.0
_NVIDIA_DRIVER = "/sys/bus/pci/drivers/nvidia"


def is_virtual(path: str) -> bool:
    """Return whether ``path`` is one of the virtual GPU-state files (or their directory)."""
    return path == STATE_DIR or path.startswith(STATE_DIR + "/")


class XmlRefused(ValueError):
    """An ``nvidia-smi -q -x`` document that is not read (too large, entities, not XML)."""


def parse_xml(data: bytes) -> object:
    """Parse ``nvidia-smi -q -x`` output defensively; return its root element.

    Bounded in size; a document type with an internal subset or any entity declaration is
    refused before parsing (nvidia-smi writes only ``<!DOCTYPE nvidia_smi_log SYSTEM
    "nvsmi_device_vNN.dtd">``, which is never fetched), so neither entity expansion nor an
    external resource is possible.
    """
    import xml.etree.ElementTree as ET  # only where GPU state is read

    if len(data) > MAX_XML:
        raise XmlRefused(f"larger than {MAX_XML >> 20} MiB")
    head = data[:4096]
    if b"<!ENTITY" in data or b"<!entity" in data:
        raise XmlRefused("it declares entities")
    doctype = head.find(b"<!DOCTYPE")
    if doctype >= 0:
        end = head.find(b">", doctype)
        if end < 0 or b"[" in head[doctype:end]:
            raise XmlRefused("its document type has an internal subset")
    elif b"<!DOCTYPE" in data:
        raise XmlRefused("a document type after the start")
    # Entities and internal subsets are refused above, and expat never fetches an external
    # DTD: what defusedxml guards against cannot reach the parser.
    parser = ET.XMLParser()  # noqa: S314
    try:
        parser.feed(data)
        return parser.close()
    except ET.ParseError as exc:
        raise XmlRefused(f"not well-formed XML ({exc})") from None


def sanitise_xml(data: bytes) -> bytes:
    """Return ``nvidia-smi -q -x`` output without its process lists (command lines).

    Output that cannot be parsed is kept as it is, only cut at the first ``<processes>``:
    it is judged as unreadable either way.
    """
    import xml.etree.ElementTree as ET

    try:
        root = parse_xml(data)
    except XmlRefused:
        cut = data.find(b"<processes>")
        return data if cut < 0 else data[:cut]
    assert isinstance(root, ET.Element)
    removed = False
    for gpu in root.findall("gpu"):
        for name in ("processes", "accounted_processes"):
            for element in gpu.findall(name):
                if len(element):  # an empty list is kept: the document stays as printed
                    gpu.remove(element)
                    removed = True
    if not removed:
        return data
    body: bytes = ET.tostring(root, encoding="utf-8", method="xml", xml_declaration=False)
    return b'<?xml version="1.0" ?>\n' + body + b"\n"


def nvidia_gpu_bound() -> bool:
    """Return whether a PCI function on this machine is bound to the ``nvidia`` driver."""
    try:
        return any(":" in name for name in os.listdir(_NVIDIA_DRIVER))
    except OSError:
        return False


def run_nvidia_smi(deadline: float = DEFAULT_DEADLINE) -> dict[str, bytes]:
    """Run ``nvidia-smi -q -x`` here within ``deadline`` seconds; return the virtual files.

    The same code the SSH collector runs on a target (``collector_script.run_smi``), with the
    process lists taken out of the XML.
    """
    from auditor.shipped.collector_script import run_smi

    files = run_smi(deadline, MAX_XML)
    if SMI_XML in files:
        files[SMI_XML] = sanitise_xml(files[SMI_XML])
    return files


def nvml_available() -> bool:
    """Return whether ``pynvml`` (nvidia-ml-py) can be imported, without importing it."""
    import importlib.util

    try:
        return importlib.util.find_spec("pynvml") is not None
    except (ImportError, ValueError):
        return False


def run_nvml(deadline: float = DEFAULT_DEADLINE) -> dict[str, bytes]:
    """Read the GPU state through NVML in a child process; return the virtual files.

    The child prints one JSON document (:mod:`auditor.shipped.nvml_child`). A child that does
    not answer within ``deadline`` is killed and the state says so; one that dies (a
    signal, a crash inside the library) likewise.
    """
    import json
    import sys


    # Run by its path, not as ``-m auditor.shipped.nvml_child``: importing the package first
    # (auditor.hosts and its backends) cost 30-60 ms of the child's start for nothing.
    child = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shipped",
                         "nvml_child.py")
    result = run_bounded([sys.executable, child], deadline, MAX_XML)
    if result.timed_out:
        document: dict[str, object] = {"source": "nvml", "error": {
            "kind": "timeout", "message": f"NVML did not answer in {deadline:g} s"}}
    elif result.returncode != 0 or not result.stdout.startswith(b"{"):
        signal_note = (f"killed by signal {-result.returncode}" if result.returncode < 0
                       else f"exit status {result.returncode}")
        tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        document = {"source": "nvml", "error": {
            "kind": "crashed", "message": f"the NVML collector died ({signal_note})"
            + (f": {tail[0][:300]}" if tail else "")}}
    else:
        return {NVML_JSON: result.stdout}
    return {NVML_JSON: json.dumps(document).encode() + b"\n"}


class Bounded(NamedTuple):
    """What a command run with a deadline returned."""

    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool


def run_bounded(argv: list[str], deadline: float, limit: int) -> Bounded:
    """Run a command of this machine with ``deadline`` seconds, its output cut at ``limit``.

    At the deadline its whole process group is killed; a process that cannot die (blocked
    in the kernel on a wedged GPU) is left behind rather than waited for: the audit goes on.
    """
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        return Bounded(127, b"", f"{argv[0]}: {exc.strerror}\n".encode(), False)
    try:
        out, err = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, err = proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            out, err = b"", b""
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
        return Bounded(-9, out[:limit], err[-4096:], True)
    return Bounded(proc.returncode, out[:limit], err[-4096:], False)


class LocalGpuState:
    """The virtual GPU-state files of this machine, collected once, on first read.

    Checks run in parallel on the live machine: the first reader collects, the others
    wait for it (a lock), and every later read is served from memory.
    """

    def __init__(self, deadline: float = DEFAULT_DEADLINE, use_nvml: bool | None = None) -> None:
        self.deadline = deadline
        #: None: NVML where pynvml is installed; False: nvidia-smi only; True: NVML only.
        self.use_nvml = use_nvml
        self._files: dict[str, bytes] | None = None
        self._kmsg: bytes | None = None
        self._kmsg_read = False
        self._lock = threading.Lock()

    def _collect(self) -> dict[str, bytes]:
        # NVML only where a GPU is bound to nvidia and nvidia-ml-py is installed; otherwise
        # nvidia-smi, as the SSH collector runs it (where it is missing, that is said).
        use_nvml = self.use_nvml if self.use_nvml is not None else nvml_available()
        if use_nvml and nvidia_gpu_bound():
            return run_nvml(self.deadline)
        return run_nvidia_smi(self.deadline)

    def files(self) -> dict[str, bytes]:
        """Return the GPU-state files (collected on the first call)."""
        with self._lock:
            if self._files is None:
                self._files = self._collect()
            return self._files

    def kmsg(self) -> bytes | None:
        """Return the kernel log's NVIDIA lines (read on the first call), None if unreadable."""
        with self._lock:
            if not self._kmsg_read:
                from auditor.shipped.collector_script import read_kmsg

                self._kmsg = read_kmsg()
                self._kmsg_read = True
            return self._kmsg

    def read(self, path: str) -> bytes | None:
        """Return one virtual file's bytes, or None where it does not exist."""
        if path == KMSG:
            return self.kmsg()
        if path in READS:
            return self.files().get(path)
        return None

    def listing(self) -> list[str]:
        """Return the names in the virtual directory."""
        names = [p.rsplit("/", 1)[1] for p in self.files()]
        if self.kmsg() is not None:
            names.append(KMSG.rsplit("/", 1)[1])
        return sorted(names)
