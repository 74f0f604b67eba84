"""lxc.device_majors: LXC containers whose device rules do not let them open their GPUs.

``nvidia-uvm``, ``nvidia-caps`` and the other NVIDIA helper drivers, and AMD's
``kfd``, get a dynamic character major at module load; it can change with every boot
or driver update. A container that bind-mounts ``/dev/nvidia-uvm`` and allows
``c 509:* rwm`` keeps working until the major moves, then CUDA (or ROCm) fails inside
the container. The check judges what each container really gets, as LXC builds it:

- the settings in order, every ``lxc.include`` followed as LXC follows it (a file, a
  directory of ``*.conf``, nested, links followed inside the paths the audit reads, a
  relative path from where ``pct start`` runs LXC; a loop, a missing file or a directory
  read as a file is a config LXC refuses), for Proxmox the config ``pct start``
  generates (the distribution's common config, the userns config of an unprivileged
  container, one allow rule per devN entry at its node's numbers, then the container's
  own ``lxc.*`` lines);
- the GPU nodes it gets: bind mounts, devN entries, and the nodes LXC's ``nvidia``
  mount hook binds (hooks/nvidia, through ``nvidia-container-cli --no-cgroups``:
  the config's own rules must allow them);
- the rules as the device controller applies them: on cgroup v2 LXC's device
  program (cgroup2_devices.c), on v1 the kernel's devices controller;
- for a container that runs now, what it runs with: Proxmox's
  ``/var/lib/lxc/<id>/config`` written at its last start, or the cgroup v1
  ``devices.list``; Incus and LXD write the config of each start to
  ``<logs>/<name>/lxc.conf``. A config corrected on disk leaves a running container
  with its old rule until it restarts (the finding says so, and the fix is the
  restart); a config broken after the start leaves it working until then. Where no
  file shows what it started with (plain LXC on cgroup2, a missing generated config),
  that part is a skip that says so.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from auditor import environment as where
from auditor.check import Check, CheckOptions, Trigger
from auditor.checks.lib.lxc_config import (
    ALLOW_KEYS,
    DENY_KEYS,
    LXC_CONFIG_DIR,
    MOUNT_KEY,
    PLAIN_LXC_GLOB,
    PROC_CGROUP,
    PROC_DEVICES,
    PVE_ROOT,
    PVE_START_DIR,
    READS,
    CgroupMode,
    ConfigLine,
    Container,
    DeviceRule,
    Entry,
    Flavour,
    MainSection,
    cgroup_mode,
    config_entries,
    devices_list,
    environment_of,
    find_containers,
    format_line,
    is_dev_key,
    listdir,
    load_entries,
    mount_hooks,
    parse_dev_entry,
    parse_device_rule,
    parse_devices_list,
    parse_main_section,
    parse_mount_entry,
    parse_proc_devices,
    proxmox_common_conf,
    proxmox_entries,
    running,
)
from auditor.checks.lib.lxc_devices import (
    DYNAMIC_MAJORS,
    FIXED_MAJORS,
    NEED,
    GpuNode,
    Rule,
    View,
    node_driver,
    permits,
    restart_command,
)
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import lazy_re

if TYPE_CHECKING:
    from auditor.remedy import Advice, FixContext, Remedy, Step

#: Directories of GPU nodes that a config may bind whole.
_NODE_DIRS = frozenset({"/dev/dri", "/dev/nvidia-caps", "/dev/nvidia-caps-imex-channels"})
#: The nodes LXC's nvidia hook binds besides the GPUs (libnvidia-container's driver
#: devices): the control node and the unified memory nodes.
_HOOK_DRIVER_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
_GPU_NODE = lazy_re(r"nvidia([0-9]{1,4})")
_CONTAINER = lazy_re(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
#: The type and major at the start of a device rule's value (``c 509:* rwm``).
_RULE_MAJOR = lazy_re(r"[cb]\s+([0-9]+)(?=:)")

class LxcDeviceMajors(Check[CheckOptions]):
    """LXC containers must allow the GPU drivers' current device majors."""

    id: ClassVar[str] = "lxc.device_majors"
    severity: ClassVar[Severity] = Severity.CRITICAL
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        PROC_DEVICES,
        PROC_CGROUP,
        "/etc/hostname",
        f"{PVE_ROOT}/lxc",
        f"{PVE_ROOT}/lxc/*.conf",
        f"{PVE_ROOT}/local",
        f"{PVE_ROOT}/local/lxc/*.conf",
        f"{PVE_ROOT}/nodes/*/lxc/*.conf",
        PLAIN_LXC_GLOB,
        *READS,
        "/dev/nvidia*",
        "/dev/nvidia-caps/*",
        "/dev/nvidia-caps-imex-channels/*",
        "/dev/kfd",
        "/dev/dri",
        "/dev/dri/*",
        *where.READS,
    )
    rationale: ClassVar[str] = (
        "nvidia-uvm, nvidia-caps and AMD's kfd get a dynamic character major when the module "
        "loads, and it can change after a reboot into a new kernel or driver. A container that "
        "bind-mounts /dev/nvidia-uvm (or /dev/kfd) but whose device rules still name the old "
        "major cannot open the node: CUDA reports no device inside the container (ROCm finds "
        "no GPU) while nvidia-smi, which needs only /dev/nvidia0 and /dev/nvidiactl at the "
        "fixed major 195, still works. A running container keeps the rules it started with "
        "until it is restarted."
    )
    remedy: ClassVar[str] = (
        "Rewrite the stale allow line to the major in /proc/devices (for example "
        "'lxc.cgroup2.devices.allow: c 238:* rwm') where it is written (the container's main "
        "section, or the file it includes) and restart the container (pct reboot <id>). On "
        "Proxmox the lasting fix is to pass the nodes as 'devN: /dev/nvidia-uvm' entries, "
        "which are allowed at the live major on every start."
    )

    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE, Trigger.GPU_NODE})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        containers, note = find_containers(host)
        if note:
            yield self.skipped("lxc", note)
        if not containers:
            if note:
                return
            env = where.environment(host)
            if env.in_container:
                yield self.skipped(
                    "lxc", f"no LXC containers: the audit runs {env.inside()}, where "
                    "the host's containers and their configs are not visible; audit the host",
                    evidence={"environment": env.describe()})
            else:
                yield self.skipped("lxc", "no LXC containers")
            return
        devices_text = host.read_optional(PROC_DEVICES)
        drivers = parse_proc_devices(devices_text or "")
        mode = cgroup_mode(host.read_optional(PROC_CGROUP))
        proxmox = any(c.flavour == "proxmox" for c in containers) or host.is_dir(PVE_ROOT)
        context = _Context(host, drivers, mode, proxmox, devices_text is not None)
        for container in containers:
            yield from self._judge(context, container)

    # -- one container ---------------------------------------------------------------

    def _judge(self, ctx: _Context, container: Container) -> Iterator[Finding]:
        base = {"config": container.path, "flavour": container.kind}
        if container.manager:
            yield from self._judge_instance(ctx, container, base)
            return
        text = self._read_config(ctx.host, container)
        if isinstance(text, Finding):
            yield text
            return
        is_running = running(ctx.host, container.id)
        if is_running:
            base["running"] = "yes"
        if container.flavour == "proxmox":
            section = parse_main_section(text, "proxmox")
            dev_nodes, dev_rules = self._dev_entries(ctx, section)
            entries, unprivileged = proxmox_entries(section, container.path, dev_rules)
            if entries and entries[0].key == "lxc.include":
                values = {line.key: line.value or "" for line in section.lines if line.key}
                common = proxmox_common_conf(ctx.host, values.get("ostype", "").strip())
                entries[0] = Entry("lxc.include", common, origin=entries[0].origin)
        else:
            section = parse_main_section(text, "lxc")
            dev_nodes = []
            entries = config_entries(text, container.path)
            unprivileged = False
        cwd = PVE_START_DIR if container.flavour == "proxmox" else None
        view = self._view(ctx, "config", container.path, entries, dev_nodes, unprivileged,
                          cwd=cwd)
        if view.loaded.fatal:
            refused = view.loaded.fatal[0]
            again = (" again: it runs now with the config of its last start, and a restart "
                     "would fail" if is_running else "")
            fix = (f"create {refused.path} or remove the lxc.include line that names it"
                   if refused.why == "does not exist"
                   else f"correct or remove the lxc.include that reaches {refused.path}")
            yield self.warned(
                container.id,
                f"LXC refuses to load this config: lxc.include {refused.path} {refused.why} "
                "(confile.c set_config_includefiles fails, and the config with it), so the "
                f"container does not start{again}",
                observed=f"lxc.include {refused.path}", expected="an include LXC can read",
                fix=fix,
                evidence={**base, "include": refused.path, "include_problem": refused.why},
            )
            return
        live, live_unknown = (self._running_view(ctx, container, view) if is_running
                              else (None, ""))
        nodes = view.nodes or (live.nodes if live is not None else [])
        if not nodes:
            yield self.passed(container.id, "no GPU device nodes are mounted or passed through",
                              evidence=base)
            return
        if view.hook is not None and not view.unprivileged:
            yield self._privileged_hook(container, view, base)
            return
        unknown = [n for n in view.nodes if n.major is None]
        for node in unknown:
            why = (f"{PROC_DEVICES} has no {node.driver!r} line (module not loaded?)"
                   if ctx.have_proc_devices else f"{PROC_DEVICES} is unreadable")
            yield self.skipped(
                container.id,
                f"cannot judge {node.path}: its current major is unknown, {why}",
                evidence={**base, "device": node.path, "driver_name": node.driver},
            )
        failing = [n for n in view.nodes if n.major is not None and not permits(view, n)]
        if failing and view.loaded.unknown:
            yield self.skipped(
                container.id,
                f"cannot judge {', '.join(n.path for n in failing)}: the config includes what "
                f"this audit cannot read, which may allow them: {view.loaded.unknown[0]}",
                evidence={**base, "include": view.loaded.unknown[0]},
            )
            return
        if failing:
            yield from self._failures(ctx, container, section, view, failing, base, live,
                                      live_unknown)
            return
        stale_run = ([n for n in live.nodes if n.major is not None and not permits(live, n)]
                     if live is not None else [])
        if stale_run and live is not None:
            yield from self._stale_run(container, view, live, stale_run, base)
            return
        if not unknown:
            yield self._pass(container, view, live, base)
        if live is None and is_running:
            # Missing is not absent: the config passes, but what the running container
            # was started with is not seen, so its present access is not judged.
            yield self.skipped(
                container.id,
                f"it runs now, and what it was started with is unknown: {live_unknown}; its "
                f"config on disk allows its GPU nodes, which a restart "
                f"({' '.join(restart_command(container.kind, container.id))}) applies",
                aspect="running", evidence={**base, "view": "running"},
            )

    def _read_config(self, host: Host, container: Container) -> str | Finding:
        path = container.path
        base = {"config": path, "flavour": container.kind}
        entry = host.stat(path)
        if entry is None or entry.kind != "file":
            # A FIFO or device named config would block or never end: read files only.
            kind = "missing" if entry is None else f"a {entry.kind}, not a file"
            return self.skipped(container.id, f"cannot read {path}: {kind}", evidence=base)
        try:
            return host.read_text(path)
        except OSError as exc:
            return self.skipped(container.id, f"cannot read {path}: {exc}", evidence=base)

    def _view(self, ctx: _Context, label: str, source: str, entries: list[Entry],
              dev_nodes: list[GpuNode], unprivileged: bool, *,
              targets: bool = False, cwd: str | None = None) -> View:
        loaded = load_entries(ctx.host, entries, proxmox=ctx.proxmox, cwd=cwd)
        rules, ignored = _effective_rules(ctx.host, loaded.entries, ctx.mode)
        nodes: dict[str, GpuNode] = {}
        for node in [*self._mounted_nodes(ctx, loaded.entries, targets), *dev_nodes]:
            nodes.setdefault(node.path, node)
        hook = _nvidia_hook(loaded.entries)
        if hook is not None:
            for node in self._hook_nodes(ctx, loaded.entries):
                nodes.setdefault(node.path, node)
        if not unprivileged:
            unprivileged = any(e.key == "lxc.idmap" and e.value for e in loaded.entries)
        return View(label, source, rules, "bpf" if ctx.mode == "v2" else "kernel",
                    list(nodes.values()), ignored, loaded,
                    hook if hook is not None and self._hook_hands_gpus(loaded.entries) else None,
                    unprivileged)

    def _running_view(self, ctx: _Context, container: Container, config: View
                      ) -> tuple[View | None, str]:
        """Return what a running container runs with where a file shows it, else why not."""
        if container.flavour == "proxmox":
            # PVE::LXC update_lxc_config writes it at every pct start (vm_start), devN rules
            # resolved, the container's own lxc.* lines copied as they were. (A later `pct
            # set` writes it again from the config of that moment; its lxc.include lines
            # are read again at the next start only.)
            path = f"/var/lib/lxc/{container.id}/config"
            entry = ctx.host.stat(path)
            if entry is None or entry.kind != "file":
                what = "missing" if entry is None else f"a {entry.kind}, not a file"
                return None, f"{path}, which pct start writes, is {what}"
            try:
                text = ctx.host.read_text(path)
            except OSError as exc:
                return None, f"{path} cannot be read ({exc})"
            dev_nodes = [n for n in config.nodes if n.via == "devN"]
            live = self._view(ctx, "running", path, config_entries(text, path), dev_nodes,
                              config.unprivileged, cwd=PVE_START_DIR)
            if live.loaded.fatal:
                refused = live.loaded.fatal[0]
                return None, (f"{path} includes {refused.path}, which {refused.why} now, so "
                              "what it read at its start is not on disk")
            return live, ""
        listed = devices_list(ctx.host, container.id)
        if listed is None:
            if ctx.mode == "v1":
                return None, "its cgroup v1 devices.list is not readable"
            # LXC keeps the config it started with in its monitor (lxc-info -c asks it over
            # the command socket); cgroup2 enforces the rules with a BPF program that no
            # cgroup file lists.
            return None, (f"LXC writes no file of the config it started with, and cgroup2's "
                          f"device program cannot be read back ('lxc-info -n {container.id} "
                          "-c lxc.cgroup2.devices.allow' shows its rules)")
        path, text = listed
        rules = [Rule(True, rule, ConfigLine(0, rule.format()), path, path)
                 for rule in parse_devices_list(text)]
        return View("running", path, rules, "list", config.nodes, loaded=config.loaded,
                    unprivileged=config.unprivileged), ""

    def _judge_instance(self, ctx: _Context, container: Container,
                        base: dict[str, str]) -> Iterator[Finding]:
        """Judge an Incus or LXD instance: by the config its manager wrote at its start."""
        manager = "Incus" if container.manager == "incus" else "LXD"
        if not running(ctx.host, container.id):
            yield self.passed(
                container.id,
                f"{manager} instance, not running: {manager} adds its GPU devices with the "
                "majors the driver has when it starts the instance, so no stale major can be "
                "written down while it is stopped",
                evidence=base,
            )
            return
        base["running"] = "yes"
        text = ctx.host.read_optional(container.path)
        if text is None:
            yield self.skipped(
                container.id,
                f"{manager} instance is running, but the LXC config {manager} generated at its "
                f"start ({container.path}) is not readable: what it runs with is unknown",
                evidence=base,
            )
            return
        view = self._view(ctx, "running", container.path, config_entries(text, container.path),
                          [], True, targets=True)
        nodes = [n for n in view.nodes if n.major is not None]
        if not nodes:
            yield self.passed(container.id, f"{manager} instance has no GPU devices "
                              f"(checked {container.path})", evidence=base)
            return
        failing = [n for n in nodes if not permits(view, n)]
        if failing:
            yield from self._stale_run(container, view, view, failing, base)
            return
        majors = ", ".join(sorted({f"{n.driver} {n.major}" for n in nodes}))
        yield self.passed(
            container.id,
            f"{manager} instance runs with {len(nodes)} GPU nodes allowed at their current "
            f"majors ({majors}; checked the config {manager} generated at its start, "
            f"{container.path})",
            evidence={**base, "devices": " ".join(n.path for n in nodes)},
        )

    # -- what the container gets -----------------------------------------------------------

    def _dev_entries(self, ctx: _Context, section: MainSection
                     ) -> tuple[list[GpuNode], list[tuple[str, str, str]]]:
        """Return the GPU nodes of devN entries and the rules Proxmox writes for them."""
        nodes: list[GpuNode] = []
        rules: list[tuple[str, str, str]] = []
        for line in section.lines:
            if line.key is None or not is_dev_key(line.key):
                continue
            path = parse_dev_entry(line.value or "")
            if path is None:
                continue
            path = posixpath.normpath(path)
            mapped = node_driver(path)
            numbers = ctx.host.device_numbers(path)
            if numbers is None and mapped is not None:
                found = _from_driver(path, mapped, ctx.drivers)
                if found.major is not None and found.minor is not None:
                    numbers = (found.major, found.minor)
            if mapped is not None:
                major, minor = numbers if numbers is not None else (None, mapped[1])
                nodes.append(GpuNode(path, mapped[0], major, minor, "devN entry", "devN"))
            if numbers is not None:
                read_only = any(item.strip() in ("deny-write=1", "deny-write=true")
                                for item in (line.value or "").split(","))
                stat = ctx.host.stat(path)
                kind = "b" if stat is not None and stat.kind == "blk" else "c"
                rule = f"{kind} {numbers[0]}:{numbers[1]}"
                rules.append((line.key, f"{rule} {'r' if read_only else 'rw'}",
                              f"{rule} w" if read_only else ""))
        return nodes, rules

    def _mounted_nodes(self, ctx: _Context, entries: list[Entry], targets: bool
                       ) -> list[GpuNode]:
        nodes: dict[str, GpuNode] = {}
        for entry in entries:
            if entry.key != MOUNT_KEY:
                continue
            mount = parse_mount_entry(entry.value)
            if mount is None or not mount.is_bind:
                continue
            source = posixpath.normpath(mount.source) if mount.source.startswith("/") else ""
            if source.startswith("/dev/"):
                found = _expand(ctx.host, source, ctx.drivers)
            elif targets and mount.target.lstrip("/").startswith("dev/"):
                # Incus binds its own copy of each node (made at start) onto /dev/<name>:
                # judge the driver the target names at the major it has now.
                target = posixpath.normpath("/" + mount.target.lstrip("/"))
                mapped = node_driver(target)
                found = [] if mapped is None else [_from_driver(target, mapped, ctx.drivers,
                                                                ctx.host)]
            else:
                continue
            for node in found:
                nodes.setdefault(node.path, node)
        return list(nodes.values())

    def _hook_hands_gpus(self, entries: list[Entry]) -> bool:
        """Return whether the nvidia hook binds GPUs, as hooks/nvidia decides from its env."""
        return _visible(environment_of(entries)) is not None

    def _hook_nodes(self, ctx: _Context, entries: list[Entry]) -> list[GpuNode]:
        """Return the nodes LXC's nvidia hook binds into the container.

        hooks/nvidia runs ``nvidia-container-cli configure --device=$NVIDIA_VISIBLE_DEVICES``
        (with ``--no-cgroups`` in the user namespace it requires), which binds the driver's
        nodes (nvidiactl, nvidia-uvm, nvidia-uvm-tools), the GPUs asked for, and the MIG
        capability nodes where MIG devices or capabilities are asked for.
        """
        env = environment_of(entries)
        visible = _visible(env)
        if visible is None:
            return []
        paths = list(_HOOK_DRIVER_NODES)
        gpus = sorted((int(m.group(1)), p) for p in ctx.host.glob("/dev/nvidia*")
                      if (m := _GPU_NODE.fullmatch(p.rsplit("/", 1)[1])))
        wanted = [item.strip() for item in visible.split(",") if item.strip()]
        if visible == "all" or any(not w.isdigit() for w in wanted if w != "none"):
            # UUIDs and MIG names map to GPUs through NVML, which a file audit cannot ask;
            # every GPU node shares the major 195.
            paths += [p for _, p in gpus]
        else:
            indices = {int(w) for w in wanted if w.isdigit() and len(w) < 5}
            paths += [p for index, p in gpus if index in indices]
        mig = any(env.get(name) for name in ("NVIDIA_MIG_CONFIG_DEVICES",
                                             "NVIDIA_MIG_MONITOR_DEVICES")) or any(
            w.startswith("MIG-") or ":" in w for w in wanted)
        if mig:
            paths += ctx.host.glob("/dev/nvidia-caps/*")
        nodes: list[GpuNode] = []
        for path in paths:
            mapped = node_driver(path)
            if mapped is None:
                continue
            numbers = ctx.host.device_numbers(path)
            node = (GpuNode(path, mapped[0], numbers[0], numbers[1], "device node")
                    if numbers is not None else _from_driver(path, mapped, ctx.drivers))
            nodes.append(GpuNode(node.path, node.driver, node.major, node.minor, node.source,
                                 "hook"))
        return nodes

    # -- verdicts --------------------------------------------------------------------------

    def _pass(self, container: Container, view: View, live: View | None,
              base: dict[str, str]) -> Finding:
        mounted = [n for n in view.nodes if n.via != "devN"]
        passed_through = [n for n in view.nodes if n.via == "devN"]
        parts: list[str] = []
        open_all = _unrestricted(view)
        if mounted:
            majors = ", ".join(sorted({f"{n.driver} {n.major}" for n in mounted}))
            how = ("GPU nodes bound by the nvidia hook" if all(n.via == "hook" for n in mounted)
                   else "bind-mounted GPU nodes")
            verb = (f"are not restricted ({open_all})" if open_all
                    else "are allowed at their current majors")
            parts.append(f"{len(mounted)} {how} {verb} ({majors})")
        if passed_through:
            parts.append(
                f"{len(passed_through)} GPU nodes are passed through as devN entries, which "
                "Proxmox allows at the live major on every start (the lasting fix)"
            )
        if live is not None:
            parts.append(f"it runs with the same access ({live.source}"
                         + (", its includes as they are on disk now" if live.loaded.included
                            else "") + ")")
        if view.loaded.unknown:
            parts.append(f"not counting an include this audit cannot read: "
                         f"{view.loaded.unknown[0]}")
        ev = {**base, "devices": " ".join(n.path for n in view.nodes)}
        if view.loaded.included:
            ev["includes"] = " ".join(view.loaded.included)
        if view.loaded.assumed:
            ev["assumed"] = " ".join(view.loaded.assumed)
        return self.passed(container.id, "; ".join(parts), evidence=ev)

    def _privileged_hook(self, container: Container, view: View,
                         base: dict[str, str]) -> Finding:
        assert view.hook is not None
        return self.failed(
            container.id,
            f"the nvidia mount hook ({view.hook.value}) hands this container its GPUs, but the "
            "container is privileged: the hook stops with 'This hook currently only works in "
            "unprivileged mode' (LXC hooks/nvidia), so the container does not start",
            observed="nvidia hook in a privileged container",
            expected="an unprivileged container, or nodes passed without the hook",
            fix=("make the container unprivileged, or pass the GPU nodes as devN entries / "
                 "bind mounts instead of the hook"),
            evidence={**base, "hook": view.hook.value, "hook_origin": view.hook.origin},
        )

    def _failures(
        self,
        ctx: _Context,
        container: Container,
        section: MainSection,
        view: View,
        failing: list[GpuNode],
        base: dict[str, str],
        live: View | None,
        live_unknown: str = "",
    ) -> Iterator[Finding]:
        stale = _stale_rules(failing, view.nodes, view.rules, ctx.drivers)
        restart = " ".join(restart_command(container.kind, container.id))
        for node in failing:
            assert node.major is not None
            candidates = stale.get(node.path, [])
            majors = sorted({r.rule.major for r in candidates if r.rule.major is not None})
            chosen = candidates[0] if len(majors) == 1 else None
            allow_key = _allow_key(section, ctx.mode, chosen)
            wanted = f"c {node.major}:* rwm"
            where_written = ""
            if chosen is not None:
                rule_text = chosen.line.text.strip()
                if chosen.path and chosen.path != container.path:
                    where_written = f" (in {chosen.origin}, which the config includes)"
                message = (
                    f"{node.path} ({node.driver}) has major {node.major} now, but the config "
                    f"allows the old major {chosen.rule.major}: {rule_text}{where_written}"
                )
                fix = (f"in {chosen.path or container.path} change {rule_text!r} to allow "
                       f"'{chosen.rule.format(node.major)}', then restart the container")
            else:
                rule_text = ""
                stale_note = (f"; stale majors it allows: {' '.join(map(str, majors))}"
                              if majors else "")
                got = {"hook": " (bound by the nvidia hook, which sets no device rule)",
                       "devN": " (a devN entry, but a later rule takes access away)"}.get(
                    node.via, "")
                message = (f"{node.path} ({node.driver}) has major {node.major} now and no "
                           f"rule of the config allows it{got}{stale_note}")
                fix = (f"add '{allow_key}: {wanted}' to the main section of {container.path}, "
                       "then restart the container")
            if view.ignored:
                message += (f"; {len(view.ignored)} lxc.cgroup.devices lines are ignored on "
                            "this pure cgroup2 host")
            runs_allowed = False
            if live is not None and node.major is not None and permits(live, node):
                # The file was broken after the start: the container works until it restarts.
                runs_allowed = True
                message += (f"; it runs now with the rules of its last start ({live.source}), "
                            "which still allow it: it breaks at its next start unless the "
                            "config is corrected")
            elif live is not None:
                message += (f"; it runs now with the rules of its last start ({live.source}), "
                            f"which do not allow it either: it stays broken until the config "
                            f"is corrected and it is restarted ({restart})")
            elif base.get("running") == "yes":
                message += (f"; it runs now, and what it was started with is unknown "
                            f"({live_unknown}): correct the config, then restart it ({restart})")
            if container.flavour == "proxmox" and node.via != "devN":
                fix += ("; lasting: pass each node in it as a devN entry"
                        if node.path in _NODE_DIRS
                        else f"; lasting: pass it as a devN entry ('devN: {node.path}')")
            ev = {
                **base,
                "device": node.path,
                "driver_name": node.driver,
                "allowed_major": " ".join(map(str, majors)),
                "current_major": str(node.major),
                "rule": rule_text,
                "rule_line": str(chosen.line.number) if chosen is not None else "",
                "allow_key": allow_key,
                "major_source": node.source,
            }
            if chosen is not None and chosen.path and chosen.path != container.path:
                ev["rule_path"] = chosen.path
            if node.via != "mount":
                ev["via"] = node.via
            if runs_allowed:
                ev["running_allows"] = "yes"
            yield self.failed(
                container.id, message,
                observed=(f"allows c {' '.join(map(str, majors))}" if majors
                          else "no allow rule for it"),
                expected=wanted, fix=fix, evidence=ev,
            )

    def _stale_run(self, container: Container, config: View, live: View,
                   failing: list[GpuNode], base: dict[str, str]) -> Iterator[Finding]:
        """Yield a failure per node a running container cannot open though its config can."""
        restart = " ".join(restart_command(container.kind, container.id))
        managed = container.manager in ("incus", "lxd")
        for node in failing:
            assert node.major is not None
            held = sorted({r.rule.major for r in live.rules
                           if r.allow and r.rule.type == "c" and r.rule.major in DYNAMIC_MAJORS
                           and (r.rule.minor is None or node.minor is None
                                or r.rule.minor == node.minor)})
            old = next((r for r in live.rules
                        if r.allow and r.rule.type == "c" and r.rule.major in held), None)
            if old is not None:
                # Name the rule it still has, where the started config writes it.
                held_text = (f": it still has the old rule '{old.line.text.strip()}' "
                             f"({old.origin or live.source})")
            else:
                held_text = (f" ({live.source}" + (f"; it allows {', '.join(map(str, held))}"
                                                   if held else "") + ")")
            if managed:
                message = (f"{node.path} ({node.driver}) has major {node.major} now, but the "
                           f"instance runs with the device rules of its start{held_text}; it "
                           f"stays broken until restarted ({restart})")
            else:
                message = (f"{node.path} ({node.driver}) has major {node.major} now and "
                           f"{config.source} allows it, but the container runs with the rules "
                           f"of its last start{held_text}; it stays broken until restarted "
                           f"({restart}): the config on disk needs no change")
            yield self.failed(
                container.id, message,
                observed=(f"runs allowing c {' '.join(map(str, held))}" if held
                          else "runs without an allow rule for it"),
                expected=f"c {node.major}:* rwm", fix=restart,
                evidence={**base, "device": node.path, "driver_name": node.driver,
                          "current_major": str(node.major), "allowed_major":
                          " ".join(map(str, held)), "view": "running",
                          "running_config": live.source, "restart": restart,
                          "major_source": node.source},
            )

    # -- the fix --------------------------------------------------------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Point each stale allow rule at the device's current major; advise a restart."""
        from auditor.remedy import Advice, InsertLine, Remedy, ReplaceLine, evidence
        remedies: list[Remedy] = []
        planned: dict[tuple[str, int], str] = {}
        inserted: set[tuple[str, str]] = set()
        for finding in findings:
            ev = evidence(finding)
            container = finding.subject
            kind = ev.get("flavour", "")
            argv = (restart_command(kind, container)
                    if _CONTAINER.fullmatch(container) else ())
            if ev.get("view") == "running":
                remedies.append(self._restart_only(finding, ev, argv))
                continue
            config, rule = ev.get("config", ""), ev.get("rule", "").strip()
            stale, current = ev.get("allowed_major", ""), ev.get("current_major", "")
            flavour: Flavour = "proxmox" if kind == "proxmox" else "lxc"
            if not (config.startswith("/") and current.isdigit()):
                if "hook" in ev or "include" in ev:
                    title = ("the nvidia hook needs an unprivileged container" if "hook" in ev
                             else f"lxc.include {ev['include']} "
                             f"{ev.get('include_problem', 'does not exist')}")
                    remedies.append(Remedy(check=self.id, subject=container, title=title,
                                           advice=(Advice(finding.fix),)))
                continue
            rule_path = ev.get("rule_path", "") or config
            try:
                text = host.read_text(rule_path)
            except OSError:
                continue
            real = host.resolve(rule_path)
            section = parse_main_section(text, flavour if rule_path == config else "lxc")
            notes: list[str] = []
            steps: list[Step] = []
            if rule and stale.isdigit():
                for line in section.entries(*ALLOW_KEYS):
                    new = _with_major(line, int(stale), current)
                    if new is None or line.text.strip() != rule or "\ufffd" in line.text:
                        continue
                    if planned.get((real, line.number), new) != new:
                        notes.append(f"line {line.number} also serves another device: add an "
                                     f"allow rule for {ev.get('device', '')} (major {current}) "
                                     "by hand")
                        continue
                    if (real, line.number) not in planned:
                        planned[(real, line.number)] = new
                        steps.append(ReplaceLine(real, line.number, line.text, new))
                if rule_path != config:
                    notes.append(f"{rule_path} is an included file: every container that "
                                 "includes it gets the new rule at its next start")
            if not rule:
                # No single stale rule to rewrite: add one for the current major.
                key = ev.get("allow_key", "")
                if key not in ALLOW_KEYS:
                    key = ALLOW_KEYS[0]
                added = format_line(key, f"c {current}:* rwm", flavour)
                last = next((line for line in reversed(section.lines) if line.text.strip()),
                            None)
                after, anchor = (last.number, last.text) if last is not None else (0, "")
                if (real, added) not in inserted and "\ufffd" not in anchor:
                    inserted.add((real, added))
                    steps.append(InsertLine(real, after, anchor, added))
            advice: list[Advice] = []
            if ev.get("running_allows") == "yes":
                advice.append(Advice(f"container {container} runs with the rules of its last "
                                     "start, which allow the device: no restart is needed, the "
                                     "corrected rule applies at its next start"))
            elif argv:
                advice.append(Advice(f"restart container {container} to apply the new rule",
                                     argv))
            else:
                advice.append(Advice("restart the container to apply the new rule"))
            if flavour == "proxmox":
                notes.append("on Proxmox VE 8.1+, devN: entries (dev0: /dev/nvidia-uvm) pass "
                             "the device with its current numbers at every start: the lasting "
                             "fix")
            remedies.append(Remedy(
                check=self.id,
                subject=container,
                title=f"allow {ev.get('device', 'the device')} by its current major {current}"
                      + (f" (was {stale})" if stale else ""),
                persistent=tuple(steps),
                notes=tuple(notes),
                advice=tuple(advice),
            ))
        return remedies

    def _restart_only(self, finding: Finding, ev: dict[str, str],
                      argv: tuple[str, ...]) -> Remedy:
        from auditor.remedy import Advice, Remedy
        current = ev.get("current_major", "")
        device = ev.get("device", "the device")
        advice = [Advice(f"restart container {finding.subject}: it runs with the device rules "
                         "of its last start", argv)]
        notes = []
        if ev.get("flavour") in ("proxmox", "lxc") and current.isdigit() and argv:
            notes.append(f"without a restart, 'lxc-cgroup -n {finding.subject} devices.allow "
                         f"\"c {current}:* rwm\"' adds the rule to the running container, where "
                         "its node already carries the current major")
        return Remedy(
            check=self.id, subject=finding.subject,
            title=f"restart to pick up {device} at major {current}",
            notes=tuple(notes), advice=tuple(advice),
        )


