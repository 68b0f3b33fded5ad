"""One package or module per family of layouts: how it runs (see runtime/backend.py)."""
