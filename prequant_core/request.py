"""What a load asks for, as records the planners, the judges and the nodes share: where the file may come from
(a ``Candidate`` of ``Candidates``, a ``Preset``), what it must be (``Request``) and what a judge says of it
(``Verdict``). No I/O: ``load/`` and ``text_encoders/`` both read them, so neither reaches into the other for them."""
from __future__ import annotations

import dataclasses

from .errors import HubError

PRESET_NONE = "none"


@dataclasses.dataclass(frozen=True)
class Candidate:
    place: str  # "local" | "hub"
    origin: str  # "path" | "hub_repo" | "preset" | "family"
    scheme: str | None = None
    path: str | None = None  # local
    repo: str | None = None  # hub
    filenames: tuple[str, ...] = ()  # hub, in the order they are tried
    revision: str | None = None  # hub; None means the default branch

    def describe(self) -> str:
        if self.place == "local":
            return f"local file {self.path}"
        rev = f"@{self.revision}" if self.revision else ""
        return f"Hub repo {self.repo}{rev} ({', '.join(self.filenames)})"


@dataclasses.dataclass(frozen=True)
class Candidates:
    """Where a checkpoint may come from, in the order tried (``plan``): no I/O was done to make it."""
    candidates: tuple[Candidate, ...]
    notes: tuple[str, ...] = ()  # steps that were skipped and why
    family: str | None = None  # the family asked for (input or preset), for validation
    scheme: str | None = None  # the scheme asked for (input or preset); None: not chosen

    def __bool__(self) -> bool:
        return bool(self.candidates)

    def __iter__(self):
        return iter(self.candidates)

    def __len__(self):
        return len(self.candidates)


@dataclasses.dataclass(frozen=True)
class Preset:
    label: str
    repo: str
    scheme: str
    family: str


def pick(label: str | None, listed: list[Preset], what: str, why: str) -> Preset | None:
    """The preset named ``label`` among ``listed`` (None for "none"); an unknown one is refused, listing them."""
    if not label or label.strip().lower() == PRESET_NONE:
        return None
    for p in listed:
        if p.label == label:
            return p
    raise HubError(f"Unknown {what} '{label}'.", expected=", ".join([PRESET_NONE] + [p.label for p in listed]),
                   found=str(label), fix=f"Pick a preset from the list ({why}).")


@dataclasses.dataclass
class Request:
    scheme: str | None = None
    base_model_id: str | None = None
    min_features: int | None = None
    exclude_tokens: list[str] | None = None  # None: the scheme's defaults for the file's family
    family: str | None = None
    component: str = "transformer"
    # None: not checked (Unsloth checks the recorded fast_accum only when the caller forces a value)
    fast_accum: bool | None = None


@dataclasses.dataclass
class Verdict:
    ok: bool
    reasons: list[str]
    notes: list[str] = dataclasses.field(default_factory=list)  # accepted, but worth showing (Prequant Info)
