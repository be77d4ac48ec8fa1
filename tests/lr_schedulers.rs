//! `--lr-scheduler cosineannealinglr|steplr|exponentiallr` with `--lr-warmup-method` and
//! `--lr-warmup-decay`: the LR of every epoch equals torch.optim.lr_scheduler's, built as
//! torchvision's references/classification/train.py builds it (SequentialLR of
//! LinearLR/ConstantLR and the main scheduler, milestones [warmup epochs]; the main scheduler
//! alone without warmup), for several configurations (`tests/python/recipe_reference.py`).
//! tchrun's per-step schedule holds that LR through every step of the epoch, whatever the
//! steps per epoch (so the world size and `--global-batch-size` do not change it).
mod common;
use common::*;
use std::time::Duration;
use tchrun::recipe::{LrScheduler, RecipeFlags, WarmupMethod};
use tchrun::schedule::LrSchedule;

#[test]
fn epoch_lrs_equal_torch_lr_scheduler() {
    let mut configs = Vec::new();
    let mut cases = Vec::new();
    for (sched, name) in [
        (LrScheduler::Cosineannealinglr, "cosineannealinglr"),
        (LrScheduler::Steplr, "steplr"),
        (LrScheduler::Exponentiallr, "exponentiallr"),
    ] {
        for (method, mname) in [
            (WarmupMethod::Linear, "linear"),
            (WarmupMethod::Constant, "constant"),
        ] {
            for (lr, epochs, warmup, decay, gamma, step, lr_min) in [
                (0.5, 90u32, 5u32, 0.01, 0.1, 30u32, 0.0),
                (0.1, 600, 5, 0.01, 0.98, 7, 1e-6),
                (0.8, 12, 0, 0.01, 0.5, 3, 0.0),
                (0.02, 7, 6, 0.3, 0.9, 1, 1e-3),
                (3.0, 40, 1, 1.0, 0.7, 4, 0.01),
            ] {
                configs.push(serde_json::json!({
                    "lr": lr, "epochs": epochs, "warmup_epochs": warmup, "scheduler": name,
                    "warmup_method": mname, "decay": decay, "gamma": gamma,
                    "step_size": step, "lr_min": lr_min,
                }));
                let r = RecipeFlags {
                    lr_scheduler: sched,
                    lr_warmup_method: method,
                    lr_warmup_decay: Some(decay),
                    lr_gamma: gamma,
                    lr_step_size: step,
                    lr_min,
                    ..RecipeFlags::default()
                };
                cases.push((r, lr, epochs, warmup));
            }
        }
    }
    let out = run(
        python()
            .arg(repo().join("tests/python/recipe_reference.py"))
            .arg("lr")
            .arg(serde_json::Value::Array(configs.clone()).to_string()),
        Duration::from_secs(120),
    );
    assert_eq!(out.code, Some(0), "{}", out.explain());
    let want: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).expect("json");
    let mut exact = 0;
    for ((r, lr, epochs, warmup), (cfg, w)) in cases.iter().zip(configs.iter().zip(&want)) {
        let want: Vec<f64> = w["lrs"]
            .as_array()
            .expect("lrs")
            .iter()
            .map(|x| x.as_f64().expect("lr"))
            .collect();
        let got = tchrun::epoch_lr::epoch_lrs(*lr, *epochs, *warmup, r);
        assert_eq!(got.len(), want.len(), "{cfg}");
        for (e, (g, t)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - t).abs() <= 1e-12 * t.abs(),
                "{cfg}: epoch {e}: tchrun {g}, torch {t}"
            );
            exact += usize::from(g == t);
        }
        // Per optimizer step: the epoch's LR at each of its steps, for any steps per epoch.
        for spe in [1u64, 7] {
            let s = LrSchedule::with_peak(*lr, *warmup, *epochs, spe, 1.0)
                .of_recipe(r, *warmup, *epochs, spe);
            for step in 0..u64::from(*epochs) * spe {
                assert_eq!(s.lr(step), got[(step / spe) as usize], "{cfg}: step {step}");
            }
        }
    }
    let total: usize = want
        .iter()
        .map(|w| w["lrs"].as_array().map_or(0, |a| a.len()))
        .sum();
    // torch's own arithmetic: every value bit for bit.
    assert_eq!(exact, total, "{exact} of {total} epoch LRs bit-identical");
}

#[test]
fn poly_keeps_its_schedule_and_warmup_flags_apply_per_step() {
    // The default recipe is the old schedule, bit for bit.
    let old = LrSchedule::with_peak(0.4, 2, 5, 10, 1.0);
    let same = old.clone().of_recipe(&RecipeFlags::default(), 2, 5, 10);
    assert!((0..60).all(|s| old.lr(s) == same.lr(s)));
    // Poly with torch's warmup laws, per step.
    let lin = old.clone().of_recipe(
        &RecipeFlags {
            lr_warmup_decay: Some(0.01),
            ..RecipeFlags::default()
        },
        2,
        5,
        10,
    );
    assert_eq!(lin.lr(0), 0.4 * 0.01);
    assert!((lin.lr(10) - 0.4 * (0.01 + 0.99 * 0.5)).abs() < 1e-15);
    assert_eq!(lin.lr(20), old.lr(20));
    let con = old.clone().of_recipe(
        &RecipeFlags {
            lr_warmup_method: WarmupMethod::Constant,
            ..RecipeFlags::default()
        },
        2,
        5,
        10,
    );
    assert!((0..20).all(|s| con.lr(s) == 0.4 * 0.01));
    assert!((20..60).all(|s| con.lr(s) == old.lr(s)));
}
