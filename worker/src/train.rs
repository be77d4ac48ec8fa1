//! `tchrun-worker train`: data-parallel training of an image classifier ("Train PyTorch
//! Model"): inputs checked, model replicated from rank 0, sharded epochs through the threaded
//! loader, bucketed gradient all-reduce, warmup + polynomial LR, validation reduced exactly,
//! early stopping on validation loss, NaN stops every rank together, rank 0 writes the model.
use crate::checkpoint;
use crate::ddp::Replicator;
use crate::models;
use crate::optim::Sgd;
use crate::outputs;
use crate::pg::{C10dError, ProcessGroup, ReduceOp};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tch::{nn, nn::ModuleT, Device, Kind, Tensor};
use tchrun::data::{self, Augment, DatasetError, ImageFolder, LoaderConfig, TrainAugment};
use tchrun::exit::ErrorKind;
use tchrun::flags::{Amp, TrainJob};
use tchrun::metrics::{EpochMetrics, SCHEMA_VERSION};
use tchrun::model::ModelConfig;
use tchrun::schedule::{Decision, EarlyStopping, LrSchedule};

/// Why training stopped early.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Preflight(#[from] tchrun::preflight::PreflightError),
    #[error("data error during training: {0}")]
    Data(DatasetError),
    #[error(
        "training diverged: the loss became {value} at epoch {epoch}, step {step}. Lower --lr: the \
         effective LR was {effective_lr:e} (--lr {lr:e} × world size {world})"
    )]
    Diverged {
        value: f64,
        epoch: u32,
        step: u64,
        effective_lr: f64,
        lr: f64,
        world: usize,
    },
    #[error(transparent)]
    Comm(#[from] C10dError),
    #[error("parameters differ across ranks after training (replicas out of sync)")]
    Replicas,
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("stopped by signal {0}; a checkpoint was written: continue with --resume")]
    Stopped(i32),
    #[error("writing the outputs: {0}")]
    Output(String),
    #[error("tensor error: {0}")]
    Torch(#[from] tch::TchError),
}

impl TrainError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            TrainError::Invalid(_) | TrainError::Preflight(_) => ErrorKind::InvalidInput,
            TrainError::Diverged { .. } => ErrorKind::Diverged,
            TrainError::Stopped(sig) if *sig == signal_hook::consts::SIGINT => {
                ErrorKind::InterruptedInt
            }
            TrainError::Stopped(_) => ErrorKind::InterruptedTerm,
            TrainError::Data(_)
            | TrainError::Comm(_)
            | TrainError::Replicas
            | TrainError::Checkpoint(_)
            | TrainError::Output(_)
            | TrainError::Torch(_) => ErrorKind::RankFailed,
        }
    }
}

pub use tchrun::preflight::Inputs;

/// Model directory, image directories (every header decoded), output: before any step.
/// `verified`: the launcher's verification (`verified_inputs.json`), reused when it describes
/// exactly the files this rank finds. Also returns a line for the driver log saying which.
pub fn check_inputs(
    job: &TrainJob,
    verified: Option<&std::path::Path>,
) -> Result<(Inputs, String), TrainError> {
    use tchrun::preflight::{check_train_job_with, Verification, VerifiedInputs};
    let manifest = verified.map(VerifiedInputs::read);
    let verification = match &manifest {
        Some(Ok(m)) => Verification::Reuse(m),
        _ => Verification::Full,
    };
    let checked = check_train_job_with(job, verification)?;
    let n = checked.inputs.train.samples.len() + checked.inputs.valid.samples.len();
    let note = match (&manifest, &checked.reused) {
        (None, _) => format!("image headers verified here ({n} images)"),
        (Some(Err(e)), _) => format!(
            "image headers verified here ({n} images): the launcher's verification is unreadable ({e})"
        ),
        (Some(Ok(_)), Ok(())) => {
            format!("image headers: the launcher's verification reused ({n} images)")
        }
        (Some(Ok(_)), Err(why)) => format!(
            "image headers verified here ({n} images): the launcher's verification does not apply ({why})"
        ),
    };
    Ok((checked.inputs, note))
}

