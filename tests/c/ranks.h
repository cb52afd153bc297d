/*
 * What the multi-rank C tests share: CHECK (count a failure, say where, go on) and
 * run_ranks (one forked process per rank; the number of ranks that failed) and
 * ranks_barrier (all ranks meet once: a rank that destroys its communicator while a
 * peer is still in an op with it fails that peer).
 */
#ifndef ANYCHIP_TESTS_RANKS_H
#define ANYCHIP_TESTS_RANKS_H

#include <stdio.h>
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
