/* A stand-in for libcuda.so.1, so that cai_mpi's CUDA runtime can run in CI through the real cuda-bindings wheel
 * (scripts/test-real-bindings.sh): every driver call the library makes then goes through the bindings' argument
 * conversion, return tuples and error mapping, as on a GPU.
 *
 * Host memory stands in for device memory; every stream operation runs at once, in the caller's thread (so streams
 * complete in order and a query always finds the work done). Each function follows the CUDA driver API's
 * documented ABI and the documented failures it can check (a zero-byte cuMemAlloc, a context call with none
 * current, memory it did not allocate); what it does not implement is not found through cuGetProcAddress, so the
 * bindings report the call as missing rather than the stub answering wrongly.
 *
 * Settings (environment): CUDA_STUB_DEVICES=N GPUs (default 1); CUDA_STUB_TRACE=1 prints some calls on stderr;
 * CUDA_STUB_HIDE=cuA,cuB: those functions are not found (a driver older than them).
 *
 *   gcc -shared -fPIC -O1 -o DIR/libcuda.so.1 -Wl,-soname,libcuda.so.1 libcuda_stub.c -lpthread
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef struct ctx_s *CUcontext;
typedef struct stream_s *CUstream;
typedef struct event_s *CUevent;

enum {
  CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2, CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100, CUDA_ERROR_INVALID_DEVICE = 101, CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400, CUDA_ERROR_NOT_FOUND = 500, CUDA_ERROR_NOT_SUPPORTED = 801,
};
enum { MEMTYPE_HOST = 1, MEMTYPE_DEVICE = 2, MEMTYPE_ARRAY = 3, MEMTYPE_UNIFIED = 4 };
enum {
  ATTR_CONTEXT = 1, ATTR_MEMORY_TYPE = 2, ATTR_DEVICE_POINTER = 3, ATTR_HOST_POINTER = 4, ATTR_SYNC_MEMOPS = 6,
  ATTR_BUFFER_ID = 7, ATTR_IS_MANAGED = 8, ATTR_DEVICE_ORDINAL = 9, ATTR_RANGE_START_ADDR = 11,
  ATTR_RANGE_SIZE = 12, ATTR_MAPPED = 13,
};
enum { MAX_DEVICES = 8 };

struct ctx_s { int device; int retained; unsigned long long id; };
struct stream_s { unsigned int flags; CUcontext ctx; };
struct event_s { unsigned int flags; };

static struct ctx_s primary[MAX_DEVICES];
static int n_devices = -1;
static bool initialized, tracing;
static __thread CUcontext stack[64];
static __thread int depth;  /* stack[depth - 1] is current */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

#define TRACE(...) do { if (tracing) { fprintf(stderr, "[cuda stub] " __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* -- allocations: what cuPointerGetAttributes knows ------------------------------------------------------------ */

struct block { uintptr_t start; size_t size; int kind; CUcontext ctx; };  /* kind: MEMTYPE_*; ctx NULL: a pool's */
static struct block *blocks;
static size_t n_blocks, cap_blocks;

static void remember(void *p, size_t size, int kind, CUcontext ctx) {
  pthread_mutex_lock(&lock);
  if (n_blocks == cap_blocks) {
    cap_blocks = cap_blocks ? 2 * cap_blocks : 64;
    blocks = realloc(blocks, cap_blocks * sizeof *blocks);
  }
  blocks[n_blocks++] = (struct block){(uintptr_t)p, size, kind, ctx};
  pthread_mutex_unlock(&lock);
}

static bool forget(uintptr_t start, int kind) {
  bool found = false;
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n_blocks; i++) {
    if (blocks[i].start == start && blocks[i].kind == kind) {
      blocks[i] = blocks[--n_blocks];
      found = true;
      break;
    }
  }
  pthread_mutex_unlock(&lock);
  return found;
}

