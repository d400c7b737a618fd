"""analysis.fit: response surfaces through a sensitivity design, the testbed fit to baseline rows, its
leave-one-out predictions and the baseline-consistent set, on synthetic numbers with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.compare import verdict
from analysis.fit import Axis, Surface, Target, fit_testbed, range_width, weak, within
from moe_core.schema.points import Unstated, sensitivity_settings

LINK = Unstated("hardware.intra_node_GBps", chosen=25.0, low=12.4, high=240.0)
BATCH = Unstated("train.batch_size", chosen=8, low=4, high=64)
LAUNCH = Unstated("hardware.kernel_launch_us", chosen=38.0, low=10.0, high=38.0)
PARAMS = (LINK, BATCH, LAUNCH)
AXES = [Axis.of(p) for p in PARAMS]


def simulate(setting: dict[str, float], law) -> float:
    """A stand-in simulator: ``law`` at the chosen values overridden by ``setting``."""
    values = {p.key: p.chosen for p in PARAMS} | setting
    return law(values[LINK.key], values[BATCH.key], values[LAUNCH.key])


def surface_of(law) -> Surface:
    """The surface through ``law``'s runs at the chosen values and the sensitivity design."""
    runs = [({}, simulate({}, law)), *((s, simulate(s, law)) for s in sensitivity_settings(PARAMS))]
    return Surface(runs, AXES)


# Power laws are linear in the log coordinates: the design identifies them exactly.
A2A_MS = lambda link, batch, launch: 30.0 * batch / link**0.8  # noqa: E731
STEP_MS = lambda link, batch, launch: 7.0 * batch**0.9 * launch**0.2  # noqa: E731
HOST_MS = lambda link, batch, launch: 3.0 * launch  # noqa: E731
SHARE = lambda link, batch, launch: A2A_MS(link, batch, launch) / STEP_MS(link, batch, launch)  # noqa: E731
AT = lambda setting: np.array([a.unit(setting.get(a.key, a.chosen)) for a in AXES])  # noqa: E731


def test_surface_goes_through_its_runs_and_recovers_a_power_law():
    surface = surface_of(A2A_MS)
    for setting in [{}, *sensitivity_settings(PARAMS)]:
        assert surface(AT(setting)) == pytest.approx(simulate(setting, A2A_MS), rel=1e-9)
    inside = {LINK.key: 60.0, BATCH.key: 20.0, LAUNCH.key: 20.0}
    assert surface(AT(inside)) == pytest.approx(simulate(inside, A2A_MS), rel=1e-9)
    assert surface.varied == [0, 1]  # the launch cost moves no all-to-all


def test_fit_recovers_the_setting_that_made_the_baselines():
    truth = {LINK.key: 60.0, BATCH.key: 20.0, LAUNCH.key: 20.0}
    targets = {
        "a2a": Target(surface_of(A2A_MS), simulate(truth, A2A_MS)),
        "step": Target(surface_of(STEP_MS), simulate(truth, STEP_MS)),
        "host": Target(surface_of(HOST_MS), simulate(truth, HOST_MS)),
    }
    fit = fit_testbed(targets, AXES)
    assert fit.setting[LINK.key] == pytest.approx(60.0, rel=0.02)
    assert fit.setting[BATCH.key] == pytest.approx(20.0, rel=0.02)
    assert fit.setting[LAUNCH.key] == pytest.approx(20.0, rel=0.02)
    assert all(ratio == pytest.approx(1, abs=0.01) for ratio in fit.ratios.values())
    assert len(fit.consistent) > 0 and all(t.agrees(fit.consistent).all() for t in targets.values())
    assert fit.unreached is None


