//! Safe wrapper over the c10d shim: `Store` (TCPStore) and `ProcessGroup` (Gloo or NCCL).
//! Every shim call goes through `check`, which turns a returned C++ message into `C10dError`.
use crate::comm::ffi;
use crate::comm::netif::GlooDevice;
use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::time::Duration;
use tch::Tensor;
use tchrun::job_record::heartbeat::Phase;

/// A libtorch c10d call failed; the message is libtorch's, without its C++ backtrace.
#[derive(Debug, thiserror::Error)]
#[error("c10d {op}: {message}")]
pub struct C10dError {
    pub op: &'static str,
    pub message: String,
}

pub(crate) fn check(op: &'static str, err: *mut c_char) -> Result<(), C10dError> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null return is a NUL-terminated malloc'd string owned by us.
    let message = unsafe { CStr::from_ptr(err) }
        .to_string_lossy()
        .trim()
        .to_string();
    unsafe { ffi::tchrun_c10d_free_error(err) };
    Err(C10dError { op, message })
}

fn cstring(op: &'static str, s: &str) -> Result<CString, C10dError> {
    CString::new(s).map_err(|_| C10dError {
        op,
        message: format!("string contains NUL: {s:?}"),
    })
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Picks the CUDA autocast dtype (bfloat16 or float16) for `tch::autocast`.
pub fn set_autocast_dtype(bf16: bool) -> Result<(), C10dError> {
    check("autocast dtype", unsafe {
        ffi::tchrun_autocast_set_cuda_dtype(bf16 as i32)
    })
}

/// The tensors' handles for a shim call that takes a list (`tchrun_tensor*`).
pub(crate) fn tensor_ptrs<'a>(
    tensors: impl IntoIterator<Item = &'a Tensor>,
) -> Vec<*mut std::ffi::c_void> {
    tensors.into_iter().map(|t| t.as_ptr() as *mut _).collect()
}

/// Drops every tensor's gradient (torch's `zero_grad(set_to_none=True)`, its default): the
/// next backward stores its gradient without zero-filling and adding into the old one.
pub fn set_grads_to_none<'a>(
    tensors: impl IntoIterator<Item = &'a Tensor>,
) -> Result<(), C10dError> {
    let mut ptrs = tensor_ptrs(tensors);
    check("zero_grad", unsafe {
        ffi::tchrun_grads_to_none(ptrs.as_mut_ptr(), ptrs.len())
    })
}

/// Whether `device` computes in bfloat16 natively (compute capability 8.0 or newer, as torch's
/// `is_bf16_supported`); `None` when this build cannot ask (compiled without the CUDA headers).
pub fn cuda_bf16_supported(device: tch::Device) -> Result<Option<bool>, C10dError> {
    let tch::Device::Cuda(i) = device else {
        return Ok(Some(true));
    };
    if unsafe { ffi::tchrun_cuda_queries() } == 0 {
        return Ok(None);
    }
    let mut out = 0;
    check("cuda device properties", unsafe {
        ffi::tchrun_cuda_bf16_supported(i as i32, &mut out)
    })?;
    Ok(Some(out != 0))
}

/// torch's fused GradScaler check (`_amp_foreach_non_finite_check_and_unscale_`): every tensor
/// is multiplied by `inv_scale` in place and `found_inf` set to 1 when any value was NaN or
/// infinite (left as it was otherwise; both 0-d float tensors on the tensors' device). Nothing
/// is read on the host.
pub fn amp_unscale(
    tensors: &[Tensor],
    found_inf: &Tensor,
    inv_scale: &Tensor,
) -> Result<(), C10dError> {
    let mut ptrs = tensor_ptrs(tensors);
    check("unscale gradients", unsafe {
        ffi::tchrun_amp_unscale(
            ptrs.as_mut_ptr(),
            ptrs.len(),
            found_inf.as_ptr() as *mut _,
            inv_scale.as_ptr() as *mut _,
        )
    })
}

/// The sum of every tensor's L1 norm (one fused kernel group, no wait on the device): a 0-d
/// float tensor that is finite exactly when every value of every tensor is (the divergence
/// guard). The tensors must share one device and dtype (float32 or wider float).
pub fn l1_total(tensors: &[Tensor]) -> Result<Tensor, C10dError> {
    let device = tensors
        .first()
        .map(|t| t.device())
        .unwrap_or(tch::Device::Cpu);
    let out = Tensor::zeros([], (tch::Kind::Float, device));
    let mut ptrs = tensor_ptrs(tensors);
    check("non-finite check", unsafe {
        ffi::tchrun_l1_total(ptrs.as_mut_ptr(), ptrs.len(), out.as_ptr() as *mut _)
    })?;
    Ok(out)
}

