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
use tchrun::model::{ModelConfig, TrainingRecord};
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
        "training diverged: {what} became {value} at epoch {epoch}, step {step}. Lower --lr: the \
         effective LR was {effective_lr:e} (--lr {lr:e} × world size {world})"
    )]
    Diverged {
        /// What went non-finite: "the loss", "the gradient of fc.weight", ...
        what: String,
        value: f64,
        epoch: u32,
        step: u64,
        effective_lr: f64,
        lr: f64,
        world: usize,
    },
    #[error(transparent)]
    Comm(#[from] C10dError),
    #[error(
        "parameters differ across ranks after training (replicas out of sync): '{0}' is the first \
         tensor that differs"
    )]
    Replicas(String),
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
            | TrainError::Replicas(_)
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
    /// Images dropped while decoding in this epoch (training and validation, all ranks).
    skipped: u64,
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
        .unwrap_or_else(|| tchrun::env::threads_per_rank(local_size))
}

fn validate(
    model: &dyn ModuleT,
    valid: &ImageFolder,
    cfg: &ModelConfig,
    job: &TrainJob,
    ctx: &RankCtx,
    bad_images: &mut BadImages,
    train_skipped: u64,
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
            skip_bad: job.options.skip_bad_images,
        },
    );
    let k = 5.min(valid.classes.len() as i64);
    // [loss sum, top-1 correct, top-5 correct, samples, skipped images (validation here, plus
    // this rank's training epoch)], reduced exactly over the ranks.
    let mut totals = Tensor::zeros([5], (Kind::Double, ctx.device));
    let mut skipped_here = train_skipped;
    for batch in loader {
        let batch = batch.map_err(TrainError::Data)?;
        skipped_here += bad_images.note(&batch.skipped);
        if batch.len == 0 {
            continue;
        }
        let (x, y) = to_input(&batch, ctx.device, !job.options.no_channels_last);
        tch::no_grad(|| {
            let logits = model.forward_t(&x, false).to_kind(Kind::Float);
            let loss =
                logits.cross_entropy_loss::<Tensor>(&y, None, tch::Reduction::Sum, -100, 0.0);
            let (_, top) = logits.topk(k, -1, true, true);
            let hits = top.eq_tensor(&y.unsqueeze(1));
            let top1 = hits.narrow(1, 0, 1).sum(Kind::Double);
            let topk = hits.any_dim(1, false).sum(Kind::Double);
            // A fill, not a host-to-device copy: no synchronization per batch on CUDA.
            let n = Tensor::full([], batch.len as f64, (Kind::Double, ctx.device));
            // Into the first four slots (a view): the fifth is this rank's skipped count.
            let mut sums = totals.narrow(0, 0, 4);
            sums += Tensor::stack(&[loss.to_kind(Kind::Double), top1, topk, n], 0);
        });
    }
    if skipped_here > 0 {
        let _ = totals.get(4).fill_(skipped_here as f64);
    }
    ctx.pg.all_reduce(&mut [&mut totals], ReduceOp::Sum)?;
    let t = Vec::<f64>::try_from(totals.to_device(Device::Cpu))?;
    let n = t[3].max(1.0);
    Ok(Validation {
        loss: t[0] / n,
        top1: t[1] / n,
        top5: t[2] / n,
        skipped: t[4].round().max(0.0) as u64,
    })
}

/// The driver-log line naming a skipped image (pre-flight or decoding), with the contract's
/// prefix (`tchrun::files::SKIPPED_IMAGE`) the launcher's run report counts.
fn log_skipped(path: &std::path::Path, why: &str) {
    tracing::warn!(
        "{}{} (--skip-bad-images): {why}",
        tchrun::files::SKIPPED_IMAGE,
        path.display()
    );
}

/// Images dropped while decoding (`--skip-bad-images`): each file is named once in this rank's
/// driver log, with the contract's prefix (`tchrun::files::SKIPPED_IMAGE`) the launcher counts.
#[derive(Default)]
struct BadImages {
    named: std::collections::HashSet<std::path::PathBuf>,
}

