/*
 * vmfabric/mtx.h -- minitransactions, barriers and condition variables for MPI programs (vmfabric's extension; docs/minitransactions.md).
 *
 * Include after <mpi.h>. Build: `cc -I$(vmfabric info --incdir) prog.c -L$(vmfabric info --libdir) -lvmfabric`
 * (with Debian's mpicc.mpich too: libvmfabric.so is our libmpich.so.12, so the program's only library
 * dependency stays libmpich.so.12 and `vmfabric run` gives it ours; our mpi.h in that directory has MPICH's
 * ABI). Our own mpicc needs only -lvmfabric, or nothing: it links libmpich.so.12 already.
 *
 * Return codes: VMF_MTX_COMMITTED (0), VMF_MTX_COMPARE_FAILED, VMF_MTX_LOCK_FAILED, or a negative VMF_ERR_*;
 * vmf_strerror(code) describes it (this thread's last error message when it had that code).
 */
#ifndef VMFABRIC_MTX_H
#define VMFABRIC_MTX_H

#include <stddef.h>

#if defined(__cplusplus)
extern "C" {
#endif

typedef struct vmf_store *vmf_store_t;
typedef struct vmf_mtx *vmf_mtx_t;
typedef struct vmf_barrier *vmf_barrier_t;
typedef struct vmf_cond *vmf_cond_t;

#define VMF_MTX_COMMITTED 0
#define VMF_MTX_COMPARE_FAILED 1
#define VMF_MTX_LOCK_FAILED 2

#define VMF_MTX_TRY 0      /* fail with VMF_MTX_LOCK_FAILED on a held lock */
#define VMF_MTX_BLOCKING 1 /* wait for held locks (no deadlock, no starvation) */

#define VMF_BARRIER_SPIN 0
#define VMF_BARRIER_BLOCK 1
#define VMF_BARRIER_ADAPTIVE 2

#define VMF_COND_SPIN 0     /* waiters busy-wait (002_*'s non-blocking condition variable) */
#define VMF_COND_BLOCK 1    /* waiters sleep (futex in one kernel; bounded sleeps between VMs) */
#define VMF_COND_ADAPTIVE 2 /* spin, then yield, then sleep */

#define VMF_ERR_ARG (-1)      /* invalid argument: node, offset+len, kind, flags, NULL pointer */
#define VMF_ERR_HANDLE (-2)   /* NULL, freed or foreign handle */
#define VMF_ERR_CORRUPT (-3)  /* the store's shared state is corrupt */
#define VMF_ERR_IO (-4)       /* a store or barrier file could not be created or opened */
#define VMF_ERR_NOSLOT (-5)   /* no free participant slot in the store */
#define VMF_ERR_TOOLARGE (-6) /* too many stripes or write bytes in one minitransaction */
#define VMF_ERR_REMOTE (-7)   /* a memory node on another host failed; or a condition variable over hosts */
#define VMF_ERR_MPI (-8)      /* an MPI call inside failed */
#define VMF_ERR_PEER (-9)     /* a barrier or condition-variable participant (or the mutex holder) died */

int vmf_store_create(MPI_Comm comm, size_t bytes, vmf_store_t *store); /* collective; rank r of comm is memory node r */
int vmf_store_open(const char *path, vmf_store_t *store);              /* a store made by `vmfabric mtx create PATH` */
int vmf_store_size(vmf_store_t store, int *nodes, size_t *bytes);
int vmf_store_free(vmf_store_t *store); /* collective for a store from vmf_store_create */

int vmf_mtx_begin(vmf_store_t store, vmf_mtx_t *tx);
int vmf_mtx_compare(vmf_mtx_t tx, int node, size_t offset, const void *expected, size_t len);
int vmf_mtx_read(vmf_mtx_t tx, int node, size_t offset, void *out, size_t len); /* out filled on commit */
int vmf_mtx_write(vmf_mtx_t tx, int node, size_t offset, const void *data, size_t len);
int vmf_mtx_set_compare(vmf_mtx_t tx, int item, const void *expected, size_t len); /* new bytes for compare item `item` (same len) */
int vmf_mtx_set_write(vmf_mtx_t tx, int item, const void *data, size_t len);       /* new bytes for write item `item` (same len) */
int vmf_mtx_commit(vmf_mtx_t tx, int flags);
int vmf_mtx_failed_item(vmf_mtx_t tx); /* index of the first failing compare item, or -1 */
int vmf_mtx_reset(vmf_mtx_t tx);       /* forget the items; the tx can be reused */
int vmf_mtx_free(vmf_mtx_t *tx);

int vmf_barrier_create(MPI_Comm comm, int kind, vmf_barrier_t *b); /* collective */
int vmf_barrier_wait(vmf_barrier_t b);
int vmf_barrier_free(vmf_barrier_t *b);

/* A process-shared condition variable with its mutex, among the ranks of comm (all on one host). As with
 * POSIX condition variables, wait may return without a signal: re-check the predicate in a loop. */
int vmf_cond_create(MPI_Comm comm, int kind, vmf_cond_t *c); /* collective */
int vmf_cond_lock(vmf_cond_t c);
int vmf_cond_unlock(vmf_cond_t c);
int vmf_cond_wait(vmf_cond_t c);      /* with the lock held: release it, wait, take it again */
int vmf_cond_signal(vmf_cond_t c);    /* wake at least one waiter */
int vmf_cond_broadcast(vmf_cond_t c); /* wake every waiter */
int vmf_cond_free(vmf_cond_t *c);

const char *vmf_strerror(int code);

#if defined(__cplusplus)
}
#endif
#endif
