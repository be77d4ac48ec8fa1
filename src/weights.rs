//! Initial weights (`tchrun model init --weights`): a torchvision `state_dict` as safetensors,
//! checked name by name and shape by shape against the architecture without libtorch (the
//! launcher's pre-flight runs on login nodes). `spec` is torchvision's `state_dict` layout of
//! every architecture, computed from its block configuration.
use crate::model::{Arch, Family};
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

/// `(name, shape)` of every tensor of torchvision's `state_dict` for `arch` with `classes`
/// outputs, in torchvision's order.
pub fn spec(arch: Arch, classes: usize) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    let bn = |out: &mut Vec<(String, Vec<usize>)>, name: &str, c: usize| {
        for p in ["weight", "bias", "running_mean", "running_var"] {
            out.push((format!("{name}.{p}"), vec![c]));
        }
        out.push((format!("{name}.num_batches_tracked"), vec![]));
    };
    match arch.family() {
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

/// SHA-256 of a file, hex (recorded in `model.json` for the initial weights).
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    use sha2::Digest;
    let bytes = std::fs::read(path)?;
    let d = sha2::Sha256::digest(&bytes);
    Ok(d.iter().map(|b| format!("{b:02x}")).collect())
}

/// The classifier's tensor-name prefix: `fc.` (ResNet) or `classifier.` (DenseNet).
pub fn head_prefix(arch: Arch) -> &'static str {
    if arch.is_densenet() {
        "classifier."
    } else {
        "fc."
    }
}

/// A weights file that cannot initialize the model; the message names the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("--weights {path}: {detail}")]
    Unreadable { path: String, detail: String },
    #[error("--weights {path}: {detail}")]
    Mismatch { path: String, detail: String },
}

/// What a checked weights file holds.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightsInfo {
    /// Output classes of the file's classifier.
    pub head_classes: usize,
    pub tensors: usize,
}

fn is_float(d: Dtype) -> bool {
    matches!(d, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64)
}

/// The file's head size if it is exactly `arch`'s `state_dict` (any number of classes).
fn head_classes_if(arch: Arch, st: &SafeTensors) -> Result<usize, String> {
    let head = format!("{}weight", head_prefix(arch));
    let classes = st
        .tensor(&head)
        .map_err(|_| format!("it lacks '{head}', which {} needs", arch.name()))?
        .shape()
        .first()
        .copied()
        .unwrap_or(0);
    let want = spec(arch, classes);
    for (name, shape) in &want {
        let Ok(view) = st.tensor(name) else {
            if name.ends_with(".num_batches_tracked") {
                continue; // optional: tch does not keep it, torchvision restores 0
            }
            return Err(format!("it lacks '{name}', which {} needs", arch.name()));
        };
        if view.shape() != shape.as_slice() {
            return Err(format!(
                "tensor '{name}' has shape {:?}, {} needs {shape:?}",
                view.shape(),
                arch.name()
            ));
        }
        let float_expected = !name.ends_with(".num_batches_tracked");
        if float_expected && !is_float(view.dtype()) {
            return Err(format!(
                "tensor '{name}' is {:?}; weights must be floating point (F32, F16, BF16 or F64)",
                view.dtype()
            ));
        }
    }
    let known: std::collections::HashSet<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
    let mut names: Vec<String> = st.names().into_iter().cloned().collect();
    names.sort();
    if let Some(extra) = names.iter().find(|n| !known.contains(n.as_str())) {
        return Err(format!(
            "it holds '{extra}', which {} does not have",
            arch.name()
        ));
    }
    Ok(classes)
}

/// Checks a safetensors `state_dict` against `arch` (every name, shape and dtype; the
/// classifier may have any number of classes: a new head replaces it when the training set
/// has another). On a mismatch, says which architecture the file looks like when one fits.
pub fn check(arch: Arch, path: &Path) -> Result<WeightsInfo, WeightsError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| WeightsError::Unreadable {
        path: shown.clone(),
        detail: format!("cannot read it: {e}"),
    })?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| WeightsError::Unreadable {
        path: shown.clone(),
        detail: format!(
            "not a complete safetensors file ({e:?}): it may be truncated or another format; \
             save it with safetensors.torch.save_file(model.state_dict(), PATH)"
        ),
    })?;
    match head_classes_if(arch, &st) {
        Ok(head_classes) => Ok(WeightsInfo {
            head_classes,
            tensors: st.len(),
        }),
        Err(detail) => {
            let like = Arch::ALL
                .iter()
                .find(|a| **a != arch && head_classes_if(**a, &st).is_ok());
            let hint = match like {
                Some(a) => format!(
                    "; the file looks like a {} state_dict: use --arch {}",
                    a.name(),
                    a.name()
                ),
                None => format!("; give a torchvision {} state_dict", arch.name()),
            };
            Err(WeightsError::Mismatch {
                path: shown,
                detail: format!("{detail}{hint}"),
            })
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
    }
}
