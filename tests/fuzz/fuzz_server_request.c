// fuzz_server_request: the server's request JSON (host/serve/request.c). Byte 0
// picks the endpoint (bit 0: chat); the rest is the HTTP body, deliberately not
// NUL-terminated. A request that parses must satisfy the documented limits; one that
// fails must name the kind and leave nothing allocated after server_request_free.
#include "tests/fuzz/fuzz_util.h"

#include "host/serve/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int chat = data[0] & 1;
    size_t len = size - 1;
    char *body = malloc(len ? len : 1);  // exactly len bytes: reads past the end are caught
    FUZZ_CHECK(body);
    memcpy(body, data + 1, len);
    server_request r;
    verr err = {{0}};
    int rc = server_parse_request(body, len, chat, &r, &err);
    if (rc != 0) {
        FUZZ_CHECK(err.msg[0] && r.kind != SRV_OK);
    } else {
        FUZZ_CHECK(r.chat == chat);
        FUZZ_CHECK(r.n >= 1 && r.n <= SERVER_MAX_N);
        size_t stop_bytes = 0;
        for (int i = 0; i < r.n_stop; i++) {
            FUZZ_CHECK(r.stop[i] && r.stop[i][0]);
            stop_bytes += strlen(r.stop[i]);
        }
        FUZZ_CHECK(r.n_stop >= 0 && stop_bytes <= SERVER_MAX_STOP_BYTES);
        FUZZ_CHECK(r.top_logprobs >= 0 && r.top_logprobs <= SERVER_MAX_TOP_LOGPROBS);
        FUZZ_CHECK(r.max_tokens >= -1);
        if (chat) {
            FUZZ_CHECK(r.n_msgs >= 1 && r.n_msgs <= SERVER_MAX_MESSAGES);
            for (int i = 0; i < r.n_msgs; i++) FUZZ_CHECK(r.msgs[i].role && r.msgs[i].content);
        } else {
            FUZZ_CHECK(r.n_prompts >= 1 && r.n_prompts <= SERVER_MAX_PROMPTS && r.n_prompts * r.n <= SERVER_MAX_CHOICES);
            long ids = 0;
            for (int i = 0; i < r.n_prompts; i++) {
                FUZZ_CHECK(r.prompts[i].text || r.prompts[i].n_ids > 0);
                ids += r.prompts[i].n_ids;
            }
            FUZZ_CHECK(ids <= SERVER_MAX_PROMPT_IDS);
        }
    }
    server_request_free(&r);
    free(body);
    return 0;
}
