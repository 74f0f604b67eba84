"""host-auditor's probe program: measures what a host's files can only promise.

This file is a program of its own. ``audit probe`` runs it with this machine's Python,
and sends its text over SSH to run with the target's ``python3`` (``python3 -`` reading
it from a here-document), so it keeps to what Python 3.6 accepts and imports only the
standard library: nothing has to be installed on a target.

It measures, and judges nothing: the numbers go back as one JSON document after a
marker line, and host-auditor judges them where it runs (``auditor.probes.judge``).

The GPU probes talk to the driver through ``ctypes``: ``libcuda.so.1`` (the CUDA driver
API) and ``libamdhip64.so`` (HIP) for AMD. Not NVIDIA's ``cuda-bindings``: a release of it
targets one driver major (13.x needs a driver >= 580.65, 12.x >= 525.60), so a tool
installed once could not probe a fleet of mixed drivers, while the driver API entry
points used here (``cuMemAlloc_v2``, ``cuMemcpyHtoDAsync_v2``, ...) are exported by every
driver branch since R450; the two newer ones (``cuEventElapsedTime_v2``,
``cuDevicePrimaryCtxRelease_v2``) fall back to their older names. No torch, no CUDA
toolkit, no kernels to compile.

Every probe runs in a forked child with a deadline: past it the child is killed
(SIGKILL; the kernel driver frees a dead process's GPU memory) and reaped, and the probe
is reported as timed out. The child frees what it allocated on every path.
"""

import ctypes
import ctypes.util
import errno
import json
import os
import platform
import select
import signal
import socket
import struct
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

#: The version of what this program sends back; host-auditor refuses another.
PROTOCOL = 1
#: The line before the JSON answer (over SSH, stdout and stderr arrive mixed).
MARK = "HOST-AUDITOR-PROBE-RESULT "
#: The probes this program knows. ``copy`` measures h2d and d2h in one driver session.
PROBES = ("copy", "p2p", "wakeup", "numa")
#: Bytes of one copy: 64 MiB reached 99.6% of the 1 GiB plateau on an H200, while
#: copies under 4 MiB lose 16% to per-copy cost (next-wave-device.json, ctypes_probe).
COPY_BYTES = 64 << 20
COPIES = 10
TRIALS = 3
P2P_BYTES = 64 << 20
LATENCY_BYTES = 16
LATENCY_COPIES = 100
NUMA_BYTES = 256 << 20
#: At most this many bytes of a child's answer are read.
MAX_ANSWER = 4 << 20
#: A GPU busier than this (NVML utilisation, percent) is refused unless forced.
BUSY_UTILISATION = 5
#: Where sysfs is; a test points it at a directory standing in for it.
SYS = "/sys"

JSONDict = Dict[str, Any]


class ProbeSkip(Exception):
    """The probe cannot run here; the message says why."""


class DriverError(Exception):
    """A driver call returned an error."""

    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__("{} returned {} ({})".format(call, name, code))
        self.call = call
        self.code = code
        self.name = name


def progress(text: str) -> None:
    """Say on stderr what the program is doing (the caller shows or drops it)."""
    sys.stderr.write("probe: " + text + "\n")
    sys.stderr.flush()


# -- sysfs ------------------------------------------------------------------------------


def read_small(path: str, limit: int = 4096) -> Optional[str]:
    """Return a small text file's content stripped, or None where it cannot be read."""
    try:
        # Non-blocking: a FIFO where a file was expected answers at once instead of hanging.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        data = os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace").strip()


def normal_bdf(text: str) -> str:
    """Return a PCI address as sysfs names it: ``0000:41:00.0`` (lower case, 4-digit domain)."""
    text = text.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)


def is_bdf(name: str) -> bool:
    """Return whether a sysfs directory name is a PCI address (``0000:41:00.0``)."""
    parts = name.split(":")
    if len(parts) != 3 or "." not in parts[2]:
        return False
    device, _, function = parts[2].partition(".")
    hexdigits = "0123456789abcdef"
    return all(c in hexdigits for c in parts[0] + parts[1] + device + function) and bool(
        parts[0] and parts[1] and device and function)


def pci_link(bdf: str) -> JSONDict:
    """Return a PCI function's link as sysfs says it: now, at most, and at the port above."""
    base = os.path.join(SYS, "bus", "pci", "devices", bdf)
    info = {
        "bdf": bdf,
        "current_speed": read_small(os.path.join(base, "current_link_speed")),
        "current_width": read_small(os.path.join(base, "current_link_width")),
        "max_speed": read_small(os.path.join(base, "max_link_speed")),
        "max_width": read_small(os.path.join(base, "max_link_width")),
        "numa_node": read_small(os.path.join(base, "numa_node")),
        "local_cpulist": read_small(os.path.join(base, "local_cpulist")),
    }  # type: JSONDict
    try:
        parent = os.path.basename(os.path.dirname(os.path.realpath(base)))
    except OSError:
        parent = ""
    if is_bdf(parent):
        above = os.path.join(SYS, "bus", "pci", "devices", parent)
        info["port"] = parent
        info["port_max_speed"] = read_small(os.path.join(above, "max_link_speed"))
        info["port_max_width"] = read_small(os.path.join(above, "max_link_width"))
    return info


def link_now(bdf: str) -> JSONDict:
    """Return the link's speed and width as they are this instant."""
    base = os.path.join(SYS, "bus", "pci", "devices", bdf)
    return {"speed": read_small(os.path.join(base, "current_link_speed")),
            "width": read_small(os.path.join(base, "current_link_width"))}


def parse_cpulist(text: Optional[str], limit: int = 131072) -> List[int]:
    """Return the CPUs of a kernel CPU list (``0-3,8``); [] where there is none."""
    cpus = []  # type: List[int]
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            return []
        if first > last or last >= limit or len(cpus) + last - first >= limit:
            return []
        cpus.extend(range(first, last + 1))
    return cpus


def numa_nodes() -> Dict[int, List[int]]:
    """Return each NUMA node that has CPUs, with its CPUs."""
    base = os.path.join(SYS, "devices", "system", "node")
    nodes = {}  # type: Dict[int, List[int]]
    try:
        names = os.listdir(base)
    except OSError:
        return nodes
    for name in names:
        if not name.startswith("node") or not name[4:].isdigit():
            continue
        cpus = parse_cpulist(read_small(os.path.join(base, name, "cpulist")))
        if cpus:
            nodes[int(name[4:])] = cpus
    return nodes


