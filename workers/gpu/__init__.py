"""A GPU worker's loop over its queue, split by concept (docs/architecture.md, "One job through a
GPU host"): `loop.py` (RunLoop: lease, hand over, next), `run.py` (JobRun: one job's launch,
supervision, measurement and settling), `reservation.py` (the next job reserved while one runs,
and who starts it: `claims.py`), `heartbeat.py` (a running job's lease renewal), `outcomes.py`
(the store of an outcome), `spares.py` (parked interpreters), `tickets.py` (what the loop knows
of a job and of itself), `launch_settings.py` (a job's runner settings)."""
