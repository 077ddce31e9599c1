"""gguf_np: an independent numpy GGUF writer/reader, block quantizers and dequantizers
(written from the GGUF/ggml format definitions), plus a tiny safetensors reader.
Used by tests/py/test_gguf.py to check `varent convert gguf`."""
import json
import struct

import numpy as np

# Metadata value types.
U8, I8, U16, I16, U32, I32, F32V, BOOL, STR, ARR, U64, I64, F64V = range(13)
_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32V: "<f",
           BOOL: "<?", U64: "<Q", I64: "<q", F64V: "<d"}

# Tensor types (ggml_type ids) and block geometry: (elements per block, bytes per block).
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q4_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 9, 12, 14, 30
BLOCK = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22),
         Q5_1: (32, 24), Q8_0: (32, 34), Q8_1: (32, 36), Q4_K: (256, 144), Q6_K: (256, 210)}


# ---- metadata values -------------------------------------------------------------

class Val:
    """A metadata value with an explicit GGUF type (arrays: vtype=ARR, elem=type)."""
    def __init__(self, vtype, value, elem=None):
        self.vtype, self.value, self.elem = vtype, value, elem


def _auto(v):
    if isinstance(v, Val):
        return v
    if isinstance(v, bool):
        return Val(BOOL, v)
    if isinstance(v, int):
        return Val(U32 if 0 <= v < 2**32 else I64, v)
    if isinstance(v, float):
        return Val(F32V, v)
    if isinstance(v, str):
        return Val(STR, v)
    if isinstance(v, (list, tuple)):
        items = [_auto(x) for x in v]
        elem = items[0].vtype if items else U32
        if elem == U32 and any(isinstance(x, int) and x < 0 for x in v):
            elem = I32
        return Val(ARR, [x.value if x.vtype != ARR else x for x in items], elem)
    raise TypeError(f"no GGUF type for {v!r}")


def _enc_str(s):
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _enc_value(vtype, value, elem=None):
    if vtype == STR:
        return _enc_str(value)
    if vtype == ARR:
        out = struct.pack("<IQ", elem, len(value))
        for x in value:
            if elem == ARR:
                x = _auto(x)
                out += _enc_value(ARR, x.value, x.elem)
            else:
                out += _enc_value(elem, x)
        return out
    return struct.pack(_SCALAR[vtype], value)


# ---- writer ----------------------------------------------------------------------

