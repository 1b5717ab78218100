"""LeRobot's processor pipelines around the policy: renaming, batching, device placement,
normalization of inputs and unnormalization of actions. A policy's pair is built or loaded by
``lerobot_pipe.policies.factory.make_pre_post_processors`` (LeRobot's place), which also
registers the policies' own steps."""

from lerobot_pipe.processors.normalize import (
    MissingStats,
    NormalizerProcessorStep,
    UnnormalizerProcessorStep,
)
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
    "MissingStats",
    "NormalizerProcessorStep",
    "PolicyProcessorPipeline",
    "ProcessorError",
    "ProcessorStep",
    "RenameObservationsProcessorStep",
    "UnnormalizerProcessorStep",
    "register_step",
]
