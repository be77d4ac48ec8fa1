use super::*;
use std::collections::BTreeSet;
use std::time::Duration;
use tchrun::job_record::heartbeat::Phase;
use tchrun::job_record::status::{CheckpointMark, JobEnd, RankStatus, Shares, SlowKind, Straggler};

fn at(s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(s)
}

fn rfc(s: u64) -> String {
    humantime::format_rfc3339_millis(at(s)).to_string()
}

fn running() -> JobStatus {
    let mut s = JobStatus::starting(1, 2);
    s.state = JobState::Training;
    s.started = Some(rfc(1_000));
    (s.epoch, s.epochs, s.step, s.total_steps) = (2, 3, 17, 30);
    s.images_per_s = Some(123.5);
    s.loss = Some(0.25);
    s.lr = Some(0.001);
    s.eta_job_s = Some(40.0);
    s.eta_epoch_s = Some(4.0);
    s.last_step = Some(rfc(1_090));
    s.last_checkpoint = Some(CheckpointMark {
        step: 10,
        time: rfc(1_060),
    });
    for rank in 0..2 {
        s.ranks.push(RankStatus {
            rank,
            host: format!("node{rank}"),
            device: "cpu".into(),
            phase: Some(if rank == 0 {
                Phase::Forward
            } else {
                Phase::GradientAllReduce
            }),
            step: 17,
            idle_s: Some(0.5),
            shares: Some(Shares {
                data_wait: 0.1,
                compute: 0.7,
                comm: 0.2,
            }),
            rss_bytes: Some(1 << 30),
            gpu_bytes: None,
        });
    }
    s.stragglers.push(Straggler {
        rank: 1,
        host: "node1".into(),
        device: "cpu".into(),
        kind: SlowKind::Compute,
        factor: 1.6,
        value: 0.2,
        median: 0.1,
        steps: 9,
        since_step: 8,
    });
    s
}

/// The samples of `text` as `name{labels}` → value.
fn samples(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("a sample has a value");
            (series.to_string(), value.to_string())
        })
        .collect()
}

fn value(text: &str, series: &str) -> Option<String> {
    samples(text)
        .into_iter()
        .find(|(s, _)| s == series)
        .map(|(_, v)| v)
}

/// The exposition format's rules the collector enforces: each family's HELP and TYPE once,
/// before its samples, all its samples together; names and label names legal; no series twice.
fn assert_well_formed(text: &str) {
    let mut families = BTreeSet::new();
    let mut series = BTreeSet::new();
    let mut current = String::new();
    let legal = |n: &str| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(families.insert(name.to_string()), "{name} twice");
            assert!(name.starts_with("tchrun_") && legal(name), "{name}");
            current = name.to_string();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            assert_eq!(rest, format!("{current} gauge"));
        } else {
            let name = line.split('{').next().unwrap();
            assert_eq!(name, current, "{line}: a sample outside its family");
            let labels = &line[name.len() + 1..line.rfind('}').unwrap()];
            for pair in labels.split("\",") {
                let key = pair.split('=').next().unwrap();
                assert!(legal(key), "{line}");
            }
            let (s, v) = line.rsplit_once(' ').unwrap();
            assert!(v.parse::<f64>().is_ok() || ["NaN", "+Inf", "-Inf"].contains(&v));
            assert!(series.insert(s.to_string()), "{s} twice");
        }
    }
}

