// The only C++ in tchrun: flat extern "C" wrappers over libtorch c10d, the autograd hooks and
// functions tch does not expose (gradient reducer, DenseNet's memory-efficient bottleneck). Each
// body runs inside PROTECT, which turns any C++ exception into a returned, malloc'd message
// (tch's pattern).
#include "c10d_shim.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef TCHRUN_WITH_NCCL
#include <ATen/cuda/CUDAContext.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>

#include <ATen/autocast_mode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

struct tchrun_store {
  c10::intrusive_ptr<c10d::Store> store;
};

struct tchrun_pg {
  c10::intrusive_ptr<c10d::Backend> backend;
  bool is_gloo;
  int size;
  std::chrono::milliseconds timeout;
};

// Waits for a collective. Gloo: a bounded CPU wait. NCCL: no timeout, which makes the caller's
// current stream wait for the NCCL stream without blocking the CPU; with a timeout, torch 2.11's
// WorkNCCL::wait blocks the CPU in a 1 ms sleep loop. NCCL's watchdog still enforces the group's
// timeout (it aborts the communicator and the job fails, as with Gloo).
static void wait_for(bool is_gloo, std::chrono::milliseconds timeout,
                     const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  if (!is_gloo) {
    work->wait();
    return;
  }
  if (!work->wait(timeout)) {
    throw std::runtime_error(std::string(what) + " did not complete within the process-group timeout");
  }
}

static char* dup_message(const std::string& msg) {
  char* out = static_cast<char*>(std::malloc(msg.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, msg.c_str(), msg.size() + 1);
  }
  return out;
}

#define PROTECT(...)                                               \
  try {                                                            \
    __VA_ARGS__;                                                   \
    return nullptr;                                                \
  } catch (const c10::Error& e) {                                  \
    return dup_message(e.what_without_backtrace());                \
  } catch (const std::exception& e) {                              \
    return dup_message(e.what());                                  \
  } catch (...) {                                                  \
    return dup_message("unknown C++ exception in libtorch c10d");  \
  }

static at::Tensor& tensor_ref(tchrun_tensor t) { return *static_cast<at::Tensor*>(t); }

static std::vector<at::Tensor> tensor_vec(tchrun_tensor* ts, size_t n) {
  std::vector<at::Tensor> v;
  v.reserve(n);
  for (size_t i = 0; i < n; i++) v.push_back(tensor_ref(ts[i]));
  return v;
}

// The current CUDA device, through c10's device-guard registry (libc10; the CUDA implementation
// is registered when libtorch_cuda loads), so the shim needs no link to libc10_cuda.
static void set_cuda_device(int device) {
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
      ->setDevice(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
}

static void wait_work(tchrun_pg* pg, const c10::intrusive_ptr<c10d::Work>& work) {
  wait_for(pg->is_gloo, pg->timeout, work, "collective");
}

extern "C" {

void tchrun_c10d_free_error(char* err) { std::free(err); }

int tchrun_c10d_has_nccl(void) {
#ifdef TCHRUN_WITH_NCCL
  return 1;
#else
  return 0;
#endif
}

char* tchrun_store_new(const char* host, uint16_t port, int is_server, int num_workers,
                       int64_t timeout_ms, int listen_fd, tchrun_store** out, uint16_t* out_port) {
  PROTECT({
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = is_server != 0;
    if (num_workers > 0) opts.numWorkers = static_cast<size_t>(num_workers);
    opts.waitWorkers = false;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    if (is_server != 0 && listen_fd >= 0) opts.masterListenFd = listen_fd;
    auto store = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    *out_port = store->getPort();
    *out = new tchrun_store{store};
  })
}

void tchrun_store_free(tchrun_store* store) { delete store; }

char* tchrun_store_set(tchrun_store* store, const char* key, const uint8_t* value, size_t len) {
  PROTECT({
    std::vector<uint8_t> v(value, value + len);
    store->store->set(std::string(key), v);
  })
}

char* tchrun_store_get(tchrun_store* store, const char* key, uint8_t** out, size_t* out_len) {
  PROTECT({
    std::vector<uint8_t> v = store->store->get(std::string(key));
    uint8_t* buf = static_cast<uint8_t*>(std::malloc(v.size() == 0 ? 1 : v.size()));
    if (buf == nullptr) throw std::bad_alloc();
    if (!v.empty()) std::memcpy(buf, v.data(), v.size());
    *out = buf;
    *out_len = v.size();
  })
}

char* tchrun_pg_new(tchrun_store* store, const char* prefix, const char* backend, int rank,
                    int size, int64_t timeout_ms, const char* gloo_host, const char* gloo_ifaces,
                    int cuda_device, tchrun_pg** out) {
  PROTECT({
    auto timeout = std::chrono::milliseconds(timeout_ms);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), store->store);
    std::string name(backend);
    if (name == "gloo") {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      // As PyTorch reads GLOO_SOCKET_IFNAME: one device per listed interface.
      std::string ifaces(gloo_ifaces);
      size_t start = 0;
      while (start < ifaces.size()) {
        size_t end = ifaces.find(',', start);
        if (end == std::string::npos) end = ifaces.size();
        if (end > start) {
          opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(
              ifaces.substr(start, end - start)));
        }
        start = end + 1;
      }
      if (opts->devices.empty()) {
        opts->devices.push_back(
            c10d::ProcessGroupGloo::createDeviceForHostname(std::string(gloo_host)));
      }
      auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, opts);
      *out = new tchrun_pg{pg, true, size, timeout};
    } else if (name == "nccl") {
#ifdef TCHRUN_WITH_NCCL
      if (cuda_device < 0) throw std::runtime_error("nccl needs the rank's CUDA device");
      // The rank's device is current before NCCL (or anything) can create a context on GPU 0,
      // and the group is bound to it (Python's init_process_group(device_id=...)).
      set_cuda_device(cuda_device);
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, size, opts);
      pg->setBoundDeviceId(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(cuda_device)));
      *out = new tchrun_pg{pg, false, size, timeout};
