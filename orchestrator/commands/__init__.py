"""What users call: the CLI, the views, the console, stop, collect, report, check."""
