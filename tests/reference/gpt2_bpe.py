"""An independent byte-level BPE encoder, for checking varent's tokenizer.json path.

It reads the vocabulary and merges straight from a GGUF file (tokenizer.ggml.*), not
from the tokenizer.json varent's converter wrote, and pre-tokenizes with a hand-written
scanner that follows GPT-2's split pattern

    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

alternative by alternative (no regex engine), optionally after HF's Digits pre-tokenizer
with individual_digits (every numeric character on its own). Only the Python standard
library is used: unicodedata for the letter/number classes.
"""
import unicodedata

CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")


def _cls(c):
    cat = unicodedata.category(c)
    if c.isspace():
        return "S"
    if cat[0] == "L":
        return "L"
    if cat[0] == "N":
        return "N"
    return "O"


def _run(s, i, cls):
    while i < len(s) and _cls(s[i]) == cls:
        i += 1
    return i


def gpt2_split(s):
    """Pre-tokens of s by the GPT-2 pattern, tried in its alternative order."""
    out, i, n = [], 0, len(s)
    while i < n:
        end = None
        if s[i] == "'":
            for c in CONTRACTIONS:
                if s.startswith(c, i + 1):
                    end = i + 1 + len(c)
                    break
        if end is None:
            for cls in ("L", "N", "O"):  # ' ?X+' for each class, space first
                if s[i] == " " and i + 1 < n and _cls(s[i + 1]) == cls:
                    end = _run(s, i + 1, cls)
                    break
                if _cls(s[i]) == cls:
                    end = _run(s, i, cls)
                    break
        if end is None:  # whitespace: \s+(?!\S), else \s+
            j = _run(s, i, "S")
            end = j if j == n or j - 1 == i else j - 1
        out.append(s[i:end])
        i = end
    return out


def digits_split(s):
    """HF Digits(individual_digits=True): each numeric character is its own piece."""
    out, cur = [], ""
    for c in s:
        if unicodedata.category(c)[0] == "N":
            if cur:
                out.append(cur)
            out.append(c)
            cur = ""
        else:
            cur += c
    if cur:
        out.append(cur)
    return out


def byte_to_unicode():
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class ByteLevelBPE:
    def __init__(self, tokens, merges, specials=(), individual_digits=False):
        self.vocab = {t: i for i, t in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.specials = sorted(specials, key=len, reverse=True)  # longest match first
        self.digits = individual_digits
        self.b2u = byte_to_unicode()

    @classmethod
    def from_gguf_kv(cls, kv):
        tokens = kv["tokenizer.ggml.tokens"]
        types = kv.get("tokenizer.ggml.token_type", [1] * len(tokens))
        specials = [t for t, ty in zip(tokens, types) if ty in (3, 4)]  # control, user-defined
        return cls(tokens, kv["tokenizer.ggml.merges"], specials, individual_digits=kv.get("tokenizer.ggml.pre") == "smollm")

    def _bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            best, at = None, -1
            for k in range(len(parts) - 1):
                r = self.ranks.get((parts[k], parts[k + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, k
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        return [self.vocab[p] for p in parts]

    def _encode_plain(self, text):
        ids = []
        pieces = digits_split(text) if self.digits else [text]
        for piece in pieces:
            for pre in gpt2_split(piece):
                word = "".join(self.b2u[b] for b in pre.encode("utf-8"))
                ids += self._bpe(word)
        return ids

    def encode(self, text, special=True):
        if not special or not self.specials:
            return self._encode_plain(text)
        ids, i, start = [], 0, 0
        while i < len(text):
            hit = next((t for t in self.specials if text.startswith(t, i)), None)
            if hit is None:
                i += 1
                continue
            ids += self._encode_plain(text[start:i]) + [self.vocab[hit]]
            i += len(hit)
            start = i
        return ids + self._encode_plain(text[start:])
