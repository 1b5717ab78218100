"""``--ema.*`` on one process: the shadow against an EMA computed here from the live weights each
checkpoint saved (the warmup schedule; a constant decay under gradient accumulation), the
checkpoint files, exact resume, LeRobot main's ema_state.pt, the evaluation hook, the config."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from tiny import DETERMINISTIC, run_train, tiny_act_flags
from torch import nn

from lerobot_pipe import constants as C
from lerobot_pipe.configs.train import EMAConfig
from lerobot_pipe.convert import load_dcp_state_dict
from lerobot_pipe.training.ema import EMAState, ema_decay, evaluation_weights

STEPS = 6


def _decay(n: int, *, after=0, inv_gamma=1.0, power=0.75, low=0.0, high=0.9999) -> float:
    """diffusers' EMAModel.get_decay, written out again."""
    t = n - after - 1
    if t <= 0:
        return 0.0
    return min(max(1.0 - (1.0 + t / inv_gamma) ** (-power), low), high)


def _reference(lives: list[dict], decays: list[float]) -> list[dict]:
    """The EMA after each update, from the live weights after each update (float64)."""
    out, shadow = [], None
    for live, d in zip(lives, decays, strict=True):
        live = {k: v.double() for k, v in live.items()}
        shadow = live if shadow is None else {k: d * shadow[k] + (1 - d) * live[k] for k in live}
        out.append(shadow)
    return out


def _close(a: dict, b: dict, tol: float) -> None:
    assert a.keys() == b.keys(), set(a) ^ set(b)
    for k in a:
        err = (a[k].double() - b[k].double()).abs().max().item()
        assert err <= tol, (k, err)


def _step(out, step: int):
    return out / C.CHECKPOINTS_DIR / f"{step:06d}"


def _weights(step_dir, folder=C.PRETRAINED_MODEL_DIR) -> dict:
    return load_file(step_dir / folder / C.MODEL_SAFETENSORS)


@pytest.fixture(scope="module")
def common(dataset_root):
    return tiny_act_flags(**DETERMINISTIC, **{"dataset.root": dataset_root, "batch_size": 8})


@pytest.fixture(scope="module")
def schedule_run(common, tmp_path_factory):
    """The default schedule, a checkpoint after every step (= optimizer update)."""
    out = tmp_path_factory.mktemp("ema") / "schedule"
    run_train(
        [*common, f"--output_dir={out}", f"--steps={STEPS}", "--save_freq=1", "--ema.enable=true"]
    )
    return out


@pytest.fixture(scope="module")
def constant_run(common, tmp_path_factory):
    """Constant decay 0.9 after one copied update, 2 micro-batches per update, both formats,
    written in the background (the shadow staged with the rest)."""
    out = tmp_path_factory.mktemp("ema") / "constant"
    run_train(
        [
            *common,
            f"--output_dir={out}",
            "--steps=8",
            "--save_freq=2",
            "--accelerator.gradient_accumulation.steps=2",
            "--checkpoint_format=safetensors_dcp",
            "--checkpoint_async=true",
            "--ema.enable=true",
            "--ema.decay=0.9",
            "--ema.update_after_step=1",
        ]
    )
    return out


def test_shadow_is_the_ema_of_the_saved_weights(schedule_run):
    lives = [_weights(_step(schedule_run, s)) for s in range(1, STEPS + 1)]
    decays = [_decay(n) for n in range(1, STEPS + 1)]
    assert decays[0] == 0.0 and 0.4 < decays[1] < 0.41  # a copy, then 1 - 2 ** -0.75
    for n, want in enumerate(_reference(lives, decays), start=1):
        step_dir = _step(schedule_run, n)
        _close(_weights(step_dir, C.PRETRAINED_MODEL_EMA_DIR), want, 1e-6)
        counters = json.loads((step_dir / C.TRAINING_STATE_DIR / C.EMA_STATE).read_text())
        assert counters["optimization_step"] == n
        assert counters["decay"] == pytest.approx(decays[n - 1])
    # The EMA lags the weights: not a copy of them.
    last = _step(schedule_run, STEPS)
    live, ema = _weights(last), _weights(last, C.PRETRAINED_MODEL_EMA_DIR)
    assert all(not torch.equal(live[k], ema[k]) for k in live)


