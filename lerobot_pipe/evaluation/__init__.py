"""Policy evaluation in simulation: rollouts with LeRobot 0.6.1's semantics (rollout.py), its
eval_info.json (info.py) and eval videos (video.py). ``lerobot-eval`` is scripts/eval.py."""
