"""Trainers (PPO, GRPO and friends). Not yet implemented: see the trainers issue."""
