"""`python -m runtime.planner profile ...`: measure a model on this machine and store the profile.

    python -m runtime.planner profile --instance-type local --kind gpt --n-layer 4 --n-embd 128 \\
        --microbatch-size 8 --store var/profiles
"""

from __future__ import annotations

import argparse
import sys

from runtime.config import DEVICES, ModelSpec
from runtime.planner.profile import ProfileStore, profile_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.planner")
    sub = parser.add_subparsers(dest="command", required=True)
    prof = sub.add_parser("profile", help="measure per-layer F/I/W times and memory, store them")
    prof.add_argument("--instance-type", default="local", help="name the profile is stored under")
    prof.add_argument("--kind", default="gpt", choices=["gpt", "mlp"])
    prof.add_argument("--n-layer", type=int, default=4)
    prof.add_argument("--n-embd", type=int, default=64)
    prof.add_argument("--n-head", type=int, default=4)
    prof.add_argument("--seq-len", type=int, default=64)
    prof.add_argument("--vocab-size", type=int, default=512)
    prof.add_argument("--microbatch-size", type=int, default=8)
    prof.add_argument("--threads", type=int, default=1)
    prof.add_argument("--repeats", type=int, default=5)
    prof.add_argument("--store", default="var/profiles")
    prof.add_argument("--device", choices=DEVICES, default="cpu", help="measure on the CPU or this host's first GPU")
    args = parser.parse_args(argv)
    spec = ModelSpec(
        kind=args.kind,
        n_layer=args.n_layer,
        n_embd=args.n_embd,
        n_head=args.n_head,
        seq_len=args.seq_len,
        vocab_size=args.vocab_size,
    )
    profile = profile_model(
        spec,
        microbatch_size=args.microbatch_size,
        instance_type=args.instance_type,
        threads=args.threads,
        repeats=args.repeats,
        on=args.device,
    )
    path = ProfileStore(args.store).save(profile)
    total = sum(sum(x) for x in profile.fiw())
    print(f"{len(profile.layers)} layers, {total * 1000:.2f} ms F+I+W per micro-batch on {profile.device.name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
