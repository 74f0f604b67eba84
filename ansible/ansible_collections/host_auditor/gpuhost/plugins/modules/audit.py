#!/usr/bin/python
# Copyright: host-auditor contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: audit
short_description: Audit and tune a GPU / LLM-inference Linux host with host-auditor
version_added: "0.1.0"
description:
  - Runs host-auditor's checks against the target (or a sysroot directory on it) and returns
    the JSON report as the C(host_auditor) fact.
  - With O(state=tuned) it applies host-auditor's fix (needs O(ignore:become) for a booted
    host), audits again and reports C(changed) only when a finding's status moved.
  - In check mode nothing changes; with O(state=tuned) it reports C(changed) when the fix
    would change something, and with C(--diff) the observed and expected values.
  - By default (O(mode=agentless)) the action plugin sends host-auditor's one-command
    collector over Ansible's own connection (ssh, become, jump hosts) and runs the checks on
    the controller, so the target needs nothing installed but C(sh). With
    O(mode=installed) the module runs on the target, whose Python must have host-auditor.
options:
  state:
    description:
      - V(audited) only reads; V(tuned) applies the fix for the findings that have one.
    type: str
    choices: [audited, tuned]
    default: audited
  checks:
    description:
      - Run only these check ids (C(audit local --check)); all when empty.
    type: list
    elements: str
    default: []
  skip:
    description:
      - Leave out these check ids (C(audit local --skip)).
    type: list
    elements: str
    default: []
  fail_on:
    description:
      - Fail the task when a finding is at or above this status (C(--fail-on)); V(never)
        only reports. A report after O(state=tuned) is judged, so a fix that needs a reboot
        still fails the task until the host has rebooted; in check mode O(state=tuned) is
        judged as the host would be after the fix (the findings it changes do not count).
    type: str
    choices: [fail, warning, never]
    default: fail
  policy:
    description:
      - A TOML policy file (thresholds and waivers). Read on the controller in
        O(mode=agentless), on the target in O(mode=installed).
    type: path
  profile:
    description:
      - A built-in profile (V(gpu-inference), V(latency), V(throughput)).
    type: str
  root:
    description:
      - Audit (and fix) the sysroot directory O(root) on the target, such as an image being
        prepared, instead of the target itself.
    type: path
  mode:
    description:
      - V(agentless) collects over the connection and judges on the controller (the
        controller needs host-auditor); V(installed) runs on the target.
    type: str
    choices: [agentless, installed]
    default: agentless
  executable:
    description:
      - With O(mode=installed), where the single-file build of host-auditor
        (C(python3 contrib/pyz/build.py)) is on a target whose Python has no host-auditor
        installed; C(/opt/host-auditor/bin/audit) is tried too. Push it first with
        M(ansible.builtin.copy).
    type: path
    default: /usr/local/bin/audit
  timeout:
    description:
      - In O(mode=agentless), the seconds one node's audit may take (C(audit host
        --timeout)) - the collecting command, reading its answer and the checks - after
        which its task fails with one line; the fix has its own limit of 10 minutes.
    type: float
    default: 60
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
notes:
  - The checks read root-only files (PCI config space past 64 bytes); use O(ignore:become)
    for a full audit. Without it those checks report C(skip) with the reason.
  - The fix keeps its rollback on the target in C(/var/lib/host-auditor/FIX-ID/rollback.sh)
    (for a sysroot, in C(/var/lib/host-auditor/sysroots/KEY/FIX-ID/), outside the tree).
seealso:
  - name: host-auditor README
    description: The checks, the JSON report and the fix scripts.
    link: https://pypi.org/project/host-auditor/
author:
  - host-auditor maintainers
"""

EXAMPLES = r"""
- name: Audit the GPU nodes (nothing installed on them)
  host_auditor.gpuhost.audit:
  become: true
  register: audit

- name: Show each node's worst finding
  ansible.builtin.debug:
    msg: "{{ ansible_facts.host_auditor.summary }} {{ audit.msg }}"

