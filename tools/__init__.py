"""Development helpers shared by tests, the demo and bench/: tiny real-architecture models, a headless and a
served ComfyUI. Not part of the installed pack."""
