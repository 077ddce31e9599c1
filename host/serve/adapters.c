// adapters.c: the server's named LoRA adapters (--lora-modules NAME=DIR, as vLLM):
// loaded at start, listed by /v1/models, chosen per request by its "model" field.
#include <stdlib.h>
#include <string.h>

#include "host/serve/internal.h"

int server_adapters_load(server *s, verr *err) {
    const server_opts *o = &s->o;
    if (o->n_lora_modules <= 0) return 0;
    s->mods = calloc((size_t)o->n_lora_modules, sizeof *s->mods);
    lora_use *all = calloc((size_t)o->n_lora_modules + (size_t)s->base->n_adapters, sizeof *all);
    if (!s->mods || !all) return free(all), verr_set(err, "out of memory");
    for (int i = 0; i < o->n_lora_modules; i++) {
        const char *name = o->lora_names[i];
        if (!strcmp(name, s->model_id)) return free(all), verr_set(err, "--lora-modules %s: the name is the base model's id", name);
        for (int k = 0; k < i; k++)
            if (!strcmp(name, o->lora_names[k])) return free(all), verr_set(err, "--lora-modules %s: the name is given twice", name);
        verr e;
        if (lora_load(&s->mods[i], &s->base->m, o->lora_modules[i].dir, &e))
            return free(all), verr_set(err, "--lora-modules %s: %.900s", name, e.msg);
        s->n_mods = i + 1;
    }
    // Slot 0 runs on the base session's forward state (copied by value): size its LoRA
    // scratch for every adapter now, so a request never reallocates what base shares
    // (on CUDA: this uploads every adapter once, before the slots start).
    if (s->base->n_adapters) memcpy(all, s->base->lora, sizeof *all * (size_t)s->base->n_adapters);  // lora: NULL without
    for (int i = 0; i < s->n_mods; i++) all[s->base->n_adapters + i] = (lora_use){ &s->mods[i], 1.0f };
    int rc = session_set_lora(s->base, all, s->base->n_adapters + s->n_mods, err) ||
             session_set_lora(s->base, s->base->lora, s->base->n_adapters, err);
    free(all);
    return rc ? -1 : 0;
}

void server_adapters_free(server *s) {
    for (int i = 0; i < s->n_mods; i++) lora_free(&s->mods[i]);
    free(s->mods);
    s->mods = NULL, s->n_mods = 0;
}

int server_adapter_find(const server *s, const char *name) {
    for (int i = 0; i < s->n_mods; i++)
        if (!strcmp(name, s->o.lora_names[i])) return i;
    return -1;
}

int server_job_adapters(server *s, server_job *j, int module, verr *err) {
    int n = s->base->n_adapters + (module >= 0);
    if (n == 0) return 0;
    j->lora = malloc(sizeof *j->lora * (size_t)n);
    if (!j->lora) return verr_set(err, "out of memory");
    if (s->base->n_adapters) memcpy(j->lora, s->base->lora, sizeof *j->lora * (size_t)s->base->n_adapters);
    if (module >= 0) j->lora[n - 1] = (lora_use){ &s->mods[module], 1.0f };
    j->n_lora = n;
    return 0;
}
