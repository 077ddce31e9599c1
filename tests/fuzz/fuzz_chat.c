// fuzz_chat: the chat template renderer (tokenizer/chat.c): chat_detect over a
// template text, then chat_render of a conversation. Input: byte 0 = options
// (bit 0 add_generation_prompt, bit 1 enable_thinking, bit 2 custom bos/eos tokens,
// bit 3 a date_string, bits 4-6 the format by name when the template is not
// recognised); then fields separated by \x01: the template text, then messages,
// each a role byte (system/user/assistant/tool/other) followed by the content, with
// an optional \x02 before a reasoning text.
#include "tests/fuzz/fuzz_util.h"

#include "tokenizer/chat.h"

#define MAX_MSGS 32

static const char *names[] = {"llama3", "llama3.1", "llama3.2", "chatml", "qwen2.5", "smollm2", "qwen3", "llama2"};
static const char *roles[] = {"system", "user", "assistant", "tool", "developer"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t flags = data[0];
    char *buf = malloc(size);  // fields, each NUL-terminated in place
    FUZZ_CHECK(buf);
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = 0;
    char *fields[MAX_MSGS + 1];
    int nf = 0;
    for (char *p = buf; nf <= MAX_MSGS;) {
        fields[nf++] = p;
        char *sep = strchr(p, '\x01');
        if (!sep) break;
        *sep = 0;
        p = sep + 1;
    }
    chat_format f = chat_detect(fields[0]);
    verr err = {{0}};
    if (f.kind == CHAT_UNKNOWN) FUZZ_CHECK(chat_format_from_name(names[flags >> 4 & 7], &f, &err) == 0);
    FUZZ_CHECK(chat_kind_from_name(names[flags >> 4 & 7]) != CHAT_UNKNOWN);
    chat_msg msgs[MAX_MSGS];
    int n = 0;
    for (int i = 1; i < nf; i++) {
        const char *m = fields[i];
        msgs[n].role = roles[(m[0] ? (uint8_t)m[0] : 0) % 5];
        msgs[n].content = m[0] ? m + 1 : m;
        char *r = strchr(msgs[n].content, '\x02');
        if (r) *r++ = 0;
        msgs[n].reasoning = r;
        n++;
    }
    chat_opts o = chat_opts_default();
    o.add_generation_prompt = flags & 1;
    o.enable_thinking = flags >> 1 & 1;
    if (flags & 4) o.bos_token = "<B>", o.eos_token = "<E>";
    if (flags & 8) o.date_string = "01 Jan 2030";
    char *out = chat_render(&f, msgs, n, &o, &err);
    if (!out) FUZZ_CHECK(err.msg[0]);
    free(out);
    for (const char *const *s = chat_stop_strings(f.kind); s && *s; s++) FUZZ_CHECK(**s);
    (void)chat_kind_name(f.kind);
    free(buf);
    return 0;
}
