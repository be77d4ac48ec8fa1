//! The architectures (tch's vision models, torchvision parameter names) and their weights as
//! torchvision `state_dict`s in safetensors: what Python's `load_state_dict(strict=True)` takes.
//! Owns the network definitions (`resnet`: ResNet/ResNeXt/Wide ResNet, `densenet`,
//! `convnext`, `efficientnet`: EfficientNet and EfficientNetV2, `mobilenet`: MobileNetV3,
//! `vit`: the Vision Transformer, `regnet`: RegNet X and Y, `swin`: the Swin Transformer;
//! `blocks`: layers they share) and
//! their weights; knows nothing of ranks, data loading or training.
pub mod blocks;
pub mod convnext;
pub mod densenet;
pub mod efficientnet;
pub mod init;
pub mod mobilenet;
pub mod regnet;
pub mod resnet;
pub mod swin;
pub mod vit;
use std::collections::BTreeMap;
use std::path::Path;
use tch::{nn, Kind, Tensor};
use tchrun::model::{Arch, Family};

/// Builds `arch` with `classes` outputs under `root` for inputs of `input_size` pixels (the
/// model's, `model.json`'s: only a ViT's tensors depend on it), as torchvision does.
/// `memory_efficient`: torchvision's DenseNet argument of that name (`model init
/// --memory-efficient`; the launcher refuses it for the ResNets, which ignore it here).
pub fn build(
    arch: Arch,
    root: &nn::Path,
    classes: i64,
    input_size: i64,
    memory_efficient: bool,
) -> Box<dyn nn::ModuleT> {
    build_with(arch, root, (classes, input_size), memory_efficient, true)
}

/// `build` without the random layers: ConvNeXt's and EfficientNet's stochastic depth off
/// (every block's drop probability 0) and EfficientNet's and MobileNetV3's dropout in the
/// classifier off, so that a training step is deterministic: the parity test's gradients
/// against torchvision's `stochastic_depth_prob=0` (and `dropout=0`). The other families have
/// neither.
pub fn build_deterministic(
    arch: Arch,
    root: &nn::Path,
    classes: i64,
    input_size: i64,
) -> Box<dyn nn::ModuleT> {
    build_with(arch, root, (classes, input_size), false, false)
}

fn build_with(
    arch: Arch,
    root: &nn::Path,
    (classes, input_size): (i64, i64),
    memory_efficient: bool,
    stochastic: bool,
) -> Box<dyn nn::ModuleT> {
    match arch.family() {
        family @ Family::Vit { .. } => {
            Box::new(crate::models::vit::vit(root, family, input_size, classes))
        }
        family @ Family::Convnext { .. } => Box::new(crate::models::convnext::convnext(
            root, family, classes, stochastic,
        )),
        family @ Family::Efficientnet { .. } => Box::new(
            crate::models::efficientnet::efficientnet(root, family, classes, stochastic),
        ),
        family @ Family::Mobilenet { .. } => Box::new(crate::models::mobilenet::mobilenet(
            root, family, classes, stochastic,
        )),
        family @ Family::Regnet { .. } => {
            Box::new(crate::models::regnet::regnet(root, family, classes))
        }
        family @ Family::Swin { .. } => {
            Box::new(crate::models::swin::swin(root, family, classes, stochastic))
        }
        family @ Family::Resnet { .. } => {
            Box::new(crate::models::resnet::resnet(root, family, classes))
        }
        family @ Family::Densenet { .. } => Box::new(crate::models::densenet::densenet(
            root,
            family,
            classes,
            memory_efficient,
        )),
    }
}

/// Test helper: the variables `vs` holds (names and shapes, sorted) equal `weights::spec` of
/// `arch` for 3 classes, the buffers the store does not keep aside (`is_derived_buffer`).
#[cfg(test)]
pub(crate) fn assert_builds_spec(vs: &nn::VarStore, arch: Arch) {
    let mut vars: Vec<(String, Vec<i64>)> = vs
        .variables()
        .into_iter()
        .map(|(n, t)| (n, t.size()))
        .collect();
    vars.sort();
    let mut want: Vec<(String, Vec<i64>)> = tchrun::weights::spec(arch, 3)
        .into_iter()
        .filter(|(n, _)| !is_derived_buffer(n))
        .map(|(n, s)| (n, s.iter().map(|&d| d as i64).collect()))
        .collect();
    want.sort();
    assert_eq!(vars, want, "{}", arch.name());
}

