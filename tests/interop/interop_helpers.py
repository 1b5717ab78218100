"""Shared pieces of the interop tests: names of the artifacts, what lerobot_pipe computes from a
checkpoint (to compare with what LeRobot computed), and the readers of upstream_driver.py's output."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny import TINY_ACT

DRIVER = Path(__file__).with_name("upstream_driver.py")
# The top-level keys of our train_config.json that LeRobot 0.6.1's decoder refuses (from its docs).
EXTENSION_KEYS = ("checkpoint_format", "parallelism", "accelerator")
LEROBOT_TIMEOUT = 300
STEPS, BATCH = 2, 4
SEED = 1234  # the RNG seed right before the compared forward pass


def tiny_flags(*, fresh: bool = True, **overrides) -> list[str]:
    """Both trainers' flags for a short run; ``fresh`` adds the tiny ACT's architecture (a run
    from ``--policy.path`` takes it from the checkpoint). Its lr goes through
    ``--policy.optimizer_lr``: with the preset on, LeRobot replaces --optimizer.* by it."""
    policy = {**TINY_ACT, "policy.optimizer_lr": 1e-3} if fresh else {}
    flags = {
        **policy,
        "num_workers": 0,
        "log_freq": 1,
        "batch_size": BATCH,
        "steps": STEPS,
        "save_freq": STEPS,
        **overrides,
    }
    return [f"--{k}={v}" for k, v in flags.items()]


def step_dir(output_dir: Path, step: int = STEPS) -> Path:
    return output_dir / "checkpoints" / f"{step:06d}"


def pretrained(output_dir: Path, step: int = STEPS) -> Path:
    return step_dir(output_dir, step) / "pretrained_model"


def strip_extensions(train_config: Path, dest: Path) -> Path:
    """``dest``: a copy of our train_config.json without the three keys LeRobot 0.6.1 refuses."""
    data = json.loads(train_config.read_text())
    for key in EXTENSION_KEYS:
        data.pop(key)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(data, indent=4) + "\n")
    return dest


def training_finished(output_dir: Path, step: int, log: Path):
    """A ``finished`` test for Launched.wait: LeRobot logged the end of training after writing
    the checkpoint of ``step``."""

    def finished() -> bool:
        done = (step_dir(output_dir, step) / "training_state" / "training_step.json").is_file()
        return done and "End of training" in log.read_text(errors="replace")

    return finished


def fail_run(what: str, launched) -> None:
    pytest.fail(f"{what} failed (log {launched.log}):\n{launched.tail()}", pytrace=False)


# A robot's own names for the policy's inputs, as lerobot-eval's --rename_map maps them.
RENAME_MAP = {
    "observation.joints": "observation.state",
    "observation.scene": "observation.environment_state",
}


@dataclass
class Inputs:
    observation: Path  # one unbatched frame, as a robot or an env hands it to lerobot-eval
    renamed_observation: Path  # the same frame under RENAME_MAP's source names
    batch: Path  # a raw training batch (padded action steps included)


@dataclass
class LeRobotCheckpoints:
    single: Path  # output dirs
    ddp: Path
    lora: Path
    single_log: Path


@dataclass
class OurCheckpoints:
    single: Path  # output dirs
    lora: Path
    fsdp: Path  # LeRobot's single checkpoint fine-tuned on FSDP2, DCP converted to safetensors
    ddp: Path  # LeRobot's DDP checkpoint resumed on 2 processes up to step 2 * STEPS


class DriverResults:
    """What upstream_driver.py wrote; a job that raised fails the test with LeRobot's traceback,
    unless the test asks for the error."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _check(self, name: str) -> Path:
        path = self.root / name
        error = self.root / f"{name}.error.json"
        if error.exists():
            info = json.loads(error.read_text())
            pytest.fail(f"LeRobot raised on {name}: {info['traceback']}", pytrace=False)
        return path

    def tensors(self, name: str) -> dict[str, torch.Tensor]:
        return load_file(self._check(name))

    def json(self, name: str) -> dict:
        return json.loads(self._check(name).read_text())

    def meta(self, name: str) -> dict:
        """The JSON a tensor job writes beside its safetensors file."""
        return json.loads((self._check(name).parent / f"{name}.json").read_text())

    def error(self, name: str) -> str | None:
        error = self.root / f"{name}.error.json"
        return json.loads(error.read_text())["error"] if error.exists() else None


