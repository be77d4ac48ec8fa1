//! Image-folder archives (`.zip`, `.tar`, `.tar.gz`/`.tgz`), as Azure ML's "Convert to Image
//! Directory" accepts them: extracted once into a cache directory, checked, and reused.
//!
//! * Where: `<data cache>/archives/<archive stem>-<key>/`, the data cache being
//!   `$TCHRUN_DATA_CACHE`, else `$XDG_CACHE_HOME/tchrun`, else `~/.cache/tchrun` ([`data_cache`];
//!   the dataset indexes live in its `index/`): never inside a job's output, so copying a model
//!   does not copy its dataset, and every job on the same archive reuses one extraction. Ranks on
//!   other nodes read the extracted folder at the same path: on a cluster whose home folders are
//!   not shared, set `TCHRUN_DATA_CACHE` to a shared folder. `<key>` is 12 hex digits of the sha256 of the
//!   archive's absolute path, size and modification time: an archive rewritten in place is
//!   extracted again; an unchanged one is reused without reading it.
//! * Complete or absent: members are written into a hidden `.<name>.partial-<host>-<pid>`
//!   folder next to the final one; the image folder is found and scanned there; the marker
//!   `.tchrun-extracted.json` is written last, and one `rename` publishes the folder. A folder
//!   without its marker is never trusted (it is removed and extracted again); on any refusal
//!   the partial folder is removed, and this host's partial folders of dead processes are
//!   removed on the next extraction. Ranks extracting the same archive at once (`tchrun-worker`
//!   started by hand) each write their own partial folder; the first rename wins and the others
//!   use its folder.
//! * Layout: the class folders at the archive's top, or under one single top-level folder
//!   (what zipping a folder gives). macOS's `__MACOSX/` resource-fork folder is skipped.
//! * Refused (`BadArchiveError`, the archive and the member named): member paths that are
//!   absolute or escape the folder (`..`), symbolic and hard links, devices and FIFOs,
//!   encrypted zip members, duplicate members, a zip member declaring more bytes than deflate
//!   can produce from its compressed size (1032:1) or holding more or fewer bytes than it
//!   declares, more than [`MAX_ARCHIVE_MEMBERS`] members, and a total unpacked size above the
//!   limit ([`DEFAULT_MAX_UNPACKED_BYTES`], or `$TCHRUN_DATA_MAX_UNPACKED_BYTES`) or above the
//!   free space of the cache's file system. Zip sizes are checked from the central directory
//!   before anything is written; tar sizes as the headers stream by.
//!
//! Here: where an extraction goes, its marker, the one `resolve` (with the signal guard and the
//! publishing rename); `extract.rs`: the members' checks and the zip and tar readers.
use super::*;

mod extract;

mod kind;
mod limits;

pub use extract::member_path;
use extract::{bad_archive, extract_checked, find_root, interrupted};
pub use kind::{ArchiveKind, ARCHIVE_SUFFIXES};
pub use limits::{
    max_unpacked_bytes, DEFAULT_MAX_UNPACKED_BYTES, MAX_ARCHIVE_MEMBERS, MAX_UNPACKED_ENV,
};
pub use tchrun::files::{cache_root, data_cache, CACHE_SUBDIR, DATA_CACHE_ENV};

/// The completion marker inside an extracted folder (hidden: scans skip it).
pub const EXTRACTED_MARKER: &str = ".tchrun-extracted.json";

/// An archive ready to use as an image folder.
#[derive(Debug, Clone, PartialEq)]
pub struct Extracted {
    pub archive: PathBuf,
    /// The extracted folder (`<cache root>/<stem>-<key>`).
    pub dir: PathBuf,
    /// The image folder inside it (`dir`, or its single top-level folder).
    pub root: PathBuf,
    /// Found complete from an earlier extraction.
    pub reused: bool,
    pub files: u64,
    pub bytes: u64,
}

