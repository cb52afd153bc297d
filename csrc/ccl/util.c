#include "internal.h"

const char *const KIND_NAMES[] = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
                                   "all_to_all", "send", "recv", "barrier"};
const char *const DTYPE_NAMES[] = {"int8",  "uint8", "int32",  "int64",  "float16", "bfloat16",
                                    "float32", "float64", "int16", "uint16", "uint32", "uint64"};
const char *const REDOP_NAMES[] = {"sum", "prod", "min", "max", "avg"};
const size_t DTYPE_SIZES[] = {1, 1, 4, 8, 2, 2, 4, 8, 2, 2, 4, 8};

/* ========================================================================== */
/* small utilities                                                            */
/* ========================================================================== */

/* The environment's numbers, by the rules of anychip/runtime/env.py: blanks around a value are
 * ignored and a blank value is unset; a whole number is digits; a number is digits with an
 * optional fraction and exponent (no sign, hex, inf or nan), or "inf" where `inf_ok`; a value > 0
 * is taken, anything else is ignored for the default (the Python side refuses it first). */
static const char *skip_blanks(const char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    return s;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int is_number(const char *s, int whole)
{
    int digits = 0;
    for (; is_digit(*s); s++)
        digits++;
    if (!whole && *s == '.')
        for (s++; is_digit(*s); s++)
            digits++;
    if (!whole && digits && (*s == 'e' || *s == 'E')) {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (!is_digit(*s))
            return 0;
        while (is_digit(*s))
            s++;
    }
    return digits && *skip_blanks(s) == '\0';
}

double env_number(const char *name, double dflt, int whole, int inf_ok)
{
    const char *v = getenv(name);
    v = v ? skip_blanks(v) : "";
    if (!*v)
        return dflt;
    if (inf_ok && (v[0] | 0x20) == 'i' && (v[1] | 0x20) == 'n' && (v[2] | 0x20) == 'f' && !*skip_blanks(v + 3))
        return CCL_NEVER_S;
    if (!is_number(v, whole))
        return dflt;
    double d = strtod(v, NULL);
    double most = whole ? 9223372036854775808.0 : 1e308; /* whole: at most 2^63, as env.py */
    return (d > 0 && d <= most) ? d : dflt;
}

uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* process start time (clock ticks since boot) and whether it is still running */
int proc_state(int pid, uint64_t *starttime, char *state)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    p += 2;
    *state = *p;
    /* field 3 is the state; starttime is field 22 */
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    *starttime = p ? strtoull(p, NULL, 10) : 0;
    return 0;
}

__thread char init_err[MSG_LEN];

const char *ccl_init_error(void) { return init_err; }

size_t ccl_dtype_size(int dtype) { return dtype >= 0 && dtype < CCL_DTYPE_COUNT ? DTYPE_SIZES[dtype] : 0; }

const char *ccl_status_name(int st)
{
    static const char *names[] = {"CCL_OK", "CCL_E_INVALID", "CCL_E_TIMEOUT", "CCL_E_PEER_DEAD", "CCL_E_MISMATCH",
                                  "CCL_E_ABORTED", "CCL_E_SYSTEM", "CCL_E_IPC", "CCL_PENDING"};
    return st >= 0 && st <= CCL_PENDING ? names[st] : "CCL_E_UNKNOWN";
}