#else
      throw std::runtime_error("tchrun-worker was built without NCCL support");
#endif
    } else {
      throw std::runtime_error("unknown backend '" + name + "' (expected gloo or nccl)");
    }
  })
}

// A clean exit: NCCL's communicators and watchdog are shut down before the group is freed
// (torch warns, and may hang at exit, when a NCCL group is destroyed without it).
void tchrun_pg_free(tchrun_pg* pg) {
  if (pg == nullptr) return;
  if (!pg->is_gloo) {
    try {
      pg->backend->shutdown();
    } catch (...) {
    }
  }
  delete pg;
}

char* tchrun_pg_allreduce(tchrun_pg* pg, tchrun_tensor* tensors, size_t n, int op) {
  PROTECT({
    auto v = tensor_vec(tensors, n);
    c10d::AllreduceOptions opts;
    bool divide = false;
    switch (op) {
      case 0: opts.reduceOp = c10d::ReduceOp::SUM; break;
      case 1:
        // Gloo has no AVG: sum, then divide by the world size.
        if (pg->is_gloo) { opts.reduceOp = c10d::ReduceOp::SUM; divide = true; }
        else { opts.reduceOp = c10d::ReduceOp::AVG; }
        break;
      case 2: opts.reduceOp = c10d::ReduceOp::MAX; break;
      case 3: opts.reduceOp = c10d::ReduceOp::MIN; break;
      default: throw std::runtime_error("unknown reduce op " + std::to_string(op));
    }
    opts.timeout = pg->timeout;
    wait_work(pg, pg->backend->allreduce(v, opts));
    if (divide) {
      for (auto& t : v) t.div_(pg->size);
    }
  })
}

char* tchrun_pg_broadcast(tchrun_pg* pg, tchrun_tensor* tensors, size_t n, int root) {
  PROTECT({
    auto v = tensor_vec(tensors, n);
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.rootTensor = 0;
    opts.timeout = pg->timeout;
    // Gloo broadcasts one tensor per call; loop so callers may pass several.
    for (auto& t : v) {
      std::vector<at::Tensor> one{t};
      wait_work(pg, pg->backend->broadcast(one, opts));
    }
  })
}

char* tchrun_pg_allgather(tchrun_pg* pg, tchrun_tensor input, tchrun_tensor* outputs,
                          size_t n_out) {
  PROTECT({
    if (static_cast<int>(n_out) != pg->size) {
      throw std::runtime_error("allgather needs one output tensor per rank");
    }
    std::vector<at::Tensor> in{tensor_ref(input)};
    std::vector<std::vector<at::Tensor>> outs{tensor_vec(outputs, n_out)};
    c10d::AllgatherOptions opts;
    opts.timeout = pg->timeout;
    wait_work(pg, pg->backend->allgather(outs, in, opts));
    // Gloo may hand back its own output tensors; copy into the caller's if so.
    for (size_t i = 0; i < n_out; i++) {
      if (!outs[0][i].is_same(tensor_ref(outputs[i]))) tensor_ref(outputs[i]).copy_(outs[0][i]);
    }
  })
}

