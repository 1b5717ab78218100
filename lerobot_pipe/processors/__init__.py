"""Processors that run around the policy: normalization of inputs, unnormalization of actions."""

from lerobot_pipe.processors.normalize import (
    NormalizerProcessor,
    UnnormalizerProcessor,
    load_processors,
    make_pre_post_processors,
    save_processors,
)

__all__ = [
    "NormalizerProcessor",
    "UnnormalizerProcessor",
    "load_processors",
    "make_pre_post_processors",
    "save_processors",
]
