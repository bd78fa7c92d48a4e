"""The worker side of orchestrate: the agent, the spec it runs, and the training runtime.

Importing this package is cheap: only `worker.runtime` imports TensorFlow, and only when a
training script imports it. `worker` never imports `orchestrator`.
"""
