"""Serving structgen over HTTP: ``structgen serve``.

:mod:`.engine` is the continuous-batching engine (one scheduler thread owns the model; requests
join and leave the running batch between steps), :mod:`.submission` what it takes and answers;
:mod:`.protocol` holds the OpenAI-compatible request and response models; :mod:`.app` is the
FastAPI application and :func:`.server.run_server` runs it with uvicorn. Importing this package
imports none of them (FastAPI, uvicorn and torch load only when a module that needs them is
imported).
"""