char* tchrun_pg_barrier(tchrun_pg* pg) {
  PROTECT({
    c10d::BarrierOptions opts;
    opts.timeout = pg->timeout;
    wait_work(pg, pg->backend->barrier(opts));
  })
}

char* tchrun_autocast_set_cuda_dtype(int bf16) {
  PROTECT({ at::autocast::set_autocast_dtype(at::kCUDA, bf16 != 0 ? at::kBFloat16 : at::kHalf); })
}

int tchrun_cuda_queries(void) {
#ifdef TCHRUN_WITH_NCCL
  return 1;
#else
  return 0;
#endif
}

char* tchrun_cuda_set_device(int device) {
  PROTECT({
    set_cuda_device(device);
  })
}

char* tchrun_cuda_bf16_supported(int device, int* out) {
  PROTECT({
#ifdef TCHRUN_WITH_NCCL
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
    *out = prop->major >= 8 ? 1 : 0;
#else
    (void)device;
    (void)out;
    throw std::runtime_error("tchrun-worker was built without the CUDA headers");
#endif
  })
}

char* tchrun_l1_total(tchrun_tensor* tensors, size_t n, tchrun_tensor out) {
  PROTECT({
    at::Tensor& total = tensor_ref(out);
    if (n == 0) {
      total.zero_();
      return nullptr;
    }
    auto v = tensor_vec(tensors, n);
    auto norms = at::_foreach_norm(v, 1);
    total.copy_(at::stack(norms).sum());
  })
}

char* tchrun_amp_unscale(tchrun_tensor* tensors, size_t n, tchrun_tensor found_inf,
                         tchrun_tensor inv_scale) {
  PROTECT({
    if (n == 0) return nullptr;
    auto v = tensor_vec(tensors, n);
    at::Tensor& found = tensor_ref(found_inf);
    at::Tensor& inv = tensor_ref(inv_scale);
    // The fused kernel wants tensors of one device and dtype per call (GradScaler groups them).
    std::vector<at::Tensor> group;
    for (auto& t : v) {
      if (!t.defined()) continue;
      if (!group.empty() && (t.device() != group[0].device() || t.scalar_type() != group[0].scalar_type())) {
        at::_amp_foreach_non_finite_check_and_unscale_(group, found, inv);
        group.clear();
      }
      group.push_back(t);
    }
    if (!group.empty()) at::_amp_foreach_non_finite_check_and_unscale_(group, found, inv);
  })
}

// torch.optim.SGD(fused=True)'s kernel over one parameter group: `grads[i]` (+ weight decay)
// into `bufs[i]` (momentum; set to the gradient when `first_step`), then `params[i]` updated,
// in one pass per tensor. `bufs` is ignored when momentum is 0. One device and dtype per call.
// `found_inf` (may be null): the loss scaler's overflow flag; at 1 the kernel changes nothing.
char* tchrun_fused_sgd(tchrun_tensor* params, tchrun_tensor* grads, tchrun_tensor* bufs, size_t n,
                       double weight_decay, double momentum, double lr, int nesterov,
                       int first_step, tchrun_tensor found_inf) {
  PROTECT({
    if (n == 0) return nullptr;
    auto p = tensor_vec(params, n);
    auto g = tensor_vec(grads, n);
    std::vector<at::Tensor> b;
    if (momentum != 0.0) b = tensor_vec(bufs, n);
    at::NoGradGuard no_grad;
    std::optional<at::Tensor> found;
    if (found_inf != nullptr) found = tensor_ref(found_inf);
    at::_fused_sgd_(p, g, b, weight_decay, momentum, lr, /*dampening=*/0.0, nesterov != 0,
                    /*maximize=*/false, first_step != 0, /*grad_scale=*/std::nullopt, found);
  })
}

// torch.optim.AdamW(fused=True)'s step over one parameter group (torch's `_fused_adamw`): the
// step counts (0-d floats) + 1, the kernel (decoupled weight decay, both moments, the bias
// corrections from the counts, the update; not amsgrad), then with `found_inf` (may be null:
// the loss scaler's flag, at 1 the kernel changes nothing) the counts - the flag, so a skipped
// step does not count. One device and dtype per call; nothing is read on the host.
char* tchrun_fused_adamw(tchrun_tensor* params, tchrun_tensor* grads, tchrun_tensor* exp_avgs,
                         tchrun_tensor* exp_avg_sqs, tchrun_tensor* steps, size_t n, double lr,
                         double beta1, double beta2, double weight_decay, double eps,
                         tchrun_tensor found_inf) {
  PROTECT({
    if (n == 0) return nullptr;
    auto p = tensor_vec(params, n);
    auto g = tensor_vec(grads, n);
    auto a = tensor_vec(exp_avgs, n);
    auto b = tensor_vec(exp_avg_sqs, n);
    auto c = tensor_vec(steps, n);
    at::NoGradGuard no_grad;
    at::_foreach_add_(c, 1);
    std::optional<at::Tensor> found;
    if (found_inf != nullptr) found = tensor_ref(found_inf);
    at::_fused_adamw_(p, g, a, b, /*max_exp_avg_sqs=*/{}, c, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, found);
    if (found) at::_foreach_sub_(c, std::vector<at::Tensor>(n, *found));
  })
}

}  // extern "C"