impl BadImages {
    /// Logs the files not named yet; returns how many images were dropped.
    fn note(&mut self, skipped: &[(std::path::PathBuf, String)]) -> u64 {
        for (path, why) in skipped {
            if self.named.insert(path.clone()) {
                log_skipped(path, why);
            }
        }
        skipped.len() as u64
    }

    fn distinct(&self) -> usize {
        self.named.len()
    }
}

/// The first tensor (by name) holding a NaN or an infinity, and that value.
fn first_non_finite(tensors: &[(String, Tensor)]) -> Option<(String, f64)> {
    tensors.iter().find_map(|(name, t)| {
        if !t.defined() {
            return None;
        }
        let bad = t.isfinite().logical_not();
        if bad.any().int64_value(&[]) == 0 {
            return None;
        }
        let value = t.masked_select(&bad).get(0).double_value(&[]);
        Some((name.clone(), value))
    })
}

/// The non-finite guard run after every optimizer step: one fused value (the sum of every
/// tensor's L1 norm, `pg::l1_total`: finite exactly when every value is) over the weights and the
/// batch-norm statistics. A non-finite gradient reaches the weights through the update (also at
/// LR 0: NaN × 0 is NaN). Cost on CPU: ~2 ms per ResNet-18 step (one pass over the weights). On
/// CUDA it is read after the next step's reduction, where the rank waits for the device anyway,
/// so the check costs no synchronization of its own.
struct Guard {
    /// Weights and buffers by name.
    watched: Vec<(String, Tensor)>,
    /// 0-d float64 sum of every watched tensor's sum, for the step named, and its LR.
    pending: Option<(Tensor, u64, u32, f64)>,
}

impl Guard {
    fn arm(&mut self, step: u64, epoch: u32, lr: f64) {
        if self.watched.is_empty() {
            return;
        }
        let tensors: Vec<Tensor> = self.watched.iter().map(|(_, t)| t.detach()).collect();
        match crate::pg::l1_total(&tensors) {
            Ok(total) => self.pending = Some((total, step, epoch, lr)),
            // Cannot happen for a model's float weights; never a reason to stop training.
            Err(e) => tracing::warn!("non-finite check skipped at step {step}: {e}"),
        }
    }