# -- helpers ------------------------------------------------------------------------------


class _Context(NamedTuple):
    host: Host
    drivers: dict[str, list[int]]
    mode: CgroupMode
    proxmox: bool
    have_proc_devices: bool


def _visible(env: dict[str, str]) -> str | None:
    """Return NVIDIA_VISIBLE_DEVICES as the nvidia hook reads it, None when it binds nothing.

    hooks/nvidia exits at once when the variable is empty or ``void``, or unset in an
    image that is not a legacy CUDA one (``CUDA_VERSION`` set, ``NVIDIA_REQUIRE_CUDA``
    not), where it means ``all``.
    """
    visible = env.get("NVIDIA_VISIBLE_DEVICES")
    if visible is None:
        if env.get("CUDA_VERSION") and not env.get("NVIDIA_REQUIRE_CUDA"):
            return "all"
        return None
    if visible in ("", "void"):
        return None
    return visible


def _nvidia_hook(entries: list[Entry]) -> Entry | None:
    for hook in mount_hooks(entries):
        command = hook.value.split()
        if command and posixpath.basename(command[0]) == "nvidia":
            return hook
    return None


def _unrestricted(view: View) -> str:
    """Say why a view's rules restrict nothing (no rule, a deny-list), or return ""."""
    if view.semantics != "bpf":
        return "no device rules" if not view.rules else ""
    listed = False
    default_allow = False
    for item in view.rules:
        if item.rule.switch:
            default_allow, listed = item.allow, False
        else:
            listed = True
    if not listed:
        return "no device rule applies, so LXC attaches no device program"
    if default_allow:
        return ("the device cgroup is a deny-list ('allow = a'"
                + (", Proxmox's default for unprivileged containers" if view.unprivileged else "")
                + ")")
    return ""