static bool find(uintptr_t p, struct block *out) {
  bool found = false;
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n_blocks && !found; i++) {
    if (p >= blocks[i].start && p < blocks[i].start + (blocks[i].size ? blocks[i].size : 1)) {
      *out = blocks[i];
      found = true;
    }
  }
  pthread_mutex_unlock(&lock);
  return found;
}

static void *device_bytes(size_t n) {
  /* CUDA aligns allocations to at least 256 bytes; fresh memory is not zeroed, so neither is this (a pattern). */
  void *p = aligned_alloc(256, (n + 255) / 256 * 256);
  if (p) memset(p, 0xA5, n);
  return p;
}

static CUcontext current(void) { return depth ? stack[depth - 1] : NULL; }

/* -- initialization, versions, errors -------------------------------------------------------------------------- */

CUresult cuInit(unsigned int flags) {
  if (flags) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  if (n_devices < 0) {
    const char *n = getenv("CUDA_STUB_DEVICES");
    n_devices = n ? atoi(n) : 1;
    if (n_devices > MAX_DEVICES) n_devices = MAX_DEVICES;
    for (int i = 0; i < MAX_DEVICES; i++) primary[i] = (struct ctx_s){i, 0, 1000 + (unsigned long long)i};
    tracing = getenv("CUDA_STUB_TRACE") && strcmp(getenv("CUDA_STUB_TRACE"), "0") != 0;
  }
  initialized = true;
  pthread_mutex_unlock(&lock);
  TRACE("cuInit(%u)", flags);
  return n_devices > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

CUresult cuDriverGetVersion(int *version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = 13000;
  return CUDA_SUCCESS;
}

static const char *error_name(CUresult e) {
  switch (e) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    default: return NULL;
  }
}

CUresult cuGetErrorName(CUresult e, const char **out) {
  const char *name = error_name(e);
  if (!out || !name) return CUDA_ERROR_INVALID_VALUE;
  *out = name;
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult e, const char **out) {
  if (!out || !error_name(e)) return CUDA_ERROR_INVALID_VALUE;
  *out = e == CUDA_SUCCESS ? "no error" : "reported by the libcuda stub (scripts/cuda-stub)";
  return CUDA_SUCCESS;
}

#define NEED_INIT() do { if (!initialized) return CUDA_ERROR_NOT_INITIALIZED; } while (0)
#define NEED_CONTEXT() do { NEED_INIT(); if (!current()) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

/* -- devices and contexts -------------------------------------------------------------------------------------- */

