//! Initial weights (`tchrun model init --weights`): a torchvision `state_dict` as safetensors
//! or as a `torch.save` file (`.pth`/`.pt`, read by `tchrun_pth`), checked name by name and
//! shape by shape against the architecture without libtorch (the launcher's pre-flight runs on
//! login nodes). `spec` is torchvision's `state_dict` layout of
//! every architecture, computed from its block configuration (the newer families' in a file
//! each: `weights/convnext.rs`, `weights/mobilenet.rs`, `weights/regnet.rs`,
//! `weights/swin.rs`).
use crate::{swin::SwinShape, vit, Arch, EfficientnetLayout, Family};

mod convnext;
mod finite;
mod layers;
mod mobilenet;
mod regnet;
mod swin;
pub use swin::RELATIVE_POSITION_INDEX;

use layers::{bn, conv_norm};

use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::Path;

pub use finite::first_non_finite;

/// `(name, shape)` of every tensor of torchvision's `state_dict` for `arch` with `classes`
/// outputs, in torchvision's order (a ViT at torchvision's default image size, 224: `spec_at`).
pub fn spec(arch: Arch, classes: usize) -> Vec<(String, Vec<usize>)> {
    spec_at(arch, classes, vit::DEFAULT_IMAGE_SIZE)
}

/// `spec` for a model built for `image_size` pixels (only a ViT's tensors depend on it).
pub fn spec_at(arch: Arch, classes: usize, image_size: u32) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    match arch.family() {
        f @ Family::Vit { .. } => {
            let shape = vit::VitShape::of(f).expect("a ViT");
            vit::spec(&mut out, shape, classes, image_size)
        }
        Family::Convnext { dims, blocks, .. } => {
            convnext::convnext_spec(&mut out, dims, blocks, classes)
        }
        Family::Efficientnet { table, .. } => efficientnet_spec(&mut out, &table.layout(), classes),
        Family::Mobilenet { table } => {
            mobilenet::mobilenet_spec(&mut out, &table.layout(), classes)
        }
        Family::Regnet { params } => regnet::regnet_spec(&mut out, &params.layout(), classes),
        f @ Family::Swin { .. } => {
            swin::swin_spec(&mut out, SwinShape::of(f).expect("a Swin"), classes)
        }
        Family::Densenet {
            init_features: c0,
            growth,
            blocks,
        } => {
            let inter = 4 * growth;
            out.push(("features.conv0.weight".into(), vec![c0, 3, 7, 7]));
            bn(&mut out, "features.norm0", c0);
            let mut nf = c0;
            for (b, &layers) in blocks.iter().enumerate() {
                for l in 0..layers {
                    let p = format!("features.denseblock{}.denselayer{}", b + 1, l + 1);
                    let cin = nf + l * growth;
                    bn(&mut out, &format!("{p}.norm1"), cin);
                    out.push((format!("{p}.conv1.weight"), vec![inter, cin, 1, 1]));
                    bn(&mut out, &format!("{p}.norm2"), inter);
                    out.push((format!("{p}.conv2.weight"), vec![growth, inter, 3, 3]));
                }
                nf += layers * growth;
                if b + 1 < blocks.len() {
                    let p = format!("features.transition{}", b + 1);
                    bn(&mut out, &format!("{p}.norm"), nf);
                    out.push((format!("{p}.conv.weight"), vec![nf / 2, nf, 1, 1]));
                    nf /= 2;
                }
            }
            bn(&mut out, "features.norm5", nf);
            out.push(("classifier.weight".into(), vec![classes, nf]));
            out.push(("classifier.bias".into(), vec![classes]));
        }
        Family::Resnet {
            bottleneck,
            blocks,
            groups,
            width_per_group,
        } => {
            let expansion = if bottleneck { 4 } else { 1 };
            out.push(("conv1.weight".into(), vec![64, 3, 7, 7]));
            bn(&mut out, "bn1", 64);
            let mut inplanes = 64;
            for (s, &n) in blocks.iter().enumerate() {
                let planes = 64 << s;
                let width = planes * width_per_group / 64 * groups;
                for j in 0..n {
                    let p = format!("layer{}.{j}", s + 1);
                    if bottleneck {
                        out.push((format!("{p}.conv1.weight"), vec![width, inplanes, 1, 1]));
                        bn(&mut out, &format!("{p}.bn1"), width);
                        out.push((
                            format!("{p}.conv2.weight"),
                            vec![width, width / groups, 3, 3],
                        ));
                        bn(&mut out, &format!("{p}.bn2"), width);
                        out.push((format!("{p}.conv3.weight"), vec![planes * 4, width, 1, 1]));
                        bn(&mut out, &format!("{p}.bn3"), planes * 4);
                    } else {
                        out.push((format!("{p}.conv1.weight"), vec![planes, inplanes, 3, 3]));
                        bn(&mut out, &format!("{p}.bn1"), planes);
                        out.push((format!("{p}.conv2.weight"), vec![planes, planes, 3, 3]));
                        bn(&mut out, &format!("{p}.bn2"), planes);
                    }
                    let stride = if s > 0 && j == 0 { 2 } else { 1 };
                    if j == 0 && (stride != 1 || inplanes != planes * expansion) {
                        out.push((
                            format!("{p}.downsample.0.weight"),
                            vec![planes * expansion, inplanes, 1, 1],
                        ));
                        bn(&mut out, &format!("{p}.downsample.1"), planes * expansion);
                    }
                    inplanes = planes * expansion;
                }
            }
            out.push(("fc.weight".into(), vec![classes, 512 * expansion]));
            out.push(("fc.bias".into(), vec![classes]));
        }
    }
    out
}

