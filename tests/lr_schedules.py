"""LeRobot 0.6.1's learning rates for a table of LR schedules, hard-coded for the unit tests of
lerobot_pipe.training.optim (tests/training/test_optim.py); tests/interop/test_lr_schedules.py
recomputes them with LeRobot itself.

Each case: the ``--scheduler.*`` fields, the run's ``--steps`` and the base lr of each parameter
group (ACT's preset has two: the backbone's lr apart). ``LEROBOT_LRS[name]`` holds the lr of every
group at each loop step 0 .. steps - 1 (the lr of that step's update) and once more after the last
step (what scheduler_state.json resumes from).

Produced by LeRobot 0.6.1 (its ``LRSchedulerConfig`` subclasses' ``build``, stepped as
lerobot-train steps them; diffusers 0.39.0 for ``diffuser``) through
tests/interop/upstream_driver.py's ``lr_schedules`` job, on the CASES below:

    make lerobot-venv
    python tests/lr_schedules.py > /tmp/lrs.txt    # prints LEROBOT_LRS, to paste below
"""

from __future__ import annotations

BASE_LRS = [1e-3, 1e-5]
DIFFUSER_WARMUP, DIFFUSER_STEPS = 3, 10

CASES: dict[str, dict] = {
    "constant_with_warmup": {
        "scheduler": {"type": "constant_with_warmup", "num_warmup_steps": 4},
        "steps": 8,
    },
    "constant_with_warmup/no_warmup": {
        "scheduler": {"type": "constant_with_warmup", "num_warmup_steps": 0},
        "steps": 3,
    },
    "cosine_annealing_with_warmup": {
        "scheduler": {"type": "cosine_annealing_with_warmup", "num_warmup_steps": 3},
        "steps": 10,
    },
    # Runs past the decay: the lr stays at decay_lr.
    "cosine_decay_with_warmup": {
        "scheduler": {
            "type": "cosine_decay_with_warmup",
            "num_warmup_steps": 3,
            "num_decay_steps": 8,
            "peak_lr": 1e-3,
            "decay_lr": 1e-5,
        },
        "steps": 12,
    },
    # A run shorter than num_decay_steps: both phases scaled by steps / num_decay_steps.
    "cosine_decay_with_warmup/scaled": {
        "scheduler": {
            "type": "cosine_decay_with_warmup",
            "num_warmup_steps": 4,
            "num_decay_steps": 20,
            "peak_lr": 2.5e-5,
            "decay_lr": 2.5e-6,
        },
        "steps": 10,
    },
    # The scaled warmup rounds down to no warmup (int(2 * 10 / 30) == 0).
    "cosine_decay_with_warmup/scaled_to_no_warmup": {
        "scheduler": {
            "type": "cosine_decay_with_warmup",
            "num_warmup_steps": 2,
            "num_decay_steps": 30,
            "peak_lr": 1e-3,
            "decay_lr": 1e-4,
        },
        "steps": 10,
    },
    # VQ-BeT's: constant while the VQ-VAE trains alone, then warmup and a cosine.
    "vqbet": {
        "scheduler": {
            "type": "vqbet",
            "num_warmup_steps": 3,
            "num_vqvae_training_steps": 4,
            "num_cycles": 0.5,
        },
        "steps": 14,
    },
    # diffusers' schedules by name (Diffusion Policy's preset: cosine). piecewise_constant is
    # left out: it needs step_rules, which neither LeRobot's config nor ours passes.
    **{
        f"diffuser/{name}": {
            "scheduler": {"type": "diffuser", "name": name, "num_warmup_steps": DIFFUSER_WARMUP},
            "steps": DIFFUSER_STEPS,
        }
        for name in (
            "cosine",
            "linear",
            "cosine_with_restarts",
            "polynomial",
            "constant",
            "constant_with_warmup",
        )
    },
}
for _case in CASES.values():
    _case["lrs"] = BASE_LRS

