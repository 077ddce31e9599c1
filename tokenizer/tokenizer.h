// tokenizer.h: Hugging Face tokenizer.json (+ tokenizer_config.json) encoding and
// decoding. Two BPE families: byte-level (GPT-2 byte<->unicode map; Llama 3, Qwen,
// SmolLM2) and SentencePiece-style (metaspace + <0xNN> byte fallback; Llama 2 and the
// llama2.c tokenizers written by `varent convert llama2c`).
#ifndef VARENT_TOKENIZER_H
#define VARENT_TOKENIZER_H

#include <stddef.h>
#include "host/util/err.h"

typedef struct tokenizer tokenizer;
typedef struct tokenizer_stream tokenizer_stream;

// path: a tokenizer.json file, or a directory holding tokenizer.json and optionally
// tokenizer_config.json. Returns NULL and fills err on failure.
tokenizer *tokenizer_load(const char *path, verr *err);
// The same from tokenizer.json text in memory, NUL-terminated at text[len] (no
// tokenizer_config.json), named name in messages: how a converter checks the tokenizer it is about to write.
tokenizer *tokenizer_load_text(const char *text, size_t len, const char *name, verr *err);
void tokenizer_free(tokenizer *t);

// Total ids (model vocab plus added tokens beyond it): max id + 1.
int tokenizer_vocab_size(const tokenizer *t);

// Encode text without BOS/EOS (HF encode(text, add_special_tokens=False)).
// parse_special=1 matches special added tokens in the text; 0 treats them as plain
// text (for untrusted input). Returns the id count and a malloc'd array in *ids,
// or -1 with err filled.
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int parse_special,
                     int **ids, verr *err);
// tokenizer_encode with special tokens parsed except where their text lies inside one of
// the n_plain byte ranges plain[2i] .. plain[2i+1] (message text: escape_special), where
// it is tokenized as ordinary text. Outside those ranges the result is tokenizer_encode's.
int tokenizer_encode_spans(const tokenizer *t, const char *text, size_t len, const size_t *plain, int n_plain,
                           int **ids, verr *err);

// Decode ids to a malloc'd NUL-terminated string (skip_special=1 drops special
// tokens). Returns NULL with err on an id out of range.
char *tokenizer_decode(const tokenizer *t, const int *ids, int n, int skip_special, verr *err);

// Streaming decode: push ids one at a time and receive only complete UTF-8.
// Text held back (a partial character) comes out on a later push or on flush.
tokenizer_stream *tokenizer_stream_new(const tokenizer *t, int skip_special);
// The ids continue text already shown (the prompt): the first one is decoded as a
// continuation, without the start-of-text strip of a leading space.
void tokenizer_stream_continue(tokenizer_stream *s);
// Returns bytes written to *out (points into the stream's buffer, valid until the
// next call), or -1 with err on an id out of range.
int tokenizer_stream_push(tokenizer_stream *s, int id, const char **out, verr *err);
int tokenizer_stream_flush(tokenizer_stream *s, const char **out);
void tokenizer_stream_free(tokenizer_stream *s);

// Token text as stored in the vocab (e.g. "Ġthe", "▁the", "<|eot_id|>"), or NULL.
const char *tokenizer_piece(const tokenizer *t, int id);
// Id of an exact vocab or added-token string, or -1.
int tokenizer_token_id(const tokenizer *t, const char *piece);
int tokenizer_is_special(const tokenizer *t, int id);

// From tokenizer_config.json / the post-processor: the BOS id (-1 if none), whether
// prompts start with BOS (add_bos_token or a TemplateProcessing that prepends it),
// the EOS token id from the config (-1 if none), and the raw chat_template text
// (NULL if none).
int tokenizer_bos_id(const tokenizer *t);
int tokenizer_add_bos(const tokenizer *t);
int tokenizer_eos_id(const tokenizer *t);
const char *tokenizer_chat_template(const tokenizer *t);

#endif