    /// Checks the armed step; `grads`: the gradients of that step, if still held, to name.
    fn check(
        &mut self,
        grads: Option<&[(String, Tensor)]>,
        p_lr: f64,
        world: usize,
    ) -> Result<(), TrainError> {
        let Some((total, step, epoch, lr)) = self.pending.take() else {
            return Ok(());
        };
        if total.double_value(&[]).is_finite() {
            return Ok(());
        }
        let named_grads: Vec<(String, Tensor)> = grads
            .unwrap_or_default()
            .iter()
            .map(|(n, p)| (format!("the gradient of {n}"), p.grad()))
            .collect();
        let what = first_non_finite(&named_grads).or_else(|| {
            let labelled: Vec<(String, Tensor)> = self
                .watched
                .iter()
                .map(|(n, t)| {
                    let kind = if crate::models::is_buffer(n) {
                        "the batch-norm statistic"
                    } else {
                        "the weight"
                    };
                    (format!("{kind} {n}"), t.shallow_clone())
                })
                .collect();
            first_non_finite(&labelled)
        });
        let (what, value) = what.unwrap_or_else(|| ("a weight".into(), f64::NAN));
        Err(TrainError::Diverged {
            what,
            value,
            epoch,
            step,
            effective_lr: lr,
            lr: p_lr,
            world,
        })
    }
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
    // The names of the momentum buffers rank 0 holds (a checkpoint may hold none: --momentum 0,
    // or fp16 stopped before its first applied step): the other ranks make exactly these, so
    // that everyone enters the same broadcast.
    const MOMENTUM_KEY: &str = "tchrun/resume-momentum";
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
        let momentum_names: Vec<&String> = loaded
            .as_ref()
            .map(|l| l.momentum.keys().collect())
            .unwrap_or_default();
        let names = serde_json::to_string(&momentum_names)
            .map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        ctx.store.set(MOMENTUM_KEY, names.as_bytes())?;
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
        let names: Vec<String> = serde_json::from_slice(&ctx.store.get(MOMENTUM_KEY)?)
            .map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        // Placeholders the broadcast from rank 0 fills: exactly the buffers rank 0 has.
        let mut zeros = BTreeMap::new();
        for name in names {
            let Some((_, p)) = opt.params().iter().find(|(n, _)| *n == name) else {
                return Err(TrainError::Checkpoint(format!(
                    "the checkpoint's momentum buffer '{name}' is not a parameter of this model"
                )));
            };
            zeros.insert(name, p.detach().zeros_like());
        }
        opt.load_state(zeros);
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
            log_skipped(path, why);
        }
        (ctx.say)(&format!(
            "skipped {} bad image(s) (--skip-bad-images); listed in the driver logs",
            skipped.len()
        ));
    }
    let preflight_skipped = skipped.len() as u64;
    let classes = train.classes.len() as i64;
    tch::manual_seed(p.seed);
    if device.is_cuda() {
        tch::Cuda::cudnn_set_benchmark(true);
    }
    let amp = device.is_cuda() && job.options.amp != Amp::Off;
    if amp && job.options.amp == Amp::Bf16 {
        match crate::pg::cuda_bf16_supported(device)? {
            Some(true) => {}
            Some(false) => {
                return Err(TrainError::Invalid(format!(
                    "--amp bf16: this GPU ({device:?}) has no native bfloat16 (compute capability \
                     below 8.0); use --amp fp16 or --amp off"
                )))
            }
            None => tracing::warn!(
                "--amp bf16: this tchrun-worker cannot query the GPU (built without the CUDA \
                 headers); assuming bfloat16 works"
            ),
        }
    }
    if amp {
        crate::pg::set_autocast_dtype(job.options.amp == Amp::Bf16)?;
    }
    let vs = nn::VarStore::new(device);
    let net = models::build(cfg.arch, &vs.root(), classes, cfg.memory_efficient);
    if cfg.zero_init_residual {
        let n = models::zero_init_residual(&vs);
        tracing::info!("--zero-init-residual: {n} residual blocks start as the identity");
    }
    // Initial weights: `model init --weights`, or a trained model directory given to --model
    // (its weights, not a resume). Every rank reads them; the broadcast below agrees anyway.
    let weights_file = job.model.join(tchrun::files::MODEL_WEIGHTS);
    let mut initial_weights = cfg.initial_weights.clone();
    if weights_file.is_file() {
        // A trained model's head knows its own classes: another class list gets a new head.
        let other_classes = cfg.is_trained() && cfg.class_names != train.classes;
        let note = models::load_initial(
            &vs,
            &weights_file,
            tchrun::weights::head_prefix(cfg.arch),
            other_classes,
        )
        .map_err(|e| TrainError::Invalid(format!("--model {e}")))?;
        (ctx.say)(&note);
        if cfg.is_trained() {
            initial_weights = Some(serde_json::json!({
                "file": weights_file.display().to_string(),
                "sha256": tchrun::weights::sha256_file(&weights_file).unwrap_or_default(),
                "trained_model": true,
            }));
        }
    } else {
        tracing::info!("initial weights: random, from --seed {}", p.seed);
    }
    let named: Vec<(String, Tensor)> = models::named(&vs).into_iter().collect();
    let head = tchrun::weights::head_prefix(cfg.arch);
    let frozen = job.options.freeze_backbone;
    let is_fixed = |name: &str| frozen && !name.starts_with(head);
    if frozen {
        let mut n = 0;
        for (name, t) in &named {
            if is_fixed(name) && t.requires_grad() {
                let _ = t.set_requires_grad(false);
                n += 1;
            }
        }
        if initial_weights.is_none() && !weights_file.is_file() {
            tracing::warn!(
                "--freeze-backbone without initial weights: the backbone stays at its random \
                 initialization (give --model a directory made with `model init --weights`)"
            );
        }
        (ctx.say)(&format!(
            "--freeze-backbone: training {} only; {n} backbone parameters and every batch-norm \
             statistic stay as loaded",
            head.trim_end_matches('.')
        ));
    } else if job.options.backbone_lr_scale != 1.0 {
        (ctx.say)(&format!(
            "--backbone-lr-scale {}: everything but {} steps with the LR × {}",
            job.options.backbone_lr_scale,
            head.trim_end_matches('.'),
            job.options.backbone_lr_scale
        ));
    }
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
    let replicas = Replicator::with_fixed(&named, models::is_buffer, is_fixed)
        .with_bucket_caps(first_cap, cap);
    let mut opt = Sgd::new(trainable, job.options.momentum, job.options.weight_decay)
        .with_backbone_lr_scale(|n| n.starts_with(head), job.options.backbone_lr_scale);

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

    (ctx.say)(
        &tchrun::driver_log::TrainingStart {
            arch: cfg.arch.name().to_string(),
            train_images: train.samples.len(),
            valid_images: valid.samples.len(),
            classes: classes as usize,
            world_size: world,
            device: if device.is_cuda() { "cuda" } else { "cpu" }.to_string(),
            steps_per_epoch,
            effective_lr: schedule.peak,
            lr: p.lr,
            bucket_cap_mb: job.options.bucket_cap_mb,
        }
        .write(),
    );

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
    let mut bad_images = BadImages::default();
    // A frozen backbone runs batch norm in inference mode: one image is fine.
    let single_image_poisons_bn = !frozen && cfg.arch.last_feature_size(cfg.input_size) <= 1;
    let mut warned_single = false;
    let mut epoch_skipped = 0u64;
    let mut guard = Guard {
        watched: named
            .iter()
            .filter(|(_, t)| t.kind() == Kind::Float)
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect(),
        pending: None,
    };
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
                skip_bad: job.options.skip_bad_images,
            },
        );
        let (mut loss_sum, mut seen, prior_s) = partial;
        partial = (0.0, 0.0, 0.0);
        let mut t_print = Instant::now();
        let mut seen_print = 0.0f64;
        for (k, batch) in loader.enumerate() {
            let it = skip_batches + k as u64;
            // With --skip-bad-images an image that fails only while decoding is dropped alone:
            // the batch goes on with the others (the reduction is exact for uneven batches).
            let batch = batch.map_err(TrainError::Data)?;
            epoch_skipped += bad_images.note(&batch.skipped);
            let t0 = Instant::now();
            opt.zero_grad()?;
            let mut n_local = batch.len;
            if n_local == 1 && single_image_poisons_bn {
                // One image would give the last batch-norm layer one value per channel: its
                // running variance becomes NaN (torch raises in Python; libtorch does not).
                // The image sits out this step (the others' samples still train).
                if !warned_single {
                    tracing::warn!(
                        "a batch of 1 image on this rank ({} at input size {} ends in a 1x1 feature \
                         map): left out of its step, as batch norm needs more than one value per \
                         channel; said once",
                        cfg.arch.name(),
                        cfg.input_size
                    );
                    warned_single = true;
                }
                n_local = 0;
            }
            let stop_vote = crate::signals::requested() != 0;
            let loss = if n_local > 0 {
                let (x, y) = to_input(&batch, device, !job.options.no_channels_last);
                tch::autocast(amp, || {
                    net.forward_t(&x, !frozen)
                        .to_kind(Kind::Float)
                        .cross_entropy_for_logits(&y)
                })
            } else {
                Tensor::zeros([], (Kind::Float, device))
            };
            // begin_step arms the gradient hooks: buckets are all-reduced while backward runs.
            replicas.begin_step(pg, &loss, n_local, stop_vote)?;
            if n_local > 0 {
                (&loss * scaler.scale).backward();
            }
            let t1 = Instant::now();
            let stats = replicas.end_step(pg)?;
            // The previous step's deferred guard (CUDA): the device has caught up by now.
            guard.check(None, p.lr, world)?;
            let t2 = Instant::now();
            if !stats.loss.is_finite() {
                return Err(TrainError::Diverged {
                    what: "the loss".into(),
                    value: stats.loss,
                    epoch: epoch + 1,
                    step,
                    effective_lr: lr,
                    lr: p.lr,
                    world,
                });
            }
            lr = schedule.lr(step);
            if stats.samples == 0.0 {
                // Every image of every rank's batch was bad: nothing to learn from. Weights,
                // momentum and batch-norm statistics stay as they were (a no-op step).
                tracing::warn!(
                    "step {step}: no images on any rank (all skipped as bad); weights unchanged"
                );
            } else if scaler.unscale_and_check(opt.params())? {
                opt.step(lr);
                if step == 0 {
                    tracing::info!("first optimizer step done");
                }
                guard.arm(step, epoch + 1, lr);
                if !device.is_cuda() {
                    // On CPU reading the verdict now costs nothing, and the gradients that
                    // made it are still here to be named.
                    let grads = (!scaler.enabled).then_some(opt.params());
                    guard.check(grads, p.lr, world)?;
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
                let line = tchrun::driver_log::Progress {
                    epoch: epoch + 1,
                    epochs: p.epochs,
                    iter: it + 1,
                    iters: steps_per_epoch,
                    loss: stats.loss,
                    lr,
                    images_per_s: ips,
                    eta,
                }
                .write();
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
        guard.check(None, p.lr, world)?;
        let train_time = prior_s + t_epoch.elapsed().as_secs_f64();
        let v = validate(
            net.as_ref(),
            &valid,
            &cfg,
            job,
            ctx,
            &mut bad_images,
            // Images the pre-flight left out count in every epoch (once: rank 0 adds them).
            epoch_skipped + if rank == 0 { preflight_skipped } else { 0 },
        )?;
        epoch_skipped = 0;
        if v.skipped > preflight_skipped {
            (ctx.say)(&format!(
                "epoch {}: {} image(s) failed to decode and were skipped (--skip-bad-images); named in the driver logs",
                epoch + 1,
                v.skipped - preflight_skipped
            ));
        }
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
            skipped_images: v.skipped,
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

    if let Some(name) = replicas.first_difference(pg)? {
        return Err(TrainError::Replicas(name));
    }
    let (sum, sumsq) = replicas.fingerprint();
    tracing::info!(
        "parameters identical across ranks; fingerprint sum={sum:.9e} sumsq={sumsq:.9e}"
    );
    tracing::info!(
        "{}",
        tchrun::driver_log::RankSummary {
            images,
            compute_s,
            communication_s: comm_s,
        }
        .write()
    );
    if bad_images.distinct() > 0 {
        tracing::warn!(
            "{} image(s) failed to decode on this rank and were skipped (--skip-bad-images)",
            bad_images.distinct()
        );
    }

    let (Some((_, best_epoch)), Some(weights)) = (stopping.best, best_weights) else {
        return Err(TrainError::Invalid(
            "no epoch completed with a finite validation loss".into(),
        ));
    };
    if rank == 0 {
        let best_metrics = history.get(best_epoch as usize - 1).cloned();
        let trained = ModelConfig {
            class_names: train.classes.clone(),
            training: Some(TrainingRecord {
                epochs: p.epochs,
                epochs_run: history.len(),
                best_epoch,
                batch_size: p.batch_size,
                warmup_epochs: p.warmup_epochs,
                lr: p.lr,
                effective_lr: schedule.peak,
                world_size: world,
                seed: p.seed,
                patience: p.patience,
                momentum: job.options.momentum,
                weight_decay: job.options.weight_decay,
                lr_power: job.options.lr_power,
                steps: step,
                train_images: train.samples.len(),
                valid_images: valid.samples.len(),
                freeze_backbone: frozen,
                backbone_lr_scale: job.options.backbone_lr_scale,
            }),
            metrics: best_metrics
                .as_ref()
                .map(|m| serde_json::to_value(m).unwrap_or_default()),
            initial_weights: initial_weights.clone(),
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
        // torch's GradScaler: one fused unscale-and-check, one read on the host (not a
        // synchronization per parameter).
        let finite = !crate::pg::amp_unscale(&grads, 1.0 / self.scale)?;
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