#[test]
fn a_running_job_shows_its_progress_ranks_and_stragglers() {
    let text = render(&running(), "out-1a2b3c4d", at(1_100));
    assert_well_formed(&text);
    let j = "job_id=\"out-1a2b3c4d\"";
    let get = |s: &str| value(&text, s).unwrap_or_else(|| panic!("{s} missing in\n{text}"));
    assert_eq!(get(&format!("tchrun_state{{{j},state=\"running\"}}")), "1");
    assert_eq!(get(&format!("tchrun_state{{{j},state=\"finished\"}}")), "0");
    assert_eq!(get(&format!("tchrun_step{{{j}}}")), "17");
    assert_eq!(get(&format!("tchrun_steps{{{j}}}")), "30");
    assert_eq!(get(&format!("tchrun_epoch{{{j}}}")), "2");
    assert_eq!(get(&format!("tchrun_images_per_second{{{j}}}")), "123.5");
    assert_eq!(get(&format!("tchrun_loss{{{j}}}")), "0.25");
    assert_eq!(get(&format!("tchrun_learning_rate{{{j}}}")), "0.001");
    assert_eq!(get(&format!("tchrun_eta_seconds{{{j}}}")), "40");
    assert_eq!(get(&format!("tchrun_seconds_since_last_step{{{j}}}")), "10");
    assert_eq!(
        get(&format!("tchrun_last_step_timestamp_seconds{{{j}}}")),
        "1090"
    );
    assert_eq!(
        get(&format!("tchrun_last_checkpoint_age_seconds{{{j}}}")),
        "40"
    );
    assert_eq!(get(&format!("tchrun_last_checkpoint_step{{{j}}}")), "10");
    assert_eq!(
        get(&format!("tchrun_updated_timestamp_seconds{{{j}}}")),
        "1100"
    );
    let r1 = format!("{j},rank=\"1\",host=\"node1\"");
    assert_eq!(get(&format!("tchrun_rank_step{{{r1}}}")), "17");
    assert_eq!(
        get(&format!(
            "tchrun_rank_phase{{{r1},phase=\"gradient_all_reduce\"}}"
        )),
        "1"
    );
    assert_eq!(
        get(&format!("tchrun_rank_time_ratio{{{r1},part=\"compute\"}}")),
        "0.7"
    );
    assert_eq!(
        get(&format!("tchrun_rank_seconds_since_progress{{{r1}}}")),
        "0.5"
    );
    assert_eq!(
        get(&format!("tchrun_rank_resident_memory_bytes{{{r1}}}")),
        "1073741824"
    );
    assert_eq!(
        get(&format!("tchrun_rank_straggler{{{r1},kind=\"compute\"}}")),
        "1"
    );
    assert_eq!(get(&format!("tchrun_stragglers{{{j}}}")), "1");
    // Nothing without a value: no GPU memory on CPU, no failure while it runs.
    assert!(!text.contains("tchrun_rank_gpu_memory_bytes"), "{text}");
    assert!(!text.contains("tchrun_failure_info"), "{text}");
    assert!(!text.contains("tchrun_exit_code"), "{text}");
}

#[test]
fn an_ended_job_is_marked_so_and_nothing_in_it_looks_alive() {
    let finished = JobStatus::ended(
        Some(running()),
        JobState::Finished,
        JobEnd {
            code: 0,
            summary: "model written to /out".into(),
            cause: None,
        },
    );
    let text = render(&finished, "j", at(2_000));
    assert_well_formed(&text);
    assert_eq!(
        value(&text, "tchrun_state{job_id=\"j\",state=\"finished\"}").as_deref(),
        Some("1")
    );
    assert_eq!(
        value(&text, "tchrun_state{job_id=\"j\",state=\"running\"}").as_deref(),
        Some("0")
    );
    assert_eq!(
        value(&text, "tchrun_exit_code{job_id=\"j\"}").as_deref(),
        Some("0")
    );
    for gone in [
        "tchrun_seconds_since_last_step",
        "tchrun_eta_seconds",
        "tchrun_epoch_eta_seconds",
        "tchrun_rank_seconds_since_progress",
        "tchrun_failure_info",
    ] {
        assert!(!text.contains(gone), "{gone} in\n{text}");
    }
    assert!(text.contains("phase=\"done\""), "{text}");
    assert!(text.contains("tchrun_last_step_timestamp_seconds{job_id=\"j\"} 1090"));

    let mut end = JobEnd {
        code: 4,
        summary: "rank 1 failed".into(),
        cause: Some("oom_killer".into()),
    };
    let failed = JobStatus::ended(Some(running()), JobState::Failed, end.clone());
    let text = render(&failed, "j", at(2_000));
    assert_well_formed(&text);
    assert!(
        text.contains("tchrun_failure_info{job_id=\"j\",cause=\"oom_killer\",exit_code=\"4\"} 1"),
        "{text}"
    );
    assert!(text.contains("tchrun_state{job_id=\"j\",state=\"failed\"} 1"));
    // No cause recorded: the exit code's kind.
    end.cause = None;
    end.code = 5;
    let text = render(
        &JobStatus::ended(None, JobState::Failed, end),
        "j",
        at(2_000),
    );
    assert!(
        text.contains("cause=\"diverged\",exit_code=\"5\""),
        "{text}"
    );
}

#[test]
fn label_values_and_help_are_escaped_and_odd_numbers_written_as_the_format_wants() {
    let mut s = running();
    s.ranks[0].host = "a\"b\\c\nd".into();
    s.loss = Some(f64::NAN);
    s.lr = Some(f64::INFINITY);
    let text = render(&s, "j", at(1_100));
    assert!(text.contains("host=\"a\\\"b\\\\c\\nd\""), "{text}");
    assert!(text.contains("tchrun_loss{job_id=\"j\"} NaN"));
    assert!(text.contains("tchrun_learning_rate{job_id=\"j\"} +Inf"));
    assert_eq!(number(1e-7), "0.0000001");
    assert_eq!(number(3.0), "3");
}

