//! Raw declarations of csrc/c10d_shim.h. Only `pg.rs` (c10d, reducer) and `densenet.rs` (the
//! memory-efficient bottleneck) call these.
use std::os::raw::{c_char, c_int, c_void};

#[repr(C)]
pub struct Store {
    _private: [u8; 0],
}
#[repr(C)]
pub struct Pg {
    _private: [u8; 0],
}
#[repr(C)]
pub struct Reducer {
    _private: [u8; 0],
}

extern "C" {
    pub fn tchrun_c10d_free_error(err: *mut c_char);
    pub fn tchrun_c10d_has_nccl() -> c_int;
    pub fn tchrun_store_new(
        host: *const c_char,
        port: u16,
        is_server: c_int,
        num_workers: c_int,
        timeout_ms: i64,
        listen_fd: c_int,
        out: *mut *mut Store,
        out_port: *mut u16,
    ) -> *mut c_char;
    pub fn tchrun_store_free(store: *mut Store);
    pub fn tchrun_store_set(
        store: *mut Store,
        key: *const c_char,
        value: *const u8,
        len: usize,
    ) -> *mut c_char;
    pub fn tchrun_store_get(
        store: *mut Store,
        key: *const c_char,
        out: *mut *mut u8,
        out_len: *mut usize,
    ) -> *mut c_char;
    pub fn tchrun_pg_new(
        store: *mut Store,
        prefix: *const c_char,
        backend: *const c_char,
        rank: c_int,
        size: c_int,
        timeout_ms: i64,
        gloo_host: *const c_char,
        gloo_ifaces: *const c_char,
        cuda_device: c_int,
        out: *mut *mut Pg,
    ) -> *mut c_char;
    pub fn tchrun_pg_free(pg: *mut Pg);
    pub fn tchrun_pg_allreduce(
        pg: *mut Pg,
        tensors: *mut *mut c_void,
        n: usize,
        op: c_int,
    ) -> *mut c_char;
    pub fn tchrun_pg_broadcast(
        pg: *mut Pg,
        tensors: *mut *mut c_void,
        n: usize,
        root: c_int,
    ) -> *mut c_char;
    pub fn tchrun_pg_allgather(
        pg: *mut Pg,
        input: *mut c_void,
        outputs: *mut *mut c_void,
        n_out: usize,
    ) -> *mut c_char;
    pub fn tchrun_pg_barrier(pg: *mut Pg) -> *mut c_char;
    pub fn tchrun_reducer_new(
        pg: *mut Pg,
        params: *mut *mut c_void,
        n: usize,
        first_bucket_bytes: i64,
        bucket_bytes: i64,
        out: *mut *mut Reducer,
    ) -> *mut c_char;
    pub fn tchrun_reducer_free(r: *mut Reducer);
    pub fn tchrun_reducer_prepare(r: *mut Reducer, extra: *mut c_void, scale: f64) -> *mut c_char;
    pub fn tchrun_reducer_prepare_accumulated(
        r: *mut Reducer,
        extra: *mut c_void,
        scale: f64,
        acc: *mut *mut c_void,
        n_acc: usize,
    ) -> *mut c_char;
    pub fn tchrun_reducer_finish(
        r: *mut Reducer,
        divisor_index: i64,
        out_early: *mut i64,
        out_buckets: *mut i64,
    ) -> *mut c_char;
    pub fn tchrun_grads_to_none(tensors: *mut *mut c_void, n: usize) -> *mut c_char;
    pub fn tchrun_autocast_set_cuda_dtype(bf16: c_int) -> *mut c_char;
    pub fn tchrun_cuda_queries() -> c_int;
    pub fn tchrun_cuda_set_device(device: c_int) -> *mut c_char;
    pub fn tchrun_cuda_bf16_supported(device: c_int, out: *mut c_int) -> *mut c_char;
    pub fn tchrun_l1_total(tensors: *mut *mut c_void, n: usize, out: *mut c_void) -> *mut c_char;
    pub fn tchrun_fused_sgd(
        params: *mut *mut c_void,
        grads: *mut *mut c_void,
        bufs: *mut *mut c_void,
        n: usize,
        weight_decay: f64,
        momentum: f64,
        lr: f64,
        nesterov: c_int,
        first_step: c_int,
        found_inf: *mut c_void,
    ) -> *mut c_char;
    pub fn tchrun_fused_adamw(
        params: *mut *mut c_void,
        grads: *mut *mut c_void,
        exp_avgs: *mut *mut c_void,
        exp_avg_sqs: *mut *mut c_void,
        steps: *mut *mut c_void,
        n: usize,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        found_inf: *mut c_void,
    ) -> *mut c_char;
    pub fn tchrun_amp_unscale(
        tensors: *mut *mut c_void,
        n: usize,
        found_inf: *mut c_void,
        inv_scale: *mut c_void,
    ) -> *mut c_char;
    pub fn tchrun_dense_bottleneck(
        inputs: *mut *mut c_void,
        n: usize,
        bn_weight: *mut c_void,
        bn_bias: *mut c_void,
        running_mean: *mut c_void,
        running_var: *mut c_void,
        conv_weight: *mut c_void,
        train: c_int,
        momentum: f64,
        eps: f64,
        out: *mut *mut c_void,
    ) -> *mut c_char;
}

/// The message of a shim call's returned error (freed here), or `None` on success.
pub(crate) fn take_error(err: *mut c_char) -> Option<String> {
    if err.is_null() {
        return None;
    }
    // SAFETY: a non-null return is a NUL-terminated malloc'd string owned by the caller.
    let message = unsafe { std::ffi::CStr::from_ptr(err) }
        .to_string_lossy()
        .trim()
        .to_string();
    unsafe { tchrun_c10d_free_error(err) };
    Some(message)
}