CUresult cuDeviceGetCount(int *count) {
  NEED_INIT();
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = n_devices;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  NEED_INIT();
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  NEED_INIT();
  if (dev < 0 || dev >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  snprintf(name, (size_t)len, "libcuda stub GPU %d", dev);
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  NEED_INIT();
  if (dev < 0 || dev >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = (size_t)16 << 30;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
  NEED_INIT();
  if (dev < 0 || dev >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case 1: *value = 1024; break;                 /* MAX_THREADS_PER_BLOCK */
    case 11: *value = 2147483647; break;          /* MAX_PITCH */
    case 16: *value = 132; break;                 /* MULTIPROCESSOR_COUNT */
    case 33: *value = 0; break;                   /* PCI_BUS_ID */
    case 34: *value = dev; break;                 /* PCI_DEVICE_ID */
    case 41: *value = 1; break;                   /* UNIFIED_ADDRESSING */
    case 75: *value = 9; break;                   /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *value = 0; break;                   /* COMPUTE_CAPABILITY_MINOR */
    case 83: *value = 0; break;                   /* MANAGED_MEMORY: not modelled */
    case 115: *value = 1; break;                  /* MEMORY_POOLS_SUPPORTED */
    default: *value = 0;
  }
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
  NEED_INIT();
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&lock);
  primary[dev].retained++;
  pthread_mutex_unlock(&lock);
  *ctx = &primary[dev];
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  NEED_INIT();
  if (dev < 0 || dev >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&lock);
  if (primary[dev].retained > 0) primary[dev].retained--;  /* the stub keeps its memory: nothing is reset */
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
  NEED_INIT();
  if (dev < 0 || dev >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = primary[dev].retained > 0;
  return CUDA_SUCCESS;
}

static bool a_context(CUcontext ctx) {
  return ctx >= &primary[0] && ctx < &primary[n_devices > 0 ? n_devices : 0];
}

CUresult cuCtxGetCurrent(CUcontext *ctx) {
  NEED_INIT();
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  *ctx = current();
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  NEED_INIT();
  if (ctx && !a_context(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (!ctx) {
    if (depth) depth--;
  } else if (depth) {
    stack[depth - 1] = ctx;
  } else {
    stack[depth++] = ctx;
  }
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  NEED_INIT();
  if (!a_context(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (depth == (int)(sizeof stack / sizeof *stack)) return CUDA_ERROR_OUT_OF_MEMORY;
  stack[depth++] = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext *ctx) {
  NEED_INIT();
  if (!depth) return CUDA_ERROR_INVALID_CONTEXT;
  CUcontext popped = stack[--depth];
  if (ctx) *ctx = popped;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
  NEED_CONTEXT();
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  *device = current()->device;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id) {
  NEED_INIT();
  if (!ctx) ctx = current();
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
  if (!a_context(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  *id = ctx->id;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetFlags(unsigned int *flags) {
  NEED_CONTEXT();
  *flags = 0;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
  NEED_CONTEXT();
  return CUDA_SUCCESS;
}

/* -- streams and events: all work is done when it is enqueued ------------------------------------------------ */

CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
  NEED_CONTEXT();
  if (!s || flags > 1) return CUDA_ERROR_INVALID_VALUE;
  struct stream_s *made = malloc(sizeof *made);
  made->flags = flags;
  made->ctx = current();
  *s = made;
  TRACE("cuStreamCreate(%u) -> %p", flags, (void *)made);
  return CUDA_SUCCESS;
}

CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority) {
  (void)priority;
  return cuStreamCreate(s, flags);
}

CUresult cuStreamDestroy_v2(CUstream s) {
  NEED_INIT();
  if ((uintptr_t)s <= 2) return CUDA_ERROR_INVALID_HANDLE;
  free(s);
  return CUDA_SUCCESS;
}

CUresult cuStreamGetFlags(CUstream s, unsigned int *flags) {
  NEED_INIT();
  *flags = (uintptr_t)s <= 2 ? 0 : s->flags;
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s) {
  NEED_INIT();
  if ((uintptr_t)s <= 2 && !current()) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream s) { return cuStreamSynchronize(s); }

CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
  NEED_INIT();
  if (!e || flags) return CUDA_ERROR_INVALID_VALUE;
  if ((uintptr_t)s <= 2 && !current()) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *e, unsigned int flags) {
  NEED_CONTEXT();
  if (!e || flags > 0xF) return CUDA_ERROR_INVALID_VALUE;
  struct event_s *made = malloc(sizeof *made);
  made->flags = flags;
  *e = made;
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream s) {
  NEED_INIT();
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  if ((uintptr_t)s <= 2 && !current()) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent e) {
  NEED_INIT();
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuEventSynchronize(CUevent e) { return cuEventQuery(e); }

CUresult cuEventDestroy_v2(CUevent e) {
  NEED_INIT();
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  free(e);
  return CUDA_SUCCESS;
}

/* -- memory ---------------------------------------------------------------------------------------------------- */

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
  NEED_CONTEXT();
  if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;  /* documented: a zero size is INVALID_VALUE */
  void *p = device_bytes(bytes);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  remember(p, bytes, MEMTYPE_DEVICE, current());
  *dptr = (CUdeviceptr)(uintptr_t)p;
  TRACE("cuMemAlloc(%zu) -> %p", bytes, p);
  return CUDA_SUCCESS;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s) {
  NEED_CONTEXT();
  (void)s;
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  void *p = device_bytes(bytes ? bytes : 1);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  remember(p, bytes, MEMTYPE_DEVICE, NULL);  /* a pool's memory belongs to no context */
  *dptr = (CUdeviceptr)(uintptr_t)p;
  TRACE("cuMemAllocAsync(%zu, %p) -> %p", bytes, (void *)s, p);
  return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  NEED_CONTEXT();
  if (!dptr) return CUDA_SUCCESS;
  if (!forget((uintptr_t)dptr, MEMTYPE_DEVICE)) return CUDA_ERROR_INVALID_VALUE;
  free((void *)(uintptr_t)dptr);
  return CUDA_SUCCESS;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) {
  (void)s;
  return cuMemFree_v2(dptr);
}

CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags) {
  NEED_CONTEXT();
  if (!pp || flags > 0xF) return CUDA_ERROR_INVALID_VALUE;
  void *p = device_bytes(bytes ? bytes : 1);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  remember(p, bytes, MEMTYPE_HOST, current());
  *pp = p;
  return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytes) { return cuMemHostAlloc(pp, bytes, 0); }

CUresult cuMemFreeHost(void *p) {
  NEED_INIT();
  if (!forget((uintptr_t)p, MEMTYPE_HOST)) return CUDA_ERROR_INVALID_VALUE;
  free(p);
  return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags) {
  NEED_CONTEXT();
  struct block b;
  if (flags || !find((uintptr_t)p, &b) || b.kind != MEMTYPE_HOST) return CUDA_ERROR_INVALID_VALUE;
  *dptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
  NEED_CONTEXT();
  *free_bytes = (size_t)15 << 30;
  *total = (size_t)16 << 30;
  return CUDA_SUCCESS;
}

/* Copies run now: a stream's earlier work is always done. */
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  NEED_CONTEXT();
  if (n && (!dst || !src)) return CUDA_ERROR_INVALID_VALUE;
  memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)s;
  return cuMemcpy(dst, src, n);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { return cuMemcpy(dst, (uintptr_t)src, n); }
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { return cuMemcpy((uintptr_t)dst, src, n); }
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) { return cuMemcpy(dst, src, n); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  return cuMemcpyAsync(dst, (uintptr_t)src, n, s);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  return cuMemcpyAsync((uintptr_t)dst, src, n, s);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return cuMemcpyAsync(dst, src, n, s);
}

typedef struct {
  size_t srcXInBytes, srcY;
  int srcMemoryType;
  const void *srcHost;
  CUdeviceptr srcDevice;
  void *srcArray;
  size_t srcPitch;
  size_t dstXInBytes, dstY;
  int dstMemoryType;
  void *dstHost;
  CUdeviceptr dstDevice;
  void *dstArray;
  size_t dstPitch;
  size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;

static CUresult side(int type, const void *host, CUdeviceptr device, char **out) {
  switch (type) {
    case MEMTYPE_HOST: *out = (char *)host; return CUDA_SUCCESS;
    case MEMTYPE_DEVICE: case MEMTYPE_UNIFIED: *out = (char *)(uintptr_t)device; return CUDA_SUCCESS;
    default: return CUDA_ERROR_NOT_SUPPORTED;  /* CUDA arrays are not modelled */
  }
}

CUresult cuMemcpy2D_v2(const void *copy) {
  NEED_CONTEXT();
  const CUDA_MEMCPY2D *c = copy;
  char *src, *dst;
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = side(c->srcMemoryType, c->srcHost, c->srcDevice, &src);
  if (r == CUDA_SUCCESS) r = side(c->dstMemoryType, c->dstHost, c->dstDevice, &dst);
  if (r != CUDA_SUCCESS) return r;
  /* documented: each pitch at least WidthInBytes (for more than one row) */
  if (c->Height > 1 && (c->srcPitch < c->WidthInBytes || c->dstPitch < c->WidthInBytes)) return CUDA_ERROR_INVALID_VALUE;
  for (size_t row = 0; row < c->Height; row++) {
    memmove(dst + (c->dstY + row) * c->dstPitch + c->dstXInBytes, src + (c->srcY + row) * c->srcPitch + c->srcXInBytes,
            c->WidthInBytes);
  }
  return CUDA_SUCCESS;
}

CUresult cuMemcpy2DAsync_v2(const void *copy, CUstream s) {
  (void)s;
  return cuMemcpy2D_v2(copy);
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
  NEED_CONTEXT();
  memset((void *)(uintptr_t)dst, v, n);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
  (void)s;
  return cuMemsetD8_v2(dst, v, n);
}

/* -- pointer attributes ------------------------------------------------------------------------------------------ */

/* Writes attribute ``a`` of ``p`` in the size the driver API documents for it; ``known`` false: memory CUDA did not
 * allocate (cuPointerGetAttributes' default NULL values). */
static CUresult attribute(void *data, int a, uintptr_t p, bool known, const struct block *b) {
  switch (a) {
    case ATTR_CONTEXT: *(CUcontext *)data = known ? b->ctx : NULL; return CUDA_SUCCESS;
    case ATTR_MEMORY_TYPE: *(unsigned int *)data = known ? (unsigned int)b->kind : 0; return CUDA_SUCCESS;
    case ATTR_DEVICE_POINTER: *(CUdeviceptr *)data = known ? p : 0; return CUDA_SUCCESS;
    case ATTR_HOST_POINTER: *(void **)data = known && b->kind == MEMTYPE_HOST ? (void *)p : NULL; return CUDA_SUCCESS;
    case ATTR_SYNC_MEMOPS: case ATTR_IS_MANAGED: *(bool *)data = false; return CUDA_SUCCESS;
    case ATTR_MAPPED: *(bool *)data = known; return CUDA_SUCCESS;
    case ATTR_BUFFER_ID: *(unsigned long long *)data = known ? b->start : 0; return CUDA_SUCCESS;
    case ATTR_DEVICE_ORDINAL: *(int *)data = known ? (b->ctx ? b->ctx->device : 0) : -2; return CUDA_SUCCESS;
    case ATTR_RANGE_START_ADDR: *(CUdeviceptr *)data = known ? b->start : 0; return CUDA_SUCCESS;
    case ATTR_RANGE_SIZE: *(size_t *)data = known ? b->size : 0; return CUDA_SUCCESS;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
}

CUresult cuPointerGetAttribute(void *data, int a, CUdeviceptr ptr) {
  NEED_INIT();
  struct block b;
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  if (!find((uintptr_t)ptr, &b)) return CUDA_ERROR_INVALID_VALUE;  /* documented: memory CUDA does not know */
  if (a == ATTR_HOST_POINTER && b.kind != MEMTYPE_HOST) return CUDA_ERROR_INVALID_VALUE;
  return attribute(data, a, (uintptr_t)ptr, true, &b);
}

CUresult cuPointerGetAttributes(unsigned int n, int *attributes, void **data, CUdeviceptr ptr) {
  NEED_CONTEXT();  /* a query with no context current fails (cupy/cupy#3991): the driver double does the same */
  struct block b;
  bool known = find((uintptr_t)ptr, &b);
  if (!attributes || !data) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned int i = 0; i < n; i++) {
    CUresult r = attribute(data[i], attributes[i], (uintptr_t)ptr, known, &b);
    if (r != CUDA_SUCCESS) return r;
  }
  TRACE("cuPointerGetAttributes(%u, %#llx) known=%d", n, ptr, known);
  return CUDA_SUCCESS;
}

/* -- cuGetProcAddress: how the bindings find every function ------------------------------------------------------ */

/* The bindings ask for each function by its base name and the CUDA version it appeared in (cuMemAlloc at 3020 is
 * cuMemAlloc_v2); every function here has one ABI, so any version finds it. */
struct entry { const char *name; void *fn; };
#define E(base, fn) {#base, (void *)fn}
static const struct entry table[] = {
  E(cuInit, cuInit), E(cuDriverGetVersion, cuDriverGetVersion), E(cuGetErrorName, cuGetErrorName),
  E(cuGetErrorString, cuGetErrorString), E(cuDeviceGetCount, cuDeviceGetCount), E(cuDeviceGet, cuDeviceGet),
  E(cuDeviceGetName, cuDeviceGetName), E(cuDeviceTotalMem, cuDeviceTotalMem_v2),
  E(cuDeviceGetAttribute, cuDeviceGetAttribute), E(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain),
  E(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2),
  E(cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState), E(cuCtxGetCurrent, cuCtxGetCurrent),
  E(cuCtxSetCurrent, cuCtxSetCurrent), E(cuCtxPushCurrent, cuCtxPushCurrent_v2),
  E(cuCtxPopCurrent, cuCtxPopCurrent_v2), E(cuCtxGetDevice, cuCtxGetDevice), E(cuCtxGetId, cuCtxGetId),
  E(cuCtxGetFlags, cuCtxGetFlags), E(cuCtxSynchronize, cuCtxSynchronize), E(cuStreamCreate, cuStreamCreate),
  E(cuStreamCreateWithPriority, cuStreamCreateWithPriority), E(cuStreamDestroy, cuStreamDestroy_v2),
  E(cuStreamGetFlags, cuStreamGetFlags), E(cuStreamSynchronize, cuStreamSynchronize),
  E(cuStreamQuery, cuStreamQuery), E(cuStreamWaitEvent, cuStreamWaitEvent), E(cuEventCreate, cuEventCreate),
  E(cuEventRecord, cuEventRecord), E(cuEventQuery, cuEventQuery), E(cuEventSynchronize, cuEventSynchronize),
  E(cuEventDestroy, cuEventDestroy_v2), E(cuMemAlloc, cuMemAlloc_v2), E(cuMemAllocAsync, cuMemAllocAsync),
  E(cuMemFree, cuMemFree_v2), E(cuMemFreeAsync, cuMemFreeAsync), E(cuMemHostAlloc, cuMemHostAlloc),
  E(cuMemAllocHost, cuMemAllocHost_v2), E(cuMemFreeHost, cuMemFreeHost),
  E(cuMemHostGetDevicePointer, cuMemHostGetDevicePointer_v2), E(cuMemGetInfo, cuMemGetInfo_v2),
  E(cuMemcpy, cuMemcpy), E(cuMemcpyAsync, cuMemcpyAsync), E(cuMemcpyHtoD, cuMemcpyHtoD_v2),
  E(cuMemcpyDtoH, cuMemcpyDtoH_v2), E(cuMemcpyDtoD, cuMemcpyDtoD_v2), E(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2),
  E(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2), E(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2),
  E(cuMemcpy2D, cuMemcpy2D_v2), E(cuMemcpy2DAsync, cuMemcpy2DAsync_v2), E(cuMemsetD8, cuMemsetD8_v2),
  E(cuMemsetD8Async, cuMemsetD8Async), E(cuPointerGetAttribute, cuPointerGetAttribute),
  E(cuPointerGetAttributes, cuPointerGetAttributes),
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status) {
  (void)version;
  (void)flags;
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  const char *hidden = getenv("CUDA_STUB_HIDE");  /* a driver too old for these (comma-separated base names) */
  size_t len = strlen(symbol);
  for (const char *h = hidden; h && (h = strstr(h, symbol)); h += len) {
    if ((h == hidden || h[-1] == ',') && (h[len] == ',' || h[len] == '\0')) {
      *pfn = NULL;
      if (status) *status = 2;  /* CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT */
      return CUDA_ERROR_NOT_FOUND;
    }
  }
  for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
    if (strcmp(table[i].name, symbol) == 0) {
      *pfn = table[i].fn;
      if (status) *status = 0;  /* CU_GET_PROC_ADDRESS_SUCCESS */
      return CUDA_SUCCESS;
    }
  }
  *pfn = NULL;
  if (status) *status = 1;  /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
  return CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
