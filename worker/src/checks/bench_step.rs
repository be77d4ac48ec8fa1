//! `tchrun-worker bench-step` (hidden): training steps alone on synthetic tensors — forward,
//! loss, backward, SGD — with the trainer's model, layout (channels-last), autocast, optimizer
//! and step function (`train::step::train_step`, without a group); reports ms/step, images/s
//! and the peak RSS. The counterpart of
//! `benches/reference/bench_step.py` (torchvision model, the same loop); used by
//! `scripts/bench.sh` (CPU, and the GPU mode: ResNet-50, 224 × 224, bf16).
use crate::models;
use crate::train::optim::Optimizer;
use crate::train::scaler::LossScaler;
use crate::train::step::{train_step, Guard, StepModel, Update};
use crate::train::window::{RowInfo, StepWindow};
use std::time::Instant;
use tch::{Device, Kind, Tensor};
use tchrun::flags::Amp;
use tchrun::model::Arch;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Architecture (resnet18 ... densenet201, convnext_tiny ... convnext_large, efficientnet_b0
    /// ... efficientnet_v2_l, mobilenet_v3_small, mobilenet_v3_large, vit_b_16, vit_b_32, vit_l_16:
    /// ViTs built for --size; regnet_y_400mf ... regnet_x_32gf; swin_t, swin_s, swin_b).
    #[arg(long, default_value = "resnet18", value_parser = parse_arch)]
    arch: Arch,
    /// Input side in pixels.
    #[arg(long, default_value_t = 112)]
    size: i64,
    #[arg(long, default_value_t = 16)]
    batch_size: i64,
    #[arg(long, default_value_t = 1000)]
    classes: i64,
    /// Timed steps (after --warmup untimed ones).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// cpu or cuda.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Autocast on CUDA (ignored on CPU).
    #[arg(long, value_enum, default_value_t = Amp::Off)]
    amp: Amp,
    /// The memory format, as `train --channels-last` (auto: the trainer's choice).
    #[arg(long, value_enum, default_value_t = tchrun::layout::ChannelsLast::Auto)]
    channels_last: tchrun::layout::ChannelsLast,
    /// The same as --channels-last off.
    #[arg(long, conflicts_with = "channels_last")]
    no_channels_last: bool,
    /// Intra-op threads (default: libtorch's).
    #[arg(long)]
    threads: Option<i32>,
    /// The optimizer, as `train --opt` (momentum 0.9; weight decay 1e-4, AdamW's 0.05).
    #[arg(long, value_enum, default_value_t = tchrun::recipe::Opt::Sgd)]
    opt: tchrun::recipe::Opt,
    /// DenseNet: the memory-efficient layers (`model init --memory-efficient`).
    #[arg(long)]
    memory_efficient: bool,
    /// The trainer's per-step additions to run with the step, to measure each on its own
    /// (issue 30): `group` (a 1-rank Gloo group: the replicator's begin and end of a step and
    /// its stats tensor), `guard` (the divergence guard's total every step), `window` (the
    /// step's row in the device window, read when full or every 10 steps: the trainer now), `read-back` (the
    /// stats read to the host every step: the trainer before), `timers` (the time split's
    /// clocks), `scaler` (fp16's dynamic loss scaling, on any device: the loss scaled, the
    /// gradients unscaled and checked, the scale updated, all on the device; with `window` its
    /// flags in the row). `window` and `read-back` need `group`.
    #[arg(long, value_enum, value_delimiter = ',')]
    with: Vec<Addition>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Addition {
    Group,
    Guard,
    Window,
    ReadBack,
    Timers,
    Scaler,
}

/// This process's peak resident set size (getrusage's ru_maxrss, KiB on Linux), in MiB.
fn peak_rss_mib() -> Option<f64> {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF)
        .ok()
        .map(|u| u.max_rss() as f64 / 1024.0)
}

fn parse_arch(s: &str) -> Result<Arch, String> {
    Arch::from_name(s).ok_or_else(|| format!("unknown architecture '{s}'"))
}

/// The device of `--device`, with `--threads`, autocast's dtype and cuDNN's autotuner set;
/// returns it and whether autocast is on.
fn set_up_device(a: &Args) -> anyhow::Result<(Device, bool)> {
    let device = match a.device.as_str() {
        "cpu" => Device::Cpu,
        "cuda" if tch::Cuda::is_available() => Device::Cuda(0),
        "cuda" => anyhow::bail!("--device cuda: no CUDA device visible"),
        other => anyhow::bail!("--device {other}: expected cpu or cuda"),
    };
    if let Some(t) = a.threads {
        tch::set_num_threads(t.max(1));
    }
    let amp = device.is_cuda() && a.amp != Amp::Off;
    if amp {
        crate::comm::pg::set_autocast_dtype(a.amp == Amp::Bf16)?;
    }
    if device.is_cuda() {
        tch::Cuda::cudnn_set_benchmark(true);
    }
    Ok((device, amp))
}

