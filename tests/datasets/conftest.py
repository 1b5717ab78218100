import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from upstream import find_upstream

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


CAMERA_EPISODES = 4
CAMERA_SEED = 5
IMAGE_SIZE = 64
HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def camera_params() -> dict[str, Any]:
    """Parameters of ``camera_root``."""
    return {
        "num_episodes": CAMERA_EPISODES,
        "episode_length": EPISODE_LENGTH,
        "fps": FPS,
        "seed": CAMERA_SEED,
        "cameras": ["top", "wrist"],
        "image_size": IMAGE_SIZE,
    }


@pytest.fixture(scope="session")
def camera_root(tmp_path_factory: pytest.TempPathFactory, camera_params: dict) -> Path:
    """The synthetic dataset with two video cameras, shared (read-only) by the session."""
    return write_synthetic_dataset(tmp_path_factory.mktemp("cameras") / "ds", **camera_params)


@pytest.fixture(scope="session")
def image_root(tmp_path_factory: pytest.TempPathFactory, camera_params: dict) -> Path:
    """The same dataset with its cameras stored as PNG images in the parquet."""
    return write_synthetic_dataset(
        tmp_path_factory.mktemp("images") / "ds", **camera_params, camera_dtype="image"
    )


@pytest.fixture
def camera_copy(camera_root: Path, tmp_path: Path) -> Path:
    """A private copy of the camera dataset that a test may corrupt."""
    return Path(shutil.copytree(camera_root, tmp_path / "copy"))


@pytest.fixture(scope="session")
def upstream(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[..., subprocess.CompletedProcess]:
    """Runs one of this folder's ``upstream_*.py`` scripts with LeRobot's interpreter."""
    found, why = find_upstream()
    if found is None:
        pytest.skip(why)
    home = tmp_path_factory.mktemp("lerobot_home")

    def run(script: str, *args: object) -> subprocess.CompletedProcess:
        return found.run_script(HERE / script, *args, home=home, timeout=300, SVT_LOG="1")

    return run
