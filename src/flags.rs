//! Every flag shared by `tchrun` and `tchrun-worker`: name, default, range, help and
//! `TCHRUN_<FLAG>` variable live here, so both binaries and `--help` never drift.
use crate::console::Selection;
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::path::PathBuf;

/// Parses `--lr`: a finite float >= f64::EPSILON ("Train PyTorch Model"'s `>=double.Epsilon`).
pub fn parse_lr(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number"))?;
    if !v.is_finite() || v < f64::EPSILON {
        return Err(format!(
            "must be a finite number >= {:e} (f64::EPSILON), got {s}",
            f64::EPSILON
        ));
    }
    Ok(v)
}

/// Training parameters (defaults from the "Train PyTorch Model" seed).
#[derive(Args, Debug, Clone, PartialEq, Serialize)]
pub struct TrainParams {
    /// Passes over the training set.
    #[arg(help_heading = "Training", long, env = "TCHRUN_EPOCHS", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    pub epochs: u32,
    /// Images per rank per step.
    #[arg(help_heading = "Training", long, env = "TCHRUN_BATCH_SIZE", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    pub batch_size: u32,
    /// Epochs of linear learning-rate warmup.
    #[arg(help_heading = "Training", visible_alias = "lr-warmup-epochs", long, env = "TCHRUN_WARMUP_EPOCHS", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..), allow_negative_numbers = true)]
    pub warmup_epochs: u32,
    /// Base learning rate; the effective LR is lr × world size (see --lr-scaling). Azure ML's
    /// "Train PyTorch Model" documents 0.001 in its text (0.1 in its parameter table): tchrun
    /// uses 0.001.
    #[arg(help_heading = "Training", long, env = "TCHRUN_LR", default_value_t = 0.001, value_parser = parse_lr, allow_negative_numbers = true)]
    pub lr: f64,
    /// Seeds weight init, shuffling and augmentation.
    #[arg(
        help_heading = "Training",
        long,
        env = "TCHRUN_SEED",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub seed: i64,
    /// Stop after this many epochs without a lower validation loss (the trained model's; with
    /// --early-stop-on ema, the EMA model's).
    #[arg(help_heading = "Training", long, env = "TCHRUN_PATIENCE", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    pub patience: u32,
    /// Log a training line at each epoch's first step and every N iterations (each line also
    /// ends a window of the straggler statistics and status.json's shares).
    #[arg(help_heading = "Observability", long, env = "TCHRUN_PRINT_FREQ", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    pub print_freq: u32,
}

/// Where a rank computes and how ranks talk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Device {
    Auto,
    Cpu,
    Cuda,
}

/// The c10d backend (auto: nccl on CUDA, gloo on CPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    Auto,
    Nccl,
    Gloo,
}

crate::value_enum_serde!(Device, Backend, LrScaling, Amp, StragglerAction);

impl Device {
    pub fn as_str(self) -> &'static str {
        match self {
            Device::Auto => "auto",
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Nccl => "nccl",
            Backend::Gloo => "gloo",
        }
    }
}

