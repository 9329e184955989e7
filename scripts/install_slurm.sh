#!/usr/bin/env bash
# Install Debian's SLURM (slurmctld, slurmd, slurm-client) and munge, for the throw-away
# test cluster of scripts/slurm_cluster.sh. Nothing is started or configured here: an
# /usr/sbin/policy-rc.d guard (exit 101) keeps the packages' init scripts from starting
# system daemons. A no-op when the programs are already there.
# Exit 0: installed (or already there); 1: could not install (the reason on stderr).
set -u
need="slurmctld slurmd srun sbatch squeue scancel scontrol munged"
missing=""
for prog in $need; do
    command -v "$prog" >/dev/null 2>&1 || [ -x "/usr/sbin/$prog" ] || missing="$missing $prog"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "install_slurm: not root; cannot install SLURM (missing:$missing)" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_slurm: no apt-get; install slurmctld, slurmd, slurm-client and munge yourself" >&2
    exit 1
fi
guard=/usr/sbin/policy-rc.d
added_guard=0
if [ ! -e "$guard" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$guard"
    chmod 755 "$guard"
    added_guard=1
fi
trap 'if [ "$added_guard" = 1 ]; then rm -f "$guard"; fi' EXIT
pkgs="slurmctld slurmd slurm-client munge"
log=$(mktemp)
install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $pkgs >"$log" 2>&1
}
if ! install; then
    # A fresh image often has no package lists yet.
    if ! { apt-get update -q >>"$log" 2>&1 && install; }; then
        echo "install_slurm: apt-get install $pkgs failed:" >&2
        tail -n 5 "$log" >&2
        rm -f "$log"
        exit 1
    fi
fi
rm -f "$log"
exit 0
