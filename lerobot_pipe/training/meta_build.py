"""A sharded run's policy built on the meta device: nothing of it in memory until each rank
materializes its own shards after sharding, with the values the eager build would give them
(distributed/meta_init.py records the build and replays it; --policy.path's weights are read
shard by shard). A policy that cannot be built there is built whole on every rank instead."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from lerobot_pipe import constants as C
from lerobot_pipe.distributed.meta_init import (
    DeferredInit,
    MetaBuild,
    Unsupported,
    destinations,
    safetensors_source,
)
from lerobot_pipe.distributed.parallelize import ShardingPlan
from lerobot_pipe.distributed.runtime import DistEnv
from lerobot_pipe.policies.factory import fill_features, get_policy_class
from lerobot_pipe.policies.peft import apply_peft
from lerobot_pipe.policies.pretrained import PreTrainedPolicy
from lerobot_pipe.processors import PolicyProcessorPipeline
from lerobot_pipe.training.data import make_processors
from lerobot_pipe.utils.locate import local_policy_folder

if TYPE_CHECKING:
    from lerobot_pipe.training.preflight import TrainingPlan

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class BuiltPolicy:
    """The policy a session trains, built and not yet wrapped for the topology."""

    policy: PreTrainedPolicy  # the unwrapped policy (config, save_pretrained)
    trainee: nn.Module  # the policy, or its PeftModel wrapper with PEFT
    pre: PolicyProcessorPipeline
    post: PolicyProcessorPipeline
    sharding: ShardingPlan | None  # how FSDP2 wraps it (None unless the run is sharded)
    eager_reason: str | None = None  # sharded and built eagerly: why not on the meta device

    def materialize(self, device: torch.device) -> None:
        """Nothing to do: an eager build is in memory already."""


@dataclass(frozen=True)
class NotOnMeta:
    """Why a sharded run's policy is built whole on every rank instead of on the meta device."""

    reason: str


@dataclass(kw_only=True)
class MetaBuilt(BuiltPolicy):
    """A policy built on the meta device (sharded runs), with what materializes it."""

    deferred: DeferredInit
    load: Callable[..., bool] | None = None  # safetensors_source: the weights, shard by shard
    model_file: Path | None = None
    expected_keys: frozenset[str] = frozenset()

    def materialize(self, device: torch.device) -> None:
        """Every rank's shards (and the whole buffers) with the eager build's values."""
        try:
            self.deferred.materialize(self.trainee, device, self.load)
        finally:
            if self.load is not None:
                self.load.close()
        if self.load is not None and self.load.loaded != self.expected_keys:
            unread = sorted(self.expected_keys - self.load.loaded)
            raise RuntimeError(f"cannot load {self.model_file}: {unread[:5]} were not read")


def meta_build_enabled() -> bool:
    """Sharded runs build on the meta device unless LEROBOT_PIPE_META_BUILD=0 (a diagnostic
    switch: the eager build, for comparisons)."""
    return os.environ.get(C.ENV_META_BUILD, "1") != "0"


def _pretrained_file(policy_cfg) -> Path | None:
    """--policy.path's model.safetensors (None without one); Unsupported when the folder is an
    adapter (merged into its base when loaded) or has no such file (the eager build says why)."""
    if not policy_cfg.pretrained_path:
        return None
    folder = local_policy_folder(str(policy_cfg.pretrained_path))
    if (folder / C.ADAPTER_CONFIG_NAME).is_file():
        raise Unsupported("--policy.path is a LoRA adapter, merged into its base when loaded")
    model_file = folder / C.MODEL_SAFETENSORS
    if not model_file.is_file():
        raise Unsupported(f"no {C.MODEL_SAFETENSORS} in {folder}")
    return model_file


def build_on_meta(plan: TrainingPlan, env: DistEnv) -> MetaBuilt | NotOnMeta:
    """The policy (and its PEFT wrapper) built on the meta device, to be sharded by the plan's
    sharding: nothing of it in memory yet. :class:`NotOnMeta`, its reason logged, when it cannot
    be (a policy that reads a value while building, a LoRA --policy.path, ...): the caller then
    builds eagerly. Collective; every rank agrees."""
    if not meta_build_enabled():
        return NotOnMeta(f"{C.ENV_META_BUILD}=0")
    if plan.sharding_unprobed is not None:
        return _eager(env, plan.sharding_unprobed)
    built: MetaBuilt | None = None
    reason = None
    try:
        built = _record_build(plan, env)
    except Unsupported as e:
        reason = str(e)
    except Exception as e:  # the eager build runs it again and reports what is really wrong
        reason = f"{type(e).__name__}: {e}"
    if dist.is_initialized():  # every rank must have built it to go on
        agreed = [None] * dist.get_world_size()
        dist.all_gather_object(agreed, reason)
        reason = next((r for r in agreed if r is not None), None)
    return built if reason is None else _eager(env, reason)