/// Flags every rank reads (the launcher passes them through).
#[derive(Args, Debug, Clone, PartialEq, Serialize)]
pub struct RankFlags {
    /// Compute device.
    #[arg(help_heading = "Launch", long, env = "TCHRUN_DEVICE", value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    /// Collective backend (auto: nccl on CUDA, gloo on CPU).
    #[arg(help_heading = "Launch", long, env = "TCHRUN_BACKEND", value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// Directory of the per-rank driver logs (default: <output>/logs, or ./tchrun-logs).
    #[arg(help_heading = "Observability", long, env = "TCHRUN_LOG_DIR")]
    pub log_dir: Option<PathBuf>,
    /// Seconds a collective or the store may wait for the other ranks before failing.
    #[arg(help_heading = "Fault tolerance", long, env = "TCHRUN_TIMEOUT", default_value_t = DEFAULT_TIMEOUT_S, value_parser = clap::value_parser!(u64).range(1..=crate::counts::MAX_SECONDS))]
    pub timeout: u64,
    /// Whose lines reach the terminal: all, ranks (0,3 or 0-3) or host:NAME[,NAME]. Warnings
    /// and errors of every rank always do; a line several ranks print alike is shown once, as
    /// "[ranks 0-3] ...". The driver logs keep every line.
    #[arg(help_heading = "Observability", long, env = "TCHRUN_CONSOLE", default_value_t = Selection::default(), value_parser = Selection::parse)]
    pub console: Selection,
    /// Intra-op (libtorch) threads of each rank (default: this node's cores / its ranks). More
    /// ranks × threads than cores, or a node already busy, slows every rank: tchrun warns
    /// before the ranks start, and the run report says "CPU oversubscribed". The same model
    /// at any world size needs the same --threads.
    #[arg(help_heading = "Launch", long, env = "TCHRUN_THREADS", value_parser = clap::value_parser!(u32).range(1..=crate::counts::MAX_LOADER_THREADS as i64))]
    pub threads: Option<u32>,
    /// The network interface every rank uses (e.g. eth0, ib0; the same name on every node):
    /// rank 0 offers only its addresses, Gloo binds it, and GLOO_SOCKET_IFNAME and
    /// NCCL_SOCKET_IFNAME are set to it unless already set. Default: rank 0 offers all its
    /// addresses and the first one every rank reaches within seconds is used.
    #[arg(
        help_heading = "Launch",
        long,
        env = "TCHRUN_IFNAME",
        value_name = "NAME"
    )]
    pub ifname: Option<String>,
}

/// `--console` of `tchrun exec` and `tchrun-worker exec`: the same selection as the other
/// commands', said in a program's terms (its stdout and stderr lines).
#[derive(Args, Debug, Clone, PartialEq, Serialize)]
pub struct ProgramConsole {
    /// Whose output reaches the terminal, line by line as the program prints it: all, ranks (0,3
    /// or 0-3) or host:NAME[,NAME]. These ranks' stdout and stderr lines are shown; of every
    /// rank, the stderr lines that look like a warning or an error (with warn, error, exception,
    /// traceback, fatal or panic in them, the indented lines after them, a Python traceback to
    /// its last line). A line several ranks print alike is shown once, as "[ranks 0-3] ...".
    /// The driver logs keep every line.
    #[arg(long, env = "TCHRUN_CONSOLE", default_value_t = Selection::default(), value_parser = Selection::parse)]
    pub console: Selection,
}

impl RankFlags {
    /// The flags as command-line arguments for a rank (`argv`).
    pub fn to_args(&self) -> Result<Vec<String>, crate::argv::ArgvError> {
        crate::argv::argv(self)
    }

    /// Each rank's intra-op threads with `local_size` ranks on its node: `--threads`, else the
    /// node's cores shared among its ranks (`env::threads_per_rank`).
    pub fn threads_per_rank(&self, local_size: usize) -> usize {
        self.threads
            .map(|t| t as usize)
            .unwrap_or_else(|| crate::env::threads_per_rank(local_size))
    }
}

impl TrainParams {
    /// The parameters as command-line arguments for a rank (`argv`).
    pub fn to_args(&self) -> Result<Vec<String>, crate::argv::ArgvError> {
        crate::argv::argv(self)
    }
}

/// `--timeout`'s default: seconds a rank waits for a peer in a collective or at start-up.
pub const DEFAULT_TIMEOUT_S: u64 = 300;
/// Default log directory of jobs that have no `--output`.
pub const DEFAULT_LOG_DIR: &str = "tchrun-logs";
/// `--max-image-pixels`'s default (Pillow's `Image.MAX_IMAGE_PIXELS`).
pub const DEFAULT_MAX_IMAGE_PIXELS: u64 = 89_478_485;

/// How the effective LR follows the batch of one optimizer step: k = its images / the batch
/// `--lr` is given for (`schedule::lr_reference_batch`): the world size by default, 1 with
/// `--global-batch-size G` unless `--lr-reference-batch` says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LrScaling {
    /// lr × k (Goyal et al.'s linear scaling rule).
    Linear,
    /// lr × √k.
    Sqrt,
    /// lr, whatever the batch.
    None,
}

impl LrScaling {
    fn is_linear(&self) -> bool {
        *self == LrScaling::Linear
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LrScaling::Linear => "linear",
            LrScaling::Sqrt => "sqrt",
            LrScaling::None => "none",
        }
    }
}

/// Mixed precision on CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Amp {
    /// Full fp32.
    Off,
    /// bfloat16 autocast (no loss scaling needed).
    Bf16,
    /// float16 autocast with dynamic loss scaling.
    Fp16,
}

