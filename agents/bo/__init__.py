"""CLITE-style Bayesian optimisation of allocations with BoTorch.

* `config`: `BoConfig` (values in configs/agents/bo.yaml);
* `space`: the allocations searched, their [0, 1] encoding, probes and candidate sets;
* `model`: the GP over the samples and the constrained acquisition step;
* `controller`: `BoController`, the explicit sample/search/hold state machine, and `make`, the
  registry factory for the spec `bo[:CONFIG]`.
"""

from agents.bo.config import BoConfig, load_bo_config
from agents.bo.controller import BoController, Phase, Sample, make
from agents.bo.space import AllocationSpace, Candidates

__all__ = [
    "AllocationSpace",
    "BoConfig",
    "BoController",
    "Candidates",
    "Phase",
    "Sample",
    "load_bo_config",
    "make",
]
