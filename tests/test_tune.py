"""raytf in Ray Tune: a user's own Tuner, PBT, a resumed sweep, a search algorithm.

Real Tune on a real local Ray; trials run raytf.fit, which reports every epoch and
checkpoints for Tune.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import workloads

import raytf

pytestmark = [pytest.mark.ray, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))


def epochs_reported(result) -> list[tuple[int, int]]:
    frame = result.metrics_dataframe
    return list(zip(frame["training_iteration"], frame["epoch"]))


def test_own_tuner_gets_epochs_and_checkpoints_and_retries_from_them(local_ray, tmp_path):
    """Each layout in a user's Tuner reports per epoch with a checkpoint; the all-reduce
    trial loses a worker (SIGKILL) in epoch 2 and Tune's retry resumes at epoch 2."""
    from ray import tune

    marker = str(tmp_path / "killed")

    def trainable(config):
        dies = config["layout"] == "all-reduce"
        raytf.fit(
            workloads.mlp_lr,
            workloads.dying_data(marker, at_step=14) if dies else workloads.data,
            layout=config["layout"],
            use_gpu=False,
            global_batch_size=64,
            epochs=2,
            verbose=False,
        )
        if config["layout"] == "towers":  # a second fit in the same trial starts afresh
            raytf.fit(
                workloads.mlp_lr,
                workloads.data,
                layout="towers",
                use_gpu=False,
                global_batch_size=64,
                verbose=False,
            )

    tuner = tune.Tuner(
        tune.with_resources(
            trainable, lambda cfg: raytf.trial_resources(layout=cfg["layout"], use_gpu=False)
        ),
        param_space={"layout": tune.grid_search(["towers", "all-reduce", "parameter-server"])},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path),
            name="own",
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=1),
        ),
    )
    grid = tuner.fit()
    assert os.path.exists(marker)  # the all-reduce worker was killed
    for result in grid:
        layout = result.config["layout"]
        assert result.error is None, (layout, result.error)
        # Two epochs, two reports: the retried trial went on at epoch 2 (from scratch, Tune
        # would have seen epoch 1 again as its third iteration). Towers' second fit trained
        # its own epoch, not resumed the first fit's last checkpoint.
        second = [(3, 1)] if layout == "towers" else []
        assert epochs_reported(result) == [(1, 1), (2, 2), *second], layout
        losses = list(result.metrics_dataframe["loss"])
        assert losses[1] < losses[0]
        if layout == "towers":  # the second fit's epoch 1 is the first fit's: a fresh model
            assert losses[2] == pytest.approx(losses[0], rel=1e-6)
        with result.checkpoint.as_directory() as path:
            state_dir = os.path.join(path, "ps-0") if layout == "parameter-server" else path
            with open(os.path.join(state_dir, "checkpoint")) as f:
                state = f.read()
            newest = state.split('"')[1]
            assert state.count("all_model_checkpoint_paths") == 1, state  # the newest only
            assert os.path.exists(os.path.join(state_dir, newest + ".index"))


def test_pbt_clones_the_better_trials_checkpoint(local_ray, tmp_path):
    """Two trials at once (one CPU device each), one with a rate too small to learn: PBT
    makes it go on from the other's epoch-1 checkpoint, so its epoch 2 ends far below where
    its own rate could take it."""
    import json

    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    result = raytf.sweep(
        workloads.mlp_lr,
        workloads.data,
        space={"lr": tune.grid_search([1e-5, 0.03])},
        metric="loss",
        # Synchronous: both trials compare at epoch 1 (asynchronous PBT, raytf's "pbt", may
        # compare one trial's epoch 1 with the other's last).
        scheduler=PopulationBasedTraining(
            time_attr="training_iteration",  # one perturbation per epoch
            perturbation_interval=1,
            hyperparam_mutations={"lr": [1e-5, 0.03]},
            quantile_fraction=0.5,
            synch=True,
        ),
        layout="towers",
        replicas=1,
        use_gpu=False,
        global_batch_size=64,
        epochs=2,
        storage_path=str(tmp_path),
        name="pbt",
        verbose=False,
    )
    with open(os.path.join(result.path, "pbt_global.txt")) as f:
        exploits = [json.loads(line) for line in f if line.strip()]
    assert exploits, "PBT never exploited"
    target = exploits[0][0]  # the trial that cloned the other: the one that started at 1e-5
    (slow,) = [r for r in result.grid if f"_{target}_" in os.path.basename(r.path)]
    # On its own, lr=1e-5 leaves this loss at 1.277 after epoch 1 and 1.276 after epoch 2;
    # the other trial's epoch-1 checkpoint is at 1.00.
    assert slow.error is None and slow.metrics["epoch"] == 2
    assert slow.metrics["loss"] < 1.15, (slow.metrics, exploits)


