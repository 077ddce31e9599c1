"""Reference port of llama2.c's tokenizer encode (run.c): read tokenizer.bin, add the
dummy-prefix space, look up each UTF-8 character (byte fallback: id = byte + 3),
then repeatedly merge the adjacent pair whose concatenation has the best score
(leftmost on ties). No BOS/EOS. Independent of varent's C code.

Usage: llama2c_tokenizer.py TOKENIZER.BIN VOCAB_SIZE < texts.jsonl  (one JSON string a
line); prints one JSON id array a line."""
import json
import struct
import sys


def load(path, vocab_size):
    with open(path, "rb") as f:
        data = f.read()
    (max_len,) = struct.unpack_from("<i", data, 0)
    off = 4
    vocab, scores = [], []
    for _ in range(vocab_size):
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        vocab.append(data[off:off + n])
        scores.append(score)
        off += n
    lookup = {}
    for i, piece in enumerate(vocab):
        lookup.setdefault(piece, i)  # llama2.c's bsearch finds one of equal keys; first is fine
    return vocab, scores, lookup


def utf8_chars(b):
    """Split bytes the way run.c does: a lead byte plus up to 3 continuation bytes."""
    out, i = [], 0
    while i < len(b):
        j = i + 1
        while j < len(b) and (b[j] & 0xC0) == 0x80 and j - i < 4:
            j += 1
        out.append(b[i:j])
        i = j
    return out


def encode(text, vocab, scores, lookup):
    b = text.encode("utf-8")
    ids = []
    if b:
        ids.append(lookup[b" "])
    for ch in utf8_chars(b):
        if ch in lookup:
            ids.append(lookup[ch])
        else:
            ids.extend(c + 3 for c in ch)
    while True:
        best, best_id, best_i = -1e10, -1, -1
        for i in range(len(ids) - 1):
            merged = vocab[ids[i]] + vocab[ids[i + 1]]
            j = lookup.get(merged)
            if j is not None and scores[j] > best:
                best, best_id, best_i = scores[j], j, i
        if best_i < 0:
            break
        ids[best_i:best_i + 2] = [best_id]
    return ids


def main():
    vocab, scores, lookup = load(sys.argv[1], int(sys.argv[2]))
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(encode(json.loads(line), vocab, scores, lookup)))


if __name__ == "__main__":
    main()
