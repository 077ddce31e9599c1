// critic.h: the agents' critic. It reads
//   Text:\n<text>\nQuestion: Is this text coherent and not nonsense?\nReply GOOD or BAD.\nAnswer:
// (as one user turn rendered with the critic model's chat template when it has one it
// recognises, else as plain text after BOS) and compares the teacher-forced
// log-probabilities of the continuations " GOOD" and " BAD", each summed over its
// tokens. No free generation: the verdict is a pure function of the weights and text.
// The critic keeps the ids whose keys are in its KV cache and only feeds what
// changed since the last check (the longest common prefix is reused).
#ifndef VARENT_CRITIC_H
#define VARENT_CRITIC_H

#include "host/runtime/session.h"
#include "tokenizer/chat.h"

#define CRITIC_QUESTION "\nQuestion: Is this text coherent and not nonsense?\nReply GOOD or BAD.\nAnswer:"

typedef struct {
    session *s;           // the context it runs on: &own, or a shared context
    session own;
    int chat;             // 1: prompt rendered with fmt
    int template_unknown; // the model has a chat_template that chat_detect does not know: plain prompt
    chat_format fmt;
    chat_opts opts;
    int *good, n_good;    // continuation ids of " GOOD" and " BAD" after the prompt
    int *bad, n_bad;
    int *cached, n_cached, cap;  // ids in s->kv, in order (n_cached == s->kv.len)
} critic;

typedef struct {
    int good;                     // logp_good >= logp_bad
    double logp_good, logp_bad;   // natural log, summed over the continuation's tokens
    int n_prompt;                 // prompt ids
    int n_fed;                    // forward positions this check (prompt ids after the cached prefix + continuations)
} critic_verdict;

// A second context on base's loaded model (ctx positions, 0: base's); base must outlive it.
int critic_open_shared(critic *c, const session *base, int ctx, verr *err);
// Its own model (--critic-model DIR) on o->device.
int critic_open_model(critic *c, const session_opts *o, verr *err);
void critic_close(critic *c);
// The prompt ids for text (see the header comment); *ids is malloc'd. Returns the count or -1.
int critic_prompt_ids(const critic *c, const char *text, int **ids, verr *err);
int critic_judge(critic *c, const char *text, critic_verdict *v, verr *err);

#endif
