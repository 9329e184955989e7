"""``make bench``: every benchmark, each printing ratios against floors from the same run."""

from __future__ import annotations

from . import (
    bench_attach,
    bench_calls,
    bench_hops,
    bench_inference,
    bench_lightning,
    bench_mesh,
    bench_parallel,
    bench_planner,
    bench_recovery,
    bench_runtime,
    bench_simulator,
    bench_slurm,
    bench_spawn,
    bench_spmd,
    bench_stats,
    bench_supervision,
    bench_telemetry,
    bench_tensor_engine,
    bench_user,
    bench_wire,
)


def main() -> None:
    print("== actor runtime ==")
    bench_runtime.main()
    print("\n== issue 29's figures in a user's program (actor class in __main__, numpy) ==")
    bench_user.main()
    print("\n== the thread hand-overs of one call_one ==")
    bench_hops.main()
    print("\n== Python calls per call_one, each side ==")
    bench_calls.main()
    print("\n== the cost of per-actor stats: on vs off ==")
    bench_stats.main()
    print("\n== the cost of OpenTelemetry tracing: on vs off ==")
    bench_telemetry.main()
    print("\n== attach: a controller behind one host agent's gateway ==")
    bench_attach.main()
    print("\n== TCP frame tags ==")
    bench_wire.main()
    print("\n== meshes ==")
    bench_mesh.main()
    print("\n== spawning: fork server vs exec ==")
    bench_spawn.main()
    print("\n== SPMD: danaus run vs torchrun ==")
    bench_spmd.main()
    print("\n== Lightning: DanausStrategy vs ddp_spawn; a plan's step from Lightning's loop ==")
    bench_lightning.main()
    print("\n== SLURM: SlurmJob.apply() to the first call ==")
    bench_slurm.main()
    print("\n== supervision ==")
    bench_supervision.main()
    print("\n== RDMA data plane: python -m danaus.rdma.bench --sizes 4096,1048576,67108864 ==")
    from danaus.rdma.bench import main as rdma_bench

    rdma_bench(["--sizes", "4096,1048576,67108864"])
    print("\n== tensor engine ==")
    bench_tensor_engine.main()
    print("\n== the tensor engine's simulator against a real mesh ==")
    bench_simulator.main()
    print("\n== whole-model parallelism: strategies against one process ==")
    bench_parallel.main()
    print("\n== whole-model parallelism: snapshots' cost, recovery from a lost proc ==")
    bench_recovery.main()
    print("\n== the planner's search on recorded costs, 4 to 4,096 simulated procs ==")
    bench_planner.main()
    print("\n== inference server example ==")
    bench_inference.main()


if __name__ == "__main__":
    main()
