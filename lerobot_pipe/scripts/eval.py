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

import logging
import sys

from lerobot_pipe.configs.envs import EnvConfig
from lerobot_pipe.evaluation.eval_policy import BadInput, EvalPipelineOptions, run
from lerobot_pipe.scripts.help import choice_sections, command_help, parse_command
from lerobot_pipe.scripts.logs import report_error

PROG = "lerobot-eval"

log = logging.getLogger("lerobot_pipe.eval")


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
    try:
        run(options)
    except BadInput as e:
        report_error(PROG, e)
        return 2
    except KeyboardInterrupt:
        report_error(PROG, "interrupted")
        return 130
    except Exception as e:  # never a traceback on the console
        log.debug("evaluation failed", exc_info=True)
        report_error(PROG, f"evaluation failed: {type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
