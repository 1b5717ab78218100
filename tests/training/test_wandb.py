"""--wandb.*: the real W&B client in offline mode (no network) writes LeRobot's metric names,
checkpoint artifacts and tags into <output_dir>/wandb/, read back with W&B's own reader; a
resumed run continues the same run id."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tiny import run_train, tiny_act_flags

from lerobot_pipe.configs.train import WandBConfig
from lerobot_pipe.training.trackers import MetricsLog, saved_run_id, wandb_mode, wandb_problem

TRAIN_KEYS = {
    "train/loss",
    "train/grad_norm",
    "train/lr",
    "train/samples_per_s",
    "train/dataloading_s",
    "train/preprocessing_s",
    "train/update_s",
    "train/step_s",
    "train/steps",
    "train/samples",
    "train/episodes",
    "train/epochs",
}


def _scan(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb
    from wandb.sdk.internal import datastore

    store = datastore.DataStore()
    store.open_for_scan(str(path))
    records = []
    while (data := store.scan_data()) is not None:
        record = pb.Record()
        record.ParseFromString(data)
        records.append(record)
    return records


def read_wandb_run(run_dir: Path, timeout: float = 30.0) -> dict:
    """A run folder's records, through wandb's own reader of its transaction log (.wandb; an
    offline run has no summary or history file beside it). Test-only use of wandb's internal
    modules: if a release moves them, this reader, not the trainer, needs updating.
    ``run.finish()`` returns before W&B's service process has written the log out: wait for
    its last record (``exit``)."""
    (path,) = run_dir.glob("run-*.wandb")
    deadline = time.monotonic() + timeout
    while True:
        records = _scan(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        assert time.monotonic() < deadline, f"{path}: no exit record after {timeout} s"
        time.sleep(0.1)
    out: dict = {"history": [], "artifacts": []}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            out |= {"id": run.run_id, "name": run.display_name, "project": run.project}
            out |= {"tags": list(run.tags), "job_type": run.job_type}
            config = run.config.update
            out["config"] = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in config
            }
        elif kind == "history":
            items = record.history.item
            out["history"].append(
                {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
            )
        elif kind == "artifact":
            artifact = record.artifact
            files = sorted(e.path for e in artifact.manifest.contents)
            out["artifacts"].append((artifact.name, artifact.type, files))
    return out


@pytest.fixture(scope="module")
def wandb_env(tmp_path_factory):
    """W&B's own folders (cache, artifact staging, settings) in a temporary folder, no key."""
    pytest.importorskip("wandb")
    home = tmp_path_factory.mktemp("wandb-home")
    with pytest.MonkeyPatch.context() as mp:
        for name in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
            mp.setenv(name, str(home / name.lower()))
        for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_RUN_ID", "WANDB_DIR"):
            mp.delenv(name, raising=False)
        mp.setenv("NETRC", str(home / "no-netrc"))
        yield home


@pytest.fixture(scope="module")
def wandb_runs(dataset_root, wandb_env, tmp_path_factory):
    """Run 1: 4 steps, logged at 2 and 4, checkpoints 2 and 4; run 2 resumes it to step 6."""
    out = tmp_path_factory.mktemp("wandb") / "out"
    flags = tiny_act_flags(
        **{"dataset.root": dataset_root, "log_freq": 2, "save_freq": 2, "batch_size": 4}
    )
    common = [*flags, "--wandb.enable=true", "--wandb.mode=offline", "--job_name=wb"]
    run_train([*common, "--steps=4", f"--output_dir={out}"])
    first = sorted((out / "wandb").glob("offline-run-*"))
    run_train([*common, "--steps=6", "--resume=true", f"--output_dir={out}"])
    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(first) == 1 and len(runs) == 2
    second = next(r for r in runs if r != first[0])
    return out, read_wandb_run(first[0]), read_wandb_run(second)


def test_train_metrics_with_lerobots_names(wandb_runs):
    out, first, _ = wandb_runs
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in first["history"] if any(k.startswith("train/") for k in r)]
    assert [r["_step"] for r in rows] == [2, 4]
    for row, record in zip(rows, metrics[:2], strict=True):
        assert set(row) >= TRAIN_KEYS, sorted(row)
        assert row["train/loss"] == pytest.approx(record["loss"])
        assert row["train/step_s"] == pytest.approx(record["step_s"])
        assert row["train/samples"] == record["samples"] == 4 * row["_step"]
        assert row["train/steps"] == row["_step"]
    assert first["name"] == "wb" and first["project"] == "lerobot"
    assert first["job_type"] == "train_eval"
    assert first["tags"] == ["policy:act", "seed:1000", "dataset:ds"]
    assert first["config"]["steps"] == 4 and first["config"]["wandb"]["enable"] is True


