"""container.cdi: NVIDIA CDI specs current, left from the previous driver, from another GPU
set, unparsable, conflicting, shadowed, in JSON; the refresh unit."""

import json

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.nvidia import DriverSpec, driver_host
from tests.support.sysroot import Sysroot

CHECK = "container.cdi"
SPEC = "/etc/cdi/nvidia.yaml"


def unparsable(root: Sysroot) -> None:
    root.write(SPEC, "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [\n  - name: 0\n")


def second_spec(root: Sysroot) -> None:
    root.write("/etc/cdi/nvidia-old.yaml", root.read(SPEC))


def regenerated_in_var_run(root: Sysroot) -> None:
    stale = root.read(SPEC)
    current = stale.replace("550.90.07", "580.95.05")
    root.write("/var/run/cdi/nvidia.yaml", current)


def as_json(root: Sysroot) -> None:
    import yaml

    data = yaml.safe_load(root.read(SPEC))
    root.remove(SPEC)
    root.write("/etc/cdi/nvidia.json", json.dumps(data))


def container(root: Sysroot) -> None:
    root.write("/run/systemd/container", "lxc\n")


CASES = [
    Case("no CDI spec", Status.SKIP, base=driver_host()),
    Case("a current spec, refreshed by nvidia-cdi-refresh", Status.PASS,
         base=driver_host(DriverSpec(cdi=("580.95.05", 8)))),
    Case("the same spec as JSON", Status.PASS, as_json,
         base=driver_host(DriverSpec(cdi=("580.95.05", 8)))),
    Case("a spec left from driver 550.90.07", Status.FAIL,
         base=driver_host(DriverSpec(cdi=("550.90.07", 8)))),
    Case("a stale /etc/cdi spec shadowed by a regenerated /var/run/cdi one", Status.PASS,
         regenerated_in_var_run, base=driver_host(DriverSpec(cdi=("550.90.07", 8)))),
    Case("a spec for 4 GPUs on a node with 8", Status.WARN,
         base=driver_host(DriverSpec(cdi=("580.95.05", 4)))),
    Case("a spec that does not parse", Status.WARN, unparsable,
         base=driver_host(DriverSpec(cdi=("580.95.05", 8)))),
    Case("two specs in /etc/cdi define the same devices", Status.FAIL, second_spec,
         base=driver_host(DriverSpec(cdi=("580.95.05", 8)))),
    Case("nvidia-cdi-refresh.path installed, not enabled", Status.WARN,
         base=driver_host(DriverSpec(cdi=("580.95.05", 8), cdi_refresh=False)), fixed=True),
    Case("inside a container", Status.SKIP, container,
         base=driver_host(DriverSpec(cdi=("550.90.07", 8)))),
]