/// torchvision's EfficientNet: every `Conv2dNormActivation` is `.0` a convolution without bias
/// and `.1` its batch norm; `features.0` the stem, `features.1` ... the stages, each block's
/// layers under `block.K` in order (MBConv: the 1x1 expansion when it expands, the depthwise
/// convolution, the squeeze-and-excitation `fc1`/`fc2` with biases, the 1x1 projection;
/// FusedMBConv: the k x k expansion and the 1x1 projection, or one k x k convolution), the last
/// 1x1 convolution after them; `classifier.1` the Linear head (`classifier.0` is the dropout).
fn efficientnet_spec(
    out: &mut Vec<(String, Vec<usize>)>,
    layout: &EfficientnetLayout,
    classes: usize,
) {
    conv_norm(out, "features.0", [layout.stem, 3, 3]);
    for (s, stage) in layout.stages.iter().enumerate() {
        for (j, b) in stage.iter().enumerate() {
            let p = format!("features.{}.{j}.block", s + 1);
            let mut layers: Vec<[usize; 3]> = Vec::with_capacity(4);
            if b.fused && b.expands() {
                layers.extend([[b.expanded, b.c_in, b.kernel], [b.c_out, b.expanded, 1]]);
            } else if b.fused {
                layers.push([b.c_out, b.c_in, b.kernel]);
            } else {
                if b.expands() {
                    layers.push([b.expanded, b.c_in, 1]);
                }
                layers.push([b.expanded, 1, b.kernel]);
            }
            for (k, &c) in layers.iter().enumerate() {
                conv_norm(out, &format!("{p}.{k}"), c);
            }
            if !b.fused {
                let se = format!("{p}.{}", layers.len());
                out.push((
                    format!("{se}.fc1.weight"),
                    vec![b.squeeze, b.expanded, 1, 1],
                ));
                out.push((format!("{se}.fc1.bias"), vec![b.squeeze]));
                out.push((
                    format!("{se}.fc2.weight"),
                    vec![b.expanded, b.squeeze, 1, 1],
                ));
                out.push((format!("{se}.fc2.bias"), vec![b.expanded]));
                let project = format!("{p}.{}", layers.len() + 1);
                conv_norm(out, &project, [b.c_out, b.expanded, 1]);
            }
        }
    }
    let c_in = layout
        .stages
        .last()
        .and_then(|s| s.last())
        .map_or(0, |b| b.c_out);
    let last = format!("features.{}", layout.stages.len() + 1);
    conv_norm(out, &last, [layout.last, c_in, 1]);
    out.push(("classifier.1.weight".into(), vec![classes, layout.last]));
    out.push(("classifier.1.bias".into(), vec![classes]));
}

