"""Offline tools and their data, run from a checkout (`python -m tools....`): they produce what the
runtime folders ship (e.g. the intent classifier's weights) and are never installed."""
