"""LeRobot 0.6.1's W&B resume finds the run lerobot_pipe wrote: its lookup of the run id in the
output folder (``get_wandb_run_id_from_filesystem``) on our offline run's folder gives our id, so
either trainer continues the other's W&B run."""

from __future__ import annotations

import pytest
from tiny import run_train, tiny_act_flags

pytestmark = pytest.mark.interop
pytest.importorskip("wandb")

from lerobot_pipe.training.trackers import saved_run_id  # noqa: E402

LOOKUP = """\
import sys
from pathlib import Path

from lerobot.common.wandb_utils import get_wandb_run_id_from_filesystem

print(get_wandb_run_id_from_filesystem(Path(sys.argv[1])))
"""


def test_lerobot_finds_our_wandb_run_id(upstream, dataset_root, tmp_path, monkeypatch):
    for name in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    out = tmp_path / "out"
    flags = tiny_act_flags(**{"dataset.root": dataset_root, "steps": 2, "save_freq": 0})
    run_train([*flags, "--wandb.enable=true", "--wandb.mode=offline", f"--output_dir={out}"])
    script = tmp_path / "lookup.py"
    script.write_text(LOOKUP)
    proc = upstream.run_script(script, out, home=tmp_path / "home", timeout=300)
    ours = saved_run_id(out)
    assert ours and proc.stdout.strip().splitlines()[-1] == ours