impl Amp {
    pub fn as_str(self) -> &'static str {
        match self {
            Amp::Off => "off",
            Amp::Bf16 => "bf16",
            Amp::Fp16 => "fp16",
        }
    }
}

/// What a straggler (`tchrun_worker::straggler`) makes the job do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StragglerAction {
    /// Name it (console, driver log, metrics, TensorBoard, status.json); the job goes on.
    Warn,
    /// Also: a host whose rank was a straggler in every window of an epoch is left out. The job
    /// checkpoints at the epoch's end, stops, and `tchrun train` restarts it without that host
    /// (needs --max-restarts and --hostfile; --min-nodes applies).
    Exclude,
}

impl StragglerAction {
    fn is_warn(&self) -> bool {
        *self == StragglerAction::Warn
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StragglerAction::Warn => "warn",
            StragglerAction::Exclude => "exclude",
        }
    }
}

fn parse_nonneg(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("must be a finite number >= 0, got {s}"));
    }
    Ok(v)
}

fn parse_scale(s: &str) -> Result<f64, String> {
    let v = parse_nonneg(s)?;
    if v <= 0.0 || v > 1.0 {
        return Err(format!("must be in (0, 1], got {s}"));
    }
    Ok(v)
}

fn parse_power(s: &str) -> Result<f64, String> {
    let v = parse_nonneg(s)?;
    if v <= 0.0 {
        return Err(format!("must be > 0, got {s}"));
    }
    Ok(v)
}

fn parse_bucket_mb(s: &str) -> Result<f64, String> {
    let v = parse_nonneg(s)?;
    if !(v > 0.0 && v <= 4096.0) {
        return Err(format!("must be in (0, 4096] MiB, got {s}"));
    }
    Ok(v)
}

/// `--bucket-cap-mb`'s default: PyTorch DDP's `bucket_cap_mb` (25 MiB).
pub const BUCKET_CAP_MB: f64 = 25.0;
/// The first bucket's cap in bytes (DDP's `_DEFAULT_FIRST_BUCKET_BYTES`, 1 MiB): small, so the
/// first all-reduce starts early in backward.
pub const FIRST_BUCKET_BYTES: usize = 1024 * 1024;

/// Gradient bucket caps in bytes for a cap of `cap_mb` MiB: (first bucket, every later one).
/// The one definition of the bucket sizes (the worker's `Replicator` defaults to
/// `bucket_caps(BUCKET_CAP_MB)`).
pub fn bucket_caps(cap_mb: f64) -> (usize, usize) {
    let rest = ((cap_mb * 1024.0 * 1024.0) as usize).max(4);
    (rest.min(FIRST_BUCKET_BYTES), rest)
}

impl TrainOptions {
    /// Bucket caps in bytes: (first bucket, every later one).
    pub fn bucket_caps(&self) -> (usize, usize) {
        bucket_caps(self.bucket_cap_mb)
    }
}

