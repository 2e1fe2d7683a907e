#!/usr/bin/env python3
"""export_torch.py: a PyTorch MLP's state_dict to a .safetensors file that solder loads, and back.

The safetensors format is written and read here with json + struct alone (the `safetensors`
package is not needed): an 8-byte little-endian header length, a compact JSON header
{"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...} padded with
spaces to a multiple of 8 bytes, then the raw little-endian bytes. See docs/io.md.

The model is the digits MLP, torch.nn.Sequential(
    Linear(64, 256), ReLU(), Dropout(0.1), Linear(256, 128), ReLU(), Dropout(0.1), Linear(128, 10)),
so its tensors are named as PyTorch's state_dict names them: 0.weight [256, 64], 0.bias [256],
3.weight [128, 256], 3.bias [128], 6.weight [10, 128], 6.bias [10] (weights are [out, in]).

  python3 examples/export_torch.py write  mlp.safetensors [--seed 0] [--state-dict m.pt] [--train EPOCHS]
  python3 examples/export_torch.py verify mlp.safetensors [--seed 0] [--state-dict m.pt] [--train EPOCHS]
  python3 examples/export_torch.py show   mlp.safetensors

`write` builds the model (seeded; or loads a saved state_dict; optionally trains it on
examples/data/digits.csv) and saves it. `verify` rebuilds the same model and checks that the
file holds exactly its tensors, bit for bit (exit status 1 if not). `show` lists a file.
"""

import argparse
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
import torch

# safetensors dtype name -> (numpy little-endian dtype, torch dtype). solder loads F32 only;
# other dtypes are written as they are, for other readers.
DTYPES = {
    "F32": ("<f4", torch.float32),
    "F64": ("<f8", torch.float64),
    "F16": ("<f2", torch.float16),
    "I64": ("<i8", torch.int64),
    "I32": ("<i4", torch.int32),
    "I16": ("<i2", torch.int16),
    "I8": ("i1", torch.int8),
    "U8": ("u1", torch.uint8),
    "BOOL": ("?", torch.bool),
}
TORCH_TO_NAME = {t: name for name, (_, t) in DTYPES.items()}

DIGITS_CSV = Path(__file__).resolve().parent / "data" / "digits.csv"


def build_mlp(seed):
    """The digits MLP with PyTorch's default initialization, drawn from torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(128, 10))


def train_on_digits(model, epochs, seed):
    """A few epochs of Adam on 80% of digits.csv (pixels / 16); prints the other 20%'s accuracy."""
    data = np.loadtxt(DIGITS_CSV, delimiter=",", dtype=np.float32)
    x = torch.from_numpy(data[:, :64] / 16.0)
    y = torch.from_numpy(data[:, 64].astype(np.int64))
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(y), generator=gen)
    n_test = round(0.2 * len(y))
    test, train = order[:n_test], order[n_test:]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(epochs):
        model.train()
        for batch in train[torch.randperm(len(train), generator=gen)].split(32):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(x[test]).argmax(1) == y[test]).float().mean().item()
    print(f"trained {epochs} epochs: test accuracy {accuracy:.4f} on {n_test} samples")


def make_model(args):
    model = build_mlp(args.seed)
    if args.state_dict:
        model.load_state_dict(torch.load(args.state_dict, map_location="cpu"))
    if args.train:
        train_on_digits(model, args.train, args.seed)
    return model


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} in the given order; floating tensors become F32. Atomic (tmp + rename)."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.is_floating_point():
            t = t.to(torch.float32)
        if t.dtype not in TORCH_TO_NAME:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype} has no safetensors name here")
        dtype = TORCH_TO_NAME[t.dtype]
        data = t.numpy().astype(DTYPES[dtype][0], copy=False).tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the reference writer does
    tmp = str(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in chunks:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate key in the header")
    return dict(pairs)


def read_safetensors(path):
    """({name: tensor}, metadata) in header order, checked as solder checks a file: the tensors'
    data_offsets cover the data exactly and match their dtype and shape."""
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(raw[8:8 + n].decode("utf-8"), object_pairs_hook=_no_duplicates)
    data = raw[8 + n:]
    metadata = header.pop("__metadata__", {})
    covered = 0
    for name, info in sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
        begin, end = info["data_offsets"]
        if begin != covered or end < begin or end > len(data):
            raise ValueError(f"{path}: tensor {name!r} has bad data_offsets [{begin}, {end}]")
        covered = end
    if covered != len(data):
        raise ValueError(f"{path}: {len(data) - covered} bytes after the last tensor belong to no tensor")
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        stored = np.dtype(DTYPES[info["dtype"]][0])
        values = np.frombuffer(data[begin:end], dtype=stored)
        if values.size != int(np.prod(info["shape"], dtype=np.int64)):
            raise ValueError(f"{path}: tensor {name!r}: {end - begin} bytes do not fit shape {info['shape']}")
        native = values.astype(stored.newbyteorder("="))  # a copy, in this machine's byte order
        tensors[name] = torch.from_numpy(native.reshape(info["shape"]))
    return tensors, metadata


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["write", "verify", "show"])
    parser.add_argument("file")
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed for the initialization (default 0)")
    parser.add_argument("--state-dict", help="a torch.save'd state_dict to load instead of the fresh model")
    parser.add_argument("--train", type=int, default=0, metavar="EPOCHS", help="train on digits.csv first")
    args = parser.parse_args()

    if args.command == "show":
        tensors, metadata = read_safetensors(args.file)
        for name, t in tensors.items():
            print(f"{name:24} {TORCH_TO_NAME[t.dtype]:5} {list(t.shape)}")
        print("metadata:", metadata)
        return 0

    state = make_model(args).state_dict()
    if args.command == "write":
        write_safetensors(args.file, state, {"format": "pt"})
        print(f"wrote {len(state)} tensors to {args.file}")
        return 0

    tensors, _ = read_safetensors(args.file)
    ok = set(tensors) == set(state)
    if not ok:
        print(f"names differ: file {sorted(tensors)}, model {sorted(state)}")
    for name, want in state.items():
        got = tensors.get(name)
        want = want.detach().contiguous()
        same = (got is not None and got.dtype == want.dtype and got.shape == want.shape
                and got.numpy().tobytes() == want.numpy().tobytes())
        print(f"{name:24} {list(want.shape)!s:12} {'bitwise equal' if same else 'DIFFERENT'}")
        ok = ok and same
    print("verify:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
