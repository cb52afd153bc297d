// The c10d backend's direct ops (anychip/torch/distributed.py; docs/torch.md).
//
// The process group is Python. Its hot ops on device tensors -- a one-tensor all_reduce
// (DDP's buckets, a training loop's all_reduce) or broadcast, all_gather_into_tensor and
// reduce_scatter_tensor (FSDP's) -- skip both its Python and anychip's communicator: a
// `Direct` enqueues each with the device library's own collective entry (plugin.h's) on
// the communicator anychip's native transport made for the group, on the current torch
// stream, and returns a C++ Work: an event recorded after the op. What a Direct does not take (other dtypes and reductions, other ops) the
// Python side runs through the communicator, on the same library and stream, so the
// ops of one group stay in program order.
//
// Failures keep the Python side's words: an op whose library reports an asynchronous
// failure gets the native transport's message (which names the rank that failed or did
// not join), a Work.wait that runs out of time names the op, the rank and the group, and
// an aborted group fails what is still pending.
//
// Deadline: as ProcessGroupNCCL's watchdog does (TORCH_NCCL_ASYNC_ERROR_HANDLING), and as the
// native transport does for its own Works, a thread per Direct (started with its first op)
// looks at the pending Works every tenth of the group's timeout (at most every second): one
// still running `timeout` s (the process group's, or ANYCHIP_COLLECTIVE_TIMEOUT) plus kGrace
// after it was enqueued fails, as do all others pending, with a DistBackendError naming the
// op, the rank and the timeout, and the communicator is aborted (the transport's abort: the
// library's comm_abort, else comm_destroy). A Work.wait without a limit blocks in the
// library's event_synchronize (polling would cost every op: the latency work measured it), so
// it returns, raising that error, when the abort ends the op's work, as a library's abort does
// (ncclCommAbort ends the stuck kernels); is_completed and exception report it at once. When
// the op's work still runs kStuck after the abort, nothing can end it and every wait for its
// stream hangs: the watchdog says so on stderr and ends the process, as the native
// transport's does (and ProcessGroupNCCL's).
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include "device.h"

namespace py = pybind11;
using anychip_torch::g_plugin;

namespace {

int ccl_dtype(at::ScalarType t)         // plugin.h's anychip_dtype of a reducing op; -1: none
{
    int dt = anychip_torch::dtype_of(t);
    return dt == ANYCHIP_BOOL ? -1 : dt;    // bool: the Python side remaps its reductions
}

int ccl_redop(c10d::ReduceOp::RedOpType op)     // anychip_redop; -1: none (bitwise, PREMUL_SUM)
{
    switch (op) {
    case c10d::ReduceOp::SUM: return ANYCHIP_SUM;
    case c10d::ReduceOp::PRODUCT: return ANYCHIP_PROD;
    case c10d::ReduceOp::MIN: return ANYCHIP_MIN;
    case c10d::ReduceOp::MAX: return ANYCHIP_MAX;
    case c10d::ReduceOp::AVG: return ANYCHIP_AVG;
    default: return -1;
    }
}

using Clock = std::chrono::steady_clock;
// past the timeout before the watchdog fails an op (a library that times out itself reports
// first, naming the peer it waited for); how long an aborted op's work may still run
constexpr std::chrono::seconds kGrace(1), kStuck(10);

std::exception_ptr backend_error(const std::string &msg)
{
    try {
        C10_THROW_ERROR(DistBackendError, msg);
    } catch (...) {
        return std::current_exception();
    }
}

class DirectWork;

// One process group's communicator, as the direct ops use it.
struct Direct : std::enable_shared_from_this<Direct> {
    anychip_comm comm;
    int device, rank, size;
    std::string group;
    bool side_needed;                   // the library refuses the NULL stream (HCCL): a side stream
    PyObject *failure;                  // (what) -> str | None: the transport's message (owned)
    PyObject *abort_comm;               // (reason) -> None: the transport's abort (owned)
    double timeout;                     // seconds a Work may be pending; <= 0: no watchdog
    std::string timeout_from;           // which timeout that is, as the message names it

    std::mutex mu;                      // guards what follows
    bool closing = false, closed = false, aborted = false;
    std::string closed_error;           // after close: the failure still pending ops get ("" none)
    std::vector<anychip_event> events;  // passed events, recorded again
    std::unordered_set<DirectWork *> pending;
    std::map<std::string, int64_t> issued;    // ops enqueued, by name
    bool watching = false;              // the watchdog's thread is started
    std::string expired;                // why the watchdog aborted the group ("" it did not)
    anychip_stream side = nullptr;
    anychip_event before = nullptr, after = nullptr;

