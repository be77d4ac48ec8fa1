//! Building a `Trainer` before the first step: the fault plan, AMP, the model and its initial
//! weights, freezing and layout, the optimizer and replicas, the plan of steps and LR
//! (`--global-batch-size`, `--lr-scaling`), the resume decision and the replication from
//! rank 0, and the start line of the driver log.
use super::board::Board;
use super::resume::{fresh, load_resume, Resume, Start};
use super::scaler::LossScaler;
use super::state::{Plan, State};
use super::step::Guard;
use super::trainer::Trainer;
use super::validate::{log_skipped, BadImages};
use super::{loader_threads, Inputs, RankCtx, TrainError};
use crate::comm::ddp::Replicator;
use crate::models;
use crate::train::checkpoint;
use crate::train::optim::Optimizer;
use crate::train::outputs;
use std::time::Instant;
use tch::{nn, Device, Kind, Tensor};
use tchrun::flags::{Amp, LrScaling, TrainJob};
use tchrun::model::ModelConfig;
use tchrun::schedule::{EarlyStopping, LrSchedule};
use tchrun_data::{self as data, GlobalCut};
use tchrun_faults::FaultPlan;

/// The model built: its variables, the network, the initial weights `model.json` records.
struct Built {
    vs: nn::VarStore,
    net: Box<dyn nn::ModuleT>,
    initial_weights: Option<tchrun::model::InitialWeights>,
    /// The model directory holds weights (`model init --weights`, or a trained model).
    has_weights_file: bool,
}

impl<'a> Trainer<'a> {
    /// Everything before the first step. `None`: a `--resume` of a finished run (said; every
    /// rank has read the decision).
    pub(super) fn setup(
        job: &'a TrainJob,
        inputs: Inputs,
        ctx: &'a RankCtx<'a>,
    ) -> Result<Option<Trainer<'a>>, TrainError> {
        let Inputs {
            cfg,
            train,
            valid,
            skipped,
        } = inputs;
        let (pg, device) = (ctx.pg, ctx.device);
        let (rank, world) = (pg.rank(), pg.size());
        let p = &job.params;
        let host = hostname::get()
            .ok()
            .map(|h| h.to_string_lossy().into_owned());
        let faults = FaultPlan::read(&|k| std::env::var(k).ok(), rank, host.as_deref())
            .map_err(|e| TrainError::Invalid(e.to_string()))?;
        if faults.torch_panic {
            // `TCHRUN_TEST_TORCH_PANIC`: a real libtorch exception, which tch turns into a panic.
            let _ = Tensor::ones([64], (Kind::Float, Device::Cpu))
                + Tensor::ones([3], (Kind::Float, Device::Cpu));
        }
        // Rank 0's checkpoints are written in the background (the test hook may slow them down).
        let writer = checkpoint::Writer::new(faults.checkpoint_delay);
        say_skipped(&skipped, ctx);
        tch::manual_seed(p.seed);
        if device.is_cuda() {
            tch::Cuda::cudnn_set_benchmark(true);
        }
        let amp = set_up_amp(job, device)?;
        let built = build_model(job, &cfg, &train.classes, ctx)?;
        let frozen = job.options.freeze_backbone;
        let head = tchrun::weights::head_prefix(cfg.arch);
        let is_fixed = |name: &str| frozen && !name.starts_with(head);
        let named: Vec<(String, Tensor)> = models::named(&built.vs).into_iter().collect();
        freeze_and_lay_out(job, &named, &is_fixed, &built, head, ctx, &cfg);
        let trainable: Vec<(String, Tensor)> = named
            .iter()
            .filter(|(n, t)| !models::is_buffer(n) && t.requires_grad())
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        let (first_cap, cap) = job.options.bucket_caps();
        let replicas = Replicator::with_fixed(&named, models::is_buffer, is_fixed)
            .with_bucket_caps(first_cap, cap);
        let mut opt = Optimizer::of_job(job, &named, trainable, head);
        let plan = plan_steps(job, rank, world, train.samples.len())?;
        let (run_record, class_weights) = record_and_class_weights(job, &cfg, &train, device)?;

