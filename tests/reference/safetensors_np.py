"""safetensors_np: read and write safetensors files with numpy only.

Format: 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
then the raw little-endian tensor bytes (offsets are relative to the data start).
BF16 has no numpy dtype: it is kept as uint16 bit patterns and widened to f32 by a
16-bit shift (exact); f32 -> bf16 rounds to nearest even, like torch.
A model directory is either one model.safetensors or shards listed in
model.safetensors.index.json; CheckpointReader hides the difference.
"""
import json
import mmap
import os
import struct

import numpy as np

# safetensors dtype -> numpy storage dtype (BF16 stored as raw uint16 bits)
_NP = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
       "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def bf16_to_f32(bits):
    """uint16 bf16 bit patterns -> float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """float32 -> uint16 bf16 bits, round to nearest, ties to even; NaN stays a quiet NaN."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    # add 0x7FFF + lsb-of-result, then truncate; in place since models can be huge.
    # uint32 cannot wrap here: only NaN bit patterns are within 0x8000 of 2^32
    t = u >> 16
    t &= np.uint32(1)
    t += np.uint32(0x7FFF)
    t += u
    t >>= 16
    rounded = t.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def to_storage(x, dtype):
    """float array -> numpy array holding the bytes of safetensors dtype `dtype`."""
    if dtype == "BF16":
        return f32_to_bf16(x)
    return np.ascontiguousarray(x, dtype=_NP[dtype])


def read_header(path):
    """(header dict without __metadata__, metadata dict, absolute data start offset)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
    meta = hdr.pop("__metadata__", {}) or {}
    return hdr, meta, 8 + n


class SafeTensorsFile:
    """One .safetensors file, memory-mapped; tensors are read lazily."""

    def __init__(self, path):
        self.path = path
        self.header, self.metadata, self.start = read_header(path)
        self._f = open(path, "rb")
        self._mm = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ)

    def keys(self):
        return list(self.header)

    def info(self, name):
        e = self.header[name]
        return e["dtype"], tuple(e["shape"])

    def raw(self, name):
        """The stored array (BF16 as uint16), a read-only view of the mapped file."""
        e = self.header[name]
        b, end = e["data_offsets"]
        arr = np.frombuffer(self._mm, dtype=_NP[e["dtype"]], count=(end - b) // np.dtype(_NP[e["dtype"]]).itemsize,
                            offset=self.start + b)
        return arr.reshape(e["shape"])

    def get(self, name, dtype=np.float32):
        """The tensor as a fresh array of `dtype` (floats widened exactly)."""
        dt, _ = self.info(name)
        a = self.raw(name)
        if dt == "BF16":
            a = bf16_to_f32(a)
        return np.array(a, dtype=dtype)

    def close(self):
        self._mm.close()
        self._f.close()


class CheckpointReader:
    """All tensors of an HF model directory (single file or sharded via the index)."""

    def __init__(self, model_dir):
        idx = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx) as f:
                wmap = json.load(f)["weight_map"]
            files = {fn: SafeTensorsFile(os.path.join(model_dir, fn)) for fn in sorted(set(wmap.values()))}
            self._where = {name: files[fn] for name, fn in wmap.items()}
            for fn, st in files.items():  # the index must agree with the shards' headers
                for k in st.keys():
                    if wmap.get(k) != fn:
                        raise ValueError(f"{fn}: tensor {k} not mapped to it by the index")
        else:
            st = SafeTensorsFile(os.path.join(model_dir, "model.safetensors"))
            self._where = {k: st for k in st.keys()}

    def keys(self):
        return list(self._where)

    def __contains__(self, name):
        return name in self._where

    def info(self, name):
        return self._where[name].info(name)

    def get(self, name, dtype=np.float32):
        return self._where[name].get(name, dtype)


class StreamWriter:
    """Writes one safetensors file tensor by tensor, so huge models never sit in RAM.

    specs: list of (name, dtype, shape) in file order; then call write(name, array) in that
    order, possibly several times per tensor with consecutive row blocks; close() checks sizes.
    """

    def __init__(self, path, specs, metadata=None):
        hdr, off = {}, 0
        if metadata:
            hdr["__metadata__"] = {k: str(v) for k, v in metadata.items()}
        self._order, self._sizes = [], {}
        for name, dtype, shape in specs:
            n = int(np.prod(shape, dtype=np.int64)) * np.dtype(_NP[dtype]).itemsize
            hdr[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
            self._order.append(name)
            self._sizes[name] = (dtype, n)
            off += n
        js = json.dumps(hdr, separators=(",", ":")).encode()
        js += b" " * (-len(js) % 8)  # pad so the data starts 8-byte aligned, as safetensors does
        self.path = path
        self._tmp = path + ".tmp"
        self._f = open(self._tmp, "wb")
        self._f.write(struct.pack("<Q", len(js)) + js)
        self._i, self._done = 0, 0

    def write(self, name, x):
        """Append (part of) tensor `name`; x is float data, converted to the spec's dtype."""
        if self._i >= len(self._order) or self._order[self._i] != name:
            raise ValueError(f"tensor {name} written out of order")
        dtype, n = self._sizes[name]
        b = to_storage(x, dtype).tobytes()
        self._f.write(b)
        self._done += len(b)
        if self._done > n:
            raise ValueError(f"tensor {name}: too much data")
        if self._done == n:
            self._i, self._done = self._i + 1, 0

    def close(self):
        if self._i != len(self._order):
            raise ValueError(f"{self.path}: missing tensor data from {self._order[self._i]}")
        self._f.close()
        os.replace(self._tmp, self.path)


def save_file(path, tensors, dtype="F32", metadata=None):
    """Write {name: float array} (or {name: (dtype, array)}) to one safetensors file."""
    items = [(k, v if isinstance(v, tuple) else (dtype, v)) for k, v in tensors.items()]
    w = StreamWriter(path, [(k, dt, np.shape(a)) for k, (dt, a) in items], metadata)
    for k, (dt, a) in items:
        w.write(k, a)
    w.close()