/// torchvision's `zero_init_residual=True`: the last batch-norm weight of every residual block
/// (`bn2` of a basic block, `bn3` of a bottleneck) set to zero. Returns how many were.
pub fn zero_init_residual(vs: &nn::VarStore) -> usize {
    let vars = vs.variables();
    let bottleneck = vars.keys().any(|n| n.ends_with(".bn3.weight"));
    let last = if bottleneck {
        ".bn3.weight"
    } else {
        ".bn2.weight"
    };
    let mut n = 0;
    tch::no_grad(|| {
        for (name, mut v) in vars {
            if name.starts_with("layer") && name.ends_with(last) {
                let _ = v.zero_();
                n += 1;
            }
        }
    });
    n
}

/// Every variable of the store by name (sorted: the same order on every rank).
pub fn named(vs: &nn::VarStore) -> BTreeMap<String, Tensor> {
    vs.variables().into_iter().collect()
}

/// A batch-norm layer's buffers are what torchvision calls `running_mean`/`running_var`;
/// torchvision also keeps `num_batches_tracked`, which tch does not.
pub fn is_buffer(name: &str) -> bool {
    name.ends_with(".running_mean") || name.ends_with(".running_var")
}

/// A `state_dict` buffer the store does not keep, written from what it does
/// (`state_dict`) and skipped when read: batch norm's `num_batches_tracked` (the steps taken)
/// and Swin's `relative_position_index` (a constant of the window size).
pub fn is_derived_buffer(name: &str) -> bool {
    name.ends_with(".num_batches_tracked")
        || name.ends_with(&format!(".{}", tchrun::weights::RELATIVE_POSITION_INDEX))
}

/// `x` (N, C, H, W) with channels-last strides (NHWC in memory); same shape and values.
pub fn channels_last(x: &Tensor) -> Tensor {
    x.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2])
}

/// Every 4-D tensor (the convolution weights) to channels-last in place: the same tensors (so
/// the optimizer, the replicator and the model keep seeing them), new storage.
pub fn to_channels_last(tensors: &[(String, Tensor)]) -> usize {
    let mut n = 0;
    tch::no_grad(|| {
        for (_, t) in tensors {
            if t.dim() == 4 {
                let mut t = t.shallow_clone();
                let cl = channels_last(&t.detach());
                t.set_data(&cl);
                n += 1;
            }
        }
    });
    n
}

/// The state dict as torchvision names it: tch's variables plus `num_batches_tracked` for each
/// batch-norm layer (set to the optimizer steps taken) and Swin's `relative_position_index`
/// beside each `relative_position_bias_table`, all on the CPU.
pub fn state_dict(weights: &BTreeMap<String, Tensor>, steps: i64) -> Vec<(String, Tensor)> {
    let mut out: Vec<(String, Tensor)> = Vec::with_capacity(weights.len() + weights.len() / 4);
    for (name, t) in weights {
        out.push((
            name.clone(),
            t.to_device(tch::Device::Cpu)
                .to_kind(Kind::Float)
                .contiguous(),
        ));
        if let Some(layer) = name.strip_suffix(".running_var") {
            out.push((format!("{layer}.num_batches_tracked"), Tensor::from(steps)));
        }
        if let Some(attn) = name.strip_suffix(".relative_position_bias_table") {
            let index = tchrun::arch::swin::relative_position_index(tchrun::arch::swin::WINDOW);
            let key = tchrun::weights::RELATIVE_POSITION_INDEX;
            out.push((format!("{attn}.{key}"), Tensor::from_slice(&index)));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Weights could not be read into the model.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error(
        "{path}: truncated or not a safetensors file ({source}); copy it again from the \
         training output"
    )]
    Read { path: String, source: tch::TchError },
    #[error(
        "{path}: it holds '{name}', which the model's architecture does not have (weights of \
         another architecture?); copy model.json and model.safetensors from the same training \
         output"
    )]
    Extra { path: String, name: String },
    #[error("{path}: missing tensor '{name}' for the model's architecture")]
    Missing { path: String, name: String },
    #[error("{path}: tensor '{name}' has shape {got:?}, the model needs {want:?}")]
    Shape {
        path: String,
        name: String,
        got: Vec<i64>,
        want: Vec<i64>,
    },
}