def _from_driver(path: str, mapped: tuple[str, int | None], drivers: dict[str, list[int]],
                 host: Host | None = None) -> GpuNode:
    driver, minor = mapped
    if host is not None:
        numbers = host.device_numbers(path)
        if numbers is not None:
            return GpuNode(path, driver, numbers[0], numbers[1], "device node")
    if driver in drivers:
        return GpuNode(path, driver, drivers[driver][0], minor, PROC_DEVICES)
    if driver in FIXED_MAJORS:
        return GpuNode(path, driver, FIXED_MAJORS[driver], minor, "fixed major")
    return GpuNode(path, driver, None, minor, "")


def _expand(host: Host, source: str, drivers: dict[str, list[int]]) -> list[GpuNode]:
    mapped = node_driver(source)
    if mapped is None:
        return []
    driver = mapped[0]
    if host.is_dir(source):
        # A bind of /dev/dri or /dev/nvidia-caps brings every node inside it.
        found: list[GpuNode] = []
        for name in listdir(host, source):
            numbers = host.device_numbers(posixpath.join(source, name))
            if numbers is not None:
                found.append(GpuNode(posixpath.join(source, name), driver, numbers[0],
                                     numbers[1], "device node"))
        if found:
            return found
        mapped = (driver, None)
    numbers = host.device_numbers(source)
    if numbers is not None:
        return [GpuNode(source, driver, numbers[0], numbers[1], "device node")]
    return [_from_driver(source, mapped, drivers)]


