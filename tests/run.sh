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
# One process per CPU (pytest-xdist); tests that share a part of the machine take turns
# (tests/conftest.py, SHARED). Later arguments win: `-n 0` runs in this one process.
exec .venv/bin/python -m pytest -n "${HOST_AUDITOR_TEST_PROCESSES:-auto}" "$@"
