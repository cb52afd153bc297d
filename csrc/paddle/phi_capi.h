/*
 * The part of Paddle's phi kernel C API (paddle/phi/capi/include/c_*.h of Paddle 3.x) that
 * anychip's kernel libraries use, written from those headers. The functions live in the
 * libphi_core.so Paddle has loaded; a kernel library looks them up there at run time
 * (anychip_phi_load), so it builds without Paddle and loads where Paddle is absent.
 * tests/paddle_provider/test_paddle_provider.py compiles this header against the wheel's own headers and
 * checks the enum values and every declaration below.
 */
#ifndef ANYCHIP_PADDLE_PHI_CAPI_H
#define ANYCHIP_PADDLE_PHI_CAPI_H

/* ANYCHIP_PHI_FUNCTIONS_ONLY: only the list of functions (the check compiles it against
 * Paddle's own declarations) */
#ifndef ANYCHIP_PHI_FUNCTIONS_ONLY
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "anychip/paddle/device_ext.h"

typedef struct PD_Tensor PD_Tensor;
typedef struct PD_KernelContext PD_KernelContext;
typedef struct PD_DeviceContext PD_DeviceContext;
typedef struct PD_KernelKey PD_KernelKey;
typedef struct PD_Kernel PD_Kernel;
typedef struct PD_KernelArgsDef PD_KernelArgsDef;
typedef struct PD_TensorArgDef PD_TensorArgDef;
typedef struct PD_Scalar PD_Scalar;
typedef struct PD_IntArray PD_IntArray;
typedef struct { size_t size; void *data; } PD_List;

/* C_DataLayout of Paddle's device_ext.h (an enum: int-sized); kernels register for ANY (0) */
typedef int C_DataLayout;
enum { ANYCHIP_PD_LAYOUT_ANY = 0 };

/* PD_KernelArgumentType (c_kernel_registry.h), up to the last member used */
typedef enum {
    PD_ARG_TYPE_CONTEXT = 0,
    PD_ARG_TYPE_TENSOR,
    PD_ARG_TYPE_BOOL,
    PD_ARG_TYPE_BFLOAT16,
    PD_ARG_TYPE_FLOAT16,
    PD_ARG_TYPE_FLOAT32,
    PD_ARG_TYPE_FLOAT64,
    PD_ARG_TYPE_INT32,
    PD_ARG_TYPE_INT64,
    PD_ARG_TYPE_STRING,
    PD_ARG_TYPE_SCALAR,
    PD_ARG_TYPE_INT_ARRAY,
    PD_ARG_TYPE_DATA_TYPE,
    PD_ARG_TYPE_DATA_LAYOUT,
    PD_ARG_TYPE_PLACE,
    PD_ARG_TYPE_LIST_BOOL,
    PD_ARG_TYPE_LIST_INT32,
    PD_ARG_TYPE_LIST_INT64,
    PD_ARG_TYPE_LIST_BFLOAT16,
    PD_ARG_TYPE_LIST_FLOAT16,
    PD_ARG_TYPE_LIST_FLOAT32,
    PD_ARG_TYPE_LIST_FLOAT64,
    PD_ARG_TYPE_LIST_STRING,
    PD_ARG_TYPE_LIST_SCALAR,
    PD_ARG_TYPE_OPTIONAL_TENSOR,
    PD_ARG_TYPE_LIST_TENSOR,
} PD_KernelArgumentType;

/* phi::DataType (paddle/phi/common/data_type.h): what a kernel's variadic entry receives for
 * a DataType attribute (the C API's own accessors give C_DataType) */
enum {
    PHI_UNDEFINED = 0, PHI_BOOL, PHI_UINT8, PHI_INT8, PHI_UINT16, PHI_INT16, PHI_UINT32, PHI_INT32, PHI_UINT64,
    PHI_INT64, PHI_FLOAT32, PHI_FLOAT64, PHI_COMPLEX64, PHI_COMPLEX128, PHI_PSTRING, PHI_FLOAT16, PHI_BFLOAT16,
};

#endif