def _effective_rules(host: Host, entries: list[Entry], mode: CgroupMode
                     ) -> tuple[list[Rule], list[ConfigLine]]:
    """Return the device rules LXC applies on this host, in order, and the lines it ignores.

    An empty value clears the rules of its key written before it, and an empty
    ``lxc.cgroup2`` every cgroup2 setting (confile.c ``lxc_clear_cgroups``). On cgroup2
    an allow rule may name a node by path, resolved to its numbers when the container
    starts (cgfsng.c ``device_cgroup_rule_parse_devpath``).
    """
    # With a v1 devices controller (hybrid layouts) LXC may apply both families, so
    # anything but a pure cgroup2 host reads them together, in file order.
    keys = {ALLOW_KEYS[0], DENY_KEYS[0]} if mode == "v2" else {*ALLOW_KEYS, *DENY_KEYS}
    rules: list[Rule] = []
    ignored: list[ConfigLine] = []
    for entry in entries:
        if entry.key in ("lxc.cgroup2", "lxc.cgroup") and not entry.value:
            family = "lxc.cgroup2." if entry.key == "lxc.cgroup2" else "lxc.cgroup."
            rules = [r for r in rules if not r.line.key or not r.line.key.startswith(family)]
            continue
        if entry.key not in (*ALLOW_KEYS, *DENY_KEYS):
            continue
        if entry.key not in keys:
            if mode == "v2" and entry.line is not None:
                ignored.append(entry.line)
            continue
        line = entry.line or ConfigLine(0, f"{entry.key} = {entry.value}", entry.key,
                                        entry.value)
        if not entry.value:
            rules = [r for r in rules if r.line.key != entry.key]
            continue
        parsed = parse_device_rule(entry.value)
        if parsed is None and mode == "v2" and entry.key == ALLOW_KEYS[0]:
            parsed = _path_rule(host, entry.value)
        if parsed is not None:
            rules.append(Rule(entry.key in ALLOW_KEYS, parsed,
                              ConfigLine(line.number, line.text, entry.key, entry.value,
                                         line.value_start),
                              entry.path, entry.origin))
    return rules, ignored


