/* threadpool.c: persistent workers, a generation counter to start work and a counting barrier, both
 * waiting by spinning briefly and then sleeping on a Linux futex. */
#include "engine/runtime/threadpool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine/engine.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

enum { SPIN_ITERS = 4000 };

struct eng_pool {
    int n;
    pthread_t *threads;      /* [n - 1] workers */
    struct worker_arg *args; /* [n - 1] */
    _Atomic uint32_t gen;    /* incremented to start a run (or to stop) */
    _Atomic uint32_t gen_sleepers;
    _Atomic int stop;
    eng_pool_fn fn;
    void *arg;
    _Atomic uint32_t bar_count;
    _Atomic uint32_t bar_phase;
    _Atomic uint32_t bar_sleepers;
};

struct worker_arg { eng_pool *p; int ith; };

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}
static void futex_wake_all(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Waits until *addr != val: spins, then sleeps (sleepers counts the sleeping threads for the waker). */
static void wait_change(_Atomic uint32_t *addr, uint32_t val, _Atomic uint32_t *sleepers) {
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (atomic_load_explicit(addr, memory_order_acquire) != val) return;
        CPU_RELAX();
    }
    atomic_fetch_add(sleepers, 1);
    while (atomic_load(addr) == val) futex_wait(addr, val);
    atomic_fetch_sub(sleepers, 1);
}

static void bump_and_wake(_Atomic uint32_t *addr, _Atomic uint32_t *sleepers) {
    atomic_fetch_add(addr, 1);
    if (atomic_load(sleepers) > 0) futex_wake_all(addr);
}

void eng_pool_barrier(eng_pool *p) {
    if (p->n == 1) return;
    uint32_t phase = atomic_load(&p->bar_phase);
    if (atomic_fetch_add(&p->bar_count, 1) == (uint32_t)p->n - 1) {
        atomic_store(&p->bar_count, 0);
        bump_and_wake(&p->bar_phase, &p->bar_sleepers);
    } else {
        wait_change(&p->bar_phase, phase, &p->bar_sleepers);
    }
}

static void *worker_main(void *varg) {
    struct worker_arg *wa = varg;
    eng_pool *p = wa->p;
    uint32_t seen = 0;
    for (;;) {
        wait_change(&p->gen, seen, &p->gen_sleepers);
        seen = atomic_load(&p->gen);
        if (atomic_load(&p->stop)) break;
        p->fn(p->arg, wa->ith, p->n);
        eng_pool_barrier(p);
    }
    return NULL;
}

int eng_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n >= 1) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (n > 1024 ? 1024 : (int)n);
}

int eng_pool_create(int n_threads, eng_pool **out) {
    if (!out || n_threads < 1) return ENG_ERR_INVALID;
    *out = NULL;
    eng_pool *p = calloc(1, sizeof *p);
    if (!p) return ENG_ERR_NOMEM;
    p->n = n_threads;
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->args = calloc((size_t)n_threads - 1, sizeof *p->args);
        if (!p->threads || !p->args) {
            free(p->threads);
            free(p->args);
            free(p);
            return ENG_ERR_NOMEM;
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        p->args[i].p = p;
        p->args[i].ith = i + 1;
        if (pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]) != 0) {
            p->n = i + 1; /* the workers started so far */
            eng_pool_free(p);
            return ENG_ERR_NOMEM;
        }
    }
    *out = p;
    return 0;
}

void eng_pool_free(eng_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    bump_and_wake(&p->gen, &p->gen_sleepers);
    for (int i = 0; i < p->n - 1; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p->args);
    free(p);
}

int eng_pool_size(const eng_pool *p) { return p ? p->n : 0; }

void eng_pool_run(eng_pool *p, eng_pool_fn fn, void *arg) {
    p->fn = fn;
    p->arg = arg;
    if (p->n > 1) bump_and_wake(&p->gen, &p->gen_sleepers);
    fn(arg, 0, p->n);
    eng_pool_barrier(p);
}
