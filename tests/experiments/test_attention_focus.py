"""The attention-focus analysis: Monte Carlo against the closed forms.

The committed tables (docs/attention_focus.md, 64 rows) agree with the closed
forms within 2% inside the regimes stated there. Here the sample is small (16
rows of 2048 keys); the standard error of each value below is under 1.5% of
it, so the tolerance, 6%, is at least four standard errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments import attention_focus as focus

SMALL_SAMPLE_TOL = 0.06


@pytest.mark.parametrize("setting", [
    focus.Setting("softmax", 0.5, 2048),
    focus.Setting("softmax", 1.0, 2048),
    focus.Setting("linear", 1.5, 2048),
    focus.Setting("linear", 1.0, 2048, score_mean=1.5),
    focus.Setting("relu2", 1.5, 2048, bias=-1.0),
    focus.Setting("decayed", 1.0, 2048, decay=0.99),
], ids=lambda s: f"{s.kind}-{s.gamma}-{s.score_mean}")
def test_monte_carlo_matches_closed_form(setting):
  mean, err = focus.monte_carlo(setting, rows=16, dim=32, seed=3)
  closed = focus.closed_form(setting)
  assert err <= 0.015 * closed
  assert abs(mean / closed - 1) <= SMALL_SAMPLE_TOL, (mean, closed)


def test_closed_forms_exact_values():
  assert focus.softmax_closed_form(0.0) == 1.0
  assert math.isclose(focus.linear_closed_form(0.0), math.sqrt(2 / math.pi))
  rhos = np.linspace(-4, 4, 81)
  assert np.argmin(focus.linear_closed_form(rhos)) == 40     # rho = 0
  assert math.isclose(focus.relu2_closed_form(1.3, 0.0), 1 / math.sqrt(6))
  # The decay form is exact for a row lambda^(n - j) at every n.
  for lam, n in ((0.9, 7), (0.99, 300), (0.5, 1)):
    row = lam ** np.arange(n)
    direct = np.mean(row) / np.sqrt(np.mean(row ** 2))
    assert math.isclose(focus.decay_closed_form(lam, n), direct, rel_tol=1e-12)


def test_relu2_moments_by_quadrature():
  """The truncated-normal moments behind the relu^2 closed form."""
  z = np.linspace(-12, 12, 200001)
  density = np.exp(-z ** 2 / 2) / math.sqrt(2 * math.pi)
  for gamma, bias in ((0.7, -1.0), (2.0, 0.5), (1.0, -3.0)):
    w = np.maximum(gamma * z + bias, 0.0) ** 2
    quad = (np.trapezoid(w * density, z)
            / math.sqrt(np.trapezoid(w ** 2 * density, z)))
    assert math.isclose(focus.relu2_closed_form(gamma, bias), quad,
                        rel_tol=1e-6)


def test_which_maps_focus():
  """Softmax sharpens with the query norm; identity linear and elu+1 do not;
  decay concentrates with the length."""
  def s(kind, gamma, length=1024, **kw):
    return focus.monte_carlo(focus.Setting(kind, gamma, length, **kw), rows=4,
                             dim=32, seed=0)[0]

  assert s("softmax", 2.0) < 0.3 < 0.8 < s("softmax", 0.5)
  for gamma in (0.5, 3.0):
    assert s("linear", gamma) > 0.78
    assert s("elu1", gamma) > 0.9
  assert s("decayed", 1.0, 4096, decay=0.9) < 0.3 * s("decayed", 1.0, 256,
                                                         decay=0.9)
