"""The store and what it records: jobs, tasks, events, the job state machine, job records,
takeover."""
