"""The JSON Schema front-end: document model, schema algebra, lowering to the grammar IR,
diagnostics, number and string formats."""
