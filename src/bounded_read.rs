//! Bounded reads of the files tchrun reads from places others can create: the log directory's
//! records (`status.json`, `heartbeat-<rank>.json`, `failure.json`, capture requests and
//! answers), the dataset's images, archives and index, `--class-weights`, `model.json`.
//! Every such read opens the file without blocking (`O_NONBLOCK`: a FIFO's open returns at
//! once), refuses what is not a regular file (a FIFO, a device, a socket, a directory: named in
//! the error, never read), and refuses a file larger than the cap of its kind (checked on the
//! open file's size, and again while reading, so a file that grows is cut off at the cap).
//! Owns the caps ([`caps`]); re-exported by the `files` module.
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The size caps per kind of file, in bytes. Each is far above what tchrun writes or a real
/// input holds, and far below what would exhaust a node's memory.
pub mod caps {
    /// A record of the log directory (`status.json`, `failure.json`, `ranks.json`,
    /// `restarts.json`, `heartbeat-<rank>.json`, `memory-<rank>.json`, capture requests and
    /// `stacks-<rank>.json`): tchrun's own are at most a few hundred KiB.
    pub const RECORD: u64 = 16 << 20;
    /// `--class-weights`' file: 64 bytes a class for a million classes.
    pub const CLASS_WEIGHTS: u64 = 64 << 20;
    /// `model.json` (its class list is the largest part).
    pub const MODEL_JSON: u64 = 64 << 20;
    /// A dataset index (`data::index`) or a pack's index: about 100 bytes an image, for ten
    /// million images.
    pub const DATASET_INDEX: u64 = 1 << 30;
    /// One image file of a dataset: twice what the largest image the decoder accepts
    /// (`data::MAX_DECODED_BYTES`) can take uncompressed.
    pub const IMAGE: u64 = 1 << 30;
    /// A weights file read whole (safetensors, `.pth`), and a checkpoint's files.
    pub const WEIGHTS: u64 = 64 << 30;
    /// A driver log or `metrics.jsonl` read whole for a report.
    pub const LOG: u64 = 1 << 30;
    /// A small text file of a user's (a hostfile, a doctor's report, a version stamp).
    pub const TEXT: u64 = 16 << 20;
}

/// Why a bounded read refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum BoundedReadError {
    /// Opening, `stat`ing or reading failed (`NotFound` among them).
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A FIFO, device, socket or directory where a regular file was expected.
    #[error("{} is {kind}, not a regular file; tchrun reads only regular files here (replace it with the file meant)", path.display())]
    NotRegular { path: PathBuf, kind: &'static str },
    /// Larger than the cap of its kind.
    #[error("{} is larger than {cap} bytes ({size} or more), the limit for this kind of file; is it the file meant?", path.display())]
    TooLarge { path: PathBuf, size: u64, cap: u64 },
}

impl BoundedReadError {
    /// Whether the file does not exist (so a caller can treat "none" apart from "bad").
    pub fn is_not_found(&self) -> bool {
        matches!(self, BoundedReadError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }

    /// The error as an `std::io::Error` (its text kept) for callers whose errors are I/O errors.
    pub fn into_io(self) -> std::io::Error {
        match self {
            BoundedReadError::Io { source, .. } => source,
            e => std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
        }
    }
}

/// What a file type is, in words ("a FIFO"), for a type that is not a regular file.
fn kind_of(t: std::fs::FileType) -> &'static str {
    if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// Opens `path` (symlinks followed) for reading if it is a regular file of at most `cap` bytes;
/// returns the file and its size. The type is checked before the open (a device is never
/// opened) and again on the open file (a FIFO swapped in between is refused: `O_NONBLOCK`
/// makes its open return at once).
pub fn open_regular(path: &Path, cap: u64) -> Result<(std::fs::File, u64), BoundedReadError> {
    let io = |source| BoundedReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let check = |m: &std::fs::Metadata| {
        if !m.file_type().is_file() {
            return Err(BoundedReadError::NotRegular {
                path: path.to_path_buf(),
                kind: kind_of(m.file_type()),
            });
        }
        if m.len() > cap {
            return Err(BoundedReadError::TooLarge {
                path: path.to_path_buf(),
                size: m.len(),
                cap,
            });
        }
        Ok(m.len())
    };
    check(&std::fs::metadata(path).map_err(io)?)?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    let len = check(&f.metadata().map_err(io)?)?;
    Ok((f, len))
}

/// The whole of `path` if it is a regular file of at most `cap` bytes (see the module docs).
pub fn read_bounded(path: &Path, cap: u64) -> Result<Vec<u8>, BoundedReadError> {
    let mut buf = Vec::new();
    read_bounded_into(path, cap, &mut buf)?;
    Ok(buf)
}

/// [`read_bounded`] into `buf` (cleared first), so that a loop reuses one buffer.
pub fn read_bounded_into(path: &Path, cap: u64, buf: &mut Vec<u8>) -> Result<(), BoundedReadError> {
    buf.clear();
    let (f, len) = open_regular(path, cap)?;
    buf.reserve(len as usize);
    f.take(cap.saturating_add(1))
        .read_to_end(buf)
        .map_err(|source| BoundedReadError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    if buf.len() as u64 > cap {
        return Err(BoundedReadError::TooLarge {
            path: path.to_path_buf(),
            size: buf.len() as u64,
            cap,
        });
    }
    Ok(())
}

/// [`read_bounded`] as UTF-8 text (invalid UTF-8 is an `InvalidData` I/O error).
pub fn read_bounded_string(path: &Path, cap: u64) -> Result<String, BoundedReadError> {
    String::from_utf8(read_bounded(path, cap)?).map_err(|e| BoundedReadError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_at_once_and_a_large_file_by_its_size() {
        let t = tempfile::tempdir().expect("tmp");
        let fifo = t.path().join("status.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let started = std::time::Instant::now();
        let e = read_bounded(&fifo, caps::RECORD).expect_err("a FIFO");
        assert!(started.elapsed().as_secs() < 5, "it blocked");
        assert!(
            matches!(e, BoundedReadError::NotRegular { .. }) && e.to_string().contains("FIFO"),
            "{e}"
        );
        assert!(e.to_string().contains("status.json"), "{e}");
        let e = read_bounded(Path::new("/dev/zero"), 1 << 20).expect_err("a device");
        assert!(e.to_string().contains("character device"), "{e}");
        let e = read_bounded(t.path(), 1 << 20).expect_err("a directory");
        assert!(e.to_string().contains("directory"), "{e}");
        let big = t.path().join("big");
        let f = std::fs::File::create(&big).expect("create");
        f.set_len(1 << 40).expect("sparse"); // a terabyte that takes no space
        let e = read_bounded(&big, caps::CLASS_WEIGHTS).expect_err("too large");
        assert!(matches!(e, BoundedReadError::TooLarge { .. }), "{e}");
        let small = t.path().join("small");
        std::fs::write(&small, b"12345").expect("write");
        assert_eq!(read_bounded(&small, 5).expect("at the cap"), b"12345");
        assert!(matches!(
            read_bounded(&small, 4),
            Err(BoundedReadError::TooLarge { .. })
        ));
        let e = read_bounded(&t.path().join("none"), 5).expect_err("missing");
        assert!(e.is_not_found(), "{e}");
    }
}
