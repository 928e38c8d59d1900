"""ComfyUI-independent core of ComfyUI-Prequant: read, validate, build and place pre-quantized transformers."""
__version__ = "0.1.0"
