"""Learned controllers: RL policies (RLlib training; inference without Ray in `agents.policy`) and
CLITE-style Bayesian optimisation (`agents.bo`)."""
