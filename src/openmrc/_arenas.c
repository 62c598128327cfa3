/* openmrc._arenas: CPython's small-object arenas on transparent huge pages (Linux).
 *
 * A large simulation is tens of millions of small objects touched in no particular order (packets, ports,
 * QPs, EV entries): with 4 KB pages nearly every touch of a cold object also misses the TLB and walks the
 * page tables. pymalloc takes its memory in arenas (1 MB in CPython 3.11) from an arena allocator, which
 * an extension may replace (PyObject_SetArenaAllocator). This one hands out arenas carved from regions of
 * 64 arenas, each region aligned to 2 MB and advised MADV_HUGEPAGE, so the kernel backs them with huge
 * pages when it has them (`transparent_hugepage/enabled` set to `madvise` or `always`).
 *
 * An arena pymalloc gives back stays mapped and is handed out again (one bit per arena in its region's
 * free mask; nothing is written into a free arena). Arenas of other sizes, and arenas made before the
 * allocator was installed, go to (and come back through) the allocator it replaced. pymalloc calls the
 * allocator with the GIL held.
 *
 * Built by scripts/build_native.py with the mypyc modules; openmrc._native.huge_page_arenas installs it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)
#define PER_REGION 64     /* arenas in a region: one bit each in a 64-bit free mask */
#define MAX_REGIONS 16384 /* 16384 regions of 64 one-MB arenas: 1 TB */

static PyObjectArenaAllocator previous;
static size_t arena_bytes;  /* the size of pymalloc's arenas: set at the first request */
static size_t region_bytes; /* PER_REGION arenas */
static char *regions[MAX_REGIONS];
static uint64_t free_mask[MAX_REGIONS]; /* bit i: arena i of the region is free (given back) */
static unsigned carved[MAX_REGIONS];    /* arenas of the region handed out at least once */
static size_t n_regions, n_free, n_out, n_foreign;
static int installed;

static char *new_region(void) {
    if (n_regions == MAX_REGIONS) return NULL;
    size_t span = region_bytes + HUGE_PAGE;
    char *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    char *base = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (base > m) munmap(m, (size_t)(base - m));
    char *end = base + region_bytes;
    if (m + span > end) munmap(end, (size_t)(m + span - end));
#ifdef MADV_HUGEPAGE
    madvise(base, region_bytes, MADV_HUGEPAGE); /* a hint: without huge pages it is plain memory */
#endif
    regions[n_regions] = base;
    free_mask[n_regions] = 0;
    carved[n_regions] = 0;
    n_regions++;
    return base;
}

static void *arena_alloc(void *ctx, size_t size) {
    (void)ctx;
    if (arena_bytes == 0 && size > 0 && size <= HUGE_PAGE * 32) {
        arena_bytes = size;
        region_bytes = (size * PER_REGION + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    }
    if (size != arena_bytes) return previous.alloc(previous.ctx, size);
    if (n_free) { /* one given back: the newest region's first */
        for (size_t r = n_regions; r-- > 0;) {
            uint64_t m = free_mask[r];
            if (m) {
                int i = __builtin_ctzll(m);
                free_mask[r] = m & (m - 1);
                n_free--;
                n_out++;
                return regions[r] + (size_t)i * size;
            }
        }
    }
    size_t r = n_regions;
    if (r == 0 || carved[r - 1] == PER_REGION) {
        if (new_region() == NULL) return previous.alloc(previous.ctx, size);
        r = n_regions;
    }
    n_out++;
    return regions[r - 1] + (size_t)(carved[r - 1]++) * size;
}

static void arena_free(void *ctx, void *ptr, size_t size) {
    (void)ctx;
    char *p = (char *)ptr;
    if (size == arena_bytes) {
        for (size_t r = 0; r < n_regions; r++) {
            if (p >= regions[r] && p < regions[r] + region_bytes) {
                free_mask[r] |= (uint64_t)1 << ((size_t)(p - regions[r]) / size);
                n_free++;
                n_out--;
                return;
            }
        }
    }
    n_foreign++;
    previous.free(previous.ctx, ptr, size);
}

static PyObject *install(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (!installed) {
        PyObject_GetArenaAllocator(&previous);
        PyObjectArenaAllocator mine = {NULL, arena_alloc, arena_free};
        PyObject_SetArenaAllocator(&mine);
        installed = 1;
    }
    Py_RETURN_TRUE;
}

static PyObject *stats(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("{s:O,s:n,s:n,s:n,s:n,s:n}", "installed", installed ? Py_True : Py_False,
                         "arena_bytes", (Py_ssize_t)arena_bytes, "regions", (Py_ssize_t)n_regions,
                         "arenas_out", (Py_ssize_t)n_out, "arenas_free", (Py_ssize_t)n_free,
                         "foreign_frees", (Py_ssize_t)n_foreign);
}

static PyMethodDef methods[] = {
    {"install", install, METH_NOARGS,
     "install() -> True: from now on pymalloc's arenas come from 2 MB-aligned regions advised for huge "
     "pages (idempotent)."},
    {"stats", stats, METH_NOARGS,
     "stats() -> dict: installed, arena_bytes, regions, arenas_out, arenas_free, foreign_frees."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "openmrc._arenas",
                                    "pymalloc's arenas on transparent huge pages", -1, methods};

PyMODINIT_FUNC PyInit__arenas(void) { return PyModule_Create(&module); }
