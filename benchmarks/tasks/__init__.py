"""The benchmarks' task data: the suite's tasks (``suite``), the extraction tasks the generation
and serving benchmarks share (``extraction``) and their shared-system-prompt variant
(``shared_prefix``)."""
