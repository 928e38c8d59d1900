"""``info`` and ``verify``: their arguments (torch-free) and what runs them (report.py, imported when they run)."""
from __future__ import annotations

from . import choices


def add(subparsers) -> None:
    p = subparsers.add_parser(
        "info", help="describe a checkpoint without loading its weights",
        description="Describe a pre-quantized checkpoint (or a pre-cast text encoder), valid or not: format tag, "
                    "container, scheme, family, base model, quantized / dense tensor counts and sizes, the saving "
                    "against the dense model, recorded versions and filter settings, and whether it would load "
                    "(with the reasons when not). Reads the header (.safetensors) or the pickle index (.pt, "
                    "memory-mapped); a ComfyUI-native file is read whole (\"read: full read\"), as its scales are "
                    "checked value by value; weights are hashed only with --verify-fingerprint. Exit status: 0 when the file could be read (whatever its verdict), 2 on "
                    "error (missing, unreadable or unsafe bytes).")
    p.add_argument("file", metavar="FILE", help="a .safetensors or .pt checkpoint")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object instead of a table")
    p.add_argument("--verify-fingerprint", action="store_true",
                   help="also hash every quantized weight and compare with the recorded fingerprint "
                        "(reads the whole file)")
    p.set_defaults(func=run_info)

    v = subparsers.add_parser(
        "verify", help="check that a checkpoint matches a base model and scheme",
        description="Check a checkpoint against the base model and scheme you mean to load it as, with the "
                    "same rules as the ComfyUI loader (a text-encoder file: as Load Prequant Text Encoder, against "
                    "the component it records). Exit status: 0 valid, 1 invalid (every reason is "
                    "printed), 2 on error (missing, unreadable or unsafe file, unknown scheme or family).")
    v.add_argument("file", metavar="FILE", help="a .safetensors or .pt checkpoint")
    v.add_argument("--base", required=True, metavar="ID",
                   help="base model id, e.g. Tongyi-MAI/Z-Image-Turbo (the last path part, any case, also matches)")
    v.add_argument("--scheme", required=True, metavar="S", type=choices.scheme,
                   help="quantization scheme: " + ", ".join(choices.SCHEMES))
    v.add_argument("--min-features", type=int, default=None, metavar="N",
                   help="require this min_features setting (only Linears with in and out features >= N quantized)")
    v.add_argument("--family", default=None, metavar="F", choices=choices.accepted_families(),
                   help=f"require this model family ({', '.join(choices.accepted_families())})")
    v.add_argument("--verify-fingerprint", action="store_true",
                   help="also hash every quantized weight against the recorded fingerprint (reads the whole file)")
    v.add_argument("--json", action="store_true", help="print the full report as JSON instead of the verdict")
    v.set_defaults(func=run_verify)


def run_info(args) -> int:
    import json
    from ..report import info
    r = info(args.file, verify_fingerprint=args.verify_fingerprint)
    print(json.dumps(r.to_dict(), indent=2, sort_keys=True, allow_nan=False) if args.json else r.to_text())
    return 0


def run_verify(args) -> int:
    import json
    from ..request import Request
    from ..report import info
    from ..safe_text import escape
    req = Request(scheme=args.scheme, base_model_id=args.base, min_features=args.min_features,
                           family=args.family)
    r = info(args.file, req, verify_fingerprint=args.verify_fingerprint)
    if args.json:
        print(json.dumps(r.to_dict(), indent=2, sort_keys=True, allow_nan=False))
    else:
        print(f"{escape(r.file)}: {escape(r.verdict_line())}")
        for reason in r.reasons:
            print(f"  - {escape(reason)}")
        if r.valid and not args.verify_fingerprint:
            # VALID judges the metadata and structure; the weights' bytes were not hashed (Info says the same)
            print("  (weights not hashed: add --verify-fingerprint to check every quantized weight against the "
                  "recorded fingerprint; it reads the whole file)")
    return 0 if r.valid else 1
