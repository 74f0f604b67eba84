#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian/Ubuntu machine, then run them all.
# Usage: bash tests/run.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    need=()
    for pair in lspci:pciutils setpci:pciutils sshd:openssh-server ssh:openssh-client \
                ssh-keygen:openssh-client udevadm:udev shellcheck:shellcheck ip:iproute2 \
                tc:iproute2 sudo:sudo chromium:chromium \
                prometheus-node-exporter:prometheus-node-exporter munged:munge \
                slurmctld:slurmctld slurmd:slurmd scontrol:slurm-client srun:slurm-client \
                unshare:util-linux; do
        cmd=${pair%%:*} pkg=${pair#*:}
        command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || need+=("$pkg")
    done
    if [ ${#need[@]} -gt 0 ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get -o DPkg::Lock::Timeout=300 update -qq
        # shellcheck disable=SC2046
        apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u) \
            >/dev/null
    fi
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
.venv/bin/ruff check auditor checks remediations tests bench ansible
.venv/bin/mypy
# The tests' temporary trees in memory where the machine has a tmpfs to spare: a case
# builds a sysroot of thousands of small files, and on a journaled disk creating them is
# most of the suite's time (2 CPUs, ext4: 7 min 40 s; /dev/shm: 4 min 25 s). The folder is
# this run's own (mktemp: mode 0700, a name nobody can guess) and goes at the end.
# HOST_AUDITOR_TEST_TMP=disk keeps pytest's default; a --basetemp given here wins.
basetemp=()
free_kib=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}') || free_kib=0
if [ "${HOST_AUDITOR_TEST_TMP:-}" != disk ] && [[ " $* " != *" --basetemp"* ]] \
        && [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] \
        && [ "${free_kib:-0}" -ge $((4 << 20)) ] \
        && shm=$(mktemp -d /dev/shm/host-auditor-tests.XXXXXX); then
    trap 'rm -rf -- "$shm"' EXIT
    basetemp=(--basetemp "$shm/pytest")
fi
# One process per CPU (pytest-xdist); tests that share a part of the machine take turns
# (tests/conftest.py, SHARED). Later arguments win: `-n 0` runs in this one process.
.venv/bin/python -m pytest -n "${HOST_AUDITOR_TEST_PROCESSES:-auto}" "${basetemp[@]}" "$@"