def _eager(env: DistEnv, reason: str) -> NotOnMeta:
    if env.is_main:
        log.warning("Building the policy whole on every rank (not on the meta device): %s", reason)
    return NotOnMeta(reason)


def _record_build(plan: TrainingPlan, env: DistEnv) -> MetaBuilt:
    """The meta-device build, recorded so that materializing replays it shard by shard."""
    cfg = plan.cfg
    fill_features(cfg.policy, plan.dataset.features)
    pretrained_parts = plan.resume_from is None and not cfg.policy.pretrained_path
    model_file = _pretrained_file(cfg.policy)
    build = MetaBuild()
    with build.recording():
        policy = get_policy_class(cfg.policy)(cfg.policy, pretrained_parts=pretrained_parts)
    policy.train()
    state = policy.state_dict(keep_vars=True)  # the file's names, before PEFT's
    pre, post = make_processors(plan, env.device.type)
    trainee: nn.Module = policy
    if cfg.peft is not None:
        with build.recording():
            trainee = apply_peft(policy, cfg.peft, cfg.policy.pretrained_path)
    load, expected = None, frozenset()
    if model_file is not None:
        load, expected = _checkpoint_names(model_file, policy, state, trainee)
    elif sources := policy.pretrained_weight_sources():
        load, expected, model_file = _pretrained_part_names(sources, state, trainee)
    return MetaBuilt(
        policy=policy,
        trainee=trainee,
        pre=pre,
        post=post,
        sharding=plan.sharding,
        deferred=build.finish(trainee),
        load=load,
        model_file=model_file,
        expected_keys=expected,
    )


def _checkpoint_names(model_file: Path, policy: PreTrainedPolicy, state: dict, trainee: nn.Module):
    """The loader of ``model_file`` into the trainee's names (PEFT's too), and the keys it must
    read; the checks of PreTrainedPolicy.from_pretrained (strict: the file's keys are the
    policy's state-dict keys, ``state``, taken before PEFT)."""
    from safetensors import safe_open

    with safe_open(str(model_file), framework="pt", device="cpu") as handle:
        file_keys = set(handle.keys())
    mapping, ignored = policy.map_file_keys(file_keys)
    missing = sorted(set(state) - set(mapping))
    unexpected = sorted((file_keys - set(mapping.values()) - ignored) | (set(mapping) - set(state)))
    if missing or unexpected:
        raise RuntimeError(
            f"{model_file} does not match {type(policy).__name__}: missing keys {missing}, "
            f"unexpected keys {unexpected}"
        )
    key_of = {id(t): mapping[k] for k, t in state.items()}
    names = {name: key_of[id(t)] for name, t in destinations(trainee).items() if id(t) in key_of}
    return safetensors_source(model_file, names), frozenset(file_keys - ignored)


def _pretrained_part_names(sources: list, state: dict, trainee: nn.Module):
    """The loader of the parts a policy built on the meta device reads from their own
    pretrained files (``pretrained_weight_sources``, e.g. SmolVLA's VLM with load_vlm_weights),
    the keys it must read, and what it reads from. Every one of the part's state-dict entries
    must be in its files (a file may hold more, e.g. VLM layers past num_vlm_layers);
    Unsupported otherwise (the eager build then loads it as from_pretrained does)."""
    if len(sources) != 1:
        raise Unsupported(f"{len(sources)} pretrained parts to read: one is supported")
    prefix, model_id, files = sources[0]
    keys = set(files) if isinstance(files, dict) else _safetensors_keys(files)
    wanted = {k: k.removeprefix(prefix) for k in state if k.startswith(prefix)}
    lacking = sorted(k for k, key in wanted.items() if key not in keys)
    if lacking:
        raise Unsupported(f"{model_id}'s weights lack {lacking[:3]} ({len(lacking)} in all)")
    key_of = {id(t): wanted[k] for k, t in state.items() if k in wanted}
    names = {name: key_of[id(t)] for name, t in destinations(trainee).items() if id(t) in key_of}
    return safetensors_source(files, names), frozenset(wanted.values()), Path(model_id)


def _safetensors_keys(model_file: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(model_file), framework="pt", device="cpu") as handle:
        return set(handle.keys())
