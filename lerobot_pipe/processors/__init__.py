"""LeRobot's processor pipelines around the policy: renaming, batching, device placement,
normalization of inputs and unnormalization of actions."""

from lerobot_pipe.processors.factory import make_pre_post_processors
from lerobot_pipe.processors.normalize import NormalizerProcessorStep, UnnormalizerProcessorStep
from lerobot_pipe.processors.pipeline import (
    PolicyProcessorPipeline,
    ProcessorError,
    ProcessorStep,
    register_step,
)
from lerobot_pipe.processors.steps import (
    AddBatchDimensionProcessorStep,
    DeviceProcessorStep,
    RenameObservationsProcessorStep,
)

__all__ = [
    "AddBatchDimensionProcessorStep",
    "DeviceProcessorStep",
    "NormalizerProcessorStep",
    "PolicyProcessorPipeline",
    "ProcessorError",
    "ProcessorStep",
    "RenameObservationsProcessorStep",
    "UnnormalizerProcessorStep",
    "make_pre_post_processors",
    "register_step",
]