// ---------------------------------------------------------------------------------------------
// The rank's collective trace (worker/src/heartbeat/trace.rs): each bucket's all-reduce is
// entered when launched and completed when waited for.
extern "C" uint64_t tchrun_trace_bucket_enter(uint32_t bucket, uint64_t bytes);
extern "C" void tchrun_trace_bucket_done(uint64_t seq);

// Gradient reducer. All state sits behind one mutex: the hooks run on autograd's thread (the
// caller's on CPU, a device thread on CUDA), prepare/finish on the caller's.
namespace {

struct Bucket {
  std::vector<size_t> members;  // parameter indices, in ready order
  int64_t grad_len = 0;         // gradient elements; bucket 0 then holds the extra values
  at::Tensor flat;
  size_t pending = 0;
  c10::intrusive_ptr<c10d::Work> work;
  uint64_t seq = 0;  // its all-reduce in the collective trace
};

struct ReducerState {
  c10::intrusive_ptr<c10d::Backend> backend;
  bool is_gloo = true;
  std::chrono::milliseconds timeout{0};
  std::vector<at::Tensor> params;
  int64_t first_cap = 0;  // elements
  int64_t cap = 0;
  bool order_known = false;
  std::vector<int64_t> seen;     // first step: the order gradients became ready here
  std::vector<char> fired;       // this step
  std::vector<size_t> bucket_of;
  std::vector<int64_t> offset_of;
  // Each parameter's slot in its bucket, with the parameter's own strides (channels-last
  // weights stay channels-last): the hooks write it in one pass, and it becomes p.grad.
  std::vector<at::Tensor> slot_of;
  std::vector<Bucket> buckets;   // in launch order
  size_t next_launch = 0;
  size_t early = 0;
  at::Tensor extra;
  at::Tensor scale;  // 0-d, this step's gradient multiplier
  // Gradient accumulation (--global-batch-size): per parameter, the sum this rank already holds
  // from the step's earlier micro-batches (undefined: none); added to gradient × scale.
  std::vector<at::Tensor> acc;
  bool armed = false;
  std::string error;
  std::mutex mu;

  static void check_params(const std::vector<at::Tensor>& ps) {
    for (const auto& p : ps) {
      if (!p.requires_grad()) throw std::runtime_error("reducer: a parameter does not require grad");
    }
  }

  c10d::AllreduceOptions sum_opts() const {
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = timeout;
    return o;
  }

  void wait(const c10::intrusive_ptr<c10d::Work>& w) const {
    wait_for(is_gloo, timeout, w, "gradient all-reduce");
  }

  // A new step: every bucket waits for all its gradients; the extra values ride in bucket 0.
  void arm_buckets() {
    for (auto& b : buckets) b.pending = b.members.size();
    Bucket& b0 = buckets[0];
    b0.flat.narrow(0, b0.grad_len, extra.numel()).copy_(extra);
  }

  // Parameter i's gradient × scale into its slot; true when that completes its bucket.
  bool fill(size_t i, const at::Tensor& grad) {
    at::mul_out(slot_of[i], grad, scale);
    if (i < acc.size() && acc[i].defined()) slot_of[i].add_(acc[i]);
    fired[i] = 1;
    return --buckets[bucket_of[i]].pending == 0;
  }

  // Launches, in bucket order, every bucket whose gradients are all in (same order on every rank).
  void launch_ready(bool in_backward) {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      Bucket& b = buckets[next_launch];
      std::vector<at::Tensor> v{b.flat};
      b.seq = tchrun_trace_bucket_enter(static_cast<uint32_t>(next_launch),
                                        static_cast<uint64_t>(b.flat.nbytes()));
      b.work = backend->allreduce(v, sum_opts());
      next_launch++;
      if (in_backward) early++;
    }
  }

