#!/usr/bin/env bash
# A real kernel RDMA device (SoftRoCE, the kernel's rdma_rxe driver) for the ibverbs tests.
#
# The host kernel of these machines has no RDMA modules, so the device lives in a QEMU guest
# that boots Debian's own kernel and uses the host's userland (python, pyverbs, the project's
# venv) through a read-only 9p share of / with a tmpfs overlay on top; the repository itself
# is shared writable at the same path. Inside the guest: rxe0 on lo, and two "hosts" for
# the two-host tests: rxe1 and rxe2 on the two ends of a veth pair (10.77.0.1 and
# 10.77.0.2, see stage2). The guest runs one command in
# the repository and hands back its exit status.
#
#   bash scripts/softroce.sh install       packages (QEMU, busybox, rdma-core, pyverbs) and
#                                          the guest kernel, into .cache/softroce
#   bash scripts/softroce.sh run CMD...    boot, run CMD in the repository, exit with its status
#   bash scripts/softroce.sh why-not       print why the guest cannot run here (empty if it can)
#
# Settings (environment): SOFTROCE_MEM (MiB, default 4096), SOFTROCE_CPUS (default: the
# host's cores), SOFTROCE_TIMEOUT (s, default 3600: the host-side bound on the whole guest).
# Under TCG (the only accelerator that boots a stock kernel here, see docs) the guest is
# 10-50x slower than the host: the tests it runs raise danaus's timeouts through DANAUS_*.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${SOFTROCE_CACHE:-$repo/.cache/softroce}
kdir=$cache/kernel

log() { echo "softroce: $*" >&2; }

kernel_version() {
    # the one version folder under the extracted package's lib/modules
    local v
    v=$(ls "$kdir/lib/modules" 2>/dev/null | head -1)
    [ -n "$v" ] && echo "$v"
}

why_not() {
    [ "$(uname -s)" = Linux ] || { echo "not Linux"; return; }
    command -v qemu-system-x86_64 >/dev/null || { echo "qemu-system-x86_64 is not installed (bash scripts/softroce.sh install, as root)"; return; }
    [ -x /bin/busybox ] || { echo "busybox-static is not installed"; return; }
    [ -n "$(kernel_version)" ] || { echo "the guest kernel is not in $kdir (bash scripts/softroce.sh install)"; return; }
    [ -d /usr/lib/python3/dist-packages/pyverbs ] || { echo "python3-pyverbs is not installed"; return; }
    command -v rdma >/dev/null || { echo "rdma-core's rdma tool is not installed"; return; }
    [ -x "$repo/.venv/bin/python" ] || { echo "the project's venv is missing (make install)"; return; }
}

apt_install() {
    apt-get install -y -q "$@" >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "$@" >/dev/null 2>&1; }
}

install() {
    if [ "$(id -u)" != 0 ]; then
        log "not root: cannot install packages; the real-device tests will skip"
        return 0
    fi
    local pkgs=(qemu-system-x86 busybox-static cpio rdma-core ibverbs-utils python3-pyverbs kmod)
    apt_install "${pkgs[@]}" || { log "could not install ${pkgs[*]}"; return 0; }
    if [ -z "$(kernel_version)" ]; then
        # bookworm's current kernel: what the linux-image-amd64 metapackage depends on
        local pkg
        pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
        [ -n "$pkg" ] || { apt-get update -q >/dev/null 2>&1; pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'); }
        [ -n "$pkg" ] || { log "no linux-image-amd64 in the package archive"; return 0; }
        mkdir -p "$cache"
        (cd "$cache" && rm -f linux-image-*.deb && apt-get download "$pkg" >/dev/null 2>&1) ||
            { log "could not download $pkg"; return 0; }
        rm -rf "$kdir.tmp" && mkdir -p "$kdir.tmp"
        dpkg-deb -x "$cache"/linux-image-*.deb "$kdir.tmp"
        rm -f "$cache"/linux-image-*.deb
        rm -rf "$kdir" && mv "$kdir.tmp" "$kdir"
        depmod -b "$kdir" "$(kernel_version)"
        log "guest kernel $(kernel_version) in $kdir"
    fi
    bash "$repo/scripts/install_pyverbs.sh" "$repo/.venv/bin/python" || true
}

# The busybox initramfs: load the 9p and overlay modules, mount / (read-only 9p) under a
# tmpfs overlay, then switch_root into it and run the second stage from the repository.
build_initramfs() {
    local ver=$1 out=$2 work mods m
    work=$(mktemp -d)
    mkdir -p "$work"/{bin,proc,sys,dev,lower,rw,newroot,mods}
    cp /bin/busybox "$work/bin/busybox"
    mods=$(for m in virtio_pci 9pnet_virtio 9p overlay; do
        modprobe -d "$kdir" -S "$ver" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
    done | awk '!seen[$0]++')
    : > "$work/mods.list"
    for m in $mods; do
        # the path under the extracted package, relative to the folder
        local rel=${m#"$kdir"/}
        local name
        name=$(basename "$rel")
        case $name in
            *.ko.xz) xz -dc "$m" > "$work/mods/${name%.xz}"; name=${name%.xz} ;;
            *.ko.zst) zstd -qdc "$m" > "$work/mods/${name%.zst}"; name=${name%.zst} ;;
            *) cp "$m" "$work/mods/$name" ;;
        esac
        echo "$name" >> "$work/mods.list"
    done
    cat > "$work/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /mods.list); do insmod /mods/$m || echo "initramfs: insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,ro hostroot /lower ||
    { echo "initramfs: cannot mount the host's /"; echo o > /proc/sysrq-trigger; }