/// Optimizer and input-pipeline options beyond "Train PyTorch Model"'s parameters (documented,
/// overridable). Serialised for the ranks' argv (`argv`): a flag left out at its default is one
/// that today's ranks never got otherwise; the nested groups add their own (`to_args`).
#[derive(Args, Debug, Clone, PartialEq, Serialize)]
pub struct TrainOptions {
    /// SGD momentum.
    #[arg(help_heading = "Training", long, env = "TCHRUN_MOMENTUM", default_value_t = 0.9, value_parser = parse_nonneg)]
    pub momentum: f64,
    /// SGD weight decay (L2), applied to every parameter as torch.optim.SGD does.
    #[arg(help_heading = "Training", long, env = "TCHRUN_WEIGHT_DECAY", default_value_t = 1e-4, value_parser = parse_nonneg)]
    pub weight_decay: f64,
    /// Power of the polynomial LR decay after warmup: lr × (1 - t)^power, t going 0 → 1.
    #[arg(help_heading = "Training", long, env = "TCHRUN_LR_POWER", default_value_t = 1.0, value_parser = parse_power)]
    pub lr_power: f64,
    /// Lower bound of RandomResizedCrop's area scale (torchvision: 0.08; raise it for tiny
    /// images such as digits).
    #[arg(help_heading = "Data", long, env = "TCHRUN_MIN_CROP_SCALE", default_value_t = 0.08, value_parser = parse_scale)]
    pub min_crop_scale: f64,
    /// Turn off the random horizontal flip (for data where mirroring changes the class).
    #[arg(help_heading = "Data", long, env = "TCHRUN_NO_HFLIP")]
    pub no_hflip: bool,
    /// Skip (and count in the log) images that cannot be decoded instead of failing.
    #[arg(help_heading = "Data", long, env = "TCHRUN_SKIP_BAD_IMAGES")]
    pub skip_bad_images: bool,
    /// Refuse images whose header declares more pixels than this (decompression bombs).
    #[arg(help_heading = "Data", long, env = "TCHRUN_MAX_IMAGE_PIXELS", default_value_t = DEFAULT_MAX_IMAGE_PIXELS, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_image_pixels: u64,
    /// Decode/augment threads per rank (default: cores / ranks on the node).
    #[arg(help_heading = "Data", short = 'j', visible_alias = "workers", long, env = "TCHRUN_LOADER_THREADS", value_parser = clap::value_parser!(u32).range(1..=crate::counts::MAX_LOADER_THREADS as i64))]
    pub loader_threads: Option<u32>,
    /// Mixed precision on CUDA (ignored on CPU).
    #[arg(help_heading = "Training", long, env = "TCHRUN_AMP", value_enum, default_value_t = Amp::Off)]
    pub amp: Amp,
    /// The convolutions' memory format: channels-last (NHWC in memory), PyTorch's NCHW, or
    /// auto: the one measured faster for the device, architecture and input size
    /// (channels-last on CUDA and for DenseNet; ResNets on CPU in NCHW below 96 px). The driver log says which and
    /// why; the weights written to --output are standard NCHW either way.
    #[arg(help_heading = "Training", long, env = "TCHRUN_CHANNELS_LAST", value_enum, default_value_t = crate::layout::ChannelsLast::Auto)]
    pub channels_last: crate::layout::ChannelsLast,
    /// The same as --channels-last off (kept for existing scripts).
    #[arg(
        long,
        hide = true,
        env = "TCHRUN_NO_CHANNELS_LAST",
        conflicts_with = "channels_last"
    )]
    pub no_channels_last: bool,
    /// Gradient bucket cap in MiB (DDP's bucket_cap_mb): each bucket's all-reduce starts as
    /// soon as backward has filled it. The first bucket is capped at 1 MiB (or this, if less).
    #[arg(help_heading = "Training", long, env = "TCHRUN_BUCKET_CAP_MB", default_value_t = BUCKET_CAP_MB, value_parser = parse_bucket_mb)]
    pub bucket_cap_mb: f64,
    /// Continue from the last checkpoint in --output.
    #[arg(help_heading = "Fault tolerance", long, env = "TCHRUN_RESUME")]
    pub resume: bool,
    /// Start over in an --output that holds an interrupted run's checkpoint or a trained
    /// model: its checkpoints, metrics and model are replaced by this run's.
    #[arg(
        help_heading = "Fault tolerance",
        long,
        env = "TCHRUN_OVERWRITE",
        conflicts_with = "resume"
    )]
    pub overwrite: bool,
    /// Fine-tuning: train the classifier only (`fc` / `classifier`). Every other parameter and
    /// batch-norm statistic stays as it started, bit for bit: no gradient, no all-reduce, batch
    /// norm in inference mode.
    #[arg(help_heading = "Training", long, env = "TCHRUN_FREEZE_BACKBONE")]
    pub freeze_backbone: bool,
    /// Fine-tuning: the LR of everything but the classifier is the scheduled LR × S (the
    /// classifier's is the scheduled LR). 1 trains all layers alike.
    #[arg(help_heading = "Training", long, env = "TCHRUN_BACKBONE_LR_SCALE", default_value_t = 1.0, value_parser = parse_nonneg, conflicts_with = "freeze_backbone")]
    #[serde(skip_serializing_if = "is_one")]
    pub backbone_lr_scale: f64,
    /// Also checkpoint every STEPS optimizer steps (besides each epoch's end; 0: epoch ends
    /// only). Rank 0 writes in the background: no rank waits on its storage.
    #[arg(
        help_heading = "Fault tolerance",
        long,
        env = "TCHRUN_CHECKPOINT_EVERY",
        default_value_t = 0
    )]
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub checkpoint_every: u64,
    /// Images per optimizer step over all ranks. Each rank then accumulates the gradients of
    /// G / (world size × --batch-size) micro-batches of --batch-size images per step, the
    /// micro-batches cut from each step's G images in one fixed way: the same samples form the
    /// same steps at any world size. Must be a multiple of world size × --batch-size.
    #[arg(help_heading = "Training", long, env = "TCHRUN_GLOBAL_BATCH_SIZE", value_parser = clap::value_parser!(u32).range(1..))]
    pub global_batch_size: Option<u32>,
    /// How the effective LR follows the batch: k = images per optimizer step / the batch --lr
    /// is given for (--lr-reference-batch): the world size by default, G / G = 1 with
    /// --global-batch-size G; linear: lr × k, sqrt: lr × √k, none: lr. --batch-size never
    /// changes the LR when G is given.
    #[arg(help_heading = "Training", long, env = "TCHRUN_LR_SCALING", value_enum, default_value_t = LrScaling::Linear)]
    #[serde(skip_serializing_if = "LrScaling::is_linear")]
    pub lr_scaling: LrScaling,
    /// The batch (images per optimizer step over all ranks) --lr is given for; --lr-scaling
    /// scales it by (images per step) / R. Default: --global-batch-size G when given (--lr is
    /// the LR of the global batch, as torchvision's --lr is that of the batch it was tuned
    /// with), else --batch-size (--lr is one rank's LR, × world size). E.g. 256 for Goyal et
    /// al.'s "0.1 per 256 images".
    #[arg(help_heading = "Training", long, env = "TCHRUN_LR_REFERENCE_BATCH", value_parser = clap::value_parser!(u32).range(1..))]
    pub lr_reference_batch: Option<u32>,
    /// A rank slower than the others (compute 1.3x the median of the other ranks, or a data
    /// wait 10 points above theirs, three --print-freq windows in a row) is named; warn: that
    /// is all; exclude: a host slow for a whole epoch is left out at a restart from that
    /// epoch's checkpoint (needs --max-restarts and --hostfile).
    #[arg(help_heading = "Observability", long, env = "TCHRUN_STRAGGLER_ACTION", value_enum, default_value_t = StragglerAction::Warn)]
    #[serde(skip_serializing_if = "StragglerAction::is_warn")]
    pub straggler_action: StragglerAction,
    /// Rank 0 rewrites DIR/tchrun_<job>.prom every few seconds for node_exporter's textfile
    /// collector (--collector.textfile.directory DIR): state, step, epoch, images/s, loss, LR,
    /// ETA, checkpoint age, each rank's phase and time split, stragglers; the launcher writes
    /// the end. <job>: --output's folder name and a hash of its path. DIR must exist; a failed
    /// write is warned about once and never stops training.
    #[arg(
        help_heading = "Observability",
        long,
        env = "TCHRUN_PROMETHEUS_TEXTFILE",
        value_name = "DIR"
    )]
    pub prometheus_textfile: Option<PathBuf>,
    #[command(flatten)]
    #[serde(skip)]
    pub recipe: crate::recipe::RecipeFlags,
    #[command(flatten)]
    #[serde(skip)]
    pub augment: crate::augment_flags::AugmentFlags,
    #[command(flatten)]
    #[serde(skip)]
    pub class_weights: crate::class_weights::ClassWeightsFlags,
    #[command(flatten)]
    #[serde(skip)]
    pub preset: crate::recipe_preset::PresetFlags,
    #[command(flatten)]
    #[serde(skip)]
    pub mlflow: crate::mlflow::MlflowFlags,
}