- name: Tune the nodes; run with --check --diff first to see what would change
  host_auditor.gpuhost.audit:
    state: tuned
    skip: [kernel.version]
  become: true

- name: Put the single-file build where the engines look (built by contrib/pyz/build.py)
  ansible.builtin.copy:
    src: dist/audit.pyz
    dest: /usr/local/bin/audit
    mode: "0755"
  become: true

- name: Audit on the node itself, with that build
  host_auditor.gpuhost.audit:
    mode: installed
  become: true

- name: Fix an image kept on the node before it is provisioned
  host_auditor.gpuhost.audit:
    state: tuned
    root: /srv/images/gpu-node
    fail_on: never
  become: true
"""

RETURN = r"""
msg:
  description: One line, the worst finding first and how many more, at most 80 bytes.
  returned: always
  type: str
  sample: "FAIL pcie.mrrs 0000:41:00.0 512, want 4096 (+7 more)"
rc:
  description: The exit code C(audit local) would give (0 clean, 1 a finding at or above
    fail_on, 3 not auditable).
  returned: always
  type: int
  sample: 1
summary:
  description: Findings counted by status.
  returned: always
  type: dict
  sample: {"pass": 5, "skip": 0, "warn": 0, "fail": 1, "error": 0}
fingerprint:
  description: 12 hex digits of the host's tuned state (C(audit fingerprint)).
  returned: always
  type: str
  sample: 3f9c0a1b2d4e
ansible_facts:
  description: Facts set on the host.
  returned: always
  type: complex
  contains:
    host_auditor:
      description: The JSON report of C(audit local --format json) (after the fix when one ran).
      returned: always
      type: dict
fix:
  description: What the fix does, one entry per remedy.
  returned: when state is tuned
  type: list
  elements: dict
  sample:
    - check: pcie.mrrs
      subject: "0000:41:00.0"
      title: MaxReadReq 4096 on 0000:41:00.0
      steps: 1
      reboot: false
fix_id:
  description: The fix's id; its rollback is kept under C(/var/lib/host-auditor/FIX-ID/).
  returned: when state is tuned
  type: str
  sample: 20261203T044422Z-1a2b3c4d
rollback:
  description: The rollback script the fix left on the target.
  returned: when a fix ran
  type: str
  sample: /var/lib/host-auditor/20261203T044422Z-1a2b3c4d/rollback.sh
moved:
  description: Each check and subject whose status changed with the fix.
  returned: when a fix ran
  type: list
  elements: dict
  sample: [{"check": "pcie.mrrs", "subject": "0000:41:00.0", "before": "fail", "after": "pass"}]
fix_output:
  description: The last 4000 characters of the fix script's output.
  returned: when a fix ran
  type: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib  # noqa: E402
from ansible_collections.host_auditor.gpuhost.plugins.module_utils.host_auditor import (  # noqa: E402
    ARGUMENT_SPEC,
    AuditFailure,
    import_auditor,
    run,
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    if import_auditor(module.params["executable"]) is not None:
        module.fail_json(msg=missing_required_lib(
            "host-auditor", reason="in the Python of ansible_python_interpreter, or its "
            f"single-file build at {module.params['executable']} (mode=installed)"))
    from auditor.hosts import LocalHost, open_sysroot
    root = module.params["root"]

    def open_host():
        return open_sysroot(root) if root else LocalHost()

    host = open_host()
    try:
        def reaudit():
            from ansible_collections.host_auditor.gpuhost.plugins.module_utils.host_auditor import (
                load,
            )

            from auditor.runner import audit

            checks, policy = load(module.params)
            with open_host() as fresh:
                return audit(fresh, checks, policy)

        result = run(host, reaudit, module.params, check_mode=module.check_mode,
                     diff_mode=module._diff)
    except AuditFailure as exc:
        module.fail_json(msg=str(exc))
    except Exception as exc:  # host-auditor's own errors: one line, no traceback
        module.fail_json(msg=f"{type(exc).__name__}: {' '.join(str(exc).split())}")
    finally:
        host.close()
    failed = result.pop("failed")
    if failed:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
