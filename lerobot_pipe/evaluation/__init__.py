"""Policy evaluation in simulation: rollouts with LeRobot 0.6.1's semantics (rollout.py), its
eval_info.json (info.py) and eval videos (video.py); a whole evaluation of a saved policy
(eval_policy.py: ``lerobot-eval``'s, whose console entry is scripts/eval.py) and the rollouts
during training (in_training.py)."""