impl TrainOptions {
    /// `--channels-last`, with the older `--no-channels-last` as `off`.
    pub fn layout_setting(&self) -> crate::layout::ChannelsLast {
        if self.no_channels_last {
            crate::layout::ChannelsLast::Off
        } else {
            self.channels_last
        }
    }

    /// The nested groups' flags for a rank: the recipe and augmentation flags not at their
    /// default, the class weights (a file's path made absolute: ranks may start elsewhere),
    /// MLflow's. `--recipe` itself is not passed: the ranks get what it expanded to.
    pub fn nested_flags(&self) -> Result<Vec<crate::argv::Flag>, crate::argv::ArgvError> {
        let mut v = crate::argv::flags_changed(&self.recipe)?;
        v.extend(crate::argv::flags_changed(&self.augment)?);
        v.extend(crate::argv::flags(&self.class_weights.absolute())?);
        v.extend(crate::argv::flags(&self.mlflow)?);
        Ok(v)
    }
}

fn is_one(x: &f64) -> bool {
    *x == 1.0
}

fn is_zero_u64(x: &u64) -> bool {
    *x == 0
}

/// The inputs and outputs of a training job ("Train PyTorch Model"'s ports).
#[derive(Args, Debug, Clone, PartialEq, Serialize)]
pub struct TrainJob {
    /// Untrained model directory (made by `tchrun model init`).
    #[arg(long, help_heading = "Inputs and outputs", env = "TCHRUN_MODEL")]
    pub model: PathBuf,
    /// Training image directory (one sub-folder per class), or a .zip/.tar/.tar.gz archive of one.
    #[arg(long, help_heading = "Inputs and outputs", env = "TCHRUN_TRAIN")]
    pub train: PathBuf,
    /// Validation image directory (the same classes), or a .zip/.tar/.tar.gz archive of one.
    #[arg(long, help_heading = "Inputs and outputs", env = "TCHRUN_VALID")]
    pub valid: PathBuf,
    /// Trained model directory to write (model.json, model.safetensors, metrics).
    #[arg(
        long,
        help_heading = "Inputs and outputs",
        env = "TCHRUN_OUTPUT",
        visible_alias = "output-dir"
    )]
    pub output: PathBuf,
    #[command(flatten)]
    #[serde(flatten)]
    pub params: TrainParams,
    #[command(flatten)]
    #[serde(flatten)]
    pub options: TrainOptions,
}

