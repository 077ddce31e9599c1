// fuzz_llama2c_vocab: the llama2.c tokenizer.bin reader (tokenizer/llama2c_vocab.c),
// which `varent convert llama2c` uses to write tokenizer.json. Bytes 0-1: the vocab
// size (little-endian, 1..1024); the rest is tokenizer.bin. A conversion that succeeds
// must give a tokenizer.json that loads, with at most that many ids, and encodes text.
#include "tests/fuzz/fuzz_util.h"

#include "tokenizer/llama2c_vocab.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int n = (data[0] | data[1] << 8) % 1024 + 1;
    const char *bin = fuzz_file("tokenizer.bin", data + 2, size - 2);
    fuzz_remove("tokenizer.json");
    fuzz_remove("tokenizer_config.json");
    verr err = {{0}};
    if (llama2c_vocab_to_tokenizer_json(bin, n, fuzz_dir(), &err) != 0) {
        FUZZ_CHECK(err.msg[0]);
        return 0;
    }
    tokenizer *t = tokenizer_load(fuzz_dir(), &err);
    if (!t) fprintf(stderr, "converted tokenizer does not load: %s\n", err.msg);
    FUZZ_CHECK(t);
    // Repeated pieces keep their first id (JSON keys are unique), so trailing repeats
    // can leave the tokenizer with fewer ids than n, never more.
    FUZZ_CHECK(tokenizer_vocab_size(t) >= 3 && tokenizer_vocab_size(t) <= n);
    int *ids = NULL;
    static const char text[] = "Once upon a time \xe6\x97\xa5 \xff";
    int k = tokenizer_encode(t, text, sizeof text - 1, 1, &ids, &err);
    for (int i = 0; i < k; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < tokenizer_vocab_size(t));
    free(ids);
    tokenizer_free(t);
    return 0;
}
