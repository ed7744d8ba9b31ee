"""The `laneway` command: runs the processes (nats, broker, worker, bridge) and operator tools."""
