"""What the host gives a load, in one object: built once on the ComfyUI side (``nodes/load_node.py``,
``nodes/te_node.py``) and once by each library or command-line entry, then passed down whole: the pipeline, the Hub
download and its watched transfer, the route and the open all read the same settings under the same names."""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

ProgressFn = Callable[[int, int], None]  # (bytes done, bytes in all) of a transfer, every poll
StatusFn = Callable[[str], None]  # a short line for the user while they wait (connecting, downloading, ...)
CancelFn = Callable[[], None]  # called every poll; raises to stop (ComfyUI's interrupt)
HOST_HEADROOM = 256 * 2**20  # Python objects, the model skeleton, placement temporaries


@dataclasses.dataclass
class Guard:
    """How the memory guard (``load/memory_check.py``) judges a load. ``device``: the load device (None / "cpu": host
    rule only)."""
    device: object = None
    lowvram: bool = False  # the host streams weights to the device: only the host must hold the whole model
    device_reclaimable: int = 0  # device bytes the caller frees before loading (other models it will unload)
    available: Callable[[], int] | None = None  # host budget in bytes; default ``host_available``
    device_free: Callable[[object], int] | None = None  # device -> free bytes; default ``cuda_free``
    headroom: int = HOST_HEADROOM


@dataclasses.dataclass(frozen=True)
class LoadContext:
    model_dirs: tuple[str, ...] = ()  # the folders a local file may lie in (a Hub file's folder is added for it)
    download_dir: str | None = None  # a Hub file is stored in its origin folder here; None: the Hugging Face cache
    search_dirs: tuple[str, ...] = ()  # other folders a downloaded file may already be stored in
    token: str | None = None  # None: the client's default (HF_TOKEN, then the stored login)
    progress: ProgressFn | None = None
    status: StatusFn | None = None
    cancel: CancelFn | None = None
    memory: Guard | None = dataclasses.field(default_factory=Guard)  # None: no check

    @classmethod
    def of(cls, *, model_dirs: Iterable[str] = (), search_dirs: Iterable[str] = (), **kw) -> "LoadContext":
        """The context with any iterables of folders taken as tuples."""
        return cls(model_dirs=tuple(model_dirs), search_dirs=tuple(search_dirs), **kw)

    def say(self, text: str) -> None:
        if self.status is not None:
            self.status(text)

    def poll(self) -> None:
        """Give the host its chance to cancel (raises then)."""
        if self.cancel is not None:
            self.cancel()

    def show(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)

    def within(self, *dirs: str) -> "LoadContext":
        """The same context with ``dirs`` also allowed for local files."""
        return dataclasses.replace(self, model_dirs=(*self.model_dirs, *dirs))
