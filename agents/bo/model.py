"""The surrogate and the acquisition step of the BO controller (BoTorch).

One `SingleTaskGP` with independent outputs (a batched GP: one set of hyperparameters per
output, fitted output by output with BoTorch's batched L-BFGS) models, over the [0, 1] encoding of
`agents.bo.space`:

* output 0, the objective: the BE jobs' throughput (normalised to the job alone on the node);
* outputs 1..N, one per LC app: its headroom, a lower bound on log(target / p99) over the
  measured intervals (`agents.bo.controller`). It is >= 0 when the app met its target in every
  measured interval with room for the interval-to-interval spread, i.e. the constraint slack >= 0
  of CLITE's QoS condition (Sec. 4.3: every LC job meets QoS), modelled on a log scale because
  slack = 1 - p99/target is unbounded below (an overloaded app's p99 is many times its target)
  and would swamp the GP.

Each output may see only some input columns (`inputs`; `MaskedKernel` zeroes the others for that
output): the controller gives each LC app's latency model the columns of the app's own partition
and the BE throughput model the BE party's (CLITE Sec. 3: with exclusive partitions an app's
performance is mostly a function of its own share). A 3-app mix is then four 5-dimensional
problems instead of one of twenty dimensions, which is what makes a few dozen samples enough;
what the partitions do not isolate (memory bandwidth, power, the disk) is left to the noise term.

Outcomes are standardised (`Standardize`); the inputs are already in the unit cube. The
hyperparameters are fitted by `fit_gpytorch_mll` (L-BFGS-B on the exact marginal likelihood,
BoTorch's default priors, retried from prior samples on failure).

Cost. A fit from BoTorch's initial values runs ~130 closure evaluations (~8 ms each: the
matrices are tiny, the cost is gpytorch's Python) and took 1-1.5 s of CPU, 3-12 s of wall time on
the loaded 2-core machine, inside one decide() call. `Surrogate` therefore keeps the
hyperparameters from fit to fit and splits the work across ticks:

* `fit` is one *chunk*: at most `maxiter` L-BFGS-B iterations, started from the hyperparameters of
  the previous chunk (warm start; BoTorch's initial values for the first); the controller runs
  chunks on the ticks where it only applies, settles or measures, after each new sample, until
  L-BFGS-B reports convergence (relative improvement below `ftol`) or a chunk limit is reached;
* `propose` does not optimise: it conditions a GP with the stored hyperparameters on every sample
  (the newest included) and maximises the acquisition, so the tick that ends a sample pays one
  Cholesky factorisation and one acquisition evaluation over the candidates.

Measured on the 28 samples of a mix3-const search (chunks after every sample, as the controller
runs them): chunks of 3 iterations cost 35 ms of CPU at the median (77 ms at most) against
0.5-1.5 s for a cold fit, 5.4 chunks per sample converge or reach the limit of 6 at ftol = 1e-5,
and the marginal likelihood stays within ~0.3 nats per sample of a cold fit's. What is left is
mostly the lengthscales of inputs an output does not depend on, still growing (3 instead of 13 on
a unit input: the predictions hardly differ); continued to convergence, the warm fit reaches the
cold fit's likelihood. The acquisition costs ~40 us of CPU per candidate (BoTorch evaluates the
analytic acquisition as a batch of single-point posteriors), hence 512 random candidates (plus
~450 neighbours of the best samples) rather than 1024.

Acquisition, maximised over a discrete candidate set from one batched posterior (`_acquire`,
with `LogConstrainedExpectedImprovement`'s helpers):

* while no sample has met QoS: the log probability of feasibility of every constraint (find a
  QoS-meeting allocation first; CLITE's score likewise ranks every QoS-violating configuration
  below every QoS-meeting one, Sec. 4.3); its spread includes the observation noise, since a
  sample's verdict is a noisy measurement;
* afterwards: constrained log EI (log EI of the BE throughput over the best QoS-meeting sample,
  plus the log probability that every constraint holds), over the choices whose probability of
  feasibility is >= `safe_pof` (the controller's safe search; none: "none_safe").

Everything runs single-threaded (`_quiet_single_thread`): the matrices are tiny, and on a busy
node the BLAS and OpenMP pools spin-wait for cores: one fit on 10 points took 24-39 s with the
default pools on this 2-core machine under load, 0.8-0.9 s with one thread.

Randomness (the GP-fit retries) comes from a seed drawn from the controller's Generator; torch's
global RNG is forked, so the controller neither depends on nor disturbs anyone else's torch state.

The first fit imports modules lazily (torch's shape checks pull in sympy: ~2 s of file reads);
`warm_up`, called from the controller's reset, runs a tiny fit and acquisition first so that no
decide() call imports anything.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from botorch.acquisition.analytic import (
    LogConstrainedExpectedImprovement,
    _log_ei_helper,
    _scaled_improvement,
)
from botorch.exceptions.errors import ModelFittingError
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms.outcome import Standardize
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior
from botorch.optim.core import OptimizationResult, OptimizationStatus
from botorch.optim.fit import fit_gpytorch_mll_scipy
from gpytorch.kernels import Kernel
from gpytorch.mlls import ExactMarginalLogLikelihood
from threadpoolctl import ThreadpoolController

DTYPE = torch.float64
# the native thread pools (BLAS, OpenMP) loaded by now; found once here because finding them reads
# /proc/self/maps, and decide() does no I/O
_POOLS = ThreadpoolController()


@dataclass(frozen=True)
class Proposal:
    """The acquisition's choice: row `index` of the candidate set, with its acquisition value.

    `kind` is "log_pof", "log_cei" or "none_safe" (a feasible sample exists, but no choice is
    safe enough: `index` is then the choice likeliest to meet every constraint); `log_value` is
    the log of the probability of feasibility or of the constrained expected improvement (in
    BE-throughput units); `fit_ok` is false when the GP could not be fitted (then `index` means
    nothing and the caller picks another way)."""

    index: int
    kind: str
    log_value: float
    fit_ok: bool = True
    pof: float = math.nan  # the chosen point's modelled probability that every constraint holds
    safe: int = 0  # log_cei: how many choices passed the safety filter


@contextmanager
def _quiet_single_thread(seed: int) -> Iterator[None]:
    """One BLAS/OpenMP/torch thread, warnings silenced (their display is I/O: linecache reads
    source files, and decide() must do none), torch's global RNG forked and seeded."""
    threads = torch.get_num_threads()
    with _POOLS.limit(limits=1), torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