/// SHA-256 of a file, hex (recorded in `model.json` for the initial weights).
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    Ok(sha256_hex(&std::fs::read(path)?))
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(bytes);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The classifier's tensor-name prefix: the Linear a new head replaces, `fc.` (ResNet,
/// RegNet), `classifier.` (DenseNet), `classifier.2.` (ConvNeXt: `classifier.0` is its last
/// LayerNorm2d, part of the backbone), `classifier.1.` (EfficientNet: `classifier.0` is the
/// dropout), `heads.head.` (ViT), `classifier.3.` (MobileNetV3: `classifier.0` is its hidden
/// Linear, part of the backbone) or `head.` (Swin).
pub fn head_prefix(arch: Arch) -> &'static str {
    match arch.family() {
        Family::Swin { .. } => "head.",
        Family::Vit { .. } => "heads.head.",
        Family::Resnet { .. } | Family::Regnet { .. } => "fc.",
        Family::Densenet { .. } => "classifier.",
        Family::Convnext { .. } => "classifier.2.",
        Family::Efficientnet { .. } => "classifier.1.",
        Family::Mobilenet { .. } => "classifier.3.",
    }
}

/// A weights file that cannot initialize the model; the message names the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("--weights {path}: {detail}")]
    Unreadable { path: String, detail: String },
    #[error("--weights {path}: {detail}")]
    Mismatch { path: String, detail: String },
    /// A `.pth` that is not a readable state_dict (its message starts with the path).
    #[error("--weights {0}")]
    Pth(#[from] tchrun_pth::PthError),
}

/// What a checked weights file holds.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightsInfo {
    /// Output classes of the file's classifier.
    pub head_classes: usize,
    pub tensors: usize,
    pub format: Format,
    /// ViT: the image size the file's model was built for (its positional embedding's grid
    /// times the patch).
    pub image_size: Option<u32>,
}

/// The format of a weights file, told by its content (not its name); `model.json` records it
/// by [`Format::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Safetensors,
    /// `torch.save`'s zip archive (`.pth`, `.pt`).
    Pth,
}

impl Format {
    /// As `model.json` records it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Safetensors => "safetensors",
            Format::Pth => "pth",
        }
    }
}

/// A checked weights file, ready for the model directory.
pub struct Loaded {
    pub info: WeightsInfo,
    /// The weights as safetensors: the file itself, or the `.pth` converted.
    pub safetensors: Vec<u8>,
    /// SHA-256 of the file as given (hex).
    pub sha256: String,
}

fn is_float(d: Dtype) -> bool {
    matches!(d, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64)
}

/// Name -> (dtype, shape) of every tensor of a file, whatever its format.
type Listing = HashMap<String, (Dtype, Vec<usize>)>;