        // Resume (rank 0 decides and reads; everyone receives), then replicate from rank 0.
        let (mut best_weights, mut ema) = (None, None);
        let start = load_resume(
            job,
            ctx,
            &cfg,
            &train.classes,
            &named,
            &mut opt,
            &mut best_weights,
            &mut ema,
        )?;
        let (resume, resumed) = match start {
            Start::Complete => {
                (ctx.say)(&format!(
                    "training already complete in {} (nothing to resume); to train longer, pass \
                     a larger --epochs with --resume",
                    job.output.display()
                ));
                // Rank 0 serves the store: no rank leaves before all have read the decision.
                pg.barrier()?;
                return Ok(None);
            }
            Start::Fresh => (fresh(p.patience), false),
            Start::Resume(meta) => (resumed_state(job, ctx, &meta, &plan)?, true),
        };
        // Rank 0's TensorBoard events; a resume keeps those up to the checkpoint's step.
        let board = if rank == 0 {
            Board::open(&job.output, resumed.then_some(resume.step), ctx.say)
        } else {
            Board::off()
        };
        replicas.broadcast_all(pg)?;
        super::resume::broadcast_optimizer_state(pg, &mut opt)?;
        let ema = super::ema::Ema::start(job, ctx, &cfg, train.classes.len(), &named, ema)?;
        say_start(job, ctx, &cfg, &train, &valid, &plan);
        let fp16 = job.options.amp == Amp::Fp16 && device.is_cuda();
        let scaler = LossScaler::of_run(device, fp16, faults.loss_scale, resume.loss_scaler);
        let window = super::window::StepWindow::new(device, scaler.enabled());
        let guard = Guard::watching(&named);
        let live = start_live(job, ctx, &plan, &resume);
        let s = State {
            epoch: resume.epoch,
            skip_batches: resume.batches_done,
            partial: resume.partial,
            step: resume.step,
            stopping: resume.stopping,
            history: resume.history,
            best_weights,
            lr: plan.schedule.lr(resume.step),
            run_start: Instant::now(),
            run_first_step: resume.step,
            compute_s: 0.0,
            comm_s: 0.0,
            images: 0.0,
            bad_images: BadImages::default(),
            warned_single: false,
            epoch_skipped: 0,
        };
        Ok(Some(Trainer {
            job,
            ctx,
            run_record,
            class_weights,
            threads: loader_threads(job, ctx.local_size),
            preflight_skipped: skipped.len() as u64,
            single_image_poisons_bn: single_image_poisons_bn(job, &cfg, frozen),
            channels_last: super::layout(job, ctx.device, &cfg).channels_last,
            cfg,
            train,
            valid,
            rank,
            world,
            device,
            amp,
            frozen,
            _vs: built.vs,
            net: built.net,
            named,
            replicas,
            opt,
            plan,
            initial_weights: built.initial_weights,
            faults,
            writer,
            board,
            scaler,
            guard,
            window,
            live,
            ema,
            s,
        }))
    }
}

/// The live view (`live.rs`), with the job's status as training starts from `resume`.
fn start_live(job: &TrainJob, ctx: &RankCtx, plan: &Plan, resume: &Resume) -> super::live::Live {
    let first = first_status(job, ctx.pg.size(), plan, resume);
    let textfile = job
        .options
        .prometheus_textfile
        .as_ref()
        .map(|dir| tchrun_prometheus::Textfile::new(dir, &job.output));
    super::live::Live::start(ctx, first, &job.output, textfile)
}

fn first_status(
    job: &TrainJob,
    world: usize,
    plan: &Plan,
    resume: &Resume,
) -> tchrun::job_record::JobStatus {
    let (epoch, step, done) = (resume.epoch, resume.step, resume.batches_done);
    let attempt = std::env::var(tchrun::env::TCHRUN_ATTEMPT)
        .ok()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let mut s = tchrun::job_record::JobStatus::starting(attempt, world);
    s.started = Some(tchrun::files::timestamp_now());
    s.epochs = job.params.epochs;
    s.epoch = epoch + 1;
    s.step = step;
    s.total_steps = plan.schedule.total_steps;
    s.steps_per_epoch = plan.steps_per_epoch;
    s.epoch_step = done;
    s
}

