"""orchestrate's own tools, run from the repository root as modules (`python -m scripts.bench`,
`python -m scripts.chaos --quick`, `python -m scripts.benchmarks.hostloss`): the benchmark suite
(bench.py over benchmarks/), the chaos soak (chaos.py and chaos_report.py over soak/), the GPU
check and the TFRecord shards of the digits. The test beds they use are tests.beds."""
