"""LeRobot's layouts of a checkpoint's training state, both ways: the optimizer state as one flat
safetensors file (parameters numbered in the optimizer's order) with its param groups in torch's
default implementation keys, every rank's RNG state under LeRobot's names (the main rank's flat,
which LeRobot's ``load_rng_state`` reads), and the fp16 loss scaler's state as JSON values.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from lerobot_pipe.checkpoint.layout import CheckpointError

log = logging.getLogger(__name__)


def flatten_tensors(tree: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    """Nested dict of tensors/numbers -> flat {"a/b/c": tensor} (the optimizer-state layout)."""
    flat: dict[str, torch.Tensor] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_tensors(value, name + "/"))
        elif isinstance(value, torch.Tensor):
            flat[name] = value.detach().cpu().contiguous()
        else:
            flat[name] = torch.tensor(value)
    return flat


def unflatten_tensors(flat: dict[str, torch.Tensor]) -> dict:
    tree: dict = {}
    for name, value in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def index_optimizer_state(osd: dict) -> tuple[dict[int, Any], list[dict]]:
    """LeRobot's layout of a full optimizer state: parameters numbered in the optimizer's order
    (group after group), ``state`` keyed by that number and ``params`` listing numbers."""
    index: dict[str, int] = {}
    groups = []
    for group in osd["param_groups"]:
        numbers = [index.setdefault(fqn, len(index)) for fqn in group["params"]]
        groups.append({**group, "params": numbers})
    return {index[fqn]: value for fqn, value in osd["state"].items()}, groups


def named_optimizer_state(state: dict, saved_groups: list[dict], current: dict) -> dict:
    """The saved optimizer state keyed by parameter name, for ``set_optimizer_state_dict``.

    ``saved_groups`` list parameter numbers (LeRobot's layout) or names (the sharded layout and
    lerobot_pipe's earlier one); ``current`` is this optimizer's own state dict, whose groups
    name the parameters in order. Saved hyper-parameters (the lr a scheduler reached) win."""
    current_groups = current["param_groups"]
    names = [fqn for group in current_groups for fqn in group["params"]]
    numbered = any(isinstance(p, int) for g in saved_groups for p in g["params"])
    if numbered:
        sizes = [len(g["params"]) for g in saved_groups]
        expected = [len(g["params"]) for g in current_groups]
        if sizes != expected:
            raise CheckpointError(
                f"the checkpoint's optimizer has parameter groups of sizes {sizes}, this policy's "
                f"optimizer {expected}: it was written for another model or policy configuration"
            )
        by_number = dict(enumerate(names))
        return {
            "state": {by_number[int(k)]: v for k, v in state.items()},
            "param_groups": [
                {**saved, "params": [by_number[int(n)] for n in saved["params"]]}
                for saved in saved_groups
            ],
        }
    if [len(g["params"]) for g in saved_groups] == [len(g["params"]) for g in current_groups]:
        return {"state": state, "param_groups": saved_groups}
    # Grouping changed (lerobot_pipe before LeRobot's backbone group): keep this optimizer's
    # groups, each with the hyper-parameters of the saved group that held its first parameter.
    owner = {fqn: g for g in saved_groups for fqn in g["params"]}
    regrouped = []
    for group in current_groups:
        saved = owner.get(group["params"][0], group) if group["params"] else group
        regrouped.append({**saved, "params": group["params"]})
    log.warning("the checkpoint's optimizer parameter groups differ from this run's; regrouped")
    return {"state": state, "param_groups": regrouped}


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"missing checkpoint file: {path}")
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"corrupt checkpoint file {path}: {e}") from None


# LeRobot's names (utils/random_utils.py); ``py_rng_gauss`` is ours: random.gauss's cached value,
# which LeRobot drops and an exact resume needs. The main rank's state is stored under these flat
# names, which LeRobot's load_rng_state reads; rank r > 0 under ``rank<r>/<name>``, which it ignores.
_LEGACY_RNG_NAMES = {  # lerobot_pipe's names before the LeRobot layout
    "python_version": "py_rng_version",
    "python_state": "py_rng_state",
    "python_gauss": "py_rng_gauss",
    "numpy_keys": "np_rng_state_values",
    "numpy_pos": "np_rng_state_index",
    "numpy_has_gauss": "np_rng_has_gauss",
    "numpy_gauss": "np_rng_cached_gaussian",
    "torch": "torch_rng_state",
    "cuda": "torch_cuda_rng_state",
}


def capture_rng_state() -> dict[str, torch.Tensor]:
    version, mt_state, gauss = random.getstate()
    _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "py_rng_version": torch.tensor([version], dtype=torch.int64),
        "py_rng_state": torch.tensor(mt_state, dtype=torch.int64),
        "py_rng_gauss": torch.tensor(
            [float("nan") if gauss is None else gauss], dtype=torch.float64
        ),
        "np_rng_state_values": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
        "np_rng_state_index": torch.tensor([np_pos], dtype=torch.int64),
        "np_rng_has_gauss": torch.tensor([np_has_gauss], dtype=torch.int64),
        "np_rng_cached_gaussian": torch.tensor([np_gauss], dtype=torch.float64),
        "torch_rng_state": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda_rng_state"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict[str, torch.Tensor]) -> None:
    gauss = float(state["py_rng_gauss"].reshape(-1)[0]) if "py_rng_gauss" in state else None
    random.setstate(
        (
            int(state["py_rng_version"].reshape(-1)[0]),
            tuple(int(v) for v in state["py_rng_state"].tolist()),
            None if gauss is None or np.isnan(gauss) else gauss,
        )
    )
    np.random.set_state(
        (
            "MT19937",
            state["np_rng_state_values"].numpy().astype(np.uint32),
            int(state["np_rng_state_index"].reshape(-1)[0]),
            int(state["np_rng_has_gauss"].reshape(-1)[0]),
            float(state["np_rng_cached_gaussian"].reshape(-1)[0]),
        )
    )
    torch.set_rng_state(state["torch_rng_state"])
    if "torch_cuda_rng_state" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["torch_cuda_rng_state"])


def flatten_rng_states(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every rank's RNG state in one flat dict: the main rank's under LeRobot's names."""
    flat = dict(states[0])
    for rank, state in enumerate(states[1:], start=1):
        flat.update({f"rank{rank}/{k}": v for k, v in state.items()})
    return flat


def rank_rng_state(flat: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """One rank's state from :func:`flatten_rng_states` output (or the earlier per-rank layout);
    empty when the file holds none for ``rank``."""
    prefix = f"rank{rank}/"
    mine = {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}
    if mine and "python_version" in mine:  # lerobot_pipe's earlier names
        return {_LEGACY_RNG_NAMES[k]: v for k, v in mine.items() if k in _LEGACY_RNG_NAMES}
    if rank == 0 and not mine:
        return {k: v for k, v in flat.items() if "/" not in k}
    return mine


def scaler_state(scaler: torch.amp.GradScaler) -> dict:
    """The GradScaler's state as JSON values."""
    return {
        k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in scaler.state_dict().items()
    }


# How torch's optimizers run, not what they compute: a loaded state keeps this run's choice
# (a checkpoint written by LeRobot, or by a run on another device, must not switch them).
IMPLEMENTATION_KEYS = ("foreach", "fused", "capturable", "differentiable")

# torch's defaults of IMPLEMENTATION_KEYS: what LeRobot's optimizer_param_groups.json holds (its
# loader refuses a value of another type, e.g. ``"fused": true`` where it has null).
_TORCH_DEFAULTS = {"foreach": None, "fused": None, "capturable": False, "differentiable": False}


def as_torch_defaults(param_groups: list[dict] | None) -> list[dict] | None:
    """Saved param groups with torch's default implementation keys (the file LeRobot writes);
    a resume here gives them back this run's (:func:`keep_implementation`)."""
    if param_groups is None:
        return None
    return [{**g, **{k: v for k, v in _TORCH_DEFAULTS.items() if k in g}} for g in param_groups]


def keep_implementation(optimizer: torch.optim.Optimizer, load: Callable[[], None]) -> None:
    """Run ``load()`` (which loads a saved state into ``optimizer``), then give every group back
    this optimizer's IMPLEMENTATION_KEYS, with the step counters where a fused or capturable
    kernel wants them (float32, on the parameter's device; torch moves them only when the saved
    groups say fused)."""
    chosen = [{k: g[k] for k in IMPLEMENTATION_KEYS if k in g} for g in optimizer.param_groups]
    load()
    for group, flags in zip(optimizer.param_groups, chosen, strict=True):
        group.update(flags)
        if not (flags.get("fused") or flags.get("capturable")):
            continue
        for p in group["params"]:
            state = optimizer.state.get(p)
            if state and torch.is_tensor(state.get("step")):
                state["step"] = state["step"].to(dtype=torch.float32, device=p.device)
