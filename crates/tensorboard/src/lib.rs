//! TensorBoard event files (`<output>/tensorboard/events.out.tfevents.*`), written by rank 0.
//!
//! The format is TensorFlow's: a file of TFRecords (`u64` length, masked CRC-32C of the
//! length, the bytes, masked CRC-32C of the bytes; little-endian), each record one `Event`
//! protocol buffer. The first event carries `file_version = "brain.Event:2"`; the others a
//! `Summary` of scalars (`simple_value`) or a `SessionLog`. The messages are declared here by
//! hand with TensorBoard's field numbers (`tensorboard/compat/proto/event.proto`,
//! `summary.proto`: `session_log` is field 7, 6 being the deprecated `log_message`) and encoded
//! with `prost`; no `protoc` is needed. `tests/observe.rs` reads them with TensorBoard's own
//! `EventAccumulator`.
//!
//! Every record is written with one `write` call and flushed (the file is unbuffered), so a
//! crash leaves at most a torn last record, which readers (ours and TensorBoard's) stop at.
//!
//! Resume: [`EventWriter::resume`] rewrites the directory's events into one new file holding
//! only the events with `step <= ` the checkpoint's step (a crashed run may have logged steps
//! after its last checkpoint; the resumed run logs them again), then appends to it, so the
//! step axis continues without a duplicate or a gap. It also writes a `SessionLog.START` at
//! the first new step: TensorBoard's own reader (`EventAccumulator`, file version 2) purges
//! every event at or after a START's step, which covers readers of older copies of the files.
use prost::Message;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Directory of the event files inside `--output`.
pub use tchrun::files::TENSORBOARD_DIR as DIR;
/// The marker TensorBoard looks for in an event file's name.
pub const FILE_MARKER: &str = "tfevents";
/// The first event's `file_version` (version 2: restarts are marked by `SessionLog.START`).
pub const FILE_VERSION: &str = "brain.Event:2";

/// `tensorboard.Event`.
#[derive(Clone, PartialEq, Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(oneof = "What", tags = "3, 5, 7")]
    pub what: Option<What>,
}

/// `Event.what`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
    /// Field 7 (6 is the deprecated `log_message`).
    #[prost(message, tag = "7")]
    SessionLog(SessionLog),
}

/// `tensorboard.Summary`.
#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<Value>,
}

/// `tensorboard.Summary.Value` (only the scalar kind).
#[derive(Clone, PartialEq, Message)]
pub struct Value {
    #[prost(string, tag = "1")]
    pub tag: String,
    /// A oneof in TensorBoard's proto: encoded even when it is 0.0 (a plain proto3 float
    /// would be left out, and the reader would see no value at all).
    #[prost(oneof = "ValueKind", tags = "2")]
    pub value: Option<ValueKind>,
}

/// `Summary.Value.value`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ValueKind {
    #[prost(float, tag = "2")]
    SimpleValue(f32),
}

/// `tensorboard.SessionLog`.
#[derive(Clone, PartialEq, Message)]
pub struct SessionLog {
    /// 1: START, 2: STOP, 3: CHECKPOINT.
    #[prost(int32, tag = "1")]
    pub status: i32,
    #[prost(string, tag = "2")]
    pub checkpoint_path: String,
    #[prost(string, tag = "3")]
    pub msg: String,
}

/// `SessionLog.SessionStatus.START`.
pub const SESSION_START: i32 = 1;

impl Event {
    /// The scalars of a summary event (tag, value).
    pub fn scalars(&self) -> Vec<(&str, f32)> {
        match &self.what {
            Some(What::Summary(s)) => s
                .value
                .iter()
                .filter_map(|v| {
                    v.value
                        .as_ref()
                        .map(|ValueKind::SimpleValue(x)| (v.tag.as_str(), *x))
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TensorBoardError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TensorBoardError + '_ {
    move |source| TensorBoardError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// TFRecord's masked CRC-32C.
pub fn masked_crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
        .rotate_right(15)
        .wrapping_add(0xa282_ead8)
}

/// One TFRecord around `data`.
pub fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// The records of a TFRecord file's bytes, up to the first incomplete or corrupt one (a torn
/// tail after a crash); the second value says whether such a tail was found.
pub fn records(bytes: &[u8]) -> (Vec<&[u8]>, bool) {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let Some(head) = bytes.get(at..at + 12) else {
            return (out, true);
        };
        let len_bytes = &head[..8];
        let crc = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        if masked_crc(len_bytes) != crc {
            return (out, true);
        }
        let mut l = [0u8; 8];
        l.copy_from_slice(len_bytes);
        let Ok(len) = usize::try_from(u64::from_le_bytes(l)) else {
            return (out, true);
        };
        let start = at + 12;
        let Some(data) = start.checked_add(len).and_then(|end| bytes.get(start..end)) else {
            return (out, true);
        };
        let Some(tail) = bytes.get(start + len..start + len + 4) else {
            return (out, true);
        };
        if masked_crc(data) != u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]) {
            return (out, true);
        }
        out.push(data);
        at = start + len + 4;
    }
    (out, false)
}

/// The events of one file, up to a torn or undecodable record.
pub fn read_events(path: &Path) -> Result<Vec<Event>, TensorBoardError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let (recs, _) = records(&bytes);
    Ok(recs
        .into_iter()
        .map_while(|r| Event::decode(r).ok())
        .collect())
}