impl TrainJob {
    /// The job as arguments for `tchrun-worker train` (paths as given: make them absolute
    /// first), derived from the flags (`argv`).
    pub fn to_args(&self) -> Result<Vec<String>, crate::argv::ArgvError> {
        Ok(crate::argv::args(&self.flags()?))
    }

    /// The job's flags as a rank gets them (`to_args`), typed.
    pub fn flags(&self) -> Result<Vec<crate::argv::Flag>, crate::argv::ArgvError> {
        let mut v = crate::argv::flags(self)?;
        v.extend(self.options.nested_flags()?);
        Ok(v)
    }

    /// The job's MLflow parameters: each flag a rank gets (`flags`) as its name and value (a
    /// switch: `true`), MLflow's own flags left out.
    pub fn params(&self) -> Result<Vec<(String, String)>, crate::argv::ArgvError> {
        let pair = |f: crate::argv::Flag| match f {
            crate::argv::Flag::Named { name, value } if !name.starts_with("mlflow-") => {
                Some((name, value.unwrap_or_else(|| "true".to_string())))
            }
            _ => None,
        };
        Ok(self.flags()?.into_iter().filter_map(pair).collect())
    }
}

/// What the launcher's pre-flight hands the ranks of `tchrun-worker train`, as hidden flags
/// (one definition for both binaries: the launcher writes them with `to_args`, the worker
/// parses them). A rank started without them (srun, sbatch, by hand) checks everything itself.
#[derive(Args, Debug, Clone, Default, PartialEq, Serialize)]
pub struct TrainHandoff {
    /// The launcher leaves the image headers to be checked when each image is first decoded
    /// (more than `TCHRUN_VERIFY_UPFRONT_MAX` never verified).
    #[arg(long, hide = true)]
    pub verify_on_decode: bool,
    /// The launcher's copy of the training folder's dataset index, read instead of listing
    /// the folder when it passes the stamps check on this rank's copy of the data.
    #[arg(long, hide = true)]
    pub train_index: Option<PathBuf>,
    /// The same for the validation folder.
    #[arg(long, hide = true)]
    pub valid_index: Option<PathBuf>,
}

impl TrainHandoff {
    /// The flags as command-line arguments for a rank (only those set; `argv`).
    pub fn to_args(&self) -> Result<Vec<String>, crate::argv::ArgvError> {
        crate::argv::argv(self)
    }

