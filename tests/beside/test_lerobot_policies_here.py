"""LeRobot's own policies on our trainer, in a venv that holds both (LeRobot 0.6.1 and this
project installed beside it: test_install_beside_lerobot.py runs this module there; elsewhere
it skips). A type we do not implement (vqbet) trains LeRobot's class with LeRobot's config,
flags and processors, on DDP, resumes on another world size, and LeRobot's own loaders read the
checkpoints strictly; ``--policy.implementation=lerobot`` trains LeRobot's ACT on FSDP2 with
units named by ``--accelerator.fsdp.wrap_modules``; a unit whose forward never runs is refused
by name before the first step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.interop, pytest.mark.beside]

lerobot = pytest.importorskip("lerobot", reason="runs where LeRobot is installed beside us")

from launch import run_distributed  # noqa: E402
from tiny import run_train  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"  # this module runs in a process of its own (beside's)

BIN = Path(sys.executable).parent
TIMEOUT_S = 600
# vqbet small enough for 2 CPU cores: its VQ-VAE trains alone for 10 steps (the pipeline's
# run), then the GPT (the resumed run: its parameters have no optimizer state yet).
VQBET = [
    "--policy.type=vqbet",
    "--policy.crop_shape=[56,56]",
    "--policy.pretrained_backbone_weights=null",
    "--policy.n_vqvae_training_steps=10",
    "--policy.gpt_n_layer=2",
]
ACT = [
    "--policy.type=act",
    "--policy.implementation=lerobot",
    "--policy.pretrained_backbone_weights=null",
    "--policy.dim_model=64",
    "--policy.n_heads=2",
    "--policy.dim_feedforward=128",
    "--policy.chunk_size=10",
    "--policy.n_action_steps=10",
]
SYNTHETIC = {"num_episodes": 6, "episode_length": 30, "image_size": 64}
REPO = Path(__file__).resolve().parents[2]
# Keys of our train_config.json that LeRobot 0.6.1 does not know (docs/compatibility.md).
EXTENSION_KEYS = ("parallelism", "accelerator", "checkpoint_format")


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("RANK")}
    return {**out, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


COMMON = ["--policy.device=cpu", "--wandb.enable=false", "--log_freq=5"]


def train(args: list[str], out: Path, nproc: int = 1, check: bool = True):
    common = COMMON
    if nproc == 1:
        command = [str(BIN / "lerobot-pipe"), "train"]
    else:
        # torchrun $(which lerobot-pipe) train ...: the launcher of this venv's Python (a copied
        # venv's own torchrun script names the original's)
        launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
        command = [*launcher, str(BIN / "lerobot-pipe"), "train"]
    run = subprocess.run(
        [*command, *args, *common],
        env=env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=out.parent,
    )
    log = run.stdout + run.stderr
    if check:
        assert run.returncode == 0, log[-6000:]
    return run.returncode, log


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    from lerobot_pipe.datasets import write_synthetic_dataset

    root = tmp_path_factory.mktemp("data")
    common = {**SYNTHETIC, "cameras": ["top"]}
    return {
        # vqbet takes no environment state
        "pixels": write_synthetic_dataset(root / "pixels", pixels_only=True, **common),
        "camera": write_synthetic_dataset(root / "camera", **common),
    }


def dataset(root: Path) -> list[str]:
    return [f"--dataset.root={root}", "--dataset.repo_id=synthetic/reach"]


@pytest.fixture(scope="module")
def vqbet_pipeline(tmp_path_factory) -> Path:
    """The pipeline (snakemake, a fresh copy of the workflow) on LeRobot's vqbet: its synthetic
    dataset with a camera, validate, DDP on 2 processes (a DCP checkpoint at step 10; only the
    VQ-VAE trains: unused parameters), conversion, evaluation in the synthetic task's
    environment, the best checkpoint. One checkpoint: each job imports LeRobot (seconds)."""
    root = tmp_path_factory.mktemp("pipeline")
    for name in ("Snakefile", "workflow", "config", "envs"):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, root / name)
    policy = {"type": "vqbet", **dict(flag[len("--policy.") :].split("=", 1) for flag in VQBET)}
    policy.pop("type")
    config = {
        "run": "vqbet",
        "dataset": {"synthetic": {**SYNTHETIC, "cameras": ["top"], "pixels_only": True}},
        # One train job (segments cost a trainer start each, and LeRobot's imports are slow).
        "launch": {"nproc_per_node": 2, "segment_steps": 0},
        "train": {
            "steps": 10,
            "save_freq": 10,
            "batch_size": 4,
            "parallelism": {"dp_shard": 1},
            "policy": {"type": "vqbet", **{k: json.loads(v) for k, v in policy.items()}},
        },
        "eval": {"env": {"type": "synthetic"}, "n_episodes": 2, "batch_size": 2},
    }
    (root / "vqbet.yaml").write_text(json.dumps(config))
    run = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "vqbet.yaml"],
        cwd=root,
        env={**env(), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-4000:]
    return root / "results/vqbet"


@pytest.fixture(scope="module")
def vqbet_resumed(vqbet_pipeline, tmp_path_factory) -> tuple[Path, str]:
    """The pipeline run's step-10 checkpoint (DDP, DCP) resumed on one process to step 15, twice
    the batch per process: the GPT trains now, its parameters without optimizer state before."""
    out = tmp_path_factory.mktemp("resumed") / "run"
    shutil.copytree(vqbet_pipeline / "train", out, symlinks=True)
    config = out / "checkpoints/000010/pretrained_model/train_config.json"
    _, log = train(
        [f"--config_path={config}", "--resume=true", "--steps=15", "--batch_size=8"]
        + [f"--output_dir={out}"]
        + ["--checkpoint_format=safetensors", f"--dataset.root={vqbet_pipeline / 'dataset'}"],
        out,
    )
    return out, log


def pretrained(run: Path, step: int) -> Path:
    return run / f"checkpoints/{step:06d}/pretrained_model"


def assert_lerobot_loads_it_strictly(folder: Path, policy_type: str, dataset_root: Path):
    """LeRobot's own loaders: its config, its ``make_policy`` on the dataset's metadata with
    exactly the file's key set and every tensor the file's (and its strict ``from_pretrained``),
    processors with lerobot-eval's overrides, and train_config.json less our documented
    extension keys. Returns LeRobot's policy."""
    import draccus
    import torch
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata
    from lerobot.policies.factory import get_policy_class, make_policy, make_pre_post_processors
    from safetensors.torch import load_file

    config = PreTrainedConfig.from_pretrained(folder)
    assert config.type == policy_type
    config.pretrained_path = folder
    policy = make_policy(config, ds_meta=LeRobotDatasetMetadata("synthetic/reach", dataset_root))
    file = load_file(folder / "model.safetensors")
    state = policy.state_dict()
    assert set(file) == set(state)
    assert all(torch.equal(file[k], state[k].cpu()) for k in file)
    get_policy_class(policy_type).from_pretrained(folder, strict=True)
    make_pre_post_processors(
        config,
        pretrained_path=str(folder),
        preprocessor_overrides={
            "device_processor": {"device": "cpu"},
            "rename_observations_processor": {"rename_map": {}},
        },
    )
    train_config = json.loads((folder / "train_config.json").read_text())
    for key in EXTENSION_KEYS:
        train_config.pop(key, None)
    assert draccus.decode(TrainPipelineConfig, train_config).policy.type == policy_type
    for name in ("config.json", "train_config.json"):
        assert "implementation" not in (folder / name).read_text()
    return policy


