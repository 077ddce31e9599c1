// lora_merge.h: LoRA adapters folded into a base model's weights and written as a
// new HF model directory (`varent lora merge`).
#ifndef VARENT_LORA_MERGE_H
#define VARENT_LORA_MERGE_H

#include "model/lora.h"

// Loads base_dir and every adapter of spec (checked as lora_load does), and writes
// out_dir: model.safetensors with each adapted projection W + sum of scale * c * B A
// (computed in double, rounded once to W's dtype; every other tensor copied as stored)
// and the base's config.json, generation_config.json and tokenizer files. Nothing is
// written unless all of it is ready (host/formats/model_dir.h). 0, or -1 with err.
int lora_merge(const char *base_dir, const lora_spec *spec, int n_spec, const char *out_dir, verr *err);

#endif
