// stopstr.h: stop strings over streamed text, as the server applies them: the text
// ends before the first occurrence of any stop string, and while streaming, bytes that
// could still begin one are held back until it is clear they do not.
#ifndef VARENT_STOPSTR_H
#define VARENT_STOPSTR_H

#include <stddef.h>

typedef struct {
    const char *const *stop;  // [n] non-empty strings, owned by the caller
    int n;
    char *buf;                // all the text so far (cut at a hit)
    size_t len, cap, sent;    // bytes in buf; bytes handed out as safe
    int hit;                  // a stop string was found
} stopstr;

void stopstr_init(stopstr *s, const char *const *stop, int n);
// Appends text[0..n). *out/*out_n: the bytes that are now safe to emit (they follow
// what earlier calls handed out). Returns 1 when a stop string completed (generation
// should stop; the text before it has been handed out), 0 otherwise, -1 out of memory.
int stopstr_push(stopstr *s, const char *text, size_t n, const char **out, size_t *out_n);
// At the end without a hit: the bytes still held back.
void stopstr_flush(stopstr *s, const char **out, size_t *out_n);
void stopstr_free(stopstr *s);

#endif
