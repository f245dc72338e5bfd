"""The real node: `LinuxNode` over cgroups v1/v2, resctrl (CAT/MBA), cpufreq, tc and Docker, with its
capability probe, latency feeds, the open-loop load generator and the app profiler."""
