#!/usr/bin/env bash
# make test-rdma: every ibverbs test on a real kernel RDMA device (SoftRoCE) in a QEMU
# guest (scripts/softroce.sh), then danaus rdma-bench on it at small sizes.
#
# On the host: installs what the guest needs where it can (root), boots it, and exits with
# the tests' status; where the guest cannot run (not root and nothing installed, no
# package archive) it says why and exits 0, as the other hardware tests skip.
# In the guest (--in-guest): no ibverbs test may skip for want of a device
# (DANAUS_REQUIRE_RDMA_DEVICE=1), and every timeout on the spawn and RDMA path is raised:
# CPU emulation runs everything 10-50x slower.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" != --in-guest ]; then
    why=$(bash scripts/softroce.sh why-not)
    if [ -n "$why" ] && [ "$(id -u)" = 0 ]; then
        bash scripts/softroce.sh install
        why=$(bash scripts/softroce.sh why-not)
    fi
    if [ -n "$why" ]; then
        echo "test-rdma: skipped: $why"
        exit 0
    fi
    # The guest runs a snapshot of the work tree, so that edits made meanwhile (the run
    # takes minutes) do not change the code under test halfway through.
    tree=.cache/softroce/tree
    rm -rf "$tree" && mkdir -p "$tree"
    git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$tree"
    start=$(date +%s)
    bash scripts/softroce.sh run env DANAUS_TEST_VENV="$PWD/.venv" DANAUS_TEST_OUT="$PWD/.cache/softroce" \
        bash -c 'cd .cache/softroce/tree && exec bash scripts/test_rdma.sh --in-guest "$@"' - "$@"
    rc=$?
    echo "test-rdma: exit status $rc after $(( $(date +%s) - start )) s (guest boot included)"
    exit $rc
fi
shift

export DANAUS_REQUIRE_RDMA_DEVICE=1
export DANAUS_TEST_RDMA_HOSTS=rxe1@10.77.0.1,rxe2@10.77.0.2
export DANAUS_TEST_TIME_SCALE=${DANAUS_TEST_TIME_SCALE:-10}
export DANAUS_PROC_START_TIMEOUT=600 DANAUS_CONNECT_TIMEOUT=300 DANAUS_HANDSHAKE_TIMEOUT=60
export DANAUS_HEARTBEAT_TIMEOUT=300 DANAUS_SPAWN_WAIT=300 DANAUS_RDMA_TIMEOUT=600
export DANAUS_STOP_TIMEOUT=60 PYTHONDONTWRITEBYTECODE=1
py=${DANAUS_TEST_VENV:-.venv}/bin/python
out=${DANAUS_TEST_OUT:-.cache/softroce}
export PYTHONPATH=$PWD  # the snapshot's danaus, in the procs too
echo "devices: $(rdma link show | awk '{print $2, $NF}' | tr '\n' ' ')"
# the unit tests (the backend's logic on the fake device, the adapter on the real one),
# the conformance suite's ibverbs half, the Monarch-compatibility RDMA tests on ibverbs,
# the bench CLI and the two-host tests
$py -m pytest -q -p no:cacheprovider -rfEs --color=no --junitxml="$out/test-rdma.xml" \
    --timeout=$(( 60 * DANAUS_TEST_TIME_SCALE )) \
    tests/unit/rdma tests/conformance/test_rdma.py tests/integration/test_rdma_monarch.py \
    tests/integration/test_rdma_bench.py tests/integration/test_rdma_two_hosts.py \
    -k "not shm and not tcp and not test_rdma_bench_json_reports_each_backend" "$@"
rc=$?
echo "== danaus rdma-bench --backend ibverbs on rxe0 (CPU-emulated: not a speed figure)"
timeout 600 $py -m danaus rdma-bench --backend ibverbs --sizes 4096,65536,1048576 --op both ||
    { echo "rdma-bench failed"; rc=1; }
exit $rc
