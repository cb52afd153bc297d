/* The collective engine's C API from C: N forked ranks run an all_reduce (small and chunked),
 * a send/recv ring in one group, a deferred task, a reduce_scatter, and check mode.
 * Build: cc -Icsrc tests/c/ccl_api.c -l:libanychip_ccl...so ; run: ./ccl_api ID NRANKS */
#include "ccl/ccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(cond, ...)                                                                    \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "rank %d: line %d: ", rank, __LINE__);                          \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fprintf(stderr, "\n");                                                          \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

static int run_rank(const char *id, int rank, int n)
{
    ccl_comm *comm;
    int st = ccl_comm_init(id, rank, n, 30.0, &comm);
    CHECK(st == CCL_OK, "init: %s (%s)", ccl_status_name(st), ccl_init_error());
    CHECK(ccl_comm_rank(comm) == rank && ccl_comm_size(comm) == n, "rank/size");

    /* all_reduce, in place, a small and a chunked size */
    size_t sizes[2] = {7, 3 * 1024 * 1024 + 5};
    for (int k = 0; k < 2; k++) {
        size_t count = sizes[k];
        int32_t *buf = malloc(count * sizeof *buf);
        for (size_t i = 0; i < count; i++)
            buf[i] = (int32_t)(i % 1000) + rank;
        ccl_op op = {.kind = CCL_ALL_REDUCE, .dtype = CCL_INT32, .redop = CCL_SUM, .count = count};
        op.send.ptr = op.recv.ptr = buf;
        st = ccl_run(comm, &op, 1);
        CHECK(st == CCL_OK, "all_reduce: %s", ccl_comm_error(comm));
        for (size_t i = 0; i < count; i++)
            CHECK(buf[i] == (int32_t)(i % 1000) * n + n * (n - 1) / 2, "all_reduce[%zu] = %d", i, buf[i]);
        free(buf);
    }

    /* a send/recv ring in one group (would deadlock one op at a time beyond the channel size) */
    size_t count = 1 << 20;
    float *out = malloc(count * sizeof *out), *in = malloc(count * sizeof *in);
    for (size_t i = 0; i < count; i++)
        out[i] = (float)rank;
    ccl_op ring[2] = {
        {.kind = CCL_SEND, .dtype = CCL_FLOAT32, .root = (rank + 1) % n, .count = count},
        {.kind = CCL_RECV, .dtype = CCL_FLOAT32, .root = (rank + n - 1) % n, .count = count},
    };
    ring[0].send.ptr = out;
    ring[1].recv.ptr = in;
    st = ccl_run(comm, ring, 2);
    CHECK(st == CCL_OK, "ring: %s", ccl_comm_error(comm));
    for (size_t i = 0; i < count; i++)
        CHECK(in[i] == (float)((rank + n - 1) % n), "ring[%zu] = %g", i, in[i]);

    /* a deferred task (what a stream host function runs) */
    ccl_op rs = {.kind = CCL_REDUCE_SCATTER, .dtype = CCL_FLOAT32, .redop = CCL_MAX, .count = count / n};
    for (size_t i = 0; i < count; i++)
        out[i] = (float)(rank * 10 + (int)(i / (count / n)));
    rs.send.ptr = out;
    rs.recv.ptr = in;
    ccl_task *task = ccl_task_new(comm, &rs, 1);
    CHECK(task && ccl_task_status(task) == CCL_PENDING, "task_new");
    ccl_task_run(task);
    CHECK(ccl_task_wait(task, -1) == CCL_OK, "task: %s", ccl_task_error(task));
    ccl_task_free(task);
    for (size_t i = 0; i < count / n; i++)
        CHECK(in[i] == (float)((n - 1) * 10 + rank), "reduce_scatter[%zu] = %g", i, in[i]);

    /* check mode: rank 0 calls broadcast with root 0, the others with root 1 */
    ccl_comm_set_check(comm, 1);
    ccl_op bc = {.kind = CCL_BROADCAST, .dtype = CCL_FLOAT32, .root = rank == 0 ? 0 : 1, .count = 4};
    bc.send.ptr = bc.recv.ptr = out;
    st = ccl_run(comm, &bc, 1);
    CHECK(st == CCL_E_MISMATCH, "check mode gave %s", ccl_status_name(st));
    CHECK(strstr(ccl_comm_error(comm), "rank 0 called broadcast(count=4, float32, root=0), rank 1 called "
                                       "broadcast(count=4, float32, root=1)") != NULL, "message: %s",
          ccl_comm_error(comm));
    free(out);
    free(in);
    ccl_comm_destroy(comm);
    return 0;
}

int main(int argc, char **argv)
{
    const char *id = argc > 1 ? argv[1] : "ccl-api-test";
    int n = argc > 2 ? atoi(argv[2]) : 2;
    for (int r = 1; r < n; r++)
        if (fork() == 0)
            return run_rank(id, r, n);
    int rank = 0, bad = run_rank(id, 0, n);
    for (int r = 1; r < n; r++) {
        int status;
        wait(&status);
        bad |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    CHECK(!bad, "a rank failed");
    printf("ccl ok\n");
    return 0;
}