  void on_grad(size_t i, const at::Tensor& grad) {
    std::lock_guard<std::mutex> lock(mu);
    if (!armed || !error.empty() || !grad.defined()) return;
    try {
      if (!order_known) {
        seen.push_back(static_cast<int64_t>(i));
        return;
      }
      if (fired[i]) throw std::runtime_error("a parameter received two gradients in one backward");
      if (fill(i, grad)) launch_ready(true);
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }

  // Buckets in the given ready order, under the caps; bucket 0 also holds `extra_len` values.
  void build(const std::vector<int64_t>& order, int64_t extra_len) {
    buckets.clear();
    bucket_of.assign(params.size(), 0);
    offset_of.assign(params.size(), 0);
    Bucket cur;
    for (int64_t idx : order) {
      size_t i = static_cast<size_t>(idx);
      int64_t limit = buckets.empty() ? first_cap : cap;
      int64_t n = params[i].numel();
      if (!cur.members.empty() && cur.grad_len + n > limit) {
        buckets.push_back(std::move(cur));
        cur = Bucket();
      }
      bucket_of[i] = buckets.size();
      offset_of[i] = cur.grad_len;
      cur.members.push_back(i);
      cur.grad_len += n;
    }
    if (!cur.members.empty() || buckets.empty()) buckets.push_back(std::move(cur));
    for (size_t k = 0; k < buckets.size(); k++) {
      Bucket& b = buckets[k];
      int64_t len = b.grad_len + (k == 0 ? extra_len : 0);
      b.flat = at::empty({len}, params.empty() ? at::TensorOptions().dtype(at::kFloat)
                                                : params[0].options().dtype(at::kFloat)
                                                      .requires_grad(false));
    }
    slot_of.assign(params.size(), at::Tensor());
    for (size_t i = 0; i < params.size(); i++) {
      const at::Tensor& p = params[i];
      at::Tensor base = buckets[bucket_of[i]].flat.narrow(0, offset_of[i], p.numel());
      slot_of[i] = p.is_non_overlapping_and_dense() ? base.as_strided(p.sizes(), p.strides())
                                                    : base.view(p.sizes());
    }
    order_known = true;
  }

  // First step: the hooks only recorded the order in which gradients arrived. Rank 0's order
  // goes to every rank, the buckets are built from it, and this step's gradients (in p.grad)
  // are reduced through them after backward, so that every step sums in the same layout (the
  // same rounding: a resumed run stays bit-identical to an uninterrupted one).
  void discovery_step(int64_t divisor_index) {
    std::vector<char> have(params.size(), 0);
    std::vector<int64_t> order;
    for (int64_t i : seen) {
      if (i >= 0 && static_cast<size_t>(i) < params.size() && !have[i]) { have[i] = 1; order.push_back(i); }
    }
    // Parameters without a gradient go last.
    for (size_t i = 0; i < params.size(); i++) if (!have[i]) order.push_back(static_cast<int64_t>(i));
    at::Tensor t = at::tensor(order, at::TensorOptions().dtype(at::kLong));
    if (!params.empty() && params[0].is_cuda()) t = t.to(params[0].device());
    std::vector<at::Tensor> bv{t};
    c10d::BroadcastOptions bo;
    bo.rootRank = 0;
    bo.rootTensor = 0;
    bo.timeout = timeout;
    wait(backend->broadcast(bv, bo));
    t = t.to(at::kCPU);
    std::vector<int64_t> root(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
    std::vector<int64_t> sorted = root;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); i++) {
      if (sorted[i] != static_cast<int64_t>(i)) throw std::runtime_error("reducer: rank 0 sent an invalid bucket order");
    }
    build(root, extra.numel());
    arm_buckets();
    for (size_t i = 0; i < params.size(); i++) {
      const at::Tensor& g = params[i].grad();
      if (g.defined()) fill(i, g);
    }
    overlapped_finish(divisor_index);
  }