/// Whether this binary was compiled with ProcessGroupNCCL.
pub fn has_nccl() -> bool {
    unsafe { ffi::tchrun_c10d_has_nccl() != 0 }
}

/// A c10d TCPStore: rank 0 serves, the others connect.
pub struct Store {
    raw: *mut ffi::Store,
    port: u16,
}

// SAFETY: c10d's TCPStore is thread-safe; the handle is only freed in Drop.
unsafe impl Send for Store {}

impl Store {
    /// Serves on `host:port` (port 0: a free port, see `port()`). The listening socket is
    /// bound to `host`'s address only (the one the ranks connect to), not every interface;
    /// if `host` is not an address of this machine, c10d binds every interface as usual.
    pub fn serve(
        host: &str,
        port: u16,
        world_size: usize,
        timeout: Duration,
    ) -> Result<Store, C10dError> {
        use std::os::fd::IntoRawFd;
        let fd = match std::net::TcpListener::bind((host, port)) {
            Ok(l) => l.into_raw_fd(),
            Err(e) => {
                tracing::warn!(
                    "cannot bind the store to {host}:{port} ({e}); c10d binds every interface"
                );
                -1
            }
        };
        Store::new(host, port, true, world_size, timeout, fd)
    }

    /// Serves on the listening socket `fd` (bound to loopback on `port`, not yet listening;
    /// c10d owns it from now on); c10d's own client connects to 127.0.0.1 on that port.
    pub(crate) fn serve_on(
        fd: i32,
        port: u16,
        world_size: usize,
        timeout: Duration,
    ) -> Result<Store, C10dError> {
        Store::new("127.0.0.1", port, true, world_size, timeout, fd)
    }

    /// Connects to rank 0's store, retrying until `timeout`.
    pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<Store, C10dError> {
        Store::new(host, port, false, 0, timeout, -1)
    }

    fn new(
        host: &str,
        port: u16,
        server: bool,
        workers: usize,
        timeout: Duration,
        listen_fd: i32,
    ) -> Result<Store, C10dError> {
        let op = if server {
            "TCPStore serve"
        } else {
            "TCPStore connect"
        };
        let chost = cstring(op, host)?;
        let mut raw = std::ptr::null_mut();
        let mut actual = 0u16;
        let workers = i32::try_from(workers).unwrap_or(i32::MAX);
        check(op, unsafe {
            ffi::tchrun_store_new(
                chost.as_ptr(),
                port,
                server as i32,
                workers,
                millis(timeout),
                listen_fd,
                &mut raw,
                &mut actual,
            )
        })
        .map_err(|e| C10dError {
            op,
            message: format!("{host}:{port}: {}", e.message),
        })?;
        Ok(Store { raw, port: actual })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), C10dError> {
        let k = cstring("store set", key)?;
        check("store set", unsafe {
            ffi::tchrun_store_set(self.raw, k.as_ptr(), value.as_ptr(), value.len())
        })
    }

    /// Waits (store timeout) for `key` and returns its value.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, C10dError> {
        let k = cstring("store get", key)?;
        let mut out = std::ptr::null_mut();
        let mut len = 0usize;
        check("store get", unsafe {
            ffi::tchrun_store_get(self.raw, k.as_ptr(), &mut out, &mut len)
        })?;
        // SAFETY: on success `out` holds `len` malloc'd bytes that we now own.
        let v = unsafe { std::slice::from_raw_parts(out, len) }.to_vec();
        unsafe { ffi::tchrun_c10d_free_error(out as *mut c_char) };
        Ok(v)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        unsafe { ffi::tchrun_store_free(self.raw) }
    }
}

/// Reduction of an all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum = 0,
    Avg = 1,
    Max = 2,
    Min = 3,
}

/// The c10d backend a group uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Gloo,
    Nccl,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Gloo => "gloo",
            BackendKind::Nccl => "nccl",
        }
    }
}

/// A c10d process group over all ranks of the job, on the rank's device: every collective
/// takes tensors of that device only (NCCL: CUDA; Gloo: CPU or CUDA) and says so otherwise.
pub struct ProcessGroup {
    raw: *mut ffi::Pg,
    rank: usize,
    size: usize,
    backend: BackendKind,
    device: tch::Device,
}

