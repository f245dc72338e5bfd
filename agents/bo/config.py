"""`BoConfig`: the constants of the CLITE-style Bayesian-optimisation controller.

Declared and documented here; the values live in `configs/agents/bo.yaml` (YAML is data, DESIGN
§6.6) and are loaded strictly with `env.config.build` (unknown keys and wrong types are errors).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from env.config import CONFIGS, ConfigError, build, load_yaml, resolve_config

ResourceName = Literal["core", "cache", "freq", "mem", "disk"]
ProbeName = Literal["fair", "lc_max_each", "be_minimum"]
DEFAULT_CONFIG = CONFIGS / "agents" / "bo.yaml"
SAMPLE_VERDICTS = ("window", "intervals")  # BoConfig.sample_verdict


@dataclass(frozen=True)
class BoConfig:
    """What the BO controller searches, how it measures a sample, and when it stops or restarts.

    Sampling (CLITE Sec. 4: each sample is a configuration run on the real node and measured):
    a candidate allocation is requested, given `settle_s` of simulated/real time once it is in
    force (migrations, cache refill, backlog drain), then measured for `measure_s`. Times are
    converted to intervals by the observations' timestamps, never by sleeping.
    """

    # what is searched: the resources each LC app's share is chosen for (the others stay at fair)
    resources: tuple[ResourceName, ...] = ("core", "cache", "freq", "mem", "disk")
    # one sample = apply, settle, measure (seconds of observation time)
    settle_s: float = 1.0
    # settling goes on past settle_s while an LC app drains a backlog (unless another misses by
    # more than exp(abort_settle_log) without one: agents.bo.controller, choice 9)
    max_settle_s: float = 10.0
    drain_tolerance_frac: float = 0.01  # draining: served > offered x (1 + this)
    measure_s: float = 3.0
    # a sample ends at its first measured interval that misses a target: its verdict is known
    # then, and measuring on would only prolong the violation (and the backlog it leaves)
    abort_on_miss: bool = True
    # ... and, when the allocation it replaced met QoS (no backlog to blame), a settling interval
    # in which some app's log(target / p99) < -abort_settle_log ends it too (0 = never)
    abort_settle_log: float = 0.0
    apply_timeout_s: float = 5.0  # a target a guard keeps changing is measured as applied after this
    # budget: samples per search when a QoS-meeting allocation has been found, and the larger
    # budget the search may use while it has found none
    max_samples: int = 30
    max_samples_without_qos: int = 60
    # CLITE's initial samples, in order (module docstring of agents.bo.space)
    probes: tuple[ProbeName, ...] = ("fair", "be_minimum")
    reprobe_incumbent: bool = True  # after a restart, sample the previous best first
    # memory floors: no party gets less than its largest resident memory seen x (1 + this), since
    # a memory cut swaps an app out and its pages fault back in at disk speed (minutes on an HDD)
    memory_headroom_frac: float = 0.1
    # capacity floors: no candidate gives an LC app fewer cores than its CPU demand (offered load x
    # the least CPU time per request measured, at the candidate's frequency) / core_floor_util:
    # 1.0 = cores that can at least do the work; 0 = off (agents.bo.controller, choice 14)
    core_floor_util: float = 0.0
    # a failed recheck rules out allocations giving the failing app no more of anything (choice 8);
    # True: more memory or disk bandwidth counts only where the app used >= env.moves.PRESSURE_FRAC
    # of that limit in the failing window (PARTIES Sec. 4.2.3: storage helps only an app near its limit)
    storage_pressure_only: bool = False
    # trust-region centres tried in rank order when every candidate around the best sample is ruled
    # out (failed rechecks, capacity floors), before random points from the whole space
    local_centres: int = 1
    # repair region (no QoS-meeting sample): the apps given more are those whose headroom misses at
    # its centre and (True) every app that missed in a measurement of the centre or for which a
    # failed recheck rules it out (agents.bo.controller, choice 10)
    repair_measured: bool = False
    # holding: the held allocation fails once its last recheck_window_s of requests has headroom
    # below this (None: qos_margin_log, a sample's margin; agents.bo.controller, choice 5)
    recheck_margin_log: float | None = None
    # candidate set for the acquisition optimiser
    random_candidates: int = 512
    dirichlet_alpha: float = 1.0  # 1 = uniform over each resource's simplex of shares
    # of the random candidates, this fraction is "bundled": every resource's split drawn around one
    # common split, Dirichlet(bundle_concentration x split) (agents.bo.space)
    bundled_fraction: float = 0.5
    bundle_concentration: float = 30.0
    neighbour_centres: int = 3
    neighbour_fractions: tuple[float, ...] = (0.1, 0.25)  # besides one unit, of the pool's units
    # outcomes: per LC app the headroom, clipped to +-log_ratio_clip (agents.bo.controller):
    # "window" = log(target / p99 of all the sample's requests) (CLITE Sec. 4: the QoS of each
    # configuration's observation period, as the referee judges a window, PARTIES Sec. 5.1); "intervals" = min(worst,
    # mean - qos_z x sd) of the measured intervals' log(target / p99)
    sample_verdict: str = "window"  # one of SAMPLE_VERDICTS
    log_ratio_clip: float = 3.0
    qos_z: float = 1.645  # ~95% of intervals meeting the target under a normal model
    qos_margin_log: float = 0.0  # a sample meets QoS when every app's headroom >= this
    # stop a search early when the best constrained EI is below this fraction of the incumbent's
    # BE throughput (CLITE's EI-based termination); 0 = always spend the budget
    stop_ei_rel: float = 0.0
    # safe search: once the search has a QoS-meeting sample, only candidates whose modelled
    # probability of meeting every target is >= safe_pof are proposed; when none is, the search
    # ends on the best QoS-meeting sample (0 = CLITE's unrestricted constrained EI)
    safe_pof: float = 0.0
    # trust region of the safe search (TuRBO, Eriksson et al. 2019): once QoS is met, candidates
    # are the one-unit neighbours of the best QoS-meeting sample and random points within
    # trust_init of the pool per party and resource around it; the region doubles (up to
    # trust_max) after a QoS-meeting improvement and halves (down to trust_min) after a miss;
    # trust_init = 0: no region (CLITE's candidates everywhere)
    trust_init: float = 0.0
    trust_min: float = 0.05
    trust_max: float = 0.4
    # the load as a model input: each LC app's headroom model also sees the app's load_frac, and
    # the samples of earlier searches (the newest history_samples) stay in the model after a
    # restart, so a new search starts from what the model knows of the new load
    load_context: bool = False
    # network limits: "fair" keeps fair's split; "follow" applies PARTIES' network rule every
    # interval (env.moves.adjust_network, Sec. 4.2.1: bandwidth is a threshold that follows each LC
    # app's use, outside the searched resources; CLITE partitions no network)
    network: Literal["fair", "follow"] = "fair"
    history_samples: int = 60
    # load shift (restart the search): EWMA of each app's load_frac against the search's reference
    load_ewma_alpha: float = 0.5
    load_shift_abs: float = 0.05
    load_shift_rel: float = 0.15
    load_shift_intervals: int = 3
    # while holding a QoS-meeting allocation: it fails (fall back to the next best, or search
    # again) once the p99 of the last recheck_window_s of requests misses a target ("window"), or
    # once more than (1 - recheck_meet_frac) of its intervals missed one ("intervals")
    recheck_window_s: float = 10.0
    recheck_meet_frac: float = 0.9
    # which sample is closest to QoS (the centre of the repair region before QoS is met, and what
    # is held when none met it) and which of its apps are failing: by the GP's posterior mean of
    # each app's headroom at the sampled points ("model": the measurements denoised, which matters
    # for an app with a few requests per sample) or by the measured headroom ("measured")
    closest_by: Literal["model", "measured"] = "measured"
    # GP inputs: "own" = each LC app's latency model sees its own partition's columns and the BE
    # throughput model the BE party's (agents.bo.model); "all" = every model sees every column
    model_inputs: Literal["own", "all"] = "own"
    # GP fitting (agents.bo.model, "Cost"): after each new sample, the ticks that only apply,
    # settle or measure each run one chunk of at most fit_maxiter L-BFGS-B iterations, warm-started
    # from the previous chunk, until a chunk converges (relative improvement < fit_ftol) or
    # fit_ticks chunks have run; a failed chunk is retried from prior samples, up to fit_attempts
    # attempts in all
    fit_attempts: int = 3
    fit_maxiter: int = 3
    fit_ticks: int = 6
    fit_ftol: float = 1e-5

    def __post_init__(self) -> None:
        if not self.resources:
            raise ConfigError("bo.resources: name at least one of core, cache, freq, mem, disk")
        if len(set(self.resources)) != len(self.resources):
            raise ConfigError(f"bo.resources: {list(self.resources)} names a resource twice")
        for name in ("settle_s", "apply_timeout_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"bo.{name} must be >= 0")
        if self.measure_s <= 0:
            raise ConfigError("bo.measure_s must be > 0")
        if self.max_settle_s < self.settle_s:
            raise ConfigError("bo.max_settle_s must be >= settle_s")
        if not 0 <= self.core_floor_util <= 1:
            raise ConfigError("bo.core_floor_util must be in [0, 1] (0 = no capacity floors)")
        if self.drain_tolerance_frac < 0 or self.memory_headroom_frac < 0:
            raise ConfigError("bo.drain_tolerance_frac and bo.memory_headroom_frac must be >= 0")
        if self.max_samples < 1 or self.max_samples_without_qos < self.max_samples:
            raise ConfigError("bo: need 1 <= max_samples <= max_samples_without_qos")
        if self.random_candidates < 0 or self.neighbour_centres < 0:
            raise ConfigError("bo.random_candidates and bo.neighbour_centres must be >= 0")
        if self.recheck_margin_log is not None and not 0 <= self.recheck_margin_log <= self.qos_margin_log:
            raise ConfigError(
                "bo.recheck_margin_log must be in [0, qos_margin_log] (or null: qos_margin_log)"
            )
        if self.local_centres < 1:
            raise ConfigError(
                "bo.local_centres must be >= 1 (the best sample's region is always tried first)"
            )
        if self.dirichlet_alpha <= 0 or self.bundle_concentration <= 0:
            raise ConfigError("bo.dirichlet_alpha and bo.bundle_concentration must be > 0")
        if not 0 <= self.bundled_fraction <= 1:
            raise ConfigError("bo.bundled_fraction must be in [0, 1]")
        if any(not 0 < f < 1 for f in self.neighbour_fractions):
            raise ConfigError("bo.neighbour_fractions: each must be in (0, 1)")
        if self.sample_verdict not in SAMPLE_VERDICTS:
            raise ConfigError(f"bo.sample_verdict = {self.sample_verdict!r}: one of {list(SAMPLE_VERDICTS)}")
        if self.qos_z < 0:
            raise ConfigError("bo.qos_z must be >= 0")
        if self.log_ratio_clip <= 0:
            raise ConfigError("bo.log_ratio_clip must be > 0")
        if not -self.log_ratio_clip < self.qos_margin_log < self.log_ratio_clip:
            raise ConfigError("bo.qos_margin_log must be within (-log_ratio_clip, log_ratio_clip)")
        if self.stop_ei_rel < 0:
            raise ConfigError("bo.stop_ei_rel must be >= 0")
        if not 0 <= self.safe_pof < 1:
            raise ConfigError("bo.safe_pof must be in [0, 1)")
        if not (0 <= self.trust_min <= self.trust_max <= 1 and 0 <= self.trust_init <= self.trust_max):
            raise ConfigError("bo: need 0 <= trust_min <= trust_max <= 1 and 0 <= trust_init <= trust_max")
        if self.abort_settle_log < 0:
            raise ConfigError("bo.abort_settle_log must be >= 0")
        if self.history_samples < 0:
            raise ConfigError("bo.history_samples must be >= 0")
        if not 0 < self.load_ewma_alpha <= 1:
            raise ConfigError("bo.load_ewma_alpha must be in (0, 1]")
        if self.load_shift_abs < 0 or self.load_shift_rel < 0 or self.load_shift_intervals < 1:
            raise ConfigError("bo: load_shift_abs, load_shift_rel >= 0 and load_shift_intervals >= 1")
        if self.recheck_window_s <= 0 or not 0 <= self.recheck_meet_frac < 1:
            raise ConfigError("bo: need recheck_window_s > 0 and 0 <= recheck_meet_frac < 1")
        if self.fit_attempts < 1 or self.fit_maxiter < 1 or self.fit_ticks < 1:
            raise ConfigError("bo.fit_attempts, bo.fit_maxiter and bo.fit_ticks must be >= 1")
        if not 0 < self.fit_ftol < 1:
            raise ConfigError("bo.fit_ftol must be in (0, 1)")


def load_bo_config(path: str | Path | None = None) -> BoConfig:
    """`configs/agents/bo.yaml`, or `path` (a YAML file, or the name of one in configs/agents/), as
    a `BoConfig`; a missing file, unknown keys and bad values are `ConfigError`s."""
    p = resolve_config("agents", path) if path is not None else DEFAULT_CONFIG
    data = load_yaml(p)
    return build(BoConfig, {} if data is None else data, where=p.name)