def test_leave_one_out_fits_without_the_row():
    """Two rows pin the link (and agree on it); one pins only the launch cost. Left out, the launch row
    is predicted at the chosen launch cost (nothing else pins it); each link row is predicted by the
    other (up to the fit's weak pull toward the chosen values)."""
    link_only = lambda link, batch, launch: 100.0 / link  # noqa: E731
    launch_only = lambda link, batch, launch: 2.0 * launch  # noqa: E731
    targets = {
        "link-a": Target(surface_of(link_only), 100.0 / 50.0),
        "link-b": Target(surface_of(lambda link, batch, launch: 3 * link_only(link, batch, launch)), 300.0 / 50.0),
        "launch": Target(surface_of(launch_only), 2.0 * 15.0),
    }
    fit = fit_testbed(targets, AXES)
    assert fit.setting[LINK.key] == pytest.approx(50.0, rel=5e-3)
    assert fit.setting[LAUNCH.key] == pytest.approx(15.0, rel=5e-3)
    assert fit.setting[BATCH.key] == pytest.approx(BATCH.chosen) and fit.pinned == [LINK.key, LAUNCH.key]
    assert fit.loo["launch"] == pytest.approx(2.0 * LAUNCH.chosen, rel=1e-6)
    assert fit.loo["link-a"] == pytest.approx(2.0, rel=1e-3) and fit.loo["link-b"] == pytest.approx(6.0, rel=1e-3)


def test_contradicting_baselines_leave_no_consistent_setting_and_name_the_row():
    link_only = lambda link, batch, launch: 100.0 / link  # noqa: E731
    targets = {
        "fast": Target(surface_of(link_only), 100.0 / 200.0),
        "slow": Target(surface_of(link_only), 100.0 / 15.0),
    }
    fit = fit_testbed(targets, AXES)
    assert len(fit.consistent) == 0
    assert fit.unreached is not None and LINK.key in fit.unreached
    assert fit.unreached.startswith(("fast:", "slow:"))
    # neither row can be met at a setting the other is met at: the ratios straddle 1
    assert min(fit.ratios.values()) < 1 < max(fit.ratios.values())


def test_a_claims_span_covers_only_baseline_consistent_settings():
    truth = {LINK.key: 100.0}
    fit = fit_testbed({"a2a": Target(surface_of(A2A_MS), simulate(truth, A2A_MS), tolerance=0.1)}, AXES)
    claim = surface_of(SHARE)
    low, high = fit.span(claim)
    everywhere = claim(np.random.default_rng(0).random((4000, 3)))
    assert everywhere.min() <= low <= fit.predict(claim) <= high <= everywhere.max()
    assert high / low < everywhere.max() / everywhere.min()


@pytest.mark.parametrize("bound", [None, "lower", "upper"])
def test_within_is_the_verdicts_rule(bound):
    ratios = np.array([0.5, 0.74, 0.8, 1.0, 1.2, 1.26, 3.0])
    assert within(ratios, 0.25, bound).tolist() == [verdict(r, 0.25, bound) == "consistent" for r in ratios]


def test_where_the_baselines_cannot_tell_the_fit_stays_nearest_the_chosen_values():
    """A baseline that reads two parameters only through their ratio is met along a whole ridge; the
    fit's weak pull toward the chosen values picks the ridge's point nearest them, not an arbitrary one."""
    ratio = lambda link, batch, launch: launch / link  # noqa: E731
    published = 1.3 * LAUNCH.chosen / LINK.chosen
    fit = fit_testbed({"ridge": Target(surface_of(ratio), published)}, AXES)
    assert fit.ratios["ridge"] == pytest.approx(1.0, abs=1e-3)
    link_axis, _, launch_axis = AXES
    links = np.exp(np.linspace(np.log(LINK.low), np.log(LINK.high), 20001))
    launches = published * links
    on_ridge = (launches >= LAUNCH.low) & (launches <= LAUNCH.high)
    offsets = np.column_stack([link_axis.unit(links[on_ridge]), launch_axis.unit(launches[on_ridge])])
    chosen = np.array([link_axis.unit(LINK.chosen), launch_axis.unit(LAUNCH.chosen)])
    nearest = np.sqrt(((offsets - chosen) ** 2).sum(axis=1)).min()
    assert np.sqrt(((fit.z[[0, 2]] - chosen) ** 2).sum()) <= nearest + 1e-2


