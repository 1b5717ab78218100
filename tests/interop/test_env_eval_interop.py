"""``--env.*`` and ``--env_eval_freq`` in train_config.json, both ways: LeRobot 0.6.1's decoder
reads our train_config.json of a run that rolled out in PushT during training (its env block
unchanged), the same flags give LeRobot's lerobot-train and ours the same env and eval blocks,
and we read LeRobot's back to the same environment."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from interop_helpers import DRIVER, LEROBOT_TIMEOUT, DriverResults, json_diff, strip_extensions
from tiny import run_train, tiny_act_flags

from lerobot_pipe import constants as C

pytestmark = pytest.mark.interop
pytest.importorskip("gym_pusht", reason="the [sim] extra (gym-pusht) is not installed")
sys.path.insert(0, str(Path(__file__).parents[1] / "evaluation"))

from pusht_data import write_pusht_dataset  # noqa: E402

FLAGS = {
    "policy.pretrained_backbone_weights": "null",
    "batch_size": 4,
    "steps": 1,
    "save_freq": 1,
    "env.type": "pusht",
    "env.episode_length": 5,
    "eval.n_episodes": 2,
    "eval.batch_size": 1,
    "eval.use_async_envs": "false",
}
# LeRobot's own run never rolls out (--env_eval_freq above --steps: its venv needs no
# simulator); ours does, at step 1.
LEROBOT_EVAL_FREQ, OUR_EVAL_FREQ = 100, 1
# What LeRobot fills in while decoding: the device, and each env config's declared features.
FILLED_BY_LEROBOT = {"policy.device", "env.features"}


def _train_config(output_dir: Path) -> Path:
    return output_dir / C.CHECKPOINTS_DIR / "000001" / C.PRETRAINED_MODEL_DIR / "train_config.json"


@pytest.fixture(scope="module")
def runs(upstream, tmp_path_factory):
    root = tmp_path_factory.mktemp("env_eval_interop")
    dataset = write_pusht_dataset(root / "pusht", episodes=2, length=10)
    flags = tiny_act_flags(**FLAGS)
    le_train = upstream.start(
        [
            "lerobot-train",
            *flags,
            f"--env_eval_freq={LEROBOT_EVAL_FREQ}",
            "--dataset.repo_id=local/pusht",
            f"--dataset.root={dataset}",
            "--wandb.enable=false",
            "--policy.device=cpu",
            "--policy.push_to_hub=false",
            f"--output_dir={root / 'le_train'}",
        ],
        cwd=root,
        log=root / "le_train.log",
    )
    ours = root / "our_train"
    run_train(
        [
            *flags,
            f"--env_eval_freq={OUR_EVAL_FREQ}",
            f"--dataset.root={dataset}",
            f"--output_dir={ours}",
        ]
    )
    if le_train.wait(LEROBOT_TIMEOUT) != 0:
        pytest.fail(f"LeRobot's lerobot-train failed:\n{le_train.tail()}", pytrace=False)
    stripped = strip_extensions(_train_config(ours), root / "stripped" / "train_config.json")
    jobs = root / "jobs.json"
    out = root / "driver"
    out.mkdir()
    jobs.write_text(
        json.dumps([{"job": "train_config", "path": str(stripped), "out": str(out / "tc.json")}])
    )
    upstream.run_script(DRIVER, "batch", jobs, home=root / ".hf_home", timeout=LEROBOT_TIMEOUT)
    return {
        "ours": ours,
        "theirs": root / "le_train",
        "stripped": stripped,
        "decoded": DriverResults(out).json("tc.json"),
    }


def test_our_run_rolled_out_in_pusht(runs):
    info = json.loads((runs["ours"] / C.EVAL_DIR / "000001" / C.EVAL_INFO).read_text())
    assert info["overall"]["n_episodes"] == 2
    assert info["per_task"][0]["task_group"] == "pusht"


def test_lerobot_decodes_our_train_config_with_an_env(runs):
    ours = json.loads(runs["stripped"].read_text())
    assert ours["env"]["type"] == "pusht" and ours["env_eval_freq"] == OUR_EVAL_FREQ
    differences = json_diff(ours, runs["decoded"])
    assert set(differences) <= FILLED_BY_LEROBOT | {"eval.batch_size"}, differences
    assert runs["decoded"]["env"]["episode_length"] == 5


def test_same_flags_same_env_and_eval_blocks_as_lerobots(runs):
    ours = json.loads(_train_config(runs["ours"]).read_text())
    theirs = json.loads(_train_config(runs["theirs"]).read_text())
    assert json_diff(ours["eval"], theirs["eval"]) == {}
    assert set(json_diff(ours["env"], theirs["env"])) == {"features"}
    assert (ours["env_eval_freq"], theirs["env_eval_freq"]) == (OUR_EVAL_FREQ, LEROBOT_EVAL_FREQ)


def test_we_read_lerobots_env_back(runs):
    from lerobot_pipe.configs.loading import parse_train_config
    from lerobot_pipe.envs.configs import PushtEnv

    cfg, _ = parse_train_config([f"--config_path={_train_config(runs['theirs'])}"])
    assert isinstance(cfg.env, PushtEnv) and cfg.env.episode_length == 5
    assert cfg.env_eval_freq == LEROBOT_EVAL_FREQ
    assert (cfg.eval.n_episodes, cfg.eval.batch_size) == (2, 1)
