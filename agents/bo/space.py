"""The BO search space: allocations in `fair_allocation`'s layout, their [0, 1] encoding, and the
candidate sets the acquisition function is maximised over.

Layout. Every candidate keeps the structure `env.allocations.fair_allocation` lays out: LC app i
has core group i and CLOS i of its own; the BE jobs share group 0 and CLOS 0. A candidate only
changes amounts, so it never regroups apps (which the guards would refuse to rate-limit) and each
LC app stays isolated, as in CLITE (Sec. 3: each LC job gets a partition of every resource).

Parties and units. The searched *pooled* resources (cores, LLC ways, memory, disk) are split into
whole units (`Capabilities.step`: one core or quota step, one way, one memory step, one disk step)
among the parties: the LC apps, then the BE jobs as one party. Every party keeps a minimum (an LC
app one core step, the node's minimum ways, memory step and one disk step; the BE party may drop to
zero cores, which pauses it); `with_floors` raises minimums (the controller's memory floors);
whatever the LC apps do not hold goes to the BE party (CLITE gives the background jobs every
resource the LC jobs leave). Without BE jobs the LC apps split the whole
pool. Frequency is a per-party level of `Capabilities.freq_levels_mhz`. Resources not searched, the
network limits and MBA stay at their fair values.

Encoding (the GP's inputs, all in [0, 1]): each party's share of each searched pooled resource
(amount / node total; the BE party's is the remainder of the LC apps', listed anyway because the
BE throughput depends on it directly), then each party's frequency level / (number of levels - 1)
when frequency is searched. `party_columns(p)` names the columns that describe party p's own
partition (the inputs of its own latency or throughput model, `agents.bo.model`).

Candidates:
* probes (CLITE's initial samples, Sec. 4.2): `fair` (the equal partition), `lc_max_each` (each LC
  app in turn gets every unit the others' minimums leave; the others keep their minimums), and
  `be_minimum` (an addition of ours: the BE party at its minimums, the LC apps splitting the rest
  equally, the allocation most likely to meet every target). Frequency is not a pool (CLITE has
  no DVFS knob): in these probes every LC app runs at the top level and the BE party at nominal,
  so "the others' minimum" is of pooled resources only, and a mix where one app needs nearly the
  whole node and the others one fast core each is found by the first probes;
* random: each pooled resource's split drawn from a symmetric Dirichlet (uniform over the simplex
  of shares at alpha = 1), rounded to whole units above the minimums, or ("bundled") every
  resource's split drawn around one common split; random frequency levels;
* neighbours of a point: every transfer of one unit, or of a fraction of the pool, from one party
  to another, and every one-level frequency change, so the search can refine the best samples
  down to a single unit.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from env.allocations import fair_allocation
from env.types import Allocation, Capabilities, Resource

POOLED: tuple[Resource, ...] = (Resource.CORE, Resource.CACHE, Resource.MEM, Resource.DISK)
_FIELD = {
    Resource.CORE: "cores",
    Resource.CACHE: "llc_ways",
    Resource.MEM: "memory_gb",
    Resource.DISK: "disk_mbps",
}


@dataclass(frozen=True)
class Candidates:
    """A set of points: `units` (n, parties, pooled resources) and `levels` (n, parties)."""

    units: np.ndarray
    levels: np.ndarray

    def __len__(self) -> int:
        return int(self.units.shape[0])

    @classmethod
    def concat(cls, parts: Sequence[Candidates]) -> Candidates:
        parts = [p for p in parts if len(p)]
        if not parts:
            raise ValueError("no candidates")
        return cls(np.concatenate([p.units for p in parts]), np.concatenate([p.levels for p in parts]))

    def take(self, idx: np.ndarray | Sequence[int]) -> Candidates:
        idx = np.asarray(idx, dtype=int)
        return Candidates(self.units[idx], self.levels[idx])

    def keys(self) -> np.ndarray:
        """One integer row per point (for de-duplication)."""
        return np.concatenate([self.units.reshape(len(self), -1), self.levels], axis=1)

    def unique(self) -> Candidates:
        """Without repeated points, first occurrences in their original order."""
        _, first = np.unique(self.keys(), axis=0, return_index=True)
        return self.take(np.sort(first))


class AllocationSpace:
    """Allocations reachable by the BO controller on a node (module docstring)."""

    def __init__(self, caps: Capabilities, resources: Sequence[Resource]) -> None:
        self.caps = caps
        self.template = fair_allocation(caps)  # ValueError when the apps do not fit
        if len({self.template[a.name].clos for a in caps.lc_apps}) < len(caps.lc_apps):
            raise ValueError(
                f"BO searches one CLOS per LC app; this node has {caps.clos_count} CLOSes for "
                f"{len(caps.lc_apps)} LC apps (the fair start shares them)"
            )
        self.lc = tuple(a.name for a in caps.lc_apps)
        self.be = tuple(a.name for a in caps.be_apps)
        self.has_be = bool(self.be)
        self.n_parties = len(self.lc) + int(self.has_be)
        searched = [r for r in resources if r in caps.knobs]
        self.pooled = tuple(r for r in POOLED if r in searched)
        self.search_freq = Resource.FREQ in searched and len(caps.freq_levels_mhz) > 1
        self.levels_mhz = caps.freq_levels_mhz
        self.nominal_level = _level_index(self.levels_mhz, caps.nominal_freq_mhz)
        self.step = np.array([caps.step(r) for r in self.pooled], dtype=float)
        self.total_amount = np.array([_total(caps, r) for r in self.pooled], dtype=float)
        self.total_units = np.array(
            [math.floor(t / s + 1e-9) for t, s in zip(self.total_amount, self.step)], dtype=int
        )
        mins = np.zeros((self.n_parties, len(self.pooled)), dtype=int)
        for j, r in enumerate(self.pooled):
            for p in range(self.n_parties):
                mins[p, j] = _min_units(caps, r, is_be=self.has_be and p == len(self.lc))
        self.min_units = mins
        short = [r.value for j, r in enumerate(self.pooled) if mins[:, j].sum() > self.total_units[j]]
        if short:
            raise ValueError(f"the node cannot give every app its minimum of {short}")
        self.party_of = {n: i for i, n in enumerate(self.lc)}
        self.party_of.update(dict.fromkeys(self.be, len(self.lc)))

    def with_floors(self, floors: dict[Resource, np.ndarray]) -> AllocationSpace:
        """A copy whose minimum units of each given pooled resource are raised to `floors[r]`
        (one value per party). Floors the pool cannot hold are scaled down to fit it."""
        out = copy.copy(self)
        mins = self.min_units.copy()
        for r, fl in floors.items():
            if r not in self.pooled:
                continue
            j = self.pooled.index(r)
            want = np.maximum(mins[:, j], np.asarray(fl, dtype=int))
            if want.sum() > self.total_units[j]:
                extra = want - mins[:, j]
                room = self.total_units[j] - mins[:, j].sum()
                want = mins[:, j] + np.floor(extra * room / max(extra.sum(), 1)).astype(int)
            mins[:, j] = want
        out.min_units = mins
        return out

    # ---- dimensions -------------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return self.n_parties * len(self.pooled) + (self.n_parties if self.search_freq else 0)

    def party_columns(self, p: int) -> list[int]:
        """The encoding's columns of party `p` (LC apps in order, then the BE party)."""
        R = len(self.pooled)
        cols = [p * R + j for j in range(R)]
        if self.search_freq:
            cols.append(self.n_parties * R + p)
        return cols

    @property
    def searchable(self) -> bool:
        """False when there is nothing to choose (no LC app, or no searched knob)."""
        return bool(self.lc) and self.dim > 0

    # ---- conversions -----------------------------------------------------------------------------
    def encode(self, cands: Candidates) -> np.ndarray:
        """(n, dim) points in [0, 1] (module docstring)."""
        n = len(cands)
        shares = cands.units * self.step / self.total_amount
        parts = [shares.reshape(n, -1)]
        if self.search_freq:
            parts.append(cands.levels / (len(self.levels_mhz) - 1))
        return np.clip(np.concatenate(parts, axis=1), 0.0, 1.0)

    def encode_allocation(self, alloc: Allocation) -> np.ndarray:
        """The encoding of any allocation of this node's apps (e.g. one a guard changed)."""
        x = []
        names = [*self.lc, *self.be[:1]]  # one per party: BE jobs share the BE party's partition
        for name in names:
            a = alloc[name]
            x += [float(getattr(a, _FIELD[r])) / t for r, t in zip(self.pooled, self.total_amount)]
        if self.search_freq:
            x += [
                _level_index(self.levels_mhz, alloc[n].freq_mhz) / (len(self.levels_mhz) - 1) for n in names
            ]
        return np.clip(np.array(x, dtype=float), 0.0, 1.0)

    def point_of(self, alloc: Allocation) -> Candidates:
        """The units and levels of an allocation in this layout (the BE party holds the rest)."""
        u = np.zeros((1, self.n_parties, len(self.pooled)), dtype=int)
        for j, r in enumerate(self.pooled):
            for p, name in enumerate(self.lc):
                u[0, p, j] = round(float(getattr(alloc[name], _FIELD[r])) / self.step[j])
            if self.has_be:
                u[0, -1, j] = self.total_units[j] - u[0, : len(self.lc), j].sum()
        names = [*self.lc, *self.be[:1]]
        lv = np.array([[_level_index(self.levels_mhz, alloc[n].freq_mhz) for n in names]], dtype=int)
        return Candidates(u, lv)

    def decode(self, cands: Candidates, i: int = 0) -> Allocation:
        """Point `i` of `cands` as an `Allocation` built on the fair template."""
        u, lv = cands.units[i], cands.levels[i]
        apps = []
        for a in self.template.apps:
            p = self.party_of[a.name]
            changes: dict[str, Any] = {}  # AppAlloc fields by name: float amounts, int ways and MHz
            for j, r in enumerate(self.pooled):
                amount = float(u[p, j] * self.step[j])
                changes[_FIELD[r]] = round(amount) if r is Resource.CACHE else amount
            if self.search_freq:
                changes["freq_mhz"] = self.levels_mhz[int(lv[p])]
            apps.append(dataclasses.replace(a, **changes))
        return Allocation.of(apps, self.caps)

    def admissible(self, cands: Candidates) -> np.ndarray:
        """Which points hand out every unit and respect every minimum (floors included); points
        built from an allocation outside this space (e.g. one a guard changed) may not."""
        u = cands.units
        ok = (u >= self.min_units[None]).all(axis=(1, 2)) & (u.sum(axis=1) == self.total_units[None]).all(
            axis=1
        )
        return ok & ((cands.levels >= 0) & (cands.levels < len(self.levels_mhz))).all(axis=1)

    # ---- candidate generators -------------------------------------------------------------------
    def probe(self, name: str) -> Candidates:
        """CLITE's initial samples by name (module docstring); `lc_max_each` gives one per LC app."""
        if name == "fair":
            return self.point_of(self.template)
        top = len(self.levels_mhz) - 1
        if name == "be_minimum":
            u = self.min_units.copy()
            n_lc = len(self.lc)
            for j in range(len(self.pooled)):
                free = self.total_units[j] - u[:, j].sum()
                u[:n_lc, j] += free // n_lc
                u[: free % n_lc, j] += 1
            lv = np.full(self.n_parties, self.nominal_level, dtype=int)
            lv[:n_lc] = top
            return Candidates(u[None], lv[None])
        if name == "lc_max_each":
            us, lvs = [], []
            for k in range(len(self.lc)):
                u = self.min_units.copy()
                u[k] += self.total_units - u.sum(axis=0)
                lv = np.full(self.n_parties, self.nominal_level, dtype=int)
                lv[: len(self.lc)] = top
                us.append(u)
                lvs.append(lv)
            return Candidates(np.stack(us), np.stack(lvs))
        raise ValueError(f"unknown probe {name!r}")

    def random(
        self, n: int, rng: np.random.Generator, alpha: float = 1.0, bundle_concentration: float = 0.0
    ) -> Candidates:
        """`n` random points (module docstring). With `bundle_concentration` > 0 the resources of a
        point are drawn around one common split (Dirichlet(c x split)), so a party with a large
        share of cores tends to have a large share of everything, as an app's need comes in
        bundles; 0 draws each resource independently."""
        P, R = self.n_parties, len(self.pooled)
        u = np.zeros((n, P, R), dtype=int)
        common = rng.dirichlet(np.full(P, alpha), size=n) if bundle_concentration > 0 else None
        for j in range(R):
            free = int(self.total_units[j] - self.min_units[:, j].sum())
            if common is None:
                w = rng.dirichlet(np.full(P, alpha), size=n) * free
            else:  # Dirichlet(bundle_concentration x split) per row, drawn as normalised gammas
                g = rng.standard_gamma(bundle_concentration * common + 1e-3)
                w = g / g.sum(axis=1, keepdims=True) * free
            base = np.floor(w).astype(int)
            left = free - base.sum(axis=1)
            order = np.argsort(-(w - base), axis=1, kind="stable")
            extra = (np.arange(P)[None, :] < left[:, None]).astype(int)
            np.put_along_axis(base, order, np.take_along_axis(base, order, axis=1) + extra, axis=1)
            u[:, :, j] = self.min_units[None, :, j] + base
        if self.search_freq:
            lv = rng.integers(0, len(self.levels_mhz), size=(n, P))
        else:
            lv = np.repeat(self.point_of(self.template).levels, n, axis=0)
        return Candidates(u, lv.astype(int))

    def neighbours(self, centre: Candidates, fractions: Sequence[float] = ()) -> Candidates:
        """Every transfer of one unit (or of `fractions` of the pool) between two parties and
        every one-level frequency change of one party, from the single point `centre`."""
        u0, lv0 = centre.units[0], centre.levels[0]
        us, lvs = [], []
        for j in range(len(self.pooled)):
            sizes = sorted({1, *(max(1, round(f * self.total_units[j])) for f in fractions)})
            for a in range(self.n_parties):
                for b in range(self.n_parties):
                    if a == b:
                        continue
                    for s in sizes:
                        if u0[a, j] - s < self.min_units[a, j]:
                            continue
                        u = u0.copy()
                        u[a, j] -= s
                        u[b, j] += s
                        us.append(u)
                        lvs.append(lv0)
        if self.search_freq:
            for p in range(self.n_parties):
                for d in (-1, 1):
                    k = int(lv0[p]) + d
                    if 0 <= k < len(self.levels_mhz):
                        lv = lv0.copy()
                        lv[p] = k
                        us.append(u0)
                        lvs.append(lv)
        if not us:
            return Candidates(np.zeros((0, *u0.shape), dtype=int), np.zeros((0, len(lv0)), dtype=int))
        return Candidates(np.stack(us), np.stack(lvs))

    def local(self, centre: Candidates, n: int, max_frac: float, rng: np.random.Generator) -> Candidates:
        """`n` random points near the single point `centre` (a trust region): every party's units
        of each pooled resource move by at most max(1, `max_frac` x the pool's units), the
        difference settled by the last party (the BE party; the last LC app without BE jobs), and each
        party's frequency moves by at most one level; points outside the space are dropped."""
        u0, lv0 = centre.units[0], centre.levels[0]
        P, R = u0.shape
        u = np.repeat(u0[None], n, axis=0).copy()
        for j in range(R):
            m = max(1, int(max_frac * self.total_units[j]))
            d = rng.integers(-m, m + 1, size=(n, P))
            d[rng.random((n, P)) < 0.5] = 0  # most points change a few parties only
            d[:, -1] = -d[:, :-1].sum(axis=1)
            u[:, :, j] += d
        lv = np.repeat(lv0[None], n, axis=0).copy()
        if self.search_freq:
            step = rng.integers(-1, 2, size=(n, P)) * (rng.random((n, P)) < 0.3)
            lv = np.clip(lv + step, 0, len(self.levels_mhz) - 1)
        out = Candidates(u, lv.astype(int))
        return out.take(np.nonzero(self.admissible(out))[0])

    def enumerate_all(self, limit: int = 200_000) -> Candidates:
        """Every point of the space (for tests and small nodes); ValueError above `limit`."""
        per_res = [
            _compositions(int(self.total_units[j] - self.min_units[:, j].sum()), self.n_parties)
            + self.min_units[None, :, j]
            for j in range(len(self.pooled))
        ]
        n_levels = len(self.levels_mhz) if self.search_freq else 1
        count = math.prod(len(c) for c in per_res) * n_levels**self.n_parties
        if count > limit:
            raise ValueError(f"the space has {count} points (> {limit})")
        grids = np.meshgrid(*[np.arange(len(c)) for c in per_res], indexing="ij")
        idx = [g.ravel() for g in grids] if per_res else []
        n = len(idx[0]) if idx else 1
        u = (
            np.stack([per_res[j][idx[j]] for j in range(len(per_res))], axis=-1)
            if per_res
            else np.zeros((1, self.n_parties, 0), dtype=int)
        )
        base_lv = self.point_of(self.template).levels[0]
        if not self.search_freq:
            return Candidates(u, np.repeat(base_lv[None], n, axis=0))
        lv_grid = np.stack(np.meshgrid(*[np.arange(n_levels)] * self.n_parties, indexing="ij"), -1).reshape(
            -1, self.n_parties
        )
        return Candidates(np.repeat(u, len(lv_grid), axis=0), np.tile(lv_grid, (n, 1)))


