"""`lerobot-pipe eval-checkpoint` (lerobot_pipe.pipeline.evaluate_job), the evaluate rule's command, in
this process: lerobot-eval into the step's folder, the stale videos of an earlier evaluation
gone, the checkpoint unpinned afterwards; bad flags name the pipeline's config keys."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("gymnasium", reason="the [sim] extra (gymnasium) is not installed")

from lerobot_pipe.checkpoint.pins import pinned_steps  # noqa: E402
from lerobot_pipe.scripts.cli import main  # noqa: E402


def test_evaluate_writes_eval_info_and_unpins(untrained_policy, tmp_path, capfd):
    train_dir = untrained_policy.parents[2]
    step_dir = untrained_policy.parent
    out = tmp_path / "eval" / step_dir.name
    stale = out / "videos" / "synthetic_0" / "eval_episode_9.mp4"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    argv = [
        "eval-checkpoint",
        f"--checkpoint_dir={step_dir}",
        f"--output_dir={out}",
        f"--policy.path={untrained_policy}",
        "--env.type=synthetic",
        "--eval.n_episodes=2",
        "--eval.batch_size=2",
        "--eval.use_async_envs=false",
        "--policy.device=cpu",
    ]
    assert main(argv) == 0
    info = json.loads((out / "eval_info.json").read_text())
    assert info["overall"]["n_episodes"] == 2
    assert info["per_task"][0]["metrics"]["seeds"] == [1000, 1001]
    assert not stale.exists()
    assert pinned_steps(train_dir) == {}

    bad = [*argv[:-1], "--env.fpss=3"]
    capfd.readouterr()
    assert main(bad) == 2
    assert capfd.readouterr().err.rstrip().endswith("[config: eval.env.fpss]")
    assert pinned_steps(train_dir) == {}