def test_an_optuna_sweep_resumes_after_its_driver_is_killed(local_ray, tmp_path):
    """Optuna samples three rates one trial at a time; the driver is SIGKILLed once a trial
    has reported its two epochs, and ``resume=True`` finishes the sweep from Tune's state."""
    import ray
    from ray import tune

    script = tmp_path / "sweep_driver.py"
    script.write_text(
        "import sys\n"
        "import ray, workloads\n"
        "from ray import cloudpickle, tune\n"
        "import raytf\n"
        "cloudpickle.register_pickle_by_value(workloads)\n"
        "ray.init(address=sys.argv[1])\n"
        "raytf.sweep(workloads.mlp_lr, workloads.data,\n"
        "    space={'lr': tune.loguniform(1e-3, 1e-1)}, metric='loss', search_alg='optuna',\n"
        "    num_samples=3, layout='towers', use_gpu=False, global_batch_size=64, epochs=2,\n"
        "    max_concurrent_trials=1, storage_path=sys.argv[2], name='resumable',\n"
        "    verbose=False)\n"
    )
    env = {**os.environ, "PYTHONPATH": HERE, "TUNE_GLOBAL_CHECKPOINT_S": "0"}
    address = ray.get_runtime_context().gcs_address
    log = tmp_path / "driver.log"
    driver = subprocess.Popen(
        [sys.executable, str(script), address, str(tmp_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),  # a file: a full pipe would stop the driver
    )
    sweep_dir = tmp_path / "resumable"
    try:
        deadline = time.monotonic() + 180
        while not _a_trial_reported(sweep_dir, epochs=2):
            if driver.poll() is not None:
                raise AssertionError(log.read_text()[-3000:])
            assert time.monotonic() < deadline, "no trial finished an epoch in 180 s"
            time.sleep(0.5)  # polling a file the driver writes, with a deadline
        killed_at = time.time()
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)

    resumed = raytf.sweep(
        workloads.mlp_lr,
        workloads.data,
        space={"lr": tune.loguniform(1e-3, 1e-1)},
        metric="loss",
        search_alg="optuna",
        num_samples=3,
        layout="towers",
        use_gpu=False,
        global_batch_size=64,
        epochs=2,
        storage_path=str(tmp_path),
        name="resumable",
        resume=True,
        verbose=False,
    )
    assert [r["status"] for r in resumed.rows] == ["ok"] * 3
    rates = [r["config"]["lr"] for r in resumed.rows]
    assert len(set(rates)) == 3 and all(1e-3 <= lr <= 1e-1 for lr in rates)  # Optuna's
    kept = 0
    for result in resumed.grid:
        epochs = [epoch for _, epoch in epochs_reported(result)]
        # No trial started over: epoch 1 once. (An epoch after the newest checkpoint the
        # sweep's state had recorded when the driver died is trained again.)
        assert epochs.count(1) == 1 and epochs[-1] == 2, epochs_reported(result)
        kept += result.metrics_dataframe["timestamp"].iloc[0] < killed_at
    assert kept >= 1  # work from before the kill was kept, not redone


def _a_trial_reported(sweep_dir, epochs: int) -> bool:
    if not sweep_dir.is_dir():
        return False
    for progress in sweep_dir.glob("*/progress.csv"):
        if len(progress.read_text().strip().splitlines()) > epochs:  # a header and the rows
            return True
    return False


def test_bad_scheduler_and_search_arguments_fail_before_tune(local_ray):
    from ray import tune

    common = dict(global_batch_size=8, metric="loss")
    with pytest.raises(raytf.ConfigError, match="scheduler='pbt' perturbs float parameters"):
        raytf.sweep(
            workloads.mlp_lr, workloads.data, space={"layout": "towers"}, scheduler="pbt", **common
        )
    with pytest.raises(raytf.ConfigError, match=r"\['lr'\] are tune.grid_search"):
        raytf.sweep(
            workloads.mlp_lr,
            workloads.data,
            space={"lr": tune.grid_search([0.1, 0.2])},
            search_alg="optuna",
            **common,
        )
    with pytest.raises(raytf.ConfigError, match="search_alg must be one of"):
        raytf.sweep(
            workloads.mlp_lr,
            workloads.data,
            space={"lr": tune.choice([0.1])},
            search_alg="grid",
            **common,
        )
    with pytest.raises(raytf.ConfigError, match="found no sweep to resume"):
        raytf.sweep(
            workloads.mlp_lr,
            workloads.data,
            space={"lr": 0.1},
            storage_path="/nonexistent/raytf",
            resume=True,
            **common,
        )
