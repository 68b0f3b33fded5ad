"""The driver side of every run: one controller, one actor group, pure policies."""
