/*
 * What the multi-rank C tests share: CHECK (count a failure, say where, go on), REQUIRE (a
 * library call the rank cannot go on without), run_ranks (one forked process per rank; the
 * number of ranks that failed) and ranks_barrier (all ranks meet once: a rank that destroys
 * its communicator while a peer is still in an op with it fails that peer); and dev_alloc
 * when the test defines RANKS_MALLOC(void **p, size_t n), its API's allocation call (0 on
 * success), before including this header.
 */
#ifndef ANYCHIP_TESTS_RANKS_H
#define ANYCHIP_TESTS_RANKS_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures;
static int rank __attribute__((unused)); /* this process's rank (some tests pass it as a parameter) */

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "rank %d line %d: ", rank, __LINE__);          \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
            failures++;                                                    \
        }                                                                  \
    } while (0)

/* `call` must return `ok`: else the rank says where, with the status and text_of(status), and
 * ends (exit 2). NO_TEXT is the text_of of an API without a status text. */
#define REQUIRE(call, ok, text_of)                                                                    \
    do {                                                                                              \
        __typeof__(call) r_ = (call);                                                                 \
        if (r_ != (ok)) {                                                                             \
            fprintf(stderr, "rank %d line %d: %s -> %d %s\n", rank, __LINE__, #call, (int)r_, text_of(r_)); \
            exit(2);                                                                                  \
        }                                                                                             \
    } while (0)
#define NO_TEXT(status) ""

#ifdef RANKS_MALLOC
/* n bytes of device memory, or the rank ends (exit 3) */
static void *dev_alloc(size_t n)
{
    void *p = NULL;
    if (RANKS_MALLOC(&p, n) != 0)
        exit(3);
    return p;
}
#endif

static int ranks_n, ranks_arrive[2], ranks_leave[2];

/* Return once every rank has called it (once per run: rank 0 collects the others). */
__attribute__((unused)) static void ranks_barrier(void)
{
    char c = 'x';
    if (rank == 0) {
        for (int r = 1; r < ranks_n; r++)
            CHECK(read(ranks_arrive[0], &c, 1) == 1, "barrier: arrive");
        for (int r = 1; r < ranks_n; r++)
            CHECK(write(ranks_leave[1], &c, 1) == 1, "barrier: leave");
    } else {
        CHECK(write(ranks_arrive[1], &c, 1) == 1, "barrier: arrive");
        CHECK(read(ranks_leave[0], &c, 1) == 1, "barrier: leave");
    }
}

/* Fork `nranks` processes; process r sets `rank` = r and exits with body(nranks, arg).
 * Returns how many of them failed (a non-zero exit or a signal). */
__attribute__((unused)) static int run_ranks(int nranks, int (*body)(int nranks, void *arg), void *arg)
{
    ranks_n = nranks;
    if (pipe(ranks_arrive) != 0 || pipe(ranks_leave) != 0)
        return nranks;
    for (int r = 0; r < nranks; r++) {
        if (fork() == 0) {
            rank = r;
            int rc = body(nranks, arg);
            fflush(stdout);
            fflush(stderr);
            _exit(rc);
        }
    }
    int failed = 0, status;
    while (wait(&status) > 0)
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failed++;
    return failed;
}

#endif
