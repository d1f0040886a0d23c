"""Tools: the command line, instance validation, metrics and the benchmark suite.

No library module imports this package."""