def test_checkpoints_are_model_artifacts(wandb_runs):
    _, first, second = wandb_runs
    name = "policy_act-seed_1000-dataset_ds-{}"
    assert first["artifacts"] == [
        (name.format("000002"), "model", ["model.safetensors"]),
        (name.format("000004"), "model", ["model.safetensors"]),
    ]
    # The resumed run logs its own checkpoint only, not the one it resumed from.
    assert second["artifacts"] == [(name.format("000006"), "model", ["model.safetensors"])]


def test_a_resumed_run_continues_the_same_run_id(wandb_runs):
    out, first, second = wandb_runs
    assert second["id"] == first["id"] == saved_run_id(out)
    steps = [r["_step"] for r in second["history"] if "train/loss" in r]
    assert steps == [6]


def test_eval_records_are_logged_under_eval(wandb_env, dataset_root, tmp_path):
    """The logger's eval records (the trainer's held-out loss: training/test_heldout.py)."""
    from lerobot_pipe.configs.loading import parse_train_config
    from lerobot_pipe.configs.parser import replace
    from lerobot_pipe.training.config_checks import validate_config

    argv = [*tiny_act_flags(**{"dataset.root": dataset_root}), "--wandb.enable=true"]
    cfg, _ = parse_train_config([*argv, "--wandb.mode=offline", "--wandb.add_tags=false"])
    cfg = replace(validate_config(cfg), output_dir=str(tmp_path))
    log = MetricsLog(cfg, start_step=0, is_main=True, num_frames=1000, num_episodes=20)
    log.log({"step": 3, "loss": 0.25, "samples": 24})
    log.log({"step": 3, "eval_loss": 0.5, "avg_sum_reward": 1.5}, mode="eval")
    with pytest.raises(ValueError, match="mode must be one of"):
        log.log({"step": 3, "x": 1.0}, mode="test")
    log.close()
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    run = read_wandb_run(run_dir)
    (row,) = run["history"]
    assert row["_step"] == 3 and row["eval/eval_loss"] == 0.5 and row["eval/avg_sum_reward"] == 1.5
    assert row["train/loss"] == 0.25 and row["train/epochs"] == 24 / 1000
    assert run["tags"] == []
    # metrics.jsonl holds both, the eval record on its own line (told apart by having no loss).
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records == [
        {"step": 3, "loss": 0.25, "samples": 24},
        {"step": 3, "eval_loss": 0.5, "avg_sum_reward": 1.5},
    ]