/// Images the pre-flight skipped (`--skip-bad-images`): each in the driver log, a count on
/// the console.
fn say_skipped(skipped: &[(std::path::PathBuf, String)], ctx: &RankCtx) {
    if skipped.is_empty() {
        return;
    }
    tracing::warn!(
        count = skipped.len(),
        "skipping bad images (--skip-bad-images)"
    );
    for (path, why) in skipped {
        log_skipped(path, why);
    }
    (ctx.say)(&format!(
        "skipped {} bad image(s) (--skip-bad-images); listed in the driver logs",
        skipped.len()
    ));
}

/// `--amp` on CUDA: bf16 refused on a GPU without it; the autocast dtype set. True when on.
fn set_up_amp(job: &TrainJob, device: Device) -> Result<bool, TrainError> {
    let amp = device.is_cuda() && job.options.amp != Amp::Off;
    if amp && job.options.amp == Amp::Bf16 {
        match crate::comm::pg::cuda_bf16_supported(device)? {
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
        crate::comm::pg::set_autocast_dtype(job.options.amp == Amp::Bf16)?;
    }
    Ok(amp)
}

/// The architecture built on the rank's device, and its initial weights: `model init
/// --weights`, or a trained model directory given to --model (its weights, not a resume).
/// Every rank reads them; the broadcast from rank 0 agrees anyway.
fn build_model(
    job: &TrainJob,
    cfg: &ModelConfig,
    classes: &[String],
    ctx: &RankCtx,
) -> Result<Built, TrainError> {
    let vs = nn::VarStore::new(ctx.device);
    let net = models::build(
        cfg.arch,
        &vs.root(),
        classes.len() as i64,
        cfg.input_size.into(),
        cfg.memory_efficient,
    );
    if cfg.zero_init_residual {
        let n = models::zero_init_residual(&vs);
        tracing::info!("--zero-init-residual: {n} residual blocks start as the identity");
    }
    let weights_file = job.model.join(tchrun::files::MODEL_WEIGHTS);
    let mut initial_weights = cfg.initial_weights.clone();
    let has_weights_file = weights_file.is_file();
    if has_weights_file {
        // A trained model's head knows its own classes: another class list gets a new head.
        let other_classes = cfg.is_trained() && cfg.class_names != classes;
        let note = models::load_initial(
            &vs,
            &weights_file,
            tchrun::weights::head_prefix(cfg.arch),
            other_classes,
        )
        .map_err(|e| TrainError::Invalid(format!("--model {e}")))?;
        (ctx.say)(&note);
        // Only rank 0 writes model.json: the others need not read the file again to hash it.
        if cfg.is_trained() && ctx.pg.rank() == 0 {
            initial_weights = Some(tchrun::model::InitialWeights::from_trained_model(
                weights_file.display().to_string(),
                tchrun::weights::sha256_file(&weights_file).unwrap_or_default(),
            ));
        }
    } else {
        tracing::info!("initial weights: random, from --seed {}", job.params.seed);
    }
    Ok(Built {
        vs,
        net,
        initial_weights,
        has_weights_file,
    })
}

/// `--freeze-backbone` (everything but the head fixed), `--backbone-lr-scale` said, and the
/// channels-last layout of the convolution weights.
fn freeze_and_lay_out(
    job: &TrainJob,
    named: &[(String, Tensor)],
    is_fixed: &dyn Fn(&str) -> bool,
    built: &Built,
    head: &str,
    ctx: &RankCtx,
    cfg: &ModelConfig,
) {
    if job.options.freeze_backbone {
        let mut n = 0;
        for (name, t) in named {
            if is_fixed(name) && t.requires_grad() {
                let _ = t.set_requires_grad(false);
                n += 1;
            }
        }
        if built.initial_weights.is_none() && !built.has_weights_file {
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
    let layout = super::layout(job, ctx.device, cfg);
    if layout.channels_last {
        let n = models::to_channels_last(named);
        tracing::info!(
            "memory format: {} for {n} convolution weight(s) and the input batches",
            layout.describe()
        );
    } else {
        tracing::info!("memory format: {}", layout.describe());
    }
}

/// The run record, and `--class-weights` resolved for the training set (per class in label
/// order, recorded) as the loss's `weight` tensor on `device`.
fn record_and_class_weights(
    job: &TrainJob,
    cfg: &ModelConfig,
    train: &data::ImageFolder,
    device: Device,
) -> Result<(tchrun::checkpoint::RunRecord, Option<Tensor>), TrainError> {
    let weights = (job.options.class_weights)
        .resolve(&train.classes, train.samples.iter().map(|s| s.label))
        .map_err(TrainError::Invalid)?;
    let mut record = super::resume::run_record(job, cfg, &train.classes);
    record.class_weights.class_weight_values = weights.clone();
    let tensor = weights.map(|w| {
        let w: Vec<f32> = w.iter().map(|&x| x as f32).collect();
        Tensor::from_slice(&w).to_device(device)
    });
    Ok((record, tensor))
}

/// Whether one image in a batch would give batch norm one value per channel at the training
/// crop (a frozen backbone runs batch norm in inference mode: one image is fine).
fn single_image_poisons_bn(job: &TrainJob, cfg: &ModelConfig, frozen: bool) -> bool {
    let train = job.options.augment.crops(cfg.input_size).train;
    !frozen && cfg.arch.has_batch_norm() && cfg.arch.last_feature_size(train) <= 1
}

/// The steps and LR of the run: `--global-batch-size`'s cut and accumulation, steps per
/// epoch, and the LR scaled for the batch of one optimizer step (k = world size, or
/// G / `--batch-size`).
fn plan_steps(
    job: &TrainJob,
    rank: usize,
    world: usize,
    train_images: usize,
) -> Result<Plan, TrainError> {
    let p = &job.params;
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
    // `--ra-sampler` cuts an epoch to its own length (`Sampling::epoch_len`).
    let positions = data::Sampling::of(&job.options.recipe).epoch_len(train_images);
    let steps_per_epoch = match cut {
        Some(c) => c.steps(positions) as u64,
        None => positions.div_ceil(world).div_ceil(p.batch_size as usize) as u64,
    };
    let scaling = job.options.lr_scaling;
    let reference = tchrun::schedule::lr_reference_batch(
        p.batch_size,
        job.options.global_batch_size,
        job.options.lr_reference_batch,
    );
    let step_images = match cut {
        Some(c) => c.global_batch() as u64,
        None => world as u64 * u64::from(p.batch_size),
    };
    let (factor, factor_text) = tchrun::schedule::lr_factor(scaling, step_images, reference);
    let lr_why = lr_why(
        job,
        cut.is_some(),
        world,
        step_images,
        reference,
        &factor_text,
    );
    Ok(Plan {
        cut,
        micro_batches: cut.map(|c| c.accumulation).unwrap_or(1),
        steps_per_epoch,
        schedule: LrSchedule::with_peak(
            p.lr * factor,
            p.warmup_epochs,
            p.epochs,
            steps_per_epoch,
            job.options.lr_power,
        )
        .of_recipe(
            &job.options.recipe,
            p.warmup_epochs,
            p.epochs,
            steps_per_epoch,
        ),
        scaling,
        lr_why,
        factor_text,
        reference,
    })
}

/// What scaled `--lr` (the console line's and the divergence error's words): "world size 2"
/// by default, else the factor, the rule and the batch `--lr` is given for.
fn lr_why(
    job: &TrainJob,
    global: bool,
    world: usize,
    step_images: u64,
    reference: u32,
    factor_text: &str,
) -> String {
    let (o, s) = (&job.options, job.options.lr_scaling.as_str());
    let r = match o.lr_reference_batch {
        Some(r) => format!("--lr-reference-batch {r}"),
        None if global => format!("reference batch {reference}: --lr is the global batch's LR"),
        None => format!("--batch-size {reference}"),
    };
    match (global, o.lr_scaling, o.lr_reference_batch) {
        (false, LrScaling::Linear, None) => format!("world size {world}"),
        (false, _, None) => format!("{factor_text} (--lr-scaling {s}, world size {world})"),
        (false, _, Some(_)) => format!(
            "{factor_text} (--lr-scaling {s}, {world} rank(s) × --batch-size {} = {step_images}              images per step / {r})",
            job.params.batch_size
        ),
        (true, _, _) => format!(
            "{factor_text} (--lr-scaling {s}, --global-batch-size {step_images} / {r}; \
             --batch-size does not change it)"
        ),
    }
}

/// The state a checkpoint resumes (said on the console; rank 0 rewrites `metrics.jsonl` to
/// the checkpoint's epochs). A mid-epoch position carries over only to the same sharding.
fn resumed_state(
    job: &TrainJob,
    ctx: &RankCtx,
    meta: &checkpoint::Meta,
    plan: &Plan,
) -> Result<Resume, TrainError> {
    let world = ctx.pg.size();
    let same_world = match job.options.global_batch_size {
        Some(g) => meta.global_batch_size == Some(g),
        None => meta.world_size == world && meta.global_batch_size.is_none(),
    };
    let state = Resume {
        epoch: meta.epoch,
        batches_done: if same_world { meta.batches_done } else { 0 },
        step: if same_world {
            meta.step
        } else {
            meta.epoch as u64 * plan.steps_per_epoch
        },
        stopping: EarlyStopping {
            patience: job.params.patience,
            best: meta.best_loss.zip(meta.best_epoch),
            since_best: meta.since_best,
        },
        history: meta.history.clone(),
        partial: if same_world && meta.batches_done > 0 {
            meta.partial
        } else {
            (0.0, 0.0, 0.0)
        },
        loss_scaler: LossScaler::in_checkpoint(meta),
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
    if ctx.pg.rank() == 0 {
        outputs::rewrite_metrics(&job.output, &state.history).map_err(TrainError::Output)?;
    }
    Ok(state)
}

/// The driver log's training-start record, and the LR's reason when it is not plain linear
/// scaling by the world size.
fn say_start(
    job: &TrainJob,
    ctx: &RankCtx,
    cfg: &ModelConfig,
    train: &data::ImageFolder,
    valid: &data::ImageFolder,
    plan: &Plan,
) {
    let (p, world, device) = (&job.params, ctx.pg.size(), ctx.device);
    (ctx.say)(
        &tchrun::driver_log::TrainingStart {
            arch: cfg.arch.name().to_string(),
            train_images: train.samples.len(),
            valid_images: valid.samples.len(),
            classes: train.classes.len(),
            world_size: world,
            device: if device.is_cuda() { "cuda" } else { "cpu" }.to_string(),
            steps_per_epoch: plan.steps_per_epoch,
            effective_lr: plan.schedule.peak,
            lr: p.lr,
            lr_factor: plan.factor_text.clone(),
            bucket_cap_mb: job.options.bucket_cap_mb,
        }
        .write(),
    );
    let peak = plan.schedule.peak;
    if let Some(c) = plan.cut {
        (ctx.say)(&format!(
            "global batch {} images per optimizer step = {world} rank(s) × {} accumulation \
             step(s) × --batch-size {}; effective LR {:e} = --lr {:e} × {}",
            c.global_batch(),
            c.accumulation,
            c.batch,
            peak,
            p.lr,
            plan.lr_why
        ));
    } else if plan.scaling != LrScaling::Linear || job.options.lr_reference_batch.is_some() {
        (ctx.say)(&format!(
            "effective LR {:e} = --lr {:e} × {}",
            peak, p.lr, plan.lr_why
        ));
    }
}
