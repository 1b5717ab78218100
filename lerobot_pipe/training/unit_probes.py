"""Which modules of a policy can be FSDP2 wrap units: a module whose forward never runs (the
policy calls its children directly) cannot be one. Found by running the still unsharded policy
on one real batch, training forward and ``select_action`` (distributed/unit_probe.py), on the
meta device before launch, or on the real model when the meta device cannot run it."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
from torch import nn

from lerobot_pipe.configs.types import OBS_LANGUAGE_PREFIX
from lerobot_pipe.datasets import BatchPrefetcher
from lerobot_pipe.distributed.parallelize import ShardingPlan, plan_sharding
from lerobot_pipe.distributed.runtime import run_on_main
from lerobot_pipe.distributed.unit_probe import MetaValues, find_bypassed_modules
from lerobot_pipe.policies.pretrained import PreTrainedPolicy
from lerobot_pipe.processors import PolicyProcessorPipeline
from lerobot_pipe.training.data import make_sampler

if TYPE_CHECKING:
    from lerobot_pipe.training.preflight import TrainingPlan


def bypassed_on_meta(
    plan: TrainingPlan, policy: PreTrainedPolicy, trainee: nn.Module, pre: PolicyProcessorPipeline
) -> dict[str, str] | str:
    """The modules whose forward the meta-device policy bypasses (name -> why), or why they
    cannot be found there (e.g. a policy that reads a value, ``.item()``, in its forward)."""
    try:
        return probe_forwards(plan, policy, trainee, pre, torch.device("cpu"), on_meta=True)
    except Exception as e:  # the launch probes the real model instead
        return f"probing its wrap units on the meta device failed ({type(e).__name__}: {e})"


def plan_units_on_the_real_model(
    plan: TrainingPlan,
    policy: PreTrainedPolicy,
    trainee: nn.Module,
    pre: PolicyProcessorPipeline,
    device: torch.device,
) -> ShardingPlan:
    """The run's FSDP2 wrap units when the meta device could not run the probe before launch
    (``plan.sharding_unprobed``): planned once every rank has run the still unsharded policy
    on one real batch. A module whose forward that skips cannot be a unit (the size policy
    passes over it; a unit chosen by class is refused, naming it). Before the first step, so
    that this fails with a message instead of FSDP2's "mixed torch.Tensor and DTensor" in the
    middle of the model. Collective."""
    # Every rank runs it, on the same batch: a policy's forward may hold collectives of its own
    # (LeRobot's vqbet all-reduces its codebook), which a probe on the main rank alone would
    # leave waiting for the others. The main rank's answer is every rank's.
    bypassed = probe_forwards(plan, policy, trainee, pre, device)
    bypassed = run_on_main(lambda: bypassed, what="running the policy once")
    return plan_sharding(trainee, plan.cfg.accelerator, type(policy)._fsdp_wrap_modules, bypassed)


def probe_forwards(
    plan: TrainingPlan,
    policy: PreTrainedPolicy,
    trainee: nn.Module,
    pre: PolicyProcessorPipeline,
    device: torch.device,
    on_meta: bool = False,
) -> dict[str, str]:
    """find_bypassed_modules on a batch of two samples as the loop gets them; RNGs, buffers and
    the policy's queues are left as they were. ``on_meta``: the model is on the meta device
    (the batch is moved there, values read from it answer 1: unit_probe.MetaValues)."""
    cfg = plan.cfg
    sampler = make_sampler(plan, min(2, cfg.batch_size), 0, 1)
    with BatchPrefetcher(plan.dataset, sampler, 0, device=device) as loader:
        batch = pre(loader.next())
    features = policy.config.input_features
    # select_action takes one observation per sample: the newest of an observation window; the
    # preprocessor's language tokens (observation.language.*) go with it.
    observation = {
        key: value[:, -1] if value.dim() == len(features[key]["shape"]) + 2 else value
        for key, value in batch.items()
        if key in features
    }
    observation |= {k: v for k, v in batch.items() if k.startswith(OBS_LANGUAGE_PREFIX)}
    if on_meta:  # the model built on the meta device: the batch as shapes only
        batch, observation = (
            {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in d.items()}
            for d in (batch, observation)
        )
    else:
        trainee.to(device)
    with MetaValues() if on_meta else contextlib.nullcontext():
        return find_bypassed_modules(
            trainee,
            lambda: trainee(batch),
            lambda: policy.select_action(observation),
            reset=policy.reset,
        )
