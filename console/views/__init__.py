"""Console views, one module per page (CONVENTIONS.md: thin function views, logic on models)."""
