"""Private helpers. Nothing here is public API."""
