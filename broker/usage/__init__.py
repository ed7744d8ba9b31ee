"""Metering: what each finished request cost (`meter`), reports over `LW_USAGE` (`report`),
and Prometheus counters per tenant and model (`metrics`)."""