/// The event files in `dir` (names containing `tfevents`, not hidden), sorted by name.
pub fn event_files(dir: &Path) -> Result<Vec<PathBuf>, TensorBoardError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(dir)(e)),
    };
    let mut files: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy())
                .is_some_and(|n| n.contains(FILE_MARKER) && !n.starts_with('.'))
        })
        .collect();
    files.sort();
    Ok(files)
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Appends events to one event file.
#[derive(Debug)]
pub struct EventWriter {
    file: File,
    path: PathBuf,
}

impl EventWriter {
    /// `dir/events.out.tfevents.<unix seconds>.<host>.<pid>`.
    fn new_path(dir: &Path, host: &str) -> PathBuf {
        let host: String = host
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        dir.join(format!(
            "events.out.{FILE_MARKER}.{}.{host}.{}",
            now() as u64,
            std::process::id()
        ))
    }

    /// A fresh run: removes the event files an earlier run left in `dir` (they described a
    /// model this run replaces), then starts a new file with its `file_version` event.
    pub fn create(dir: &Path, host: &str) -> Result<Self, TensorBoardError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        for old in event_files(dir)? {
            std::fs::remove_file(&old).map_err(io(&old))?;
        }
        let path = Self::new_path(dir, host);
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(tchrun::files::FILE_MODE)
            .open(&path)
            .map_err(io(&path))?;
        let mut w = EventWriter { file, path };
        w.write(&Event {
            wall_time: now(),
            step: 0,
            what: Some(What::FileVersion(FILE_VERSION.into())),
        })?;
        Ok(w)
    }

    /// A resumed run at optimizer step `step` (the checkpoint's): the events of `dir` with a
    /// step up to `step` are rewritten (atomically) into one new file, the others are dropped;
    /// a `SessionLog.START` at `step + 1` follows. Returns the writer and the kept events.
    pub fn resume(
        dir: &Path,
        host: &str,
        step: u64,
    ) -> Result<(Self, Vec<Event>), TensorBoardError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let old = event_files(dir)?;
        let mut kept = Vec::new();
        for f in &old {
            for e in read_events(f)? {
                let versioned = matches!(e.what, Some(What::FileVersion(_)));
                if !versioned && e.step >= 0 && e.step as u64 <= step {
                    kept.push(e);
                }
            }
        }
        let mut bytes = frame(
            &Event {
                wall_time: now(),
                step: 0,
                what: Some(What::FileVersion(FILE_VERSION.into())),
            }
            .encode_to_vec(),
        );
        for e in &kept {
            bytes.extend(frame(&e.encode_to_vec()));
        }
        // A hidden temporary without the marker: a crash here leaves nothing TensorBoard reads.
        let tmp = dir.join(".tchrun-events.tmp");
        let path = Self::new_path(dir, host);
        let written = std::fs::write(&tmp, &bytes)
            .and_then(|()| tchrun::files::narrow_mode(&tmp))
            .and_then(|()| File::open(&tmp)?.sync_all())
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp); // never leave a partial file behind
            return Err(io(&path)(e));
        }
        for f in old.iter().filter(|f| **f != path) {
            std::fs::remove_file(f).map_err(io(f))?;
        }
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        let mut w = EventWriter { file, path };
        w.write(&Event {
            wall_time: now(),
            step: step as i64 + 1,
            what: Some(What::SessionLog(SessionLog {
                status: SESSION_START,
                ..Default::default()
            })),
        })?;
        Ok((w, kept))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One record, one `write` (the file is unbuffered: nothing waits in a buffer).
    pub fn write(&mut self, event: &Event) -> Result<(), TensorBoardError> {
        let rec = frame(&event.encode_to_vec());
        self.file.write_all(&rec).map_err(io(&self.path))
    }

    /// Scalars at `step`, in one event.
    pub fn scalars(&mut self, step: u64, values: &[(&str, f64)]) -> Result<(), TensorBoardError> {
        self.write(&Event {
            wall_time: now(),
            step: step as i64,
            what: Some(What::Summary(Summary {
                value: values
                    .iter()
                    .map(|(tag, v)| Value {
                        tag: (*tag).to_string(),
                        value: Some(ValueKind::SimpleValue(*v as f32)),
                    })
                    .collect(),
            })),
        })
    }

    /// Flushes to disk (end of an epoch).
    pub fn sync(&mut self) -> Result<(), TensorBoardError> {
        self.file.sync_data().map_err(io(&self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::manual_rotate)] // TFRecord's formula as TensorFlow writes it
    fn masked_crc_matches_tensorflow() {
        // CRC-32C check value of "123456789" is 0xE3069283 (RFC 3720); masked as TFRecord does.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        let c: u32 = 0xe306_9283;
        assert_eq!(
            masked_crc(b"123456789"),
            ((c >> 15) | (c << 17)).wrapping_add(0xa282_ead8)
        );
    }

    #[test]
    fn framing_round_trips_and_stops_at_a_torn_tail() {
        let a = frame(b"hello");
        let b = frame(b"");
        let mut all = [a.clone(), b.clone()].concat();
        assert_eq!(all.len(), 5 + 16 + 16);
        let (recs, torn) = records(&all);
        assert_eq!(recs, vec![&b"hello"[..], &b""[..]]);
        assert!(!torn);
        // A crash mid-record: the complete records are still read.
        all.extend_from_slice(&frame(b"partial")[..10]);
        let (recs, torn) = records(&all);
        assert_eq!(recs.len(), 2);
        assert!(torn);
        // A flipped bit in the data is detected.
        let mut bad = a.clone();
        bad[13] ^= 1;
        let (recs, torn) = records(&bad);
        assert!(recs.is_empty() && torn);
    }

    #[test]
    fn events_encode_with_tensorboards_field_numbers() {
        let e = Event {
            wall_time: 1.5,
            step: 7,
            what: Some(What::Summary(Summary {
                value: vec![Value {
                    tag: "a".into(),
                    value: Some(ValueKind::SimpleValue(0.0)),
                }],
            })),
        };
        let bytes = e.encode_to_vec();
        // wall_time: field 1, fixed64; step: field 2, varint; summary: field 5, bytes;
        // value: field 1 of Summary; tag: field 1; simple_value (even 0.0): field 2, fixed32.
        let mut want = vec![0x09];
        want.extend_from_slice(&1.5f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 7, 0x2a, 10, 0x0a, 8, 0x0a, 1, b'a', 0x15, 0, 0, 0, 0]);
        assert_eq!(bytes, want);
        assert_eq!(Event::decode(&bytes[..]).ok(), Some(e));
        let v = Event {
            wall_time: 0.0,
            step: 0,
            what: Some(What::FileVersion(FILE_VERSION.into())),
        };
        assert_eq!(&v.encode_to_vec()[..2], &[0x1a, 13]);
        let start = Event {
            wall_time: 0.0,
            step: 3,
            what: Some(What::SessionLog(SessionLog {
                status: SESSION_START,
                ..Default::default()
            })),
        };
        // session_log: field 7, bytes (0x3a); status START: field 1, varint 1.
        assert_eq!(start.encode_to_vec(), vec![0x10, 3, 0x3a, 2, 0x08, 1]);
    }

    #[test]
    fn resume_keeps_steps_up_to_the_checkpoint_in_one_file() {
        let t = tempfile::tempdir().expect("tempdir");
        let dir = t.path().join(DIR);
        let mut w = EventWriter::create(&dir, "host one").expect("create");
        for s in 1..=10u64 {
            w.scalars(s, &[("train/loss", s as f64)]).expect("write");
        }
        let first = w.path().to_path_buf();
        assert!(first
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains("tfevents")));
        drop(w);
        // A torn record at the end, as a crash would leave.
        let mut f = OpenOptions::new().append(true).open(&first).expect("open");
        f.write_all(&frame(b"xxxxxxxx")[..9]).expect("append");
        let (mut w, kept) = EventWriter::resume(&dir, "host one", 6).expect("resume");
        let steps: Vec<i64> = kept.iter().map(|e| e.step).collect();
        assert_eq!(steps, vec![1, 2, 3, 4, 5, 6]);
        for s in 7..=8u64 {
            w.scalars(s, &[("train/loss", 100.0 + s as f64)])
                .expect("write");
        }
        let files = event_files(&dir).expect("list");
        assert_eq!(files.len(), 1, "{files:?}");
        let events = read_events(&files[0]).expect("read");
        assert!(matches!(events[0].what, Some(What::FileVersion(_))));
        let start: Vec<i64> = events
            .iter()
            .filter(|e| matches!(&e.what, Some(What::SessionLog(s)) if s.status == SESSION_START))
            .map(|e| e.step)
            .collect();
        assert_eq!(start, vec![7]);
        let losses: Vec<(i64, f32)> = events
            .iter()
            .flat_map(|e| e.scalars().into_iter().map(move |(_, v)| (e.step, v)))
            .collect();
        let want: Vec<(i64, f32)> = (1..=6)
            .map(|s| (s, s as f32))
            .chain((7..=8).map(|s| (s, 100.0 + s as f32)))
            .collect();
        assert_eq!(losses, want);
        // A fresh run starts over.
        let w = EventWriter::create(&dir, "h").expect("create");
        assert_eq!(
            event_files(&dir).expect("list"),
            vec![w.path().to_path_buf()]
        );
        assert_eq!(read_events(w.path()).expect("read").len(), 1);
    }
}
