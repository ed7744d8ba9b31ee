"""tests/gpu/calibrate_sim.py's predictions, without a GPU: a session lent one runs the script
once, so an error in the part that needs none must not wait for that session to show."""

from __future__ import annotations

import pytest

from tests.gpu.calibrate_sim import predicted
from workers.engines.sim.roofline import PROFILES, step_seconds


def test_the_predictions_are_the_sim_profiles_step_times_at_the_measured_context():
    p = PROFILES["llama-8b-h100"]
    at_1k = predicted("llama-8b-h100", [1, 64], 1024, [512])
    assert [d["step_s"] for d in at_1k["decode"]] == [step_seconds(p, b * 1024, b) for b in (1, 64)]
    assert at_1k["chunk"] == [{"tokens": 512, "step_s": step_seconds(p, 512, 512)}]
    # KV reads scale with the context: at half of it, half of each sequence's read.
    half = predicted("llama-8b-h100", [64], 512, [])["decode"][0]["step_s"]
    assert half == pytest.approx(p.decode_base_s + 64 * 512 * p.kv_s_per_token)