#[test]
fn the_job_id_is_readable_file_safe_stable_and_tells_apart_same_named_outputs() {
    let a = job_id(Path::new("/scratch/alice/resnet lr=0.1"));
    assert!(a.starts_with("resnet_lr_0_1-"), "{a}");
    assert_eq!(a.len(), "resnet_lr_0_1-".len() + 8);
    assert!(a
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    assert_eq!(a, job_id(Path::new("/scratch/alice/resnet lr=0.1")));
    assert_ne!(a, job_id(Path::new("/scratch/bob/resnet lr=0.1")));
    assert!(job_id(Path::new("/")).starts_with("job-"));
    let long = "x".repeat(300);
    assert!(job_id(Path::new(&long)).len() <= 48 + 9);
    let t = Textfile::new(Path::new("/tf"), Path::new("/scratch/out"));
    assert_eq!(
        t.path(),
        Path::new("/tf").join(format!("tchrun_{}.prom", job_id(Path::new("/scratch/out"))))
    );
}

#[test]
fn the_directory_must_exist_be_a_directory_and_be_writable() {
    let t = tempfile::tempdir().unwrap();
    assert_eq!(check_dir(t.path()), Ok(()));
    let missing = check_dir(&t.path().join("nope")).unwrap_err();
    assert!(
        missing.starts_with("--prometheus-textfile ") && missing.contains("create it"),
        "{missing}"
    );
    let file = t.path().join("f");
    std::fs::write(&file, b"").unwrap();
    assert!(check_dir(&file).unwrap_err().contains("not a directory"));
}

#[test]
fn the_file_is_replaced_whole_readable_by_node_exporter_and_no_temp_is_left() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let tf = Textfile::new(t.path(), Path::new("/scratch/out"));
    tf.write(&running(), at(1_100)).unwrap();
    tf.write(&running(), at(1_101)).unwrap();
    let names: Vec<String> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![format!("tchrun_{}.prom", tf.job)]);
    let meta = std::fs::metadata(tf.path()).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o644);
    let text = std::fs::read_to_string(tf.path()).unwrap();
    assert!(text.contains("tchrun_updated_timestamp_seconds{") && text.contains("} 1101\n"));
}

#[test]
fn each_host_file_has_its_own_ranks_and_rank_0s_file_the_job_and_rank_0s_host() {
    let t = tempfile::tempdir().unwrap();
    let job = Textfile::new(t.path(), Path::new("/scratch/out"));
    let host = job.for_host("node1.example/x");
    assert_eq!(
        host.path().file_name().unwrap().to_string_lossy(),
        format!("tchrun_{}_node1_example_x.prom", job.job)
    );
    let mut s = running();
    s.ranks[1].host = "node1.example/x".into();
    s.stragglers[0].host = "node1.example/x".into();
    job.write(&s, at(1_100)).unwrap();
    host.write(&s, at(1_100)).unwrap();
    let first = std::fs::read_to_string(job.path()).unwrap();
    let second = std::fs::read_to_string(host.path()).unwrap();
    assert_well_formed(&first);
    assert_well_formed(&second);
    let ranks = |text: &str| -> BTreeSet<String> {
        samples(text)
            .into_iter()
            .filter_map(|(s, _)| Some(s.split("rank=\"").nth(1)?.split('"').next()?.to_string()))
            .collect()
    };
    assert_eq!(ranks(&first), BTreeSet::from(["0".to_string()]), "{first}");
    assert_eq!(
        ranks(&second),
        BTreeSet::from(["1".to_string()]),
        "{second}"
    );
    // The job's series in rank 0's file only (its straggler count stays the job's).
    assert!(value(&first, &format!("tchrun_step{{job_id=\"{}\"}}", job.job)).is_some());
    assert_eq!(
        value(
            &first,
            &format!("tchrun_stragglers{{job_id=\"{}\"}}", job.job)
        ),
        Some("1".into())
    );
    assert!(!second.contains("tchrun_step{") && !second.contains("tchrun_stragglers{"));
    let labels = format!("job_id=\"{}\",host=\"node1.example/x\"", job.job);
    assert_eq!(
        value(
            &second,
            &format!("tchrun_state{{{labels},state=\"running\"}}")
        ),
        Some("1".into()),
        "{second}"
    );
    assert_eq!(
        value(
            &second,
            &format!("tchrun_updated_timestamp_seconds{{{labels}}}")
        ),
        Some("1100".into())
    );
    assert!(second.contains("tchrun_rank_straggler{"), "{second}");
    // Its end: marked so, nothing counting on.
    s.state = JobState::Finished;
    let ended = render_host(&s, &job.job, "node1.example/x", at(1_200));
    assert_eq!(
        value(
            &ended,
            &format!("tchrun_state{{{labels},state=\"finished\"}}")
        ),
        Some("1".into())
    );
    assert!(
        !ended.contains("tchrun_rank_seconds_since_progress"),
        "{ended}"
    );
}
