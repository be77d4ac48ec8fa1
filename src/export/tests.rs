use super::*;

#[test]
fn batch_and_opset_parse_with_the_fix_in_the_error() {
    assert_eq!("dynamic".parse::<Batch>(), Ok(Batch::Dynamic));
    assert_eq!("8".parse::<Batch>(), Ok(Batch::Fixed(8)));
    let e = "0".parse::<Batch>().unwrap_err();
    assert!(e.contains("--batch dynamic"), "{e}");
    assert_eq!(opset("17"), Ok(17));
    let e = opset("7").unwrap_err();
    assert!(e.contains("13..=20"), "{e}");
}

#[test]
fn names_are_checked_and_defaults_cleaned() {
    assert!(check_name("digits_resnet18-v1.2").is_ok());
    for bad in ["", ".hidden", "a/b", "a b", "ü"] {
        assert!(check_name(bad).is_err(), "{bad}");
    }
    assert_eq!(
        default_name(std::path::Path::new("/x/my model")),
        "my_model"
    );
    assert_eq!(default_name(std::path::Path::new("/")), "model");
    assert!(check_name(&default_name(std::path::Path::new("/x/.ema"))).is_ok());
}

#[test]
fn a_check_fails_naming_its_largest_difference() {
    let run = |batch, d| Difference {
        batch,
        max_abs_diff: d,
        image: 3,
        class: 5,
        top1_disagree: 0,
    };
    let mut c = Check {
        target: Target::Onnx,
        images: "synthetic".into(),
        count: 7,
        tolerance: TOLERANCE_FP32,
        runs: vec![run(1, 1e-7), run(7, 2e-6)],
    };
    assert!(c.verdict().is_ok());
    c.runs[1].max_abs_diff = 3e-3;
    let e = c.verdict().unwrap_err();
    assert!(
        e.contains("3.000e-3") && e.contains("image 3 class 5, batch 7"),
        "{e}"
    );
    c.runs[1].max_abs_diff = f64::NAN;
    assert!(c.verdict().is_err());
    c.runs[1].max_abs_diff = 0.0;
    c.runs[0].top1_disagree = 1;
    assert!(c.verdict().is_err());
}
