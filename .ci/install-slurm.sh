#!/usr/bin/env bash
# Installs a one-node SLURM (Debian's slurmctld + slurmd + client, munge) for tests/workflow/test_slurm.py.
# Run as root on Debian 12. Idempotent: a second run changes nothing. It starts no daemon:
# the test writes its own slurm.conf, starts munged/slurmctld/slurmd and stops them by PID.
set -euo pipefail

packages=(slurmctld slurmd slurm-client munge)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Without systemd the packages' postinst scripts cannot start services; policy-rc.d says "don't try".
    policy=/usr/sbin/policy-rc.d
    created_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created_policy=1
    fi
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
    ((created_policy)) && rm -f "$policy"
fi

# munge needs a key (the package creates one; make sure) and a socket folder owned by its user.
if [[ ! -s /etc/munge/munge.key ]]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge

echo "install-slurm: $(dpkg-query -W -f='${Package} ${Version}\n' "${packages[@]}" | tr '\n' ' ')"