/// What the training loop needs from the rank.
pub struct RankCtx<'a> {
    pub pg: &'a ProcessGroup,
    pub store: &'a crate::pg::Store,
    pub device: Device,
    pub local_size: usize,
    pub say: &'a dyn Fn(&str),
}

struct Validation {
    loss: f64,
    top1: f64,
    top5: f64,
}

fn to_input(batch: &data::Batch, device: Device, channels_last: bool) -> (Tensor, Tensor) {
    let s = batch.size as i64;
    let x = Tensor::from_slice(&batch.images).view([batch.len as i64, 3, s, s]);
    let y = Tensor::from_slice(&batch.labels);
    let (x, y) = if device.is_cuda() {
        (
            x.pin_memory(device)
                .to_device_(device, Kind::Float, true, false),
            y.to_device_(device, Kind::Int64, true, false),
        )
    } else {
        (x, y)
    };
    if channels_last {
        (models::channels_last(&x), y)
    } else {
        (x, y)
    }
}

fn loader_threads(job: &TrainJob, local_size: usize) -> usize {
    job.options
        .loader_threads
        .map(|t| t as usize)
        .unwrap_or_else(|| {
            let cores = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1);
            (cores / local_size.max(1)).max(1)
        })
}

fn validate(
    model: &dyn ModuleT,
    valid: &ImageFolder,
    cfg: &ModelConfig,
    job: &TrainJob,
    ctx: &RankCtx,
) -> Result<Validation, TrainError> {
    let (rank, world) = (ctx.pg.rank(), ctx.pg.size());
    let mut idx = data::shard(valid.samples.len(), rank, world, 0, 0, false);
    idx.truncate(data::shard_real_count(valid.samples.len(), rank, world));
    let loader = data::load_batches(
        valid,
        idx,
        LoaderConfig {
            size: cfg.input_size as usize,
            batch_size: job.params.batch_size as usize,
            threads: loader_threads(job, ctx.local_size),
            prefetch: 4,
            augment: Augment::Eval,
            norm: cfg.normalization,
            seed: job.params.seed,
            epoch: 0,
            rank,
            first_position: 0,
        },
    );
    let k = 5.min(valid.classes.len() as i64);
    // [loss sum, top-1 correct, top-5 correct, samples], reduced exactly over the ranks.
    let mut totals = Tensor::zeros([4], (Kind::Double, ctx.device));
    for batch in loader {
        let batch = match batch {
            Ok(b) => b,
            Err(e) if job.options.skip_bad_images => {
                tracing::warn!("skipped a validation batch (--skip-bad-images): {e}");
                continue;
            }
            Err(e) => return Err(TrainError::Data(e)),
        };
        let (x, y) = to_input(&batch, ctx.device, !job.options.no_channels_last);
        tch::no_grad(|| {
            let logits = model.forward_t(&x, false).to_kind(Kind::Float);
            let loss =
                logits.cross_entropy_loss::<Tensor>(&y, None, tch::Reduction::Sum, -100, 0.0);
            let (_, top) = logits.topk(k, -1, true, true);
            let hits = top.eq_tensor(&y.unsqueeze(1));
            let top1 = hits.narrow(1, 0, 1).sum(Kind::Double);
            let topk = hits.any_dim(1, false).sum(Kind::Double);
            let n = Tensor::from(batch.len as f64).to_device(ctx.device);
            totals += Tensor::stack(&[loss.to_kind(Kind::Double), top1, topk, n], 0);
        });
    }
    ctx.pg.all_reduce(&mut [&mut totals], ReduceOp::Sum)?;
    let t = Vec::<f64>::try_from(totals.to_device(Device::Cpu))?;
    let n = t[3].max(1.0);
    Ok(Validation {
        loss: t[0] / n,
        top1: t[1] / n,
        top5: t[2] / n,
    })
}

/// Training state restored from a checkpoint (or fresh).
struct Resume {
    epoch: u32,
    batches_done: u64,
    step: u64,
    stopping: EarlyStopping,
    history: Vec<EpochMetrics>,
    partial: (f64, f64, f64),
    loss_scale: Option<f64>,
}

