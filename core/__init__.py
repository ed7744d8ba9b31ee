"""What every Laneway process shares: the NATS connection and embedded server, KV watches, tasks,
provisioning and topology, the settings and the live catalogue, the policy documents and their
pure decisions (`policy/`), routing (`routing/`), the response cache, metering, and the one
registry of environment variables (`env.py`)."""
