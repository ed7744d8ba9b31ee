"""tests/gpu/calibrate_sim.py's predictions, without a GPU: a session lent one runs the script
once, so an error in the part that needs none must not wait for that session to show."""

from __future__ import annotations

import pytest

from tests.gpu.calibrate_sim import predicted
from workers.engines.sim.roofline import _CTX, PROFILES, step_seconds


def test_the_predictions_are_the_sim_profiles_step_times_at_the_measured_context():
    p = PROFILES["llama-8b-h100"]
    at_reference = predicted("llama-8b-h100", [1, 64], _CTX, [512])
    assert [d["step_s"] for d in at_reference["decode"]] == [step_seconds(p, b, b) for b in (1, 64)]
    assert at_reference["chunk"] == [{"tokens": 512, "step_s": step_seconds(p, 1, 512)}]
    # KV reads scale with the context: half of it, half of each sequence's read.
    half = predicted("llama-8b-h100", [64], _CTX // 2, [])["decode"][0]["step_s"]
    assert half == pytest.approx(p.decode_base_s + 64 * p.decode_s_per_seq * (_CTX // 2) / _CTX)