    std::mutex qmu;                     // the futures' completion thread
    std::condition_variable qcv;
    std::deque<c10::intrusive_ptr<DirectWork>> queue;
    bool thread_started = false, stopping = false;

    Direct(uintptr_t comm_, int device_, int rank_, int size_, std::string group_, bool side_needed_,
           py::object failure_, py::object abort_, double timeout_, std::string timeout_from_)
        : comm(reinterpret_cast<anychip_comm>(comm_)), device(device_), rank(rank_), size(size_),
          group(std::move(group_)), side_needed(side_needed_), failure(failure_.release().ptr()),
          abort_comm(abort_.release().ptr()), timeout(timeout_), timeout_from(std::move(timeout_from_))
    {
    }

    ~Direct()
    {
        if (anychip_torch::python_usable()) {
            py::gil_scoped_acquire gil;
            Py_DECREF(failure);
            Py_DECREF(abort_comm);
        }
    }

    bool watched() const { return timeout > 0; }

    std::string prefix(const char *what) const
    {
        return std::string("anychip c10d ") + what + " (rank " + std::to_string(rank) + " of " +
               std::to_string(size) + ", group " + group + "): ";
    }

    void check(anychip_status st, const char *what, const char *call) const
    {
        if (st != 0)
            C10_THROW_ERROR(DistBackendError, prefix(what) + anychip_torch::backend_name() + " " + call + " failed: " +
                                                  anychip_torch::status_text(st));
    }

    anychip_event take_event()
    {
        {
            std::lock_guard<std::mutex> lock(mu);
            if (!events.empty()) {
                anychip_event ev = events.back();
                events.pop_back();
                return ev;
            }
        }
        anychip_event ev = nullptr;
        check(g_plugin.event_create(device, &ev), "collective", "event_create");
        return ev;
    }

    void give_event(anychip_event ev)
    {
        std::lock_guard<std::mutex> lock(mu);
        if (!closed && (closing || events.size() < 64))
            events.push_back(ev);
        else
            g_plugin.event_destroy(device, ev);
    }

    // the failure of an op that has passed, after prefix(what) ("" none): the library's
    // asynchronous error in the transport's words (asked for only when there is one)
    std::string failure_of(const char *what)
    {
        anychip_status err = 0;
        bool was_aborted = false;
        {
            std::lock_guard<std::mutex> lock(mu);
            if (!expired.empty())
                return expired;
            was_aborted = aborted;
            if (closed && !aborted)
                return closed_error;
            if (!closed && g_plugin.comm_get_async_error) {
                anychip_status st = g_plugin.comm_get_async_error(comm, &err);
                if (st != 0)
                    err = st;
            }
            if (!closed && err == 0)
                return "";
        }
        if (!anychip_torch::python_usable())
            return "failed: " + anychip_torch::status_text(err);
        py::gil_scoped_acquire gil;
        py::object said = py::reinterpret_borrow<py::object>(failure)(what);
        if (!said.is_none())
            return said.cast<std::string>();
        if (err)
            return "failed: " + anychip_torch::status_text(err);
        return was_aborted ? "the process group was aborted" : "";
    }

    bool is_aborted()
    {
        std::lock_guard<std::mutex> lock(mu);
        return aborted;
    }

    // the ops' Works, or None where the Python side runs the op
    py::object all_reduce(std::vector<at::Tensor> &tensors, const py::handle &opts);
    py::object broadcast(std::vector<at::Tensor> &tensors, const py::handle &opts);
    py::object all_gather(at::Tensor &output, at::Tensor &input);
    py::object reduce_scatter(at::Tensor &output, at::Tensor &input, const py::handle &opts);
    bool takes(const at::Tensor &t) const;
    bool reduces(const at::Tensor &t, c10d::ReduceOp::RedOpType red, int *dtype, int *op) const;
    py::object enqueue(const char *what, c10d::OpType type, std::vector<at::Tensor> out,
                       const std::function<anychip_status(anychip_stream)> &call);
    void close();
    void abort();
    void watch();
    static void watch_loop(std::weak_ptr<Direct> weak, std::chrono::microseconds period);
    anychip_event expire(Clock::time_point now, std::string *why);
    void complete_later(c10::intrusive_ptr<DirectWork> work);
    void complete_loop();
};

// A direct op's Work: complete when its event has passed; failed with the library's
// asynchronous error (in the transport's words), or when its group is aborted.
class DirectWork final : public c10d::Work {
public:
    DirectWork(std::shared_ptr<Direct> d, const char *what, c10d::OpType type, anychip_event ev,
               std::vector<at::Tensor> out)
        : c10d::Work(d->rank, type), d_(std::move(d)), what_(what), ev_(ev), out_(std::move(out)),
          since_(Clock::now())
    {
        std::lock_guard<std::mutex> lock(d_->mu);
        d_->pending.insert(this);
    }