def assert_same_actions(folder: Path, dataset_root: Path, theirs, *flags: str) -> None:
    """The checkpoint loaded by our factory (LeRobot's class inside our wrapper) and by
    LeRobot's ``make_policy`` choose the same actions on the same observations and seeds,
    through LeRobot's saved processors."""
    import torch
    from lerobot.policies.factory import make_pre_post_processors

    from lerobot_pipe.configs.loading import parse_train_config
    from lerobot_pipe.datasets import LeRobotDataset
    from lerobot_pipe.policies.factory import get_policy_class

    cfg, _ = parse_train_config([f"--policy.path={folder}", *flags])
    ours = get_policy_class(cfg.policy).from_pretrained(folder, config=cfg.policy)
    assert type(ours).__module__.startswith("lerobot_pipe.policies.lerobot_bridge")
    pre, post = make_pre_post_processors(theirs.config, pretrained_path=str(folder))
    frames = LeRobotDataset(dataset_root)
    actions = {}
    for name, policy in (("ours", ours), ("theirs", theirs)):
        policy.eval()
        policy.reset()
        torch.manual_seed(0)
        chosen = []
        for i in range(6):
            item = frames[i]
            observation = {
                k: v for k, v in item.items() if k.startswith("observation.") or k == "task"
            }
            with torch.no_grad():
                chosen.append(post(policy.select_action(pre(observation))))
        actions[name] = torch.stack(chosen)
    torch.testing.assert_close(actions["ours"], actions["theirs"], rtol=0, atol=0)


