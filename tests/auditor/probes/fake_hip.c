/* A stand-in for libamdhip64.so with the HIP calls the copy probe makes, for tests: real
 * copies between malloc'd buffers, timed from the bytes queued at FAKE_HIP_GBPS (default 25).
 * FAKE_CUDA_LEDGER (shared with the CUDA stand-in) receives "host=N device=N" after each
 * allocation and free. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int hipError_t;
static long host_live, device_live;
static double queued;

static void ledger(void) {
    const char *path = getenv("FAKE_CUDA_LEDGER");
    FILE *out = path ? fopen(path, "w") : NULL;
    if (!out) return;
    fprintf(out, "host=%ld device=%ld\n", host_live, device_live);
    fclose(out);
}

hipError_t hipInit(unsigned flags) { (void)flags; return 0; }
hipError_t hipDriverGetVersion(int *v) { *v = 60443483; return 0; }
hipError_t hipGetDeviceCount(int *n) { *n = 1; return 0; }
hipError_t hipDeviceGetName(char *name, int len, int d) { (void)d; snprintf(name, len, "Fake MI300X"); return 0; }
hipError_t hipDeviceGetPCIBusId(char *bus, int len, int d) { (void)d; snprintf(bus, len, "0000:05:00.0"); return 0; }
hipError_t hipDeviceTotalMem(size_t *bytes, int d) { (void)d; *bytes = (size_t)1 << 30; return 0; }
hipError_t hipSetDevice(int d) { (void)d; return 0; }
hipError_t hipMemGetInfo(size_t *free, size_t *total) { *total = (size_t)1 << 30; *free = *total; return 0; }
hipError_t hipHostMalloc(void **p, size_t n, unsigned flags) { (void)flags; *p = malloc(n); host_live++; ledger(); return *p ? 0 : 2; }
hipError_t hipHostFree(void *p) { free(p); host_live--; ledger(); return 0; }
hipError_t hipMalloc(void **p, size_t n) { *p = malloc(n); device_live++; ledger(); return *p ? 0 : 2; }
hipError_t hipFree(void *p) { free(p); device_live--; ledger(); return 0; }
hipError_t hipMemcpy(void *d, const void *s, size_t n, int kind) { (void)kind; memcpy(d, s, n); return 0; }
hipError_t hipMemcpyAsync(void *d, const void *s, size_t n, int kind, void *st) {
    (void)kind; (void)st; memcpy(d, s, n); queued += (double)n; return 0;
}
hipError_t hipStreamCreate(void **s) { *s = malloc(1); return 0; }
hipError_t hipStreamDestroy(void *s) { free(s); return 0; }
hipError_t hipEventCreate(void **e) { *e = malloc(sizeof(double)); return 0; }
hipError_t hipEventDestroy(void *e) { free(e); return 0; }
hipError_t hipEventRecord(void *e, void *s) { (void)s; *(double *)e = queued; return 0; }
hipError_t hipEventSynchronize(void *e) { (void)e; return 0; }
hipError_t hipEventElapsedTime(float *ms, void *a, void *b) {
    const char *rate = getenv("FAKE_HIP_GBPS");
    *ms = (float)((*(double *)b - *(double *)a) / ((rate ? atof(rate) : 25.0) * 1e9) * 1e3);
    return 0;
}
const char *hipGetErrorName(hipError_t code) { (void)code; return "hipErrorUnknown"; }
