"""Learned controllers: RL policies (RLlib training, torch-only inference in `agents.policy`) and
CLITE-style Bayesian optimisation (`agents.bo`)."""
