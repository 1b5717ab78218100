"""ACT: Action Chunking Transformer, registered as policy type "act"."""

from lerobot_pipe.policies.act.configuration_act import ACT_TINY_PRESET, ACTConfig
from lerobot_pipe.policies.act.modeling_act import (
    ACT,
    ACTDecoder,
    ACTDecoderLayer,
    ACTEncoder,
    ACTEncoderLayer,
    ACTPolicy,
    ACTSinusoidalPositionEmbedding2d,
    ACTTemporalEnsembler,
    create_sinusoidal_pos_embedding,
)

__all__ = [
    "ACT",
    "ACT_TINY_PRESET",
    "ACTConfig",
    "ACTDecoder",
    "ACTDecoderLayer",
    "ACTEncoder",
    "ACTEncoderLayer",
    "ACTPolicy",
    "ACTSinusoidalPositionEmbedding2d",
    "ACTTemporalEnsembler",
    "create_sinusoidal_pos_embedding",
]
