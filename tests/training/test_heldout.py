"""The held-out loss (``--dataset.eval_split``, ``--eval_steps``, ``--max_eval_samples``): LeRobot
0.6.1's split on a dataset of several tasks, the training sampler kept off the held-out episodes,
and the figure the same on 1 and 2 ranks (DDP, FSDP2) and equal to a direct computation, per
sample, over the held-out frames of the saved checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from launch import run_distributed
from multitask import LENGTHS, write_multitask
from tiny import (
    DETERMINISTIC,
    eval_losses,
    losses,
    run_train,
    tiny_act_flags,
    tiny_diffusion_flags,
)

from lerobot_pipe import constants as C
from lerobot_pipe.datasets import LeRobotDataset
from lerobot_pipe.training.heldout import (
    cap_samples,
    heldout_keys,
    heldout_loss,
    num_forward_calls,
    plan_split,
    rank_share,
)

SPLIT = 0.3
# LeRobot 0.6.1's make_train_eval_datasets on this dataset (interop/test_heldout_interop.py
# checks these against it): groups a [0 2 3 6 8], b [1 4 7], c [5]; ceil(n x 0.3) = 2, 1, 1.
TRAIN, HELD_OUT = (0, 2, 3, 1, 4), (6, 8, 7, 5)
N_HELD_OUT = sum(LENGTHS[e] for e in HELD_OUT)  # 75: shares of 38 and 37 on 2 ranks


@pytest.fixture(scope="module")
def multitask_root(tmp_path_factory):
    return write_multitask(tmp_path_factory.mktemp("data") / "multitask")


def test_split_groups_episodes_by_first_task(multitask_root):
    dataset = LeRobotDataset(multitask_root)
    split = plan_split(dataset, SPLIT)
    assert (split.train_episodes, split.eval_episodes, split.num_tasks) == (TRAIN, HELD_OUT, 3)
    # Every frame of the held-out episodes, in index order (LeRobot's filtered dataset).
    episode = dataset.episode_index
    assert np.array_equal(split.rows, np.flatnonzero(np.isin(episode, HELD_OUT)))
    assert split.num_samples == N_HELD_OUT
    # --dataset.episodes: groups and "last" follow the order given.
    subset = LeRobotDataset(multitask_root, episodes=[8, 1, 5, 0, 3, 7])
    split = plan_split(subset, SPLIT)
    assert (split.train_episodes, split.eval_episodes) == ((8, 0, 1), (3, 7, 5))
    assert plan_split(dataset, 0.0) is None


def test_max_eval_samples_takes_each_tasks_first_frames(multitask_root):
    """LeRobot 0.6.1's lerobot_train.py rule (read in its source): per task of the held-out
    frames (task_index ascending), its first max(1, cap // n_tasks) frames."""
    dataset = LeRobotDataset(multitask_root)
    split = plan_split(dataset, SPLIT, max_eval_samples=7)
    full = plan_split(dataset, SPLIT).rows
    tasks = dataset.task_index[full]
    expected = np.concatenate([full[tasks == t][:2] for t in (0, 1, 2)])  # 7 // 3 = 2 each
    assert np.array_equal(split.rows, expected)
    assert len(cap_samples(full, tasks, 2)) == 3  # max(1, 2 // 3) = 1 of each task


def test_every_sample_in_exactly_one_rank_share():
    rows = np.arange(N_HELD_OUT)
    for world in (1, 2, 3):
        shares = [rank_share(rows, r, world) for r in range(world)]
        assert np.array_equal(np.concatenate(shares), rows)
        assert num_forward_calls(N_HELD_OUT, 4, world) * 4 >= max(map(len, shares))
    assert num_forward_calls(75, 4, 2) == 10 and num_forward_calls(1, 8, 2) == 1


def _plan(root, out, extra, policy="act"):
    from lerobot_pipe.training.preflight import make_plan

    make_flags = tiny_act_flags if policy == "act" else tiny_diffusion_flags
    return make_plan(make_flags(**{"dataset.root": root, "output_dir": out, **extra}), 1, {})


@pytest.mark.parametrize("policy", ["act", "diffusion"])
def test_the_training_sampler_never_draws_a_held_out_frame(multitask_root, tmp_path, policy):
    from lerobot_pipe.training.data import sample_indices

    plan = _plan(multitask_root, tmp_path / "out", {"dataset.eval_split": SPLIT}, policy)
    drawn = sample_indices(plan.cfg.policy, plan.dataset, plan.heldout)
    episode = plan.dataset.episode_index
    assert set(np.unique(episode[drawn])) == set(TRAIN)
    if policy == "act":  # every training frame
        assert len(drawn) == np.isin(episode, TRAIN).sum()


# --- the trainer: one process, DDP and FSDP2 on 2 processes -----------------------------------

STEPS, EVAL_STEPS = 4, 2


def _run_flags(root):
    return tiny_act_flags(
        **DETERMINISTIC,
        **{
            "dataset.root": root,
            "steps": STEPS,
            "save_freq": 0,
            "log_freq": 1,
            "dataset.eval_split": SPLIT,
            "eval_steps": EVAL_STEPS,
        },
    )


@pytest.fixture(scope="module")
def runs(multitask_root, tmp_path_factory):
    """The same global batch of 8 on one process, DDP and FSDP2 on 2 (shares of 38 and 37
    held-out frames, in batches of 4: 10 forward calls each, the last ones short)."""
    out = tmp_path_factory.mktemp("heldout_runs")
    flags = _run_flags(multitask_root)
    run_train([*flags, "--batch_size=8", f"--output_dir={out / 'single'}"])
    run_distributed(run_train, 2, [*flags, "--batch_size=4", f"--output_dir={out / 'ddp'}"])
    run_distributed(
        run_train,
        2,
        [
            *flags,
            "--batch_size=4",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=safetensors_dcp",
            f"--output_dir={out / 'fsdp'}",
        ],
    )
    return {name: out / name for name in ("single", "ddp", "fsdp")}


@pytest.fixture(scope="module")
def hsdp_run(multitask_root, tmp_path_factory):
    """HSDP on 4 processes (2 replicas of 2 shards), batches of 2: shares of 19 and 18."""
    out = tmp_path_factory.mktemp("heldout_hsdp") / "hsdp"
    run_distributed(
        run_train,
        4,
        [
            *_run_flags(multitask_root),
            "--batch_size=2",
            "--parallelism.dp_replicate=2",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=safetensors_dcp",
            f"--output_dir={out}",
        ],
    )
    return out


def test_eval_loss_is_logged_at_each_eval_step(runs):
    records = [json.loads(x) for x in (runs["single"] / C.METRICS_LOG).read_text().splitlines()]
    held_out = [r for r in records if "eval_loss" in r]
    assert [r["step"] for r in held_out] == list(range(EVAL_STEPS, STEPS + 1, EVAL_STEPS))
    assert all(r["eval_samples"] == N_HELD_OUT for r in held_out)
    assert set(losses(runs["single"])) == set(range(1, STEPS + 1))  # the training curve intact


def test_evaluating_leaves_training_as_it_was(multitask_root, tmp_path):
    """With dropout and the VAE on (randomness every step) and the held-out loss at every step,
    in the middle of a gradient accumulation too: the same training losses, bit for bit, as
    without it (the evaluation draws nothing from the RNGs and leaves the gradients alone)."""
    base = {
        "dataset.root": multitask_root,
        "steps": 4,
        "save_freq": 0,
        "batch_size": 4,
        "dataset.eval_split": SPLIT,
        "accelerator.gradient_accumulation.steps": 2,
    }
    run_train([*tiny_act_flags(**base), f"--output_dir={tmp_path / 'plain'}"])
    run_train([*tiny_act_flags(**base, eval_steps=1), f"--output_dir={tmp_path / 'eval'}"])
    assert losses(tmp_path / "eval") == losses(tmp_path / "plain")
    assert set(eval_losses(tmp_path / "eval")) == {1, 2, 3, 4}


def test_the_progress_line_shows_the_held_out_loss(runs):
    from lerobot_pipe.training.progress import events_path, render_progress

    events = [json.loads(x) for x in events_path(runs["single"]).read_text().splitlines()]
    last = [e for e in events if e["event"] == "progress"][-1]
    eval_loss = eval_losses(runs["single"])[STEPS]
    assert last["step"] == STEPS and last["eval_loss"] == eval_loss
    assert f" eval_loss {eval_loss:.4f} " in render_progress(last)


def test_the_report_plots_the_held_out_curve(runs, tmp_path):
    """workflow/scripts/plot_training.py as Snakemake runs it: both curves in the loss figure,
    the training curve still from every step."""
    import runpy
    from types import SimpleNamespace

    import matplotlib

    out = SimpleNamespace(loss=str(tmp_path / "loss.svg"), throughput=str(tmp_path / "tp.svg"))
    snakemake = SimpleNamespace(
        params=SimpleNamespace(metrics=str(runs["single"] / C.METRICS_LOG), run="r"),
        output=out,
        log=[str(tmp_path / "plot.log")],
    )
    script = Path(__file__).parents[2] / "workflow/scripts/plot_training.py"
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text, to read it back
        runpy.run_path(str(script), init_globals={"snakemake": snakemake})
    svg = Path(out.loss).read_text()
    assert "held-out loss (eval_loss)" in svg and "training loss" in svg


@pytest.mark.parametrize("topology", ["ddp", "fsdp", "hsdp"])
def test_eval_loss_is_the_same_on_every_topology(runs, topology, request):
    """On 2 processes (DDP, FSDP2) and 4 (HSDP) as on one, within 1e-6 (the weights differ
    by the reduction order of the gradients only)."""
    other = request.getfixturevalue("hsdp_run") if topology == "hsdp" else runs[topology]
    single, two = eval_losses(runs["single"]), eval_losses(other)
    assert single.keys() == two.keys() == {2, 4}
    for step in single:
        assert two[step] == pytest.approx(single[step], rel=1e-6), step
    assert single[4] < single[2]  # it learns


def _per_sample_mean(pretrained: Path, root: Path) -> float:
    """The policy in ``pretrained`` run on each held-out frame alone (a batch of one: the
    policy's own mean loss is that sample's loss), the mean over the frames."""
    from lerobot_pipe.policies.factory import get_policy_class, make_pre_post_processors
    from lerobot_pipe.processors import NormalizerProcessorStep
    from lerobot_pipe.training.data import delta_timestamps as _delta_timestamps

    policy = get_policy_class("act").from_pretrained(pretrained)
    pre, _ = make_pre_post_processors(policy.config, pretrained_path=pretrained)
    dataset = LeRobotDataset(root, delta_timestamps=_delta_timestamps(policy.config, root))
    rows = np.flatnonzero(np.isin(dataset.episode_index, HELD_OUT))
    # Normalized with the whole dataset's statistics (LeRobot's), not the training episodes'.
    stats = pre.step(NormalizerProcessorStep.registry_name).stats
    assert np.allclose(np.asarray(stats["action"]["mean"]), dataset.stats["action"]["mean"])
    policy.eval()
    with torch.no_grad():
        per_sample = [policy(pre(dataset.get_batch([row])))[0].item() for row in rows]
    return float(np.mean(per_sample))


@pytest.mark.parametrize("topology", ["single", "fsdp"])
def test_eval_loss_equals_the_per_sample_mean_of_the_checkpoint(runs, multitask_root, topology):
    pretrained = runs[topology] / C.CHECKPOINTS_DIR / f"{STEPS:06d}" / C.PRETRAINED_MODEL_DIR
    direct = _per_sample_mean(pretrained, multitask_root)
    assert eval_losses(runs[topology])[STEPS] == pytest.approx(direct, rel=1e-6)


def test_the_held_out_loss_is_the_live_weights_not_the_ema(multitask_root, tmp_path):
    flags = {**DETERMINISTIC, "dataset.root": multitask_root, "steps": 3, "save_freq": 0}
    run_train(
        [
            *tiny_act_flags(**flags, **{"dataset.eval_split": SPLIT, "eval_steps": 3}),
            "--ema.enable=true",
            "--ema.decay=0.5",
            f"--output_dir={tmp_path}",
        ]
    )
    step_dir = tmp_path / C.CHECKPOINTS_DIR / "000003"
    live = _per_sample_mean(step_dir / C.PRETRAINED_MODEL_DIR, multitask_root)
    ema = _per_sample_mean(step_dir / C.PRETRAINED_MODEL_EMA_DIR, multitask_root)
    assert eval_losses(tmp_path)[3] == pytest.approx(live, rel=1e-6)
    assert abs(ema - live) > 1e-3 * live


# --- Diffusion Policy: keyed noise ------------------------------------------------------------


def _diffusion_session(root, out):
    from lerobot_pipe.policies.factory import make_policy
    from lerobot_pipe.training.data import make_processors
    from lerobot_pipe.utils.random import seed_everything

    plan = _plan(root, out, {"dataset.eval_split": SPLIT}, "diffusion")
    seed_everything(0)
    policy = make_policy(plan.cfg.policy, plan.dataset.features, pretrained_parts=False)
    pre, _ = make_processors(plan, "cpu")
    return plan, policy, pre


def _diffusion_loss(root, out, batch_size):
    import os

    plan, policy, pre = _diffusion_session(root, out)
    return heldout_loss(
        policy,
        pre,
        plan.dataset,
        plan.heldout,
        batch_size=batch_size,
        seed=plan.cfg.seed,
        rank=int(os.environ.get("RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        device=torch.device("cpu"),
    )


def _on_ranks(root, out, batch_size):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        return _diffusion_loss(root, out, batch_size)
    finally:
        dist.destroy_process_group()


def test_diffusion_held_out_loss_is_keyed(multitask_root, tmp_path):
    """The held-out frames draw their noise and diffusion step from fixed keys: the figure is
    the same at every evaluation, for any batch size and world size, and equals the per-sample
    losses computed one frame at a time with those keys."""
    plan, policy, pre = _diffusion_session(multitask_root, tmp_path / "out")
    common = dict(seed=plan.cfg.seed, rank=0, world_size=1, device=torch.device("cpu"))
    first = heldout_loss(policy, pre, plan.dataset, plan.heldout, batch_size=8, **common)
    again = heldout_loss(policy, pre, plan.dataset, plan.heldout, batch_size=8, **common)
    other_batch = heldout_loss(policy, pre, plan.dataset, plan.heldout, batch_size=5, **common)
    assert policy.training  # restored
    assert first == again
    assert other_batch == pytest.approx(first, rel=1e-6)

    policy.eval()
    per_sample = []
    with torch.no_grad():
        for row in plan.heldout.rows:
            batch = plan.dataset.get_batch([row])
            batch[C.SAMPLE_KEY] = torch.from_numpy(heldout_keys(plan.cfg.seed, np.array([row])))
            per_sample.append(policy(pre(batch))[0].item())
    assert first == pytest.approx(float(np.mean(per_sample)), rel=1e-6)

    on_two = run_distributed(_on_ranks, 2, multitask_root, tmp_path / "out2", 8)
    assert on_two[0] == on_two[1] == pytest.approx(first, rel=1e-6)


def test_camera_frames_are_evaluated_without_augmentation(diffusion_camera_root, tmp_path):
    """With --dataset.image_transforms on, the held-out frames still come as recorded (LeRobot's
    held-out dataset has no transforms): the figure equals the per-sample losses on a dataset
    opened without them."""
    from lerobot_pipe.policies.factory import make_policy
    from lerobot_pipe.training.data import delta_timestamps as _delta_timestamps
    from lerobot_pipe.training.data import make_processors
    from lerobot_pipe.utils.random import seed_everything

    extra = {"dataset.eval_split": 0.2, "dataset.image_transforms.enable": "true"}
    plan = _plan(diffusion_camera_root, tmp_path / "out", extra, "diffusion")
    assert plan.dataset.image_transforms.enabled
    seed_everything(0)
    policy = make_policy(plan.cfg.policy, plan.dataset.features, pretrained_parts=False)
    pre, _ = make_processors(plan, "cpu")
    figure = heldout_loss(
        policy,
        pre,
        plan.dataset,
        plan.heldout,
        batch_size=16,
        seed=plan.cfg.seed,
        rank=0,
        world_size=1,
        device=torch.device("cpu"),
    )
    plain = LeRobotDataset(
        diffusion_camera_root,
        delta_timestamps=_delta_timestamps(plan.cfg.policy, diffusion_camera_root),
    )
    rows = plan.heldout.rows
    batch = plain.get_batch(rows)
    batch[C.SAMPLE_KEY] = torch.from_numpy(heldout_keys(plan.cfg.seed, rows))
    policy.eval()
    with torch.no_grad():
        direct = policy(pre(batch), reduction="none")[0].double().mean().item()
    assert figure == pytest.approx(direct, rel=1e-6)


def test_smolvla_held_out_loss_is_its_per_sample_mean(tmp_path):
    """SmolVLA (LeRobot's forward(batch, reduction="none"), its noise and time keyed per frame):
    the trainer's figure equals its per-sample losses on the checkpoint, frame by frame."""
    pytest.importorskip("transformers", reason="SmolVLA needs transformers: lerobot_pipe[smolvla]")
    from smolvla_tiny import build_tiny_smolvlm

    from lerobot_pipe.datasets import write_synthetic_dataset
    from lerobot_pipe.policies.factory import make_pre_post_processors
    from lerobot_pipe.policies.smolvla import SMOLVLA_TINY_PRESET, SmolVLAPolicy
    from lerobot_pipe.training.data import delta_timestamps as _delta_timestamps

    vlm = build_tiny_smolvlm(tmp_path / "vlm")
    root = write_synthetic_dataset(
        tmp_path / "ds", num_episodes=4, episode_length=10, cameras=["top"], image_size=32,
        pixels_only=True, num_tasks=2,
    )  # fmt: skip
    flags = {
        "policy.type": "smolvla",
        "policy.vlm_model_name": str(vlm),
        **{f"policy.{k}": v for k, v in SMOLVLA_TINY_PRESET.items()},
        "policy.resize_imgs_with_padding": "[32,32]",
        "dataset.root": str(root),
        "dataset.eval_split": 0.5,
        "eval_steps": 2,
        "steps": 2,
        "batch_size": 4,
        "num_workers": 0,
        "save_freq": 0,
        "output_dir": str(tmp_path / "out"),
    }
    run_train([f"--{k}={v}" for k, v in flags.items()])
    pretrained = tmp_path / "out" / C.CHECKPOINTS_DIR / "000002" / C.PRETRAINED_MODEL_DIR
    policy = SmolVLAPolicy.from_pretrained(pretrained)
    pre, _ = make_pre_post_processors(policy.config, pretrained_path=pretrained)
    dataset = LeRobotDataset(root, delta_timestamps=_delta_timestamps(policy.config, root))
    split = plan_split(dataset, 0.5)
    assert split.eval_episodes == (2, 3)  # the last of each of the two tasks (0 2 | 1 3)
    policy.eval()
    per_sample = []
    with torch.no_grad():
        for row in split.rows:
            batch = dataset.get_batch([row])
            batch[C.SAMPLE_KEY] = torch.from_numpy(heldout_keys(1000, np.array([row])))
            per_sample.append(policy(pre(batch), reduction="none")[0].item())
    figure = eval_losses(tmp_path / "out")[2]
    assert figure == pytest.approx(float(np.mean(per_sample)), rel=1e-5)
