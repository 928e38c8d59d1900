"""Inspecting checkpoints (``info``) and checking them against a request (``verify``)."""
