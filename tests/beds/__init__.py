"""The test beds: namespaced SSH hosts (ssh.py) and a namespaced Slurm cluster (slurm.py), both
built on base.py over netns.py; and the helpers the tests, the benchmarks and the chaos soak
share with them (checked_signal.py; delay_proxy.py, started as a file).

Imported as `tests.beds.*` from the repository root (the editable install puts it on the path);
the beds also run from there as command-line tools: `python -m tests.beds.ssh up 3`."""