/// A device as users write it: `cpu`, `cuda:0`.
pub fn device_name(d: tch::Device) -> String {
    match d {
        tch::Device::Cuda(i) => format!("cuda:{i}"),
        tch::Device::Cpu => "cpu".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// Every tensor must be on `device` (the group's): a clear error naming the call, instead of
/// the c10 exception NCCL throws ("Tensors must be CUDA and dense") or a silent host copy.
pub fn check_devices<'a>(
    op: &'static str,
    device: tch::Device,
    backend: BackendKind,
    tensors: impl IntoIterator<Item = &'a Tensor>,
) -> Result<(), C10dError> {
    for (i, t) in tensors.into_iter().enumerate() {
        let d = t.device();
        if d != device {
            return Err(C10dError {
                op,
                message: format!(
                    "tensor {i} is on {}, but this {} group runs its collectives on {}; create it \
                     on the group's device (ProcessGroup::device)",
                    device_name(d),
                    backend.name(),
                    device_name(device)
                ),
            });
        }
    }
    Ok(())
}

// SAFETY: c10d backends may be used from any thread; we never share &mut across threads.
unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    /// Creates the group on its own `PrefixStore` named `name` (two groups on one raw store
    /// collide). `gloo`: what this rank's Gloo device binds. `device`: the rank's
    /// device; NCCL needs a CUDA one, which becomes the current device before the group exists
    /// and the group's bound device.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: &Store,
        name: &str,
        backend: BackendKind,
        rank: usize,
        size: usize,
        timeout: Duration,
        gloo: &GlooDevice,
        device: tch::Device,
    ) -> Result<ProcessGroup, C10dError> {
        let op = "ProcessGroup create";
        let cuda_device = match device {
            tch::Device::Cuda(i) => i as i32,
            _ => -1,
        };
        if backend == BackendKind::Nccl && cuda_device < 0 {
            return Err(C10dError {
                op,
                message: format!(
                    "nccl runs on CUDA devices, but this rank's device is {}; use --backend gloo \
                     (or --device cuda)",
                    device_name(device)
                ),
            });
        }
        if backend == BackendKind::Nccl && !has_nccl() {
            return Err(C10dError {
                op,
                message: "this tchrun-worker was built without NCCL support; rebuild after scripts/setup.sh \
                          installs the CUDA headers, or use --backend gloo"
                    .into(),
            });
        }
        if cuda_device >= 0 {
            // The rank's GPU is current before anything (c10d, NCCL, the allocator) can create
            // a context on GPU 0.
            check(op, unsafe { ffi::tchrun_cuda_set_device(cuda_device) })?;
        }
        let prefix = cstring(op, name)?;
        let b = cstring(op, backend.name())?;
        let (host, ifaces) = match gloo {
            GlooDevice::Address(a) => (cstring(op, a)?, cstring(op, "")?),
            GlooDevice::Interfaces(names) => (cstring(op, "")?, cstring(op, &names.join(","))?),
        };
        let mut raw = std::ptr::null_mut();
        check(op, unsafe {
            ffi::tchrun_pg_new(
                store.raw,
                prefix.as_ptr(),
                b.as_ptr(),
                rank as i32,
                size as i32,
                millis(timeout),
                host.as_ptr(),
                ifaces.as_ptr(),
                cuda_device,
                &mut raw,
            )
        })?;
        Ok(ProcessGroup {
            raw,
            rank,
            size,
            backend,
            device,
        })
    }

    /// The device every tensor given to this group's collectives must be on.
    pub fn device(&self) -> tch::Device {
        self.device
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn size(&self) -> usize {
        self.size
    }
    pub fn backend(&self) -> BackendKind {
        self.backend
    }

    /// All-reduce in place on every tensor (same shapes on every rank).
    pub fn all_reduce(&self, tensors: &mut [&mut Tensor], op: ReduceOp) -> Result<(), C10dError> {
        check_devices(
            "allreduce",
            self.device,
            self.backend,
            tensors.iter().map(|t| &**t),
        )?;
        let mut ptrs: Vec<*mut std::ffi::c_void> = tensors
            .iter_mut()
            .map(|t| t.as_mut_ptr() as *mut _)
            .collect();
        let _in =
            crate::heartbeat::collective(Phase::AllReduce, bytes(tensors.iter().map(|t| &**t)));
        check("allreduce", unsafe {
            ffi::tchrun_pg_allreduce(self.raw, ptrs.as_mut_ptr(), ptrs.len(), op as i32)
        })
    }

    /// Broadcast in place from `root` to every rank.
    pub fn broadcast(&self, tensors: &mut [&mut Tensor], root: usize) -> Result<(), C10dError> {
        check_devices(
            "broadcast",
            self.device,
            self.backend,
            tensors.iter().map(|t| &**t),
        )?;
        let mut ptrs: Vec<*mut std::ffi::c_void> = tensors
            .iter_mut()
            .map(|t| t.as_mut_ptr() as *mut _)
            .collect();
        let _in =
            crate::heartbeat::collective(Phase::Broadcast, bytes(tensors.iter().map(|t| &**t)));
        check("broadcast", unsafe {
            ffi::tchrun_pg_broadcast(self.raw, ptrs.as_mut_ptr(), ptrs.len(), root as i32)
        })
    }

    /// Every rank's `input`, in rank order.
    pub fn all_gather(&self, input: &Tensor) -> Result<Vec<Tensor>, C10dError> {
        check_devices("allgather", self.device, self.backend, [input])?;
        let mut outputs: Vec<Tensor> = (0..self.size).map(|_| input.empty_like()).collect();
        let mut ptrs: Vec<*mut std::ffi::c_void> = outputs
            .iter_mut()
            .map(|t| t.as_mut_ptr() as *mut _)
            .collect();
        let _in = crate::heartbeat::collective(Phase::AllGather, bytes([input]) * self.size as u64);
        check("allgather", unsafe {
            ffi::tchrun_pg_allgather(
                self.raw,
                input.as_ptr() as *mut _,
                ptrs.as_mut_ptr(),
                ptrs.len(),
            )
        })?;
        Ok(outputs)
    }

    pub fn barrier(&self) -> Result<(), C10dError> {
        let _in = crate::heartbeat::collective(Phase::Barrier, 0);
        check("barrier", unsafe { ffi::tchrun_pg_barrier(self.raw) })
    }
}

