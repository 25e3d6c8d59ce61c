#!/usr/bin/python3
"""Write a random batch file for reference_run.py (and forja's parity tests).

Each row is an SFT-like sample: a prompt whose labels are -100, an answer that is trained on,
and right padding (labels -100). With --pack each row instead holds several documents packed
back to back, with position_ids restarting at 0 and segment_ids 1, 2, ... (0 = padding); the
first token of every document gets label -100 so that no counted target crosses a document
boundary (reference_run.py rejects files that break this rule).

    /usr/bin/python3 tests/reference/make_batch.py --vocab 97 --out batch.json [--pack]
"""

import argparse
import json

import numpy as np


def sft_row(rng, vocab, seq_len, pad_id):
    """One padded sample: (input_ids, labels, real_length)."""
    n = int(rng.randint(max(2, seq_len // 2), seq_len + 1))  # real tokens in [S/2, S]
    ids = rng.randint(0, vocab, size=n).tolist()
    prompt = int(rng.randint(1, max(2, n // 2)))  # at least position 0 is prompt (masked)
    labels = [-100] * prompt + ids[prompt:]
    pad = seq_len - n
    return ids + [pad_id] * pad, labels + [-100] * pad, n


def packed_row(rng, vocab, seq_len, pad_id, docs):
    ids, labels, pos, seg = [], [], [], []
    for d in range(1, docs + 1):
        room = seq_len - len(ids)
        if room < 3:
            break
        n = int(rng.randint(3, max(4, min(room, seq_len // docs + 2) + 1)))
        n = min(n, room)
        doc = rng.randint(0, vocab, size=n).tolist()
        prompt = int(rng.randint(1, max(2, n // 2)))  # the first token is always masked
        ids += doc
        labels += [-100] * prompt + doc[prompt:]
        pos += list(range(n))
        seg += [d] * n
    pad = seq_len - len(ids)
    return (ids + [pad_id] * pad, labels + [-100] * pad, pos + list(range(pad)), seg + [0] * pad)


def make_batch(vocab, micro_batches=2, batch_size=2, seq_len=11, seed=0, pack=False, docs=2):
    rng = np.random.RandomState(seed)  # own state: deterministic, independent of global numpy
    pad_id = vocab - 1
    out = []
    for _ in range(micro_batches):
        mb = {"input_ids": [], "labels": []}
        if pack:
            mb["position_ids"], mb["segment_ids"] = [], []
        for _ in range(batch_size):
            if pack:
                i, l, p, s = packed_row(rng, vocab, seq_len, pad_id, docs)
                mb["position_ids"].append(p)
                mb["segment_ids"].append(s)
            else:
                i, l, _ = sft_row(rng, vocab, seq_len, pad_id)
            mb["input_ids"].append(i)
            mb["labels"].append(l)
        out.append(mb)
    return {"micro_batches": out}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=11)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pack", action="store_true", help="pack several documents per row (position/segment ids)")
    ap.add_argument("--docs", type=int, default=2, help="documents per packed row")
    a = ap.parse_args(argv)
    b = make_batch(a.vocab, a.micro_batches, a.batch_size, a.seq_len, a.seed, a.pack, a.docs)
    with open(a.out, "w") as f:
        json.dump(b, f)
        f.write("\n")
    print(f"wrote {a.out}: {a.micro_batches} micro-batches of {a.batch_size} x {a.seq_len}{' (packed)' if a.pack else ''}")


if __name__ == "__main__":
    main()