def test_range_width_and_weak():
    assert range_width(2.0, 3.0) == 1.5 and not weak(2.0, 3.0) and weak(2.0, 3.1)
    assert range_width(-3.0, -2.0) == 1.5 and weak(-1.0, 1.0)


@pytest.mark.parametrize("law", [A2A_MS, STEP_MS, lambda link, batch, launch: launch - 20.0])
@pytest.mark.parametrize("bound", [None, "lower", "upper"])
def test_the_optimisers_gradient_is_the_log_errors_derivative(law, bound):
    """Exact gradients (the fit's L-BFGS-B takes them) against central differences, on a log surface,
    a surface through zero (no log: a linear law crossing zero) and one-sided errors."""
    target = Target(surface_of(law), simulate({LINK.key: 60.0}, law) or 1.0, bound=bound)
    z = np.random.default_rng(0).uniform(0.05, 0.95, size=(6, len(AXES)))
    h = 1e-6
    numeric = np.stack(
        [(target.log_error(z + h * e) - target.log_error(z - h * e)) / (2 * h) for e in np.eye(len(AXES))], axis=1
    )
    assert np.allclose(target.log_error_gradient(z), numeric, rtol=1e-5, atol=1e-7)


def test_run_setting_rounds_counts_and_writes_six_digits():
    """The setting the workflow simulates a paper at: a count whole, a rate as the record writes it."""
    targets = {"a2a": Target(surface_of(A2A_MS), simulate({LINK.key: 61.2345678, BATCH.key: 20.4}, A2A_MS))}
    fit = fit_testbed(targets, AXES)
    setting = fit.run_setting()
    assert setting[BATCH.key] == round(fit.setting[BATCH.key]) and BATCH.integer and not LINK.integer
    assert setting[LINK.key] == float(f"{fit.setting[LINK.key]:g}") and setting[LAUNCH.key] == LAUNCH.chosen
    fit.simulated("a2a", 2 * targets["a2a"].published)
    assert fit.ratios["a2a"] == 2.0 and fit.surface_ratios["a2a"] == pytest.approx(1.0, abs=0.01)


def test_a_count_is_fitted_at_the_best_whole_value():
    """A batch of sequences is simulated whole: the fit is the whole value nearest the published number
    in log error (20 for 20.4: 2% below, 21 is 3% above), its ratios the surface's there, and every
    baseline-consistent setting whole too."""
    compute_ms = lambda link, batch, launch: 5.0 * batch  # noqa: E731
    targets = {"compute": Target(surface_of(compute_ms), simulate({BATCH.key: 20.4}, compute_ms), tolerance=0.05)}
    fit = fit_testbed(targets, AXES)
    assert fit.setting[BATCH.key] == pytest.approx(20.0, rel=1e-9)
    assert fit.ratios["compute"] == pytest.approx(20.0 / 20.4, rel=1e-9)
    batches = AXES[1].value(fit.consistent[:, 1])
    assert len(batches) and np.allclose(batches, np.round(batches))
    assert set(np.round(batches)) == {20.0, 21.0}  # within 5% of 20.4: 20 and 21 only


def test_the_design_runs_a_small_count_at_every_whole_value():
    """A number that moves in whole steps is simulated at each of them, not interpolated between the
    ends: a count of at most WHOLE_LEVELS values runs each alone; a wide count and a rate their ends."""
    groups = Unstated("gshard.max_groups_per_core", chosen=4, low=1, high=4)
    assert groups.integer and groups.alone == (1, 2, 3)
    assert BATCH.alone == BATCH.ends == (4, 64) and LINK.alone == LINK.ends
    alone = [s for s in sensitivity_settings((LINK, groups)) if len(s) == 1]
    assert alone == [{LINK.key: 12.4}, {LINK.key: 240.0}, *({groups.key: g} for g in (1, 2, 3))]
