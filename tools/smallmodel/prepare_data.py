#!/usr/bin/env python3
"""Stage 1: build the small model's text data (pure Python).

    python3 prepare_data.py --data DIR --out WORK/data [--train-n N] [--heldout-per-steps K]

DIR holds copies of ../shared/data/gsm8k/train.jsonl and
../shared/data/text/tinyshakespeare/input.txt (any layout; see common.find_data_files).
Writes to --out:
  problems_train.jsonl, problems_heldout.jsonl  generated problems (gen_problems.py)
  problems_val.jsonl                            validation problems (choosing among variants)
  problems_ops1.jsonl, problems_short.jsonl     curriculum pools (gen_problems.POOLS; --pools)
  gsm8k_train.jsonl                             GSM8K train, calculator annotations stripped
  shakespeare_train.txt, shakespeare_heldout.txt   tinyshakespeare split (held-out tail = last 10%)
  data_meta.json                                counts, seeds, sha256 of the inputs
"""

import argparse
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import gen_problems  # noqa: E402


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def main(argv=None):
    ap = argparse.ArgumentParser(description="build the small model's data")
    ap.add_argument("--data", required=True, help="dir with gsm8k train.jsonl and tinyshakespeare input.txt")
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-n", type=int, default=gen_problems.TRAIN_N)
    ap.add_argument("--heldout-per-steps", type=int, default=gen_problems.HELDOUT_PER_STEPS)
    ap.add_argument("--heldout-frac", type=float, default=0.9, help="Shakespeare train fraction")
    ap.add_argument("--pools", default=",".join(gen_problems.POOLS),
                    help="curriculum pools to write (comma list of gen_problems.POOLS names; empty: none)")
    ap.add_argument("--pool-n", type=int, default=0, help="problems per pool (0: the pool's documented size)")
    a = ap.parse_args(argv)
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    gsm_path, sh_path = common.find_data_files(a.data)

    gsm = []
    for r in common.read_jsonl(gsm_path):
        gsm.append({"question": r["question"].strip(), "answer": common.clean_gsm8k_answer(r["answer"])})
    common.write_jsonl(os.path.join(a.out, "gsm8k_train.jsonl"), gsm)

    with open(sh_path, encoding="utf-8") as f:
        text = f.read()
    sh_train, sh_held = common.split_shakespeare(text, a.heldout_frac)
    for name, t in (("shakespeare_train.txt", sh_train), ("shakespeare_heldout.txt", sh_held)):
        with open(os.path.join(a.out, name), "w", encoding="utf-8") as f:
            f.write(t)

    train = gen_problems.generate_train(a.train_n)
    held, dropped = gen_problems.generate_heldout(train, a.heldout_per_steps)
    bad = gen_problems.check_disjoint(train, held)
    if bad:
        sys.exit("prepare_data: held-out problems share %d questions with train" % len(bad))
    common.write_jsonl(os.path.join(a.out, "problems_train.jsonl"), train)
    common.write_jsonl(os.path.join(a.out, "problems_heldout.jsonl"), held)
    val, val_dropped = gen_problems.generate_validation(train, held)
    if gen_problems.check_disjoint(train + held, val):
        sys.exit("prepare_data: validation problems share questions with train or held-out")
    common.write_jsonl(os.path.join(a.out, "problems_val.jsonl"), val)
    pools = {}
    for name in [x for x in a.pools.split(",") if x]:
        if name not in gen_problems.POOLS:
            sys.exit("prepare_data: unknown pool %r (known: %s)" % (name, ", ".join(gen_problems.POOLS)))
        items, pdrop = gen_problems.generate_pool(name, held + val, a.pool_n or None)
        if gen_problems.check_disjoint(items, held) or gen_problems.check_disjoint(items, val):
            sys.exit("prepare_data: pool %s shares questions with held-out or validation" % name)
        common.write_jsonl(os.path.join(a.out, "problems_%s.jsonl" % name), items)
        pools[name] = {"n": len(items), "seed": gen_problems.POOLS[name][0], "dropped": pdrop,
                       "carry_share": round(gen_problems.carry_share(items), 4)}

    meta = {"gsm8k_train": {"path": os.path.basename(gsm_path), "sha256": sha256(gsm_path), "n": len(gsm)},
            "tinyshakespeare": {"sha256": sha256(sh_path), "chars": len(text), "train_chars": len(sh_train),
                                "heldout_chars": len(sh_held), "heldout_frac": a.heldout_frac},
            "problems": {"train_n": len(train), "train_seed": gen_problems.TRAIN_SEED,
                         "heldout_n": len(held), "heldout_seed": gen_problems.HELDOUT_SEED,
                         "heldout_per_steps": a.heldout_per_steps, "heldout_dropped": dropped,
                         "disjoint": True, "val_n": len(val), "val_seed": gen_problems.VAL_SEED,
                         "val_dropped": val_dropped, "pools": pools}}
    with open(os.path.join(a.out, "data_meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("prepare_data: gsm8k %d, shakespeare %d train / %d held-out chars, problems %d train / %d held-out "
          "(%d dropped), pools %s, %.1fs" % (len(gsm), len(sh_train), len(sh_held), len(train), len(held), dropped,
                                             pools or "none", time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
