#!/usr/bin/env bash
# A real, throw-away SLURM cluster on this machine, for tests: one munged, one slurmctld
# and N slurmd "nodes", all state (config, munge key and socket, spool, logs, pids) in
# one directory. Needs root and Debian's packages (scripts/install_slurm.sh).
#
#   scripts/slurm_cluster.sh start [--nodes N] [--mode loopback|netns] [--dir DIR]
#   scripts/slurm_cluster.sh stop --dir DIR
#
# start prints KEY=VALUE lines (SLURM_CONF=... is all a client needs; `sinfo`, `srun`,
# `sbatch`... then talk to this cluster) and returns once every node is idle.
# Modes:
#   loopback  node i listens on 127.0.0.(i+1); all nodes share the host's network and
#             hostname (tell them apart by SLURMD_NODENAME). Several may run at once:
#             each takes free ports and its own node-name prefix.
#   netns     each node has its own network and UTS namespace, IP (10.251.0.(i+1)) and
#             hostname, on a bridge whose host side is 10.251.0.1. One at a time.
# Node names resolve through /etc/hosts lines that start adds and stop removes.
# stop ends only the daemons this cluster started (recorded pids, checked against
# their command line), removes its namespaces and /etc/hosts lines, then DIR.
set -Eeuo pipefail

die() { echo "slurm_cluster: $*" >&2; exit 1; }
usage() {
    sed -n '6,8p' "$0" >&2
    exit 2
}

[ $# -ge 1 ] || usage
cmd=$1
shift
nodes=2
mode=loopback
dir=""
while [ $# -gt 0 ]; do
    case $1 in
    --nodes) nodes=${2:?--nodes needs a number}; shift 2 ;;
    --mode) mode=${2:?--mode needs loopback or netns}; shift 2 ;;
    --dir) dir=${2:?--dir needs a directory}; shift 2 ;;
    -h | --help) usage ;;
    *) die "unknown argument '$1' (start|stop [--nodes N] [--mode loopback|netns] [--dir DIR])" ;;
    esac
done

HOSTS_TAG="# danaus-slurm-cluster"
NETNS_BR=dslbr0
NETNS_NET=10.251.0

sbin() { # a daemon's path: /usr/sbin is not on every root PATH
    command -v "$1" 2>/dev/null || { [ -x "/usr/sbin/$1" ] && echo "/usr/sbin/$1"; } || return 1
}

remove_hosts_lines() { # the /etc/hosts lines of the cluster in $1 (in place: it may be a bind mount)
    local tag="$HOSTS_TAG $1"
    if grep -qF -- "$tag" /etc/hosts 2>/dev/null; then
        local kept
        kept=$(grep -vF -- "$tag" /etc/hosts || true)
        printf '%s\n' "$kept" >/etc/hosts
    fi
}

remove_netns() { # the namespaces, veths and bridge of a netns cluster (a killed one's too)
    local ns
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^dsl-' || true); do
        ip link del "v${ns#dsl-}" 2>/dev/null || true # the veth first: netns deletion frees it late
        ip netns del "$ns" 2>/dev/null || true
    done
    ip link del "$NETNS_BR" 2>/dev/null || true
}

listening() { # is TCP port $1 in use on this host?
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
}

