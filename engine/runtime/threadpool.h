/*
 * threadpool.h: a persistent pool of worker threads for the CPU forward pass (internal to the engine).
 *
 * eng_pool_run(pool, fn, arg) runs fn(arg, ith, nth) on every one of the pool's nth threads at once (the
 * calling thread is thread 0, the workers 1..nth-1) and returns when all have returned. Inside fn, the
 * threads synchronize with eng_pool_barrier (every thread of the pool must call it the same number of
 * times). Waiting spins briefly, then sleeps on a futex, so an idle pool costs no CPU.
 *
 * Thread-safety: one thread at a time may call eng_pool_run (the pool's owner); fn must not call
 * eng_pool_run. Errors: eng_pool_create returns 0, ENG_ERR_INVALID (n_threads < 1) or ENG_ERR_NOMEM.
 */
#ifndef KVSERVE_ENGINE_THREADPOOL_H
#define KVSERVE_ENGINE_THREADPOOL_H

typedef struct eng_pool eng_pool;
typedef void (*eng_pool_fn)(void *arg, int ith, int nth);

int eng_pool_create(int n_threads, eng_pool **out);
void eng_pool_free(eng_pool *p); /* joins the workers; NULL is a no-op */
int eng_pool_size(const eng_pool *p);
void eng_pool_run(eng_pool *p, eng_pool_fn fn, void *arg);
void eng_pool_barrier(eng_pool *p);

/* The number of CPU cores this process may run on (its affinity mask; at least 1). */
int eng_cpu_count(void);

#endif
