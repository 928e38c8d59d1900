"""Bounds on a ``.pt`` archive checked before any unpickler sees it.

``torch.load(weights_only=True)`` and the legacy reader never run code from a file, but a few bytes can still
make them take the server down:

* a dict key (or set member) that is a tuple nested a few hundred thousand levels deep: hashing it recurses in C
  until the stack overflows (SIGSEGV, the whole ComfyUI process), before any Python check runs;
* a deflated ``data.pkl`` that inflates to gigabytes (torch.save never compresses a record);
* protocol-5 buffer opcodes (``BYTEARRAY8`` allocates the length it declares before reading it);
* millions of one-byte opcodes (each pushes an object), or integers thousands of digits long.

``scan`` walks the opcodes once, without building any object, tracking how deeply each value on the stack is
nested (memo references included) and refuses the archive as soon as a bound is crossed. The bounds sit far above
what ``torch.save`` writes for any real transformer (measured in tests: a state dict nests about 8 levels, and a
checkpoint of thousands of quantized layers stays under a few hundred thousand opcodes).
"""
from __future__ import annotations

import pickletools
import struct
import zipfile

from ..errors import CorruptCheckpointError
from ..units import human_bytes

MAX_PICKLE_BYTES = 32 * 2**20
MAX_OPCODES = 2_000_000
MAX_DEPTH = 64
MAX_INT = 2**64  # sizes, strides, offsets and storage counts all fit in 64 bits
MAX_ARCHIVE_ENTRIES = 200_000
# Never written by torch.save; BYTEARRAY8 allocates its declared length up front, the buffer opcodes read
# out-of-band data the loader does not have.
REFUSED_OPCODES = {"BYTEARRAY8", "NEXT_BUFFER", "READONLY_BUFFER"}
_MUTATORS = {"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD"}
_MEMO_PUT = {"PUT", "BINPUT", "LONG_BINPUT"}
_NEW_CONTAINERS = {"EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET"}
_LEAF = [0]
_MEMO_GET = {"GET", "BINGET", "LONG_BINGET"}
_FIX = "Download the file again, or rebuild it with Build Prequant Checkpoint; a file like this was not written " \
       "by torch.save."


def _refuse(path: str, message: str, found: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"Refused to read this .pt file: {message}. Nothing from it was loaded.",
                                  path=path, found=found, fix=_FIX)


def check_zip_index(fileobj, path: str) -> list:
    """Every archive entry stored (not compressed), named once, within bounds; read from the central directory.
    Returns the entries (``zipfile.ZipInfo``) it checked."""
    try:
        end = zipfile._EndRecData(fileobj)  # noqa: SLF001 - the entry count before any entry is parsed
        if end is not None and end[zipfile._ECD_ENTRIES_TOTAL] > MAX_ARCHIVE_ENTRIES:  # noqa: SLF001
            raise _refuse(path, "the archive lists too many entries",
                          f"{end[zipfile._ECD_ENTRIES_TOTAL]} entries (limit {MAX_ARCHIVE_ENTRIES})")  # noqa: SLF001
        fileobj.seek(0)
        with zipfile.ZipFile(fileobj) as z:
            infos = z.infolist()
    except CorruptCheckpointError:
        raise
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error, NotImplementedError) as e:
        raise CorruptCheckpointError("The .pt file is damaged or truncated (its zip index cannot be read).",
                                     path=path, found=f"{type(e).__name__}: {str(e)[:200]}",
                                     fix="Download or build the file again.") from None
    seen = set()
    for i in infos:
        if i.compress_type != zipfile.ZIP_STORED:
            raise _refuse(path, "an archive entry is compressed (torch.save stores every entry as is)",
                          f"'{i.filename[:80]}' compressed with method {i.compress_type}, "
                          f"{human_bytes(i.compress_size)} inflating to {human_bytes(i.file_size)}")
        if i.filename in seen:
            raise _refuse(path, "an archive entry name appears twice", f"'{i.filename[:80]}'")
        seen.add(i.filename)
    return infos


