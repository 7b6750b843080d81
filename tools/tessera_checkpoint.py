#!/usr/bin/env python3
"""Read and verify Tessera checkpoints without Tessera: numpy and safetensors
only, written from docs/checkpoint-format.md (format version 1).

  tessera_checkpoint.py list   CKPT                 tensors, shapes, dtypes, who wrote it
  tessera_checkpoint.py verify CKPT                 every checksum and size; exit 1 on damage
  tessera_checkpoint.py export CKPT OUT.safetensors [--with-optimizer-state] [--torch OUT.pt]

CKPT is a checkpoint directory (holding index.json) or a root holding step-*
checkpoints (the newest complete one is read). As a module:

  ck = Checkpoint("ckpt")           # index checked (format, version, index checksum, coverage)
  w = ck.tensor("block0.w1")        # main weights, reassembled, every range's checksum verified
  m = ck.tensor("block0.w1", "exp_avg")
  ck.verify()                       # every file: size, header, ranges, file checksum
"""
import argparse
import json
import os
import re
import struct
import sys

import numpy as np

FORMAT, VERSION = "tessera-checkpoint", 1
MASK = (1 << 64) - 1
DTYPES = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "F16": np.dtype("<f2")}  # BF16: read as raw u16
SIZES = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2}


class CheckpointError(Exception):
    """A checkpoint that is damaged, incomplete or of an unknown version."""


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def checksum64(data) -> int:
    """The format's checksum (docs/checkpoint-format.md, section 4.1); numpy over whole blocks."""
    data = memoryview(data).cast("B")
    L = len(data)
    full = L // 32 * 32
    lanes = [0x6A09E667F3BCC908, 0xBB67AE8584CAA73B, 0x3C6EF372FE94F82B, 0xA54FF53A5F1D36F1]
    if full:
        w = np.frombuffer(data[:full], dtype="<u8").reshape(-1, 4)
        with np.errstate(over="ignore"):
            for i in range(4):  # the lanes are independent; each is a sequential recurrence
                col = (w[:, i] * np.uint64(0x87C37B91114253D5)).tolist()
                h = lanes[i]
                for x in col:
                    h ^= x
                    h = ((h << 31) | (h >> 33)) & MASK
                    h = (h * 0x4CF5AD432745937F + 0x52DCE729) & MASK
                lanes[i] = h
    tail = bytes(data[full:]) + bytes(32 - (L - full))
    h = _splitmix64((L * 0x9E3779B97F4A7C15) & MASK)
    for i in range(4):
        word = int.from_bytes(tail[8 * i:8 * i + 8], "little")
        h = _splitmix64(h ^ lanes[i] ^ _splitmix64((word + i) & MASK))
    return h


def _hex(v):
    return f"{v:016x}"


def _canonical(obj):
    return json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode("utf-8")


def resolve(path):
    """The checkpoint `path` names: itself if it holds index.json, else the newest complete step-* under it."""
    if os.path.isfile(os.path.join(path, "index.json")):
        return path
    steps = []
    if os.path.isdir(path):
        for name in os.listdir(path):
            m = re.fullmatch(r"step-(\d+)", name)
            if m and os.path.isfile(os.path.join(path, name, "index.json")):
                steps.append((int(m.group(1)), name))
    if not steps:
        raise CheckpointError(f"no complete checkpoint at or under '{path}'")
    return os.path.join(path, max(steps)[1])