class MaskedKernel(Kernel):
    """`base` (batched over the outputs) on inputs multiplied by a per-output 0/1 column mask
    (shape outputs x 1 x d): output k's covariance ignores the columns its mask zeroes.

    Masking keeps the model one batched `SingleTaskGP`, which BoTorch fits output by output with
    its batched L-BFGS; a `ModelListGP` would go through `scipy_minimize`, whose per-call
    `threadpool_limits` reads /proc/self/maps (I/O, which decide() must not do)."""

    def __init__(self, base: Kernel, mask: torch.Tensor) -> None:
        super().__init__(batch_shape=base.batch_shape)
        self.base_kernel = base
        self.register_buffer("mask", mask)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, diag: bool = False, **params):
        return self.base_kernel.forward(x1 * self.mask, x2 * self.mask, diag=diag, **params)


def build_gp(
    train_x: np.ndarray,
    train_y: np.ndarray,
    inputs: Sequence[Sequence[int]] | None = None,
    params: Mapping[str, torch.Tensor] | None = None,
) -> SingleTaskGP:
    """One independent GP per column of `train_y` (output k sees the input columns `inputs[k]`;
    all when `inputs` is None), not fitted: its hyperparameters are BoTorch's initial values, or
    `params` (from `hyperparameters` of an earlier model of the same outputs and inputs)."""
    X = torch.as_tensor(train_x, dtype=DTYPE)
    Y = torch.as_tensor(train_y, dtype=DTYPE)
    m, d = Y.shape[-1], X.shape[-1]
    mask = torch.ones(m, 1, d, dtype=DTYPE)
    if inputs is not None:
        mask.zero_()
        for k, cols in enumerate(inputs):
            mask[k, 0, list(cols)] = 1.0
    # BoTorch's dimension-scaled lengthscale prior, for the inputs an output really sees
    width = int(mask.sum(dim=-1).max().item())
    base = get_covar_module_with_dim_scaled_prior(ard_num_dims=d, batch_shape=torch.Size([m]))
    base.register_prior(
        "lengthscale_prior",
        type(base.lengthscale_prior)(loc=math.sqrt(2) + 0.5 * math.log(width), scale=math.sqrt(3)),
        lambda module: module.lengthscale,
        lambda module, value: module._set_lengthscale(value),
    )
    model = SingleTaskGP(X, Y, covar_module=MaskedKernel(base, mask), outcome_transform=Standardize(m=m))
    if params:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in params and params[name].shape == p.shape:
                    p.copy_(params[name])
    return model