def allowed_cpus() -> List[int]:
    """Return the CPUs this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []


def pin(cpus: List[int]) -> bool:
    """Run this thread on ``cpus`` (those allowed); return whether it moved."""
    usable = set(cpus) & set(allowed_cpus())
    if not usable:
        return False
    try:
        os.sched_setaffinity(0, usable)
    except OSError:
        return False
    return True


def hypervisor() -> bool:
    """Return whether the CPU says it runs under a hypervisor (x86 ``hypervisor`` flag)."""
    text = read_small("/proc/cpuinfo", 1 << 20) or ""
    for line in text.splitlines():
        if line.startswith("flags"):
            return "hypervisor" in line.split()
    return False


# -- the GPU drivers --------------------------------------------------------------------

c_int_p = ctypes.POINTER(ctypes.c_int)
c_size_p = ctypes.POINTER(ctypes.c_size_t)
c_void_pp = ctypes.POINTER(ctypes.c_void_p)
c_u64_p = ctypes.POINTER(ctypes.c_uint64)
c_float_p = ctypes.POINTER(ctypes.c_float)


class Gpu(object):
    """One GPU as a probe sees it: its ordinal, name and PCI address."""

    def __init__(self, index: int, name: str, bdf: str, total: int) -> None:
        self.index = index
        self.name = name
        self.bdf = bdf
        self.total = total

    def describe(self) -> JSONDict:
        return {"index": self.index, "name": self.name, "bdf": self.bdf,
                "memory_bytes": self.total}


class Cuda(object):
    """A small binding of the CUDA driver API (``libcuda.so.1``): what the probes need.

    ``CUdeviceptr`` is a 64-bit integer; every size is ``size_t``; the ``_v2`` names are
    the 64-bit ABI (the unversioned ``cuMemAlloc`` and ``cuMemcpyHtoD`` are the old one).
    """

    kind = "cuda"
    library = "libcuda.so.1"
    H2D, D2H = "h2d", "d2h"

    def __init__(self) -> None:
        self.lib = ctypes.CDLL(self.library)
        self.contexts = {}  # type: Dict[int, int]
        self.version = 0
        lib = self.lib
        i, u, sz, vp, u64 = (ctypes.c_int, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p,
                             ctypes.c_uint64)
        self._declare("cuInit", [u])
        self._declare("cuDriverGetVersion", [c_int_p])
        self._declare("cuDeviceGetCount", [c_int_p])
        self._declare("cuDeviceGet", [c_int_p, i])
        self._declare("cuDeviceGetName", [ctypes.c_char_p, i, i])
        self._declare("cuDeviceGetPCIBusId", [ctypes.c_char_p, i, i])
        self._declare("cuDeviceTotalMem_v2", [c_size_p, i])
        self._declare("cuDevicePrimaryCtxRetain", [c_void_pp, i])
        self.ctx_release = self._declare_first(("cuDevicePrimaryCtxRelease_v2",
                                                "cuDevicePrimaryCtxRelease"), [i])
        self._declare("cuCtxSetCurrent", [vp])
        self._declare("cuCtxSynchronize", [])
        self._declare("cuMemGetInfo_v2", [c_size_p, c_size_p])
        self._declare("cuMemAllocHost_v2", [c_void_pp, sz])
        self._declare("cuMemFreeHost", [vp])
        self._declare("cuMemAlloc_v2", [c_u64_p, sz])
        self._declare("cuMemFree_v2", [u64])
        self._declare("cuMemcpyHtoD_v2", [u64, vp, sz])
        self._declare("cuMemcpyDtoH_v2", [vp, u64, sz])
        self._declare("cuMemcpyHtoDAsync_v2", [u64, vp, sz, vp])
        self._declare("cuMemcpyDtoHAsync_v2", [vp, u64, sz, vp])
        self._declare("cuMemcpyPeerAsync", [u64, vp, u64, vp, sz, vp])
        self._declare("cuDeviceCanAccessPeer", [c_int_p, i, i])
        self._declare("cuCtxEnablePeerAccess", [vp, u])
        self._declare("cuCtxDisablePeerAccess", [vp])
        self._declare("cuStreamCreate", [c_void_pp, u])
        self.stream_destroy = self._declare_first(("cuStreamDestroy_v2", "cuStreamDestroy"),
                                                  [vp])
        self._declare("cuEventCreate", [c_void_pp, u])
        self._declare("cuEventRecord", [vp, vp])
        self._declare("cuEventSynchronize", [vp])
        self.event_destroy = self._declare_first(("cuEventDestroy_v2", "cuEventDestroy"), [vp])
        # cuEventElapsedTime_v2 is CUDA 12.8+; older drivers have only the first name.
        self.elapsed = self._declare_first(("cuEventElapsedTime_v2", "cuEventElapsedTime"),
                                           [c_float_p, vp, vp])
        get_name = getattr(lib, "cuGetErrorName", None)
        if get_name is not None:
            get_name.argtypes = [i, ctypes.POINTER(ctypes.c_char_p)]
            get_name.restype = i
        self._error_name = get_name

    def _declare(self, name: str, argtypes: List[Any]) -> None:
        function = getattr(self.lib, name)  # AttributeError: the driver lacks it
        function.argtypes = argtypes
        function.restype = ctypes.c_int

    def _declare_first(self, names: Tuple[str, ...], argtypes: List[Any]) -> str:
        for name in names:
            if hasattr(self.lib, name):
                self._declare(name, argtypes)
                return name
        raise AttributeError("the driver exports none of " + ", ".join(names))

    def error_name(self, code: int) -> str:
        if self._error_name is not None:
            text = ctypes.c_char_p()
            if self._error_name(code, ctypes.byref(text)) == 0 and text.value:
                return text.value.decode("ascii", "replace")
        return "CUDA error"

    def call(self, name: str, *args: Any) -> None:
        code = getattr(self.lib, name)(*args)
        if code != 0:
            raise DriverError(name, code, self.error_name(code))

    # -- the seam the probes use (HIP below has the same) -------------------------------

    def init(self) -> None:
        try:
            self.call("cuInit", 0)
        except DriverError as exc:
            # 100 CUDA_ERROR_NO_DEVICE, 999 UNKNOWN (a VM without the device passed through
            # answers either), 35 INSUFFICIENT_DRIVER, 3 NOT_INITIALIZED, 34 STUB_LIBRARY.
            raise ProbeSkip("the CUDA driver found no usable GPU ({})".format(exc)) from None
        version = ctypes.c_int()
        self.call("cuDriverGetVersion", ctypes.byref(version))
        self.version = version.value

    def gpus(self) -> List[Gpu]:
        count = ctypes.c_int()
        self.call("cuDeviceGetCount", ctypes.byref(count))
        found = []
        for index in range(min(count.value, 64)):
            device = ctypes.c_int()
            self.call("cuDeviceGet", ctypes.byref(device), index)
            name = ctypes.create_string_buffer(256)
            self.call("cuDeviceGetName", name, 256, device.value)
            bus = ctypes.create_string_buffer(64)
            self.call("cuDeviceGetPCIBusId", bus, 64, device.value)
            total = ctypes.c_size_t()
            self.call("cuDeviceTotalMem_v2", ctypes.byref(total), device.value)
            found.append(Gpu(device.value, name.value.decode("utf-8", "replace"),
                             normal_bdf(bus.value.decode("ascii", "replace")), total.value))
        return found

    def open(self, index: int) -> None:
        if index not in self.contexts:
            context = ctypes.c_void_p()
            self.call("cuDevicePrimaryCtxRetain", ctypes.byref(context), index)
            self.contexts[index] = context.value or 0
        self.call("cuCtxSetCurrent", ctypes.c_void_p(self.contexts[index]))

    def close_all(self) -> None:
        for index in list(self.contexts):
            del self.contexts[index]
            try:
                self.call(self.ctx_release, index)
            except DriverError:
                pass

    def mem_info(self) -> Tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def alloc_host(self, size: int) -> int:
        pointer = ctypes.c_void_p()
        self.call("cuMemAllocHost_v2", ctypes.byref(pointer), size)
        return pointer.value or 0

    def free_host(self, pointer: int) -> None:
        self.call("cuMemFreeHost", ctypes.c_void_p(pointer))

    def alloc_device(self, size: int) -> int:
        pointer = ctypes.c_uint64()
        self.call("cuMemAlloc_v2", ctypes.byref(pointer), size)
        return pointer.value

    def free_device(self, pointer: int) -> None:
        self.call("cuMemFree_v2", ctypes.c_uint64(pointer))

    def copy(self, direction: str, device: int, host: int, size: int) -> None:
        if direction == self.H2D:
            self.call("cuMemcpyHtoD_v2", ctypes.c_uint64(device), ctypes.c_void_p(host), size)
        else:
            self.call("cuMemcpyDtoH_v2", ctypes.c_void_p(host), ctypes.c_uint64(device), size)

    def copy_async(self, direction: str, device: int, host: int, size: int,
                   stream: int) -> None:
        if direction == self.H2D:
            self.call("cuMemcpyHtoDAsync_v2", ctypes.c_uint64(device), ctypes.c_void_p(host),
                      size, ctypes.c_void_p(stream))
        else:
            self.call("cuMemcpyDtoHAsync_v2", ctypes.c_void_p(host), ctypes.c_uint64(device),
                      size, ctypes.c_void_p(stream))

    def stream(self) -> int:
        handle = ctypes.c_void_p()
        self.call("cuStreamCreate", ctypes.byref(handle), 0)
        return handle.value or 0

    def destroy_stream(self, handle: int) -> None:
        self.call(self.stream_destroy, ctypes.c_void_p(handle))

    def event(self) -> int:
        handle = ctypes.c_void_p()
        self.call("cuEventCreate", ctypes.byref(handle), 0)
        return handle.value or 0

    def destroy_event(self, handle: int) -> None:
        self.call(self.event_destroy, ctypes.c_void_p(handle))

    def record(self, event: int, stream: int) -> None:
        self.call("cuEventRecord", ctypes.c_void_p(event), ctypes.c_void_p(stream))

    def wait_ms(self, start: int, stop: int) -> float:
        self.call("cuEventSynchronize", ctypes.c_void_p(stop))
        elapsed = ctypes.c_float()
        self.call(self.elapsed, ctypes.byref(elapsed), ctypes.c_void_p(start),
                  ctypes.c_void_p(stop))
        return float(elapsed.value)

    # -- peer to peer (CUDA only) -------------------------------------------------------

    def can_access_peer(self, a: int, b: int) -> bool:
        flag = ctypes.c_int()
        self.call("cuDeviceCanAccessPeer", ctypes.byref(flag), a, b)
        return bool(flag.value)

    def peer_access(self, a: int, b: int, on: bool) -> None:
        """Let the context of ``a`` reach ``b``'s memory directly (or stop it)."""
        self.open(a)
        peer = ctypes.c_void_p(self.contexts[b])
        try:
            if on:
                self.call("cuCtxEnablePeerAccess", peer, 0)
            else:
                self.call("cuCtxDisablePeerAccess", peer)
        except DriverError as exc:
            # 704 PEER_ACCESS_ALREADY_ENABLED, 705 PEER_ACCESS_NOT_ENABLED: already so.
            if exc.code not in (704, 705):
                raise

    def copy_peer(self, dst: int, dst_gpu: int, src: int, src_gpu: int, size: int,
                  stream: int) -> None:
        self.call("cuMemcpyPeerAsync", ctypes.c_uint64(dst),
                  ctypes.c_void_p(self.contexts[dst_gpu]), ctypes.c_uint64(src),
                  ctypes.c_void_p(self.contexts[src_gpu]), size, ctypes.c_void_p(stream))