class Checkpoint:
    def __init__(self, path):
        self.path = resolve(path)
        where = os.path.join(self.path, "index.json")
        try:
            with open(where, "rb") as f:
                index = json.loads(f.read().decode("utf-8"))
        except (OSError, ValueError, RecursionError) as e:
            raise CheckpointError(f"{where}: {e}") from None
        # Any field of the wrong type or missing is one message, never a traceback.
        try:
            self._check_index(index, where)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError, OverflowError) as e:
            raise CheckpointError(f"{where}: malformed index ({type(e).__name__}: {e})") from None
        m = re.fullmatch(r"step-(\d+)", os.path.basename(os.path.normpath(self.path)))
        if m and int(m.group(1)) != self.index["step"]:
            raise CheckpointError(f"{where}: the directory {os.path.basename(os.path.normpath(self.path))} holds the "
                                  f"index of step {self.index['step']} (moved or copied by hand?)")

    def _check_index(self, index, where):
        if not isinstance(index, dict) or index.get("format") != FORMAT:
            raise CheckpointError(f"{where}: not a Tessera checkpoint index")
        # The version first (the spec's order): another version may checksum its index another way.
        if index.get("version") != VERSION:
            raise CheckpointError(f"{where}: index version {index.get('version')!r}, this reader reads {VERSION}")
        # Required: without it an edit that keeps the structure valid (a transposed
        # shape, a dropped tensor) cannot be told from the saved index.
        if "index_checksum" not in index:
            raise CheckpointError(f"{where}: the index has no index_checksum (removed, or written before 2026-11-30); "
                                  f"an unverified index is refused")
        want = index.pop("index_checksum")
        if _hex(checksum64(_canonical(index))) != want:
            raise CheckpointError(f"{where}: the index does not match its checksum (edited or damaged)")
        self.index = index
        self.states = list(index["states"])
        world = index["world"]
        files = index["files"]
        if not isinstance(files, list) or len(files) != world:
            raise CheckpointError(f"{where}: 'files' does not list one file per rank of the writing world")
        for f in files:
            n = f["name"]
            if not n or "/" in n or ".." in n:
                raise CheckpointError(f"{where}: file name {n!r} is not a plain name in the checkpoint directory")
        self.files = files
        for name, t in index["tensors"].items():
            if t["dtype"] not in SIZES:
                raise CheckpointError(f"{where}: tensor '{name}': dtype {t['dtype']!r} is not one a checkpoint holds")
            numel, esize = int(np.prod(t["shape"], dtype=np.int64)), SIZES[t["dtype"]]
            cover = []
            for p in t["pieces"]:
                if not 0 <= p["file"] < world or len(p["ranges"]) != len(self.states):
                    raise CheckpointError(f"{where}: tensor '{name}': a piece names no file or lacks a range per state")
                for s, r in zip(self.states, p["ranges"]):
                    if r["key"] != f"{name}/{s}" or r["bytes"] != p["count"] * esize:
                        raise CheckpointError(f"{where}: tensor '{name}': range {r['key']!r} does not match its piece")
                if p["count"]:
                    cover.append((p["begin"], p["count"]))
            at = 0
            for b, c in sorted(cover):
                if b != at:
                    raise CheckpointError(f"{where}: tensor '{name}': its pieces {'overlap' if b < at else 'leave a gap'} at element {min(b, at)}")
                at = b + c
            if at != numel:
                raise CheckpointError(f"{where}: tensor '{name}': its pieces cover {at} of {numel} elements")
        self._sizes_checked = False

    # ---- reading ------------------------------------------------------------------
    def names(self):
        return sorted(self.index["tensors"])

    def _open(self, q):
        f = self.files[q]
        p = os.path.join(self.path, f["name"])
        try:
            size = os.path.getsize(p)
        except OSError as e:
            raise CheckpointError(f"checkpoint '{self.path}': rank file {f['name']}: {e.strerror}") from None
        if size != f["bytes"]:
            raise CheckpointError(f"checkpoint '{self.path}': rank file {f['name']} holds {size} bytes, the index says {f['bytes']}")
        return p

    def tensor(self, name, state="main"):
        """State `state` of tensor `name`, whole, as a numpy array (BF16: raw uint16); checksums verified."""
        t = self.index["tensors"].get(name)
        if t is None:
            raise CheckpointError(f"checkpoint '{self.path}' has no tensor '{name}'")
        if state not in self.states:
            raise CheckpointError(f"checkpoint '{self.path}' holds states {self.states}, not '{state}'")
        s = self.states.index(state)
        dt = DTYPES.get(t["dtype"], np.dtype("<u2"))
        out = np.empty(int(np.prod(t["shape"], dtype=np.int64)), dtype=dt)
        for p in t["pieces"]:
            if not p["count"]:
                continue
            r = p["ranges"][s]
            path = self._open(p["file"])
            with open(path, "rb") as f:
                f.seek(r["offset"])
                raw = f.read(r["bytes"])
            if len(raw) != r["bytes"]:
                raise CheckpointError(f"checkpoint '{self.path}': {self.files[p['file']]['name']}: '{r['key']}' is cut short")
            if _hex(checksum64(raw)) != r["checksum"]:
                raise CheckpointError(f"checkpoint '{self.path}': {self.files[p['file']]['name']}: '{r['key']}' does not match its checksum (damaged)")
            out[p["begin"]:p["begin"] + p["count"]] = np.frombuffer(raw, dtype=dt)
        return out.reshape(t["shape"])

    def verify(self):
        """Every rank file: its size, its safetensors header against the index, every range's and the file's checksum."""
        ranges_of = [[] for _ in self.files]
        for name, t in self.index["tensors"].items():
            for p in t["pieces"]:
                for r in p["ranges"]:
                    if r["bytes"]:  # an empty piece has no entry in its file (spec, section 2.1)
                        ranges_of[p["file"]].append(r)
        for q, f in enumerate(self.files):
            path = self._open(q)
            with open(path, "rb") as fh:
                raw = fh.read()
            if len(raw) < 8:
                raise CheckpointError(f"checkpoint '{self.path}': {f['name']} has no safetensors header")
            n = struct.unpack("<Q", raw[:8])[0]
            try:
                header = json.loads(raw[8:8 + n].decode("utf-8"))
            except ValueError:
                raise CheckpointError(f"checkpoint '{self.path}': {f['name']}: the safetensors header is not JSON") from None
            if not isinstance(header, dict):
                raise CheckpointError(f"checkpoint '{self.path}': {f['name']}: the safetensors header is not an object")
            meta = header.get("__metadata__")
            meta = meta if isinstance(meta, dict) else {}
            for k, want in (("format", "tessera"), ("rank", str(q)), ("world", str(self.index["world"])),
                            ("step", str(self.index["step"]))):
                if meta.get(k) != want:
                    raise CheckpointError(f"checkpoint '{self.path}': {f['name']}: its header's __metadata__ '{k}' is "
                                          f"{meta.get(k)!r}; the index says '{want}'")
            try:
                entries = sorted((v["data_offsets"][0] + 8 + n, v["data_offsets"][1] - v["data_offsets"][0], k)
                                 for k, v in header.items() if k != "__metadata__")
            except (TypeError, KeyError, IndexError):
                raise CheckpointError(f"checkpoint '{self.path}': {f['name']}: an entry of the safetensors header is malformed") from None
            by_key = {r["key"]: r for r in ranges_of[q]}
            digests = bytearray()
            for off, size, key in entries:
                r = by_key.get(key)
                if r is None or r["offset"] != off or r["bytes"] != size:
                    raise CheckpointError(f"checkpoint '{self.path}': {f['name']}: entry '{key}' is not where the index says")
                d = checksum64(raw[off:off + size])
                if _hex(d) != r["checksum"]:
                    raise CheckpointError(f"checkpoint '{self.path}': {f['name']}: '{key}' does not match its checksum (damaged)")
                digests += d.to_bytes(8, "little")
            if len(entries) != len(ranges_of[q]):
                raise CheckpointError(f"checkpoint '{self.path}': {f['name']} holds {len(entries)} entries, the index {len(ranges_of[q])}")
            if _hex(checksum64(raw[:8 + n] + bytes(digests))) != f["checksum"]:
                raise CheckpointError(f"checkpoint '{self.path}': {f['name']} does not match its checksum (damaged)")

    def export(self, out, with_optimizer_state=False, torch_out=None):
        """One safetensors file of whole tensors ('name', and 'name/state' with optimizer state), as tessera-consolidate writes."""
        from safetensors.numpy import save_file
        tensors = {}
        for name in self.names():
            for s in self.states if with_optimizer_state else ["main"]:
                if self.index["tensors"][name]["dtype"] == "BF16":
                    raise CheckpointError(f"'{name}' is BF16, which numpy cannot hold; read it with tensor() as raw uint16")
                tensors[name if s == "main" else f"{name}/{s}"] = np.ascontiguousarray(self.tensor(name, s))
        save_file(tensors, out, metadata={"format": "pt", "step": str(self.index["step"])})
        if torch_out:
            import torch
            torch.save({k: torch.from_numpy(v.copy()) for k, v in tensors.items()}, torch_out)
        return tensors


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for c in ("list", "verify"):
        sub.add_parser(c).add_argument("checkpoint")
    e = sub.add_parser("export")
    e.add_argument("checkpoint")
    e.add_argument("out")
    e.add_argument("--with-optimizer-state", action="store_true")
    e.add_argument("--torch", metavar="OUT.pt")
    a = ap.parse_args(argv)
    try:
        ck = Checkpoint(a.checkpoint)
        x = ck.index
        if a.cmd == "list":
            print(f"{ck.path}: step {x['step']}, {x['world']} rank file(s), strategy {x['strategy']}, wrapper "
                  f"{x.get('wrapper', '?')}, optimizer {x['optimizer']} (states {', '.join(ck.states)})")
            for name in ck.names():
                t = x["tensors"][name]
                print(f"  {name:32s} {t['dtype']:5s} {str(t['shape']):16s} {len(t['pieces'])} piece(s)")
        elif a.cmd == "verify":
            ck.verify()
            print(f"{ck.path}: {len(ck.files)} file(s), {len(x['tensors'])} tensors x {len(ck.states)} states: every checksum matches")
        else:
            t = ck.export(a.out, a.with_optimizer_state, a.torch)
            print(f"{ck.path}: {len(t)} tensors into {a.out}")
    except CheckpointError as err:
        print(f"tessera: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