def _path_rule(host: Host, value: str) -> DeviceRule | None:
    """Resolve ``/dev/x rwm`` as LXC does when the container starts: the node's numbers now."""
    path, _, access = value.strip().partition(" ")
    access = access.strip()
    if not path.startswith("/dev/") or not access or not set(access) <= set("rwm"):
        return None
    entry = host.stat(path)
    if entry is None or entry.kind not in ("chr", "blk"):
        return None
    return DeviceRule("c" if entry.kind == "chr" else "b", entry.major, entry.minor,
                      frozenset(access))


def _allow_key(section: MainSection, mode: CgroupMode, chosen: Rule | None) -> str:
    if chosen is not None and chosen.line.key is not None:
        return chosen.line.key
    if mode == "v2":
        return ALLOW_KEYS[0]
    if mode == "v1":
        return ALLOW_KEYS[1]
    if not section.entries(ALLOW_KEYS[0]) and section.entries(ALLOW_KEYS[1]):
        return ALLOW_KEYS[1]
    return ALLOW_KEYS[0]


def _with_major(line: ConfigLine, stale: int, current: str) -> str | None:
    """Return an allow line naming ``stale`` as its major, with ``current`` instead; or None."""
    match = _RULE_MAJOR.match(line.value or "")
    if match is None or int(match.group(1)) != stale:
        return None
    value = line.value or ""
    return line.with_value(value[: match.start(1)] + current + value[match.end(1):])