  void overlapped_finish(int64_t divisor_index) {
    // Gradients that never arrived (unused parameters, or no batch on this rank) count as zeros.
    for (size_t i = 0; i < params.size(); i++) {
      if (fired[i]) continue;
      Bucket& b = buckets[bucket_of[i]];
      if (i < acc.size() && acc[i].defined()) slot_of[i].copy_(acc[i]); else slot_of[i].zero_();
      b.pending--;
    }
    launch_ready(false);
    for (auto& b : buckets) {
      wait(b.work);
      tchrun_trace_bucket_done(b.seq);
    }
    Bucket& b0 = buckets[0];
    extra.copy_(b0.flat.narrow(0, b0.grad_len, extra.numel()).view_as(extra));
    double inv = 1.0 / std::max(1.0, extra[divisor_index].item<double>());
    // Each gradient becomes a view of its bucket (DDP's gradient_as_bucket_view): no copy back,
    // and the tensor autograd produced is freed here. The next step's hooks overwrite the slots.
    for (auto& b : buckets) {
      b.flat.narrow(0, 0, b.grad_len).mul_(inv);
      for (size_t i : b.members) {
        at::Tensor& p = params[i];
        if (p.scalar_type() == at::kFloat) {
          p.mutable_grad() = slot_of[i];
        } else {
          at::Tensor& g = p.mutable_grad();
          if (g.defined()) g.copy_(slot_of[i]); else g = slot_of[i].to(p.scalar_type());
        }
      }
      b.work.reset();
    }
  }
};

}  // namespace

struct tchrun_reducer {
  std::shared_ptr<ReducerState> state;
  std::vector<unsigned> hooks;
};

extern "C" {

char* tchrun_grads_to_none(tchrun_tensor* tensors, size_t n) {
  PROTECT({
    for (size_t i = 0; i < n; i++) tensor_ref(tensors[i]).mutable_grad().reset();
  })
}

char* tchrun_reducer_new(tchrun_pg* pg, tchrun_tensor* params, size_t n, int64_t first_bucket_bytes,
                         int64_t bucket_bytes, tchrun_reducer** out) {
  PROTECT({
    auto s = std::make_shared<ReducerState>();
    s->backend = pg->backend;
    s->is_gloo = pg->is_gloo;
    s->timeout = pg->timeout;
    s->params = tensor_vec(params, n);
    ReducerState::check_params(s->params);
    s->first_cap = std::max<int64_t>(1, first_bucket_bytes / 4);
    s->cap = std::max<int64_t>(1, bucket_bytes / 4);
    s->fired.assign(n, 0);
    auto* r = new tchrun_reducer{s, {}};
    std::weak_ptr<ReducerState> weak = s;
    for (size_t i = 0; i < n; i++) {
      r->hooks.push_back(s->params[i].register_hook([weak, i](const at::TensorBase& grad) {
        if (auto st = weak.lock()) st->on_grad(i, at::Tensor(grad));
      }));
    }
    *out = r;
  })
}

void tchrun_reducer_free(tchrun_reducer* r) {
  if (r == nullptr) return;
  try {
    for (size_t i = 0; i < r->hooks.size(); i++) r->state->params[i].remove_hook(r->hooks[i]);
  } catch (...) {
  }
  delete r;
}

char* tchrun_reducer_prepare(tchrun_reducer* r, tchrun_tensor extra, double scale) {
  return tchrun_reducer_prepare_accumulated(r, extra, scale, nullptr, 0);
}

char* tchrun_reducer_prepare_accumulated(tchrun_reducer* r, tchrun_tensor extra, double scale,
                                         tchrun_tensor* acc, size_t n_acc) {
  PROTECT({
    ReducerState& s = *r->state;
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.armed) throw std::runtime_error("reducer: prepare called twice without finish");
    at::Tensor e = tensor_ref(extra);
    if (e.dim() != 1 || e.scalar_type() != at::kFloat) {
      throw std::runtime_error("reducer: extra must be a 1-D float tensor");
    }
    if (s.order_known && e.numel() != s.buckets[0].flat.numel() - s.buckets[0].grad_len) {
      throw std::runtime_error("reducer: extra changed length between steps");
    }
    // Gradients are the reducer's: drop them, so that autograd hands over fresh tensors instead
    // of adding into last step's (which are views of the buckets the hooks are about to fill).
    for (auto& p : s.params) p.mutable_grad().reset();
    if (n_acc != 0 && n_acc != s.params.size()) {
      throw std::runtime_error("reducer: one accumulated gradient per parameter (or none)");
    }
    s.acc.assign(s.params.size(), at::Tensor());
    for (size_t i = 0; i < n_acc; i++) {
      if (acc[i] != nullptr) s.acc[i] = tensor_ref(acc[i]);
    }
    s.extra = e;
    s.scale = at::scalar_tensor(at::Scalar(scale), at::kDouble);
    s.error.clear();
    s.seen.clear();
    std::fill(s.fired.begin(), s.fired.end(), 0);
    s.next_launch = 0;
    s.early = 0;
    if (s.order_known) {
      s.arm_buckets();
      // A bucket with no parameters (a model without any) is ready at once.
      s.launch_ready(true);
    }
    s.armed = true;
  })
}

