// tok_util.c: growable buffers, UTF-8 helpers and the GPT-2 byte<->unicode map.
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

int tbuf_reserve(tbuf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t nc = b->cap ? b->cap * 2 : 256;
    while (nc < b->n + extra + 1) nc *= 2;
    char *p = realloc(b->p, nc);
    if (!p) return -1;
    b->p = p;
    b->cap = nc;
    return 0;
}

// Always keeps a NUL after the content so buffers can be handed out as strings.
int tbuf_put(tbuf *b, const void *s, size_t n) {
    if (tbuf_reserve(b, n) < 0) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int id_list_push(id_list *l, int id) {
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 64;
        int *p = realloc(l->p, (size_t)nc * sizeof *p);
        if (!p) return -1;
        l->p = p;
        l->cap = nc;
    }
    l->p[l->n++] = id;
    return 0;
}

int piece_list_add(piece_list *l, const char *p, size_t len) {
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 64;
        const char **pp = realloc(l->p, (size_t)nc * sizeof *pp);
        if (!pp) return -1;
        l->p = pp;
        size_t *ln = realloc(l->len, (size_t)nc * sizeof *ln);
        if (!ln) return -1;
        l->len = ln;
        l->cap = nc;
    }
    l->p[l->n] = p;
    l->len[l->n++] = len;
    return 0;
}

// Strict decoder: rejects overlongs, surrogates and code points past U+10FFFF.
int tok_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    if (!n) return 0;
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (!len || c > 0xF4 || (size_t)len > n) return 0;
    uint32_t v = c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    if ((len == 3 && v < 0x800) || (len == 4 && (v < 0x10000 || v > 0x10FFFF)) ||
        (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return len;
}

int tok_utf8_encode(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// GPT-2's map: printable Latin-1 bytes stand for themselves, the other bytes take
// code points 256, 257, ... in byte order, so every byte has a visible character.
void tok_bytemap_init(uint16_t byte_to_cp[256], int16_t cp_to_byte[512]) {
    for (int i = 0; i < 512; i++) cp_to_byte[i] = -1;
    int next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_to_cp[b] = (uint16_t)(printable ? b : next++);
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}
