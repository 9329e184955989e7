"""Lightning on meshes: ``Trainer(strategy=DanausStrategy(procs))`` trains an unmodified
LightningModule with every proc a rank of Lightning's DDP, and the controller's module and
trainer hold the result."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

from torch.utils.data import DataLoader  # noqa: E402

from danaus import SupervisionError, attach_to_hosts, this_host  # noqa: E402
from danaus.lightning import DanausStrategy  # noqa: E402
from danaus.parallel import PlanError  # noqa: E402
from danaus.spmd import RankFailure  # noqa: E402

from . import parallel_models as pm  # noqa: E402
from .agents_kit import controller_key, host_agents  # noqa: E402
from .lightning_modules import CausalLM, Regressor, fit_by_hand, lm_rows, regression_data  # noqa: E402

pytestmark = [
    pytest.mark.timeout(240),
    # Lightning's advice for a real run (more dataloader workers, TensorBoard), not errors
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
    pytest.mark.filterwarnings("ignore:.*tensorboardX"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
]

KEY = "7c" * 32  # the host agents' job key
QUIET = {"enable_progress_bar": False, "enable_model_summary": False}


def _trainer(strategy: Any, **kw: Any) -> Any:
    """A quiet Lightning trainer on CPU with ``strategy``: no logger and no checkpoints
    unless ``kw`` asks for them."""
    return L.Trainer(
        strategy=strategy,
        **{"accelerator": "cpu", "logger": False, "enable_checkpointing": False, **QUIET, **kw},
    )


def _max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(
        float((p - q).detach().abs().max())
        for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


def test_ddp_on_two_procs_equals_one_process_on_the_global_batch(tmp_path: Path) -> None:
    with this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        module = Regressor()
        trainer = _trainer(
            DanausStrategy(procs),
            devices=2,
            max_epochs=2,
            default_root_dir=tmp_path,
            log_every_n_steps=4,
            logger=True,
        )
        trainer.fit(module, regression_data(batch_size=4))  # 4 a rank: global batches of 8
    one = Regressor()
    fit_by_hand(one, regression_data(batch_size=8), epochs=2)
    assert _max_diff(module, one) < 1e-4  # the controller's module holds the trained weights
    assert _max_diff(module, Regressor()) > 1e-2  # (and they moved)
    assert trainer.state.finished and trainer.global_step == 16
    assert set(trainer.callback_metrics) == {"train_loss"}
    # the logger's files were written by rank 0, as under Lightning's DDP
    lines = (tmp_path / "lightning_logs/version_0/metrics.csv").read_text().splitlines()
    assert lines[0].split(",")[:2] == ["epoch", "step"] and len(lines) == 1 + 16 // 4


def test_model_checkpoint_files_load_back_and_validate_test_predict_run(tmp_path: Path) -> None:
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", mode="min")
    with this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        module = Regressor()
        trainer = _trainer(
            DanausStrategy(procs),
            devices=2,
            max_epochs=3,
            callbacks=[ckpt],
            enable_checkpointing=True,
        )
        trainer.fit(module, regression_data(4), regression_data(4, rows=32, seed=1))
        best = Path(ckpt.best_model_path)
        assert best.parent == tmp_path and best.exists(), ckpt.best_model_path
        loaded = Regressor.load_from_checkpoint(best)
        assert "val_loss" in trainer.callback_metrics
        assert float(ckpt.best_model_score) == pytest.approx(
            min(float(trainer.callback_metrics["val_loss"]), float(ckpt.best_model_score))
        )
        # validate and test on the mesh give the loss of the data set as one process sees it
        val = trainer.validate(loaded, regression_data(4, rows=32, seed=1), verbose=False)
        x, y = regression_data(32, rows=32, seed=1).dataset.tensors
        with torch.no_grad():
            want = float(torch.nn.functional.mse_loss(loaded(x), y))
        assert val[0]["val_loss"] == pytest.approx(want, rel=1e-5)
        tested = trainer.test(loaded, regression_data(4, rows=32, seed=1), verbose=False)
        assert tested[0]["test_loss"] == pytest.approx(want, rel=1e-5)
        # predict returns rank 0's predictions, as Lightning's DDP does
        out = trainer.predict(loaded, regression_data(4, rows=32, seed=1))
        assert out is not None and {rank for rank, _ in out} == {0}
        assert sum(len(p) for _, p in out) == 16


def test_a_failing_rank_fails_fit_with_its_traceback_and_the_procs_live_on() -> None:
    with this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        trainer = _trainer(DanausStrategy(procs), devices=2, max_epochs=1)
        with pytest.raises(RankFailure) as info:
            trainer.fit(Regressor(fail_rank=1, fail_step=2), regression_data(4))
        assert info.value.rank == 1
        assert "rank 1 fails at step 2 on purpose" in str(info.value.cause)
        assert "training_step" in str(info.value.cause)  # the rank's traceback
        # the procs were not stopped: a new trainer trains on them
        module = Regressor()
        again = _trainer(DanausStrategy(procs), devices=2, max_epochs=1)
        again.fit(module, regression_data(4))
        assert again.state.finished


def test_a_lost_proc_fails_fit_naming_it_and_no_rank_is_left_waiting() -> None:
    with this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        trainer = _trainer(DanausStrategy(procs), devices=2, max_epochs=1)
        with pytest.raises(RankFailure) as info:
            trainer.fit(Regressor(fail_rank=1, fail_step=2, how="kill"), regression_data(4))
        assert info.value.rank == 1
        assert isinstance(info.value.cause, SupervisionError), repr(info.value.cause)
        assert "procs" in str(info.value.cause) and "1" in str(info.value.cause)


@pytest.mark.slow
def test_ddp_across_two_host_agents_equals_one_process() -> None:
    env = dict(os.environ, DANAUS_AUTH_KEY=KEY, PYTHONPATH=os.getcwd())
    with host_agents([f"tcp://127.0.0.{i}:0" for i in (2, 3)], [env, env]) as agents:
        with controller_key(KEY):
            hosts = attach_to_hosts([addr for addr, _ in agents])
            with hosts.spawn_procs(per_host={"gpus": 1}) as procs:
                module = Regressor()
                trainer = _trainer(DanausStrategy(procs), devices=1, max_epochs=1)
                trainer.fit(module, regression_data(batch_size=4))
    one = Regressor()
    fit_by_hand(one, regression_data(batch_size=8), epochs=1)
    assert _max_diff(module, one) < 1e-4
    assert trainer.global_step == 8


def test_devices_unlike_the_mesh_are_refused() -> None:
    with this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2}) as procs:
        trainer = _trainer(DanausStrategy(procs), devices=3, max_epochs=1)
        with pytest.raises(
            ValueError, match=r"Trainer\(devices=3\) but the mesh has 2 procs per host"
        ):
            trainer.fit(Regressor(), regression_data(4))


# --- with a plan: the module's model laid out by danaus.parallel ----------------------


def _lm_loader(rows: int, batch: int = 8, seed: int = 1) -> Any:
    return DataLoader(lm_rows(rows, seed=seed), batch_size=batch)


@pytest.mark.slow
def test_a_pipeline_plan_trains_as_one_process(tmp_path: Path) -> None:
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path)
    with this_host().spawn_procs(per_host={"gpus": 4}) as procs:
        module = CausalLM(pm.gpt2())
        strategy = DanausStrategy(procs, dp=2, pp=2)
        trainer = _trainer(strategy, max_epochs=1, callbacks=[ckpt], enable_checkpointing=True)
        trainer.fit(module, _lm_loader(32), _lm_loader(8, seed=2))
        assert strategy.trainer_on_mesh is None  # stopped with the fit
        # the plan's schedule ran: dp=2 x pp=2
        assert trainer.global_step == 4
    one = pm.gpt2()
    losses = pm.train_over(one, list(_lm_loader(32)))
    assert _max_diff(module.model, one) < 1e-4  # every step's global batch, fully used
    assert float(trainer.callback_metrics["train_loss"]) == pytest.approx(losses[-1], abs=1e-4)
    with torch.no_grad():  # validation ran on the trained weights
        want = float(one(**next(iter(_lm_loader(8, seed=2)))).loss)
    assert float(trainer.callback_metrics["val_loss"]) == pytest.approx(want, abs=1e-4)
    # ModelCheckpoint saved what the mesh trained
    saved = torch.load(ckpt.best_model_path, weights_only=False)["state_dict"]
    assert (
        max(float((saved[f"model.{k}"] - v).abs().max()) for k, v in one.state_dict().items())
        < 1e-4
    )


@pytest.mark.slow
def test_a_tensor_parallel_plan_trains_as_one_process() -> None:
    with this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        module = CausalLM(pm.gpt2(layers=2))
        strategy = DanausStrategy(procs, tp=2)
        trainer = _trainer(strategy, max_steps=3)
        trainer.fit(module, _lm_loader(24))
        assert strategy.plan is not None and strategy.plan.tp == 2
    one = pm.gpt2(layers=2)
    pm.train_over(one, list(_lm_loader(24)))
    assert _max_diff(module.model, one) < 1e-4


def _gpus() -> int:
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 CUDA GPUs (NCCL); this machine has none")
def test_ddp_on_two_gpus_equals_one_process() -> None:
    with this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        module = Regressor()
        trainer = _trainer(DanausStrategy(procs), devices=2, max_epochs=1, accelerator="gpu")
        trainer.fit(module, regression_data(batch_size=4))
    one = Regressor()
    fit_by_hand(one, regression_data(batch_size=8), epochs=1)
    assert _max_diff(module.cpu(), one) < 1e-4  # GPU kernels round unlike the CPU's


@pytest.mark.slow
def test_plan_auto_chooses_a_layout_and_trains_as_one_process() -> None:
    with this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        module = CausalLM(pm.gpt2(layers=2))
        strategy = DanausStrategy(procs, plan="auto")
        trainer = _trainer(strategy, max_steps=3)
        trainer.fit(module, _lm_loader(24))
    one = pm.gpt2(layers=2)
    pm.train_over(one, list(_lm_loader(24)))
    assert _max_diff(module.model, one) < 1e-4


def test_a_training_step_the_plan_cannot_run_is_refused_before_the_procs_work() -> None:
    with this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        strategy = DanausStrategy(procs, dp=2)
        trainer = _trainer(strategy, max_steps=2)
        with pytest.raises(PlanError, match=r"training_step cannot be run as the plan's sch"):
            trainer.fit(CausalLM(pm.gpt2(layers=1), penalty=0.1), _lm_loader(8))
        assert strategy.trainer_on_mesh is None  # nothing was sent to the procs
        # a learning-rate scheduler is refused before the first step, saying so
        module = CausalLM(pm.gpt2(layers=1))
        opt = module.configure_optimizers()
        module.configure_optimizers = lambda: {  # type: ignore[method-assign]
            "optimizer": opt,
            "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1),
        }
        again = _trainer(DanausStrategy(procs, dp=2), max_steps=2)
        with pytest.raises(PlanError, match=r"learning-rate scheduler"):
            again.fit(module, _lm_loader(8))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_example_trains_gpt2_with_the_planner_and_with_a_pipeline() -> None:
    import subprocess
    import sys

    example = Path(__file__).parents[2] / "examples" / "lightning_gpt2.py"
    out = subprocess.run(
        [sys.executable, str(example), "--steps", "12", "--batch", "8"],
        capture_output=True, text=True, timeout=280, check=True,
    ).stdout  # fmt: skip
    lines = [line for line in out.splitlines() if line.startswith("DanausStrategy(procs, ")]
    assert [line.split(":")[0] for line in lines] == [
        "DanausStrategy(procs, plan='auto')",
        "DanausStrategy(procs, dp=2, pp=2)",
    ], out
    assert "dp=2 x pp=2" in lines[1] or "pp=2" in lines[1], lines[1]
    for line in lines:  # each learned
        first, last = (float(v) for v in line.split("loss ")[1].split(" in ")[0].split(" -> "))
        assert last < first, line