def test_constant_decay_counts_optimizer_updates(constant_run):
    # Loop steps 2, 4, 6, 8 end updates 1..4; update_after_step=1: two copies, then 0.9.
    decays = [ema_decay(EMAConfig(decay=0.9, update_after_step=1), n) for n in range(1, 5)]
    assert decays == [0.0, 0.0, 0.9, 0.9]
    assert decays == [_decay(n, after=1, low=0.9, high=0.9) for n in range(1, 5)]
    steps = [2, 4, 6, 8]
    lives = [_weights(_step(constant_run, s)) for s in steps]
    for n, (step, want) in enumerate(zip(steps, _reference(lives, decays), strict=True), 1):
        step_dir = _step(constant_run, step)
        ema = _weights(step_dir, C.PRETRAINED_MODEL_EMA_DIR)
        _close(ema, want, 1e-6)
        # The DCP shards hold the same tensors, bit for bit.
        shards = load_dcp_state_dict(step_dir / C.PRETRAINED_MODEL_EMA_DIR / C.MODEL_DCP_DIR)
        assert shards.keys() == ema.keys()
        assert all(torch.equal(shards[k], ema[k]) for k in ema)
        counters = json.loads((step_dir / C.TRAINING_STATE_DIR / C.EMA_STATE).read_text())
        assert counters["optimization_step"] == n
    # The logged records (log_freq 1) carry each loop step's decay and update count.
    records = [json.loads(line) for line in (constant_run / C.METRICS_LOG).read_text().splitlines()]
    assert [(r["ema/step"], r["ema/decay"]) for r in records] == [
        (0, 0.0),
        (1, 0.0),
        (1, 0.0),
        (2, 0.0),
        (2, 0.0),
        (3, 0.9),
        (3, 0.9),
        (4, 0.9),
    ]


def test_ema_folder_is_a_policy_folder_with_the_manifest(schedule_run):
    step_dir = _step(schedule_run, STEPS)
    live, ema = step_dir / C.PRETRAINED_MODEL_DIR, step_dir / C.PRETRAINED_MODEL_EMA_DIR
    assert sorted(p.name for p in live.iterdir()) == sorted(p.name for p in ema.iterdir())
    assert (live / C.CONFIG_NAME).read_text() == (ema / C.CONFIG_NAME).read_text()
    manifest = json.loads((step_dir / C.TRAINING_STATE_DIR / C.TRAINING_STEP).read_text())
    assert f"{C.PRETRAINED_MODEL_EMA_DIR}/{C.MODEL_SAFETENSORS}" in manifest["files"]
    assert f"{C.TRAINING_STATE_DIR}/{C.EMA_STATE}" in manifest["files"]
    # The extension is written when set (LeRobot main's key), left out at its default.
    saved = json.loads((live / C.TRAIN_CONFIG_NAME).read_text())
    assert saved["ema"]["enable"] is True


def test_resume_continues_the_shadow_bit_exactly(schedule_run, tmp_path):
    resumed = tmp_path / "resumed"
    run_train(
        [
            "--resume=true",
            f"--config_path={_step(schedule_run, 3) / C.PRETRAINED_MODEL_DIR}",
            f"--output_dir={resumed}",
            f"--steps={STEPS}",
        ]
    )
    for folder in (C.PRETRAINED_MODEL_DIR, C.PRETRAINED_MODEL_EMA_DIR):
        a, b = _weights(_step(schedule_run, STEPS), folder), _weights(_step(resumed, STEPS), folder)
        assert all(torch.equal(a[k], b[k]) for k in a), folder
    counters = json.loads((_step(resumed, STEPS) / C.TRAINING_STATE_DIR / C.EMA_STATE).read_text())
    assert counters["optimization_step"] == STEPS


def test_resume_from_lerobot_main_ema_state(schedule_run, tmp_path):
    """LeRobot main's checkpoint keeps diffusers' EMAModel.state_dict() in ema_state.pt (a torch
    pickle: shadow_params in the order of policy.parameters()); resuming reads it with
    weights_only=True and continues as from our own files."""
    source = tmp_path / "lerobot_main"
    shutil.copytree(_step(schedule_run, 3), source / C.CHECKPOINTS_DIR / "000003")
    state_dir = source / C.CHECKPOINTS_DIR / "000003" / C.TRAINING_STATE_DIR
    ema_dir = state_dir.parent / C.PRETRAINED_MODEL_EMA_DIR
    shadow = load_file(ema_dir / C.MODEL_SAFETENSORS)
    names = list(load_file(state_dir.parent / C.PRETRAINED_MODEL_DIR / C.MODEL_SAFETENSORS))
    order = _parameter_order(state_dir.parent / C.PRETRAINED_MODEL_DIR)
    assert sorted(order) == sorted(names)
    torch.save(
        {
            "decay": 0.9999,
            "min_decay": 0.0,
            "optimization_step": 3,
            "update_after_step": 0,
            "use_ema_warmup": True,
            "inv_gamma": 1.0,
            "power": 0.75,
            "shadow_params": [shadow[n] for n in order],
        },
        state_dir / C.LEROBOT_EMA_STATE,
    )
    # LeRobot's checkpoint: no manifest, no ema_state.json; its pretrained_model_ema/ is not read.
    (state_dir / C.EMA_STATE).unlink()
    shutil.rmtree(ema_dir)
    info = json.loads((state_dir / C.TRAINING_STEP).read_text())
    info.pop("files")
    (state_dir / C.TRAINING_STEP).write_text(json.dumps(info))
    resumed = tmp_path / "resumed"
    run_train(
        [
            "--resume=true",
            f"--config_path={state_dir.parent / C.PRETRAINED_MODEL_DIR}",
            f"--output_dir={resumed}",
            f"--steps={STEPS}",
        ]
    )
    a = _weights(_step(schedule_run, STEPS), C.PRETRAINED_MODEL_EMA_DIR)
    b = _weights(_step(resumed, STEPS), C.PRETRAINED_MODEL_EMA_DIR)
    assert all(torch.equal(a[k], b[k]) for k in a)