LEROBOT_LRS: dict[str, list[list[float]]] = {
    "constant_with_warmup": [
        [0.0, 0.0],
        [0.00025, 2.5e-06],
        [0.0005, 5e-06],
        [0.00075, 7.500000000000001e-06],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
    ],
    "constant_with_warmup/no_warmup": [
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
    ],
    "cosine_annealing_with_warmup": [
        [0.0, 0.0],
        [0.0003333333333333333, 3.3333333333333333e-06],
        [0.0006666666666666666, 6.666666666666667e-06],
        [0.001, 1e-05],
        [0.0009504844339512095, 9.504844339512096e-06],
        [0.0008117449009293668, 8.117449009293668e-06],
        [0.0006112604669781572, 6.112604669781572e-06],
        [0.00038873953302184284, 3.887395330218429e-06],
        [0.00018825509907063325, 1.8825509907063328e-06],
        [4.9515566048790485e-05, 4.951556604879049e-07],
        [0.0, 0.0],
    ],
    "cosine_decay_with_warmup": [
        [0.00025, 2.5e-06],
        [0.0005, 5e-06],
        [0.00075, 7.500000000000001e-06],
        [0.0006944282990207195, 6.944282990207195e-06],
        [0.000505, 5.050000000000001e-06],
        [0.0003155717009792806, 3.155717009792806e-06],
        [0.00015498214331265904, 1.5498214331265905e-06],
        [4.7679631406913064e-05, 4.767963140691307e-07],
        [1e-05, 1.0000000000000001e-07],
        [1e-05, 1.0000000000000001e-07],
        [1e-05, 1.0000000000000001e-07],
        [1e-05, 1.0000000000000001e-07],
        [1e-05, 1.0000000000000001e-07],
    ],
    "cosine_decay_with_warmup/scaled": [
        [0.0003333333333333333, 3.3333333333333333e-06],
        [0.0006666666666666666, 6.666666666666667e-06],
        [0.0009140576474687263, 9.140576474687263e-06],
        [0.000814503363531613, 8.14503363531613e-06],
        [0.0006890576474687264, 6.890576474687264e-06],
        [0.00055, 5.500000000000001e-06],
        [0.0004109423525312738, 4.109423525312738e-06],
        [0.0002854966364683872, 2.854966364683872e-06],
        [0.00018594235253127373, 1.8594235253127373e-06],
        [0.00012202456766718093, 1.2202456766718092e-06],
        [0.0001, 1.0000000000000002e-06],
    ],
    "cosine_decay_with_warmup/scaled_to_no_warmup": [
        [0.001, 1e-05],
        [0.0009779754323328191, 9.779754323328192e-06],
        [0.0009140576474687263, 9.140576474687263e-06],
        [0.000814503363531613, 8.14503363531613e-06],
        [0.0006890576474687264, 6.890576474687264e-06],
        [0.00055, 5.500000000000001e-06],
        [0.0004109423525312738, 4.109423525312738e-06],
        [0.0002854966364683872, 2.854966364683872e-06],
        [0.00018594235253127373, 1.8594235253127373e-06],
        [0.00012202456766718093, 1.2202456766718092e-06],
        [0.0001, 1.0000000000000002e-06],
    ],
    "vqbet": [
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.0, 0.0],
        [0.0003333333333333333, 3.3333333333333333e-06],
        [0.0006666666666666666, 6.666666666666667e-06],
        [0.001, 1e-05],
        [0.0009797464868072487, 9.797464868072489e-06],
        [0.0009206267664155906, 9.206267664155906e-06],
        [0.0008274303669726426, 8.274303669726427e-06],
        [0.0007077075065009433, 7.0770750650094335e-06],
        [0.0005711574191366427, 5.711574191366427e-06],
        [0.0004288425808633575, 4.2884258086335755e-06],
        [0.0002922924934990568, 2.9229249349905686e-06],
    ],
    "diffuser/cosine": [
        [0.0, 0.0],
        [0.0003333333333333333, 3.3333333333333333e-06],
        [0.0006666666666666666, 6.666666666666667e-06],
        [0.001, 1e-05],
        [0.0009504844339512095, 9.504844339512096e-06],
        [0.0008117449009293668, 8.117449009293668e-06],
        [0.0006112604669781572, 6.112604669781572e-06],
        [0.00038873953302184284, 3.887395330218429e-06],
        [0.00018825509907063325, 1.8825509907063328e-06],
        [4.9515566048790485e-05, 4.951556604879049e-07],
        [0.0, 0.0],
    ],
    "diffuser/linear": [
        [0.0, 0.0],
        [0.0003333333333333333, 3.3333333333333333e-06],
        [0.0006666666666666666, 6.666666666666667e-06],
        [0.001, 1e-05],
        [0.0008571428571428571, 8.571428571428571e-06],
        [0.0007142857142857143, 7.1428571428571436e-06],
        [0.0005714285714285714, 5.7142857142857145e-06],
        [0.00042857142857142855, 4.2857142857142855e-06],
        [0.0002857142857142857, 2.8571428571428573e-06],
        [0.00014285714285714284, 1.4285714285714286e-06],
        [0.0, 0.0],
    ],
    "diffuser/cosine_with_restarts": [
        [0.0, 0.0],
        [0.0003333333333333333, 3.3333333333333333e-06],
        [0.0006666666666666666, 6.666666666666667e-06],
        [0.001, 1e-05],
        [0.0009504844339512095, 9.504844339512096e-06],
        [0.0008117449009293668, 8.117449009293668e-06],
        [0.0006112604669781572, 6.112604669781572e-06],
        [0.00038873953302184284, 3.887395330218429e-06],
        [0.00018825509907063325, 1.8825509907063328e-06],
        [4.9515566048790485e-05, 4.951556604879049e-07],
        [0.0, 0.0],
    ],
    "diffuser/polynomial": [
        [0.0, 0.0],
        [0.0003333333333333333, 3.3333333333333333e-06],
        [0.0006666666666666666, 6.666666666666667e-06],
        [0.001, 1e-05],
        [0.0008571571428571429, 8.571571428571429e-06],
        [0.0007143142857142856, 7.1431428571428565e-06],
        [0.0005714714285714285, 5.714714285714286e-06],
        [0.00042862857142857147, 4.286285714285715e-06],
        [0.0002857857142857143, 2.8578571428571427e-06],
        [0.0001429428571428572, 1.4294285714285722e-06],
        [1e-07, 1e-09],
    ],
    "diffuser/constant": [
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
    ],
    "diffuser/constant_with_warmup": [
        [0.0, 0.0],
        [0.0003333333333333333, 3.3333333333333333e-06],
        [0.0006666666666666666, 6.666666666666667e-06],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
        [0.001, 1e-05],
    ],
}


