"""structgen's benchmarks: one module per benchmark, each run from the repository root as
``python -m benchmarks.<name>`` (``--smoke`` for the quick run CI makes, ``--help`` for the rest).

``benchmarks.common`` holds what the benchmarks share (the results envelope, the mask engines,
the llama.cpp helpers); ``benchmarks.tasks`` the task data; ``benchmarks/results/`` the recorded
results, indexed by ``benchmarks/results/README.md``. Not part of the installed package.
"""
