"""Warm restarts: a task's next trainer starts in a standby interpreter that imported
TensorFlow already. keeper.py holds it (standby.py, its child) and records itself
(registry.py); the agent activates it or asks for the next (activation.py, next_standby.py);
import_env.py and imports_ahead.py keep a warm trainer true to a cold one."""
