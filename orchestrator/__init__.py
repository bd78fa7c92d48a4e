"""orchestrate: launch and supervise one TensorFlow MultiWorkerMirrored job across many hosts.

The coordinator side never imports TensorFlow; only the training process on a worker does.
"""

__version__ = "0.1.0"
