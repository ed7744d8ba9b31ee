"""Several brokers, one schedule: every broker gates (validate, quota, PII, route, cache) the
requests it consumes; the one holding the scheduler lease keeps the lanes of every pool and
alone answers worker pulls.

- `lease.py`: the lease in the `lw_sched` KV bucket (create to take, update to renew, expiry or
  delete to hand over) and its timing, kept pure.
- `origin.py`: the gate side: each admitted request goes to the scheduler (`Admitted` on
  `lw.sched.admit`); a copy stays until the scheduler says it settled, and is sent again to a
  new scheduler.
- `schedule.py`: the scheduler side: lanes, parked pulls, dispatch, expiry, cancels.
- `answers.py`: acks by subject alone, and the refusal a client gets.
- `peers.py`: which other brokers are alive (the scheduler does not gate while one is).
"""
