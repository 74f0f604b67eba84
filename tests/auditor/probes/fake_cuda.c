/* A stand-in for libcuda.so.1 with the entry points the probe binds, for tests on machines
 * without a GPU. It copies real bytes between malloc'd buffers and times copies from the
 * bytes queued at FAKE_CUDA_GBPS (default 50), so a test knows the figure to expect.
 *
 * FAKE_CUDA_DEVICES  number of devices (default 1)
 * FAKE_CUDA_BUSES    their PCI addresses, comma-separated (default 0000:41:00.0, 0000:42:00.0)
 * FAKE_CUDA_INIT     the code cuInit returns (default 0)
 * FAKE_CUDA_HANG     "init": cuInit never returns (after writing the pid to FAKE_CUDA_PIDFILE)
 * FAKE_CUDA_FAIL     "copy": asynchronous copies fail (CUDA_ERROR_LAUNCH_FAILED, 719)
 * FAKE_CUDA_PEER_ON_GBPS  the rate of peer copies while peer access is on (default: the
 *                    same as FAKE_CUDA_GBPS); below it, the signature of a redirected path
 * FAKE_CUDA_LEDGER   a file holding "host=N device=N": the buffers allocated and not yet
 *                    freed, rewritten at each allocation and free (the probe's child ends
 *                    with _exit, which runs no destructor)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
static long host_live, device_live;
static size_t device_bytes;
static double queued, slow;
static int peer_on;
static int current;

static const char *env(const char *name, const char *fallback) {
    const char *value = getenv(name);
    return value ? value : fallback;
}

static void ledger(void) {
    const char *path = getenv("FAKE_CUDA_LEDGER");
    if (!path) return;
    FILE *out = fopen(path, "w");
    if (!out) return;
    fprintf(out, "host=%ld device=%ld\n", host_live, device_live);
    fclose(out);
}

CUresult cuInit(unsigned flags) {
    (void)flags;
    if (strcmp(env("FAKE_CUDA_HANG", ""), "init") == 0) {
        const char *pidfile = getenv("FAKE_CUDA_PIDFILE");
        if (pidfile) {
            FILE *out = fopen(pidfile, "w");
            if (out) { fprintf(out, "%d\n", (int)getpid()); fclose(out); }
        }
        for (;;) pause();
    }
    return atoi(env("FAKE_CUDA_INIT", "0"));
}
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = atoi(env("FAKE_CUDA_DEVICES", "1")); return 0; }
CUresult cuDeviceGet(int *d, int i) { *d = i; return 0; }
CUresult cuDeviceGetName(char *name, int len, int d) {
    (void)d; snprintf(name, len, "Fake H200"); return 0;
}
CUresult cuDeviceGetPCIBusId(char *bus, int len, int d) {
    char buses[256];
    snprintf(buses, sizeof buses, "%s", env("FAKE_CUDA_BUSES", "0000:41:00.0,0000:42:00.0"));
    char *save = NULL, *item = strtok_r(buses, ",", &save);
    for (int i = 0; item && i < d; i++) item = strtok_r(NULL, ",", &save);
    snprintf(bus, len, "%s", item ? item : "0000:ff:00.0");
    return 0;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, int d) { (void)d; *bytes = (size_t)1 << 30; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int d) { *ctx = (void *)(intptr_t)(d + 1); return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return 0; }
CUresult cuCtxSetCurrent(void *ctx) { current = (int)(intptr_t)ctx; return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    *total = (size_t)1 << 30; *free = *total - device_bytes; return 0;
}
CUresult cuMemAllocHost_v2(void **p, size_t n) {
    *p = malloc(n); if (!*p) return 2; host_live++; ledger(); return 0;
}
CUresult cuMemFreeHost(void *p) { free(p); host_live--; ledger(); return 0; }
CUresult cuMemAlloc_v2(uint64_t *p, size_t n) {
    void *m = malloc(n + sizeof(size_t)); if (!m) return 2;
    *(size_t *)m = n; device_bytes += n; device_live++; ledger();
    *p = (uint64_t)(uintptr_t)((char *)m + sizeof(size_t)); return 0;
}
CUresult cuMemFree_v2(uint64_t p) {
    char *m = (char *)(uintptr_t)p - sizeof(size_t);
    device_bytes -= *(size_t *)m; device_live--; free(m); ledger(); return 0;
}
static CUresult copy(void *dst, const void *src, size_t n, int async) {
    if (async && strcmp(env("FAKE_CUDA_FAIL", ""), "copy") == 0) return 719;
    memcpy(dst, src, n); queued += (double)n; return 0;
}
CUresult cuMemcpyHtoD_v2(uint64_t d, const void *h, size_t n) { return copy((void *)(uintptr_t)d, h, n, 0); }
CUresult cuMemcpyDtoH_v2(void *h, uint64_t d, size_t n) { return copy(h, (void *)(uintptr_t)d, n, 0); }
CUresult cuMemcpyHtoDAsync_v2(uint64_t d, const void *h, size_t n, void *s) { (void)s; return copy((void *)(uintptr_t)d, h, n, 1); }
CUresult cuMemcpyDtoHAsync_v2(void *h, uint64_t d, size_t n, void *s) { (void)s; return copy(h, (void *)(uintptr_t)d, n, 1); }
CUresult cuMemcpyPeerAsync(uint64_t d, void *dc, uint64_t s, void *sc, size_t n, void *st) {
    (void)dc; (void)sc; (void)st;
    if (peer_on && getenv("FAKE_CUDA_PEER_ON_GBPS")) {
        memcpy((void *)(uintptr_t)d, (void *)(uintptr_t)s, n); slow += (double)n; return 0;
    }
    return copy((void *)(uintptr_t)d, (void *)(uintptr_t)s, n, 1);
}
CUresult cuDeviceCanAccessPeer(int *ok, int a, int b) { (void)a; (void)b; *ok = 1; return 0; }
CUresult cuCtxEnablePeerAccess(void *c, unsigned f) { (void)c; (void)f; peer_on = 1; return 0; }
CUresult cuCtxDisablePeerAccess(void *c) { (void)c; peer_on = 0; return 0; }
CUresult cuStreamCreate(void **s, unsigned f) { (void)f; *s = malloc(1); return 0; }
CUresult cuStreamDestroy_v2(void *s) { free(s); return 0; }
CUresult cuEventCreate(void **e, unsigned f) { (void)f; *e = malloc(2 * sizeof(double)); return 0; }
CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
CUresult cuEventRecord(void *e, void *s) {
    (void)s; ((double *)e)[0] = queued; ((double *)e)[1] = slow; return 0;
}
CUresult cuEventSynchronize(void *e) { (void)e; return 0; }
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) {
    double gbps = atof(env("FAKE_CUDA_GBPS", "50"));
    double peer = atof(env("FAKE_CUDA_PEER_ON_GBPS", "1"));
    double bytes = ((double *)b)[0] - ((double *)a)[0];
    double slow_bytes = ((double *)b)[1] - ((double *)a)[1];
    *ms = (float)(bytes / (gbps * 1e9) * 1e3 + slow_bytes / (peer * 1e9) * 1e3);
    return 0;
}
CUresult cuGetErrorName(CUresult code, const char **name) {
    *name = code == 719 ? "CUDA_ERROR_LAUNCH_FAILED"
          : code == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
