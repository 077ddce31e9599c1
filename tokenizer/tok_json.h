// tok_json.h: fast tokenizer.json reader (see tok_json.c).
#ifndef VARENT_TOK_JSON_H
#define VARENT_TOK_JSON_H

#include <cjson/cJSON.h>
#include "tokenizer/tok_internal.h"

typedef struct {
    tbuf arena;           // unescaped NUL-terminated strings
    uint32_t *voff;       // [nv] vocab key offsets in arena
    int *vid;             // [nv] vocab ids
    int nv;
    uint32_t *ma, *mb;    // [nm] merge parts; mb = UINT32_MAX for the "a b" string form
    int nm;
    int has_vocab, has_merges;
} tok_json_model;

// Returns the document without model.vocab/model.merges (those land in *m), or NULL
// with err naming the byte offset of the problem.
cJSON *tok_json_parse(const char *buf, size_t len, tok_json_model *m, const char *path, verr *err);
void tok_json_model_free(tok_json_model *m);

#endif
