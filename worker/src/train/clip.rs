//! `--clip-grad-norm`: torch's `clip_grad_norm_(parameters, max_norm)` (L2, the same
//! operations): each gradient's norm, the norm of those norms, the factor
//! `min(max_norm / (total + 1e-6), 1)` multiplied into every gradient. Applied to the gradient
//! averaged over every rank (after the all-reduce, after AMP's unscaling), before the step, so
//! every rank clips the same gradient the same way.
use tch::Tensor;

/// Clips the gradients of `params` in place; returns the total norm before clipping (a 0-d
/// tensor), as torch does.
pub(crate) fn clip_grad_norm(params: &[(String, Tensor)], max_norm: f64) -> Option<Tensor> {
    let grads: Vec<Tensor> = params
        .iter()
        .map(|(_, p)| p.grad())
        .filter(|g| g.defined())
        .collect();
    let first = grads.first()?;
    let device = first.device();
    tch::no_grad(|| {
        let norms: Vec<Tensor> = grads.iter().map(|g| g.norm().to_device(device)).collect();
        let total = Tensor::stack(&norms, 0).norm();
        // `max_norm / (total + 1e-6)`: torch's float / tensor is reciprocal() × float.
        let coef = ((&total + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
        for g in &grads {
            let mut g = g.shallow_clone();
            let _ = g.g_mul_(&coef.to_device(g.device()));
        }
        Some(total)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// The gradients and their clipped values against torch's `clip_grad_norm_` and the loss
    /// against `F.cross_entropy(label_smoothing=..., weight=...)` on the same values, with class
    /// labels and with probabilities (`tests/python/recipe_reference.py`).
    #[test]
    fn clipping_and_label_smoothing_equal_torch() {
        let v = crate::train::recipe_reference("clip");
        let floats = |v: &serde_json::Value| -> Vec<f32> {
            v.as_array()
                .expect("array")
                .iter()
                .map(|x| x.as_f64().expect("number") as f32)
                .collect()
        };
        for case in v["clip"].as_array().expect("cases") {
            let max = case["max_norm"].as_f64().expect("max_norm");
            let params: Vec<(String, Tensor)> = case["grads"]
                .as_array()
                .expect("grads")
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    let g = Tensor::from_slice(&floats(g));
                    let p =
                        Tensor::zeros(g.size(), (Kind::Float, Device::Cpu)).set_requires_grad(true);
                    let mut grad = p.grad();
                    if !grad.defined() {
                        // Give the parameter its gradient: backward of <p, g>.
                        (&p * &g).sum(Kind::Float).backward();
                        grad = p.grad();
                    }
                    assert_eq!(
                        Vec::<f32>::try_from(&grad).expect("grad"),
                        floats(&case["grads"][i])
                    );
                    (format!("p{i}"), p)
                })
                .collect();
            let total = clip_grad_norm(&params, max)
                .expect("grads")
                .double_value(&[]);
            let want = case["total_norm"].as_f64().expect("total");
            assert!(
                (total - want).abs() <= 1e-6 * want,
                "total norm {total} vs torch {want}"
            );
            let mut sq = 0.0f64;
            for (i, (_, p)) in params.iter().enumerate() {
                let got = Vec::<f32>::try_from(&p.grad()).expect("grad");
                let want = floats(&case["clipped"][i]);
                for (a, b) in got.iter().zip(&want) {
                    assert!(
                        (a - b).abs() <= 1e-6 * b.abs().max(1e-6),
                        "{a} vs torch {b}"
                    );
                }
                sq += got.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>();
            }
            assert!(
                sq.sqrt() <= max * (1.0 + 1e-6),
                "clipped norm {} > {max}",
                sq.sqrt()
            );
        }
        for case in v["smoothing"].as_array().expect("cases") {
            let eps = case["eps"].as_f64().expect("eps");
            let n = case["classes"].as_i64().expect("classes");
            let logits = Tensor::from_slice(&floats(&case["logits"])).view([-1, n]);
            let labels: Vec<i64> = case["labels"]
                .as_array()
                .expect("labels")
                .iter()
                .map(|x| x.as_i64().expect("label"))
                .collect();
            let weight = case.get("weight").map(|w| Tensor::from_slice(&floats(w)));
            let ce = |targets: &Tensor| {
                crate::train::step::cross_entropy(&logits, targets, eps, weight.as_ref())
                    .double_value(&[])
            };
            let loss = ce(&Tensor::from_slice(&labels));
            let want = case["loss"].as_f64().expect("loss");
            assert!(
                (loss - want).abs() <= 1e-6 * want.abs(),
                "eps {eps}: {loss} vs torch {want}"
            );
            if let Some(soft) = case.get("soft") {
                let loss = ce(&Tensor::from_slice(&floats(soft)).view([-1, n]));
                let want = case["soft_loss"].as_f64().expect("soft_loss");
                assert!(
                    (loss - want).abs() <= 1e-6 * want.abs(),
                    "eps {eps}, weighted probabilities: {loss} vs torch {want}"
                );
            }
        }
    }
}
