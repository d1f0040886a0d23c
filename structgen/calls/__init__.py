"""Tool calling: tools as JSON Schemas, the call formats of model families, and the grammar and
reading of an output that may hold calls.

* :mod:`structgen.calls.formats`: :class:`~structgen.calls.formats.Tool`, the call formats
  (hermes, json, hermes_json, llama3, mistral; :func:`~structgen.calls.formats.register_tool_format`
  adds one), each with its grammar, its parser and its stream reader, and format detection
  from a tokenizer;
* :mod:`structgen.calls.scan`: the text scanning the formats' stream readers share (calls
  read out of an output as it grows);
* :mod:`structgen.calls.triggered`: free text with constrained regions that a trigger opens
  (the grammar shape of calls amid text);
* :mod:`structgen.calls.structural_tag`: XGrammar-style structural tags over those regions;
* :mod:`structgen.calls.plan`: one output's plan (:func:`~structgen.calls.plan.plan_output`:
  tools, tool choice, reasoning and an answer constraint -> one compiled grammar) and its
  reading, whole (:meth:`~structgen.calls.plan.OutputPlan.split`) or as it streams
  (:class:`~structgen.calls.plan.OutputStream`).

This stage sits between the masks and generation: it builds grammars and reads text, and never
imports torch; :mod:`structgen.generation` and :mod:`structgen.serving` use it.
"""
