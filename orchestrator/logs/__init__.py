"""Task logs: tailing, durable copies, reading them back."""
