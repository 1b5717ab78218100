"""Bad inputs fail before any process group starts: rank 0 of a would-be 2-process run exits
alone with status 2 and a one-line message, and writes nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest
from tiny import tiny_act_flags

from lerobot_pipe.scripts.train import main as train_main


def _image_dataset(src, dst):
    shutil.copytree(src, dst)
    info = json.loads((dst / "meta/info.json").read_text())
    info["features"]["observation.images.top"] = {
        "dtype": "video",
        "shape": [3, 64, 64],
        "names": None,
    }
    (dst / "meta/info.json").write_text(json.dumps(info))
    return dst


def _corrupt_info(src, dst):
    shutil.copytree(src, dst)
    (dst / "meta/info.json").write_text('{"codebase_version": "v3.0", ')
    return dst


# (id, extra flags, environment, expected message fragment); "{ds}" is the dataset root.
CASES = [
    ("unknown-flag", ["--stepz=10"], {}, "Did you mean --steps"),
    ("misspelled-policy-field", ["--policy.dim_modle=8"], {}, "--policy.dim_modle: unknown flag"),
    ("bad-int", ["--batch_size=abc"], {}, "--batch_size='abc': expected an integer"),
    ("bad-bool", ["--save_checkpoint=maybe"], {}, "expected true or false"),
    ("bad-float", ["--optimizer.lr=fast"], {}, "--optimizer.lr='fast': expected a number"),
    (
        "dp-product",
        ["--parallelism.dp_replicate=1", "--parallelism.dp_shard=1"],
        {},
        "the product must equal the world size",
    ),
    (
        "dp-not-dividing",
        ["--parallelism.dp_shard=3"],
        {},
        "--parallelism.dp_shard=3 does not divide the world size 2",
    ),
    ("dp-zero", ["--parallelism.dp_shard=0"], {}, "must be a positive integer or -1"),
    ("steps-zero", ["--steps=0"], {}, "--steps=0: must be > 0"),
    ("batch-negative", ["--batch_size=-1"], {}, "--batch_size=-1: must be > 0"),
    ("save-freq-negative", ["--save_freq=-5"], {}, "--save_freq=-5: must be >= 0"),
    (
        "save-freq-vs-accum",
        ["--save_freq=3", "--accelerator.gradient_accumulation.steps=2"],
        {},
        "must be a multiple of",
    ),
    (
        "keep-last-negative",
        ["--checkpoint_keep_last=-1"],
        {},
        "--checkpoint_keep_last=-1: must be >= 0",
    ),
    ("mixed-precision", ["--accelerator.mixed_precision=fp8"], {}, "choose one of no, fp16, bf16"),
    (
        "checkpoint-format",
        ["--checkpoint_format=zip"],
        {},
        "choose one of safetensors, dcp, safetensors_dcp",
    ),
    ("policy-type", ["--policy.type=diffusionx"], {}, "unknown policy type"),
    ("policy-heads", ["--policy.n_heads=5"], {}, "n_heads"),
    ("policy-action-steps", ["--policy.n_action_steps=50"], {}, "n_action_steps"),
    (
        "lr-negative",
        [
            "--use_policy_training_preset=false",
            "--optimizer.type=adamw",
            "--optimizer.lr=-1",
            "--scheduler.type=constant_with_warmup",
        ],
        {},
        "--optimizer.lr=-1.0: must be >= 0",
    ),
    ("policy-lr-negative", ["--policy.optimizer_lr=-1"], {}, "optimizer_lr must be >= 0"),
    (
        "no-scheduler",
        ["--use_policy_training_preset=false", "--optimizer.type=adamw"],
        {},
        "needs --scheduler.type too",
    ),
    (
        "wandb-mode",
        ["--wandb.enable=true", "--wandb.mode=ofline"],
        {},
        "--wandb.mode='ofline': choose one of online, offline, disabled",
    ),
    (
        "peft-method",
        ["--peft.method_type=MISS"],
        {},
        "--peft.method_type='MISS': choose one of LORA",
    ),
    (
        "env-never-rolled-out",
        ["--env.type=synthetic", "--env_eval_freq=0"],
        {},
        "--env.type=synthetic is rolled out every --env_eval_freq steps, and --env_eval_freq=0",
    ),
    ("env-eval-freq-negative", ["--env_eval_freq=-1"], {}, "--env_eval_freq=-1: must be >= 0"),
    (
        "env-eval-no-episodes",
        ["--env.type=synthetic", "--eval.n_episodes=0"],
        {},
        "--eval.n_episodes=0: at least 1",
    ),
    (
        "env-recording",
        ["--env.type=synthetic", "--eval.recording=true"],
        {},
        "--eval.recording: recording the rollouts as a dataset is not built",
    ),
    (
        "env-unknown-type",
        ["--env.type=libero"],
        {},
        "--env.type='libero': unknown env type; choose one of: aloha, pusht, synthetic",
    ),
    (
        "env-unknown-task",
        ["--env.type=synthetic", "--env.task=Reach-v9"],
        {},
        "--env.task='Reach-v9': lerobot_pipe/Reach-v9 is not registered",
    ),
    (
        "env-features-not-delivered",
        ["--env.type=synthetic", "--env.pixels_only=true", '--env.cameras=["top"]'],
        {},
        "the policy does not fit --env.type=synthetic (lerobot_pipe/Reach-v0): "
        "observation.environment_state [2] is not delivered",
    ),
    (
        "env-features-pusht",
        ["--env.type=pusht"],
        {},
        "the policy does not fit --env.type=pusht (gym_pusht/PushT-v0)",
    ),
    (
        "eval-steps-without-split",
        ["--eval_steps=10"],
        {},
        "--eval_steps=10 evaluates on held-out episodes: it needs --dataset.eval_split > 0",
    ),
    (
        "eval-split-one",
        ["--dataset.eval_split=1"],
        {},
        "--dataset.eval_split=1.0: must be in [0, 1)",
    ),
    (
        "eval-split-negative",
        ["--dataset.eval_split=-0.1"],
        {},
        "--dataset.eval_split=-0.1: must be in [0, 1)",
    ),
    (
        "eval-split-no-training-episode",
        ["--dataset.eval_split=0.99", "--eval_steps=2"],
        {},
        "--dataset.eval_split=0.99 leaves no training episode of 20",
    ),
    ("eval-steps-negative", ["--eval_steps=-1"], {}, "--eval_steps=-1: must be >= 0"),
    (
        "max-eval-samples-negative",
        ["--max_eval_samples=-1"],
        {},
        "--max_eval_samples=-1: must be >= 0",
    ),
    ("rename-without-pretrained", ['--rename_map={"a": "b"}'], {}, "--rename_map renames"),
    ("workers-negative", ["--num_workers=-1"], {}, "--num_workers=-1: must be >= 0"),
    ("push-without-repo", ["--policy.push_to_hub=true"], {}, "needs --policy.repo_id"),
    (
        "push-bad-repo-id",
        ["--policy.push_to_hub=true", "--policy.repo_id=me/../act"],
        {"HF_TOKEN": "hf_test"},
        "--policy.repo_id: invalid repo_id 'me/../act': '..' is not allowed",
    ),
    (
        "push-dcp-only",
        ["--policy.push_to_hub=true", "--policy.repo_id=me/act", "--checkpoint_format=dcp"],
        {"HF_TOKEN": "hf_test"},
        "--checkpoint_format=dcp does not write",
    ),
    (
        "push-without-token",
        ["--policy.push_to_hub=true", "--policy.repo_id=me/act"],
        {"HF_TOKEN": "", "HF_TOKEN_PATH": "/nonexistent/token", "HF_HOME": "/nonexistent/hf"},
        "no Hugging Face token to push me/act with",
    ),
    ("scheduler-type", ["--scheduler.type=linear"], {}, "--scheduler.type='linear'"),
    ("positional", ["extra"], {}, "unexpected argument 'extra'"),
    ("missing-dataset", ["--dataset.root=/nonexistent/ds"], {}, "/nonexistent/ds"),
    (
        "missing-config-path",
        ["--config_path=/nonexistent/train_config.json"],
        {},
        "--config_path not found",
    ),
    ("resume-without-checkpoint", ["--resume=true"], {}, "holds no complete, undamaged checkpoint"),
    ("accelerate-env", [], {"ACCELERATE_USE_FSDP": "true"}, "ACCELERATE_USE_FSDP=true"),
    (
        "wrap-class-missing",
        [
            "--parallelism.dp_shard=2",
            '--accelerator.fsdp.wrap_modules=["ACTEncoderLayer","NoSuchLayer"]',
        ],
        {},
        "NoSuchLayer match no module of the model; module classes present: ACT, ACTDecoder",
    ),
    (
        "wrap-exclusive",
        [
            "--parallelism.dp_shard=2",
            '--accelerator.fsdp.wrap_modules=["ACTEncoderLayer"]',
            "--accelerator.fsdp.min_num_params=10",
        ],
        {},
        "mutually exclusive",
    ),
    (
        "wrap-none",
        ["--parallelism.dp_shard=2", "--accelerator.fsdp.wrap_modules=[]"],
        {},
        "sharding needs wrap units",
    ),
    (
        "min-num-params-too-big",
        ["--parallelism.dp_shard=2", "--accelerator.fsdp.min_num_params=100000000"],
        {},
        "no submodule has that many parameters",
    ),
    (
        "ignored-modules-regex",
        ["--parallelism.dp_shard=2", "--accelerator.fsdp.ignored_modules=["],
        {},
        "invalid regex",
    ),
    (
        "ignored-modules-nomatch",
        ["--parallelism.dp_shard=2", "--accelerator.fsdp.ignored_modules=^nothing$"],
        {},
        "matches no module",
    ),
    (
        "mp-policy-param-dtype",
        [
            "--parallelism.dp_shard=2",
            "--accelerator.fsdp.mixed_precision_policy.reduce_dtype=float32",
        ],
        {},
        "param_dtype must be set",
    ),
    (
        "mp-policy-fp16",
        [
            "--parallelism.dp_shard=2",
            "--accelerator.fsdp.mixed_precision_policy.param_dtype=float16",
        ],
        {},
        "needs --accelerator.mixed_precision=fp16",
    ),
    (
        "mp-policy-dtype",
        ["--parallelism.dp_shard=2", "--accelerator.fsdp.mixed_precision_policy.param_dtype=fp8"],
        {},
        "choose one of float32, bfloat16, float16",
    ),
    ("ema-decay-range", ["--ema.decay=1.5"], {}, "--ema.decay=1.5: must be in [0, 1]"),
    (
        "ema-bounds",
        ["--ema.min_decay=0.5", "--ema.max_decay=0.1"],
        {},
        "need 0 <= min_decay <= max_decay <= 1",
    ),
    ("ema-inv-gamma", ["--ema.inv_gamma=0"], {}, "--ema.inv_gamma=0.0: must be > 0"),
    ("ema-power", ["--ema.power=-1"], {}, "--ema.power=-1.0: must be > 0"),
    (
        "ema-update-after-step",
        ["--ema.update_after_step=-1"],
        {},
        "--ema.update_after_step=-1: must be >= 0",
    ),
    (
        "ema-decay-and-bounds",
        ["--ema.decay=0.99", "--ema.min_decay=0.5"],
        {},
        "exclude each other: set one or the other",
    ),
    (
        "push-ema-repo-too-long",
        ["--policy.push_to_hub=true", f"--policy.repo_id=me/{'a' * 94}", "--ema.enable=true"],
        {"HF_TOKEN": "hf_test"},
        "the EMA policy is published to me/",
    ),
    (
        "accelerate-mixed-precision-env",
        [],
        {"ACCELERATE_MIXED_PRECISION": "bf16"},
        "--accelerator.mixed_precision",
    ),
]


@pytest.fixture
def base_flags(dataset_root, tmp_path):
    return tiny_act_flags(
        **{"dataset.root": dataset_root, "steps": 4, "output_dir": tmp_path / "out"}
    )


@pytest.mark.parametrize(
    ("extra", "env", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_fails_early_and_writes_nothing(
    base_flags, tmp_path, monkeypatch, capsys, extra, env, expected
):
    for key, value in {
        "WORLD_SIZE": "2",
        "RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
        **env,
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    start = time.monotonic()
    assert train_main([*base_flags, *extra]) == 2
    assert time.monotonic() - start < 30
    err = capsys.readouterr().err
    assert expected in err, err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_env_without_its_simulator_says_what_to_install(base_flags, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gym_pusht", None)  # import gym_pusht -> ModuleNotFoundError
    monkeypatch.chdir(tmp_path)
    assert train_main([*base_flags, "--env.type=pusht"]) == 2
    err = capsys.readouterr().err
    assert "--env.type=pusht needs the gym_pusht package" in err
    assert "pip install 'lerobot_pipe[sim]'" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("installed", [False, True], ids=["no-package", "no-key"])
def test_wandb_that_cannot_log_is_refused(base_flags, tmp_path, monkeypatch, capsys, installed):
    """Online W&B without an API key, or without the package, fails before launch."""
    if installed:
        pytest.importorskip("wandb")
        for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
        expected = "logs online but no W&B API key is configured: set WANDB_API_KEY"
    else:
        monkeypatch.setitem(sys.modules, "wandb", None)  # Python's own way to fail an import
        expected = "needs the wandb package: pip install 'lerobot_pipe[wandb]'"
    monkeypatch.chdir(tmp_path)
    assert train_main([*base_flags, "--wandb.enable=true"]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_existing_output_without_resume_is_refused(dataset_root, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    assert train_main([*tiny_act_flags(**{"dataset.root": dataset_root, "output_dir": out})]) == 2
    assert "already holds checkpoints and --resume is false" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("make", "expected"),
    [(_image_dataset, "observation.images.top"), (_corrupt_info, "not valid JSON")],
)
def test_bad_dataset_is_refused(dataset_root, tmp_path, capsys, make, expected):
    bad = make(dataset_root, tmp_path / "bad")
    assert (
        train_main([*tiny_act_flags(**{"dataset.root": bad, "output_dir": tmp_path / "out"})]) == 2
    )
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_rank0_of_two_fails_alone_as_a_real_process(dataset_root, tmp_path):
    """A real process with a 2-rank environment and no peer: fails at once, does not hang."""
    env = {
        "WORLD_SIZE": "2",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29999",
        "OMP_NUM_THREADS": "1",
        "PATH": "",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lerobot_pipe.scripts.train",
            *tiny_act_flags(**{"dataset.root": dataset_root, "steps": 0}),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "--steps=0: must be > 0" in proc.stderr
    assert list(tmp_path.iterdir()) == []