    ~DirectWork() override
    {
        anychip_event ev = nullptr;
        {
            std::lock_guard<std::mutex> lock(d_->mu);
            d_->pending.erase(this);
            std::swap(ev, ev_);
        }
        // dropped before it settled: the event's next record supersedes this one
        if (ev)
            d_->give_event(ev);
    }

    bool isCompleted() override
    {
        if (done())
            return true;
        if (!passed() && !d_->is_aborted())
            return false;
        settle();
        return true;
    }

    bool isSuccess() const override
    {
        std::lock_guard<std::mutex> lock(mutex_);
        return completed_ && !exception_;
    }

    std::vector<at::Tensor> result() override { return out_; }

    // (with the Direct's mu held)
    anychip_event event() const { return ev_; }
    const char *what() const { return what_; }
    Clock::time_point since() const { return since_; }
    anychip_event take_event() { return std::exchange(ev_, nullptr); }   // the watchdog's now

    bool wait(std::chrono::milliseconds timeout) override
    {
        if (!block(timeout)) {
            std::ostringstream secs;
            secs << timeout.count() / 1000.0;
            C10_THROW_ERROR(DistBackendError, d_->prefix(what_) + "Work.wait timed out after " + secs.str() +
                                                  " s; the op has not completed (it is still pending)");
        }
        std::exception_ptr exc = exception();
        if (exc)
            std::rethrow_exception(exc);
        return true;
    }

    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override
    {
        {
            std::lock_guard<std::mutex> lock(future_mu_);
            if (future_)
                return future_;
            future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
        }
        if (done())
            complete_future();
        else
            d_->complete_later(c10::intrusive_ptr<DirectWork>::unsafe_reclaim_from_nonowning(this));
        return future_;
    }

    // wait for the op, at most `timeout` (0: no limit, blocking in the library as the Python
    // Works do); false when it is still running then
    bool block(std::chrono::milliseconds timeout)
    {
        if (timeout.count() == 0) {
            anychip_event ev = event_to_wait();
            if (ev)
                g_plugin.event_synchronize(d_->device, ev);
            settle();
            return true;
        }
        const auto deadline = Clock::now() + timeout;
        auto pause = std::chrono::microseconds(10);
        while (!done()) {
            if (passed() || d_->is_aborted()) {
                settle();
                break;
            }
            if (Clock::now() >= deadline)
                return false;
            std::this_thread::sleep_for(pause);
            pause = std::min(pause * 2, std::chrono::microseconds(1000));
        }
        return true;
    }

private:
    bool done() const
    {
        std::lock_guard<std::mutex> lock(mutex_);
        return completed_;
    }

    // the event to block on; null when there is none to wait for
    anychip_event event_to_wait()
    {
        std::lock_guard<std::mutex> lock(d_->mu);
        return d_->closed || d_->aborted ? nullptr : ev_;
    }

    // whether the event has passed (a failing query counts: the op's failure says why)
    bool passed()
    {
        std::lock_guard<std::mutex> lock(d_->mu);
        if (!ev_ || d_->closed)
            return true;
        return g_plugin.event_query(d_->device, ev_) != g_plugin.not_ready_status;
    }

    void settle()
    {
        std::lock_guard<std::mutex> once(settle_mu_);
        if (done())
            return;
        std::string err = d_->failure_of(what_);
        anychip_event ev = nullptr;
        {
            std::lock_guard<std::mutex> lock(d_->mu);
            std::swap(ev, ev_);
            d_->pending.erase(this);
        }
        if (ev && err.empty())
            d_->give_event(ev);     // passed: it may be recorded again (a failed op's is not reused)
        finish(err.empty() ? nullptr : backend_error(d_->prefix(what_) + err));
        complete_future();
    }

