#define SAFETENSORS_IMPLEMENTATION
#include "host/safetensors.h"
