#define SAFETENSORS_IMPLEMENTATION
#include "host/formats/safetensors.h"