/// The file's head size (and a ViT's image size) if it is exactly `arch`'s `state_dict` (any
/// number of classes; a ViT at any whole grid of patches).
fn head_classes_if(arch: Arch, st: &Listing) -> Result<(usize, Option<u32>), String> {
    let head = format!("{}weight", head_prefix(arch));
    let classes = st
        .get(&head)
        .ok_or_else(|| format!("it lacks '{head}', which {} needs", arch.name()))?
        .1
        .first()
        .copied()
        .unwrap_or(0);
    let pos = st.get(vit::POS_EMBEDDING).map(|(_, s)| s.as_slice());
    let image_size = match arch.patch_size() {
        Some(p) => vit::checkpoint_image_size(p as usize, pos)?,
        None => None,
    };
    let want = spec_at(arch, classes, image_size.unwrap_or(vit::DEFAULT_IMAGE_SIZE));
    for (name, shape) in &want {
        let Some((dtype, have)) = st.get(name) else {
            if name.ends_with(".num_batches_tracked") {
                continue; // optional: tch does not keep it, torchvision restores 0
            }
            return Err(format!("it lacks '{name}', which {} needs", arch.name()));
        };
        if have != shape {
            return Err(format!(
                "tensor '{name}' has shape {have:?}, {} needs {shape:?}",
                arch.name()
            ));
        }
        // Integer buffers: batch norm's counter, Swin's relative position index.
        let float_expected =
            !name.ends_with(".num_batches_tracked") && !name.ends_with(RELATIVE_POSITION_INDEX);
        let index = name.ends_with(RELATIVE_POSITION_INDEX);
        if index && (is_float(*dtype) || *dtype == Dtype::BOOL) {
            return Err(format!(
                "tensor '{name}' is {dtype:?}; torchvision keeps it as an integer buffer (I64)"
            ));
        }
        if float_expected && !is_float(*dtype) {
            return Err(format!(
                "tensor '{name}' is {dtype:?}; weights must be floating point (F32, F16, BF16 or F64)"
            ));
        }
    }
    let known: std::collections::HashSet<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
    let mut names: Vec<&String> = st.keys().collect();
    names.sort();
    if let Some(extra) = names.iter().find(|n| !known.contains(n.as_str())) {
        return Err(format!(
            "it holds '{extra}', which {} does not have",
            arch.name()
        ));
    }
    Ok((classes, image_size))
}

/// A weights file's tensors: the file's bytes, its listing, and a `.pth`'s state_dict.
fn read_weights(
    path: &Path,
) -> Result<(Vec<u8>, Listing, Option<tchrun_pth::StateDict>), WeightsError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| WeightsError::Unreadable {
        path: shown.clone(),
        detail: format!("cannot read it: {e}"),
    })?;
    // torch.save's zip archive or a legacy torch file; else safetensors, whatever the name
    // (a .pth/.pt that is neither is reported as a torch file).
    let torch_name = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("pth" | "pt")
    );
    let st = if tchrun_pth::is_zip(&bytes) || tchrun_pth::is_legacy(&bytes) {
        None
    } else {
        match SafeTensors::deserialize(&bytes) {
            Ok(st) => Some(st),
            Err(_) if torch_name => None,
            Err(e) => {
                return Err(WeightsError::Unreadable {
                    path: shown,
                    detail: format!(
                        "not a complete safetensors file ({e:?}): it may be truncated or another \
                         format; save it with safetensors.torch.save_file(model.state_dict(), \
                         PATH)"
                    ),
                })
            }
        }
    };
    let (listing, sd) = match st {
        Some(st) => (
            st.tensors()
                .into_iter()
                .map(|(n, v)| (n, (v.dtype(), v.shape().to_vec())))
                .collect(),
            None,
        ),
        None => {
            let sd = tchrun_pth::read_bytes(&bytes, &shown)?;
            let listing = sd
                .tensors
                .iter()
                .map(|t| (t.name.clone(), (t.dtype, t.shape.clone())))
                .collect();
            (listing, Some(sd))
        }
    };
    Ok((bytes, listing, sd))
}

