"""Policy documents a tenant carries (quota, PII) and their pure decisions, and the cascade's
verdict: no I/O, and nothing of the gate's imported, so tenants, config, routing and workers can
hold them without loading the gate."""
