"""A scheme this pack does not ship, as one module: "q8toy", int8 weights (int8's torchao config and quantizer)
whose Unsloth-style rule asks both dims of a layer to divide by 32. tests/schemes/test_scheme_registry.py adds it with one
registry line and follows it through naming, building, validation, Info and the matmul choice."""
from prequant_core.schemes import int8
from prequant_core.schemes.record import Scheme

SCHEME = Scheme(name="q8toy", kind="int8", codec=int8.CODEC, suffix="-Q8TOY", config=int8.config, quantize=int8.quantize,
                require_divisible=32, granularity_field="int8_granularity", exclude_base_tokens=int8.BASE_EXCLUDE,
                min_capability=(7, 5))
