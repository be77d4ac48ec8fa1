//! Round trips of the header and every line, panic messages, a whole log with its failure
//! record; property tests of the round trips.
use super::*;
use std::time::Duration;

fn header() -> Header {
    Header {
        host: "node-1".into(),
        rank: 3,
        local_rank: 1,
        world_size: 4,
        pid: 4242,
        device: "cuda:1".into(),
        backend: "nccl".into(),
        started_by: "Mpi".into(),
        tchrun: "0.1.0".into(),
        torch: "2.11.0".into(),
        command: "tchrun-worker train --lr 1e-3".into(),
        started: "2026-11-24T00:00:00.000Z".into(),
    }
}

#[test]
fn header_is_the_documented_text_and_round_trips() {
    let h = header();
    let text = h.write();
    assert!(text.starts_with("tchrun driver log\nhost: node-1\nrank: 3\n"));
    assert!(text.contains("\npid: 4242\n"));
    assert!(text.ends_with("started: 2026-11-24T00:00:00.000Z\n---\n"));
    let full = format!("{text}hello\n");
    let (back, body) = Header::parse(&full).expect("parses");
    assert_eq!(back, h);
    assert_eq!(body, "hello\n");
    assert_eq!(
        Header::parse("tchrun driver log\nhost: a\n"),
        Err(DriverLogError::UnterminatedHeader)
    );
    assert_eq!(Header::parse("hello\n"), Err(DriverLogError::NotADriverLog));
}

#[test]
fn lines_are_the_ones_people_read() {
    let p = Progress {
        epoch: 2,
        epochs: 3,
        iter: 5,
        iters: 9,
        loss: 1.23456,
        lr: 0.05,
        images_per_s: 812.34,
        eta: Duration::from_secs(75),
    };
    assert_eq!(
        p.write(),
        "epoch 2/3 iter 5/9 loss 1.2346 lr 5.000e-2 images/s 812.3 eta 1m 15s"
    );
    let back = Progress::parse(&p.write()).expect("parses");
    assert_eq!((back.epoch, back.iter, back.eta), (2, 5, p.eta));
    let s = TrainingStart {
        arch: "resnet18".into(),
        train_images: 100,
        valid_images: 20,
        classes: 10,
        world_size: 2,
        device: "cpu".into(),
        steps_per_epoch: 3,
        effective_lr: 0.05,
        lr: 0.025,
        lr_factor: "2".into(),
        bucket_cap_mb: 25.0,
    };
    assert!(s.write().contains("effective LR 5e-2 (--lr 2.5e-2 × 2)"));
    let sqrt = TrainingStart {
        lr_factor: "√2".into(),
        effective_lr: 0.025 * 2f64.sqrt(),
        ..s.clone()
    };
    assert!(sqrt.write().contains("(--lr 2.5e-2 × √2)"));
    assert_eq!(TrainingStart::parse(&sqrt.write()), Some(sqrt));
    assert_eq!(TrainingStart::parse(&s.write()), Some(s));
    assert_eq!(
        RankExit::parse("rank exiting with code 5"),
        Some(RankExit { code: 5 })
    );
    let r = RankSummary {
        images: 120.0,
        compute_s: 1.5,
        communication_s: 0.5,
    };
    assert_eq!(
        r.write(),
        "rank summary: images 120, compute 1.50s, communication 0.50s, images/s 60.0"
    );
    assert_eq!(RankSummary::parse(&r.write()), Some(r));
}