impl Extracted {
    /// One line for the log.
    pub fn describe(&self) -> String {
        if self.reused {
            format!(
                "{}: using the folder extracted earlier, {} ({} files)",
                self.archive.display(),
                self.root.display(),
                self.files
            )
        } else {
            format!(
                "{}: extracted {} files ({} bytes) into {}",
                self.archive.display(),
                self.files,
                self.bytes,
                self.root.display()
            )
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Marker {
    format: u32,
    archive: PathBuf,
    size: u64,
    mtime_ns: i128,
    /// The image folder, relative to the extracted folder ("" for itself).
    root: String,
    files: u64,
    bytes: u64,
}

/// `src` itself when it is not an archive; otherwise the image folder extracted from it
/// (extracting it into `cache` unless a complete extraction is there). See the module docs.
pub fn resolve(src: &Path, cache: &Path) -> Result<Option<Extracted>, DatasetError> {
    let Some((kind, stem)) = ArchiveKind::of(src) else {
        return Ok(None);
    };
    let meta = fs::metadata(src).map_err(|e| io_err(src, e))?;
    if meta.is_dir() {
        // A folder named like an archive is a folder.
        return Ok(None);
    }
    // A FIFO or device named like an archive is refused here, never opened to block.
    tchrun::files::open_regular(src, u64::MAX).map_err(|e| bad_archive(src, e.to_string()))?;
    let archive = if src.is_absolute() {
        src.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| io_err(src, e))?
            .join(src)
    };
    let mtime_ns = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i128);
    let key = {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(archive.as_os_str().as_encoded_bytes());
        h.update(meta.len().to_le_bytes());
        h.update(mtime_ns.to_le_bytes());
        let d = h.finalize();
        d.iter()
            .take(6)
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let safe_stem: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    let name = format!("{}-{key}", safe_stem.trim_start_matches('.'));
    let dir = cache.join(&name);
    if let Some(found) = read_complete(&archive, &dir) {
        return Ok(Some(found));
    }
    fs::create_dir_all(cache).map_err(|e| io_err(cache, e))?;
    if dir.exists() {
        // No valid marker: an interrupted or altered extraction; never trusted.
        fs::remove_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
    }
    remove_dead_partials(cache, &name);
    let partial = cache.join(format!(
        ".{name}.partial-{}-{}",
        host_tag(),
        std::process::id()
    ));
    if partial.exists() {
        fs::remove_dir_all(&partial).map_err(|e| io_err(&partial, e))?;
    }
    // SIGINT/SIGTERM from here to the rename: the extraction stops at the next member (or
    // read), the partial folder is removed and the error says so (`DatasetError::Interrupted`).
    let guard = tchrun::interrupt::Guard::install();
    let stop_now = || tchrun::interrupt::received().map(|signal| interrupted(&archive, signal));
    fs::create_dir(&partial).map_err(|e| io_err(&partial, e))?;
    let result = extract_checked(kind, &archive, &partial, cache).and_then(|(files, bytes)| {
        let root_rel = find_root(&archive, &partial)?;
        let marker = Marker {
            format: 1,
            archive: archive.clone(),
            size: meta.len(),
            mtime_ns,
            root: root_rel.clone(),
            files,
            bytes,
        };
        let text = serde_json::to_vec_pretty(&marker).map_err(|e| {
            io_err(
                &partial.join(EXTRACTED_MARKER),
                std::io::Error::other(e.to_string()),
            )
        })?;
        tchrun::files::write_atomic(&partial.join(EXTRACTED_MARKER), &text)
            .map_err(|e| io_err(&e.path, e.source))?;
        match stop_now() {
            Some(e) => Err(e),
            None => Ok((root_rel, files, bytes)),
        }
    });
    let (root_rel, files, bytes) = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = fs::remove_dir_all(&partial);
            return Err(e);
        }
    };
    let renamed = fs::rename(&partial, &dir);
    drop(guard);
    if let Some(signal) = tchrun::interrupt::received() {
        // Came after the last check: the extraction is complete (or gone); the signal now has
        // its usual effect.
        if let Ok(sig) = nix::sys::signal::Signal::try_from(signal) {
            let _ = nix::sys::signal::raise(sig);
        }
    }
    if let Err(e) = renamed {
        let _ = fs::remove_dir_all(&partial);
        // Another job published the same archive first: use its folder.
        return read_complete(&archive, &dir)
            .map(Some)
            .ok_or_else(|| io_err(&dir, e));
    }
    Ok(Some(Extracted {
        archive,
        root: dir.join(&root_rel),
        dir,
        reused: false,
        files,
        bytes,
    }))
}