    void complete_future()
    {
        c10::intrusive_ptr<c10::ivalue::Future> fut;
        {
            std::lock_guard<std::mutex> lock(future_mu_);
            if (!future_ || marked_)
                return;
            marked_ = true;
            fut = future_;
        }
        std::exception_ptr exc = exception();
        if (exc)
            fut->setError(exc);
        else
            fut->markCompleted(c10::IValue(out_));
    }

    std::shared_ptr<Direct> d_;
    const char *what_;                  // the op's name in messages
    anychip_event ev_;                  // (guarded by d_->mu)
    std::vector<at::Tensor> out_;
    Clock::time_point since_;           // when it was enqueued (the watchdog's deadline)
    std::mutex settle_mu_, future_mu_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    bool marked_ = false;
};

// whether `t` is a tensor the direct ops take: of this group's device, contiguous, not empty
bool Direct::takes(const at::Tensor &t) const
{
    return t.device().type() == c10::DeviceType::PrivateUse1 && t.device().index() == device && t.is_contiguous() &&
           t.numel() > 0;
}

bool Direct::reduces(const at::Tensor &t, c10d::ReduceOp::RedOpType red, int *dtype, int *op) const
{
    *dtype = ccl_dtype(t.scalar_type());
    *op = ccl_redop(red);
    return *dtype >= 0 && *op >= 0 &&
           anychip_plugin_reduces(&g_plugin, (anychip_dtype)*dtype, (anychip_redop)*op);
}

// `call` (the library's entry bound to its arguments) enqueued on the current torch stream,
// through a side stream where the library refuses the NULL stream; its Work
py::object Direct::enqueue(const char *what, c10d::OpType type, std::vector<at::Tensor> out,
                           const std::function<anychip_status(anychip_stream)> &call)
{
    {
        std::lock_guard<std::mutex> lock(mu);
        if (closed)
            return py::none();          // the Python side says why
    }
    int64_t id = 0;
    auto stream = static_cast<anychip_stream>(anychip_torch::current_stream_of(device, &id));
    if (g_plugin.set_device)
        check(g_plugin.set_device(device), what, "set_device");
    anychip_stream on = stream;
    if (id == 0 && side_needed) {       // the default stream (NULL on ACL): a side stream in turn
        if (!side) {
            check(g_plugin.stream_create(device, &side), what, "stream_create");
            check(g_plugin.event_create(device, &before), what, "event_create");
            check(g_plugin.event_create(device, &after), what, "event_create");
        }
        check(g_plugin.event_record(device, before, stream), what, "event_record");
        check(g_plugin.stream_wait_event(device, side, before), what, "stream_wait_event");
        on = side;
    }
    anychip_status st = call(on);
    if (on != stream) {
        check(g_plugin.event_record(device, after, on), what, "event_record");
        check(g_plugin.stream_wait_event(device, stream, after), what, "stream_wait_event");
    }
    check(st, what, what);
    {
        std::lock_guard<std::mutex> lock(mu);
        ++issued[what];
        if (watched() && !watching) {
            watching = true;
            watch();
        }
    }
    anychip_event ev = take_event();
    check(g_plugin.event_record(device, ev, stream), what, "event_record");
    c10::intrusive_ptr<c10d::Work> work = c10::make_intrusive<DirectWork>(shared_from_this(), what, type, ev,
                                                                         std::move(out));
    return py::cast(work);
}

py::object Direct::all_reduce(std::vector<at::Tensor> &tensors, const py::handle &opts)
{
    if (tensors.size() != 1 || !takes(tensors[0]))
        return py::none();
    const at::Tensor &t = tensors[0];
    auto red = opts.is_none() ? c10d::ReduceOp::SUM : opts.cast<const c10d::AllreduceOptions &>().reduceOp.op_;
    int dtype, op;
    if (!reduces(t, red, &dtype, &op))
        return py::none();
    void *data = t.data_ptr();
    size_t count = static_cast<size_t>(t.numel());
    anychip_comm c = comm;
    return enqueue("all_reduce", c10d::OpType::ALLREDUCE, tensors, [&](anychip_stream on) {
        return g_plugin.all_reduce(data, data, count, static_cast<anychip_dtype>(dtype),
                                   static_cast<anychip_redop>(op), c, on);
    });
}

py::object Direct::broadcast(std::vector<at::Tensor> &tensors, const py::handle &opts)
{
    if (!g_plugin.broadcast || tensors.size() != 1 || !takes(tensors[0]))
        return py::none();
    int root = 0;
    if (!opts.is_none()) {
        const auto &o = opts.cast<const c10d::BroadcastOptions &>();
        if (o.rootTensor != 0)
            return py::none();
        root = static_cast<int>(o.rootRank);
    }
    if (root < 0 || root >= size)
        return py::none();              // the Python side refuses it, saying why
    const at::Tensor &t = tensors[0];
    void *data = t.data_ptr();
    size_t nbytes = t.nbytes();
    anychip_comm c = comm;
    return enqueue("broadcast", c10d::OpType::BROADCAST, tensors, [&](anychip_stream on) {
        return g_plugin.broadcast(data, data, nbytes, ANYCHIP_UINT8, root, c, on);
    });
}

py::object Direct::all_gather(at::Tensor &output, at::Tensor &input)
{
    if (!g_plugin.all_gather || !takes(output) || !takes(input) ||
        output.nbytes() != input.nbytes() * static_cast<size_t>(size))
        return py::none();
    const void *send = input.data_ptr();
    void *recv = output.data_ptr();
    size_t nbytes = input.nbytes();
    anychip_comm c = comm;
    return enqueue("all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE, {output}, [&](anychip_stream on) {
        return g_plugin.all_gather(send, recv, nbytes, ANYCHIP_UINT8, c, on);
    });
}

