"""The supervisor and everything it decides: attempts, rounds, rules, host loss, notify."""
