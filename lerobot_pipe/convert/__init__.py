"""Offline conversion of model DCP checkpoints into LeRobot's safetensors files.

See :mod:`lerobot_pipe.convert.dcp_to_safetensors`. Local folders only: DCP metadata is a pickle.
"""

from lerobot_pipe.convert.dcp_read import load_dcp_state_dict, read_dcp_metadata, verify_dcp_files
from lerobot_pipe.convert.dcp_to_safetensors import convert_checkpoint
from lerobot_pipe.convert.errors import ConversionError
from lerobot_pipe.convert.verify import verify_against_dcp

__all__ = [
    "ConversionError",
    "convert_checkpoint",
    "load_dcp_state_dict",
    "read_dcp_metadata",
    "verify_against_dcp",
    "verify_dcp_files",
]
