"""Runs LeRobot's own code on artifacts the interop tests prepared; executed by LeRobot's Python.

    <upstream python> tests/interop/upstream_driver.py batch <jobs.json>

``jobs.json`` is a list of ``{"job": <name>, ...arguments}``; every job runs in this one process
(importing LeRobot takes seconds, so the tests batch their checks) and writes what LeRobot computed
to its ``out`` path: tensors as safetensors, everything else as JSON. A job that raises records
``{"error": "<type>: <message>"}`` in ``<out>.error.json`` and the next job still runs; the tests
decide whether the error was expected.

Only LeRobot's public API is used, the way its tools call it: ``PreTrainedConfig.from_pretrained``
and ``make_policy`` (the PEFT path included, when config.json says ``use_peft``),
``make_pre_post_processors`` with lerobot-eval's overrides, ``TrainPipelineConfig.from_pretrained``
(draccus), ``make_optimizer_and_scheduler``, ``load_training_state`` and the LR scheduler configs'
``build``. Nothing of lerobot_pipe is imported here: this file runs in LeRobot's virtual
environment.
"""

from __future__ import annotations

import json
import random
import sys
import traceback
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file


def _policy(pretrained: str, dataset_root: str, rename_map: dict | None = None):
    """The policy in ``pretrained`` as lerobot-eval builds it, and its processors (lerobot-eval's
    ``--rename_map`` goes to the rename step)."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.datasets import LeRobotDatasetMetadata
    from lerobot.policies.factory import make_policy, make_pre_post_processors

    cfg = PreTrainedConfig.from_pretrained(pretrained)
    cfg.pretrained_path = Path(pretrained)
    cfg.device = "cpu"
    meta = LeRobotDatasetMetadata("interop/dataset", root=dataset_root)
    policy = make_policy(cfg, ds_meta=meta)
    # What lerobot-eval (and lerobot-record, lerobot-rollout, the policy server) pass.
    overrides = {
        "device_processor": {"device": "cpu"},
        "rename_observations_processor": {"rename_map": rename_map or {}},
    }
    pre, post = make_pre_post_processors(
        cfg, pretrained_path=pretrained, preprocessor_overrides=overrides
    )
    return cfg, policy, pre, post


def _named_parameters(policy) -> dict[str, torch.nn.Parameter]:
    """Parameter names of the policy itself (a PeftModel's wrapper prefix removed)."""
    from peft import PeftModel

    if isinstance(policy, PeftModel):
        policy = policy.get_base_model()
    return dict(policy.named_parameters())


def job_actions(spec: dict) -> None:
    """What lerobot-eval does with one observation: preprocess, act, postprocess. With
    ``rename_map``, the observation's keys are a robot's own names, renamed by the preprocessor."""
    cfg, policy, pre, post = _policy(
        spec["pretrained"], spec["dataset_root"], spec.get("rename_map")
    )
    _act(spec, cfg, policy, pre, post)


def job_strict_actions(spec: dict) -> None:
    """job_actions with the policy loaded by its class's ``from_pretrained(strict=True)``: every
    tensor of model.safetensors is one of the class's and none is missing."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    cfg = PreTrainedConfig.from_pretrained(spec["pretrained"])
    cfg.device = "cpu"
    policy = get_policy_class(cfg.type).from_pretrained(spec["pretrained"], config=cfg, strict=True)
    overrides = {"device_processor": {"device": "cpu"}}
    pre, post = make_pre_post_processors(
        cfg, pretrained_path=spec["pretrained"], preprocessor_overrides=overrides
    )
    _act(spec, cfg, policy, pre, post)
    # The order of policy.parameters(): diffusers' EMAModel.shadow_params (ema_state.pt) follow it.
    names = [name for name, _ in policy.named_parameters()]
    Path(spec["out"] + ".parameters.json").write_text(json.dumps(names))


def job_ema_decays(spec: dict) -> None:
    """diffusers' EMAModel.get_decay for updates 1..20, built as LeRobot main's lerobot_train.py
    builds it (use_ema_warmup=True) from each case's keyword arguments."""
    from diffusers.training_utils import EMAModel

    out = {}
    for name, kwargs in spec["cases"].items():
        ema = EMAModel([torch.nn.Parameter(torch.zeros(1))], use_ema_warmup=True, **kwargs)
        out[name] = [ema.get_decay(n) for n in range(1, 21)]
    Path(spec["out"]).write_text(json.dumps(out))


def _act(spec: dict, cfg, policy, pre, post) -> None:
    observation = load_file(spec["observation"])
    policy.eval()
    policy.reset()
    with torch.no_grad():
        batch = pre(dict(observation))
        chunk = policy.predict_action_chunk(batch)
        policy.reset()
        action = policy.select_action(batch)
        action_out = post(action)
    tensors = {"chunk": chunk, "action": action, "action_unnormalized": action_out}
    if hasattr(policy, "disable_adapter"):  # a PeftModel: the base policy's own chunk too
        with torch.no_grad(), policy.disable_adapter():
            tensors["chunk_without_adapter"] = policy.predict_action_chunk(batch)
    tensors.update({f"pre/{k}": v for k, v in batch.items() if isinstance(v, torch.Tensor)})
    save_file({k: v.contiguous() for k, v in tensors.items()}, spec["out"])
    meta = {
        "policy_class": type(policy).__name__,
        "use_peft": bool(cfg.use_peft),
        "preprocessor_steps": [type(s).__name__ for s in pre.steps],
        "postprocessor_steps": [type(s).__name__ for s in post.steps],
    }
    Path(spec["out"] + ".json").write_text(json.dumps(meta, indent=2))


def job_loss(spec: dict) -> None:
    """LeRobot's training loss and gradients on a raw training batch, RNG seeded just before."""
    _, policy, pre, _ = _policy(spec["pretrained"], spec["dataset_root"])
    batch = pre(dict(load_file(spec["batch"])))
    policy.train()
    torch.manual_seed(spec["seed"])
    loss, parts = policy.forward(batch)
    loss.backward()
    tensors = {"loss": loss.detach()}
    tensors.update({f"part/{k}": torch.tensor(float(v)) for k, v in (parts or {}).items()})
    tensors.update(
        {f"grad/{k}": p.grad for k, p in _named_parameters(policy).items() if p.grad is not None}
    )
    save_file({k: v.contiguous() for k, v in tensors.items()}, spec["out"])


def job_eval_split(spec: dict) -> None:
    """LeRobot's train / held-out episodes of ``--dataset.eval_split`` (make_train_eval_datasets)
    and the held-out dataset's frame indices, for each case of ``spec["cases"]``."""
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.datasets.factory import make_train_eval_datasets
    from lerobot.policies.act.configuration_act import ACTConfig

    results = {}
    for name, case in spec["cases"].items():
        dataset = DatasetConfig(
            repo_id="local/heldout",
            root=spec["dataset_root"],
            eval_split=case["eval_split"],
            episodes=case.get("episodes"),
        )
        cfg = TrainPipelineConfig(
            dataset=dataset, policy=ACTConfig(device="cpu", push_to_hub=False)
        )
        try:
            train, held_out = make_train_eval_datasets(cfg)
        except ValueError as e:
            results[name] = {"error": str(e)}
            continue
        results[name] = {
            "train": list(train.episodes),
            "eval": list(held_out.episodes),
            "eval_index": held_out.hf_dataset.data.column("index").to_pylist(),
        }
    Path(spec["out"]).write_text(json.dumps(results))


def job_heldout_loss(spec: dict) -> None:
    """lerobot_train.py's held-out loss (its eval step) on one process: the held-out dataset of
    make_train_eval_datasets in a loader of ``spec["batch_size"]``, the policy in eval mode under
    no_grad, the mean of the per-batch losses."""
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.datasets.factory import make_train_eval_datasets

    policy_cfg, policy, pre, _ = _policy(spec["pretrained"], spec["dataset_root"])
    dataset = DatasetConfig(
        repo_id="local/heldout", root=spec["dataset_root"], eval_split=spec["eval_split"]
    )
    _, held_out = make_train_eval_datasets(TrainPipelineConfig(dataset=dataset, policy=policy_cfg))
    loader = torch.utils.data.DataLoader(held_out, batch_size=spec["batch_size"], shuffle=False)
    policy.eval()
    losses = []
    with torch.no_grad():
        for batch in loader:
            loss, _ = policy.forward(pre(batch))
            losses.append(loss.item())
    Path(spec["out"]).write_text(
        json.dumps({"eval_loss": sum(losses) / len(losses), "num_samples": len(held_out)})
    )


def job_train_config(spec: dict) -> None:
    """Decode a train_config.json with LeRobot's TrainPipelineConfig (draccus), as --config_path
    does, and write back what it decoded."""
    import draccus
    import lerobot.policies  # noqa: F401 - registers the policy types (in a batch of its own)
    from lerobot.configs.train import TrainPipelineConfig

    cfg = TrainPipelineConfig.from_pretrained(spec["path"])
    Path(spec["out"]).write_text(json.dumps(draccus.encode(cfg), indent=2, default=str))


def job_training_state(spec: dict) -> None:
    """What lerobot-train's resume restores from a checkpoint: the policy, the optimizer and
    scheduler built from its train_config.json, then ``load_training_state``. Writes the optimizer
    state keyed by parameter name, the param groups' hyper-parameters and the first numbers each
    random generator draws after the RNG restore."""
    from lerobot.common.train_utils import load_training_state
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.datasets import LeRobotDatasetMetadata
    from lerobot.optim.factory import make_optimizer_and_scheduler
    from lerobot.policies.factory import make_policy

    step_dir = Path(spec["checkpoint"])
    cfg = TrainPipelineConfig.from_pretrained(spec["train_config"])
    cfg.policy.pretrained_path = step_dir / "pretrained_model"
    cfg.policy.device = "cpu"
    meta = LeRobotDatasetMetadata("interop/dataset", root=spec["dataset_root"])
    policy = make_policy(cfg.policy, ds_meta=meta)
    optimizer, scheduler = make_optimizer_and_scheduler(cfg, policy)
    step, optimizer, scheduler = load_training_state(step_dir, optimizer, scheduler)
    draws = {
        "torch": torch.rand(4, dtype=torch.float64),
        "numpy": torch.from_numpy(np.random.rand(4)),
        "python": torch.tensor([random.random() for _ in range(4)], dtype=torch.float64),
    }
    names = {id(p): n for n, p in _named_parameters(policy).items()}
    tensors = {f"rng/{k}": v for k, v in draws.items()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    tensors[f"state/{names[id(p)]}/{key}"] = value
    save_file({k: v.contiguous() for k, v in tensors.items()}, spec["out"])
    groups = [
        {k: v for k, v in g.items() if k != "params"} | {"num_params": len(g["params"])}
        for g in optimizer.param_groups
    ]
    info = {"step": step, "param_groups": groups, "optimizer": type(optimizer).__name__}
    Path(spec["out"] + ".json").write_text(json.dumps(info, indent=2, default=str))


def job_defaults(spec: dict) -> None:
    """LeRobot's ACT config and train config at their defaults, as draccus encodes them."""
    import draccus
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.policies.act.configuration_act import ACTConfig

    defaults = {
        "policy": draccus.encode(ACTConfig()),
        "train": draccus.encode(TrainPipelineConfig(dataset=DatasetConfig(repo_id="any/name"))),
    }
    Path(spec["out"]).write_text(json.dumps(defaults, indent=2, default=str))


def job_lr_schedules(spec: dict) -> None:
    """The learning rate of every parameter group at each loop step (before the step's update,
    and once after the last) under LeRobot's schedulers, as ``lerobot-train`` steps them: one
    ``scheduler.step()`` after each optimizer step. ``cases``: name -> {"scheduler": {"type",
    ...fields}, "steps", "lrs": the groups' base lrs}; writes name -> [[lr per group], ...]."""
    from lerobot.optim.schedulers import LRSchedulerConfig

    out = {}
    for name, case in spec["cases"].items():
        fields = dict(case["scheduler"])
        config = LRSchedulerConfig.get_choice_class(fields.pop("type"))(**fields)
        first, *others = case["lrs"]
        groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in others]
        optimizer = torch.optim.SGD(
            [{"params": [torch.nn.Parameter(torch.zeros(1))]}, *groups], lr=first
        )
        scheduler = config.build(optimizer, case["steps"])
        lrs = []
        for _ in range(case["steps"]):
            lrs.append([g["lr"] for g in optimizer.param_groups])
            optimizer.step()
            scheduler.step()
        out[name] = [*lrs, [g["lr"] for g in optimizer.param_groups]]
    Path(spec["out"]).write_text(json.dumps(out, indent=1))


JOBS = {
    "actions": job_actions,
    "defaults": job_defaults,
    "ema_decays": job_ema_decays,
    "loss": job_loss,
    "lr_schedules": job_lr_schedules,
    "strict_actions": job_strict_actions,
    "eval_split": job_eval_split,
    "heldout_loss": job_heldout_loss,
    "train_config": job_train_config,
    "training_state": job_training_state,
}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "batch":
        print(__doc__, file=sys.stderr)
        return 2
    failed = 0
    for spec in json.loads(Path(argv[1]).read_text()):
        error_file = Path(spec["out"] + ".error.json")
        try:
            JOBS[spec["job"]](spec)
        except Exception as e:  # noqa: BLE001 - recorded for the test to judge
            failed += 1
            error_file.write_text(
                json.dumps(
                    {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
                )
            )
    print(f"upstream_driver: {failed} job(s) raised", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