py::object Direct::reduce_scatter(at::Tensor &output, at::Tensor &input, const py::handle &opts)
{
    if (!g_plugin.reduce_scatter || !takes(output) || !takes(input) || output.scalar_type() != input.scalar_type() ||
        input.numel() != output.numel() * size)
        return py::none();
    auto red = opts.is_none() ? c10d::ReduceOp::SUM : opts.cast<const c10d::ReduceScatterOptions &>().reduceOp.op_;
    int dtype, op;
    if (!reduces(output, red, &dtype, &op))
        return py::none();
    const void *send = input.data_ptr();
    void *recv = output.data_ptr();
    size_t count = static_cast<size_t>(output.numel());
    anychip_comm c = comm;
    return enqueue("reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE, {output}, [&](anychip_stream on) {
        return g_plugin.reduce_scatter(send, recv, count, static_cast<anychip_dtype>(dtype),
                                       static_cast<anychip_redop>(op), c, on);
    });
}

void Direct::complete_later(c10::intrusive_ptr<DirectWork> work)
{
    std::lock_guard<std::mutex> lock(qmu);
    queue.push_back(std::move(work));
    if (!thread_started) {
        thread_started = true;
        std::thread([self = shared_from_this()] { self->complete_loop(); }).detach();
    }
    qcv.notify_one();
}

void Direct::complete_loop()
{
    for (;;) {
        c10::intrusive_ptr<DirectWork> work;
        {
            std::unique_lock<std::mutex> lock(qmu);
            qcv.wait(lock, [this] { return stopping || !queue.empty(); });
            if (queue.empty())
                return;
            work = std::move(queue.front());
            queue.pop_front();
        }
        work->block(std::chrono::milliseconds(0));
    }
}

// before the communicator is destroyed: wait for the pending ops, so that they settle
// while the library can still report their failure; then no op uses the communicator
void Direct::close()
{
    std::vector<anychip_event> waiting;
    {
        std::lock_guard<std::mutex> lock(mu);
        if (closed)
            return;
        closing = true;                 // (no event is destroyed until closed)
        for (DirectWork *w : pending)
            if (w->event())
                waiting.push_back(w->event());
    }
    {
        py::gil_scoped_release nogil;
        for (anychip_event ev : waiting)
            g_plugin.event_synchronize(device, ev);
    }
    std::string err = failure_of("collective");
    {
        std::lock_guard<std::mutex> lock(mu);
        closed = true;
        closed_error = err;
        for (anychip_event ev : events)
            g_plugin.event_destroy(device, ev);
        events.clear();
        if (side) {
            g_plugin.stream_destroy(device, side);
            g_plugin.event_destroy(device, before);
            g_plugin.event_destroy(device, after);
            side = nullptr;
        }
    }
    std::lock_guard<std::mutex> lock(qmu);
    stopping = true;
    qcv.notify_all();
}

// the group is aborted: pending ops fail at once, with the transport's words
void Direct::abort()
{
    {
        std::lock_guard<std::mutex> lock(mu);
        closed = aborted = true;
    }
    std::lock_guard<std::mutex> lock(qmu);
    stopping = true;
    qcv.notify_all();
}

