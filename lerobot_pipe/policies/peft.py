"""PEFT (LoRA) fine-tuning of a pretrained policy, with peft's own module and file names.

The trainer wraps the policy in a ``PeftModel`` (module paths gain ``base_model.model.``), shards
or replicates that wrapper like any policy, and saves only the adapter: ``adapter_model.safetensors``
(keys as ``peft.get_peft_model_state_dict`` names them) + ``adapter_config.json`` recording the base
policy's path. :func:`load_pretrained_policy` loads either kind of folder for inference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from lerobot_pipe import constants as C
from lerobot_pipe.configs.policies import PreTrainedConfig
from lerobot_pipe.policies.pretrained import PreTrainedPolicy

if TYPE_CHECKING:
    from lerobot_pipe.configs.train import PeftConfig


def apply_peft(policy: PreTrainedPolicy, peft_cfg: PeftConfig, base_path: str | None) -> nn.Module:
    """Freeze ``policy`` and add LoRA adapters; returns the PeftModel to train."""
    from peft import LoraConfig, get_peft_model

    if peft_cfg.method_type != "LORA":
        raise ValueError(f"--peft.method_type={peft_cfg.method_type!r}: only LORA is supported")
    declared = type(policy)._peft_target_modules  # names, or one regex over full names
    targets = peft_cfg.target_modules or (declared if isinstance(declared, str) else list(declared))
    names = [name for name, _ in policy.named_modules() if name]
    present = {name.rsplit(".", 1)[-1] for name in names}
    # peft's rule: a target names a module, or the end of its dotted path ("cond_encoder.1").
    # A string is peft's regex over full names, not checked here.
    missing = [
        t
        for t in ([] if isinstance(targets, str) else targets)
        if not any(n == t or n.endswith("." + t) for n in names)
    ]
    if missing:
        raise ValueError(
            f"--peft.target_modules: {', '.join(missing)} match no module name of the "
            f"{policy.name} policy; e.g. {', '.join(sorted(present - {''})[:12])}"
        )
    # As LeRobot builds it: unset fields keep peft's defaults (lora_alpha 8), init_type is
    # LoraConfig's init_lora_weights.
    optional = {"lora_alpha": peft_cfg.lora_alpha, "init_lora_weights": peft_cfg.init_type}
    config = LoraConfig(
        r=peft_cfg.r,
        lora_dropout=peft_cfg.lora_dropout,
        target_modules=targets,
        modules_to_save=peft_cfg.full_training_modules,
        base_model_name_or_path=base_path,
        **{k: v for k, v in optional.items() if v is not None},
    )
    # get_peft_model records the base path from the model's name_or_path (transformers' attribute).
    policy.name_or_path = base_path
    return get_peft_model(policy, config)


def adapter_key_map(model: nn.Module) -> dict[str, str]:
    """peft file key -> model state-dict key, for every adapter / full-training tensor.
    Call it on the unwrapped PeftModel (before DDP adds its ``module.`` prefix)."""
    from peft import get_peft_model_state_dict

    sentinels = {k: torch.empty(0) for k in model.state_dict()}
    owner = {id(t): k for k, t in sentinels.items()}
    renamed = get_peft_model_state_dict(model, state_dict=sentinels)
    return {peft_key: owner[id(t)] for peft_key, t in renamed.items()}


def wrap_with_adapter_config(policy: PreTrainedPolicy, adapter_config: dict) -> nn.Module:
    """The PeftModel that ``adapter_config`` (the contents of peft's adapter_config.json) describes,
    around ``policy``; its adapters are freshly initialized."""
    from peft import PeftConfig, get_peft_model

    # get_peft_model records the base path from the model's name_or_path (transformers' attribute).
    policy.name_or_path = adapter_config.get("base_model_name_or_path")
    return get_peft_model(policy, PeftConfig.from_peft_type(**adapter_config))


def write_adapter(directory: Path, model: nn.Module, full_state: dict[str, torch.Tensor]) -> None:
    """Write adapter_model.safetensors + adapter_config.json from a gathered full state dict."""
    from peft import get_peft_model_state_dict

    adapter = get_peft_model_state_dict(model, state_dict=full_state)
    save_file(
        {k: v.contiguous() for k, v in adapter.items()},
        directory / C.ADAPTER_SAFETENSORS,
        metadata={"format": "pt"},
    )
    write_adapter_config(directory, model)


def write_adapter_config(directory: Path, model: nn.Module) -> None:
    config = model.peft_config["default"].to_dict()
    config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}
    (directory / C.ADAPTER_CONFIG_NAME).write_text(json.dumps(config, indent=4, default=str) + "\n")


def load_pretrained_policy(
    path: str | Path, config: PreTrainedConfig | None = None
) -> PreTrainedPolicy:
    """A policy folder with model.safetensors, or an adapter folder (adapter_model.safetensors +
    adapter_config.json naming the base policy): the adapter is merged into the base.
    ``config`` replaces the folder's config.json."""
    from lerobot_pipe.policies.factory import get_policy_class

    path = Path(path)
    config = config or PreTrainedConfig.from_pretrained(path)
    policy_cls = get_policy_class(config)
    if not (path / C.ADAPTER_CONFIG_NAME).is_file():
        return policy_cls.from_pretrained(path, config=config)
    from peft import set_peft_model_state_dict

    adapter_file = path / C.ADAPTER_SAFETENSORS
    if not adapter_file.is_file():
        if (path / C.MODEL_DCP_DIR).is_dir():
            raise FileNotFoundError(
                f"{path} holds DCP shards only; convert it first with: lerobot-convert-dcp --checkpoint_dir={path}"
            )
        raise FileNotFoundError(f"no {C.ADAPTER_SAFETENSORS} in {path}")
    adapter_config = json.loads((path / C.ADAPTER_CONFIG_NAME).read_text())
    base = adapter_config.get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        raise FileNotFoundError(
            f"{path / C.ADAPTER_CONFIG_NAME}: base policy {base!r} (base_model_name_or_path) is not a local folder"
        )
    policy = policy_cls.from_pretrained(base, config=config)
    peft_model = wrap_with_adapter_config(policy, adapter_config)
    result = set_peft_model_state_dict(peft_model, load_file(adapter_file))
    if result.unexpected_keys:
        raise RuntimeError(f"{adapter_file}: unexpected keys {result.unexpected_keys}")
    merged = peft_model.merge_and_unload()
    merged.eval()
    return merged
