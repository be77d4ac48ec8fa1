// tchrun c10d shim: flat extern "C" functions over libtorch's c10d (TCPStore, ProcessGroupGloo,
// ProcessGroupNCCL). Every function returns NULL on success or a malloc'd error message that the
// caller frees with tchrun_c10d_free_error. Handles are opaque and freed by their *_free function.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tchrun_store tchrun_store;
typedef struct tchrun_pg tchrun_pg;
// tch's tensor handle (an at::Tensor*).
typedef void* tchrun_tensor;

void tchrun_c10d_free_error(char* err);
// 1 when the shim was compiled with ProcessGroupNCCL.
int tchrun_c10d_has_nccl(void);

// TCPStore: is_server=1 serves on host:port (port 0 picks a free port); clients connect, retrying
// until timeout_ms. *out_port receives the port actually used.
// listen_fd >= 0 (server only): a socket the caller bound and listens on (the address the ranks
// use); c10d takes it over instead of binding every interface.
char* tchrun_store_new(const char* host, uint16_t port, int is_server, int num_workers,
                       int64_t timeout_ms, int listen_fd, tchrun_store** out, uint16_t* out_port);
void tchrun_store_free(tchrun_store* store);
char* tchrun_store_set(tchrun_store* store, const char* key, const uint8_t* value, size_t len);
// Blocks until the key exists (store timeout). *out is malloc'd; free with tchrun_c10d_free_error.
char* tchrun_store_get(tchrun_store* store, const char* key, uint8_t** out, size_t* out_len);

// Process groups. Each group gets its own PrefixStore over `store` named `prefix`.
// backend: "gloo" or "nccl". gloo_host: address this rank's Gloo device binds (ignored by nccl).
char* tchrun_pg_new(tchrun_store* store, const char* prefix, const char* backend, int rank,
                    int size, int64_t timeout_ms, const char* gloo_host, tchrun_pg** out);
void tchrun_pg_free(tchrun_pg* pg);
// op: 0 sum, 1 avg (gloo: sum then divide), 2 max, 3 min. In place on every tensor.
char* tchrun_pg_allreduce(tchrun_pg* pg, tchrun_tensor* tensors, size_t n, int op);
char* tchrun_pg_broadcast(tchrun_pg* pg, tchrun_tensor* tensors, size_t n, int root);
// outputs: `size` tensors shaped like input, filled with every rank's input in rank order.
char* tchrun_pg_allgather(tchrun_pg* pg, tchrun_tensor input, tchrun_tensor* outputs, size_t n_out);
char* tchrun_pg_barrier(tchrun_pg* pg);

// Autocast dtype on CUDA: bf16=1 bfloat16, 0 float16 (tch's autocast enables, this picks the type).
char* tchrun_autocast_set_cuda_dtype(int bf16);

#ifdef __cplusplus
}
#endif
