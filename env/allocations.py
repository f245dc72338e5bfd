"""The allocations every controller starts from or is compared with.

* `fair_allocation`: PARTIES' starting point (Alg. 1, Sec. 4.2.1): "each application receives an
  equal partition of all managed resources, and all processors run at nominal frequency". Each LC
  app gets its own core group and CLOS; BE jobs share one group and CLOS holding what the equal
  split leaves over (at least the minimum of each resource, so they are not starved of a CLOS).
  When the LC apps outnumber the CLOSes left for them (e.g. CoCo Fig. 2: six LC containers on a
  4-CLOS CAT), they share CLOSes (`lc_clos_blocks`); every app keeps its equal share of the ways.
* `lean_start`: the fair start with a random number of LC units (cores, LLC ways) handed to the BE
  jobs: a start-state distribution for training, so that episodes also begin where the apps hold
  little (what the fair start rarely leads a cautious policy to).
* `unmanaged_allocation`: no isolation at all (PARTIES Sec. 5.2.3, "Unmanaged"): every app and BE
  job shares all cores, the whole LLC, memory, disk and network; frequency is left to the governor
  (turbo when busy).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from env.types import Allocation, AppAlloc, Capabilities, Direction, Move, Resource, validate_allocation

BE_GROUP = 0  # core group and CLOS shared by BE jobs


def _split(total: float, parts: int, step: float, reserve: float) -> tuple[float, float]:
    """Equal share per part in multiples of `step`, keeping `reserve` aside; returns (share, rest)."""
    if parts == 0:
        return 0.0, total
    share = math.floor((total - reserve) / parts / step + 1e-9) * step
    return share, total - share * parts


def lc_clos_blocks(n_lc: int, lc_closes: int) -> list[int]:
    """How many LC apps share each LC CLOS when `n_lc` apps have `lc_closes` CLOSes: one app per
    CLOS while they fit, else contiguous blocks in the node's app order whose sizes differ by at most
    one (the first `n_lc mod lc_closes` CLOSes hold one app more), so that no app shares with more
    apps than it must."""
    if lc_closes >= n_lc:
        return [1] * n_lc
    q, r = divmod(n_lc, lc_closes)
    return [q + 1] * r + [q] * (lc_closes - r)


def fair_allocation(caps: Capabilities) -> Allocation:
    """PARTIES' equal partition (Alg. 1 initialization; module docstring).

    Each LC app gets an equal share of cores (its own core group), LLC ways, memory, disk and
    network at the nominal frequency; the BE jobs share core group 0 and CLOS 0 with the rest.

    CLOSes. One per LC app (plus CLOS 0 for the BE jobs) while the node has enough. With more LC
    apps than the CLOSes left for them, the LC apps share CLOSes in balanced contiguous blocks
    (`lc_clos_blocks`), and a CLOS of k apps holds k equal shares of the ways, so every app's share
    of the LLC is the same as with exclusive CLOSes, but it is shared (the simulator models the apps
    of one CLOS competing for its ways) rather than isolated. The BE jobs keep their own CLOS. On a
    node with a single CLOS and BE jobs nothing can be partitioned: every app and BE job is in CLOS
    0 holding all ways. Raises ValueError when the apps cannot get one core step each, or a CLOS
    cannot get the node's minimum ways, or the shares are not a valid allocation of the node
    (e.g. less memory per app than the node's minimum limit): the node cannot host these apps.
    """
    lc, be = caps.lc_apps, caps.be_apps
    if not lc and not be:
        raise ValueError("the node runs no apps")
    n = len(lc)
    need_be = bool(be)
    n_clos = max(caps.clos_count, 1)
    lc_closes = n_clos - int(need_be)
    cores, rest_cores = _split(caps.cores, n, caps.core_step, 0.0)
    ways, rest_ways = _split(caps.llc_ways, n, 1, caps.min_llc_ways if need_be else 0)
    mem, rest_mem = _split(caps.memory_gb, n, caps.memory_step_gb, caps.min_memory_gb if need_be else 0)
    disk, rest_disk = _split(caps.disk_mbps, n, caps.disk_step_mbps, caps.disk_step_mbps if need_be else 0)
    net, rest_net = _split(caps.net_gbps, n, caps.net_step_gbps, caps.net_step_gbps if need_be else 0)
    if n and lc_closes < 1:  # one CLOS, BE jobs too: no partitioning at all
        blocks, clos_ids, clos_ways, rest_ways = [n], [BE_GROUP], [caps.llc_ways], caps.llc_ways
    else:
        blocks = lc_clos_blocks(n, lc_closes)
        first = 1 if need_be else 0  # CLOS 0 belongs to the BE jobs
        clos_ids = list(range(first, first + len(blocks)))
        clos_ways = [int(ways) * k for k in blocks]
    if n and (cores < caps.core_step or min(clos_ways) < caps.min_llc_ways):
        raise ValueError(f"{n} LC apps do not fit on {caps.cores} cores / {caps.llc_ways} LLC ways")
    nominal = caps.nominal_freq_mhz
    clos_of = [(c, w) for c, w, k in zip(clos_ids, clos_ways, blocks) for _ in range(k)]
    apps = []
    # LC app i gets core group i (group 0 belongs to the BE jobs) and the CLOS of its block.
    for i, (spec, (clos, w)) in enumerate(zip(lc, clos_of), start=1):
        apps.append(AppAlloc(spec.name, cores, i, w, clos, nominal, mem, disk, net))
    for spec in be:
        apps.append(
            AppAlloc(
                spec.name,
                rest_cores,
                BE_GROUP,
                int(rest_ways),
                BE_GROUP,
                nominal,
                rest_mem,
                rest_disk,
                rest_net,
            )
        )
    alloc = Allocation.of(apps, caps)
    validate_allocation(alloc, caps)  # an AllocationError (a ValueError): the apps do not fit
    return alloc


LEAN_START_RESOURCES = (Resource.CORE, Resource.CACHE)  # what a cautious policy over-holds


def lean_start(caps: Capabilities, rng: np.random.Generator, max_moves: int) -> Allocation:
    """`fair_allocation` after k DOWN moves, k uniform in 0..`max_moves`: each a core or an LLC way
    (`LEAN_START_RESOURCES`) of a random LC app, given to the first BE job (the idle pool without
    one), as PARTIES' downsizing gives it (Sec. 4.2.4). A move the app cannot make (at its
    minimum) is skipped, so k is an upper bound on the units moved. Every draw comes from `rng`."""
    if max_moves < 0:
        raise ValueError(f"lean_start: max_moves must be >= 0, got {max_moves}")
    alloc = fair_allocation(caps)
    lc = [a.name for a in caps.lc_apps]
    if not lc:
        return alloc
    to = next((b.name for b in caps.be_apps if b.name in alloc), None)
    for _ in range(int(rng.integers(0, max_moves + 1))):
        app = lc[int(rng.integers(len(lc)))]
        move = Move.of(Direction.DOWN, LEAN_START_RESOURCES[int(rng.integers(len(LEAN_START_RESOURCES)))])
        if alloc.move_feasible(app, move, caps, to):
            alloc = alloc.with_move(app, move, caps, to)
    return alloc


def unmanaged_allocation(caps: Capabilities) -> Allocation:
    """No isolation (PARTIES Sec. 5.2.3): every app, BE jobs included, shares all cores
    (group 0), all LLC ways (CLOS 0), the top frequency and the whole memory, disk and network."""
    top = caps.freq_levels_mhz[-1]
    apps = [
        AppAlloc(a.name, caps.cores, 0, caps.llc_ways, 0, top, caps.memory_gb, caps.disk_mbps, caps.net_gbps)
        for a in caps.apps
    ]
    return Allocation.of(apps, caps)


def structure(alloc: Allocation) -> tuple[tuple[str, int, int], ...]:
    """How the apps are grouped: (name, core group, CLOS) of each app, sorted. Two allocations with
    the same structure differ only in amounts, so a change between them can be made unit by unit."""
    return tuple(sorted((a.name, a.core_group, a.clos) for a in alloc.apps))


def allocation_diff(before: Allocation, after: Allocation) -> list[str]:
    """'app.field a->b' for every field that differs (apps only in `after` as '+app')."""
    items = []
    for a in after.apps:
        if a.name not in before:
            items.append(f"+{a.name}")
            continue
        b = before[a.name]
        for f in dataclasses.fields(a):
            x, y = getattr(b, f.name), getattr(a, f.name)
            if x != y:
                items.append(f"{a.name}.{f.name} {_fmt(x)}->{_fmt(y)}")
    return items


def describe_diff(before: Allocation, after: Allocation, limit: int = 6) -> str:
    """`allocation_diff` as one line of at most `limit` items ("" when nothing differs)."""
    items = allocation_diff(before, after)
    if len(items) > limit:
        items = [*items[:limit], f"... {len(items) - limit} more"]
    return ", ".join(items)


def _fmt(x: object) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)