/// Checks `listing` against `arch`; on a mismatch, says which architecture it looks like.
fn check_listing(
    arch: Arch,
    path: &Path,
    st: &Listing,
    format: Format,
) -> Result<WeightsInfo, WeightsError> {
    match head_classes_if(arch, st) {
        Ok((head_classes, image_size)) => Ok(WeightsInfo {
            head_classes,
            tensors: st.len(),
            format,
            image_size,
        }),
        Err(detail) => {
            let like = Arch::ALL
                .iter()
                .find(|a| **a != arch && head_classes_if(**a, st).is_ok());
            let hint = match like {
                Some(a) => format!(
                    "; the file looks like a {} state_dict: use --arch {}",
                    a.name(),
                    a.name()
                ),
                None if !st.is_empty() && st.keys().all(|n| n.starts_with("module.")) => {
                    "; every name starts with 'module.' (saved from DataParallel or \
                     DistributedDataParallel): save model.module.state_dict() instead, or strip \
                     the prefix: {k.removeprefix('module.'): v for k, v in sd.items()}"
                        .to_string()
                }
                None => format!("; give a torchvision {} state_dict", arch.name()),
            };
            Err(WeightsError::Mismatch {
                path: path.display().to_string(),
                detail: format!("{detail}{hint}"),
            })
        }
    }
}

/// Checks a `state_dict` file against `arch` (every name, shape and dtype; the classifier may
/// have any number of classes: a new head replaces it when the training set has another). The
/// file is safetensors or what `torch.save` writes (`.pth`/`.pt`, read without running
/// anything in it: `tchrun_pth`). On a mismatch, says which architecture the file looks like
/// when one fits.
pub fn check(arch: Arch, path: &Path) -> Result<WeightsInfo, WeightsError> {
    let (_, listing, sd) = read_weights(path)?;
    let format = if sd.is_some() {
        Format::Pth
    } else {
        Format::Safetensors
    };
    check_listing(arch, path, &listing, format)
}

/// `check`, and the weights as safetensors (a `.pth` converted) with the file's SHA-256, for a
/// model of `input_size` pixels: a ViT checkpoint built for another size has its positional
/// embedding resampled as torchvision's `interpolate_embeddings` does (`vit::interpolate`).
pub fn load(arch: Arch, path: &Path, input_size: u32) -> Result<Loaded, WeightsError> {
    let (bytes, listing, sd) = read_weights(path)?;
    let format = if sd.is_some() {
        Format::Pth
    } else {
        Format::Safetensors
    };
    let info = check_listing(arch, path, &listing, format)?;
    let sha256 = sha256_hex(&bytes);
    let unreadable = |detail| WeightsError::Unreadable {
        path: path.display().to_string(),
        detail,
    };
    let mut safetensors = match sd {
        None => bytes,
        Some(sd) => sd.to_safetensors().map_err(unreadable)?,
    };
    if let (Some(p), Some(s)) = (arch.patch_size(), info.image_size) {
        if s != input_size {
            let grid = (input_size / p) as usize;
            safetensors = vit::resample_safetensors(&safetensors, grid).map_err(unreadable)?;
        }
    }
    if let Some(detail) = first_non_finite(&safetensors).map_err(unreadable)? {
        return Err(unreadable(detail));
    }
    Ok(Loaded {
        info,
        safetensors,
        sha256,
    })
}

/// The tensors (name, dtype, shape) a safetensors file declares, read from its header alone
/// (the launcher checks a model directory without reading its weights), with the file's size
/// checked against the header: a truncated file, or one that is not safetensors, is refused
/// here with the words "truncated or not a safetensors file".
pub fn safetensors_listing(path: &Path) -> Result<Listing, String> {
    use std::io::Read;
    const MAX_HEADER: u64 = 100_000_000; // the safetensors crate's limit
    let bad = |why: String| {
        format!(
            "truncated or not a safetensors file ({why}); copy it again from the training \
             output (a complete model directory has model.json and model.safetensors written \
             by `tchrun train`)"
        )
    };
    let mut f = std::fs::File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    let len = f
        .metadata()
        .map_err(|e| format!("cannot read it: {e}"))?
        .len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n)
        .map_err(|_| bad(format!("{len} bytes, shorter than a header")))?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER || n.checked_add(8).is_none_or(|h| h > len) {
        return Err(bad(format!("a header of {n} bytes in a file of {len}")));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header)
        .map_err(|e| bad(format!("cannot read its header: {e}")))?;
    let raw: HashMap<String, serde_json::Value> = serde_json::from_slice(&header)
        .map_err(|e| bad(format!("its header is not safetensors JSON: {e}")))?;
    let mut listing = Listing::new();
    let mut end = 0u64;
    for (name, v) in raw {
        if name == "__metadata__" {
            continue;
        }
        let info: safetensors::tensor::TensorInfo = serde_json::from_value(v).map_err(|e| {
            bad(format!(
                "tensor '{name}' is not described as safetensors: {e}"
            ))
        })?;
        end = end.max(info.data_offsets.1 as u64);
        listing.insert(name, (info.dtype, info.shape));
    }
    let want = 8 + n + end;
    if want != len {
        return Err(bad(format!(
            "its header describes {want} bytes, the file has {len}"
        )));
    }
    Ok(listing)
}

