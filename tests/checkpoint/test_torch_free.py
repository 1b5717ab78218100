"""What the Snakefile, the train job's checks and the CLI import to list and resolve
checkpoints does not import torch (the checkpoint package's torch-free modules)."""

import subprocess
import sys

TORCH_FREE = [
    "lerobot_pipe.checkpoint.layout",
    "lerobot_pipe.checkpoint.pins",
    "lerobot_pipe.evaluation.best",
    "lerobot_pipe.checkpoint.manifest",
    "lerobot_pipe.checkpoint.resume",
    "lerobot_pipe.pipeline.config",
    "lerobot_pipe.training.progress",
    "lerobot_pipe.training.trackers",
    "lerobot_pipe.utils.repo_id",
]


def test_listing_and_resolving_checkpoints_imports_no_torch():
    code = (
        "import sys\n"
        + "".join(f"import {name}\n" for name in TORCH_FREE)
        + "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
