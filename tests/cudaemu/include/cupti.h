// cupti.h (emulated device): the part of NVIDIA's CUPTI activity API that the tracer
// (tools/trace/cupti_trace.c) uses, implemented by tests/cudaemu/cupti.cpp. Same names,
// enum values and record field names as NVIDIA's headers, so the tracer compiles
// against either; the record structs hold only the fields the tracer reads (the source
// is compatible, the binary layout is not: an emulated build is never mixed with
// NVIDIA's library). docs/cuda.md, "A GPU window".
#ifndef VARENT_EMU_CUPTI_H
#define VARENT_EMU_CUPTI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUPTIAPI

typedef enum {
    CUPTI_SUCCESS = 0,
    CUPTI_ERROR_INVALID_PARAMETER = 1,
    CUPTI_ERROR_MAX_LIMIT_REACHED = 12,
    CUPTI_ERROR_NOT_INITIALIZED = 15,
    CUPTI_ERROR_UNKNOWN = 999
} CUptiResult;

typedef enum {
    CUPTI_ACTIVITY_KIND_INVALID = 0,
    CUPTI_ACTIVITY_KIND_MEMCPY = 1,
    CUPTI_ACTIVITY_KIND_MEMSET = 2,
    CUPTI_ACTIVITY_KIND_RUNTIME = 5,
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL = 10
} CUpti_ActivityKind;

typedef enum { CUPTI_CB_DOMAIN_RUNTIME_API = 2 } CUpti_CallbackDomain;
typedef uint32_t CUpti_CallbackId;
typedef struct CUctx_st *CUcontext;

typedef struct {
    CUpti_ActivityKind kind;
} CUpti_Activity;

// CUPTI's memcpy kinds (CUpti_ActivityMemcpyKind).
enum { CUPTI_ACTIVITY_MEMCPY_KIND_HTOD = 1, CUPTI_ACTIVITY_MEMCPY_KIND_DTOH = 2, CUPTI_ACTIVITY_MEMCPY_KIND_DTOD = 8 };

typedef struct {
    CUpti_ActivityKind kind;
    uint64_t start, end;  // ns
    uint32_t deviceId, streamId, correlationId;
    const char *name;
    uint64_t graphNodeId;
    uint32_t graphId;
} CUpti_ActivityKernel10;

typedef struct {
    CUpti_ActivityKind kind;
    uint8_t copyKind;
    uint64_t bytes;
    uint64_t start, end;
    uint32_t deviceId, streamId, correlationId;
    uint64_t graphNodeId;
    uint32_t graphId;
} CUpti_ActivityMemcpy6;

typedef struct {
    CUpti_ActivityKind kind;
    uint32_t value;
    uint64_t bytes;
    uint64_t start, end;
    uint32_t deviceId, streamId, correlationId;
    uint64_t graphNodeId;
    uint32_t graphId;
} CUpti_ActivityMemset4;

typedef struct {
    CUpti_ActivityKind kind;
    CUpti_CallbackId cbid;
    uint64_t start, end;
    uint32_t processId, threadId, correlationId, returnValue;
} CUpti_ActivityAPI;

typedef void(CUPTIAPI *CUpti_BuffersCallbackRequestFunc)(uint8_t **buffer, size_t *size, size_t *maxNumRecords);
typedef void(CUPTIAPI *CUpti_BuffersCallbackCompleteFunc)(CUcontext context, uint32_t streamId, uint8_t *buffer,
                                                          size_t size, size_t validSize);

CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc requested,
                                           CUpti_BuffersCallbackCompleteFunc completed);
CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind);
CUptiResult cuptiActivityFlushAll(uint32_t flag);
CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t validBufferSizeBytes, CUpti_Activity **record);
CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t streamId, size_t *dropped);
CUptiResult cuptiGetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid, const char **name);
CUptiResult cuptiGetResultString(CUptiResult result, const char **str);
CUptiResult cuptiGetTimestamp(uint64_t *timestamp);

#ifdef __cplusplus
}
#endif

#endif