fn fresh(patience: u32) -> Resume {
    Resume {
        epoch: 0,
        batches_done: 0,
        step: 0,
        stopping: EarlyStopping::new(patience),
        history: Vec::new(),
        partial: (0.0, 0.0, 0.0),
        loss_scale: None,
    }
}

/// Rank 0 reads the checkpoint and shares its description through the store; the tensors
/// reach the other ranks by broadcast (no shared file system needed).
fn load_resume(
    job: &TrainJob,
    ctx: &RankCtx,
    named: &[(String, Tensor)],
    opt: &mut Sgd,
    best: &mut Option<BTreeMap<String, Tensor>>,
) -> Result<Option<checkpoint::Meta>, TrainError> {
    const KEY: &str = "tchrun/resume";
    let pg = ctx.pg;
    if pg.rank() == 0 {
        let loaded = if job.options.resume {
            checkpoint::load(&job.output).map_err(TrainError::Checkpoint)?
        } else {
            None
        };
        let text = match &loaded {
            Some(l) => {
                serde_json::to_string(&l.meta).map_err(|e| TrainError::Checkpoint(e.to_string()))?
            }
            None => String::new(),
        };
        ctx.store.set(KEY, text.as_bytes())?;
        let Some(l) = loaded else { return Ok(None) };
        tch::no_grad(|| -> Result<(), TrainError> {
            for (name, t) in named {
                let src = l
                    .model
                    .get(name)
                    .ok_or_else(|| TrainError::Checkpoint(format!("checkpoint lacks '{name}'")))?;
                t.detach().copy_(&src.to_kind(t.kind()));
            }
            Ok(())
        })?;
        opt.load_state(l.momentum);
        *best = l.best;
        Ok(Some(l.meta))
    } else {
        let text = ctx.store.get(KEY)?;
        if text.is_empty() {
            return Ok(None);
        }
        let meta: checkpoint::Meta =
            serde_json::from_slice(&text).map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        if meta.step > 0 {
            // Placeholders the broadcast from rank 0 fills.
            let zeros = opt
                .params()
                .iter()
                .map(|(n, p)| (n.clone(), p.detach().zeros_like()))
                .collect();
            opt.load_state(zeros);
        }
        Ok(Some(meta))
    }
}

