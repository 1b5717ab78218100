"""The stateless steps of LeRobot's policy pipelines: renaming, batching, device placement.

Registry names, configs and behaviour are LeRobot's (``rename_observations_processor``,
``to_batch_processor``, ``device_processor``), so a pipeline saved here runs the same in LeRobot's
tools, and the overrides those tools pass (``device_processor``, ``rename_observations_processor``)
find the steps they expect.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lerobot_pipe.configs.types import ACTION, OBS_ENV_STATE, OBS_IMAGES_PREFIX, OBS_STATE
from lerobot_pipe.processors.pipeline import Batch, ProcessorError, ProcessorStep, register_step

OBS_IMAGE = "observation.image"
FLOAT_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


@register_step
class RenameObservationsProcessorStep(ProcessorStep):
    """Renames observation keys (``--rename_map``): a dataset's or robot's camera and state names
    onto those the policy was trained with. Keys outside the map keep their names."""

    registry_name = "rename_observations_processor"

    def __init__(self, rename_map: dict[str, str] | None = None) -> None:
        self.rename_map = dict(rename_map or {})

    def __call__(self, batch: Batch) -> Batch:
        if not self.rename_map:
            return batch
        return {
            self.rename_map.get(k, k) if k.startswith("observation") else k: v
            for k, v in batch.items()
        }

    def get_config(self) -> dict[str, Any]:
        return {"rename_map": dict(self.rename_map)}


@register_step
class AddBatchDimensionProcessorStep(ProcessorStep):
    """Makes a single observation a batch of one: 1-D states, 3-D images, a 1-D action, a task
    string and 0-D index tensors gain a leading dimension. Batched inputs pass unchanged."""

    registry_name = "to_batch_processor"

    def __call__(self, batch: Batch) -> Batch:
        out = dict(batch)
        for key, value in batch.items():
            if not isinstance(value, Tensor):
                if key == "task" and isinstance(value, str):
                    out[key] = [value]
                continue
            single = (
                (key in (OBS_STATE, OBS_ENV_STATE, ACTION) and value.dim() == 1)
                or ((key == OBS_IMAGE or key.startswith(OBS_IMAGES_PREFIX)) and value.dim() == 3)
                or (key in ("index", "task_index") and value.dim() == 0)
            )
            if single:
                out[key] = value.unsqueeze(0)
        return out


@register_step
class DeviceProcessorStep(ProcessorStep):
    """Moves every tensor to ``device`` (asynchronously on CUDA) and, with ``float_dtype``, casts
    floating-point tensors to it."""

    registry_name = "device_processor"

    def __init__(self, device: str = "cpu", float_dtype: str | None = None) -> None:
        if float_dtype is not None and float_dtype not in FLOAT_DTYPES:
            raise ProcessorError(
                f"device_processor: float_dtype {float_dtype!r} is not one of {sorted(FLOAT_DTYPES)}"
            )
        self.device = str(device)
        self.float_dtype = float_dtype
        self._device = torch.device(self.device)
        self._dtype = FLOAT_DTYPES.get(float_dtype) if float_dtype else None

    def __call__(self, batch: Batch) -> Batch:
        return {k: self._move(v) for k, v in batch.items()}

    def _move(self, value: Any) -> Any:
        if isinstance(value, Tensor):
            value = value.to(self._device, non_blocking=self._device.type == "cuda")
            if self._dtype is not None and value.is_floating_point():
                value = value.to(self._dtype)
        return value

    def get_config(self) -> dict[str, Any]:
        return {"device": self.device, "float_dtype": self.float_dtype}
