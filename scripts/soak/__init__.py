"""The chaos soak that scripts/chaos.py runs: a job's life under faults (jobs.py), the beds it
runs on (beds.py), the invariants checked (checks.py), the misbehaving webhook (webhook.py), and
the report of several runs (report.py, run by scripts/chaos_report.py)."""