char* tchrun_reducer_finish(tchrun_reducer* r, int64_t divisor_index, int64_t* out_early,
                            int64_t* out_buckets) {
  PROTECT({
    ReducerState& s = *r->state;
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.armed) throw std::runtime_error("reducer: finish called without prepare");
    s.armed = false;
    if (!s.error.empty()) throw std::runtime_error("gradient hook: " + s.error);
    if (divisor_index < 0 || divisor_index >= s.extra.numel()) {
      throw std::runtime_error("reducer: divisor index outside extra");
    }
    if (s.order_known) s.overlapped_finish(divisor_index);
    else s.discovery_step(divisor_index);
    s.acc.clear();
    *out_early = static_cast<int64_t>(s.early);
    *out_buckets = static_cast<int64_t>(s.buckets.size());
  })
}

}  // extern "C"

// ---------------------------------------------------------------------------------------------
// DenseNet's memory-efficient bottleneck (torchvision's `memory_efficient=True`, which wraps
// `conv1(relu1(norm1(torch.cat(inputs, 1))))` in torch.utils.checkpoint): a custom autograd
// function whose forward runs without recording a graph and keeps only its inputs (the block's
// feature maps, which the block holds anyway) and the three parameters; backward recomputes the
// concatenation, batch norm and ReLU with gradients on and differentiates through them. So the
// concatenation and the norm1/relu outputs, which grow with every layer of a block, are never
// held between forward and backward.
namespace {

// The running statistics reach forward inside a struct, not as tensors: autograd then neither
// records them as inputs of the node nor expects gradients for them (forward updates them in
// place, as batch norm does).
struct RunningStats {
  at::Tensor mean;
  at::Tensor var;
};

at::Tensor bottleneck(at::TensorList inputs, const at::Tensor& weight, const at::Tensor& bias,
                      const std::optional<at::Tensor>& mean, const std::optional<at::Tensor>& var,
                      bool train, double momentum, double eps, const at::Tensor& conv_weight) {
  // One input (a block's first layer) is used as it is, as the plain model does.
  at::Tensor x = inputs.size() == 1 ? inputs[0] : at::cat(inputs, 1);
  at::Tensor y = at::batch_norm(x, weight, bias, mean, var, train, momentum, eps,
                                /*cudnn_enabled=*/true);
  return at::conv2d(at::relu(y), conv_weight);
}

// The autocast state forward ran under, restored while backward recomputes (backward runs
// outside the caller's autocast region, and on CUDA on autograd's own thread), so the recompute
// gives the same dtypes as forward did; torch.utils.checkpoint does the same. The cast cache
// stays off meanwhile: the recompute's weights are fresh detached tensors.
constexpr at::DeviceType kAutocastDevices[] = {at::kCUDA, at::kCPU};

void save_autocast(torch::autograd::AutogradContext* ctx) {
  for (at::DeviceType d : kAutocastDevices) {
    std::string key = c10::DeviceTypeName(d, /*lower_case=*/true);
    ctx->saved_data["autocast_" + key] = at::autocast::is_autocast_enabled(d);
    ctx->saved_data["autocast_dtype_" + key] =
        static_cast<int64_t>(at::autocast::get_autocast_dtype(d));
  }
}

// Autocast's cast cache off for a scope. Forward runs under no-grad: a weight cast cached there
// would carry no gradient to a later use of the same weight in the autocast region.
struct AutocastCacheOff {
  bool was = at::autocast::is_autocast_cache_enabled();
  AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(false); }
  ~AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(was); }
  AutocastCacheOff(const AutocastCacheOff&) = delete;
  AutocastCacheOff& operator=(const AutocastCacheOff&) = delete;
};

struct AutocastScope {
  struct Was {
    at::DeviceType device;
    bool enabled;
    at::ScalarType dtype;
  };
  std::vector<Was> was;
  AutocastCacheOff cache_off;