    /// The index copies of train and valid, in that order (`files::DATASET_INDEX_COPIES`'s).
    pub fn indexes_mut(&mut self) -> [&mut Option<PathBuf>; 2] {
        [&mut self.train_index, &mut self.valid_index]
    }
}

/// Parses `args` (the program's name first) as `C`, once, with the arguments the user gave
/// its subcommand (`Given`: what a `--recipe` leaves alone; `TrainJob::with_recipe` applies
/// one after this). A flag given twice takes its last value, as argparse (and so torchrun, a
/// Python script's flags) does: `$COMMON --epochs 3` after a `$COMMON` holding `--epochs`.
pub fn try_parse_from<C: clap::Parser>(
    args: Vec<std::ffi::OsString>,
) -> Result<(C, crate::recipe_preset::Given), clap::Error> {
    let m = C::command()
        .args_override_self(true)
        .try_get_matches_from(args)?;
    Ok((
        C::from_arg_matches(&m)?,
        crate::recipe_preset::Given::of_subcommand(&m),
    ))
}

/// Parses the command line of either binary (`try_parse_from`); a bad flag prints clap's
/// message (naming the flag) and exits with the invalid-input code, `--help`/`--version` exit
/// 0.
pub fn parse_or_exit<C: clap::Parser>() -> (C, crate::recipe_preset::Given) {
    match try_parse_from::<C>(std::env::args_os().collect()) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                crate::exit::code::INVALID_INPUT
            } else {
                crate::exit::code::OK
            };
            let _ = e.print();
            std::process::exit(code);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        p: TrainParams,
        #[command(flatten)]
        r: RankFlags,
    }

    #[test]
    fn defaults_are_the_seeds() {
        let c = Cli::try_parse_from(["x"]).expect("defaults parse");
        assert_eq!(
            (
                c.p.epochs,
                c.p.batch_size,
                c.p.warmup_epochs,
                c.p.seed,
                c.p.patience,
                c.p.print_freq
            ),
            (5, 16, 0, 1, 3, 10)
        );
        assert_eq!(c.p.lr, 0.001);
    }

    #[derive(Parser, Debug)]
    struct Handed {
        #[command(flatten)]
        h: TrainHandoff,
    }

    #[test]
    fn the_launchers_handoff_is_what_the_worker_parses() {
        assert!(TrainHandoff::default().to_args().expect("argv").is_empty());
        let mut h = TrainHandoff {
            verify_on_decode: true,
            ..TrainHandoff::default()
        };
        *h.indexes_mut()[1] = Some(PathBuf::from("/o/logs/dataset-index-valid.v1"));
        let args = h.to_args().expect("argv");
        assert_eq!(
            args,
            [
                "--verify-on-decode",
                "--valid-index=/o/logs/dataset-index-valid.v1"
            ]
        );
        let parsed = Handed::try_parse_from(std::iter::once("x".to_string()).chain(args))
            .expect("the worker parses what the launcher writes");
        assert_eq!(parsed.h, h);
    }

    #[test]
    fn ranges_are_enforced() {
        for bad in [
            ["x", "--epochs", "0"],
            ["x", "--batch-size", "0"],
            ["x", "--lr", "0"],
            ["x", "--lr", "nan"],
            ["x", "--patience", "0"],
            ["x", "--print-freq", "0"],
            ["x", "--warmup-epochs", "-1"],
            ["x", "--timeout", "31536001"],
            ["x", "--timeout", "18446744073709551615"],
        ] {
            let err = Cli::try_parse_from(bad).expect_err("out of range");
            assert!(err.to_string().contains(bad[1]), "{err}");
        }
        assert!(Cli::try_parse_from(["x", "--seed", "-7"]).is_ok());
    }

    #[test]
    fn args_round_trip() {
        let c = Cli::try_parse_from([
            "x",
            "--epochs",
            "7",
            "--lr",
            "0.05",
            "--seed",
            "-3",
            "--backend",
            "gloo",
            "--threads",
            "3",
        ])
        .expect("parse");
        let mut argv = vec!["x".to_string()];
        argv.extend(c.p.to_args().expect("argv"));
        argv.extend(c.r.to_args().expect("argv"));
        let d = Cli::try_parse_from(argv).expect("reparse");
        assert_eq!(c.p, d.p);
        assert_eq!(c.r, d.r);
    }
}