def write_gguf(path, kv, tensors, version=3, alignment=None):
    """kv: dict key -> python value or Val. tensors: list of (name, ggml_type,
    ne (fastest-first dims), raw bytes). Returns the byte string written."""
    kv = dict(kv)
    if alignment is not None:
        kv["general.alignment"] = Val(U32, alignment)
    align = alignment or 32
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for k, v in kv.items():
        v = _auto(v)
        head += _enc_str(k) + struct.pack("<I", v.vtype) + _enc_value(v.vtype, v.value, v.elem)
    offs, off = [], 0
    for name, ttype, ne, raw in tensors:
        offs.append(off)
        off += len(raw)
        off = (off + align - 1) // align * align
    for (name, ttype, ne, raw), o in zip(tensors, offs):
        head += _enc_str(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        head += struct.pack("<IQ", ttype, o)
    head += b"\0" * ((-len(head)) % align)
    body = bytearray()
    for (name, ttype, ne, raw), o in zip(tensors, offs):
        body += b"\0" * (o - len(body))
        body += raw
    data = head + bytes(body)
    with open(path, "wb") as f:
        f.write(data)
    return data


# ---- reader (for inspecting real files) -----------------------------------------

def read_gguf(path):
    """Returns (version, kv dict, tensors dict name -> (type, ne, bytes))."""
    buf = open(path, "rb").read()
    pos = [0]

    def take(n):
        b = buf[pos[0]:pos[0] + n]
        if len(b) != n:
            raise ValueError(f"truncated at {pos[0]}")
        pos[0] += n
        return b

    def rd(fmt):
        return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

    def rstr():
        return take(rd("<Q")).decode("utf-8", "replace")

    def rval(t):
        if t == STR:
            return rstr()
        if t == ARR:
            et, n = rd("<I"), rd("<Q")
            return [rval(et) for _ in range(n)]
        return rd(_SCALAR[t])

    if take(4) != b"GGUF":
        raise ValueError("bad magic")
    version, nt, nkv = rd("<I"), rd("<Q"), rd("<Q")
    kv = {}
    for _ in range(nkv):
        k = rstr()
        kv[k] = rval(rd("<I"))
    infos = []
    for _ in range(nt):
        name = rstr()
        nd = rd("<I")
        ne = [rd("<Q") for _ in range(nd)]
        infos.append((name, rd("<I"), ne, rd("<Q")))
    align = kv.get("general.alignment", 32)
    start = (pos[0] + align - 1) // align * align
    tensors = {}
    for name, t, ne, off in infos:
        be, bb = BLOCK.get(t, (1, 0))
        n = int(np.prod(ne)) // be * bb
        tensors[name] = (t, ne, buf[start + off:start + off + n])
    return version, kv, tensors


# ---- quantizers: float32 [n] -> block bytes ---------------------------------------

def _f16(x):
    return np.asarray(x, np.float32).astype(np.float16)


def quantize(x, ttype, rng=None):
    """Quantize a flat float32 array (length a multiple of the block size)."""
    x = np.asarray(x, np.float32).reshape(-1)
    if ttype == F32:
        return x.astype("<f4").tobytes()
    if ttype == F16:
        return x.astype("<f2").tobytes()
    if ttype == BF16:
        return (f32_to_bf16_bits(x)).astype("<u2").tobytes()
    be = BLOCK[ttype][0]
    b = x.reshape(-1, be)
    nb = b.shape[0]
    if ttype == Q8_0:
        d = _f16(np.abs(b).max(1) / 127)
        q = np.clip(np.round(b / np.maximum(d.astype(np.float32), 1e-30)[:, None]), -128, 127).astype(np.int8)
        return _pack([d.view(np.uint8).reshape(nb, 2), q.view(np.uint8)])
    if ttype in (Q4_0, Q5_0):
        bits = 4 if ttype == Q4_0 else 5
        off = 1 << (bits - 1)
        d = _f16(np.abs(b).max(1) / (off - 1))
        q = np.clip(np.round(b / np.maximum(d.astype(np.float32), 1e-30)[:, None]) + off, 0, 2 * off - 1)
        return _pack_nibbles(q.astype(np.uint32), [d], bits)
    if ttype in (Q4_1, Q5_1):
        bits = 4 if ttype == Q4_1 else 5
        mn, mx = b.min(1), b.max(1)
        d = _f16((mx - mn) / ((1 << bits) - 1))
        m = _f16(mn)
        q = np.clip(np.round((b - m.astype(np.float32)[:, None]) /
                             np.maximum(d.astype(np.float32), 1e-30)[:, None]), 0, (1 << bits) - 1)
        return _pack_nibbles(q.astype(np.uint32), [d, m], bits)
    if ttype == Q6_K:
        return _quant_q6k(b)
    raise ValueError(f"no quantizer for type {ttype}")


def _pack(parts):
    return np.concatenate([np.asarray(p, np.uint8) for p in parts], axis=1).tobytes()


def _pack_nibbles(q, scales, bits):
    """32-element blocks: low nibbles of elements 0..15 and 16..31 share bytes; the 5th
    bits go to a little-endian u32 (bit j = element j)."""
    nb = q.shape[0]
    qs = (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)
    parts = [s.view(np.uint8).reshape(nb, 2) for s in scales]
    if bits == 5:
        hi = ((q >> 4) & 1).astype(np.uint64)
        qh = (hi << np.arange(32, dtype=np.uint64)).sum(1).astype("<u4")
        parts.append(qh.view(np.uint8).reshape(nb, 4))
    parts.append(qs.astype(np.uint8))
    return _pack(parts)


def _quant_q6k(b):
    """Q6_K super-block of 256: 16 sub-blocks of 16 with int8 scales and an f16 d.
    Bytes: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16], d."""
    nb = b.shape[0]
    sub = b.reshape(nb, 16, 16)
    amax = np.abs(sub).max(2)
    d = _f16(amax.max(1) / (127 * 31) + 1e-12)
    sc = np.clip(np.round(amax / 31 / d.astype(np.float32)[:, None]), -128, 127).astype(np.int8)
    eff = d.astype(np.float32)[:, None] * sc.astype(np.float32)
    q = np.clip(np.round(sub / np.where(eff == 0, 1, eff)[:, :, None]), -32, 31).astype(np.int32) + 32
    q = q.reshape(nb, 256).astype(np.uint32)
    ql = np.zeros((nb, 128), np.uint32)
    qh = np.zeros((nb, 64), np.uint32)
    # Element index within a 128-half h: l + 32*k (k = 0..3, l = 0..31).
    for h in range(2):
        e = q[:, 128 * h:128 * (h + 1)].reshape(nb, 4, 32)
        ql[:, 64 * h:64 * h + 32] = (e[:, 0] & 15) | ((e[:, 2] & 15) << 4)
        ql[:, 64 * h + 32:64 * h + 64] = (e[:, 1] & 15) | ((e[:, 3] & 15) << 4)
        qh[:, 32 * h:32 * h + 32] = ((e[:, 0] >> 4) | ((e[:, 1] >> 4) << 2) |
                                     ((e[:, 2] >> 4) << 4) | ((e[:, 3] >> 4) << 6))
    return _pack([ql.astype(np.uint8), qh.astype(np.uint8), sc.view(np.uint8),
                  d.view(np.uint8).reshape(nb, 2)])


# ---- dequantizers: block bytes -> float32 ----------------------------------------

def dequantize(raw, ttype, n):
    """Decode n elements. Arithmetic in float32 in the order the format defines:
    q*d (+ m) for 32-blocks, (d*scale)*q for Q6_K."""
    raw = np.frombuffer(raw, np.uint8)
    if ttype == F32:
        return raw.view("<f4")[:n].astype(np.float32)
    if ttype == F16:
        return raw.view("<f2")[:n].astype(np.float32)
    if ttype == BF16:
        return (raw.view("<u2")[:n].astype(np.uint32) << 16).view(np.float32)
    be, bb = BLOCK[ttype]
    blk = raw[:n // be * bb].reshape(-1, bb)
    f16 = lambda a: a.copy().view("<f2").astype(np.float32).reshape(-1)
    if ttype == Q8_0:
        d = f16(blk[:, 0:2])
        return (blk[:, 2:].view(np.int8).astype(np.float32) * d[:, None]).reshape(-1)
    if ttype in (Q4_0, Q4_1, Q5_0, Q5_1):
        has_m = ttype in (Q4_1, Q5_1)
        five = ttype in (Q5_0, Q5_1)
        d = f16(blk[:, 0:2])
        p = 2
        if has_m:
            m = f16(blk[:, 2:4])
            p = 4
        qs = blk[:, p + 4 * five:].astype(np.int32)
        q = np.concatenate([qs & 15, qs >> 4], axis=1)
        if five:
            qh = blk[:, p:p + 4].copy().view("<u4").astype(np.int64).reshape(-1)
            q |= (((qh[:, None] >> np.arange(32)) & 1) << 4).astype(np.int32)
        if not has_m:
            q -= 16 if five else 8
        y = q.astype(np.float32) * d[:, None]
        if has_m:
            y = y + m[:, None]
        return y.astype(np.float32).reshape(-1)
    if ttype == Q6_K:
        ql = blk[:, 0:128].astype(np.int32)
        qh = blk[:, 128:192].astype(np.int32)
        sc = blk[:, 192:208].view(np.int8).astype(np.float32)
        d = f16(blk[:, 208:210])
        out = np.zeros((blk.shape[0], 256), np.float32)
        for h in range(2):
            lo = ql[:, 64 * h:64 * h + 64]
            hi = qh[:, 32 * h:32 * h + 32]
            e = [(lo[:, :32] & 15) | ((hi & 3) << 4),
                 (lo[:, 32:] & 15) | (((hi >> 2) & 3) << 4),
                 (lo[:, :32] >> 4) | (((hi >> 4) & 3) << 4),
                 (lo[:, 32:] >> 4) | (((hi >> 6) & 3) << 4)]
            for k in range(4):
                for half in range(2):  # 16-element sub-blocks
                    sidx = 8 * h + 2 * k + half
                    qv = (e[k][:, 16 * half:16 * half + 16] - 32).astype(np.float32)
                    ds = (d * sc[:, sidx]).astype(np.float32)
                    out[:, 128 * h + 32 * k + 16 * half:128 * h + 32 * k + 16 * half + 16] = ds[:, None] * qv
        return out.reshape(-1)
    raise ValueError(f"no dequantizer for type {ttype}")


def f32_to_bf16_bits(x):
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (finite inputs)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


# ---- Llama Q/K row permutation (what llama.cpp's HF->GGUF converter applies) -----

def permute_qk(w, n_head):
    """Rows of each head go from rotate-half order [first half, second half] to
    interleaved pairs (row 2i = old i, row 2i+1 = old i + d/2)."""
    rows = w.shape[0]
    return (w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


# ---- safetensors reader ------------------------------------------------------------

def read_safetensors(path):
    """Returns dict name -> numpy array (F32, F16; BF16 widened to float32)."""
    buf = open(path, "rb").read()
    n = struct.unpack("<Q", buf[:8])[0]
    hdr = json.loads(buf[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = buf[base + a:base + b]
        dt = info["dtype"]
        if dt == "F32":
            arr = np.frombuffer(raw, "<f4")
        elif dt == "F16":
            arr = np.frombuffer(raw, "<f2").astype(np.float32)
        elif dt == "BF16":
            arr = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"dtype {dt}")
        out[name] = arr.reshape(info["shape"])
    return out, hdr