stop_pid() { # TERM, then KILL after 10 s (a slurmd that lost munged ignores TERM)
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for i in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || return 0
        [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

ours() { # is pid $1 a daemon of the cluster in dir $2 (its command line names the dir)?
    tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$2"
}

do_stop() {
    [ -n "$dir" ] || die "stop needs --dir DIR (the directory start printed)"
    [ -d "$dir" ] || die "no cluster directory $dir"
    dir=$(cd "$dir" && pwd)
    local pid f
    # slurmd first (they report to slurmctld), munged last (the others need it to stop).
    for f in "$dir"/run/slurmd-*.pid "$dir"/run/slurmctld.pid "$dir"/run/munged.pid; do
        [ -f "$f" ] || continue
        pid=$(cat "$f" 2>/dev/null || true)
        [ -n "$pid" ] && ours "$pid" "$dir" && stop_pid "$pid"
    done
    if [ -f "$dir/mode" ] && [ "$(cat "$dir/mode")" = netns ]; then
        remove_netns
    fi
    remove_hosts_lines "$dir"
    rm -rf "$dir"
}

wait_pidfile() { # a daemonized slurmd writes its pid file just after its parent returns
    local f=$1 what=$2 i
    for i in $(seq 200); do
        [ -s "$f" ] && return 0
        sleep 0.05
    done
    die "$what did not start (no $f); see $dir/log"
}

do_start() {
    [ "$(id -u)" = 0 ] || die "needs root (slurmd runs jobs as any user; munged, namespaces, /etc/hosts)"
    case $nodes in '' | *[!0-9]*) die "--nodes must be a positive number, not '$nodes'" ;; esac
    [ "$nodes" -ge 1 ] && [ "$nodes" -le 200 ] || die "--nodes must be 1..200, not $nodes"
    case $mode in loopback | netns) ;; *) die "--mode must be loopback or netns, not '$mode'" ;; esac
    local munged slurmctld slurmd
    munged=$(sbin munged) && slurmctld=$(sbin slurmctld) && slurmd=$(sbin slurmd) &&
        command -v sinfo >/dev/null ||
        die "SLURM is not installed (need munged, slurmctld, slurmd, sinfo): run scripts/install_slurm.sh"
    if [ "$mode" = netns ]; then
        command -v nsenter >/dev/null && command -v unshare >/dev/null ||
            die "netns mode needs nsenter and unshare (util-linux)"
        if ip link show "$NETNS_BR" >/dev/null 2>&1; then
            local other
            other=$(grep -F "$HOSTS_TAG" /etc/hosts | grep "^$NETNS_NET\." | awk '{print $NF}' | head -n1)
            if [ -n "$other" ] && [ -f "$other/mode" ]; then
                die "a netns cluster already runs ($other); stop it first"
            fi
            remove_netns # left by a killed cluster
        fi
    fi
    # Leftovers of killed clusters: /etc/hosts lines whose directory is gone.
    local line d
    for d in $(grep -F "$HOSTS_TAG" /etc/hosts 2>/dev/null | awk '{print $NF}' | sort -u); do
        [ -d "$d" ] || remove_hosts_lines "$d"
    done

    # Free ports: slurmctld on base, node i on base+i.
    local base=6817 p ok
    while :; do
        ok=1
        for p in $(seq "$base" $((base + nodes))); do
            if listening "$p"; then ok=0; break; fi
        done
        [ "$ok" = 1 ] && break
        base=$((base + 256))
        [ "$base" -lt 30000 ] || die "no free range of $((nodes + 1)) TCP ports for slurmctld/slurmd"
    done
    local prefix=node
    [ "$base" = 6817 ] || prefix="n${base}x"

    if [ -z "$dir" ]; then
        dir=$(mktemp -d /tmp/danaus-slurm.XXXXXX)
    else
        mkdir -p "$dir"
        [ -z "$(ls -A "$dir")" ] || die "--dir $dir is not empty"
    fi
    dir=$(cd "$dir" && pwd)
    # munged: "execute permissions for all required" on the socket's directories.
    chmod 755 "$dir"
    mkdir -p "$dir"/{etc,munge,log,run,state,spool}
    chmod 755 "$dir"/{munge,run}
    chmod 700 "$dir/log"
    echo "$mode" >"$dir/mode"
    # From here on a failed start cleans up after itself.
    trap 'echo "slurm_cluster: start failed; logs:" >&2; tail -n 5 "$dir"/log/* >&2 2>/dev/null || true; do_stop' ERR

    local ctld_host ctld_addr
    if [ "$mode" = netns ]; then
        ctld_host=$(hostname -s)
        ctld_addr=$NETNS_NET.1
    else
        ctld_host=localhost
        ctld_addr=127.0.0.1
    fi
    local names=() addrs=() i
    for i in $(seq "$nodes"); do
        names+=("$prefix$i")
        if [ "$mode" = netns ]; then addrs+=("$NETNS_NET.$((i + 1))"); else addrs+=("127.0.0.$((i + 1))"); fi
    done
    local cpus
    cpus=$(nproc)
    {
        cat <<EOF
# Written by scripts/slurm_cluster.sh for a throw-away test cluster.
ClusterName=danaus$base
SlurmctldHost=$ctld_host($ctld_addr)
SlurmctldPort=$base
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket.2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdParameters=config_overrides
EnforcePartLimits=ALL
SchedulerParameters=batch_sched_delay=0
KillWait=5
MinJobAge=300
MailProg=/bin/true
EOF
        for i in $(seq "$nodes"); do
            echo "NodeName=${names[$((i - 1))]} NodeAddr=${addrs[$((i - 1))]} Port=$((base + i)) CPUs=$cpus State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    } >"$dir/etc/slurm.conf"
    export SLURM_CONF=$dir/etc/slurm.conf

    for i in $(seq "$nodes"); do
        echo "${addrs[$((i - 1))]} ${names[$((i - 1))]} $HOSTS_TAG $dir" >>/etc/hosts
    done

    head -c 1024 /dev/urandom >"$dir/munge/munge.key"
    chmod 400 "$dir/munge/munge.key"
    "$munged" --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket.2" \
        --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
        --seed-file="$dir/munge/munged.seed"
    wait_pidfile "$dir/run/munged.pid" munged

    if [ "$mode" = netns ]; then
        ip link add "$NETNS_BR" type bridge
        ip addr add "$NETNS_NET.1/24" dev "$NETNS_BR"
        ip link set "$NETNS_BR" up
        for i in $(seq "$nodes"); do
            local ns="dsl-${names[$((i - 1))]}" veth="v${names[$((i - 1))]}"
            ip netns add "$ns"
            ip link add "$veth" type veth peer name eth0 netns "$ns"
            ip link set "$veth" master "$NETNS_BR" up
            ip -n "$ns" addr add "${addrs[$((i - 1))]}/24" dev eth0
            ip -n "$ns" link set eth0 up
            ip -n "$ns" link set lo up
        done
    fi

    "$slurmctld" -i -f "$SLURM_CONF"
    wait_pidfile "$dir/run/slurmctld.pid" slurmctld
    for i in $(seq "$nodes"); do
        local name=${names[$((i - 1))]}
        mkdir -p "$dir/spool/$name"
        if [ "$mode" = netns ]; then
            # Not `ip netns exec`: it remounts /sys, and slurmd then finds no cgroup fs.
            nsenter --net="/run/netns/dsl-$name" unshare --uts \
                sh -c 'hostname "$1" && exec "$2" -N "$1" -f "$3"' sh "$name" "$slurmd" "$SLURM_CONF"
        else
            "$slurmd" -N "$name" -f "$SLURM_CONF"
        fi
    done
    for i in $(seq "$nodes"); do
        wait_pidfile "$dir/run/slurmd-${names[$((i - 1))]}.pid" "slurmd ${names[$((i - 1))]}"
    done

    # Ready once every node is idle (bounded).
    local idle=0
    for i in $(seq 300); do
        idle=$(sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle' || true)
        [ "$idle" = "$nodes" ] && break
        sleep 0.05
    done
    [ "$idle" = "$nodes" ] || { echo "slurm_cluster: only $idle of $nodes nodes idle after 15 s" >&2; false; }
    trap - ERR

    local list="${prefix}[1-$nodes]"
    [ "$nodes" = 1 ] && list="${prefix}1"
    echo "SLURM_CONF=$SLURM_CONF"
    echo "SLURM_CLUSTER_DIR=$dir"
    echo "SLURM_CLUSTER_MODE=$mode"
    echo "SLURM_CLUSTER_NODES=$list"
    echo "SLURM_CLUSTER_ADDRS=$(IFS=,; echo "${addrs[*]}")"
}

case $cmd in
start) do_start ;;
stop) do_stop ;;
*) usage ;;
esac
