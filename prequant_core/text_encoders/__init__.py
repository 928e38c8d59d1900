"""Unsloth's pre-cast text encoders, what is specific to them in one place: ``sources`` (where one may come from:
Unsloth's ``<Model>-<component>-FP8`` names, presets; pure, like ``load.sources``), ``checks`` (a file's verdict:
Unsloth's checks and the claimed class's whole structure; ``load.opening.judge`` hands encoder files to it),
``tokenizer`` (the tokenizer a file lacks, where ComfyUI takes it from a state dict). The encoder records themselves
are ``families/encoders.py``; writing one is ``builder/text_encoder.py``."""