/// Trains and (rank 0) writes the model directory.
pub fn train(job: &TrainJob, inputs: Inputs, ctx: &RankCtx) -> Result<(), TrainError> {
    let Inputs {
        cfg,
        train,
        valid,
        skipped,
    } = inputs;
    let (pg, device) = (ctx.pg, ctx.device);
    let (rank, world) = (pg.rank(), pg.size());
    let p = &job.params;
    if !skipped.is_empty() {
        tracing::warn!(
            count = skipped.len(),
            "skipping bad images (--skip-bad-images)"
        );
        for (path, why) in &skipped {
            tracing::warn!("skipped {}: {why}", path.display());
        }
        (ctx.say)(&format!(
            "skipped {} bad image(s) (--skip-bad-images); listed in the driver logs",
            skipped.len()
        ));
    }
    let classes = train.classes.len() as i64;
    tch::manual_seed(p.seed);
    if device.is_cuda() {
        tch::Cuda::cudnn_set_benchmark(true);
    }
    let amp = device.is_cuda() && job.options.amp != Amp::Off;
    if amp {
        crate::pg::set_autocast_dtype(job.options.amp == Amp::Bf16)?;
    }
    let vs = nn::VarStore::new(device);
    let net = models::build(cfg.arch, &vs.root(), classes);
    let named: Vec<(String, Tensor)> = models::named(&vs).into_iter().collect();
    if !job.options.no_channels_last {
        let n = models::to_channels_last(&named);
        tracing::info!("channels-last layout for {n} convolution weight(s) and the input batches");
    }
    let trainable: Vec<(String, Tensor)> = named
        .iter()
        .filter(|(n, t)| !models::is_buffer(n) && t.requires_grad())
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    let (first_cap, cap) = job.options.bucket_caps();
    let replicas = Replicator::new(&named, models::is_buffer).with_bucket_caps(first_cap, cap);
    let mut opt = Sgd::new(trainable, job.options.momentum, job.options.weight_decay);

    let per_rank = data::shard(train.samples.len(), rank, world, p.seed, 0, true).len();
    let steps_per_epoch = per_rank.div_ceil(p.batch_size as usize) as u64;
    let schedule = LrSchedule::new(
        p.lr,
        world,
        p.warmup_epochs,
        p.epochs,
        steps_per_epoch,
        job.options.lr_power,
    );

    // Resume (rank 0 reads; everyone receives), then replicate from rank 0.
    let mut best_weights: Option<BTreeMap<String, Tensor>> = None;
    let mut state = fresh(p.patience);
    if let Some(meta) = load_resume(job, ctx, &named, &mut opt, &mut best_weights)? {
        if meta.finished {
            (ctx.say)(&format!(
                "training already complete in {} (nothing to resume)",
                job.output.display()
            ));
            return Ok(());
        }
        let same_world = meta.world_size == world;
        state = Resume {
            epoch: meta.epoch,
            // Mid-epoch positions only carry over to the same sharding.
            batches_done: if same_world { meta.batches_done } else { 0 },
            step: if same_world {
                meta.step
            } else {
                meta.epoch as u64 * steps_per_epoch
            },
            stopping: EarlyStopping {
                patience: p.patience,
                best: meta.best_loss.zip(meta.best_epoch),
                since_best: meta.since_best,
            },
            history: meta.history.clone(),
            partial: if same_world && meta.batches_done > 0 {
                meta.partial
            } else {
                (0.0, 0.0, 0.0)
            },
            loss_scale: Some(meta.loss_scale),
        };
        let mut msg = format!(
            "resuming from {} at epoch {} (batch {}), step {}",
            checkpoint::dir(&job.output).display(),
            state.epoch + 1,
            state.batches_done,
            state.step
        );
        if !same_world {
            msg.push_str(&format!(
                "; world size {} (checkpoint: {}): LR and sharding recomputed, epoch {} restarts from its first batch",
                world,
                meta.world_size,
                state.epoch + 1
            ));
        }
        (ctx.say)(&msg);
        if rank == 0 {
            outputs::rewrite_metrics(&job.output, &state.history).map_err(TrainError::Output)?;
        }
    }
    replicas.broadcast_all(pg)?;
    let momentum: Vec<Tensor> = opt.state().values().map(|t| t.shallow_clone()).collect();
    if world > 1 && !momentum.is_empty() {
        Replicator::broadcast_tensors(pg, &momentum)?;
    }

    (ctx.say)(&format!(
        "training {} on {} train / {} valid images, {} classes, {world} rank(s) on {}: {} steps/epoch, \
         effective LR {:e} (--lr {:e} × {world}), gradient buckets of {} MiB overlapped with backward",
        cfg.arch.name(),
        train.samples.len(),
        valid.samples.len(),
        classes,
        if device.is_cuda() { "cuda" } else { "cpu" },
        steps_per_epoch,
        schedule.peak,
        p.lr,
        job.options.bucket_cap_mb
    ));

    let threads = loader_threads(job, ctx.local_size);
    let mut step = state.step;
    let mut stopping = state.stopping;
    let mut history = state.history;
    let mut scaler = LossScaler::new(job.options.amp == Amp::Fp16 && device.is_cuda());
    if let Some(s) = state.loss_scale.filter(|_| scaler.enabled) {
        scaler.scale = s;
    }
    let (mut compute_s, mut comm_s, mut images) = (0.0f64, 0.0f64, 0.0f64);
    let checkpoint_meta = |epoch: u32,
                           batches_done: u64,
                           step: u64,
                           stopping: &EarlyStopping,
                           history: &[EpochMetrics],
                           partial,
                           scale,
                           finished| checkpoint::Meta {
        format_version: checkpoint::FORMAT_VERSION,
        epoch,
        batches_done,
        step,
        world_size: world,
        seed: p.seed,
        best_loss: stopping.best.map(|b| b.0),
        best_epoch: stopping.best.map(|b| b.1),
        since_best: stopping.since_best,
        history: history.to_vec(),
        partial,
        loss_scale: scale,
        finished,
    };
    crate::signals::set_graceful(true);
    let mut start_epoch = state.epoch;
    let mut skip_batches = state.batches_done;
    let mut partial = state.partial;
    let mut lr = schedule.lr(step);
    let (run_start, run_first_step) = (Instant::now(), step);
    'epochs: for epoch in start_epoch..p.epochs {
        start_epoch = epoch;
        let t_epoch = Instant::now();
        let mut indices = data::shard(train.samples.len(), rank, world, p.seed, epoch as u64, true);
        let first_position = (skip_batches as usize * p.batch_size as usize).min(indices.len());
        indices.drain(..first_position);
        let loader = data::load_batches(
            &train,
            indices,
            LoaderConfig {
                size: cfg.input_size as usize,
                batch_size: p.batch_size as usize,
                threads,
                prefetch: 4,
                augment: Augment::Train(TrainAugment {
                    min_scale: job.options.min_crop_scale,
                    hflip: !job.options.no_hflip,
                }),
                norm: cfg.normalization,
                seed: p.seed,
                epoch: epoch as u64,
                rank,
                first_position,
            },
        );
        let (mut loss_sum, mut seen, prior_s) = partial;
        partial = (0.0, 0.0, 0.0);
        let mut t_print = Instant::now();
        let mut seen_print = 0.0f64;
        for (k, batch) in loader.enumerate() {
            let it = skip_batches + k as u64;
            // An image that fails only while decoding: with --skip-bad-images this rank
            // contributes no samples to the step (the others' gradients still apply), so every
            // rank keeps taking the same steps.
            let batch = match batch {
                Ok(b) => Some(b),
                Err(e) if job.options.skip_bad_images => {
                    tracing::warn!("skipped a batch (--skip-bad-images): {e}");
                    None
                }
                Err(e) => return Err(TrainError::Data(e)),
            };
            let t0 = Instant::now();
            opt.zero_grad()?;
            let n_local = batch.as_ref().map(|b| b.len).unwrap_or(0);
            let stop_vote = crate::signals::requested() != 0;
            let loss = match &batch {
                Some(batch) => {
                    let (x, y) = to_input(batch, device, !job.options.no_channels_last);
                    tch::autocast(amp, || {
                        net.forward_t(&x, true)
                            .to_kind(Kind::Float)
                            .cross_entropy_for_logits(&y)
                    })
                }
                None => Tensor::zeros([], (Kind::Float, device)),
            };
            // begin_step arms the gradient hooks: buckets are all-reduced while backward runs.
            replicas.begin_step(pg, &loss, n_local, stop_vote)?;
            if batch.is_some() {
                (&loss * scaler.scale).backward();
            }
            let t1 = Instant::now();
            let stats = replicas.end_step(pg)?;
            let t2 = Instant::now();
            if step == run_first_step {
                if let Some(r) = replicas.last_reduction() {
                    tracing::info!(
                        "gradient buckets: {} (caps {} / {} bytes), in rank 0's order of gradient arrival",
                        r.buckets,
                        first_cap,
                        cap
                    );
                }
            } else if step == run_first_step + 1 {
                if let Some(r) = replicas.last_reduction() {
                    tracing::info!(
                        "gradient all-reduce: {} of {} bucket(s) started during backward",
                        r.early,
                        r.buckets
                    );
                }
            }
            if !stats.loss.is_finite() {
                return Err(TrainError::Diverged {
                    value: stats.loss,
                    epoch: epoch + 1,
                    step,
                    effective_lr: lr,
                    lr: p.lr,
                    world,
                });
            }
            lr = schedule.lr(step);
            if scaler.unscale_and_check(opt.params())? {
                opt.step(lr);
                if step == 0 {
                    tracing::info!("first optimizer step done");
                }
            }
            let t3 = Instant::now();
            // Communication: the all-reduce time backward did not hide.
            comm_s += (t2 - t1).as_secs_f64();
            compute_s += (t1 - t0).as_secs_f64() + (t3 - t2).as_secs_f64();
            images += n_local as f64;
            step += 1;
            loss_sum += stats.loss * stats.samples;
            seen += stats.samples;
            seen_print += stats.samples;
            if (it + 1) % p.print_freq as u64 == 0 || it + 1 == steps_per_epoch {
                let ips = seen_print / t_print.elapsed().as_secs_f64().max(1e-9);
                // ETA of the training steps left (validation not included), from this run's pace.
                let done_here = (step - run_first_step).max(1) as f64;
                let left = schedule.total_steps.saturating_sub(step) as f64;
                let eta = Duration::from_secs(
                    (run_start.elapsed().as_secs_f64() / done_here * left) as u64,
                );
                let line = format!(
                    "epoch {}/{} iter {}/{} loss {:.4} lr {:.3e} images/s {:.1} eta {}",
                    epoch + 1,
                    p.epochs,
                    it + 1,
                    steps_per_epoch,
                    stats.loss,
                    lr,
                    ips,
                    humantime::format_duration(eta)
                );
                (ctx.say)(&line);
                t_print = Instant::now();
                seen_print = 0.0;
            }
            if stats.stop {
                // Every rank saw the vote in this step's reduction: stop together.
                let sig = crate::signals::requested();
                if rank == 0 {
                    let elapsed = prior_s + t_epoch.elapsed().as_secs_f64();
                    let meta = checkpoint_meta(
                        epoch,
                        it + 1,
                        step,
                        &stopping,
                        &history,
                        (loss_sum, seen, elapsed),
                        scaler.scale,
                        false,
                    );
                    checkpoint::save(&job.output, &meta, &named, opt.state(), None)
                        .map_err(TrainError::Checkpoint)?;
                    (ctx.say)(&format!(
                        "stopped at epoch {} batch {} (step {step}); checkpoint written to {}; continue with --resume",
                        epoch + 1,
                        it + 1,
                        checkpoint::dir(&job.output).display()
                    ));
                }
                pg.barrier()?;
                return Err(TrainError::Stopped(if sig != 0 {
                    sig
                } else {
                    signal_hook::consts::SIGTERM
                }));
            }
        }
        skip_batches = 0;
        let train_time = prior_s + t_epoch.elapsed().as_secs_f64();
        let v = validate(net.as_ref(), &valid, &cfg, job, ctx)?;
        let m = EpochMetrics {
            schema: SCHEMA_VERSION,
            epoch: epoch + 1,
            train_loss: loss_sum / seen.max(1.0),
            train_images_per_sec: seen / train_time.max(1e-9),
            val_loss: v.loss,
            top1: v.top1,
            top5: v.top5,
            lr,
            epoch_time_s: prior_s + t_epoch.elapsed().as_secs_f64(),
            time: tchrun::files::timestamp_now(),
        };
        let line = format!(
            "epoch {}/{}: train loss {:.4}, {:.1} images/s; valid loss {:.4}, top-1 {:.2}%, top-5 {:.2}%",
            m.epoch,
            p.epochs,
            m.train_loss,
            m.train_images_per_sec,
            m.val_loss,
            100.0 * m.top1,
            100.0 * m.top5
        );
        (ctx.say)(&line);
        history.push(m.clone());
        let decision = stopping.update(epoch + 1, v.loss);
        if decision == Decision::Improved {
            best_weights = Some(
                named
                    .iter()
                    .map(|(n, t)| (n.clone(), t.detach().to_device(Device::Cpu).copy()))
                    .collect(),
            );
        }
        let done = decision == Decision::Stop || epoch + 1 == p.epochs;
        if rank == 0 {
            let meta = checkpoint_meta(
                epoch + 1,
                0,
                step,
                &stopping,
                &history,
                (0.0, 0.0, 0.0),
                scaler.scale,
                false,
            );
            let best = if decision == Decision::Improved {
                best_weights.as_ref()
            } else {
                None
            };
            checkpoint::save(&job.output, &meta, &named, opt.state(), best)
                .map_err(TrainError::Checkpoint)?;
            outputs::append_metrics(&job.output, &m).map_err(TrainError::Output)?;
        }
        if decision == Decision::Stop {
            let msg = format!(
                "early stopping after epoch {}: validation loss has not decreased for {} epoch(s) (--patience {})",
                epoch + 1,
                stopping.since_best,
                p.patience
            );
            (ctx.say)(&msg);
        }
        if done {
            break 'epochs;
        }
    }
    let _ = start_epoch;
    crate::signals::set_graceful(false);

    if !replicas.identical_across_ranks(pg)? {
        return Err(TrainError::Replicas);
    }
    let (sum, sumsq) = replicas.fingerprint();
    tracing::info!(
        "parameters identical across ranks; fingerprint sum={sum:.9e} sumsq={sumsq:.9e}"
    );
    tracing::info!(
        "rank summary: images {images:.0}, compute {compute_s:.2}s, communication {comm_s:.2}s, images/s {:.1}",
        images / (compute_s + comm_s).max(1e-9)
    );

    let (Some((_, best_epoch)), Some(weights)) = (stopping.best, best_weights) else {
        return Err(TrainError::Invalid(
            "no epoch completed with a finite validation loss".into(),
        ));
    };
    if rank == 0 {
        let best_metrics = history.get(best_epoch as usize - 1).cloned();
        let trained = ModelConfig {
            class_names: train.classes.clone(),
            training: Some(serde_json::json!({
                "epochs": p.epochs, "epochs_run": history.len(), "best_epoch": best_epoch,
                "batch_size": p.batch_size, "warmup_epochs": p.warmup_epochs, "lr": p.lr,
                "effective_lr": schedule.peak, "world_size": world, "seed": p.seed, "patience": p.patience,
                "momentum": job.options.momentum, "weight_decay": job.options.weight_decay,
                "lr_power": job.options.lr_power, "steps": step,
                "train_images": train.samples.len(), "valid_images": valid.samples.len(),
            })),
            metrics: best_metrics
                .as_ref()
                .map(|m| serde_json::to_value(m).unwrap_or_default()),
            ..cfg.clone()
        };
        let state_dict = models::state_dict(&weights, step as i64);
        outputs::write_model_dir(&job.output, &trained, &state_dict, &history)
            .map_err(TrainError::Output)?;
        let meta = checkpoint_meta(
            history.len() as u32,
            0,
            step,
            &stopping,
            &history,
            (0.0, 0.0, 0.0),
            scaler.scale,
            true,
        );
        checkpoint::save(&job.output, &meta, &named, opt.state(), None)
            .map_err(TrainError::Checkpoint)?;
        if let Some(m) = best_metrics {
            (ctx.say)(&format!(
                "best epoch {best_epoch}: valid top-1 {:.2}%, top-5 {:.2}%, loss {:.4}",
                100.0 * m.top1,
                100.0 * m.top5,
                m.val_loss
            ));
        }
    }
    pg.barrier()?;
    Ok(())
}

