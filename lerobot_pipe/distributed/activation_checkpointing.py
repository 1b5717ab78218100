"""Activation checkpointing (``--accelerator.activation_checkpointing.mode=full``): each wrap unit
keeps only its inputs in the forward and recomputes its activations in the backward.

The units are the FSDP2 units of a sharded run (``ShardingPlan.wrap_units``) and, unsharded, the
modules the same rules choose by class (``--accelerator.fsdp.wrap_modules``, else the policy's
``_fsdp_wrap_modules``). A unit's forward, and its unit entry where it has one (SmolVLA's
decoder layers run their work through ``run_as_unit``, unit_probe.py), is replaced on the
instance by one that runs it under ``torch.utils.checkpoint.checkpoint`` (non-reentrant). No
module is added, so every parameter name stays as it is (torch's ``checkpoint_wrapper`` inserts
``_checkpoint_wrapped_module.``), and it composes with FSDP2: installed before ``fully_shard``,
FSDP2's hooks (on ``forward``, and the entry registered as a forward method) run around the
checkpointed call, so a unit is gathered for its forward and again, by its pre-backward hook,
before the recomputation. A unit inside another checkpointed unit runs plainly (the outer one
recomputes it); without gradients (evaluation, sampling) nothing is checkpointed.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lerobot_pipe.distributed.unit_probe import UNIT_ENTRY, has_unit_entry

_state = threading.local()  # .inside: a checkpointed unit is running (forward or recompute)


def _recomputed(call: Callable) -> Callable:
    """``call``, run under a non-reentrant checkpoint when it is the outermost unit with grad."""

    def body(*args, **kwargs):
        outer = getattr(_state, "inside", False)
        _state.inside = True
        try:
            return call(*args, **kwargs)
        finally:
            _state.inside = outer

    @functools.wraps(call)
    def run(*args, **kwargs):
        if getattr(_state, "inside", False) or not torch.is_grad_enabled():
            return call(*args, **kwargs)
        return checkpoint(body, *args, use_reentrant=False, **kwargs)

    return run


def apply_activation_checkpointing(model: nn.Module, unit_names: Iterable[str]) -> int:
    """Checkpoint each named submodule's forward (and unit entry); returns how many. Call it
    before the model is sharded."""
    count = 0
    for name in unit_names:
        unit = model.get_submodule(name)
        unit.forward = _recomputed(unit.forward)
        if has_unit_entry(unit):
            unit.__dict__[UNIT_ENTRY] = _recomputed(unit.__dict__[UNIT_ENTRY])
        count += 1
    return count


def checkpointed_units(
    model: nn.Module,
    wrap_modules: list[str] | None,
    policy_wrap_modules: list[str],
    sharded_units: Iterable[str] | None,
) -> list[str]:
    """The units to checkpoint: a sharded run's FSDP2 units, else the submodules of the classes
    ``--accelerator.fsdp.wrap_modules`` (else the policy's ``_fsdp_wrap_modules``) names."""
    from lerobot_pipe.configs.parser import ConfigError

    if sharded_units is not None:
        return list(sharded_units)
    classes = wrap_modules if wrap_modules is not None else policy_wrap_modules
    names = [n for n, m in model.named_modules() if n and type(m).__name__ in classes]
    if not names:
        raise ConfigError(
            "--accelerator.activation_checkpointing.mode=full recomputes each wrap unit, and "
            f"none of the classes {list(classes)} is a module of the model: pass "
            "--accelerator.fsdp.wrap_modules='[\"ClassName\"]'"
        )
    return names