// start the watchdog's thread (with mu held); it holds the Direct only while it looks
void Direct::watch()
{
    auto period = std::chrono::duration<double>(std::min(timeout / 10, 1.0));
    std::thread(watch_loop, weak_from_this(), std::chrono::duration_cast<std::chrono::microseconds>(period)).detach();
}

void Direct::watch_loop(std::weak_ptr<Direct> weak, std::chrono::microseconds period)
{
    anychip_event stuck = nullptr;
    std::string why;
    int device = 0;
    for (;;) {
        std::this_thread::sleep_for(period);
        std::shared_ptr<Direct> d = weak.lock();
        if (!d)
            return;
        {
            std::lock_guard<std::mutex> lock(d->mu);
            if (d->closed)
                return;                 // closed or aborted by the program: nothing to watch
        }
        stuck = d->expire(Clock::now(), &why);
        if (stuck) {
            device = d->device;
            break;
        }
    }
    // the group is aborted; its op's work must end (a library's abort ends it) or nothing will
    const auto since = Clock::now();
    while (g_plugin.event_query(device, stuck) == g_plugin.not_ready_status) {
        if (Clock::now() - since > kStuck) {
            std::fprintf(stderr, "anychip: %s, and its work on anychip:%d still runs %lld s after the abort: nothing "
                         "can end it; ending the process\n", why.c_str(), device,
                         static_cast<long long>(kStuck.count()));
            std::fflush(stderr);
            std::fflush(stdout);
            _exit(1);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // (the event is not destroyed: a wait may still be in it)
}

// the watchdog's look: the oldest op still running past the deadline fails every pending Work,
// naming it, and the communicator is aborted; its event (which the watchdog then keeps from
// reuse, null when none expired), and in `why` what stderr says if its work never ends
anychip_event Direct::expire(Clock::time_point now, std::string *why)
{
    const auto deadline = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout)) + kGrace;
    std::ostringstream secs;
    secs << timeout;
    anychip_event stuck = nullptr;
    std::string reason;
    {
        std::lock_guard<std::mutex> lock(mu);
        DirectWork *oldest = nullptr;
        for (DirectWork *w : pending)
            if (w->event() && now - w->since() > deadline && (!oldest || w->since() < oldest->since()) &&
                g_plugin.event_query(device, w->event()) == g_plugin.not_ready_status)
                oldest = w;
        if (!oldest || closed)
            return nullptr;
        std::string op = std::string(oldest->what()) + " (group " + group + ")";
        reason = op + " did not complete within " + secs.str() + " s on rank " + std::to_string(rank) +
                 " (" + timeout_from + "); the communicator was aborted";
        *why = "rank " + std::to_string(rank) + ": " + op + " did not complete within " + secs.str() +
               " s (" + timeout_from + ")";
        expired = reason;               // (the native transport's words for its own Works)
        stuck = oldest->take_event();
        closed = aborted = true;        // the pending Works' waits return and fail with `expired`
    }
    {
        std::lock_guard<std::mutex> lock(qmu);
        stopping = true;
        qcv.notify_all();
    }
    if (anychip_torch::python_usable()) {
        py::gil_scoped_acquire gil;
        try {
            py::reinterpret_borrow<py::object>(abort_comm)(reason);
        } catch (py::error_already_set &e) {
            e.discard_as_unraisable("anychip c10d watchdog: aborting the communicator");
        }
    }
    return stuck;
}

}  // namespace

namespace anychip_torch {

void bind_c10d(py::module_ &m)
{
    py::class_<Direct, std::shared_ptr<Direct>>(m, "C10dDirect")
        .def(py::init<uintptr_t, int, int, int, std::string, bool, py::object, py::object, double, std::string>())
        .def("all_reduce", &Direct::all_reduce)
        .def("broadcast", &Direct::broadcast)
        .def("all_gather", &Direct::all_gather)
        .def("reduce_scatter", &Direct::reduce_scatter)
        .def("close", &Direct::close)
        .def("abort", &Direct::abort)
        .def("issued", [](Direct &d) {
            std::lock_guard<std::mutex> lock(d.mu);
            return d.issued;
        });
    m.def("c10d_direct_available", [] {
        return g_plugin.all_reduce && g_plugin.event_create && g_plugin.event_record && g_plugin.event_query &&
               g_plugin.event_synchronize && g_plugin.event_destroy && g_plugin.stream_wait_event &&
               g_plugin.stream_create && g_plugin.not_ready_status != 0;
    });
}

}  // namespace anychip_torch