/// A complete extraction of `archive` in `dir` (its marker matches), if any.
fn read_complete(archive: &Path, dir: &Path) -> Option<Extracted> {
    let text =
        tchrun::files::read_bounded(&dir.join(EXTRACTED_MARKER), tchrun::files::caps::RECORD)
            .ok()?;
    let m: Marker = serde_json::from_slice(&text).ok()?;
    let root = dir.join(&m.root);
    (m.format == 1 && m.archive == archive && root.is_dir()).then(|| Extracted {
        archive: archive.to_path_buf(),
        dir: dir.to_path_buf(),
        root,
        reused: true,
        files: m.files,
        bytes: m.bytes,
    })
}

/// This host's name as a file-name part (partial folders of other hosts, on a shared file
/// system, are never judged by this host's process table).
fn host_tag() -> String {
    nix::unistd::gethostname()
        .map(|h| {
            h.to_string_lossy()
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .take(64)
                .collect()
        })
        .unwrap_or_else(|_| "host".into())
}

/// Removes this host's `.<name>.partial-<host>-<pid>` folders whose process is gone (bounded
/// by the listing).
fn remove_dead_partials(cache: &Path, name: &str) {
    let prefix = format!(".{name}.partial-{}-", host_tag());
    let Ok(rd) = fs::read_dir(cache) else { return };
    for entry in rd.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = file.strip_prefix(&prefix) else {
            continue;
        };
        let alive = pid.parse::<u32>().is_ok_and(|p| {
            p != std::process::id() && Path::new("/proc").join(p.to_string()).exists()
        });
        if !alive {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}
#[cfg(test)]
mod tests {
    use super::extract::Budget;
    use super::*;

    #[test]
    fn member_paths() {
        assert_eq!(
            member_path("a/b.png").unwrap(),
            Some(PathBuf::from("a/b.png"))
        );
        assert_eq!(
            member_path("./a//b.png").unwrap(),
            Some(PathBuf::from("a/b.png"))
        );
        assert_eq!(
            member_path("a\\b.png").unwrap(),
            Some(PathBuf::from("a/b.png"))
        );
        assert_eq!(member_path("./").unwrap(), None);
        assert_eq!(member_path("__MACOSX/a/._b.png").unwrap(), None);
        for bad in [
            "../x.png",
            "a/../../x.png",
            "..\\x.png",
            "/etc/x.png",
            "\\x",
            "C:\\x.png",
        ] {
            assert!(member_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kinds() {
        let k = |p: &str| ArchiveKind::of(Path::new(p));
        assert_eq!(k("/d/set.zip"), Some((ArchiveKind::Zip, "set".into())));
        assert_eq!(k("set.TAR.GZ"), Some((ArchiveKind::TarGz, "set".into())));
        assert_eq!(k("set.tgz"), Some((ArchiveKind::TarGz, "set".into())));
        assert_eq!(k("a.b.tar"), Some((ArchiveKind::Tar, "a.b".into())));
        assert_eq!(k("train"), None);
        assert_eq!(k(".zip"), None);
        assert_eq!(k("x.png"), None);
    }

    #[test]
    fn budget_limits() {
        let a = Path::new("/d/a.zip");
        let mut b = Budget {
            limit: 100,
            free: Some(50),
            used: 0,
            members: 0,
            delay: None,
        };
        b.add(a, "x", 40).unwrap();
        let m = b.add(a, "y", 20).unwrap_err().to_string();
        assert!(
            m.contains("free") && m.contains(DATA_CACHE_ENV) && m.contains("'y'"),
            "{m}"
        );
        b.free = None;
        b.add(a, "z", 40).unwrap();
        let m = b.add(a, "w", 1).unwrap_err().to_string();
        assert!(
            m.starts_with("BadArchiveError: /d/a.zip") && m.contains(MAX_UNPACKED_ENV),
            "{m}"
        );
    }
}