def flat(lrs: list[list[float]]) -> list[float]:
    """The lrs of every step and group in one list (pytest.approx compares flat sequences)."""
    return [lr for step in lrs for lr in step]


def lerobot_pipe_lrs(case: dict) -> list[list[float]]:
    """What lerobot_pipe's make_scheduler gives for ``case``, stepped as the training loop steps
    it, in LEROBOT_LRS's form."""
    import torch

    from lerobot_pipe.configs.optim import SchedulerConfig
    from lerobot_pipe.training.optim import make_scheduler

    fields = dict(case["scheduler"])
    config = SchedulerConfig.get_choice_class(fields.pop("type"))(**fields)
    first, *others = case["lrs"]
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in others]
    optimizer = torch.optim.SGD(
        [{"params": [torch.nn.Parameter(torch.zeros(1))]}, *groups], lr=first
    )
    scheduler = make_scheduler(optimizer, config, case["steps"])
    lrs = []
    for _ in range(case["steps"]):
        lrs.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return [*lrs, [g["lr"] for g in optimizer.param_groups]]


def _print_from_lerobot() -> None:
    """Run the driver with LeRobot's Python and print LEROBOT_LRS as Python source."""
    import json
    import tempfile
    from pathlib import Path

    from upstream import find_upstream

    upstream, why = find_upstream()
    if upstream is None:
        raise SystemExit(why)
    with tempfile.TemporaryDirectory() as tmp:
        jobs = Path(tmp, "jobs.json")
        out = Path(tmp, "lrs.json")
        jobs.write_text(json.dumps([{"job": "lr_schedules", "cases": CASES, "out": str(out)}]))
        driver = Path(__file__).parent / "interop" / "upstream_driver.py"
        upstream.run_script(driver, "batch", jobs, home=Path(tmp), timeout=300)
        if Path(f"{out}.error.json").exists():
            raise SystemExit(Path(f"{out}.error.json").read_text())
        lrs = json.loads(out.read_text())
    print("LEROBOT_LRS: dict[str, list[list[float]]] = {")
    for name, steps in lrs.items():
        print(f"    {name!r}: [")
        for step in steps:
            print(f"        [{', '.join(map(repr, step))}],")
        print("    ],")
    print("}")


if __name__ == "__main__":
    _print_from_lerobot()
