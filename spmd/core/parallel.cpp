// spmd/core/parallel.cpp: the thread pool behind parallel_for.
#include <spmd/core/parallel.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <spmd/core/env.h>
#include <spmd/core/error.h>

namespace spmd {
namespace {

thread_local bool t_inside_parallel = false;

// Note [Pool spin]
// Kernels come back to back (an op's dispatch between them takes about a microsecond), and a
// futex sleep and wake-up costs the waiting thread several microseconds and the kernel's
// scheduler more. So a worker that finished a job polls for the next one, and the submitting
// thread polls for its job's last chunk, for kSpinPolls pause-instruction polls (some 10 to 40
// microseconds) before sleeping on the condition variable: examples/gpt's step at d_model 64 on
// full tensors went from 6.3 to 4.7 ms on 2 cores (gpt_bench), where 14% of the time had been the
// scheduler's. The spin is short, so a worker that has no next job soon gives its core back; and
// under mpirun each process's pool already has cores / local ranks threads (world/launcher.h), so
// 8 processes on 2 cores run no workers to spin.
constexpr int kSpinPolls = 1000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls ready() up to kSpinPolls times; whether it became true.
template <class Ready>
bool spin_until(Ready ready) {
  for (int i = 0; i < kSpinPolls; ++i) {
    if (ready()) return true;
    cpu_relax();
  }
  return ready();
}

int default_thread_count() {
  if (std::optional<int> n = env_num_threads()) return *n;
  return std::max(1u, std::thread::hardware_concurrency());
}

// One job at a time: the submitting thread holds submit_mutex_ for the job's duration. Each job
// is its own object, so a worker that wakes late only finds its job's chunks all claimed.
class Pool {
 public:
  explicit Pool(int threads) : threads_(threads) { start_workers(); }
  ~Pool() { stop_workers(); }

  int threads() const { return threads_; }

  void resize(int threads) {
    std::lock_guard submit(submit_mutex_);
    stop_workers();
    threads_ = std::max(1, threads);
    start_workers();
  }

  // Returns false (running nothing) when the pool is busy with another thread's job.
  bool try_run(int64_t n, int64_t chunks, const std::function<void(int64_t, int64_t)>& fn) {
    std::unique_lock submit(submit_mutex_, std::try_to_lock);
    if (!submit.owns_lock()) return false;
    auto job = std::make_shared<Job>(&fn, n, chunks);
    {
      std::lock_guard lock(mutex_);
      current_ = job;
      ++generation_;
    }
    wake_.notify_all();
    work(*job);
    spin_until([&] { return job->remaining.load(std::memory_order_acquire) == 0; });
    {
      std::unique_lock lock(mutex_);
      done_.wait(lock, [&] { return job->remaining.load() == 0; });
      current_.reset();
    }
    if (job->error) std::rethrow_exception(job->error);
    return true;
  }

 private:
  struct Job {
    Job(const std::function<void(int64_t, int64_t)>* f, int64_t total, int64_t count)
        : fn(f), n(total), chunks(count), remaining(count) {}
    const std::function<void(int64_t, int64_t)>* fn;
    const int64_t n;
    const int64_t chunks;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> remaining;
    std::exception_ptr error;  // guarded by Pool::mutex_
  };

  void start_workers() {
    stopping_ = false;
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  void stop_workers() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; });
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
        job = current_;
      }
      if (job) work(*job);
    }
  }

  // Claims and runs chunks of `job` until none are left.
  void work(Job& job) {
    t_inside_parallel = true;
    for (;;) {
      int64_t chunk = job.next.fetch_add(1);
      if (chunk >= job.chunks) break;
      int64_t begin = job.n * chunk / job.chunks;
      int64_t end = job.n * (chunk + 1) / job.chunks;
      try {
        (*job.fn)(begin, end);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!job.error) job.error = std::current_exception();
      }
      if (job.remaining.fetch_sub(1) == 1) {
        std::lock_guard lock(mutex_);
        done_.notify_all();
      }
    }
    t_inside_parallel = false;
  }

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex submit_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  bool stopping_ = false;
  std::atomic<uint64_t> generation_{0};  // written under mutex_; polled without it
  std::shared_ptr<Job> current_;
};

Pool& pool() {
  static Pool instance(default_thread_count());
  return instance;
}

}  // namespace

std::optional<int> env_num_threads() {
  const std::optional<std::string> value = env_value("SPMD_NUM_THREADS");
  if (!value) return std::nullopt;
  int n = 0;
  const auto [end, ec] = std::from_chars(value->data(), value->data() + value->size(), n);
  if (ec != std::errc() || end != value->data() + value->size() || n < 1 || n > kMaxThreads) {
    throw_error<ConfigError>(
        "SPMD_NUM_THREADS={}: expected the number of kernel threads, an integer in [1, {}]", *value,
        kMaxThreads);
  }
  return n;
}

int num_threads() {
  return pool().threads();
}

void set_num_threads(int n) {
  pool().resize(n);
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (t_inside_parallel || n < 2 * grain) {
    fn(0, n);
    return;
  }
  Pool& p = pool();
  int64_t chunks = std::min<int64_t>(p.threads(), n / grain);
  if (chunks <= 1 || !p.try_run(n, chunks, fn)) fn(0, n);
}

}  // namespace spmd