/// The bytes of `tensors` (for the collective trace).
fn bytes<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> u64 {
    tensors
        .into_iter()
        .map(|t| (t.numel() * t.kind().elt_size_in_bytes()) as u64)
        .sum()
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        unsafe { ffi::tchrun_pg_free(self.raw) }
    }
}

/// How one reduced step went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReducedStep {
    /// Buckets whose all-reduce started while backward was still running.
    pub early: usize,
    /// Buckets in all.
    pub buckets: usize,
}

/// Gradient reducer over a group (the shim's DDP-style Reducer): autograd hooks on every
/// parameter fill flat buckets and launch their asynchronous SUM all-reduces during backward.
/// Use: `prepare` after forward, then backward, then `finish`. The first step finds the order in
/// which gradients become ready (rank 0's wins) and reduces through the buckets after backward,
/// so that every step sums in the same layout.
pub struct Reducer {
    raw: *mut ffi::Reducer,
}

// SAFETY: the shim guards all reducer state with a mutex; the handle is only freed in Drop.
unsafe impl Send for Reducer {}

impl Reducer {
    /// `params`: every trainable parameter (requires grad), in the same order on every rank.
    pub fn new(
        pg: &ProcessGroup,
        params: &[Tensor],
        first_bucket_bytes: usize,
        bucket_bytes: usize,
    ) -> Result<Reducer, C10dError> {
        check_devices("reducer create", pg.device, pg.backend, params)?;
        let mut ptrs = tensor_ptrs(params);
        let mut raw = std::ptr::null_mut();
        check("reducer create", unsafe {
            ffi::tchrun_reducer_new(
                pg.raw,
                ptrs.as_mut_ptr(),
                ptrs.len(),
                i64::try_from(first_bucket_bytes).unwrap_or(i64::MAX),
                i64::try_from(bucket_bytes).unwrap_or(i64::MAX),
                &mut raw,
            )
        })?;
        Ok(Reducer { raw })
    }

    /// Arms the hooks for one backward: gradients are multiplied by `scale`; `extra` (1-D f32,
    /// the same length every step) is summed across ranks with the first bucket.
    pub fn prepare(&self, extra: &Tensor, scale: f64) -> Result<(), C10dError> {
        check("gradient reduce (prepare)", unsafe {
            ffi::tchrun_reducer_prepare(self.raw, extra.as_ptr() as *mut _, scale)
        })
    }

    /// `prepare` for the last micro-batch of an accumulated step (`--global-batch-size`):
    /// `acc[i]` is what this rank already holds for parameter i (its earlier micro-batches'
    /// gradient × samples, `None`: nothing); the bucket gets gradient × `scale` + `acc[i]`.
    pub fn prepare_accumulated(
        &self,
        extra: &Tensor,
        scale: f64,
        acc: &[Option<Tensor>],
    ) -> Result<(), C10dError> {
        let mut ptrs: Vec<*mut std::ffi::c_void> = acc
            .iter()
            .map(|t| match t {
                Some(t) => t.as_ptr() as *mut _,
                None => std::ptr::null_mut(),
            })
            .collect();
        check("gradient reduce (prepare)", unsafe {
            ffi::tchrun_reducer_prepare_accumulated(
                self.raw,
                extra.as_ptr() as *mut _,
                scale,
                ptrs.as_mut_ptr(),
                ptrs.len(),
            )
        })
    }

