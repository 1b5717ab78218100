"""lerobot_pipe.training.optim: the optimizer and the LR schedule that the flags build, with
LeRobot's numbers (tests/lr_schedules.py holds LeRobot 0.6.1's learning rates)."""

from __future__ import annotations

import pytest
import torch
from lr_schedules import CASES, LEROBOT_LRS, flat, lerobot_pipe_lrs

from lerobot_pipe.configs.optim import AdamConfig, AdamWConfig, DiffuserSchedulerConfig, SGDConfig
from lerobot_pipe.configs.parser import ConfigError
from lerobot_pipe.training.optim import check_diffuser_schedule, make_optimizer, make_scheduler


def test_every_scheduler_type_has_a_case():
    from lerobot_pipe.configs.optim import SchedulerConfig

    assert {case["scheduler"]["type"] for case in CASES.values()} == set(
        SchedulerConfig.known_choices()
    )
    assert CASES.keys() == LEROBOT_LRS.keys()


@pytest.mark.parametrize("name", list(CASES))
def test_lr_schedule_is_lerobots(name):
    """The lr of every parameter group at every step, as LeRobot 0.6.1 computes it (to 1e-12
    relative: the same formulas, the same float operations)."""
    if name.startswith("diffuser/"):
        pytest.importorskip("diffusers")
    ours = lerobot_pipe_lrs(CASES[name])
    assert len(ours) == len(LEROBOT_LRS[name]) == CASES[name]["steps"] + 1
    assert flat(ours) == pytest.approx(flat(LEROBOT_LRS[name]), rel=1e-12, abs=0)


def test_no_scheduler_keeps_the_lr():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    assert make_scheduler(optimizer, None, 10) is None


def test_unknown_diffuser_schedule_is_refused_before_launch():
    pytest.importorskip("diffusers")
    with pytest.raises(
        ConfigError, match=r"--scheduler.name='cosin': choose one of linear, cosine"
    ):
        check_diffuser_schedule(DiffuserSchedulerConfig(name="cosin"))


@pytest.mark.parametrize(
    "config, cls, expected",
    [
        (
            AdamWConfig(lr=1e-4, betas=[0.8, 0.9], eps=1e-6, weight_decay=0.5),
            torch.optim.AdamW,
            {"lr": 1e-4, "betas": (0.8, 0.9), "eps": 1e-6, "weight_decay": 0.5},
        ),
        (
            AdamConfig(lr=1e-4),
            torch.optim.Adam,
            {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
        ),
        (
            SGDConfig(lr=0.1, momentum=0.9, dampening=0.1, nesterov=False, weight_decay=1e-3),
            torch.optim.SGD,
            {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "nesterov": False, "weight_decay": 1e-3},
        ),
    ],
)
def test_optimizer_takes_the_config_and_each_groups_own_lr(config, cls, expected):
    """A policy's parameter group with its own lr (ACT's backbone) keeps it; the others get the
    config's hyper-parameters, as LeRobot's OptimizerConfig.build passes them to torch."""
    main, backbone = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    optimizer = make_optimizer([{"params": [main]}, {"params": [backbone], "lr": 1e-5}], config)
    assert type(optimizer) is cls
    first, second = optimizer.param_groups
    assert {k: first[k] for k in expected} == expected
    assert {k: second[k] for k in expected} == {**expected, "lr": 1e-5}


def _params_with_grads(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(n, generator=g)) for n in (1000, 37, 5)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    return params


@pytest.mark.torch_range
@pytest.mark.parametrize("config", [AdamWConfig(lr=1e-2, weight_decay=0.1), AdamConfig(lr=1e-2)])
def test_adam_runs_torchs_fused_kernel_and_updates_as_the_loop(config):
    """On CPU Adam/AdamW get torch's fused kernel (docs/benchmarks.md §9: the per-tensor loop,
    torch's CPU default and LeRobot's, took ~15 % of an ACT step); the same updates as the loop
    within float rounding."""
    fused_params, loop_params = _params_with_grads(0), _params_with_grads(0)
    fused = make_optimizer([{"params": fused_params}], config)
    cls = torch.optim.AdamW if isinstance(config, AdamWConfig) else torch.optim.Adam
    loop = cls(loop_params, lr=config.lr, weight_decay=config.weight_decay)
    assert fused.param_groups[0]["fused"] is True and not loop.param_groups[0]["fused"]
    for step in range(5):
        for a, b in zip(fused_params, loop_params, strict=True):
            b.grad.copy_(a.grad.mul_(1.0 - 0.1 * step))
        fused.step()
        loop.step()
    for a, b in zip(fused_params, loop_params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.torch_range
def test_a_loaded_state_of_the_loop_keeps_this_runs_fused_kernel():
    """A LeRobot checkpoint's optimizer_param_groups.json says ``"fused": null`` (torch's
    default); loading it (torch takes the saved groups' keys) must not switch this run back to
    the loop: the implementation keys are this optimizer's, the hyper-parameters the saved
    ones, the step counters float32 as the fused kernel wants them."""
    from lerobot_pipe.checkpoint.lerobot_state import keep_implementation

    lerobots_params = _params_with_grads(1)
    lerobots = torch.optim.AdamW(lerobots_params, lr=3e-3)
    lerobots.step()
    saved = lerobots.state_dict()
    saved["param_groups"][0]["lr"] = 7e-4  # the lr a scheduler reached
    assert saved["param_groups"][0]["fused"] is None

    ours = make_optimizer([{"params": _params_with_grads(1)}], AdamWConfig(lr=1e-2))
    keep_implementation(ours, lambda: ours.load_state_dict(saved))
    group = ours.param_groups[0]
    assert group["fused"] is True and group["lr"] == 7e-4
    assert all(s["step"].dtype == torch.float32 for s in ours.state.values())
    ours.step()  # and it runs