/* the functions, one member each, named as in Paddle's headers */
#define ANYCHIP_PHI_FUNCTIONS(X)                                                                                  \
    X(void, PD_RegisterPhiKernel,                                                                              \
      (const char *, const char *, C_DataType, C_DataLayout, size_t, PD_KernelArgumentType *, size_t,          \
       PD_KernelArgumentType *, size_t, PD_KernelArgumentType *, void (*)(const PD_KernelKey *, PD_Kernel *),   \
       void (*)(PD_KernelContext *), void *))                                                                  \
    X(PD_DeviceContext *, PD_KernelContextGetDeviceContext, (PD_KernelContext *))                              \
    X(PD_Tensor *, PD_KernelContextInputAt, (PD_KernelContext *, size_t))                                      \
    X(PD_Tensor *, PD_KernelContextOutputAt, (PD_KernelContext *, size_t))                                     \
    X(PD_List, PD_KernelContextMultiInputAt, (PD_KernelContext *, size_t))                                     \
    X(PD_List, PD_KernelContextMultiOutputAt, (PD_KernelContext *, size_t))                                    \
    X(PD_List, PD_KernelContextListInt32AttrAt, (PD_KernelContext *, size_t))                                  \
    X(PD_List, PD_KernelContextListInt64AttrAt, (PD_KernelContext *, size_t))                                  \
    X(char *, PD_KernelContextStringAttrAt, (PD_KernelContext *, size_t))                                      \
    X(bool, PD_KernelContextBoolAttrAt, (PD_KernelContext *, size_t))                                          \
    X(int32_t, PD_KernelContextInt32AttrAt, (PD_KernelContext *, size_t))                                      \
    X(int64_t, PD_KernelContextInt64AttrAt, (PD_KernelContext *, size_t))                                      \
    X(float, PD_KernelContextFloatAttrAt, (PD_KernelContext *, size_t))                                        \
    X(PD_Scalar *, PD_KernelContextScalarAttrAt, (PD_KernelContext *, size_t))                                 \
    X(PD_IntArray *, PD_KernelContextIntArrayAttrAt, (PD_KernelContext *, size_t))                             \
    X(C_DataType, PD_KernelContextDataTypeAttrAt, (PD_KernelContext *, size_t))                                \
    X(C_Stream, PD_DeviceContextGetStream, (const PD_DeviceContext *, C_Status *))                             \
    X(void *, PD_DeviceContextAllocateTensor, (const PD_DeviceContext *, PD_Tensor *, size_t, C_DataType,      \
                                               C_Status *))                                                    \
    X(C_DataType, PD_TensorGetPDDataType, (const PD_Tensor *, C_Status *))                                     \
    X(void *, PD_TensorGetDataPointer, (const PD_Tensor *, C_Status *))                                        \
    X(int64_t, PD_TensorGetElementCount, (const PD_Tensor *, C_Status *))                                      \
    X(int64_t, PD_TensorGetNumDims, (const PD_Tensor *, C_Status *))                                           \
    X(int64_t, PD_TensorGetDim, (const PD_Tensor *, size_t, C_Status *))                                       \
    X(int64_t, PD_TensorGetNumStrides, (const PD_Tensor *, C_Status *))                                        \
    X(int64_t, PD_TensorGetStride, (const PD_Tensor *, size_t, C_Status *))                                    \
    X(void, PD_TensorSetDims, (PD_Tensor *, int64_t, const int64_t *, C_Status *))                             \
    X(void, PD_TensorSetStrides, (PD_Tensor *, int64_t, const int64_t *, C_Status *))                          \
    X(void, PD_TensorSetOffset, (PD_Tensor *, const int64_t, C_Status *))                                      \
    X(PD_Tensor *, PD_NewTensor, (void))                                                                       \
    X(void, PD_DeleteTensor, (PD_Tensor *))                                                                    \
    X(PD_Tensor *, PD_OptionalTensorGetPointer, (PD_Tensor *))                                                 \
    X(PD_List, PD_IntArrayGetDataPointer, (PD_IntArray *))                                                     \
    X(size_t, PD_IntArrayGetElementCount, (PD_IntArray *))                                                     \
    X(double, PD_ScalarGetFloat64Data, (PD_Scalar *))                                                          \
    X(int64_t, PD_ScalarGetInt64Data, (PD_Scalar *))                                                           \
    X(PD_KernelArgsDef *, PD_KernelGetArgsDef, (PD_Kernel *, C_Status *))                                      \
    X(PD_List, PD_KernelArgsDefGetOutputArgDefs, (PD_KernelArgsDef *, C_Status *))                             \
    X(void, PD_TensorArgDefSetDataType, (PD_TensorArgDef *, C_DataType, C_Status *))                           \
    X(void, PD_DeletePointerList, (PD_List))                                                                   \
    X(C_DataType, PD_KernelKeyGetDataType, (PD_KernelKey *, C_Status *))

#ifndef ANYCHIP_PHI_FUNCTIONS_ONLY
#define ANYCHIP_PHI_MEMBER(ret, name, args) ret(*name) args;
typedef struct anychip_phi_api {
    ANYCHIP_PHI_FUNCTIONS(ANYCHIP_PHI_MEMBER)
} anychip_phi_api;
#undef ANYCHIP_PHI_MEMBER
#endif

#endif
