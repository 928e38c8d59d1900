"""Loading a checkpoint, one step a module."""
