"""Isolated code execution. Not yet implemented: see the sandboxes issue."""