#[test]
fn panic_messages_lose_tchs_wrapper_and_libtorchs_backtrace() {
    let payload = r#"called `Result::unwrap()` on an `Err` value: Torch("Given input size: (1024x1x1). Calculated output size: (1024x0x0). Output size is too small\nException raised from ... (most recent call first):\nframe #0: c10::Error")"#;
    assert_eq!(
        panic_message(payload),
        "Given input size: (1024x1x1). Calculated output size: (1024x0x0). Output size is too small"
    );
    assert_eq!(
        panic_message("index out of bounds\nmore"),
        "index out of bounds"
    );
    assert_eq!(
        panic_message(r#"called `Result::unwrap()` on an `Err` value: Torch("say \"hi\"")"#),
        "say \"hi\""
    );
}

#[test]
fn a_log_is_read_with_its_failure_record() {
    let mut text = header().write();
    text.push_str("2026-11-24T00:00:01.000001Z  INFO epoch 1/1 iter 1/3 loss 2.3000 lr 1.000e-3 images/s 10.0 eta 2s\n");
    let rec = FailureRecord {
        rank: 3,
        host: "node-1".into(),
        pid: 4242,
        time: "2026-11-24T00:00:02.000Z".into(),
        kind: FailureKind::Panic,
        message: "Output size is too small".into(),
        location: Some("tensor_generated.rs:6297:10".into()),
        exit_code: None,
    };
    text.push_str(&format!("libtorch without newline{}\n", rec.write()));
    text.push_str("2026-11-24T00:00:02.000002Z ERROR rank 3 panicked: panicked at x.rs:1:1:\n");
    text.push_str("   0: std::backtrace\n");
    let mut last = rec.clone();
    last.kind = FailureKind::Internal;
    last.exit_code = Some(4);
    text.push_str(&format!("{}\n", last.write()));
    text.push_str("2026-11-24T00:00:03.000002Z  INFO rank exiting with code 4\n");
    let p = parse(&text);
    assert_eq!(p.header, Some(header()));
    assert_eq!(p.failure(), Some(&rec));
    assert_eq!(p.exit_code(), Some(4));
    assert_eq!(p.before_failure.len(), 1, "{:?}", p.before_failure);
    assert!(p.before_failure[0].contains("epoch 1/1 iter 1/3"));
    assert_eq!(
        p.first_error.as_ref().map(|e| e.0.as_str()),
        Some("2026-11-24T00:00:02.000002Z")
    );
}

#[test]
fn console_lines_split() {
    assert_eq!(
        split_console_line("node-1:0 epoch 1/2"),
        Some(("node-1", 0, "epoch 1/2"))
    );
    assert_eq!(split_console_line("plain line"), None);
    assert_eq!(console_prefix("h", 2), "h:2 ");
}

mod props {
    use super::super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    fn text() -> impl Strategy<Value = String> {
        // Anything on one value, newlines and backslashes included.
        ".{0,40}"
    }

    fn header() -> impl Strategy<Value = Header> {
        (
            (
                "[a-z0-9.-]{1,20}",
                0usize..100_000,
                0usize..64,
                1usize..100_000,
                any::<u32>(),
            ),
            (text(), text(), text(), text(), text(), text(), text()),
        )
            .prop_map(
                |((host, rank, local_rank, world_size, pid), (d, b, s, t, v, c, st))| Header {
                    host,
                    rank,
                    local_rank,
                    world_size,
                    pid,
                    device: d,
                    backend: b,
                    started_by: s,
                    tchrun: t,
                    torch: v,
                    command: c,
                    started: st,
                },
            )
    }

    fn kind() -> impl Strategy<Value = FailureKind> {
        prop::sample::select(vec![
            FailureKind::InvalidInput,
            FailureKind::Data,
            FailureKind::Diverged,
            FailureKind::OutOfMemory,
            FailureKind::Cuda,
            FailureKind::Communication,
            FailureKind::Io,
            FailureKind::Interrupted,
            FailureKind::Panic,
            FailureKind::Internal,
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn header_round_trips(h in header(), body in text()) {
            let text = format!("{}{body}", h.write());
            let (back, rest) = Header::parse(&text).expect("parses");
            prop_assert_eq!(back, h);
            prop_assert_eq!(rest, body.as_str());
        }

        #[test]
        fn progress_round_trips(
            epoch in 1u32..1000, epochs in 1u32..1000, iter in 1u64..1_000_000,
            iters in 1u64..1_000_000, loss in 0f64..1e6, lr in 1e-12f64..10.0,
            ips in 0f64..1e7, eta in 0u64..10_000_000,
        ) {
            let p = Progress { epoch, epochs, iter, iters, loss, lr, images_per_s: ips,
                               eta: Duration::from_secs(eta) };
            let line = p.write();
            let back = Progress::parse(&line).expect("parses");
            prop_assert_eq!((back.epoch, back.epochs, back.iter, back.iters, back.eta),
                            (epoch, epochs, iter, iters, p.eta));
            prop_assert_eq!(back.write(), line.clone());
            // On a console, behind its prefix.
            let console = format!("{}{line}", console_prefix("node-7", 0));
            let (host, rank, rest) = split_console_line(&console).expect("splits");
            prop_assert_eq!((host, rank), ("node-7", 0));
            prop_assert!(Progress::parse(rest).is_some());
        }

        #[test]
        fn training_start_round_trips(
            arch in "[a-z0-9_]{1,20}", train in 0usize..10_000_000, valid in 0usize..10_000_000,
            classes in 1usize..100_000, world in 1usize..100_000, cuda in any::<bool>(),
            steps in 0u64..1_000_000_000, lr in 1e-12f64..1e12, mb in 0.001f64..1e4,
        ) {
            let s = TrainingStart { arch, train_images: train, valid_images: valid, classes,
                world_size: world, device: if cuda { "cuda" } else { "cpu" }.into(),
                steps_per_epoch: steps, effective_lr: lr * world as f64, lr,
                lr_factor: world.to_string(), bucket_cap_mb: mb };
            prop_assert_eq!(TrainingStart::parse(&s.write()), Some(s));
        }

        #[test]
        fn rank_summary_and_exit_round_trip(
            images in 0u64..1_000_000_000, c in 0f64..1e7, m in 0f64..1e7, code in any::<i32>(),
        ) {
            let r = RankSummary { images: images as f64, compute_s: c, communication_s: m };
            let back = RankSummary::parse(&r.write()).expect("parses");
            prop_assert_eq!(back.images, images as f64);
            prop_assert_eq!(back.write(), r.write());
            prop_assert_eq!(RankExit::parse(&RankExit { code }.write()), Some(RankExit { code }));
        }

        #[test]
        fn failure_record_round_trips_on_one_line(
            rank in 0usize..100_000, host in text(), pid in any::<u32>(), time in text(),
            kind in kind(), message in ".{0,200}", location in proptest::option::of(text()),
            exit_code in proptest::option::of(any::<i32>()), before in "[^\n]{0,20}",
        ) {
            let r = FailureRecord { rank, host, pid, time, kind, message, location, exit_code };
            let line = format!("{before}{}", r.write());
            prop_assert!(!line.contains('\n'));
            prop_assert_eq!(FailureRecord::parse(&line), Some(r));
        }

        #[test]
        fn any_text_parses_without_panicking(text in "(?s).{0,400}") {
            let p = parse(&text);
            let _ = p.exit_code();
            let _ = panic_message(&text);
            let _ = split_console_line(&text);
        }
    }
}
