"""Checkpoints written by LeRobot 0.6.1 and by lerobot_pipe, and what each side makes of the other's.

The artifacts are built once per session, in four stages, so that LeRobot (seconds to import) starts
as few times as possible:

1. ``lerobot_ckpts``: LeRobot trains the tiny ACT on our synthetic dataset: one process, two
   processes (DDP, torchrun) and LoRA on top of the first (``--policy.path=<it> --peft.r=4``).
2. ``our_ckpts``: lerobot_pipe trains from scratch (one process), fine-tunes LeRobot's checkpoint on
   FSDP2 (then lerobot-convert-dcp), resumes LeRobot's DDP checkpoint on 2 processes, and trains LoRA
   over its own checkpoint.
3. ``lerobot_reads``: one LeRobot process loads every checkpoint as lerobot-eval does (actions), computes
   a seeded training loss, decodes our train_config.json files and restores our training states.
4. ``lerobot_trains_ours``: LeRobot fine-tunes from our converted FSDP2 checkpoint and resumes our DDP
   checkpoint on 2 processes (the round trip's last leg).

Every test then compares numbers or files; none of them re-implements a LeRobot check.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from safetensors.torch import save_file
from tiny import TINY_ACT, run_train
from upstream import Upstream, find_upstream

sys.path.insert(0, str(Path(__file__).parent))

from interop_helpers import (  # noqa: E402
    DRIVER,
    LEROBOT_TIMEOUT,
    RENAME_MAP,
    SEED,
    STEPS,
    DriverResults,
    Inputs,
    LeRobotCheckpoints,
    LeRobotReads,
    LeRobotTrainsOurs,
    OurCheckpoints,
    fail_run,
    loadable_checkpoints,
    pretrained,
    resumable_checkpoints,
    step_dir,
    strip_extensions,
    tiny_flags,
    training_finished,
)


@pytest.fixture(scope="session")
def upstream() -> Upstream:
    found, why = find_upstream()
    if found is None:
        pytest.skip(why)
    return found


@pytest.fixture(scope="session")
def interop_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("interop")


@pytest.fixture(scope="session")
def lerobot_flags(dataset_root) -> list[str]:
    """What every LeRobot run here needs: a local dataset, offline, CPU, no W&B, no push."""
    return [
        "--dataset.repo_id=interop/dataset",
        f"--dataset.root={dataset_root}",
        "--wandb.enable=false",
        "--policy.device=cpu",
        "--policy.push_to_hub=false",
    ]


@pytest.fixture(scope="session")
def inputs(dataset_root, interop_root) -> Inputs:
    from lerobot_pipe.datasets import LeRobotDataset

    dataset = LeRobotDataset(dataset_root)
    chunk = int(TINY_ACT["policy.chunk_size"])
    dataset = LeRobotDataset(
        dataset_root, delta_timestamps={"action": [i / dataset.fps for i in range(chunk)]}
    )
    # Frames near an episode's end have padded action steps: the loss averages over the others.
    frames = dataset.get_batch([3, 47, 120, 549])
    assert frames["action_is_pad"].any() and not frames["action_is_pad"].all()
    keep = {k: v for k, v in frames.items() if k.startswith(("observation.", "action"))}
    batch = interop_root / "batch.safetensors"
    save_file(keep, batch)
    frame = {k: v[1].clone() for k, v in keep.items() if k.startswith("observation.")}
    observation = interop_root / "observation.safetensors"
    save_file(frame, observation)
    renamed = interop_root / "renamed_observation.safetensors"
    source = {new: old for old, new in RENAME_MAP.items()}
    save_file({source[k]: v for k, v in frame.items()}, renamed)
    return Inputs(observation, renamed, batch)


@pytest.fixture(scope="session")
def lerobot_ckpts(upstream, lerobot_flags, interop_root) -> LeRobotCheckpoints:
    root = interop_root
    single, ddp, lora = root / "le_single", root / "le_ddp", root / "le_lora"
    # --optimizer.* with the preset on: LeRobot replaces it by the policy's preset (as we do).
    first = upstream.start(
        [
            "lerobot-train",
            *tiny_flags(),
            *lerobot_flags,
            "--optimizer.type=adamw",
            "--optimizer.lr=0.5",
            f"--output_dir={single}",
        ],
        cwd=root,
        log=root / "le_single.log",
    )
    second = upstream.start(
        [
            "torchrun",
            "--standalone",
            "--nproc-per-node=2",
            str(upstream.bin / "lerobot-train"),
            *tiny_flags(),
            *lerobot_flags,
            f"--output_dir={ddp}",
        ],
        cwd=root,
        log=root / "le_ddp.log",
    )
    if first.wait(LEROBOT_TIMEOUT, training_finished(single, STEPS, first.log)) != 0:
        fail_run("LeRobot's lerobot-train (one process)", first)
    # LeRobot's ACT names no default LoRA targets: ours are its feed-forward projections.
    third = upstream.start(
        [
            "lerobot-train",
            *tiny_flags(fresh=False),
            *lerobot_flags,
            f"--policy.path={pretrained(single)}",
            "--peft.r=4",
            '--peft.target_modules=["linear1","linear2"]',
            f"--output_dir={lora}",
        ],
        cwd=root,
        log=root / "le_lora.log",
    )
    for launched, what, output_dir in (
        (second, "LeRobot's DDP run (torchrun, 2 processes)", ddp),
        (third, "LeRobot's LoRA run", lora),
    ):
        if launched.wait(LEROBOT_TIMEOUT, training_finished(output_dir, STEPS, launched.log)) != 0:
            fail_run(what, launched)
    return LeRobotCheckpoints(single, ddp, lora, root / "le_single.log")


@pytest.fixture(scope="session")
def our_ckpts(lerobot_ckpts, dataset_root, interop_root) -> OurCheckpoints:
    from launch import run_distributed

    from lerobot_pipe.scripts.convert_dcp import main as convert_dcp

    root = interop_root
    ours = OurCheckpoints(
        root / "our_single", root / "our_lora", root / "our_fsdp", root / "our_ddp"
    )
    data = f"--dataset.root={dataset_root}"
    run_train(
        [
            *tiny_flags(),
            data,
            "--optimizer.type=adamw",
            "--optimizer.lr=0.5",
            f"--output_dir={ours.single}",
        ]
    )
    run_train(
        [
            *tiny_flags(fresh=False),
            data,
            f"--policy.path={pretrained(ours.single)}",
            "--peft.r=4",
            f"--output_dir={ours.lora}",
        ]
    )
    fine_tune = [
        *tiny_flags(fresh=False),
        f"--policy.path={pretrained(lerobot_ckpts.single)}",
        data,
        f"--output_dir={ours.fsdp}",
        "--parallelism.dp_shard=2",
        "--checkpoint_format=dcp",
    ]
    run_distributed(run_train, 2, fine_tune)
    assert convert_dcp([f"--checkpoint_dir={step_dir(ours.fsdp)}"]) == 0
    resume = [
        "--resume=true",
        f"--config_path={pretrained(lerobot_ckpts.ddp) / 'train_config.json'}",
        f"--output_dir={ours.ddp}",
        f"--steps={2 * STEPS}",
    ]
    run_distributed(run_train, 2, resume)
    return ours


@pytest.fixture(scope="session")
def lerobot_reads(
    upstream, lerobot_ckpts, our_ckpts, inputs, dataset_root, interop_root
) -> LeRobotReads:
    out = interop_root / "driver"
    out.mkdir()
    loadable = loadable_checkpoints(lerobot_ckpts, our_ckpts)
    resumable = resumable_checkpoints(our_ckpts)
    stripped = {
        name: strip_extensions(
            step / "pretrained_model" / "train_config.json", out / "stripped" / name / "tc.json"
        )
        for name, step in resumable.items()
    }
    common = {"dataset_root": str(dataset_root)}
    jobs: list[dict] = [{"job": "defaults", "out": str(out / "defaults.json")}]
    for name, path in loadable.items():
        jobs.append(
            {
                "job": "actions",
                "pretrained": str(path),
                "observation": str(inputs.observation),
                "out": str(out / f"{name}.actions.safetensors"),
                **common,
            }
        )
    for name in ("le_single", "our_single"):
        jobs.append(
            {
                "job": "actions",
                "pretrained": str(loadable[name]),
                "observation": str(inputs.renamed_observation),
                "rename_map": RENAME_MAP,
                "out": str(out / f"{name}.renamed_actions.safetensors"),
                **common,
            }
        )
        jobs.append(
            {
                "job": "loss",
                "pretrained": str(loadable[name]),
                "batch": str(inputs.batch),
                "seed": SEED,
                "out": str(out / f"{name}.loss.safetensors"),
                **common,
            }
        )
    for name, step in resumable.items():
        jobs.append(
            {
                "job": "train_config",
                "path": str(stripped[name]),
                "out": str(out / f"{name}.tc.json"),
            }
        )
        jobs.append(
            {
                "job": "train_config",
                "path": str(step / "pretrained_model" / "train_config.json"),
                "out": str(out / f"{name}.tc_unstripped.json"),
            }
        )
    for name in ("our_single", "our_ddp"):
        jobs.append(
            {
                "job": "training_state",
                "checkpoint": str(resumable[name]),
                "train_config": str(stripped[name]),
                "out": str(out / f"{name}.state.safetensors"),
                **common,
            }
        )
    jobs.append(
        {
            "job": "training_state",
            "checkpoint": str(step_dir(lerobot_ckpts.single)),
            "train_config": str(pretrained(lerobot_ckpts.single) / "train_config.json"),
            "out": str(out / "le_single.state.safetensors"),
            **common,
        }
    )
    (out / "jobs.json").write_text(json.dumps(jobs, indent=2))
    launched = upstream.start(
        ["python", str(DRIVER), "batch", str(out / "jobs.json")], cwd=interop_root, log=out / "log"
    )
    if launched.wait(LEROBOT_TIMEOUT) != 0:
        fail_run("upstream_driver.py", launched)
    return LeRobotReads(DriverResults(out), loadable, resumable, stripped)


@pytest.fixture(scope="session")
def lerobot_trains_ours(upstream, our_ckpts, lerobot_flags, interop_root) -> LeRobotTrainsOurs:
    root = interop_root
    fine_tune = root / "le_from_our_fsdp"
    first = upstream.start(
        [
            "lerobot-train",
            *lerobot_flags,
            *tiny_flags(fresh=False),
            f"--policy.path={pretrained(our_ckpts.fsdp)}",
            f"--output_dir={fine_tune}",
        ],
        cwd=root,
        log=root / "le_from_our_fsdp.log",
    )
    # LeRobot 0.6.1 resumes our run once train_config.json lacks the three documented extra keys.
    resumed = root / "le_resumes_our_ddp"
    shutil.copytree(our_ckpts.ddp, resumed, symlinks=True)
    config = pretrained(resumed, 2 * STEPS) / "train_config.json"
    strip_extensions(config, config)
    second = upstream.start(
        [
            "torchrun",
            "--standalone",
            "--nproc-per-node=2",
            str(upstream.bin / "lerobot-train"),
            "--resume=true",
            f"--config_path={config}",
            f"--steps={3 * STEPS}",
            "--policy.device=cpu",
            f"--output_dir={resumed}",
        ],
        cwd=root,
        log=root / "le_resumes_our_ddp.log",
    )
    for launched, what, output_dir, step in (
        (first, "LeRobot's fine-tuning from our checkpoint", fine_tune, STEPS),
        (second, "LeRobot's resume of our DDP checkpoint", resumed, 3 * STEPS),
    ):
        if launched.wait(LEROBOT_TIMEOUT, training_finished(output_dir, step, launched.log)) != 0:
            fail_run(what, launched)
    return LeRobotTrainsOurs(fine_tune, first.log, resumed, second.log)
