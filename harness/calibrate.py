"""`evaluate.py calibrate`: the papers' tables and facts reproduced in the simulator
(`env.sim.calibration`), written as calibration.json, calibration.md and plots."""

from __future__ import annotations

import json
from pathlib import Path

from env.sim import calibration
from harness.output import staged_output


def run_calibrate(out: Path, *, seed: int = 0, workers: int = 2, overwrite: bool = False) -> int:
    """Run the calibration report into `out` (checked before the run starts, written through a
    staging directory, so an existing result is replaced only with `overwrite` and only at the end)."""
    with staged_output(out, overwrite) as tmp:
        report = calibration.run(seed=seed, workers=workers)
        (tmp / "calibration.json").write_text(json.dumps(report, indent=2))
        (tmp / "calibration.md").write_text(calibration.markdown(report))
        calibration.plots(report, tmp)
    print(calibration.markdown(report).split("## PARTIES Table 2")[0])
    print(f"wrote {out}/calibration.json, calibration.md and plots")
    return 0