    /// After backward: waits for every bucket, writes the summed `extra` back into the tensor
    /// given to `prepare`, and sets each gradient to its sum / max(1, extra[divisor_index]).
    pub fn finish(&self, divisor_index: usize) -> Result<ReducedStep, C10dError> {
        let (mut early, mut buckets) = (0i64, 0i64);
        check("gradient all-reduce", unsafe {
            ffi::tchrun_reducer_finish(
                self.raw,
                i64::try_from(divisor_index).unwrap_or(i64::MAX),
                &mut early,
                &mut buckets,
            )
        })?;
        Ok(ReducedStep {
            early: early.max(0) as usize,
            buckets: buckets.max(0) as usize,
        })
    }
}

impl Drop for Reducer {
    fn drop(&mut self) {
        unsafe { ffi::tchrun_reducer_free(self.raw) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn collectives_refuse_tensors_off_the_group_device() {
        let cpu = Tensor::zeros([4], (Kind::Float, Device::Cpu));
        let e = check_devices("allreduce", Device::Cuda(0), BackendKind::Nccl, [&cpu])
            .expect_err("a CPU tensor on a CUDA group must be refused");
        assert_eq!(e.op, "allreduce");
        assert!(
            e.message.contains("tensor 0 is on cpu")
                && e.message.contains("nccl group")
                && e.message.contains("cuda:0"),
            "{e}"
        );
        let e = check_devices(
            "broadcast",
            Device::Cuda(1),
            BackendKind::Gloo,
            [&cpu, &cpu],
        )
        .expect_err("refused on a Gloo group on CUDA too");
        assert!(e.to_string().starts_with("c10d broadcast:"), "{e}");
        check_devices("allreduce", Device::Cpu, BackendKind::Gloo, [&cpu, &cpu])
            .expect("CPU tensors on a CPU group");
    }

    #[test]
    fn fused_unscale_finds_non_finite_values_and_scales() {
        let a = Tensor::from_slice(&[2.0f32, 4.0]);
        let b = Tensor::from_slice(&[8.0f32]);
        let found = Tensor::zeros([], (tch::Kind::Float, Device::Cpu));
        let half = Tensor::from(0.5f32);
        amp_unscale(&[a.shallow_clone(), b.shallow_clone()], &found, &half).expect("unscale");
        assert_eq!(found.double_value(&[]), 0.0);
        assert_eq!(Vec::<f32>::try_from(&a).expect("a"), vec![1.0, 2.0]);
        assert_eq!(Vec::<f32>::try_from(&b).expect("b"), vec![4.0]);
        let one = Tensor::from(1.0f32);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let found = Tensor::zeros([], (tch::Kind::Float, Device::Cpu));
            let c = Tensor::from_slice(&[1.0f32, bad]);
            amp_unscale(&[a.shallow_clone(), c], &found, &one).expect("unscale");
            assert_eq!(found.double_value(&[]), 1.0);
            // A later finite group leaves a set flag set.
            amp_unscale(&[a.shallow_clone()], &found, &one).expect("unscale");
            assert_eq!(found.double_value(&[]), 1.0);
        }
        let found = Tensor::zeros([], (tch::Kind::Float, Device::Cpu));
        amp_unscale(&[], &found, &one).expect("no tensors");
        assert_eq!(found.double_value(&[]), 0.0);
    }

    #[test]
    fn l1_total_is_finite_exactly_when_every_value_is() {
        let a = Tensor::from_slice(&[1.0f32, -2.0]);
        let b = Tensor::from_slice(&[3.0f32]);
        let t = l1_total(&[a.shallow_clone(), b]).expect("total");
        assert_eq!(t.double_value(&[]), 6.0);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let c = Tensor::from_slice(&[0.5f32, bad]);
            let t = l1_total(&[a.shallow_clone(), c]).expect("total");
            assert!(!t.double_value(&[]).is_finite(), "{bad}");
        }
        assert_eq!(l1_total(&[]).expect("none").double_value(&[]), 0.0);
    }

    #[test]
    fn bf16_query_on_cpu_is_trivially_true() {
        assert_eq!(cuda_bf16_supported(Device::Cpu).expect("cpu"), Some(true));
    }
}