/// Dynamic loss scaling for fp16 autocast (off: scale 1, every step taken).
struct LossScaler {
    enabled: bool,
    scale: f64,
    good_steps: u32,
}

impl LossScaler {
    fn new(enabled: bool) -> LossScaler {
        LossScaler {
            enabled,
            scale: if enabled { 65536.0 } else { 1.0 },
            good_steps: 0,
        }
    }

    /// Unscales the (reduced, identical on every rank) gradients; false: skip this step.
    fn unscale_and_check(&mut self, params: &[(String, Tensor)]) -> Result<bool, TrainError> {
        if !self.enabled {
            return Ok(true);
        }
        let grads: Vec<Tensor> = params
            .iter()
            .map(|(_, p)| p.grad())
            .filter(|g| g.defined())
            .collect();
        let mut finite = true;
        tch::no_grad(|| {
            for g in &grads {
                let mut g = g.shallow_clone();
                let _ = g.g_mul_scalar_(1.0 / self.scale);
            }
        });
        for g in &grads {
            if g.isfinite().all().int64_value(&[]) == 0 {
                finite = false;
                break;
            }
        }
        if finite {
            self.good_steps += 1;
            if self.good_steps >= 2000 {
                self.scale *= 2.0;
                self.good_steps = 0;
            }
        } else {
            self.scale /= 2.0;
            self.good_steps = 0;
            tracing::warn!(
                scale = self.scale,
                "fp16 gradients overflowed; step skipped, loss scale lowered"
            );
        }
        Ok(finite)
    }
}