def zip_index(fh) -> list:
    """``check_zip_index`` of an ``OpenedFile``, read through its handle once and kept on it: the memory guard,
    the pickle bounds and the reader share one parse of the central directory."""
    if fh.zip_infos is None:
        with fh.reader() as raw:
            fh.zip_infos = check_zip_index(raw, fh.path)
    return fh.zip_infos


_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then (after 22 bytes) file name and extra field lengths


def checked_pickle(fh) -> bytes:
    """``data.pkl`` of an ``OpenedFile``'s archive, found in its (checked) zip index and read by ``pread``, after
    the index and the pickle passed every bound here: what ``torch.load`` may then unpickle. torch's zip reader
    names records under the first entry's folder (``archive/data.pkl``), so that is the record read here too."""
    infos = zip_index(fh)
    prefix = infos[0].filename.split("/", 1)[0] if infos else ""
    entry = next((i for i in infos if i.filename == f"{prefix}/data.pkl"), None)
    if entry is None:
        raise CorruptCheckpointError("The .pt archive has no data.pkl.", path=fh.path, fix="Download the file again.")
    if entry.file_size > MAX_PICKLE_BYTES:
        raise _refuse(fh.path, "its pickle is larger than any checkpoint's",
                      f"data.pkl of {human_bytes(entry.file_size)} (limit {human_bytes(MAX_PICKLE_BYTES)})")
    head = fh.read_at(entry.header_offset, _LOCAL_HEADER.size)
    sig, name_len, extra_len = _LOCAL_HEADER.unpack(head) if len(head) == _LOCAL_HEADER.size else (b"", 0, 0)
    start = entry.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    if sig != b"PK\x03\x04" or start + entry.file_size > fh.size:
        raise CorruptCheckpointError("The .pt archive's data.pkl cannot be read.", path=fh.path,
                                     found=f"a damaged local header at byte {entry.header_offset}",
                                     fix="Download or build the file again.")
    data = fh.read_at(start, entry.file_size)
    scan(data, fh.path)
    return data


def open_checked(fh) -> tuple:
    """(torch's zip reader, data.pkl bytes) for an ``OpenedFile``, once the zip index and the pickle passed every
    bound here: what the legacy reader may then unpickle (it reads records through torch's reader)."""
    import torch
    zip_index(fh)
    try:
        reader = torch._C.PyTorchFileReader(fh.reader())
    except RuntimeError as e:
        raise CorruptCheckpointError("The .pt file is damaged or truncated (torch cannot open the archive).",
                                     path=fh.path, found=(str(e).strip().splitlines() or ["RuntimeError"])[0][:200],
                                     fix="Download or build the file again.") from None
    data = read_pickle_record(reader, fh.path)
    scan(data, fh.path)
    return reader, data


def read_pickle_record(reader, path: str) -> bytes:
    """``data.pkl`` from torch's own zip reader (what ``torch.load`` will read), after bounding its size."""
    if not reader.has_record("data.pkl"):
        raise CorruptCheckpointError("The .pt archive has no data.pkl.", path=path, fix="Download the file again.")
    n = reader.get_record_size("data.pkl")
    if n > MAX_PICKLE_BYTES:
        raise _refuse(path, "its pickle is larger than any checkpoint's",
                      f"data.pkl of {human_bytes(n)} (limit {human_bytes(MAX_PICKLE_BYTES)})")
    try:
        return bytes(reader.get_record("data.pkl"))
    except RuntimeError as e:
        raise CorruptCheckpointError("The .pt archive's data.pkl cannot be read.", path=path,
                                     found=str(e).splitlines()[0][:200] if str(e) else "RuntimeError",
                                     fix="Download or build the file again.") from None


# per opcode: (kind, values popped below a MARK or in all, values pushed); kind decides the depth rule
_SKIP, _MARK, _PUT, _GET, _DUP, _MUTATE, _LEAF_OP, _BUILD, _REFUSE = range(9)


