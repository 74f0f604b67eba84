/* A stand-in for libnvidia-ml.so.1 with the few calls the probe makes, for tests.
 *
 * FAKE_NVML_PROCS  compute processes on every GPU (default 0)
 * FAKE_NVML_UTIL   utilisation percent (default 0)
 * FAKE_NVML_GEN    link generation, now and at most (default 5); width is always 16
 */
#include <stdlib.h>

typedef int nvmlReturn_t;

static unsigned env(const char *name, unsigned fallback) {
    const char *value = getenv(name);
    return value ? (unsigned)atoi(value) : fallback;
}

nvmlReturn_t nvmlInit_v2(void) { return 0; }
nvmlReturn_t nvmlShutdown(void) { return 0; }
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **handle) {
    (void)bus; *handle = (void *)1; return 0;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(void *handle, unsigned *rates) {
    (void)handle; rates[0] = env("FAKE_NVML_UTIL", 0); rates[1] = 0; return 0;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *handle, unsigned *count, void *infos) {
    (void)handle; (void)infos;
    unsigned running = env("FAKE_NVML_PROCS", 0);
    if (running > *count) { *count = running; return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */ }
    *count = running; return 0;
}
static nvmlReturn_t one(void *handle, unsigned *value, unsigned what) {
    (void)handle; *value = what; return 0;
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(void *h, unsigned *v) { return one(h, v, env("FAKE_NVML_GEN", 5)); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(void *h, unsigned *v) { return one(h, v, env("FAKE_NVML_GEN", 5)); }
nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(void *h, unsigned *v) { return one(h, v, env("FAKE_NVML_GEN", 5)); }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(void *h, unsigned *v) { return one(h, v, 16); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(void *h, unsigned *v) { return one(h, v, 16); }