  explicit AutocastScope(torch::autograd::AutogradContext* ctx) {
    for (at::DeviceType d : kAutocastDevices) {
      std::string key = c10::DeviceTypeName(d, /*lower_case=*/true);
      was.push_back({d, at::autocast::is_autocast_enabled(d), at::autocast::get_autocast_dtype(d)});
      at::autocast::set_autocast_enabled(d, ctx->saved_data["autocast_" + key].toBool());
      at::autocast::set_autocast_dtype(
          d, static_cast<at::ScalarType>(ctx->saved_data["autocast_dtype_" + key].toInt()));
    }
  }
  ~AutocastScope() {
    for (const Was& w : was) {
      at::autocast::set_autocast_enabled(w.device, w.enabled);
      at::autocast::set_autocast_dtype(w.device, w.dtype);
    }
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;
};

struct DenseBottleneck : public torch::autograd::Function<DenseBottleneck> {
  // Runs with grad mode off (Function::apply). Batch norm in training mode: normalized with the
  // batch's statistics, the running ones updated once here (momentum, unbiased variance), as
  // the plain layer does.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs,
                            const at::Tensor& weight, const at::Tensor& bias,
                            const at::Tensor& conv_weight, const RunningStats& stats,
                            double momentum, double eps) {
    std::vector<at::Tensor> keep(inputs.begin(), inputs.end());
    keep.push_back(weight);
    keep.push_back(bias);
    keep.push_back(conv_weight);
    ctx->save_for_backward(keep);
    ctx->saved_data["eps"] = eps;
    save_autocast(ctx);
    AutocastCacheOff cache_off;
    return bottleneck(inputs, weight, bias, stats.mean, stats.var, true, momentum, eps,
                      conv_weight);
  }

  // One gradient per forward argument: each input, norm1's weight and bias, conv1's weight,
  // then none for the statistics, momentum and eps.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const size_t n = saved.size() - 3;
    torch::autograd::variable_list grads(saved.size() + 3);
    if (grad_out.empty() || !grad_out[0].defined()) return grads;
    // Detached leaves: the recompute's graph ends at them, not at the real parameters, so the
    // parameters' hooks (the gradient reducer's) fire once, when this node hands its gradients
    // on, and not inside the nested differentiation below.
    std::vector<at::Tensor> leaves;
    std::vector<at::Tensor> wrt;
    std::vector<size_t> wrt_index;
    leaves.reserve(saved.size());
    for (size_t i = 0; i < saved.size(); i++) {
      at::Tensor t = saved[i].detach();
      if (ctx->needs_input_grad(i)) {
        t.requires_grad_(true);
        wrt.push_back(t);
        wrt_index.push_back(i);
      }
      leaves.push_back(std::move(t));
    }
    if (wrt.empty()) return grads;
    const double eps = ctx->saved_data["eps"].toDouble();
    at::Tensor out;
    {
      at::AutoGradMode enable_grad(true);
      AutocastScope autocast(ctx);
      // No running statistics: forward already updated them once. torchvision's checkpointed
      // layer updates them a second time in its recompute (its norm1 is in training mode
      // then too), so its statistics move twice per step; ours move once, exactly as without
      // memory_efficient. The normalization itself uses the batch's statistics either way, so
      // the recompute's output equals forward's.
      out = bottleneck(at::TensorList(leaves.data(), n), leaves[n], leaves[n + 1], std::nullopt,
                       std::nullopt, true, 0.0, eps, leaves[n + 2]);
    }
    torch::autograd::variable_list g =
        torch::autograd::grad({out}, wrt, {grad_out[0]}, /*retain_graph=*/false,
                              /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < wrt_index.size(); k++) grads[wrt_index[k]] = g[k];
    return grads;
  }
};

}  // namespace

extern "C" {

char* tchrun_dense_bottleneck(tchrun_tensor* inputs, size_t n, tchrun_tensor bn_weight,
                              tchrun_tensor bn_bias, tchrun_tensor running_mean,
                              tchrun_tensor running_var, tchrun_tensor conv_weight, int train,
                              double momentum, double eps, tchrun_tensor* out) {
  PROTECT({
    if (n == 0) throw std::runtime_error("dense bottleneck: no input feature maps");
    auto xs = tensor_vec(inputs, n);
    const at::Tensor& w = tensor_ref(bn_weight);
    const at::Tensor& b = tensor_ref(bn_bias);
    const at::Tensor& cw = tensor_ref(conv_weight);
    if (!w.defined() || !b.defined() || !cw.defined()) {
      throw std::runtime_error("dense bottleneck: norm1 needs its weight and bias, conv1 its weight");
    }
    RunningStats stats{tensor_ref(running_mean), tensor_ref(running_var)};
    at::Tensor y;
    if (train != 0 && at::GradMode::is_enabled()) {
      y = DenseBottleneck::apply(at::TensorList(xs), w, b, cw, stats, momentum, eps);
    } else {
      // Evaluation, or no gradients wanted: nothing is kept for a backward, so compute directly.
      y = bottleneck(xs, w, b, stats.mean, stats.var, train != 0, momentum, eps, cw);
    }
    *out = new at::Tensor(std::move(y));
  })
}

}  // extern "C"