# ---- helpers ----------------------------------------------------------------------------------------
def _compositions(free: int, parts: int) -> np.ndarray:
    """All splits of `free` units among `parts` parties (non-negative, summing to `free`)."""
    out: list[tuple[int, ...]] = []

    def rec(prefix: tuple[int, ...], left: int) -> None:
        if len(prefix) == parts - 1:
            out.append((*prefix, left))
            return
        for k in range(left + 1):
            rec((*prefix, k), left - k)

    if parts == 1:
        return np.array([[free]], dtype=int)
    rec((), free)
    return np.array(out, dtype=int)


def _level_index(levels: Sequence[int], mhz: float) -> int:
    return int(np.argmin([abs(v - mhz) for v in levels]))


def _total(caps: Capabilities, r: Resource) -> float:
    return {
        Resource.CORE: caps.cores,
        Resource.CACHE: float(caps.llc_ways),
        Resource.MEM: caps.memory_gb,
        Resource.DISK: caps.disk_mbps,
    }[r]


def _min_units(caps: Capabilities, r: Resource, is_be: bool) -> int:
    if r is Resource.CORE:
        return 0 if is_be else 1
    if r is Resource.CACHE:
        return int(caps.min_llc_ways)
    if r is Resource.MEM:
        return max(1, math.ceil(caps.min_memory_gb / caps.memory_step_gb - 1e-9))
    return 1  # disk: one step each (PARTIES' minimum, env.types._minimum)