def _table() -> dict:
    t = {}
    for op in pickletools.opcodes:
        before, after, name = op.stack_before, op.stack_after, op.name
        marked = pickletools.markobject in before
        below = before.index(pickletools.markobject) if marked else len(before)
        if name in REFUSED_OPCODES:
            kind = _REFUSE
        elif name == "MARK":
            kind = _MARK
        elif name in ("STOP", "PROTO", "FRAME"):
            kind = _SKIP
        elif name in _MEMO_PUT or name == "MEMOIZE":
            kind = _PUT
        elif name in _MEMO_GET:
            kind = _GET
        elif name == "DUP":
            kind = _DUP
        elif name in _MUTATORS:
            kind = _MUTATE
        elif not before and name not in _NEW_CONTAINERS:
            kind = _LEAF_OP
        else:
            kind = _BUILD
        t[op.code] = (kind, name, marked, below, len(after))
    return t


_OPS = _table()


def scan(data: bytes, path: str) -> dict:
    """Walk the pickle's opcodes without executing them; raise ``CorruptCheckpointError`` past any bound.

    Returns counts (opcodes, deepest nesting) for tests and benchmarks.
    """
    if len(data) > MAX_PICKLE_BYTES:
        raise _refuse(path, "its pickle is larger than any checkpoint's", f"{human_bytes(len(data))}")
    stack: list = []  # one [depth] cell per value; containers filled later share their cell with the memo
    marks: list[int] = []
    memo: dict = {}
    count = deepest = 0
    ops, leaf, max_int = _OPS, _LEAF, MAX_INT
    try:
        for op, arg, pos in pickletools.genops(data):
            count += 1
            kind, name, marked, below, n_after = ops[op.code]
            if kind == _LEAF_OP:
                if type(arg) is int and not -max_int < arg < max_int:
                    raise _refuse(path, "its pickle holds an integer too large for any size or offset",
                                  f"a {arg.bit_length()}-bit integer at byte {pos}")
                stack.append(leaf)  # one shared cell: millions of pushed scalars cost one pointer each
                if count > MAX_OPCODES:
                    break
                continue
            if count > MAX_OPCODES:
                break
            if kind == _SKIP:
                continue
            if kind == _MARK:
                marks.append(len(stack))
                continue
            if kind == _PUT:
                if not stack:
                    raise ValueError(f"{name} on an empty stack")
                memo[arg if name != "MEMOIZE" else len(memo)] = stack[-1]
                continue
            if kind == _GET:
                if arg not in memo:
                    raise ValueError(f"memo key {arg} missing")
                stack.append(memo[arg])
                continue
            if kind == _REFUSE:
                raise _refuse(path, f"its pickle uses the {name} opcode (protocol-5 buffers), which torch.save "
                              "never writes", f"{name} at byte {pos}")
            if marked:
                if not marks:
                    raise ValueError(f"{name} without a MARK")
                m = marks.pop() - below
                if m < 0:
                    raise ValueError(f"{name} on a too short stack")
            else:
                m = len(stack) - below
                if m < 0:
                    raise ValueError(f"{name} on a too short stack")
            popped = stack[m:]
            del stack[m:]
            if kind == _DUP:
                stack += [popped[0], popped[0]]
                continue
            if kind == _MUTATE:
                cell = popped[0]
                if cell is leaf:
                    raise ValueError(f"{name} fills a value that is not a container")
                inner = max((c[0] for c in popped[1:]), default=-1)
                if inner + 1 > cell[0]:
                    cell[0] = inner + 1
                depth = cell[0]
                stack.append(cell)
            else:
                depth = max((c[0] for c in popped), default=-1) + 1
                for _ in range(n_after):
                    stack.append([depth])
            if depth > deepest:
                deepest = depth
                if depth > MAX_DEPTH:
                    raise _refuse(path, "its pickle nests values deeper than any checkpoint does",
                                  f"nesting deeper than {MAX_DEPTH} levels at byte {pos}")
    except CorruptCheckpointError:
        raise
    except (ValueError, IndexError, KeyError, TypeError, struct.error, UnicodeDecodeError, OverflowError,
            MemoryError, RecursionError) as e:
        raise CorruptCheckpointError("The .pt file's pickle is malformed.", path=path,
                                     found=f"{type(e).__name__}: {str(e)[:200]}",
                                     fix="Download or build the file again.") from None
    if count > MAX_OPCODES:
        raise _refuse(path, "its pickle has more opcodes than any checkpoint's", f"more than {MAX_OPCODES:,} opcodes")
    return {"opcodes": count, "depth": deepest}