def hyperparameters(model: SingleTaskGP) -> dict[str, torch.Tensor]:
    """A copy of the model's fitted hyperparameters (raw values), for `build_gp(params=...)`."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def fit_model(
    model: SingleTaskGP, attempts: int, maxiter: int | None = None, ftol: float | None = None
) -> bool:
    """Fit the hyperparameters from their current values (call it inside `_quiet_single_thread`):
    at most `maxiter` L-BFGS-B iterations (None: to convergence), converged once an iteration
    improves the loss by less than `ftol` relative (None: L-BFGS-B's default, ~2e-9). True when
    L-BFGS-B converged for every output, false when it stopped at `maxiter`; raises
    `ModelFittingError` when every attempt (the first from the current values, the others from
    prior samples) failed."""
    status: list[OptimizationStatus] = []

    def optimizer(mll: ExactMarginalLogLikelihood, **kwargs: Any) -> OptimizationResult:
        result = fit_gpytorch_mll_scipy(mll, **kwargs)
        status.append(result.status)
        return result

    options: dict[str, float] = {}
    if maxiter is not None:
        options["maxiter"] = maxiter
    if ftol is not None:  # BoTorch's batched L-BFGS-B takes it as factr x machine epsilon
        options["factr"] = ftol / float(np.finfo(np.float64).eps)
    fit_gpytorch_mll(
        ExactMarginalLogLikelihood(model.likelihood, model),
        optimizer=optimizer,
        optimizer_kwargs={"options": options},
        max_attempts=attempts,
    )
    return bool(status) and status[-1] is OptimizationStatus.SUCCESS


def fit_gp(
    train_x: np.ndarray, train_y: np.ndarray, attempts: int, inputs: Sequence[Sequence[int]] | None = None
) -> SingleTaskGP:
    """`build_gp` fitted to convergence from BoTorch's initial values (call it inside
    `_quiet_single_thread`)."""
    model = build_gp(train_x, train_y, inputs)
    fit_model(model, attempts)
    return model


class Surrogate:
    """The GP's hyperparameters, carried from fit to fit (module docstring, "Cost"): `fit` runs one
    bounded chunk of fitting from the stored values, `propose` conditions on every sample with the
    stored values and maximises the acquisition. `fitted_on` is the key (by default the number of
    samples) of the data the last chunk saw, `chunks` how many chunks ran on that data,
    `converged` whether the last one converged."""

    def __init__(self, attempts: int = 3, maxiter: int | None = None, ftol: float | None = None) -> None:
        self.attempts, self.maxiter, self.ftol = attempts, maxiter, ftol
        self.clear()

    def clear(self) -> None:
        """Forget the hyperparameters (a new search: new data, perhaps a new response surface)."""
        self._params: dict[str, torch.Tensor] | None = None
        self.fitted_on, self.chunks, self.converged = 0, 0, False

    @property
    def ready(self) -> bool:
        """Whether some chunk has fitted hyperparameters."""
        return self._params is not None

    def fit(
        self,
        train_x: np.ndarray,
        train_y: np.ndarray,
        seed: int,
        inputs: Sequence[Sequence[int]] | None = None,
        key: int | None = None,
    ) -> bool:
        """One chunk on these samples; false (the stored values kept) when the fit failed. `key`
        names the data (default: the number of samples); a new key restarts the chunk count."""
        n = len(train_x) if key is None else key
        if n != self.fitted_on:
            self.fitted_on, self.chunks, self.converged = n, 0, False
        self.chunks += 1
        with _quiet_single_thread(seed):
            model = build_gp(train_x, train_y, inputs, self._params)
            try:
                self.converged = fit_model(model, self.attempts, self.maxiter, self.ftol)
            except (ModelFittingError, RuntimeError, ValueError):
                return False
            self._params = hyperparameters(model)
        return True

    def propose(
        self,
        train_x: np.ndarray,
        train_y: np.ndarray,
        feasible: np.ndarray,
        choices: np.ndarray,
        margin: float,
        seed: int,
        inputs: Sequence[Sequence[int]] | None = None,
        safe_pof: float = 0.0,
    ) -> Proposal:
        """Pick one of `choices` (n, d) to sample next (module docstring), with the stored
        hyperparameters (without any, one fit first: a chunk, or a full fit when `maxiter` is
        None).

        `train_y` columns: objective, then one constraint per LC app (>= `margin` to be met);
        `feasible` marks the samples that met every constraint; `inputs` the input columns of each
        output (None: all); once a sample is feasible only the choices whose probability that
        every constraint holds is >= `safe_pof` are eligible. `choices` must not repeat a sample."""
        if len(choices) == 0:
            raise ValueError("no candidate to choose from")
        if self._params is None and not self.fit(train_x, train_y, seed, inputs):
            return Proposal(0, "none", math.nan, fit_ok=False)
        with _quiet_single_thread(seed):
            try:
                model = build_gp(train_x, train_y, inputs, self._params).eval()
                return _acquire(model, train_y, feasible, choices, margin, safe_pof)
            except (RuntimeError, ValueError):  # e.g. a Cholesky failure on the new data
                return Proposal(0, "none", math.nan, fit_ok=False)

    def predict(
        self,
        train_x: np.ndarray,
        train_y: np.ndarray,
        x: np.ndarray,
        inputs: Sequence[Sequence[int]] | None = None,
    ) -> np.ndarray | None:
        """The posterior mean (n, outputs) at `x`, in the units of `train_y`, of the GP conditioned
        on the samples with the stored hyperparameters (nothing is fitted, nothing random is drawn);
        None without fitted ones or on a failure."""
        if self._params is None:
            return None
        with _quiet_single_thread(0):
            try:
                model = build_gp(train_x, train_y, inputs, self._params).eval()
                with torch.no_grad():
                    mean = model.posterior(torch.as_tensor(x, dtype=DTYPE)).mean
            except (RuntimeError, ValueError):
                return None
        return mean.numpy().reshape(len(x), -1)


def _acquire(
    model: SingleTaskGP,
    train_y: np.ndarray,
    feasible: np.ndarray,
    choices: np.ndarray,
    margin: float,
    safe_pof: float = 0.0,
) -> Proposal:
    """The acquisition over `choices` from one batched posterior: log PoF of every constraint,
    and once a sample is feasible log constrained EI over the choices whose PoF >= `safe_pof`
    (none: kind "none_safe")."""
    constraints: dict[int, tuple[float | None, float | None]] = {
        i: (margin, None) for i in range(1, train_y.shape[1])
    }
    best_f = float(train_y[feasible, 0].max()) if feasible.any() else 0.0
    acq = LogConstrainedExpectedImprovement(model, best_f=best_f, objective_index=0, constraints=constraints)
    C = torch.as_tensor(choices, dtype=DTYPE)
    with torch.no_grad():
        means, sigmas = acq._mean_and_sigma(C.unsqueeze(-2))  # (n, outputs)
        assert sigmas is not None  # compute_sigma defaults to true
        # feasibility of the *measurement*: the predictive spread includes the noise of a sample's
        # headroom, which decides whether the sample meets QoS
        noisy = model.posterior(C.unsqueeze(-2), observation_noise=True).variance.squeeze(-2)
        log_pof = acq._compute_log_prob_feas(means=means, sigmas=noisy.clamp_min(1e-12).sqrt())
        if not feasible.any():
            i = int(torch.argmax(log_pof).item())
            return Proposal(i, "log_pof", float(log_pof[i].item()), pof=math.exp(float(log_pof[i].item())))
        u = _scaled_improvement(means[..., 0], sigmas[..., 0], torch.tensor(best_f, dtype=DTYPE), True)
        log_cei = _log_ei_helper(u) + sigmas[..., 0].log() + log_pof
        safe = log_pof >= math.log(safe_pof) if safe_pof > 0 else torch.ones_like(log_pof, dtype=torch.bool)
        n_safe = int(safe.sum().item())
        if n_safe == 0:
            i = int(torch.argmax(log_pof).item())
            return Proposal(i, "none_safe", float(log_pof[i].item()), pof=math.exp(float(log_pof[i].item())))
        log_cei = torch.where(safe, log_cei, torch.full_like(log_cei, -math.inf))
        i = int(torch.argmax(log_cei).item())
    return Proposal(
        i, "log_cei", float(log_cei[i].item()), pof=math.exp(float(log_pof[i].item())), safe=n_safe
    )


_WARMED_UP = False


def warm_up() -> None:
    """Run a tiny fit and acquisition once per process, so that the modules they import lazily
    are imported now rather than inside a decide() call (module docstring)."""
    global _WARMED_UP
    if _WARMED_UP:
        return
    x = np.array([[0.1, 0.2], [0.5, 0.9], [0.8, 0.4]])
    y = np.array([[0.1, 0.3], [0.4, -0.2], [0.2, 0.1]])
    surrogate = Surrogate(attempts=1, maxiter=2)
    for feasible in (np.array([True, False, True]), np.zeros(3, dtype=bool)):
        surrogate.propose(x, y, feasible, np.array([[0.3, 0.3], [0.6, 0.6]]), 0.0, seed=0)
    _WARMED_UP = True
