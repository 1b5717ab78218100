"""``lerobot-eval``: roll a trained policy out in simulation, with LeRobot 0.6.1's flags,
rollout semantics and ``eval_info.json`` (:mod:`lerobot_pipe.evaluation.eval_policy`).

    lerobot-eval --policy.path=outputs/train/act/checkpoints/last/pretrained_model \\
        --env.type=pusht --eval.n_episodes=10 --eval.batch_size=2
    lerobot-eval --policy.path=me/act_synthetic --env.type=synthetic --env.cameras='["top"]'

Bad input (a flag, an unknown env type, a missing simulator, a policy whose features the
environment does not deliver) exits with status 2 before any rollout, with a one-line reason; a
failed evaluation exits with 1.
"""

from __future__ import annotations

import sys

from lerobot_pipe.configs.envs import EnvConfig
from lerobot_pipe.evaluation.eval_policy import BadInput, EvalPipelineOptions, run
from lerobot_pipe.scripts.help import choice_sections, command_help, parse_command
from lerobot_pipe.scripts.logs import run_reported

PROG = "lerobot-eval"


def usage() -> str:
    text = command_help(
        f"{PROG} --policy.path=PATH --env.type=TYPE [--flag=value ...]", EvalPipelineOptions
    )
    return "\n".join([text, *choice_sections(EnvConfig, "env")])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    options, status = parse_command(PROG, EvalPipelineOptions, argv, usage)
    if options is None:
        return status
    status, _ = run_reported(PROG, "evaluation", lambda: run(options), expected=(BadInput,))
    return status


if __name__ == "__main__":
    sys.exit(main())