def _stale_rules(
    failing: list[GpuNode],
    nodes: list[GpuNode],
    rules: list[Rule],
    drivers: dict[str, list[int]],
) -> dict[str, list[Rule]]:
    """Pair each failing node with the allow rules that most likely named its old major.

    A candidate is a character allow rule written in a file (not one Proxmox
    generates or LXC ships) with a dynamic major that lets rw through, allows none of
    the container's GPU nodes as they are now, and whose major is not a fixed GPU major
    nor one any driver holds now (``c 10:200`` is tun, and a rule for the current
    nvidia-caps major is current even when no nvidia-caps node is mounted). Its minor
    must fit the node's (``c 509:1`` is uvm-tools'). When the candidates name several
    majors, the failing drivers and the stale majors are paired in order: dynamic
    majors are handed out in the same order at every load.
    """
    other_majors = {m for ms in drivers.values() for m in ms} | set(FIXED_MAJORS.values())
    live = [(n.major, n.minor) for n in nodes if n.major is not None]
    pool = [
        r for r in rules
        if r.allow and r.path and r.line.number > 0 and r.rule.type == "c"
        and not r.path.startswith(LXC_CONFIG_DIR + "/")
        and r.rule.major in DYNAMIC_MAJORS
        and NEED <= r.rule.access and r.rule.major not in other_majors
        and not any(r.rule.major == ma and (r.rule.minor is None or mi is None
                                            or r.rule.minor == mi) for ma, mi in live)
    ]
    per_node: dict[str, list[Rule]] = {}
    for node in failing:
        # A fixed major never goes stale: a missing 195 or 226 rule is only missing.
        per_node[node.path] = [] if node.driver in FIXED_MAJORS else [
            r for r in pool
            if r.rule.minor is None or node.minor is None or r.rule.minor == node.minor
        ]
    stale_majors = sorted({r.rule.major for rs in per_node.values() for r in rs
                           if r.rule.major is not None})
    failing_drivers = sorted({(n.major or 0, n.driver) for n in failing
                              if n.driver not in FIXED_MAJORS})
    if len(stale_majors) > 1 and len(stale_majors) == len(failing_drivers):
        paired = {driver: major for (_, driver), major in zip(failing_drivers, stale_majors,
                                                                   strict=True)}
        for node in failing:
            narrowed = [r for r in per_node[node.path] if r.rule.major == paired.get(node.driver)]
            if narrowed:
                per_node[node.path] = narrowed
    for path, candidates in per_node.items():
        # The line naming the node's own minor is the one to rewrite first.
        node = next(n for n in failing if n.path == path)
        candidates.sort(key=lambda r: r.rule.minor is None or r.rule.minor != node.minor)
    return per_node
