import shutil
from pathlib import Path

import pytest

from lerobot_pipe.datasets import write_synthetic_dataset

NUM_EPISODES = 6
EPISODE_LENGTH = 20
FPS = 10


@pytest.fixture(scope="session")
def synthetic_params() -> dict[str, int]:
    """Parameters of ``synthetic_root``."""
    return {"num_episodes": NUM_EPISODES, "episode_length": EPISODE_LENGTH, "fps": FPS}


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic dataset shared (read-only) by the whole session."""
    return write_synthetic_dataset(
        tmp_path_factory.mktemp("synthetic") / "ds",
        num_episodes=NUM_EPISODES,
        episode_length=EPISODE_LENGTH,
        fps=FPS,
        seed=3,
    )


@pytest.fixture
def dataset_copy(synthetic_root: Path, tmp_path: Path) -> Path:
    """A private copy of the synthetic dataset that a test may corrupt."""
    return Path(shutil.copytree(synthetic_root, tmp_path / "copy"))