class Hip(object):
    """The same seam over AMD's HIP runtime (``libamdhip64.so``), for h2d and d2h."""

    kind = "hip"
    library = "libamdhip64.so"
    H2D, D2H = "h2d", "d2h"
    #: hipMemcpyKind: hipMemcpyHostToDevice, hipMemcpyDeviceToHost.
    KINDS = {"h2d": 1, "d2h": 2}

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL(self.library)
        except OSError:
            rocm = os.environ.get("ROCM_PATH") or "/opt/rocm"
            self.lib = ctypes.CDLL(os.path.join(rocm, "lib", self.library))
        self.version = 0
        i, sz, vp, u = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_uint
        for name, argtypes in (
                ("hipInit", [u]), ("hipDriverGetVersion", [c_int_p]),
                ("hipGetDeviceCount", [c_int_p]),
                ("hipDeviceGetName", [ctypes.c_char_p, i, i]),
                ("hipDeviceGetPCIBusId", [ctypes.c_char_p, i, i]),
                ("hipDeviceTotalMem", [c_size_p, i]), ("hipSetDevice", [i]),
                ("hipMemGetInfo", [c_size_p, c_size_p]),
                ("hipHostMalloc", [c_void_pp, sz, u]), ("hipHostFree", [vp]),
                ("hipMalloc", [c_void_pp, sz]), ("hipFree", [vp]),
                ("hipMemcpy", [vp, vp, sz, i]), ("hipMemcpyAsync", [vp, vp, sz, i, vp]),
                ("hipStreamCreate", [c_void_pp]), ("hipStreamDestroy", [vp]),
                ("hipEventCreate", [c_void_pp]), ("hipEventDestroy", [vp]),
                ("hipEventRecord", [vp, vp]), ("hipEventSynchronize", [vp]),
                ("hipEventElapsedTime", [c_float_p, vp, vp])):
            function = getattr(self.lib, name)
            function.argtypes = argtypes
            function.restype = ctypes.c_int
        name_of = getattr(self.lib, "hipGetErrorName", None)
        if name_of is not None:
            name_of.argtypes = [i]
            name_of.restype = ctypes.c_char_p
        self._error_name = name_of

    def call(self, name: str, *args: Any) -> None:
        code = getattr(self.lib, name)(*args)
        if code != 0:
            text = self._error_name(code) if self._error_name is not None else None
            raise DriverError(name, code, (text or b"HIP error").decode("ascii", "replace"))

    def init(self) -> None:
        try:
            self.call("hipInit", 0)
        except DriverError as exc:
            raise ProbeSkip("the HIP runtime found no usable GPU ({})".format(exc)) from None
        version = ctypes.c_int()
        self.call("hipDriverGetVersion", ctypes.byref(version))
        self.version = version.value

    def gpus(self) -> List[Gpu]:
        count = ctypes.c_int()
        self.call("hipGetDeviceCount", ctypes.byref(count))
        found = []
        for index in range(min(count.value, 64)):
            name = ctypes.create_string_buffer(256)
            self.call("hipDeviceGetName", name, 256, index)
            bus = ctypes.create_string_buffer(64)
            self.call("hipDeviceGetPCIBusId", bus, 64, index)
            total = ctypes.c_size_t()
            self.call("hipDeviceTotalMem", ctypes.byref(total), index)
            found.append(Gpu(index, name.value.decode("utf-8", "replace"),
                             normal_bdf(bus.value.decode("ascii", "replace")), total.value))
        return found

    def open(self, index: int) -> None:
        self.call("hipSetDevice", index)

    def close_all(self) -> None:
        """HIP keeps one context per device until the process ends."""

    def mem_info(self) -> Tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.call("hipMemGetInfo", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def alloc_host(self, size: int) -> int:
        pointer = ctypes.c_void_p()
        self.call("hipHostMalloc", ctypes.byref(pointer), size, 0)
        return pointer.value or 0

    def free_host(self, pointer: int) -> None:
        self.call("hipHostFree", ctypes.c_void_p(pointer))

    def alloc_device(self, size: int) -> int:
        pointer = ctypes.c_void_p()
        self.call("hipMalloc", ctypes.byref(pointer), size)
        return pointer.value or 0

    def free_device(self, pointer: int) -> None:
        self.call("hipFree", ctypes.c_void_p(pointer))

    def _ends(self, direction: str, device: int, host: int) -> Tuple[int, int]:
        return (device, host) if direction == self.H2D else (host, device)

    def copy(self, direction: str, device: int, host: int, size: int) -> None:
        dst, src = self._ends(direction, device, host)
        self.call("hipMemcpy", ctypes.c_void_p(dst), ctypes.c_void_p(src), size,
                  self.KINDS[direction])

    def copy_async(self, direction: str, device: int, host: int, size: int,
                   stream: int) -> None:
        dst, src = self._ends(direction, device, host)
        self.call("hipMemcpyAsync", ctypes.c_void_p(dst), ctypes.c_void_p(src), size,
                  self.KINDS[direction], ctypes.c_void_p(stream))

    def stream(self) -> int:
        handle = ctypes.c_void_p()
        self.call("hipStreamCreate", ctypes.byref(handle))
        return handle.value or 0

    def destroy_stream(self, handle: int) -> None:
        self.call("hipStreamDestroy", ctypes.c_void_p(handle))

    def event(self) -> int:
        handle = ctypes.c_void_p()
        self.call("hipEventCreate", ctypes.byref(handle))
        return handle.value or 0

    def destroy_event(self, handle: int) -> None:
        self.call("hipEventDestroy", ctypes.c_void_p(handle))

    def record(self, event: int, stream: int) -> None:
        self.call("hipEventRecord", ctypes.c_void_p(event), ctypes.c_void_p(stream))

    def wait_ms(self, start: int, stop: int) -> float:
        self.call("hipEventSynchronize", ctypes.c_void_p(stop))
        elapsed = ctypes.c_float()
        self.call("hipEventElapsedTime", ctypes.byref(elapsed), ctypes.c_void_p(start),
                  ctypes.c_void_p(stop))
        return float(elapsed.value)


def open_driver() -> Any:
    """Return the CUDA driver, else HIP; skip, saying what was looked for, where neither."""
    reasons = []
    for kind in (Cuda, Hip):
        try:
            return kind()
        except OSError as exc:
            text = " ".join(str(exc).split())
            reasons.append("{} {}".format(kind.library, "not found" if "cannot open shared"
                                          in text else "not loaded: " + text[:160]))
        except AttributeError as exc:
            reasons.append("{}: too old ({})".format(kind.library, exc))
    raise ProbeSkip("no GPU driver: " + ", ".join(reasons))


class Nvml(object):
    """What NVML (``libnvidia-ml.so.1``, through ``ctypes`` too) says of a GPU: its use,
    and its PCIe link where sysfs does not show it (a container or a sandbox).

    Only calls whose ABI has not changed: ``nvmlDeviceGetUtilizationRates`` (two unsigned
    ints), the link generation and width getters (one unsigned int), and
    ``nvmlDeviceGetComputeRunningProcesses`` asked with room for none, which answers
    SUCCESS with a count of 0 when no process runs and INSUFFICIENT_SIZE (7) when some
    do, so no process struct (whose layout changed between versions) is ever read.
    """

    def __init__(self) -> None:
        self.lib = None  # type: Any
        self.reason = ""
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            self.reason = "NVML (libnvidia-ml.so.1) not found"
            return
        init = getattr(lib, "nvmlInit_v2", None) or getattr(lib, "nvmlInit", None)
        if init is None or init() != 0:
            self.reason = "NVML did not initialise"
            return
        self.lib = lib

    def close(self) -> None:
        lib, self.lib = self.lib, None
        if lib is not None and hasattr(lib, "nvmlShutdown"):
            lib.nvmlShutdown()

    def handle(self, bdf: str) -> Optional[ctypes.c_void_p]:
        if self.lib is None:
            return None
        handle = ctypes.c_void_p()
        by_bus = (getattr(self.lib, "nvmlDeviceGetHandleByPciBusId_v2", None)
                  or getattr(self.lib, "nvmlDeviceGetHandleByPciBusId", None))
        if by_bus is None:
            return None
        by_bus.argtypes = [ctypes.c_char_p, c_void_pp]
        if by_bus(bdf.encode(), ctypes.byref(handle)) != 0:
            return None
        return handle

    def _uint(self, name: str, handle: ctypes.c_void_p) -> Optional[int]:
        function = getattr(self.lib, name, None)
        if function is None:
            return None
        value = ctypes.c_uint(0)
        function.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint)]
        if function(handle, ctypes.byref(value)) != 0:
            return None
        return int(value.value)

    def busy(self, bdf: str) -> JSONDict:
        handle = self.handle(bdf)
        if handle is None:
            return {"known": False, "reason": self.reason or "NVML does not know " + bdf}
        state = {"known": True}  # type: JSONDict
        rates = (ctypes.c_uint * 2)()
        self.lib.nvmlDeviceGetUtilizationRates.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        if self.lib.nvmlDeviceGetUtilizationRates(handle, rates) == 0:
            state["utilisation"] = int(rates[0])
        for name in ("nvmlDeviceGetComputeRunningProcesses_v3",
                     "nvmlDeviceGetComputeRunningProcesses_v2",
                     "nvmlDeviceGetComputeRunningProcesses"):
            function = getattr(self.lib, name, None)
            if function is None:
                continue
            count = ctypes.c_uint(0)
            function.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint),
                                 ctypes.c_void_p]
            code = function(handle, ctypes.byref(count), None)
            if code == 0:
                state["processes"] = int(count.value)
            elif code == 7:
                state["processes"] = max(1, int(count.value))
            break
        return state

    def link(self, bdf: str, now_only: bool = False) -> JSONDict:
        """Return the link generation and width NVML reports (now, and the most the GPU
        and its slot allow); {} where NVML cannot say."""
        handle = self.handle(bdf)
        if handle is None:
            return {}
        names = [("current_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                 ("current_width", "nvmlDeviceGetCurrPcieLinkWidth")]
        if not now_only:
            names += [("max_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
                      ("max_width", "nvmlDeviceGetMaxPcieLinkWidth"),
                      ("gpu_max_gen", "nvmlDeviceGetGpuMaxPcieLinkGeneration")]
        found = {}  # type: JSONDict
        for key, name in names:
            value = self._uint(name, handle)
            if value is not None:
                found[key] = value
        return found


def busy_state(bdf: str) -> JSONDict:
    """Return what NVML says of a GPU's use: compute processes and utilisation."""
    nvml = Nvml()
    try:
        return nvml.busy(bdf)
    finally:
        nvml.close()


def refusal(state: JSONDict) -> str:
    """Return why a GPU counts as busy ("" when it does not)."""
    reasons = []
    if state.get("processes"):
        reasons.append("{} compute process(es) running".format(state["processes"]))
    if int(state.get("utilisation") or 0) > BUSY_UTILISATION:
        reasons.append("{}% utilisation".format(state["utilisation"]))
    return ", ".join(reasons)


def choose_gpus(api: Any, wanted: Optional[List[int]]) -> List[Gpu]:
    gpus = list(api.gpus())  # type: List[Gpu]
    if not gpus:
        raise ProbeSkip("the driver reports no GPU")
    if wanted:
        gpus = [g for g in gpus if g.index in wanted]
        if not gpus:
            raise ProbeSkip("none of the GPUs asked for (--gpus) exists")
    return gpus


# -- probe: host <-> device copies ------------------------------------------------------


def time_copies(api: Any, direction: str, device: int, host: int, size: int, copies: int,
                stream: int, start: int, stop: int, bdf: str,
                nvml: Optional[Nvml] = None) -> Tuple[float, JSONDict]:
    """Time ``copies`` back-to-back copies between two events; return GB/s and the link
    sysfs (and NVML) showed while they ran (read after they were queued, before they
    finished)."""
    api.record(start, stream)
    for _ in range(copies):
        api.copy_async(direction, device, host, size, stream)
    api.record(stop, stream)
    link = link_now(bdf)
    if nvml is not None and nvml.lib is not None:
        link["nvml"] = nvml.link(bdf, now_only=True)
    milliseconds = api.wait_ms(start, stop)
    seconds = max(milliseconds / 1000.0, 1e-9)
    return size * copies / seconds / 1e9, link


def median(values: List[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2.0


def copy_one(api: Any, gpu: Gpu, directions: List[str], size: int,
             nvml: Optional[Nvml] = None) -> JSONDict:
    """Measure pinned copies to and from one GPU; free everything on every path."""
    result = {"gpu": gpu.describe(), "link": pci_link(gpu.bdf)}  # type: JSONDict
    if nvml is not None and nvml.lib is not None:
        result["link"]["nvml"] = nvml.link(gpu.bdf)
    local = parse_cpulist(result["link"].get("local_cpulist"))
    before = allowed_cpus()
    # Pin first: the pinned buffer is then placed on the GPU's node when first touched
    # (as nvbandwidth does with nvmlDeviceSetCpuAffinity).
    result["pinned_to_local_cpus"] = pin(local) if local else False
    host = device = stream = start = stop = 0
    free_before = None  # type: Optional[int]
    api.open(gpu.index)
    try:
        free_before, total = api.mem_info()
        host = api.alloc_host(size)
        device = api.alloc_device(size)
        stream, start, stop = api.stream(), api.event(), api.event()
        free_during, _ = api.mem_info()
        result["gpu_mem_used_bytes"] = max(0, free_before - free_during)
        result["gpu_mem_total_bytes"] = total
        for direction in directions:
            # The first copy wakes a link that idles at a lower speed (it retrains).
            api.copy(direction, device, host, size)
            trials, links = [], []
            for _ in range(TRIALS):
                gbps, link = time_copies(api, direction, device, host, size, COPIES, stream,
                                         start, stop, gpu.bdf, nvml)
                trials.append(gbps)
                links.append(link)
            result[direction] = {"gbps": median(trials), "trials": trials,
                                 "link_during": links[-1], "bytes": size, "copies": COPIES}
    finally:
        for free, handle in ((api.destroy_event, stop), (api.destroy_event, start),
                             (api.destroy_stream, stream), (api.free_device, device),
                             (api.free_host, host)):
            if handle:
                try:
                    free(handle)
                except DriverError as exc:
                    result.setdefault("cleanup_errors", []).append(str(exc))
        if before:
            pin(before)
    if free_before is not None:
        try:
            free_after, _ = api.mem_info()
            # What the probe still holds once it freed its buffers (0 unless it leaked).
            result["gpu_mem_left_bytes"] = max(0, free_before - free_after)
        except DriverError:
            pass
    return result


def probe_copy(options: JSONDict) -> JSONDict:
    """h2d and d2h: pinned copies per GPU, one GPU at a time."""
    api = open_driver()
    api.init()
    gpus = choose_gpus(api, options.get("gpus"))
    directions = [d for d in ("h2d", "d2h") if d in options.get("directions", ["h2d", "d2h"])]
    size = int(options.get("bytes") or COPY_BYTES)
    answers = []
    nvml = Nvml() if api.kind == "cuda" else None
    try:
        for gpu in gpus:
            state = nvml.busy(gpu.bdf) if nvml is not None else {
                "known": False, "reason": "no busy check for HIP GPUs"}
            busy = refusal(state) if state.get("known") else ""
            if busy and not options.get("force"):
                answers.append({"gpu": gpu.describe(), "link": pci_link(gpu.bdf),
                                "refused": busy, "busy": state})
                continue
            progress("copy: GPU {} ({})".format(gpu.index, gpu.bdf))
            try:
                answer = copy_one(api, gpu, directions, size, nvml)
            except DriverError as exc:
                answer = {"gpu": gpu.describe(), "link": pci_link(gpu.bdf),
                          "error": str(exc)}
            answer["busy"] = state
            answers.append(answer)
    finally:
        api.close_all()
        if nvml is not None:
            nvml.close()
    return {"driver": api.kind, "driver_version": api.version, "gpus": answers}


# -- probe: peer to peer ----------------------------------------------------------------


def probe_p2p(options: JSONDict) -> JSONDict:
    """Bandwidth and latency between each ordered pair of GPUs, peer access on and off."""
    api = open_driver()
    if api.kind != "cuda":
        raise ProbeSkip("the p2p probe speaks CUDA only; {} GPUs are not measured".format(
            api.kind.upper()))
    api.init()
    gpus = choose_gpus(api, options.get("gpus"))
    if len(gpus) < 2:
        raise ProbeSkip("one GPU: peer-to-peer needs two or more")
    gpus = gpus[:8]
    for gpu in gpus:
        state = busy_state(gpu.bdf)
        busy = refusal(state) if state.get("known") else ""
        if busy and not options.get("force"):
            raise ProbeSkip("GPU {} ({}) is busy: {}".format(gpu.index, gpu.bdf, busy))
    size = int(options.get("bytes") or P2P_BYTES)
    buffers = {}  # type: Dict[int, int]
    streams = {}  # type: Dict[int, Tuple[int, int, int]]
    pairs = []
    try:
        for gpu in gpus:
            api.open(gpu.index)
            buffers[gpu.index] = api.alloc_device(size)
            streams[gpu.index] = (api.stream(), api.event(), api.event())
        for src in gpus:
            for dst in gpus:
                if src.index == dst.index:
                    continue
                pair = {"src": src.bdf, "dst": dst.bdf, "src_index": src.index,
                        "dst_index": dst.index,
                        "can_access": api.can_access_peer(dst.index, src.index)}  # type: JSONDict
                modes = [False, True] if pair["can_access"] else [False]
                for on in modes:
                    progress("p2p: {} -> {} peer access {}".format(
                        src.index, dst.index, "on" if on else "off"))
                    api.peer_access(dst.index, src.index, on)
                    api.peer_access(src.index, dst.index, on)
                    api.open(dst.index)
                    stream, start, stop = streams[dst.index]
                    api.copy_peer(buffers[dst.index], dst.index, buffers[src.index], src.index,
                                  size, stream)  # warm-up
                    api.record(start, stream)
                    for _ in range(COPIES):
                        api.copy_peer(buffers[dst.index], dst.index, buffers[src.index],
                                      src.index, size, stream)
                    api.record(stop, stream)
                    seconds = max(api.wait_ms(start, stop) / 1000.0, 1e-9)
                    api.record(start, stream)
                    for _ in range(LATENCY_COPIES):
                        api.copy_peer(buffers[dst.index], dst.index, buffers[src.index],
                                      src.index, LATENCY_BYTES, stream)
                    api.record(stop, stream)
                    latency_us = api.wait_ms(start, stop) * 1000.0 / LATENCY_COPIES
                    pair["on" if on else "off"] = {
                        "gbps": size * COPIES / seconds / 1e9, "latency_us": latency_us}
                    if on:
                        api.peer_access(dst.index, src.index, False)
                        api.peer_access(src.index, dst.index, False)
                pairs.append(pair)
    finally:
        for index, pointer in buffers.items():
            try:
                api.open(index)
                api.free_device(pointer)
            except DriverError:
                pass
        for index, (stream, start, stop) in streams.items():
            try:
                api.open(index)
                api.destroy_event(start)
                api.destroy_event(stop)
                api.destroy_stream(stream)
            except DriverError:
                pass
        api.close_all()
    return {"driver": api.kind, "driver_version": api.version,
            "gpus": [g.describe() for g in gpus],
            "links": {g.bdf: pci_link(g.bdf) for g in gpus}, "pairs": pairs}


# -- probe: CPU wake-up latency ---------------------------------------------------------

PR_SET_TIMERSLACK = 29


def set_timer_slack(nanoseconds: int) -> bool:
    """Set this thread's timer slack; the default 50 us would add ~50 us to every wake."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(nanoseconds), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def percentile(ordered: List[float], fraction: float) -> float:
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def wake_loop(wakes: int, period_s: float) -> JSONDict:
    """Sleep to ``wakes`` absolute deadlines ``period_s`` apart; return the overshoots (us)."""
    clock = time.monotonic
    overshoot = []
    target = clock() + period_s
    for _ in range(wakes):
        left = target - clock()
        if left > 0:
            time.sleep(left)
        now = clock()
        overshoot.append((now - target) * 1e6)
        target = max(target + period_s, now + period_s / 2)
    overshoot.sort()
    return {"wakes": wakes, "p50_us": percentile(overshoot, 0.50),
            "p99_us": percentile(overshoot, 0.99), "p999_us": percentile(overshoot, 0.999),
            "max_us": overshoot[-1], "min_us": overshoot[0],
            "mean_us": sum(overshoot) / len(overshoot)}


def deepest_cstate(cpu: int) -> JSONDict:
    """Return the deepest enabled idle state of a CPU and its exit latency (us)."""
    base = os.path.join(SYS, "devices", "system", "cpu", "cpu{}".format(cpu), "cpuidle")
    deepest = {}  # type: JSONDict
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith("state"))
    except OSError:
        return deepest
    for name in names:
        if read_small(os.path.join(base, name, "disable")) == "1":
            continue
        latency = read_small(os.path.join(base, name, "latency"))
        if latency is not None and latency.isdigit():
            if int(latency) >= int(deepest.get("latency_us", -1)):
                deepest = {"state": read_small(os.path.join(base, name, "name")) or name,
                           "latency_us": int(latency)}
    return deepest


def probe_wakeup(options: JSONDict) -> JSONDict:
    """Timer wake-up overshoot on one CPU of each NUMA node (of each CPU group)."""
    wakes = max(10, min(int(options.get("wakeups") or 3000), 100000))
    period = 200e-6
    nodes = numa_nodes() or {0: allowed_cpus()}
    allowed = set(allowed_cpus())
    slack = set_timer_slack(1)
    groups = []
    before = allowed_cpus()
    qos_path = "/dev/cpu_dma_latency"
    try:
        for node, cpus in sorted(nodes.items()):
            usable = [c for c in cpus if c in allowed]
            if not usable:
                continue
            # Not CPU 0 where the node has others: it takes the timer and most IRQs.
            cpu = usable[1] if len(usable) > 1 and usable[0] == 0 else usable[0]
            progress("wakeup: node {} CPU {}".format(node, cpu))
            pin([cpu])
            policy = "other"
            try:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
                policy = "fifo"
            except (OSError, AttributeError):
                pass  # EPERM even as root where RT time is not granted: said, not hidden
            try:
                group = {"node": node, "cpu": cpu, "policy": policy,
                         "as_is": wake_loop(wakes, period), "cstate": deepest_cstate(cpu)}
                try:
                    qos = os.open(qos_path, os.O_WRONLY)
                except OSError as exc:
                    group["qos"] = {"skipped": "{}: {}".format(qos_path, exc.strerror)}
                else:
                    try:
                        # Held open, 0 asks every CPU to stay out of deep idle states, as
                        # tuned's force_latency does; closing it drops the request.
                        os.write(qos, struct.pack("i", 0))
                        group["qos"] = wake_loop(wakes, period)
                    finally:
                        os.close(qos)
            finally:
                if policy == "fifo":
                    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            groups.append(group)
    finally:
        if before:
            pin(before)
    return {"groups": groups, "timer_slack_1ns": slack, "period_us": period * 1e6,
            "hypervisor": hypervisor(),
            "cpuidle_driver": read_small(os.path.join(
                SYS, "devices", "system", "cpu", "cpuidle", "current_driver"))}


# -- probe: NUMA local vs remote memory -------------------------------------------------

#: set_mempolicy(2) by architecture (no libc wrapper without libnuma).
SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "s390x": 270}
MPOL_DEFAULT, MPOL_BIND = 0, 2


def set_mempolicy(mode: int, node: Optional[int]) -> None:
    number = SET_MEMPOLICY.get(platform.machine())
    if number is None:
        raise ProbeSkip("set_mempolicy's system call number is not known for " +
                        platform.machine())
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if node is None:
        result = libc.syscall(number, mode, None, ctypes.c_ulong(0))
    else:
        words = node // 64 + 1
        mask = (ctypes.c_ulong * words)()
        mask[node // 64] = 1 << (node % 64)
        result = libc.syscall(number, mode, mask, ctypes.c_ulong(words * 64 + 1))
    if result != 0:
        raise OSError(ctypes.get_errno(), "set_mempolicy: " + os.strerror(ctypes.get_errno()))


def copy_bandwidth(cpus: List[int], memory_node: int, size: int) -> float:
    """Return GB/s of one thread on ``cpus`` copying between buffers on ``memory_node``."""
    import mmap

    pin(cpus)
    src = mmap.mmap(-1, size)
    dst = mmap.mmap(-1, size)
    try:
        set_mempolicy(MPOL_BIND, memory_node)
        try:
            chunk = b"\x5a" * (1 << 20)
            for offset in range(0, size - len(chunk) + 1, len(chunk)):
                # First touch places the pages on the node the policy binds.
                src[offset:offset + len(chunk)] = chunk
                dst[offset:offset + len(chunk)] = chunk
        finally:
            set_mempolicy(MPOL_DEFAULT, None)
        to_buffer = (ctypes.c_char * size).from_buffer(dst)
        from_buffer = (ctypes.c_char * size).from_buffer(src)
        best = 0.0
        for _ in range(3):
            started = time.perf_counter()
            ctypes.memmove(to_buffer, from_buffer, size)
            best = max(best, size / max(time.perf_counter() - started, 1e-9) / 1e9)
        # The exported views must go before the maps can close.
        del to_buffer, from_buffer
        return best
    finally:
        src.close()
        dst.close()


def gpu_nodes() -> Dict[str, int]:
    """Return the NUMA node sysfs gives each display/3D controller (a GPU)."""
    base = os.path.join(SYS, "bus", "pci", "devices")
    found = {}  # type: Dict[str, int]
    try:
        names = os.listdir(base)
    except OSError:
        return found
    for name in names[:4096]:
        kind = read_small(os.path.join(base, name, "class")) or ""
        if kind.startswith("0x03"):
            node = read_small(os.path.join(base, name, "numa_node")) or "-1"
            try:
                found[name] = int(node)
            except ValueError:
                found[name] = -1
    return found


def probe_numa(options: JSONDict) -> JSONDict:
    """Host memory bandwidth from the GPU's node's CPUs: to its own memory and a remote one."""
    nodes = numa_nodes()
    if len(nodes) < 2:
        raise ProbeSkip("one NUMA node: nothing is remote")
    size = int(options.get("bytes") or NUMA_BYTES)
    gpus = gpu_nodes()
    local_nodes = sorted({n for n in gpus.values() if n in nodes}) or [min(nodes)]
    before = allowed_cpus()
    results = []
    try:
        for local in local_nodes[:8]:
            remote = next(n for n in sorted(nodes) if n != local)
            progress("numa: CPUs of node {}, memory of node {} and {}".format(
                local, local, remote))
            results.append({
                "node": local, "remote_node": remote,
                "gpus": sorted(b for b, n in gpus.items() if n == local),
                "local_gbps": copy_bandwidth(nodes[local], local, size),
                "remote_gbps": copy_bandwidth(nodes[local], remote, size), "bytes": size})
    finally:
        if before:
            pin(before)
    return {"nodes": sorted(nodes), "results": results,
            "gpu_numa_nodes": gpus}


# -- running a probe in a child with a deadline -----------------------------------------

RUNNERS: Dict[str, Callable[[JSONDict], JSONDict]] = {
    "copy": probe_copy, "p2p": probe_p2p, "wakeup": probe_wakeup, "numa": probe_numa}
#: Address space a probe that loads no GPU driver may use. A GPU probe gets no such
#: limit: the driver reserves virtual address ranges the size of every GPU's memory and
#: the host's for unified addressing, far past any sensible cap; its own allocations are
#: fixed (64 MiB a buffer) instead.
MEMORY_LIMIT = {"wakeup": 1 << 30, "numa": 2 << 30}


def _child(name: str, options: JSONDict, write_fd: int) -> None:
    try:
        limit = MEMORY_LIMIT.get(name)
        if limit is not None:
            import resource

            vm = read_small("/proc/self/statm") or "0"
            used = int(vm.split()[0]) * os.sysconf("SC_PAGE_SIZE")
            resource.setrlimit(resource.RLIMIT_AS, (used + limit, used + limit))
        answer = {"status": "ok", "data": RUNNERS[name](options)}  # type: JSONDict
    except ProbeSkip as exc:
        answer = {"status": "skip", "reason": str(exc)}
    except MemoryError:
        answer = {"status": "error", "reason": "ran out of its memory limit"}
    except BaseException as exc:  # the child must always answer
        answer = {"status": "error", "reason": "{}: {}".format(type(exc).__name__, exc)[:400]}
    data = json.dumps(answer).encode()
    view = memoryview(data)
    while view:
        try:
            written = os.write(write_fd, view)
        except OSError:
            break
        view = view[written:]


def run_bounded(name: str, options: JSONDict, timeout: float) -> JSONDict:
    """Run probe ``name`` in a forked child; kill and reap it at ``timeout`` seconds."""
    started = time.monotonic()
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: measure, answer through the pipe, leave at once
        code = 0
        try:
            os.close(read_fd)
            _child(name, options, write_fd)
        except BaseException:  # nothing may run past this point
            code = 70
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks = []
    size = 0
    answer = None  # type: Optional[JSONDict]
    try:
        while True:
            left = started + timeout - time.monotonic()
            if left <= 0:
                answer = {"status": "timeout",
                          "reason": "stopped after {:g} s (the deadline)".format(timeout)}
                break
            ready, _, _ = select.select([read_fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_ANSWER:
                answer = {"status": "error", "reason": "the probe's answer was too long"}
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
        if answer is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _, status = _reap(pid)
    if answer is None:
        try:
            answer = json.loads(b"".join(chunks).decode())
        except ValueError:
            answer = {"status": "error",
                      "reason": "the probe ended without an answer (wait status {})".format(
                          status)}
    answer["wall_s"] = time.monotonic() - started
    answer["child_pid"] = pid
    return answer


def _reap(pid: int) -> Tuple[int, int]:
    while True:
        try:
            return os.waitpid(pid, 0)
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            return pid, -1


def parse_args(argv: List[str]) -> JSONDict:
    """Read ``--name value`` pairs (the caller writes the command line, not a person)."""
    options = {"probe": "", "timeout": 60.0, "force": False}  # type: JSONDict
    items = list(argv)
    while items:
        key = items.pop(0)
        if key == "--force":
            options["force"] = True
            continue
        if not key.startswith("--") or not items:
            raise SystemExit("probe: bad argument " + repr(key))
        value = items.pop(0)
        name = key[2:]
        if name in ("gpus",):
            options[name] = [int(v) for v in value.split(",") if v.strip()]
        elif name == "directions":
            options[name] = [v for v in value.split(",") if v]
        elif name in ("timeout",):
            options[name] = float(value)
        elif name in ("wakeups", "bytes"):
            options[name] = int(value)
        elif name in ("probe", "sys"):
            options[name] = value
        else:
            raise SystemExit("probe: unknown option " + repr(key))
    if options["probe"] not in PROBES:
        raise SystemExit("probe: unknown probe " + repr(options["probe"]))
    return options


def main(argv: List[str]) -> int:
    global SYS
    options = parse_args(argv)
    SYS = options.get("sys") or SYS
    answer = run_bounded(options["probe"], options, float(options["timeout"]))
    document = {"protocol": PROTOCOL, "probe": options["probe"], "answer": answer,
                "host": socket.gethostname()[:255], "kernel": platform.release()[:255],
                "python": platform.python_version(), "machine": platform.machine()}
    sys.stdout.write("\n" + MARK + json.dumps(document) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