def test_the_pipeline_trains_converts_and_evaluates_lerobots_vqbet(vqbet_pipeline):
    log = (vqbet_pipeline / "logs/train.log").read_text()
    assert "Policy: vqbet (LeRobot's own, lerobot.policies.vqbet)" in log
    assert "Processes: 2 (gloo" in log
    folder = vqbet_pipeline / "converted/000010/pretrained_model"
    theirs = assert_lerobot_loads_it_strictly(folder, "vqbet", vqbet_pipeline / "dataset")
    info = json.loads((vqbet_pipeline / "eval/000010/eval_info.json").read_text())
    assert info["overall"]["n_episodes"] == 2
    assert_same_actions(folder, vqbet_pipeline / "dataset", theirs)
    assert json.loads((vqbet_pipeline / "eval/best.json").read_text())["step"] == "000010"


def test_vqbet_resumes_on_another_world_size(vqbet_resumed, vqbet_pipeline):
    run, log = vqbet_resumed
    assert "(step 10)" in log and "Processes: 1" in log
    step = json.loads((run / "checkpoints/000015/training_state/training_step.json").read_text())
    assert step["step"] == 15
    folder, root = pretrained(run, 15), vqbet_pipeline / "dataset"
    theirs = assert_lerobot_loads_it_strictly(folder, "vqbet", root)
    assert_same_actions(folder, root, theirs)