/// A classifier tensor the file holds with another shape: (name, file's shape, model's shape).
type Replaced = (String, Vec<i64>, Vec<i64>);

/// Copies every variable of the store from the safetensors file at `path`, checking every name
/// and shape. With `head`, a tensor under that prefix whose shape differs is left as it is (and
/// listed) instead of refused. Returns the number of tensors copied.
fn copy_from_file(
    vs: &nn::VarStore,
    path: &Path,
    head: Option<(&str, bool)>,
) -> Result<(usize, Vec<Replaced>), WeightsError> {
    let p = path.display().to_string();
    let tensors = Tensor::read_safetensors(path).map_err(|source| WeightsError::Read {
        path: p.clone(),
        source,
    })?;
    let by_name: BTreeMap<String, Tensor> = tensors.into_iter().collect();
    // Strict, as load_state_dict(strict=True): no tensor the model lacks (torchvision's
    // batch-norm counters and Swin's position indexes excepted: the store does not keep them).
    let vars = vs.variables();
    if let Some(extra) = by_name
        .keys()
        .find(|n| !vars.contains_key(*n) && !is_derived_buffer(n))
    {
        return Err(WeightsError::Extra {
            path: p.clone(),
            name: extra.clone(),
        });
    }
    let (mut loaded, mut kept) = (0usize, Vec::new());
    tch::no_grad(|| {
        for (name, mut var) in vs.variables() {
            let src = by_name.get(&name).ok_or_else(|| WeightsError::Missing {
                path: p.clone(),
                name: name.clone(),
            })?;
            let in_head = head.filter(|(h, _)| name.starts_with(h));
            if in_head.is_some_and(|(_, always_new)| always_new) {
                kept.push((name, src.size(), var.size()));
                continue;
            }
            if src.size() != var.size() {
                if in_head.is_some() {
                    kept.push((name, src.size(), var.size()));
                    continue;
                }
                return Err(WeightsError::Shape {
                    path: p.clone(),
                    name,
                    got: src.size(),
                    want: var.size(),
                });
            }
            var.copy_(&src.to_kind(var.kind()));
            loaded += 1;
        }
        Ok((loaded, kept))
    })
}

/// Starts the model from a weights file (`model init --weights`, or a trained model directory
/// given to `--model`): every tensor of the store is copied from the file, except a classifier
/// (`head` prefix) whose shape differs (another number of classes) or, with `new_head`, any
/// classifier (a trained model's classes are not the training set's): it keeps its fresh,
/// seeded initialization. Returns what happened, for the log.
pub fn load_initial(
    vs: &nn::VarStore,
    path: &Path,
    head: &str,
    new_head: bool,
) -> Result<String, WeightsError> {
    let (loaded, fresh) = copy_from_file(vs, path, Some((head, new_head)))?;
    let mut note = format!("initial weights from {}: {loaded} tensors", path.display());
    if let Some((_, got, want)) = fresh.iter().find(|(n, _, _)| n.ends_with("weight")) {
        let why = if got == want {
            "the model's classes are not the training set's".to_string()
        } else {
            format!("the file's has {}", got.first().copied().unwrap_or(0))
        };
        note.push_str(&format!(
            "; a new head ({}) for {} classes ({why}), initialized from --seed",
            head.trim_end_matches('.'),
            want.first().copied().unwrap_or(0),
        ));
    }
    Ok(note)
}

/// Loads `model.safetensors` into the store, checking every name and shape.
pub fn load(vs: &mut nn::VarStore, path: &Path) -> Result<(), WeightsError> {
    copy_from_file(vs, path, None).map(|_| ())
}
