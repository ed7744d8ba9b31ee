"""Policy documents a tenant carries (quota, PII) and their pure decisions: no I/O, and nothing
of the gate's imported, so tenants and config can hold them without loading the gate."""
