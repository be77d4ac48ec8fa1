//! `tchrun-worker train`: data-parallel training of an image classifier ("Train PyTorch
//! Model"): inputs checked, model replicated from rank 0, sharded epochs through the threaded
//! loader, bucketed gradient all-reduce, warmup + polynomial LR, validation reduced exactly,
//! early stopping on validation loss, NaN stops every rank together, rank 0 writes the model.
mod board;
mod resume;
pub(crate) mod step;
mod validate;

use crate::checkpoint;
use crate::ddp::Replicator;
use crate::models;
use crate::optim::Sgd;
use crate::outputs;
use crate::pg::{C10dError, ProcessGroup};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tch::{nn, Device, Kind, Tensor};
use tchrun::data::{self, Augment, DatasetError, GlobalCut, LoaderConfig, TrainAugment};
use tchrun::exit::ErrorKind;
use tchrun::flags::{Amp, TrainJob};
use tchrun::metrics::{EpochMetrics, SCHEMA_VERSION};
use tchrun::model::{ModelConfig, TrainingRecord};
use tchrun::schedule::{Decision, EarlyStopping, LrSchedule};

use board::Board;
use resume::{fresh, load_resume, Resume, Start};
use step::{accumulate_micro_batch, train_step, Guard, LossScaler, StepModel, Update};
use validate::{log_skipped, validate, BadImages};

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
         effective LR was {effective_lr:e} (--lr {lr:e} × {scaled_by})"
    )]
    Diverged {
        /// What went non-finite: "the loss", "the gradient of fc.weight", ...
        what: String,
        value: f64,
        epoch: u32,
        step: u64,
        effective_lr: f64,
        lr: f64,
        /// What scaled --lr: "world size 2", or the factor and its reason.
        scaled_by: String,
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
            // A hand-started rank's archive extraction interrupted (the partial folder removed).
            TrainError::Preflight(tchrun::preflight::PreflightError::Dataset {
                error: DatasetError::Interrupted { signal, .. },
                ..
            }) => {
                if tchrun::interrupt::exit_code(*signal) == tchrun::exit::code::INTERRUPTED_INT {
                    ErrorKind::InterruptedInt
                } else {
                    ErrorKind::InterruptedTerm
                }
            }
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

/// Model directory, image directories, output: before any step. `indexes`: the launcher's
/// copies of the train and valid dataset indexes, used (instead of listing the folders) when
/// they describe this rank's copy of the data. Also returns lines for the driver log saying
/// where the file lists came from and what happens to the image headers.
/// `on_decode`: the launcher left the headers to be checked on decode (a large set).
pub fn check_inputs(
    job: &TrainJob,
    indexes: [Option<&std::path::Path>; 2],
    on_decode: bool,
) -> Result<(Inputs, Vec<String>), TrainError> {
    use tchrun::preflight::{check_train_job_with, Verification};
    let [train, valid] = indexes;
    let v = Verification::Rank {
        train,
        valid,
        on_decode,
    };
    let checked = check_train_job_with(job, v)?;
    Ok((checked.inputs, checked.notes))
}

/// What the training loop needs from the rank.
pub struct RankCtx<'a> {
    pub pg: &'a ProcessGroup,
    pub store: &'a crate::pg::Store,
    pub device: Device,
    pub local_size: usize,
    pub say: &'a dyn Fn(&str),
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

/// A per-rank time split reduced over the group: mean and largest of each value.
struct Split {
    mean: [f64; 4],
    max: [f64; 4],
}

/// One sum and one max all-reduce of four numbers (data wait, compute, communication, loop
/// time) at the end of an epoch; every rank calls it at the same point.
fn time_split(pg: &ProcessGroup, values: [f64; 4]) -> Result<Split, TrainError> {
    let mut sum = Tensor::from_slice(&values).to_device(pg.device());
    pg.all_reduce(&mut [&mut sum], crate::pg::ReduceOp::Sum)?;
    let mut max = Tensor::from_slice(&values).to_device(pg.device());
    pg.all_reduce(&mut [&mut max], crate::pg::ReduceOp::Max)?;
    let read = |t: &Tensor| -> Result<[f64; 4], TrainError> {
        let v = Vec::<f64>::try_from(t.to_device(Device::Cpu))?;
        let mut out = [0.0; 4];
        for (o, x) in out.iter_mut().zip(v) {
            *o = x;
        }
        Ok(out)
    };
    let n = pg.size().max(1) as f64;
    Ok(Split {
        mean: read(&sum)?.map(|x| x / n),
        max: read(&max)?,
    })
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
    // Test hook (`TCHRUN_TEST_KILL_AT_STEP`): this rank dies before that step, first attempt only.
    let kill_at = tchrun::env::test_kill_at_step(&|k| std::env::var(k).ok())
        .map_err(|e| TrainError::Invalid(e.to_string()))?
        .and_then(|(r, k)| (r == rank).then_some(k));
    // Test hook (`TCHRUN_TEST_KILL_ON_HOST`): a rank on that host dies after that many steps of
    // every attempt.
    let kill_after = tchrun::env::test_kill_on_host(&|k| std::env::var(k).ok())
        .map_err(|e| TrainError::Invalid(e.to_string()))?
        .and_then(|(h, n)| {
            let here = hostname::get().map(|s| s.to_string_lossy().into_owned());
            here.is_ok_and(|here| here == h).then_some(n)
        });
    // Test hook (`TCHRUN_TEST_TORCH_PANIC`): a real libtorch exception, which tch turns into a
    // panic, on that rank.
    if std::env::var(tchrun::env::TCHRUN_TEST_TORCH_PANIC)
        .ok()
        .as_deref()
        == Some(rank.to_string().as_str())
    {
        let _ = Tensor::ones([64], (Kind::Float, Device::Cpu))
            + Tensor::ones([3], (Kind::Float, Device::Cpu));
    }
    // Rank 0's checkpoints are written in the background (the test hook may slow them down).
    let mut writer = checkpoint::Writer::new(
        tchrun::env::test_checkpoint_delay(&|k| std::env::var(k).ok())
            .map_err(|e| TrainError::Invalid(e.to_string()))?,
    );
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
        // Only rank 0 writes model.json: the others need not read the file again to hash it.
        if cfg.is_trained() && rank == 0 {
            initial_weights = Some(tchrun::model::InitialWeights::from_trained_model(
                weights_file.display().to_string(),
                tchrun::weights::sha256_file(&weights_file).unwrap_or_default(),
            ));
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

    // --global-batch-size: each rank's micro-batches per optimizer step, and the epoch's cut.
    let cut = match job.options.global_batch_size {
        Some(g) => Some(GlobalCut {
            rank,
            world,
            batch: p.batch_size as usize,
            accumulation: tchrun::schedule::accumulation_steps(g, p.batch_size, world)
                .map_err(TrainError::Invalid)? as usize,
        }),
        None => None,
    };
    let micro_batches = cut.map(|c| c.accumulation).unwrap_or(1);
    let steps_per_epoch = match cut {
        Some(c) => c.steps(train.samples.len()) as u64,
        None => {
            let per_rank = data::shard(train.samples.len(), rank, world, p.seed, 0, true).len();
            per_rank.div_ceil(p.batch_size as usize) as u64
        }
    };
    // The LR follows the batch of one optimizer step: k = world size, or G / --batch-size.
    let scaling = job.options.lr_scaling;
    let k = cut.map(|c| c.global_batch() / c.batch).unwrap_or(world);
    let (factor, factor_text) = tchrun::schedule::lr_factor(scaling, k);
    let lr_why = match (cut, scaling) {
        (None, tchrun::flags::LrScaling::Linear) => format!("world size {world}"),
        (None, s) => format!(
            "{factor_text} (--lr-scaling {}, world size {world})",
            s.as_str()
        ),
        (Some(c), s) => format!(
            "{factor_text} (--lr-scaling {}, --global-batch-size {} / --batch-size {} = {k})",
            s.as_str(),
            c.global_batch(),
            c.batch
        ),
    };
    let schedule = LrSchedule::with_peak(
        p.lr * factor,
        p.warmup_epochs,
        p.epochs,
        steps_per_epoch,
        job.options.lr_power,
    );

    // Resume (rank 0 decides and reads; everyone receives), then replicate from rank 0.
    let mut best_weights: Option<BTreeMap<String, Tensor>> = None;
    let mut state = fresh(p.patience);
    let mut resumed = false;
    let start = load_resume(
        job,
        ctx,
        &cfg,
        &train.classes,
        &named,
        &mut opt,
        &mut best_weights,
    )?;
    if let Start::Complete = start {
        (ctx.say)(&format!(
            "training already complete in {} (nothing to resume); to train longer, pass a larger \
             --epochs with --resume",
            job.output.display()
        ));
        // Rank 0 serves the store: no rank leaves before all have read the decision.
        pg.barrier()?;
        return Ok(());
    }
    if let Start::Resume(meta) = start {
        let same_world = match job.options.global_batch_size {
            Some(g) => meta.global_batch_size == Some(g),
            None => meta.world_size == world && meta.global_batch_size.is_none(),
        };
        resumed = true;
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
        if same_world && meta.world_size != world {
            msg.push_str(&format!(
                "; world size {} (checkpoint: {}): the same --global-batch-size {}, so the same \
                 steps from the same samples",
                world,
                meta.world_size,
                job.options.global_batch_size.unwrap_or_default()
            ));
        } else if !same_world {
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
    // Rank 0's TensorBoard events; a resume keeps those up to the checkpoint's step.
    let mut board = if rank == 0 {
        Board::open(&job.output, resumed.then_some(state.step), ctx.say)
    } else {
        Board::off()
    };
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
            lr_factor: factor_text.clone(),
            bucket_cap_mb: job.options.bucket_cap_mb,
        }
        .write(),
    );
    if let Some(c) = cut {
        (ctx.say)(&format!(
            "global batch {} images per optimizer step = {world} rank(s) × {} accumulation \
             step(s) × --batch-size {}; effective LR {:e} = --lr {:e} × {lr_why}",
            c.global_batch(),
            c.accumulation,
            c.batch,
            schedule.peak,
            p.lr
        ));
    } else if scaling != tchrun::flags::LrScaling::Linear {
        (ctx.say)(&format!(
            "effective LR {:e} = --lr {:e} × {lr_why}",
            schedule.peak, p.lr
        ));
    }

    let threads = loader_threads(job, ctx.local_size);
    let mut step = state.step;
    let mut stopping = state.stopping;
    let mut history = state.history;
    let mut scaler = LossScaler::new(job.options.amp == Amp::Fp16 && device.is_cuda());
    if let Some(s) = state.loss_scale.filter(|_| scaler.enabled) {
        scaler.scale = s;
    }
    let (mut compute_s, mut comm_s, mut images) = (0.0f64, 0.0f64, 0.0f64);
    let run_record = checkpoint::RunRecord::of(job, &cfg, &train.classes);
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
        global_batch_size: job.options.global_batch_size,
        tensors: String::new(),
        best_tensors: None,
        run: Some(run_record.clone()),
        written: None,
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
        // This epoch's time split on this rank: waiting for the loader, compute, communication.
        let (mut wait_e, mut compute_e, mut comm_e) = (0.0f64, 0.0f64, 0.0f64);
        let mut indices = match cut {
            Some(c) => c.indices(train.samples.len(), p.seed, epoch as u64),
            None => data::shard(train.samples.len(), rank, world, p.seed, epoch as u64, true),
        };
        let first_position =
            (skip_batches as usize * micro_batches * p.batch_size as usize).min(indices.len());
        indices.drain(..first_position);
        let mut loader = data::load_batches(
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
                max_pixels: job.options.max_image_pixels,
                global: cut,
            },
        );
        let (mut loss_sum, mut seen, prior_s) = partial;
        partial = (0.0, 0.0, 0.0);
        let mut t_print = Instant::now();
        let mut seen_print = 0.0f64;
        let mut k = 0u64;
        // --global-batch-size: the micro-batch of the step (0..micro_batches), the step's
        // earlier micro-batches, and their compute time.
        let mut micro = 0usize;
        let mut acc = None;
        let mut micro_compute = 0.0f64;
        loop {
            // The time until the next batch is there: the loader's share of the step.
            let t_wait = Instant::now();
            let next = loader.next();
            wait_e += t_wait.elapsed().as_secs_f64();
            let Some(batch) = next else {
                if micro != 0 {
                    return Err(TrainError::Invalid(format!(
                        "epoch {} ended after micro-batch {micro} of {micro_batches} of a step",
                        epoch + 1
                    )));
                }
                break;
            };
            // With --skip-bad-images an image that fails only while decoding is dropped alone:
            // the batch goes on with the others (the reduction is exact for uneven batches).
            let batch = batch.map_err(TrainError::Data)?;
            epoch_skipped += bad_images.note(&batch.skipped);
            if micro == 0 {
                if kill_at == Some(step) {
                    tracing::warn!(
                        "{}: SIGKILL at step {step}",
                        tchrun::env::TCHRUN_TEST_KILL_AT_STEP
                    );
                    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
                }
                if kill_after.is_some_and(|n| step == run_first_step + n) {
                    tracing::warn!(
                        "{}: SIGKILL at step {step}, {} step(s) into this attempt",
                        tchrun::env::TCHRUN_TEST_KILL_ON_HOST,
                        step - run_first_step
                    );
                    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
                }
                let t = Instant::now();
                opt.zero_grad()?;
                micro_compute = t.elapsed().as_secs_f64();
                acc = cut.map(|_| replicas.start_accumulation(micro_batches, world));
            }
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
            let input =
                (n_local > 0).then(|| to_input(&batch, device, !job.options.no_channels_last));
            let model = StepModel {
                net: net.as_ref(),
                train: !frozen,
                amp,
                device,
            };
            if micro + 1 < micro_batches {
                // Not the step's last micro-batch: forward and backward, no communication.
                let t = Instant::now();
                if let Some(a) = acc.as_mut() {
                    accumulate_micro_batch(
                        &model,
                        input.as_ref().map(|(x, y)| (x, y)),
                        &replicas,
                        a,
                        scaler.scale,
                    )?;
                }
                micro_compute += t.elapsed().as_secs_f64();
                images += n_local as f64;
                micro += 1;
                continue;
            }
            micro = 0;
            let it = skip_batches + k;
            k += 1;
            let t0 = Instant::now();
            let stop_vote = crate::signals::requested() != 0;
            // The LR of this step's update; a non-finite loss names the previous one.
            let next_lr = schedule.lr(step);
            let done = train_step(
                &model,
                input.as_ref().map(|(x, y)| (x, y)),
                stop_vote,
                Some((pg, &replicas)),
                Some(Update {
                    opt: &mut opt,
                    scaler: &mut scaler,
                    lr: next_lr,
                }),
                acc.take(),
                |stats| {
                    // The previous step's deferred guard (CUDA): the device has caught up by now.
                    guard.check(None, p.lr, &lr_why)?;
                    if !stats.loss.is_finite() {
                        return Err(TrainError::Diverged {
                            what: "the loss".into(),
                            value: stats.loss,
                            epoch: epoch + 1,
                            step,
                            effective_lr: lr,
                            lr: p.lr,
                            scaled_by: lr_why.clone(),
                        });
                    }
                    Ok(())
                },
            )?;
            let (t1, t2) = (done.backward_done, done.reduced);
            let stats = done
                .stats
                .ok_or_else(|| TrainError::Invalid("a step without its reduction".into()))?;
            lr = next_lr;
            if stats.samples == 0.0 {
                // Every image of every rank's batch was bad: nothing to learn from. Weights,
                // momentum and batch-norm statistics stay as they were (a no-op step).
                tracing::warn!(
                    "step {step}: no images on any rank (all skipped as bad); weights unchanged"
                );
            } else if done.updated {
                if step == 0 {
                    tracing::info!("first optimizer step done");
                }
                guard.arm(step, epoch + 1, lr);
                if !device.is_cuda() {
                    // On CPU reading the verdict now costs nothing, and the gradients that
                    // made it are still here to be named.
                    let grads = (!scaler.enabled).then_some(opt.params());
                    guard.check(grads, p.lr, &lr_why)?;
                }
            }
            let t3 = Instant::now();
            // Communication: the all-reduce time backward did not hide.
            comm_e += (t2 - t1).as_secs_f64();
            compute_e += micro_compute + (t1 - t0).as_secs_f64() + (t3 - t2).as_secs_f64();
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
                board.step(rank == 0, step, stats.loss, lr, ips, ctx.say);
                t_print = Instant::now();
                seen_print = 0.0;
            }
            // The state after this step, mid-epoch (a stop's checkpoint, or `--checkpoint-every`'s).
            let mid_epoch = || {
                checkpoint_meta(
                    epoch,
                    it + 1,
                    step,
                    &stopping,
                    &history,
                    (loss_sum, seen, prior_s + t_epoch.elapsed().as_secs_f64()),
                    scaler.scale,
                    false,
                )
            };
            // A background checkpoint write that failed ends the job now, in words (a full
            // disk), not when the next checkpoint is due.
            if rank == 0 {
                writer.poll().map_err(TrainError::Checkpoint)?;
            }
            let every = job.options.checkpoint_every;
            if rank == 0
                && every > 0
                && step % every == 0
                && it + 1 < steps_per_epoch
                && !stats.stop
            {
                // `--checkpoint-every`: in the background, resumable exactly like a stop's.
                writer
                    .save(&job.output, &mid_epoch(), &named, opt.state(), None)
                    .map_err(TrainError::Checkpoint)?;
            }
            if stats.stop {
                // Every rank saw the vote in this step's reduction: stop together.
                let sig = crate::signals::requested();
                if rank == 0 {
                    let meta = mid_epoch();
                    // The stop checkpoint is written now (the ranks wait at the barrier):
                    // after the one in flight, so the newest state lands last.
                    writer.wait().map_err(TrainError::Checkpoint)?;
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
        let loop_s = t_epoch.elapsed().as_secs_f64();
        comm_s += comm_e;
        compute_s += compute_e;
        let split = time_split(pg, [wait_e, compute_e, comm_e, loop_s])?;
        skip_batches = 0;
        guard.check(None, p.lr, &lr_why)?;
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
            step_time_s: split.mean[3],
            data_wait_s: split.mean[0],
            compute_s: split.mean[1],
            comm_s: split.mean[2],
            data_wait_max_s: split.max[0],
            compute_max_s: split.max[1],
            comm_max_s: split.max[2],
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
        // Only rank 0 writes the model, so only it keeps the best weights (a resumed run's
        // best epoch may come from before the stop: rank 0 read its weights from the checkpoint).
        if decision == Decision::Improved && rank == 0 {
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
            writer
                .save(&job.output, &meta, &named, opt.state(), best)
                .map_err(TrainError::Checkpoint)?;
            outputs::append_metrics(&job.output, &m).map_err(TrainError::Output)?;
            board.epoch(step, &m, ctx.say);
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
    // A stop request from here on waits for the model: the training steps are done, and what
    // is left (the replica check, rank 0's writes) is bounded. Exiting now would lose the run.

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

    let Some((_, best_epoch)) = stopping.best else {
        return Err(TrainError::Invalid(
            "no epoch completed with a finite validation loss".into(),
        ));
    };
    // The last collective: after it rank 0 alone finishes its checkpoint write and the model
    // directory, and no other rank waits on its storage (or times out doing so).
    pg.barrier()?;
    if rank == 0 {
        writer.wait().map_err(TrainError::Checkpoint)?;
        let weights = best_weights.ok_or_else(|| {
            TrainError::Checkpoint(format!(
                "the best epoch is {best_epoch} but its weights were not kept (the checkpoint \
                 in {} lacks them)",
                checkpoint::dir(&job.output).display()
            ))
        })?;
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
                global_batch_size: job.options.global_batch_size,
                lr_scaling: scaling.as_str().into(),
            }),
            metrics: best_metrics
                .as_ref()
                .map(|m| serde_json::to_value(m).unwrap_or_default()),
            initial_weights: initial_weights.clone(),
            ..cfg.clone()
        };
        let state_dict = models::state_dict(&weights, step as i64);
        if let Some(v) = tchrun::metrics::verdict(&history) {
            tracing::info!("time split of the training steps: {}", v.line());
        }
        outputs::write_model_dir(
            &job.output,
            &trained,
            &state_dict,
            &history,
            &board.losses,
            steps_per_epoch,
        )
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
    let sig = crate::signals::requested();
    if sig != 0 {
        tracing::warn!(
            "the stop request ({}) came after the last training step: the model was finished first",
            crate::signals::name(sig)
        );
    }
    Ok(())
}
