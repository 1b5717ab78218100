"""lerobot_pipe: multi-GPU training of LeRobot policies as a declarative pipeline."""

__version__ = "0.1.0"
