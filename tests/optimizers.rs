//! `--norm-weight-decay` and `--bias-weight-decay`: the weight decay of every parameter of
//! resnet18, densenet121, convnext_tiny (LayerNorms), efficientnet_b0 (batch norms beside
//! squeeze-and-excitation convolutions with biases), vit_b_32 (LayerNorms beside the
//! attention's `in_proj_bias`, which is no `bias`) and swin_t (LayerNorms, patch mergings'
//! reductions without bias, the relative position bias tables: torchvision's train.py gives
//! these --weight-decay unless --transformer-embedding-decay, which tchrun does not have), as tchrun groups them (`tchrun::recipe::norm_parameters` over the
//! model's variables, `RecipeFlags::weight_decay_of`), equals torchvision's `set_weight_decay`
//! on torchvision's own models (normalisation layers found by class;
//! `tests/python/recipe_reference.py decay`). The optimizers' steps are checked against
//! torch.optim in `worker/src/train/optim.rs`'s unit tests; an interrupted AdamW run resumed
//! in `tests/restart.rs`.
mod common;
use common::*;
use std::time::Duration;
use tchrun::arch::Arch;
use tchrun::recipe::{norm_parameters, RecipeFlags};

#[test]
fn weight_decay_groups_equal_torchvisions_set_weight_decay() {
    for (norm, bias) in [
        (None, None),
        (Some(0.0), None),
        (None, Some(0.0)),
        (Some(0.0), Some(2e-5)),
        (Some(3e-5), Some(0.0)),
    ] {
        let arg = |x: Option<f64>| x.map_or("none".to_string(), |v| v.to_string());
        let out = run(
            python()
                .arg(repo().join("tests/python/recipe_reference.py"))
                .arg("decay")
                .arg(arg(norm))
                .arg(arg(bias)),
            Duration::from_secs(120),
        );
        assert_eq!(out.code, Some(0), "{}", out.explain());
        let want: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
        let flags = RecipeFlags {
            norm_weight_decay: norm,
            bias_weight_decay: bias,
            ..RecipeFlags::default()
        };
        let mut distinct = std::collections::BTreeSet::new();
        for arch in [
            "resnet18",
            "densenet121",
            "convnext_tiny",
            "efficientnet_b0",
            "vit_b_32",
            "swin_t",
        ] {
            let a = Arch::from_name(arch).expect("architecture");
            let spec = tchrun::weights::spec(a, 3);
            let names: Vec<&str> = spec.iter().map(|(n, _)| n.as_str()).collect();
            let dims: Vec<(&str, usize)> =
                spec.iter().map(|(n, s)| (n.as_str(), s.len())).collect();
            let in_norm = norm_parameters(&dims);
            let want = want[arch].as_object().expect("decays");
            let trainable: Vec<&str> = names
                .iter()
                .copied()
                .filter(|n| want.contains_key(*n))
                .collect();
            // Every trainable parameter of torchvision's model is in the layout, and only
            // buffers are left over.
            assert_eq!(trainable.len(), want.len(), "{arch}");
            for n in &names {
                let leaf = n.rsplit('.').next().unwrap_or(n);
                let buffer = matches!(
                    leaf,
                    "running_mean"
                        | "running_var"
                        | "num_batches_tracked"
                        | "relative_position_index"
                );
                assert_eq!(want.contains_key(*n), !buffer, "{arch}: {n}");
            }
            for n in trainable {
                let got = flags.weight_decay_of(1e-4, n, in_norm.contains(n));
                let w = want[n].as_f64().expect("decay");
                assert_eq!(
                    got, w,
                    "{arch} {n} with --norm-weight-decay {norm:?} --bias-weight-decay {bias:?}"
                );
                distinct.insert(got.to_bits());
            }
        }
        // The flags given make their own groups.
        let groups = 1
            + usize::from(norm.is_some_and(|x| x != 1e-4))
            + usize::from(bias.is_some_and(|x| x != 1e-4 && Some(x) != norm));
        assert_eq!(distinct.len(), groups, "{norm:?} {bias:?}");
    }
}
