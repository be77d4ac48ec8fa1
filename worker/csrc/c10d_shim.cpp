// The only C++ in tchrun: flat extern "C" wrappers over libtorch c10d. Each body runs inside
// PROTECT, which turns any C++ exception into a returned, malloc'd message (tch's pattern).
#include "c10d_shim.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef TCHRUN_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <ATen/autocast_mode.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
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

static void wait_work(tchrun_pg* pg, const c10::intrusive_ptr<c10d::Work>& work) {
  if (!work->wait(pg->timeout)) {
    throw std::runtime_error("collective did not complete within the process-group timeout");
  }
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
                    int size, int64_t timeout_ms, const char* gloo_host, tchrun_pg** out) {
  PROTECT({
    auto timeout = std::chrono::milliseconds(timeout_ms);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), store->store);
    std::string name(backend);
    if (name == "gloo") {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      opts->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForHostname(std::string(gloo_host)));
      auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, opts);
      *out = new tchrun_pg{pg, true, size, timeout};
    } else if (name == "nccl") {
#ifdef TCHRUN_WITH_NCCL
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, size, opts);
      *out = new tchrun_pg{pg, false, size, timeout};
#else
      throw std::runtime_error("tchrun-worker was built without NCCL support");
#endif
    } else {
      throw std::runtime_error("unknown backend '" + name + "' (expected gloo or nccl)");
    }
  })
}

void tchrun_pg_free(tchrun_pg* pg) { delete pg; }

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

}  // extern "C"