mount -t tmpfs -o size=75% rw /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot ||
    { echo "initramfs: overlay failed"; echo o > /proc/sysrq-trigger; }
for d in proc sys dev; do mount -o move /$d /newroot/$d; done
exec switch_root /newroot /bin/bash "$(cat /stage2)" guest
EOF
    chmod +x "$work/init"
    echo "$repo/scripts/softroce.sh" > "$work/stage2"
    (cd "$work" && find . | cpio -o -H newc --quiet | gzip -1 > "$out")
    rm -rf "$work"
}

# Second stage, in the guest as pid 1: the repository (writable), the kernel's modules,
# SoftRoCE devices, then the command.
stage2() {
    set +e
    local ver cmdfile rcfile
    ver=$(kernel_version)
    export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
    mount -t tmpfs tmp /tmp
    mount -t tmpfs run /run
    mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs shm /dev/shm
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,cache=none work "$repo" ||
        { echo "softroce guest: cannot mount the repository"; echo o > /proc/sysrq-trigger; }
    mkdir -p "/usr/lib/modules/$ver" && mount --bind "$kdir/lib/modules/$ver" "/usr/lib/modules/$ver"
    cmdfile=$cache/guest.cmd
    rcfile=$cache/guest.rc
    ip link set lo up
    modprobe rdma_rxe && modprobe ib_uverbs && modprobe veth || echo "softroce guest: modprobe failed"
    rdma link add rxe0 type rxe netdev lo
    # Two hosts: rxe1 on veth1 (10.77.0.1) and rxe2 on veth2 (10.77.0.2), the two ends of
    # one veth pair. Linux 6.1's rxe sends and receives only in the first network
    # namespace, so both ends stay there, and policy routing sends what is addressed to
    # one end out of the other (locally made packets only: iif lo), so traffic between
    # the two hosts crosses the pair instead of short-cutting through lo.
    ip link add veth1 type veth peer name veth2
    ip addr add 10.77.0.1/32 dev veth1 && ip addr add 10.77.0.2/32 dev veth2
    ip link set veth1 up && ip link set veth2 up
    for k in all.accept_local veth1.accept_local veth2.accept_local; do sysctl -qw net.ipv4.conf.$k=1; done
    for k in all.rp_filter default.rp_filter veth1.rp_filter veth2.rp_filter; do sysctl -qw net.ipv4.conf.$k=0; done
    ip route add 10.77.0.2 dev veth1 src 10.77.0.1 table 101
    ip route add 10.77.0.1 dev veth2 src 10.77.0.2 table 102
    ip rule add pref 10 iif lo to 10.77.0.2 lookup 101
    ip rule add pref 11 iif lo to 10.77.0.1 lookup 102
    ip rule add pref 100 lookup local && ip rule del pref 0
    rdma link add rxe1 type rxe netdev veth1
    rdma link add rxe2 type rxe netdev veth2
    rdma link show
    cd "$repo" || exit 1
    echo "softroce guest: running $(cat "$cmdfile")"
    /bin/bash "$cmdfile" < /dev/null
    echo $? > "$rcfile"
    sync
    echo o > /proc/sysrq-trigger
    sleep 60
}

run() {
    local why ver rc
    why=$(why_not)
    [ -z "$why" ] || { log "cannot run: $why"; return 77; }
    ver=$(kernel_version)
    mkdir -p "$cache"
    printf '%q ' "$@" > "$cache/guest.cmd"
    echo >> "$cache/guest.cmd"
    rm -f "$cache/guest.rc"
    if [ ! -f "$cache/initramfs-$ver.gz" ] || [ "$0" -nt "$cache/initramfs-$ver.gz" ]; then
        build_initramfs "$ver" "$cache/initramfs-$ver.gz"
    fi
    local cpus=${SOFTROCE_CPUS:-$(nproc)}
    timeout --foreground -k 10 "${SOFTROCE_TIMEOUT:-3600}" qemu-system-x86_64 \
        -machine pc,accel=tcg -cpu max -smp "$cpus" -m "${SOFTROCE_MEM:-4096}" \
        -nodefaults -nographic -no-reboot -serial stdio -monitor none -nic none \
        -kernel "$kdir/boot/vmlinuz-$ver" -initrd "$cache/initramfs-$ver.gz" \
        -append "console=ttyS0 quiet panic=-1 rdinit=/init" \
        -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
        -virtfs "local,path=$repo,mount_tag=work,security_model=none,multidevs=remap" \
        < /dev/null || { rc=$?; log "qemu exited with $rc"; }
    if [ -f "$cache/guest.rc" ]; then
        rc=$(cat "$cache/guest.rc")
        return "$rc"
    fi
    log "the guest gave no exit status (crashed or timed out)"
    return 1
}

case ${1:-} in
    install) install ;;
    why-not) why_not ;;
    run) shift; run "$@" ;;
    "") echo "usage: $0 install | why-not | run CMD..." >&2; exit 2 ;;
    guest) stage2 ;;
    *) echo "usage: $0 install | why-not | run CMD..." >&2; exit 2 ;;
esac
