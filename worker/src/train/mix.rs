//! `--mixup-alpha` and `--cutmix-alpha` on the training micro-batch tensor: torchvision's
//! `v2.MixUp` and `v2.CutMix` (one chosen per micro-batch when both are on, as
//! `v2.RandomChoice`), the batch mixed with itself rolled by one, the labels made one-hot and
//! mixed alike. The draw is `tchrun_data::mix_params`, seeded by the micro-batch's global
//! position, so `--global-batch-size` mixes the same micro-batches alike at any world size and
//! a resume draws what the uninterrupted run drew. The model's random layers (dropout,
//! stochastic depth) are seeded by the same global position (`seed_random_layers`).
use super::trainer::Trainer;
use tch::{Kind, Tensor};
use tchrun_data::{layer_seed, mix_params, mix_rng, Mix};

/// `v2.MixUp`/`v2.CutMix`'s transform of images `x` (N x C x H x W) and index labels `y` (N)
/// of `classes` classes with the drawn `mix`: (images, probability labels N x classes).
pub(crate) fn apply(x: &Tensor, y: &Tensor, classes: i64, mix: Mix) -> (Tensor, Tensor) {
    let labels = y.one_hot(classes).to_kind(Kind::Float);
    let mix_labels = |lam: f64| labels.roll([1], [0]) * (1.0 - lam) + &labels * lam;
    match mix {
        Mix::MixUp { lam } => (x.roll([1], [0]) * (1.0 - lam) + x * lam, mix_labels(lam)),
        Mix::CutMix {
            boxed: [x1, y1, x2, y2],
            lam,
        } => {
            let rolled = x.roll([1], [0]);
            let out = x.copy();
            if x2 > x1 && y2 > y1 {
                let (x1, y1, w, h) = (x1 as i64, y1 as i64, (x2 - x1) as i64, (y2 - y1) as i64);
                out.narrow(2, y1, h)
                    .narrow(3, x1, w)
                    .copy_(&rolled.narrow(2, y1, h).narrow(3, x1, w));
            }
            (out, mix_labels(lam))
        }
    }
}

impl Trainer<'_> {
    /// The global index of the rank's micro-batch `m` of the epoch: `GlobalCut`'s micro-batch
    /// j of step k (the same at any world size), else (rank, m) apart.
    pub(super) fn global_micro_batch(&self, m: usize) -> usize {
        let batch = self.job.params.batch_size as usize;
        match self.plan.cut {
            Some(cut) => cut.position(m * batch) / batch,
            None => m * self.world + self.rank,
        }
    }

    /// Seeds the model's random layers (dropout, stochastic depth) for the rank's micro-batch
    /// `m` of epoch `epoch` by its global position (`data::layer_seed`).
    pub(super) fn seed_random_layers(&self, epoch: u32, m: usize) {
        let global = self.global_micro_batch(m);
        tch::manual_seed(layer_seed(self.job.params.seed, u64::from(epoch), global));
    }

    /// The rank's micro-batch `m` of epoch `epoch` (counted from the epoch's start, a resume's
    /// skipped ones included) mixed as `--mixup-alpha`/`--cutmix-alpha` say; unchanged when
    /// both are 0.
    pub(super) fn mix(&self, epoch: u32, m: usize, x: Tensor, y: Tensor) -> (Tensor, Tensor) {
        let flags = &self.job.options.augment;
        if !flags.mixes() {
            return (x, y);
        }
        let global = self.global_micro_batch(m);
        let mut rng = mix_rng(self.job.params.seed, u64::from(epoch), global);
        let size = x.size();
        let (h, w) = (size[2] as usize, size[3] as usize);
        match mix_params(flags.mixup_alpha, flags.cutmix_alpha, h, w, &mut rng) {
            Some(mix) => apply(&x, &y, self.train.classes.len() as i64, mix),
            None => (x, y),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tchrun_data::cutmix_box;

    fn reference() -> serde_json::Value {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = std::process::Command::new(root.join(".venv/bin/python"))
            .arg(root.join("tests/python/augment_reference.py"))
            .arg("mix")
            .output()
            .expect("the venv's python (scripts/setup.sh)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    }

    fn floats(v: &serde_json::Value) -> Vec<f32> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_f64().expect("number") as f32)
            .collect()
    }

    fn close(what: &str, got: &Tensor, want: &[f32]) {
        let got = Vec::<f32>::try_from(&got.contiguous().view([-1])).expect("floats");
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                "{what}[{i}]: {a} vs {b}"
            );
        }
    }

    /// MixUp at torchvision's λ and CutMix at torchvision's draw (λ and centre: the same box
    /// and adjusted λ as `CutMix.make_params`) give `v2.MixUp`'s and `v2.CutMix`'s images and
    /// probability labels; the soft-label loss with label smoothing equals `F.cross_entropy`'s.
    #[test]
    fn mixup_and_cutmix_equal_torchvision_v2() {
        let v = reference();
        for case in v["cases"].as_array().expect("cases") {
            let shape: Vec<i64> = case["shape"]
                .as_array()
                .expect("shape")
                .iter()
                .map(|x| x.as_i64().expect("dim"))
                .collect();
            let classes = case["classes"].as_i64().expect("classes");
            let x = Tensor::from_slice(&floats(&case["images"])).view(shape.as_slice());
            let labels: Vec<i64> = case["labels"]
                .as_array()
                .expect("labels")
                .iter()
                .map(|l| l.as_i64().expect("label"))
                .collect();
            let y = Tensor::from_slice(&labels);
            let logits = Tensor::from_slice(&floats(&case["logits"])).view([-1, classes]);
            let lam = case["lam"].as_f64().expect("lam");
            let (mx, my) = apply(&x, &y, classes, Mix::MixUp { lam });
            close("mixup images", &mx, &floats(&case["mixup_images"]));
            close("mixup labels", &my, &floats(&case["mixup_labels"]));
            let d = &case["cutmix_draw"];
            let (h, w) = (shape[2] as usize, shape[3] as usize);
            let (boxed, lam) = cutmix_box(
                d["lam"].as_f64().expect("lam"),
                d["r_x"].as_u64().expect("r_x") as usize,
                d["r_y"].as_u64().expect("r_y") as usize,
                h,
                w,
            );
            let want: Vec<usize> = case["cutmix_box"]
                .as_array()
                .expect("box")
                .iter()
                .map(|b| b.as_u64().expect("corner") as usize)
                .collect();
            assert_eq!(boxed.to_vec(), want, "CutMix's box");
            assert_eq!(lam, case["cutmix_lam"].as_f64().expect("lam"), "adjusted λ");
            let (cx, cy) = apply(&x, &y, classes, Mix::CutMix { boxed, lam });
            close("cutmix images", &cx, &floats(&case["cutmix_images"]));
            close("cutmix labels", &cy, &floats(&case["cutmix_labels"]));
            for l in case["losses"].as_array().expect("losses") {
                let eps = l["eps"].as_f64().expect("eps");
                for (name, soft) in [("mixup", &my), ("cutmix", &cy)] {
                    let got = crate::train::step::cross_entropy(&logits, soft, eps, None)
                        .double_value(&[]);
                    let want = l[name].as_f64().expect("loss");
                    assert!(
                        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                        "{name} eps {eps}: {got} vs torch {want}"
                    );
                }
            }
        }
    }
}