/// Checks a model directory's `model.safetensors` against its `model.json` (architecture, a
/// ViT's `input_size`, a trained model's number of `classes`): every tensor the architecture
/// has, none more, every shape, as `load_state_dict(strict=True)`. On a mismatch, names the
/// architecture the file does fit, when one does. Reads the header only.
pub fn check_model_weights(
    arch: Arch,
    classes: Option<usize>,
    input_size: u32,
    path: &Path,
) -> Result<(), String> {
    let st = safetensors_listing(path)?;
    match head_classes_if(arch, &st) {
        Ok((_, Some(s))) if s != input_size => Err(format!(
            "its positional embedding is for {s}x{s} images but model.json's input_size is \
             {input_size}; copy model.json and model.safetensors from the same training output, \
             or make the model again with `tchrun model init --input-size {input_size} --weights`"
        )),
        Ok((found, _)) if classes.is_some_and(|n| n != found) => Err(format!(
            "its classifier has {found} output(s) but model.json names {} class(es); the \
             weights are not this model's: copy model.json and model.safetensors from the same \
             training output",
            classes.unwrap_or_default()
        )),
        Ok(_) => Ok(()),
        Err(detail) => {
            let like = Arch::ALL
                .iter()
                .find(|a| **a != arch && head_classes_if(**a, &st).is_ok());
            let hint = match like {
                Some(a) => format!(
                    "; the file is a {} state_dict, model.json says {}: copy model.json and \
                     model.safetensors from the same training output",
                    a.name(),
                    arch.name()
                ),
                None => format!(
                    "; it is not a {} state_dict: copy model.json and model.safetensors from \
                     the same training output",
                    arch.name()
                ),
            };
            Err(format!("weights do not match model.json: {detail}{hint}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_sizes_match_torchvision_parameter_counts() {
        // torchvision: sum(p.numel() for p in model.parameters()) with 1000 classes.
        let params = |arch: Arch| -> usize {
            spec(arch, 1000)
                .iter()
                .filter(|(n, _)| !n.contains("running_") && !n.ends_with("num_batches_tracked"))
                .map(|(_, s)| s.iter().product::<usize>())
                .sum()
        };
        assert_eq!(params(Arch::Resnet18), 11_689_512);
        assert_eq!(params(Arch::Resnet50), 25_557_032);
        assert_eq!(params(Arch::Resnet152), 60_192_808);
        assert_eq!(params(Arch::Resnext50_32x4d), 25_028_904);
        assert_eq!(params(Arch::Resnext101_32x8d), 88_791_336);
        assert_eq!(params(Arch::Resnext101_64x4d), 83_455_272);
        assert_eq!(params(Arch::WideResnet50_2), 68_883_240);
        assert_eq!(params(Arch::WideResnet101_2), 126_886_696);
        assert_eq!(params(Arch::Densenet121), 7_978_856);
        assert_eq!(params(Arch::Densenet161), 28_681_000);
        assert_eq!(params(Arch::Densenet201), 20_013_928);
        assert_eq!(params(Arch::ConvnextTiny), 28_589_128);
        assert_eq!(params(Arch::ConvnextSmall), 50_223_688);
        assert_eq!(params(Arch::ConvnextBase), 88_591_464);
        assert_eq!(params(Arch::ConvnextLarge), 197_767_336);
        assert_eq!(params(Arch::EfficientnetB0), 5_288_548);
        assert_eq!(params(Arch::EfficientnetB1), 7_794_184);
        assert_eq!(params(Arch::EfficientnetB2), 9_109_994);
        assert_eq!(params(Arch::EfficientnetB3), 12_233_232);
        assert_eq!(params(Arch::EfficientnetB4), 19_341_616);
        assert_eq!(params(Arch::EfficientnetB5), 30_389_784);
        assert_eq!(params(Arch::EfficientnetB6), 43_040_704);
        assert_eq!(params(Arch::EfficientnetB7), 66_347_960);
        assert_eq!(params(Arch::EfficientnetV2S), 21_458_488);
        assert_eq!(params(Arch::EfficientnetV2M), 54_139_356);
        assert_eq!(params(Arch::EfficientnetV2L), 118_515_272);
        assert_eq!(params(Arch::VitB16), 86_567_656);
        assert_eq!(params(Arch::VitB32), 88_224_232);
        assert_eq!(params(Arch::VitL16), 304_326_632);
        assert_eq!(params(Arch::MobilenetV3Small), 2_542_856);
        assert_eq!(params(Arch::MobilenetV3Large), 5_483_032);
        assert_eq!(params(Arch::RegnetY400mf), 4_344_144);
        assert_eq!(params(Arch::RegnetY800mf), 6_432_512);
        assert_eq!(params(Arch::RegnetY1_6gf), 11_202_430);
        assert_eq!(params(Arch::RegnetY3_2gf), 19_436_338);
        assert_eq!(params(Arch::RegnetY8gf), 39_381_472);
        assert_eq!(params(Arch::RegnetY16gf), 83_590_140);
        assert_eq!(params(Arch::RegnetY32gf), 145_046_770);
        assert_eq!(params(Arch::RegnetX400mf), 5_495_976);
        assert_eq!(params(Arch::RegnetX800mf), 7_259_656);
        assert_eq!(params(Arch::RegnetX1_6gf), 9_190_136);
        assert_eq!(params(Arch::RegnetX3_2gf), 15_296_552);
        assert_eq!(params(Arch::RegnetX8gf), 39_572_648);
        assert_eq!(params(Arch::RegnetX16gf), 54_278_536);
        assert_eq!(params(Arch::RegnetX32gf), 107_811_560);
        // Swin: its relative_position_index buffers are no parameters.
        let swin = |arch| {
            params(arch)
                - 2401
                    * spec(arch, 1000)
                        .iter()
                        .filter(|(n, _)| n.ends_with(RELATIVE_POSITION_INDEX))
                        .count()
        };
        assert_eq!(swin(Arch::SwinT), 28_288_354);
        assert_eq!(swin(Arch::SwinS), 49_606_258);
        assert_eq!(swin(Arch::SwinB), 87_768_224);
    }

    /// A Swin `state_dict`'s `relative_position_index` buffers are integers (torchvision's
    /// int64); the same listing with one of them in float is refused, naming it.
    #[test]
    fn swin_position_indexes_must_be_integers() {
        let listing = |float_index: bool| -> Listing {
            spec(Arch::SwinT, 10)
                .into_iter()
                .map(|(n, s)| {
                    let int = n.ends_with(RELATIVE_POSITION_INDEX) && !float_index;
                    (n, (if int { Dtype::I64 } else { Dtype::F32 }, s))
                })
                .collect()
        };
        assert_eq!(
            head_classes_if(Arch::SwinT, &listing(false)),
            Ok((10, None))
        );
        let err = head_classes_if(Arch::SwinT, &listing(true)).unwrap_err();
        assert!(
            err.contains(".relative_position_index' is F32") && err.contains("integer"),
            "{err}"
        );
    }
}