def _two_offline_steps(dataset_root, out, *flags: str) -> tuple[dict, list[dict]]:
    """The tiny ACT trained 2 steps (log_freq 2, batch 4) with ``flags``, logged to an offline
    W&B run: the run's one history row, and the records of metrics.jsonl."""
    run_train(
        [
            *tiny_act_flags(**{"dataset.root": dataset_root, "log_freq": 2, "batch_size": 4}),
            "--steps=2",
            "--save_freq=0",
            *flags,
            "--wandb.enable=true",
            "--wandb.mode=offline",
            f"--output_dir={out}",
        ]
    )
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    (row,) = read_wandb_run(run_dir)["history"]
    return row, [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_held_out_loss_is_logged_under_eval(wandb_env, dataset_root, tmp_path):
    """The trainer's eval_loss (--eval_steps) as LeRobot logs it: eval/eval_loss at its step;
    episodes and epochs count the training episodes only (LeRobot's train dataset)."""
    row, records = _two_offline_steps(
        dataset_root, tmp_path, "--dataset.eval_split=0.25", "--eval_steps=2"
    )
    (record,) = [r for r in records if "eval_loss" in r]
    assert row["_step"] == record["step"] == 2
    assert row["eval/eval_loss"] == pytest.approx(record["eval_loss"])
    assert row["eval/eval_samples"] == 5 * 50  # the last 5 of the 20 episodes
    assert row["train/epochs"] == pytest.approx(8 / (15 * 50))
    assert row["train/episodes"] == pytest.approx(8 / 50)


def test_the_rollouts_are_logged_under_eval(wandb_env, dataset_root, tmp_path):
    """The in-training rollouts' summary (--env.*, --env_eval_freq) under LeRobot's names:
    eval/pc_success, eval/avg_sum_reward, eval/eval_s, beside ours."""
    row, records = _two_offline_steps(
        dataset_root,
        tmp_path,
        "--env.type=synthetic",
        "--env_eval_freq=2",
        "--eval.n_episodes=2",
        "--eval.batch_size=1",
        "--eval.use_async_envs=false",
    )
    (record,) = [r for r in records if "pc_success" in r]
    assert row["_step"] == record["step"] == 2
    for key in ("pc_success", "avg_sum_reward", "avg_max_reward", "eval_s", "episodes_per_s"):
        assert row[f"eval/{key}"] == pytest.approx(record[key]), key
    assert row["eval/n_episodes"] == 2


def test_a_resume_without_a_wandb_run_starts_one(wandb_env, dataset_root, tmp_path, caplog):
    """Resuming a run that did not log to W&B (its folder holds no W&B run): a new run, said."""
    from lerobot_pipe.configs.loading import parse_train_config
    from lerobot_pipe.configs.parser import replace
    from lerobot_pipe.training.config_checks import validate_config

    argv = [*tiny_act_flags(**{"dataset.root": dataset_root}), "--wandb.enable=true"]
    cfg, _ = parse_train_config([*argv, "--wandb.mode=offline"])
    cfg = replace(validate_config(cfg), output_dir=str(tmp_path))
    log = MetricsLog(cfg, start_step=4, is_main=True)
    log.close()
    assert any("logging to a new W&B run" in r.message for r in caplog.records)
    assert saved_run_id(tmp_path) == log.wandb.run_id


def test_async_checkpoints_are_logged_once_durable(wandb_env, dataset_root, tmp_path):
    """Async saves: each checkpoint is logged when it is durable (the save after it, or the
    end); retention deletes the older folders afterwards, their artifacts are kept."""
    flags = tiny_act_flags(**{"dataset.root": dataset_root, "log_freq": 2, "save_freq": 2})
    out = tmp_path / "out"
    run_train(
        [
            *flags,
            "--steps=6",
            "--wandb.enable=true",
            "--wandb.mode=offline",
            "--checkpoint_async=true",
            "--checkpoint_keep_last=1",
            f"--output_dir={out}",
        ]
    )
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["000006", "last"]
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    names = [a[0].rsplit("-", 1)[1] for a in read_wandb_run(run_dir)["artifacts"]]
    assert names == ["000002", "000004", "000006"]


def test_disable_artifact_uploads_no_checkpoint(wandb_env, dataset_root, tmp_path):
    from lerobot_pipe.configs.loading import parse_train_config
    from lerobot_pipe.configs.parser import replace
    from lerobot_pipe.training.config_checks import validate_config

    argv = [*tiny_act_flags(**{"dataset.root": dataset_root}), "--wandb.enable=true"]
    cfg, _ = parse_train_config([*argv, "--wandb.mode=offline", "--wandb.disable_artifact=true"])
    cfg = replace(validate_config(cfg), output_dir=str(tmp_path))
    log = MetricsLog(cfg, start_step=0, is_main=True)
    pretrained = tmp_path / "checkpoints" / "000002" / "pretrained_model"
    pretrained.mkdir(parents=True)
    (pretrained / "model.safetensors").write_bytes(b"weights")
    log.checkpoint(pretrained.parent)
    log.log({"step": 2, "loss": 1.0})
    log.close()
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    run = read_wandb_run(run_dir)
    assert run["artifacts"] == [] and run["history"][0]["train/loss"] == 1.0


def test_a_dcp_only_checkpoint_logs_no_artifact(wandb_env, dataset_root, tmp_path, caplog):
    """--checkpoint_format=dcp: the weights are DCP shards only; no artifact, said once."""
    from lerobot_pipe.configs.loading import parse_train_config
    from lerobot_pipe.configs.parser import replace
    from lerobot_pipe.training.config_checks import validate_config

    argv = [*tiny_act_flags(**{"dataset.root": dataset_root}), "--checkpoint_format=dcp"]
    cfg, _ = parse_train_config([*argv, "--wandb.enable=true", "--wandb.mode=offline"])
    cfg = replace(validate_config(cfg), output_dir=str(tmp_path))
    log = MetricsLog(cfg, start_step=0, is_main=True)
    for step in ("000002", "000004"):
        pretrained = tmp_path / "checkpoints" / step / "pretrained_model"
        (pretrained / "pytorch_model_fsdp_0").mkdir(parents=True)
        (pretrained / "config.json").write_text("{}")
        log.checkpoint(pretrained.parent)
    log.close()
    warnings = [r.message for r in caplog.records if "no W&B model artifact" in r.message]
    assert len(warnings) == 1 and "--checkpoint_format=safetensors_dcp" in warnings[0]
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    assert read_wandb_run(run_dir)["artifacts"] == []


def _no_network_prefix() -> list[str]:
    """A command prefix that runs a process in a network namespace of its own (no interface
    but a loopback that is down), or [] where unshare cannot make one."""
    import shutil
    import subprocess

    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    ok = subprocess.run([unshare, "-rn", "true"], capture_output=True).returncode == 0
    return [unshare, "-rn"] if ok else []


@pytest.mark.slow
def test_offline_mode_needs_no_network(wandb_env, dataset_root, tmp_path):
    import os
    import subprocess
    import sys

    prefix = _no_network_prefix()
    if not prefix:
        pytest.skip("unshare -rn (a network namespace) is not available here")
    flags = tiny_act_flags(**{"dataset.root": dataset_root, "steps": 2, "save_freq": 2})
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            *prefix,
            sys.executable,
            "-m",
            "lerobot_pipe.scripts.train",
            *flags,
            "--wandb.enable=true",
            "--wandb.mode=offline",
            f"--output_dir={out}",
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    run = read_wandb_run(run_dir)
    assert [r["_step"] for r in run["history"] if "train/loss" in r] == [1, 2]
    assert len(run["artifacts"]) == 1


def test_a_run_wandb_refuses_stops_every_rank(wandb_env, dataset_root, tmp_path):
    """W&B refusing to start its run on the main rank (here a run id it does not accept)
    stops both ranks with its message, as a user error: no rank waits for the other."""
    from launch import run_distributed

    flags = tiny_act_flags(**{"dataset.root": dataset_root, "steps": 2, "save_freq": 0})
    argv = [*flags, "--wandb.enable=true", "--wandb.mode=offline", "--wandb.run_id=bad/id"]
    argv.append(f"--output_dir={tmp_path}")
    results = run_distributed(_train_expecting_tracker_error, 2, argv, timeout=90)
    assert results == ["refused", "refused"]


def _train_expecting_tracker_error(argv):
    from lerobot_pipe.training.trackers import TrackerError

    with pytest.raises(TrackerError, match=r"W&B could not start its run \(offline\): Run ID"):
        run_train(argv)
    return "refused"


def test_the_mode_is_the_flag_then_wandb_mode_then_online():
    cfg = WandBConfig(enable=True)
    assert wandb_mode(cfg, {}) == "online"
    assert wandb_mode(cfg, {"WANDB_MODE": "offline"}) == "offline"
    assert wandb_mode(cfg, {"WANDB_MODE": "dryrun"}) == "offline"  # W&B's older name
    assert (
        wandb_mode(WandBConfig(enable=True, mode="online"), {"WANDB_MODE": "offline"}) == "online"
    )
    assert wandb_problem(WandBConfig(enable=False, mode="nonsense"), {}) is None
    assert "--wandb.project" in wandb_problem(WandBConfig(enable=True, project=""), {})


def test_online_needs_a_configured_key_looked_up_without_a_request(tmp_path):
    """WANDB_API_KEY, or the netrc entry `wandb login` writes for the W&B host."""
    pytest.importorskip("wandb")
    cfg = WandBConfig(enable=True)
    netrc = tmp_path / "netrc"
    no_key = {"NETRC": str(netrc)}
    assert "no W&B API key" in wandb_problem(cfg, no_key)
    assert wandb_problem(cfg, {**no_key, "WANDB_MODE": "offline"}) is None
    assert "WANDB_MODE='bogus'" in wandb_problem(cfg, {**no_key, "WANDB_MODE": "bogus"})
    assert wandb_problem(cfg, {**no_key, "WANDB_API_KEY": "x" * 40}) is None
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert wandb_problem(cfg, no_key) is None
    other_host = {**no_key, "WANDB_BASE_URL": "https://wandb.example.org"}
    assert "no W&B API key" in wandb_problem(cfg, other_host)


def test_the_artifact_holds_what_lerobots_loaders_read(tmp_path):
    """LeRobot's choice of files: LoRA's adapter with its config and the policy's config.json,
    else model.safetensors; a DCP-only pretrained_model/ has neither."""
    from lerobot_pipe.training.trackers import model_files

    lora, full, dcp = (tmp_path / name for name in ("lora", "full", "dcp"))
    for folder, files in (
        (lora, ["adapter_model.safetensors", "adapter_config.json", "config.json"]),
        (full, ["model.safetensors", "config.json", "policy_preprocessor.json"]),
        (dcp, ["config.json"]),
    ):
        folder.mkdir()
        for name in files:
            (folder / name).write_text("{}")
    assert [p.name for p in model_files(lora)] == [
        "adapter_model.safetensors",
        "adapter_config.json",
        "config.json",
    ]
    assert [p.name for p in model_files(full)] == ["model.safetensors"]
    assert model_files(dcp) == []