def _parameter_order(pretrained) -> list[str]:
    """The policy's parameters() order (what diffusers' shadow_params list follows)."""
    from lerobot_pipe.configs.policies import PreTrainedConfig
    from lerobot_pipe.policies.factory import get_policy_class

    config = PreTrainedConfig.from_pretrained(pretrained)
    with torch.device("meta"):
        policy = get_policy_class(config.type)(config)
    return [n for n, _ in policy.named_parameters()]


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(3, 3)
        self.frozen.requires_grad_(False)
        self.trained = nn.Linear(3, 2).to(torch.bfloat16)
        self.norm = nn.BatchNorm1d(2)


def test_shadow_holds_trained_parameters_in_fp32_only():
    net = _Net()
    ema = EMAState(net, EMAConfig(enable=True))
    assert set(ema.shadow) == {"trained.weight", "trained.bias", "norm.weight", "norm.bias"}
    assert all(t.dtype == torch.float32 for t in ema.shadow.values())
    assert ema.local_bytes() == (6 + 2 + 2 + 2) * 4
    ema.update()  # a copy
    with torch.no_grad():
        net.trained.weight.add_(1.0)
        net.norm.running_mean.add_(5.0)
    ema.update()
    d = ema_decay(EMAConfig(), 2)
    weights = ema.weights(net.state_dict())
    assert torch.equal(weights["norm.running_mean"], net.norm.running_mean)  # live buffers
    assert torch.equal(weights["frozen.weight"], net.frozen.weight)
    want = net.trained.weight.float() - d * 1.0
    assert torch.allclose(weights["trained.weight"], want, atol=1e-2)  # bf16 weights


def test_evaluation_weights_swap_in_and_restore():
    net = _Net()
    ema = EMAState(net, EMAConfig(enable=True))
    ema.update()
    with torch.no_grad():
        net.norm.weight.add_(1.0)
    live = {k: v.clone() for k, v in net.state_dict().items()}
    with evaluation_weights(ema, use_for_eval=True):
        assert torch.equal(net.norm.weight, ema.shadow["norm.weight"])
    with evaluation_weights(ema, use_for_eval=False):
        assert torch.equal(net.norm.weight, live["norm.weight"])
    assert all(torch.equal(live[k], v) for k, v in net.state_dict().items())


def _train_and_record_shadow(argv: list[str]) -> dict:
    """lerobot-train's library path; the shadow's names and bytes as the session built them."""
    import os

    from lerobot_pipe.distributed.runtime import destroy, init_distributed
    from lerobot_pipe.training.loop import run_loop
    from lerobot_pipe.training.preflight import make_plan
    from lerobot_pipe.training.session import prepare_session

    plan = make_plan(argv, int(os.environ.get("WORLD_SIZE", "1")), os.environ)
    env = init_distributed()
    try:
        session = prepare_session(plan, env)
        ema = session.state.ema
        recorded = {"names": sorted(ema.shadow), "bytes": ema.local_bytes()}
        recorded["model_bytes"] = sum(
            p.numel() * p.element_size() for p in session.trainee.parameters()
        )
        run_loop(env, session)
    finally:
        destroy()
    return recorded


def test_lora_shadow_covers_the_adapters_and_resumes(schedule_run, dataset_root, tmp_path):
    base = _step(schedule_run, STEPS) / C.PRETRAINED_MODEL_DIR
    flags = [
        *tiny_act_flags(**{"dataset.root": dataset_root, "batch_size": 8}),
        "--policy.optimizer_lr=1e-2",
        f"--policy.path={base}",
        "--peft.method_type=LORA",
        "--peft.r=4",
        "--ema.enable=true",
        "--save_freq=1",
    ]
    out = tmp_path / "lora"
    recorded = _train_and_record_shadow([*flags, "--steps=3", f"--output_dir={out}"])
    assert recorded["names"] and all("lora_" in n for n in recorded["names"])
    assert recorded["bytes"] < recorded["model_bytes"] / 10
    adapter = C.ADAPTER_SAFETENSORS
    lives = [load_file(_step(out, s) / C.PRETRAINED_MODEL_DIR / adapter) for s in (1, 2, 3)]
    want = _reference(lives, [_decay(n) for n in (1, 2, 3)])[-1]
    ema_dir = _step(out, 3) / C.PRETRAINED_MODEL_EMA_DIR
    assert not (ema_dir / C.MODEL_SAFETENSORS).exists()
    ema = load_file(ema_dir / adapter)
    _close(ema, want, 1e-6)
    assert (ema_dir / C.ADAPTER_CONFIG_NAME).is_file()

    resumed = tmp_path / "lora_resumed"
    run_train(
        [
            "--resume=true",
            f"--config_path={_step(out, 2) / C.PRETRAINED_MODEL_DIR}",
            f"--output_dir={resumed}",
            "--steps=3",
        ]
    )
    again = load_file(_step(resumed, 3) / C.PRETRAINED_MODEL_EMA_DIR / adapter)
    assert all(torch.equal(again[k], ema[k]) for k in ema)