/// Runs the benchmark and prints one JSON line on stdout.
pub fn run(a: Args) -> anyhow::Result<()> {
    let (device, amp) = set_up_device(&a)?;
    tch::manual_seed(0);
    let vs = tch::nn::VarStore::new(device);
    let net = models::build(a.arch, &vs.root(), a.classes, a.size, a.memory_efficient);
    let named: Vec<(String, Tensor)> = models::named(&vs).into_iter().collect();
    let setting = if a.no_channels_last {
        tchrun::layout::ChannelsLast::Off
    } else {
        a.channels_last
    };
    let channels_last =
        crate::layout::choose(setting, device.is_cuda(), a.arch, a.size).channels_last;
    if channels_last {
        models::to_channels_last(&named);
    }
    let trainable: Vec<(String, Tensor)> = named
        .iter()
        .filter(|(n, t)| !models::is_buffer(n) && t.requires_grad())
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    let decay = if a.opt == tchrun::recipe::Opt::Adamw {
        0.05
    } else {
        1e-4
    };
    let mut opt = Optimizer::new(a.opt, trainable, 0.9, decay);
    let x = Tensor::randn([a.batch_size, 3, a.size, a.size], (Kind::Float, device));
    let x = if channels_last {
        models::channels_last(&x)
    } else {
        x
    };
    let y = Tensor::randint(a.classes, [a.batch_size], (Kind::Int64, device));
    let model = StepModel {
        net: net.as_ref(),
        train: true,
        amp,
        device,
        label_smoothing: 0.0,
        class_weights: None,
    };
    // Loss scaling is fp16 training's (off unless `--with scaler`: scale 1, every step taken).
    let mut scaler = if a.with.contains(&Addition::Scaler) {
        LossScaler::on(device, crate::train::scaler::INITIAL_SCALE)
    } else {
        LossScaler::off()
    };
    let sync = || {
        if device.is_cuda() {
            tch::Cuda::synchronize(0);
        }
    };
    let has = |x: Addition| a.with.contains(&x);
    if (has(Addition::Window) || has(Addition::ReadBack)) && !has(Addition::Group) {
        anyhow::bail!("--with window and --with read-back need --with group (the stats they read)");
    }
    let group_and_store = has(Addition::Group)
        .then(|| one_rank_group(device))
        .transpose()?;
    let group = group_and_store.as_ref().map(|(pg, _)| pg);
    let replicas = group.map(|_| crate::comm::ddp::Replicator::new(&named, models::is_buffer));
    let guard = has(Addition::Guard).then(|| Guard::watching(&named));
    let mut window = has(Addition::Window).then(|| StepWindow::new(device, scaler.enabled()));
    let mut split = [0.0f64; 3];
    let mut start = Instant::now();
    for i in 0..a.warmup + a.steps {
        if i == a.warmup {
            sync();
            start = Instant::now();
        }
        let t0 = has(Addition::Timers).then(Instant::now);
        opt.zero_grad()?;
        // The training step itself, on one process.
        let done = train_step(
            &model,
            Some((&x, &y)),
            false,
            group.zip(replicas.as_ref()),
            Some(Update {
                opt: &mut opt,
                scaler: &mut scaler,
                lr: 0.01,
                clip: None,
            }),
            None,
        )?;
        let total = guard.as_ref().and_then(|g| g.total(i as u64));
        if let Some(stats) = &done.stats {
            if has(Addition::ReadBack) {
                let (loss, _, _) = stats.read();
                let finite = total
                    .as_ref()
                    .is_none_or(|t| t.double_value(&[]).is_finite());
                anyhow::ensure!(loss.is_finite() && finite, "non-finite at step {i}");
            }
            if let Some(w) = window.as_mut() {
                let row = RowInfo {
                    step: i as u64,
                    epoch: 1,
                    lr_before: 0.01,
                    lr_after: 0.01,
                };
                let flags = scaler.flags().filter(|_| done.scaler_checked);
                w.push(stats, total.as_ref(), flags, row);
                if w.is_full() || (i + 1) % 10 == 0 {
                    w.read()
                        .map_err(|(bad, at)| anyhow::anyhow!("{bad:?} at step {}", at.step))?;
                }
            }
        }
        if let Some(t0) = t0.filter(|_| i >= a.warmup) {
            let t3 = Instant::now();
            split[0] += (done.backward_done - t0).as_secs_f64();
            split[1] += (done.reduced - done.backward_done).as_secs_f64();
            split[2] += t3.elapsed().as_secs_f64();
        }
    }
    sync();
    let secs = start.elapsed().as_secs_f64() / a.steps.max(1) as f64;
    let line = serde_json::json!({
        "tool": "tchrun",
        "arch": a.arch.name(),
        "size": a.size,
        "batch_size": a.batch_size,
        "steps": a.steps,
        "device": a.device,
        "amp": if amp { a.amp.as_str() } else { "off" },
        "channels_last": channels_last,
        "threads": tch::get_num_threads(),
        "memory_efficient": a.memory_efficient,
        "opt": a.opt.as_str(),
        "ms_per_step": secs * 1e3,
        "images_per_sec": a.batch_size as f64 / secs,
        "peak_rss_mib": peak_rss_mib(),
        "with": a.with.iter().map(|x| format!("{x:?}").to_lowercase()).collect::<Vec<_>>(),
        "split_s": split,
    });
    println!("{line}");
    Ok(())
}

/// A process group of this process alone (Gloo on loopback, a store on a free port), and the
/// store it was made with (kept while the group lives).
fn one_rank_group(
    device: Device,
) -> anyhow::Result<(crate::comm::pg::ProcessGroup, crate::comm::pg::Store)> {
    use crate::comm::pg::{BackendKind, ProcessGroup, Store};
    let timeout = std::time::Duration::from_secs(30);
    let store = Store::serve("127.0.0.1", 0, 1, timeout)?;
    let backend = if device.is_cuda() {
        BackendKind::Nccl
    } else {
        BackendKind::Gloo
    };
    let gloo = crate::comm::netif::GlooDevice::Address("127.0.0.1".into());
    let pg = ProcessGroup::new(&store, "bench", backend, 0, 1, timeout, &gloo, device)?;
    Ok((pg, store))
}
