"""What the benchmarks share.

* ``checkout``: the repository root, and how a benchmark starts another module of it in a child
  process (``python -m``, with the root on the child's ``PYTHONPATH``);
* ``envelope``: the envelope every results file carries (commit, date, machine, versions, command);
* ``mask_engines``: the token-mask engines of ``benchmarks.masks`` and their worker processes;
* ``llamacpp_model``: the llama.cpp model a benchmark's ``--backend llamacpp`` runs;
* ``llamacpp_peer``: llama-cpp-python as a peer engine, in a child process;
* ``llamacpp_server``: llama-cpp-python's OpenAI-compatible server, the peer of ``benchmarks.serve``;
* ``smoke_model``: the tiny random model the serving benchmarks' ``--smoke`` runs serve;
* ``ttfm``: time to first mask per phase, in one warm process (a tool, run by hand).
"""
