"""Helpers the VLA tests (SmolVLA, pi0, pi0.5) share: a saved policy run as LeRobot's drivers run
theirs, and one rank's loss and gradients on a fixed batch for the activation-checkpointing
tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch


def run_saved_policy(folder: Path, inputs: dict[str, torch.Tensor], tasks: list[str]) -> dict:
    """Our policy and processors loaded from ``folder`` (an adapter folder: merged into its
    base) with lerobot-eval's overrides, run as the LeRobot drivers run LeRobot's: the
    preprocessed tokens, mask and state, the loss (both reductions) from ``inputs``' noise and
    time, the actions from its noise (and postprocessed), the state-dict keys, the policy."""
    from lerobot_pipe.policies.factory import make_pre_post_processors
    from lerobot_pipe.policies.peft import load_pretrained_policy

    policy = load_pretrained_policy(folder)
    pre, post = make_pre_post_processors(
        policy.config,
        pretrained_path=folder,
        preprocessor_overrides={
            "device_processor": {"device": "cpu"},
            "rename_observations_processor": {"rename_map": {}},
        },
    )
    batch = {k: v for k, v in inputs.items() if k not in ("noise", "time")}
    processed = pre({**batch, "task": list(tasks)})
    with torch.no_grad():
        loss, _ = policy(dict(processed), noise=inputs["noise"], time=inputs["time"])
        per_sample, _ = policy(
            dict(processed), noise=inputs["noise"], time=inputs["time"], reduction="none"
        )
    actions = policy.predict_action_chunk(dict(processed), noise=inputs["noise"])
    return {
        "tokens": processed["observation.language.tokens"],
        "mask": processed["observation.language.attention_mask"],
        "state": processed["observation.state"],
        "loss": loss.reshape(1),
        "per_sample": per_sample,
        "actions": actions,
        "actions_post": post(actions),
        "keys": sorted(policy.state_dict()),
        "policy": policy,
    }


def gradients_of_one_batch(argv: list[str], make_batch: Callable, counted: tuple[str, ...]) -> dict:
    """One rank of the run ``argv``: the loss and full gradients on ``make_batch(config)`` =
    (batch, noise) with the flow times (0.3, 0.8), how often each ``counted`` module ran
    (forward and backward) and the bytes autograd kept for the backward outside checkpointed
    units."""
    from torch.distributed.tensor import DTensor

    from lerobot_pipe.distributed.runtime import destroy, init_distributed
    from lerobot_pipe.training.preflight import make_plan
    from lerobot_pipe.training.session import prepare_session

    plan = make_plan(argv, int(os.environ.get("WORLD_SIZE", "1")), os.environ)
    env = init_distributed()
    try:
        session = prepare_session(plan, env)
        policy = session.policy
        batch, noise = make_batch(policy.config)
        calls = dict.fromkeys(counted, 0)
        for name in counted:

            def count(module, args, name=name):
                calls[name] += 1

            policy.get_submodule(name).register_forward_pre_hook(count)
        kept = [0]

        def pack(tensor):
            kept[0] += tensor.numel() * tensor.element_size()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss, _ = session.model(batch, noise=noise, time=torch.tensor([0.3, 0.8]))
        loss.backward()
        grads = {}
        for name, p in session.trainee.named_parameters():
            if p.grad is not None:
                grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                grads[name] = grad.clone()
    finally:
        destroy()
    return {"loss": loss.detach(), "grads": grads, "calls": calls, "kept": kept[0]}