def test_lora_on_lerobots_vqbet_takes_lerobots_peft_path(vqbet_pipeline, tmp_path):
    """LoRA (``--peft.*``, the targets named: LeRobot's class declares none for us) over the
    pipeline's vqbet: the adapter checkpoint loads through LeRobot's ``make_policy`` (its PEFT
    path: ``use_peft``, the base named by adapter_config.json)."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata
    from lerobot.policies.factory import make_policy

    out, root = tmp_path / "lora", vqbet_pipeline / "dataset"
    argv = [f"--policy.path={vqbet_pipeline / 'converted/000010/pretrained_model'}"]
    argv += [*dataset(root), "--steps=2", "--batch_size=2", *COMMON, f"--output_dir={out}"]
    argv += ['--peft.target_modules=["c_attn","c_proj"]']
    run_distributed(run_train, 1, argv)
    folder = pretrained(out, 2)
    assert (folder / "adapter_model.safetensors").is_file()
    config = PreTrainedConfig.from_pretrained(folder)
    assert config.use_peft
    config.pretrained_path = folder
    policy = make_policy(config, ds_meta=LeRobotDatasetMetadata("synthetic/reach", root))
    assert type(policy).__name__ == "PeftModel"


def train_whose(argv: list[str]) -> str:
    """One rank of a run (run_distributed): trains, and says whose policy class it trained."""
    from lerobot_pipe.training.preflight import make_plan
    from lerobot_pipe.training.train import train as run

    plan = make_plan(argv, int(os.environ["WORLD_SIZE"]), os.environ)
    whose = type(plan.cfg.policy).upstream_class.__module__
    run(plan)
    return whose


def test_lerobots_act_by_flag_on_ddp_resumed_sharded(data, tmp_path):
    """LeRobot's ACT (``--policy.implementation=lerobot``) on DDP, 2 processes, bf16 autocast;
    its step-2 checkpoint resumed on HSDP, 4 processes (2 replicas of 2 shards, units named by
    flag, bf16 parameters: LeRobot's code under autocast, DCP), converted; both final
    checkpoints LeRobot's, with LeRobot's actions."""
    ddp, sharded = tmp_path / "ddp", tmp_path / "sharded"
    argv = [*ACT, *dataset(data["camera"]), "--steps=4", "--batch_size=4", "--save_freq=2"]
    argv += [*COMMON, "--accelerator.mixed_precision=bf16"]
    whose = run_distributed(train_whose, 2, [*argv, f"--output_dir={ddp}"])
    assert whose == ["lerobot.policies.act.configuration_act"] * 2
    shutil.copytree(ddp, sharded, symlinks=True)
    shutil.rmtree(sharded / "checkpoints/000004")
    (sharded / "checkpoints/last").unlink()
    (sharded / "checkpoints/last").symlink_to("000002")
    resume = [
        f"--config_path={pretrained(sharded, 2)}/train_config.json",
        "--resume=true",
        "--policy.implementation=lerobot",  # never written: named again
        f"--output_dir={sharded}",
        "--parallelism.dp_replicate=2",
        "--parallelism.dp_shard=2",
        '--accelerator.fsdp.wrap_modules=["ACTEncoderLayer","ACTDecoderLayer"]',
        "--accelerator.mixed_precision=bf16",
        "--checkpoint_format=dcp",
    ]
    assert run_distributed(train_whose, 4, resume) == whose * 2
    assert (pretrained(sharded, 4) / "pytorch_model_fsdp_0").is_dir()
    convert = [
        str(BIN / "lerobot-pipe"),
        "convert-dcp",
        f"--checkpoint_dir={sharded}/checkpoints/000004",
    ]
    done = subprocess.run(convert, env=env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for run in (ddp, sharded):
        theirs = assert_lerobot_loads_it_strictly(pretrained(run, 4), "act", data["camera"])
        assert_same_actions(
            pretrained(run, 4), data["camera"], theirs, "--policy.implementation=lerobot"
        )


def test_a_unit_whose_forward_never_runs_is_refused_by_name(data, tmp_path):
    """vqbet's VQ-VAE runs through its methods, never its forward: FSDP2 could not gather it.
    lerobot-pipe validate (the pipeline's first job) refuses it before anything is launched (the
    real model probed on the CPU), and so does the launch, before the first step."""
    out = tmp_path / "run"
    argv = [*VQBET, *dataset(data["pixels"]), "--steps=2", "--batch_size=2", *COMMON]
    argv += ["--parallelism.dp_shard=2", '--accelerator.fsdp.wrap_modules=["VqVae"]']
    validate = [str(BIN / "lerobot-pipe"), "validate", "--nproc_per_node=2"]
    refused = subprocess.run(
        [*validate, *argv, f"--output_dir={out}"],
        env=env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    said = refused.stdout + refused.stderr
    assert refused.returncode == 2, said[-3000:]
    assert "vqbet.action_head.vqvae_model" in said and "--parallelism.dp_shard=1" in said, said
    assert "Traceback" not in said and not out.exists()
    with pytest.raises(Exception) as err:  # noqa: PT011 - each rank's error, as run_distributed reports it
        run_distributed(run_train, 2, [*argv, f"--output_dir={out}"])
    log = str(err.value)
    assert "vqbet.action_head.vqvae_model" in log and "--parallelism.dp_shard=1" in log, log[-3000:]
    assert not (out / "checkpoints").exists()
