// tchrun c10d shim: flat extern "C" functions over libtorch's c10d (TCPStore, ProcessGroupGloo,
// ProcessGroupNCCL) and the autograd pieces tch lacks (gradient reducer, dense bottleneck).
// Every function returns NULL on success or a malloc'd error message that the caller frees with
// tchrun_c10d_free_error. Handles are opaque and freed by their *_free function.
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
// backend: "gloo" or "nccl". gloo_ifaces: comma-separated interfaces, one Gloo device each
// (GLOO_SOCKET_IFNAME's meaning in PyTorch); when empty, gloo_host: the address this rank's one
// Gloo device binds. Both ignored by nccl.
// cuda_device: the rank's CUDA device index, or -1 (CPU). nccl needs one: the shim makes it the
// current device before the group exists and binds the group to it.
char* tchrun_pg_new(tchrun_store* store, const char* prefix, const char* backend, int rank,
                    int size, int64_t timeout_ms, const char* gloo_host, const char* gloo_ifaces,
                    int cuda_device, tchrun_pg** out);
void tchrun_pg_free(tchrun_pg* pg);
// op: 0 sum, 1 avg (gloo: sum then divide), 2 max, 3 min. In place on every tensor.
char* tchrun_pg_allreduce(tchrun_pg* pg, tchrun_tensor* tensors, size_t n, int op);
char* tchrun_pg_broadcast(tchrun_pg* pg, tchrun_tensor* tensors, size_t n, int root);
// outputs: `size` tensors shaped like input, filled with every rank's input in rank order.
char* tchrun_pg_allgather(tchrun_pg* pg, tchrun_tensor input, tchrun_tensor* outputs, size_t n_out);
char* tchrun_pg_barrier(tchrun_pg* pg);

// Gradient reducer (DDP's Reducer, reduced to what tchrun needs): hooks on every parameter copy
// its gradient × scale into a flat bucket as backward produces it, and launch each bucket's
// asynchronous SUM all-reduce as soon as it and every bucket before it are full, so the
// reduction overlaps the rest of backward. Buckets follow the order in which rank 0's gradients
// became ready in the first step (that step broadcasts the order, then reduces through the
// buckets after backward, so every step sums in the same layout). The reducer holds its own reference to the group.
typedef struct tchrun_reducer tchrun_reducer;
// first_bucket_bytes / bucket_bytes: bucket caps (DDP: 1 MiB for the first, 25 MiB after).
char* tchrun_reducer_new(tchrun_pg* pg, tchrun_tensor* params, size_t n, int64_t first_bucket_bytes,
                         int64_t bucket_bytes, tchrun_reducer** out);
void tchrun_reducer_free(tchrun_reducer* r);
// Before backward: `extra` (1-D float, same length every step) is summed with the first bucket;
// gradients are multiplied by `scale`.
char* tchrun_reducer_prepare(tchrun_reducer* r, tchrun_tensor extra, double scale);
// As prepare, for the last micro-batch of an accumulated step: `acc[i]` (n_acc == 0, or one per
// parameter; NULL: none) is what this rank already holds for parameter i (the sum of its earlier
// micro-batches' gradient × samples); the bucket gets gradient × scale + acc[i] (acc[i] alone
// when backward produces no gradient for it). Used for the next finish only.
char* tchrun_reducer_prepare_accumulated(tchrun_reducer* r, tchrun_tensor extra, double scale,
                                         tchrun_tensor* acc, size_t n_acc);
// After backward: launches what is left (a parameter without a gradient counts as zeros), waits
// for every bucket, writes the summed extra back into `extra`, and sets every parameter's
// gradient to its bucket sum divided by max(1, extra[divisor_index]).
// *out_early: buckets launched during backward; *out_buckets: buckets in all.
char* tchrun_reducer_finish(tchrun_reducer* r, int64_t divisor_index, int64_t* out_early,
                            int64_t* out_buckets);

// Drops each tensor's gradient (torch's zero_grad(set_to_none=True)): the next backward hands
// its gradient over without a zero fill and an add.
char* tchrun_grads_to_none(tchrun_tensor* tensors, size_t n);

// Autocast dtype on CUDA: bf16=1 bfloat16, 0 float16 (tch's autocast enables, this picks the type).
char* tchrun_autocast_set_cuda_dtype(int bf16);
// Whether this build can query CUDA devices (compiled with the CUDA headers).
int tchrun_cuda_queries(void);
// Makes `device` the current CUDA device of this thread (before anything touches GPU 0).
char* tchrun_cuda_set_device(int device);
// *out = 1 when `device` computes in bfloat16 natively (compute capability >= 8.0).
char* tchrun_cuda_bf16_supported(int device, int* out);
// torch's fused GradScaler check: every tensor *= inv_scale; *found_inf = 1 when any value of
// any tensor is NaN or infinite. One kernel per tensor group and one read on the host.
// out (a 0-d float tensor on the tensors' device) = the sum of every tensor's L1 norm, in one
// fused kernel group (_foreach_norm): finite exactly when every value is (short of an overflow
// past 3.4e38, itself a divergence). Asynchronous on CUDA: nothing waits for the device.
char* tchrun_l1_total(tchrun_tensor* tensors, size_t n, tchrun_tensor out);
// torch's GradScaler check: every tensor times `inv_scale` in place, `found_inf` set to 1 when a
// value is NaN or infinite (both 0-d float tensors on the tensors' device). Nothing is read back.
char* tchrun_amp_unscale(tchrun_tensor* tensors, size_t n, tchrun_tensor found_inf,
                         tchrun_tensor inv_scale);
char* tchrun_fused_sgd(tchrun_tensor* params, tchrun_tensor* grads, tchrun_tensor* bufs, size_t n,
                       double weight_decay, double momentum, double lr, int nesterov,
                       int first_step, tchrun_tensor found_inf);
char* tchrun_fused_adamw(tchrun_tensor* params, tchrun_tensor* grads, tchrun_tensor* exp_avgs,
                         tchrun_tensor* exp_avg_sqs, tchrun_tensor* steps, size_t n, double lr,
                         double beta1, double beta2, double weight_decay, double eps,
                         tchrun_tensor found_inf);

// DenseNet's bottleneck conv1(relu(norm1(cat(inputs, 1)))) as torchvision's memory_efficient
// layer computes it: in training mode with grad mode on, a custom autograd function that keeps
// only `inputs` and the parameters and recomputes the concatenation, norm1 and relu in backward
// (gradients for every input, norm1's weight and bias, conv1's weight). norm1's running
// statistics are updated once, in forward (momentum, unbiased variance), never by the recompute.
// In eval mode or under no-grad it computes directly. conv1: 1x1, stride 1, no bias.
// *out receives a new tensor handle (tch's at::Tensor*), owned by the caller.
char* tchrun_dense_bottleneck(tchrun_tensor* inputs, size_t n, tchrun_tensor bn_weight,
                              tchrun_tensor bn_bias, tchrun_tensor running_mean,
                              tchrun_tensor running_var, tchrun_tensor conv_weight, int train,
                              double momentum, double eps, tchrun_tensor* out);

#ifdef __cplusplus
}
#endif
