"""`python -m env.sim.fit`: its soft facts, what it writes, and that the shipped profiles are what
their recorded command found."""

from __future__ import annotations

import math
import re
import shutil

import pytest

from env.config import CONFIGS
from env.sim import fit as F
from env.sim.profiles import load_profile


def test_the_knee_costs_nothing_inside_the_papers_range_and_grows_outside_it():
    """PARTIES Sec. 3.2: max load sits typically at 60-80% of the max RPS."""
    assert F.knee_loss(0.6) == F.knee_loss(0.7) == F.knee_loss(0.8) == 0.0
    assert F.knee_loss(0.85) == pytest.approx(1.0)  # one 5-point unit above
    assert F.knee_loss(0.5) == pytest.approx(4.0)  # two units below
    assert F.knee_loss(0.95) > F.knee_loss(0.9) > F.knee_loss(0.85)
    assert F.knee_loss(None) == F.knee_loss(math.nan) == 100.0  # nothing served


@pytest.fixture
def fitted_sphinx(tmp_path, monkeypatch):
    """A copy of sphinx.yaml that `write_fitted` writes to, after one full fit of two values."""
    apps = tmp_path / "apps"
    apps.mkdir()
    shutil.copy(CONFIGS / "apps" / "sphinx.yaml", apps / "sphinx.yaml")
    monkeypatch.setattr(F, "CONFIGS", tmp_path)
    F.write_fitted(
        "sphinx", {"service_det": 0.5, "zipf": 0.7}, "`python -m env.sim.fit --apps sphinx` (loss 1.000)"
    )
    return apps / "sphinx.yaml"


def test_writing_a_fit_replaces_its_values_and_records_the_command(fitted_sphinx):
    F.write_fitted(
        "sphinx", {"service_det": 0.25, "zipf": 0.75}, "`python -m env.sim.fit --apps sphinx` (loss 2.000)"
    )
    text = fitted_sphinx.read_text()
    assert re.findall(r"^service_det: .*$", text, flags=re.M) == ["service_det: 0.25"]
    assert re.findall(r"^zipf: .*$", text, flags=re.M) == ["zipf: 0.75"]
    assert re.findall(r"^# written by .*$", text, flags=re.M) == [
        "# written by `python -m env.sim.fit --apps sphinx` (loss 2.000)"
    ]
    assert re.findall(r"^fitted: .*$", text, flags=re.M) == ["fitted: [service_det, zipf]"]
    assert text.index("# written by") < text.index("fitted:")


def test_a_partial_fit_keeps_the_earlier_record_and_names(fitted_sphinx):
    """`--params`: the values it fitted replace theirs, the earlier fit's other names stay in
    `fitted:` and its command stays above the partial fit's own (the last one is the file's loss).
    A rescoring of the earlier values under a later model no longer applies to the new ones: it goes."""
    text = fitted_sphinx.read_text().replace(
        "\nfitted:", "\n# rescored: loss 0.900 under a later model\nfitted:"
    )
    fitted_sphinx.write_text(text)
    assert len(RESCORED.findall(text)) == 1
    F.write_fitted(
        "sphinx",
        {"zipf": 0.75},
        "`python -m env.sim.fit --apps sphinx --params zipf` (loss 0.500)",
        partial=True,
    )
    text = fitted_sphinx.read_text()
    assert re.findall(r"^zipf: .*$", text, flags=re.M) == ["zipf: 0.75"]
    assert re.findall(r"^service_det: .*$", text, flags=re.M) == ["service_det: 0.5"]
    assert re.findall(r"^# written by .*$", text, flags=re.M) == [
        "# written by `python -m env.sim.fit --apps sphinx` (loss 1.000)",
        "# written by `python -m env.sim.fit --apps sphinx --params zipf` (loss 0.500)",
    ]
    assert re.findall(r"^fitted: .*$", text, flags=re.M) == ["fitted: [service_det, zipf]"]
    assert [m.group(2) for m in RECORDED.finditer(text)][-1] == "0.500"
    assert not RESCORED.findall(text)


RECORDED = re.compile(r"^# written by `python -m env\.sim\.fit --apps (\w+) [^`]*` \(loss ([0-9.]+)\)$", re.M)
# the same values scored under a later model (a refit drops the line)
RESCORED = re.compile(r"^# rescored: loss ([0-9.]+) ", re.M)


@pytest.mark.parametrize("app", F.BASE)
def test_a_profile_whose_fit_is_recorded_gives_the_recorded_loss(app):
    """The written values (4 significant digits) reproduce the loss the fit printed: a change to the
    simulator or to the loss that moves a fitted app shows here, and the command to refit it is in
    the file."""
    text = (CONFIGS / "apps" / f"{app}.yaml").read_text()
    recorded = list(RECORDED.finditer(text))  # a partial fit's record comes after the one it refined
    if not recorded:
        pytest.skip(f"{app}: fitted before fits recorded their command")
    assert all(m.group(1) == app for m in recorded)
    # the last record counts: a fit's, or a rescoring of its values after the model changed
    last = max(
        [(m.start(), m.group(2)) for m in recorded]
        + [(m.start(), m.group(1)) for m in RESCORED.finditer(text)]
    )
    prof = load_profile(app)
    values = {p.name: float(getattr(prof, p.name)) for p in F.params_for(app)}
    loss, _, _ = F.objective(app, values)
    assert loss == pytest.approx(float(last[1]), rel=0.02, abs=0.05)
