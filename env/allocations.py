"""The allocations every controller starts from or is compared with.

* `fair_allocation`: PARTIES' starting point (Alg. 1, Sec. 4.2.1): "each application receives an
  equal partition of all managed resources, and all processors run at nominal frequency". Each LC
  app gets its own core group and CLOS; BE jobs share one group and CLOS holding what the equal
  split leaves over (at least the minimum of each resource, so they are not starved of a CLOS).
* `unmanaged_allocation`: no isolation at all (PARTIES Sec. 5.2.3, "Unmanaged"): every app and BE
  job shares all cores, the whole LLC, memory, disk and network; frequency is left to the governor
  (turbo when busy).
"""

from __future__ import annotations

import math

from env.types import Allocation, AppAlloc, Capabilities

BE_GROUP = 0  # core group and CLOS shared by BE jobs


def _split(total: float, parts: int, step: float, reserve: float) -> tuple[float, float]:
    """Equal share per part in multiples of `step`, keeping `reserve` aside; returns (share, rest)."""
    if parts == 0:
        return 0.0, total
    share = math.floor((total - reserve) / parts / step + 1e-9) * step
    return share, total - share * parts


def fair_allocation(caps: Capabilities) -> Allocation:
    lc, be = caps.lc_apps, caps.be_apps
    if not lc and not be:
        raise ValueError("the node runs no apps")
    n = len(lc)
    need_be = bool(be)
    cores, rest_cores = _split(caps.cores, n, caps.core_step, 0.0)
    ways, rest_ways = _split(caps.llc_ways, n, 1, caps.min_llc_ways if need_be else 0)
    mem, rest_mem = _split(caps.memory_gb, n, caps.memory_step_gb, caps.min_memory_gb if need_be else 0)
    disk, rest_disk = _split(caps.disk_mbps, n, caps.disk_step_mbps, caps.disk_step_mbps if need_be else 0)
    net, rest_net = _split(caps.net_gbps, n, caps.net_step_gbps, caps.net_step_gbps if need_be else 0)
    if n and (cores < caps.core_step or ways < caps.min_llc_ways):
        raise ValueError(f"{n} LC apps do not fit on {caps.cores} cores / {caps.llc_ways} LLC ways")
    nominal = caps.nominal_freq_mhz
    n_clos = max(caps.clos_count, 1)
    if n + int(need_be) > n_clos:
        raise ValueError(
            f"{n} LC apps{' and the BE jobs' if need_be else ''} need {n + int(need_be)} CLOSes for "
            f"exclusive LLC partitions; the node has {n_clos}"
        )
    apps = []
    # LC app i gets core group i and CLOS i (CLOS 0 and group 0 belong to the BE jobs).
    for i, spec in enumerate(lc, start=1):
        clos = i if need_be else i - 1
        apps.append(AppAlloc(spec.name, cores, i, ways, clos, nominal, mem, disk, net))
    for spec in be:
        apps.append(
            AppAlloc(spec.name, rest_cores, BE_GROUP, int(rest_ways), BE_GROUP, nominal, rest_mem, rest_disk, rest_net)
        )
    return Allocation.of(apps, caps)


def unmanaged_allocation(caps: Capabilities) -> Allocation:
    top = caps.freq_levels_mhz[-1]
    apps = [
        AppAlloc(a.name, caps.cores, 0, caps.llc_ways, 0, top, caps.memory_gb, caps.disk_mbps, caps.net_gbps)
        for a in caps.apps
    ]
    return Allocation.of(apps, caps)
