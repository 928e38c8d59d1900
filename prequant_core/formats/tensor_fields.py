"""The boundary for what a quantized tensor from a stranger's file carries besides its bytes.

A pickled torchao tensor subclass brings its attributes with it: torch restores the pickled ``__dict__`` as it is, so
a file can add any attribute (a ConvRot group the metadata never declares) or put a string where torchao expects its
quantization kwargs, and that reaches arithmetic at sampling time. Every quantized tensor a reader returns passes
here first: exactly the attributes its class has (its codec's ``fields``), each of the type and value range this pack's code handles; anything
else is a ``CorruptCheckpointError`` naming the file, the tensor, the field, what was expected and what was found.
Shapes, dtypes and values of the parts are checked next by ``validate_tensors``.
"""
from __future__ import annotations

from ..errors import CorruptCheckpointError
from ..schemes import registry
from ..schemes.field_checks import Bad as _Bad
from ..safe_text import escape


def check_fields(key: str, t, path: str) -> None:
    """Every attribute ``t`` carries is one its class has, of the type this pack handles. (Attributes this pack
    sets itself, a ConvRot group, the legacy reader's fingerprint origin, are set after this check: a file never
    supplies them.)"""
    codec = registry.codec_of(t)
    if codec is None:
        return
    cls = codec.type_name
    have = set(getattr(t, "__dict__", {}))
    extra = sorted(have - codec.fields)
    try:
        if extra:
            raise _Bad(extra[0], f"only the attributes a torchao {cls} has", f"an extra attribute '{escape(extra[0][:60])}'")
        codec.check_fields(t)
    except _Bad as b:
        raise CorruptCheckpointError(
            f"Quantized tensor '{escape(key[:80])}' ({cls}) carries a field this pack does not accept: "
            f"'{escape(b.field)}'. A file only supplies numbers; what they mean comes from the format.", path=path,
            expected=b.expected, found=str(b.found), fix="Download or build the file again from a trusted source.") \
            from None
