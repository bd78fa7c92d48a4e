"""The benchmarks: the suite's rows (suite.py, run by scripts/bench.py), the measurements they
share (measure.py, infra.py, launch.py) and their results (rows.py); the scripts that measure a
few rows alone or a figure of their own, each run as `python -m scripts.benchmarks.NAME`
(hostloss, slurm, warm, scale, tick, launch, sampling, overhead, install, plot_scale); and the
processes the measurements start by path (trainer.py, scale_trainer.py, ab.py), which import
nothing from here."""