# Checkpoints whose policies LeRobot loads and runs (stage 3), by name.
def loadable_checkpoints(le: LeRobotCheckpoints, ours: OurCheckpoints) -> dict[str, Path]:
    return {
        "le_single": pretrained(le.single),
        "le_ddp": pretrained(le.ddp),
        "le_lora": pretrained(le.lora),
        "our_single": pretrained(ours.single),
        "our_ddp": pretrained(ours.ddp, 2 * STEPS),
        "our_fsdp": pretrained(ours.fsdp),
        "our_lora": pretrained(ours.lora),
    }


# Our checkpoints whose train_config.json and training_state LeRobot reads.
def resumable_checkpoints(ours: OurCheckpoints) -> dict[str, Path]:
    return {
        "our_single": step_dir(ours.single),
        "our_ddp": step_dir(ours.ddp, 2 * STEPS),
        "our_lora": step_dir(ours.lora),
        "our_fsdp": step_dir(ours.fsdp),
    }


@dataclass
class LeRobotReads:
    results: DriverResults
    loadable: dict[str, Path]
    resumable: dict[str, Path]
    stripped: dict[str, Path]  # our train_config.json copies without the extension keys


@dataclass
class LeRobotTrainsOurs:
    fine_tune: Path  # LeRobot's output dir, --policy.path=<our converted FSDP2 checkpoint>
    fine_tune_log: Path
    resumed: Path  # a copy of our DDP run's output dir that LeRobot resumed (2 processes)
    resumed_log: Path


@dataclass
class OurActions:
    pre: dict[str, torch.Tensor]  # the observation after our preprocessor
    chunk: torch.Tensor
    action: torch.Tensor
    action_unnormalized: torch.Tensor


def our_actions(
    pretrained_dir: Path, observation: Path, rename_map: dict[str, str] | None = None
) -> OurActions:
    """What lerobot_pipe does with one observation, loading the folder as lerobot-eval would:
    the policy (a LoRA checkpoint merged), its processors with lerobot-eval's overrides."""
    from lerobot_pipe.configs.policies import PreTrainedConfig
    from lerobot_pipe.policies.factory import make_pre_post_processors
    from lerobot_pipe.policies.peft import load_pretrained_policy

    cfg = PreTrainedConfig.from_pretrained(pretrained_dir)
    policy = load_pretrained_policy(pretrained_dir)
    # What lerobot-eval, lerobot-record and the policy server pass when they load processors.
    overrides = {
        "device_processor": {"device": "cpu"},
        "rename_observations_processor": {"rename_map": rename_map or {}},
    }
    pre, post = make_pre_post_processors(
        cfg, pretrained_path=pretrained_dir, preprocessor_overrides=overrides
    )
    policy.eval()
    policy.reset()
    with torch.no_grad():
        batch = pre(dict(load_file(observation)))
        chunk = policy.predict_action_chunk(batch)
        policy.reset()
        action = policy.select_action(batch)
        return OurActions(batch, chunk, action, post(action))


def our_loss(pretrained_dir: Path, batch_file: Path) -> tuple[torch.Tensor, dict, dict]:
    """Our training loss, its parts and the gradients on a raw batch, seeded as the driver is."""
    from lerobot_pipe.configs.policies import PreTrainedConfig
    from lerobot_pipe.policies.factory import make_pre_post_processors
    from lerobot_pipe.policies.peft import load_pretrained_policy

    cfg = PreTrainedConfig.from_pretrained(pretrained_dir)
    policy = load_pretrained_policy(pretrained_dir)
    pre, _ = make_pre_post_processors(
        cfg,
        pretrained_path=pretrained_dir,
        preprocessor_overrides={"device_processor": {"device": "cpu"}},
    )
    batch = pre(dict(load_file(batch_file)))
    policy.train()
    torch.manual_seed(SEED)
    loss, parts = policy(batch)
    loss.backward()
    grads = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
    return loss.detach(), {k: float(v) for k, v in parts.items()}, grads


def json_diff(ours: object, theirs: object, path: str = "") -> dict[str, tuple]:
    """{dotted key: (ours, theirs)} of every leaf that differs; a key on one side only pairs
    with ``"<absent>"``."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        out: dict[str, tuple] = {}
        for key in sorted(set(ours) | set(theirs), key=str):
            sub = f"{path}{key}"
            if key not in ours or key not in theirs:
                out[sub] = (ours.get(key, "<absent>"), theirs.get(key, "<absent>"))
            else:
                out.update(json_diff(ours[key], theirs[key], sub + "."))
        return out
    return {} if ours == theirs else {path.rstrip("."): (ours, theirs)}
