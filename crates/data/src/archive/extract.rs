//! Extracting an archive's members with the checks of `archive`'s module docs: member paths,
//! links, sizes (declared and real), the unpacked-size and free-space budget, a signal between
//! members or reads; the zip and tar readers; the image folder's root inside the extraction.
use super::kind::ArchiveKind;
use super::limits::{max_unpacked_bytes, DEFLATE_MAX_RATIO, MAX_ARCHIVE_MEMBERS, MAX_UNPACKED_ENV};
use crate::dataset::{name_of, ImageFolder};
use crate::error::{io_err, DatasetError};
use crate::folder::list_dir;
use std::fs;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use tchrun::files::DATA_CACHE_ENV;

/// The member's path inside the extraction folder, or why it is refused. Both `/` and `\`
/// count as separators for the checks (archives made on Windows).
pub fn member_path(name: &str) -> Result<Option<PathBuf>, String> {
    if name.starts_with('/') || name.starts_with('\\') {
        return Err("has an absolute path".into());
    }
    let b = name.as_bytes();
    if b.len() >= 2 && b[1] == b':' && b[0].is_ascii_alphabetic() {
        return Err("has an absolute (drive letter) path".into());
    }
    let mut out = PathBuf::new();
    for part in name.split(['/', '\\']) {
        match part {
            "" | "." => {}
            ".." => return Err("has a path that escapes the folder (`..`)".into()),
            p if p.contains('\0') => return Err("has a NUL byte in its path".into()),
            p => out.push(p),
        }
    }
    if out.as_os_str().is_empty() {
        return Ok(None);
    }
    // macOS Finder's resource forks, never images of the dataset.
    if out
        .components()
        .next()
        .is_some_and(|c| c.as_os_str() == "__MACOSX")
    {
        return Ok(None);
    }
    Ok(Some(out))
}

/// Size limits of one extraction.
pub(super) struct Budget {
    pub(super) limit: u64,
    pub(super) free: Option<u64>,
    pub(super) used: u64,
    pub(super) members: u64,
    /// `TCHRUN_TEST_EXTRACT_DELAY_MS`.
    pub(super) delay: Option<std::time::Duration>,
}

impl Budget {
    /// Before each member: stop when a signal came (see `resolve`); the test hook's pause.
    fn next_member(&self, archive: &Path) -> Result<(), DatasetError> {
        if let Some(signal) = tchrun::interrupt::received() {
            return Err(interrupted(archive, signal));
        }
        if let Some(d) = self.delay {
            std::thread::sleep(d);
        }
        Ok(())
    }

    pub(super) fn add(
        &mut self,
        archive: &Path,
        member: &str,
        size: u64,
    ) -> Result<(), DatasetError> {
        self.members += 1;
        if self.members > MAX_ARCHIVE_MEMBERS {
            return Err(bad_archive(
                archive,
                format!(
                    "holds more than {MAX_ARCHIVE_MEMBERS} members; split the dataset into \
                     several archives or extract it yourself"
                ),
            ));
        }
        self.used = self.used.saturating_add(size);
        if self.used > self.limit {
            return Err(bad_archive(
                archive,
                format!(
                    "unpacks to more than {} bytes (reached at member '{member}'), above the \
                     limit of {} bytes (a zip bomb?); extract it yourself and pass the folder, \
                     or raise {MAX_UNPACKED_ENV}",
                    self.limit, self.limit
                ),
            ));
        }
        if let Some(free) = self.free {
            if self.used > free {
                return Err(bad_archive(
                    archive,
                    format!(
                        "unpacks to more than {} bytes (reached at member '{member}') but the \
                         cache's file system has {free} bytes free; free space, or set \
                         {DATA_CACHE_ENV} to a folder on a larger file system",
                        self.used
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Extracts every member into `into` with the checks of the module docs; (files, bytes).
pub(super) fn extract_checked(
    kind: ArchiveKind,
    archive: &Path,
    into: &Path,
    cache: &Path,
) -> Result<(u64, u64), DatasetError> {
    let mut budget = Budget {
        limit: max_unpacked_bytes()?,
        free: tchrun::files::free_bytes(cache),
        used: 0,
        members: 0,
        delay: test_delay(),
    };
    let (file, _) = tchrun::files::open_regular(archive, u64::MAX)
        .map_err(|e| bad_archive(archive, e.to_string()))?;
    match kind {
        ArchiveKind::Zip => extract_zip(archive, file, into, &mut budget),
        ArchiveKind::Tar => extract_tar(archive, BufReader::new(file), into, &mut budget),
        ArchiveKind::TarGz => extract_tar(
            archive,
            flate2::read::MultiGzDecoder::new(BufReader::new(file)),
            into,
            &mut budget,
        ),
    }
}

/// Creates `rel` (a checked member path) under `into` as a new file and fills it from `data`,
/// refusing more than `max` bytes; the bytes written.
fn write_member(
    archive: &Path,
    member: &str,
    into: &Path,
    rel: &Path,
    data: &mut dyn Read,
    max: u64,
) -> Result<u64, DatasetError> {
    let path = into.join(rel);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
    }
    let mut out = match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(bad_archive(
                archive,
                format!(
                    "member '{member}' appears twice (or also as a folder); rebuild the archive \
                     with each file once"
                ),
            ))
        }
        Err(e) => return Err(io_err(&path, e)),
    };
    let mut limited = Stoppable(data).take(max.saturating_add(1));
    let n = std::io::copy(&mut limited, &mut out).map_err(|e| {
        if let Some(signal) = tchrun::interrupt::received() {
            return interrupted(archive, signal);
        }
        bad_archive(
            archive,
            format!("member '{member}' cannot be read ({e}); the archive is corrupt or truncated"),
        )
    })?;
    out.flush().map_err(|e| io_err(&path, e))?;
    Ok(n)
}

fn extract_zip(
    archive: &Path,
    file: fs::File,
    into: &Path,
    budget: &mut Budget,
) -> Result<(u64, u64), DatasetError> {
    let corrupt = |e: zip::result::ZipError| {
        bad_archive(
            archive,
            format!("is not a readable zip archive ({e}); re-create it"),
        )
    };
    let mut z = zip::ZipArchive::new(BufReader::new(file)).map_err(corrupt)?;
    // Pass 1, from the central directory: names, kinds and declared sizes, before any write.
    let mut plan = Vec::with_capacity(z.len());
    for i in 0..z.len() {
        // by_index (not _raw) refuses encrypted members ("Password required") before any write.
        let f = z.by_index(i).map_err(corrupt)?;
        let name = f.name().to_string();
        let refuse = |why: &str| {
            bad_archive(
                archive,
                format!("member '{name}' {why}; rebuild the archive from a plain folder of images"),
            )
        };
        let rel = member_path(&name).map_err(|why| refuse(&why))?;
        if let Some(mode) = f.unix_mode() {
            let kind = mode & 0o170000;
            if kind == 0o120000 {
                return Err(refuse("is a symbolic link (links are refused)"));
            }
            if kind != 0 && kind != 0o100000 && kind != 0o040000 {
                return Err(refuse("is not a regular file or folder"));
            }
        }
        let Some(rel) = rel else { continue };
        if f.is_dir() {
            plan.push((i, name, rel, None));
            continue;
        }
        let (size, packed) = (f.size(), f.compressed_size());
        let most = match f.compression() {
            zip::CompressionMethod::Stored => packed,
            zip::CompressionMethod::Deflated => packed
                .saturating_mul(DEFLATE_MAX_RATIO)
                .saturating_add(1024),
            other => {
                return Err(refuse(&format!(
                    "uses compression {other:?} (tchrun reads stored and deflated members)"
                )))
            }
        };
        if size > most {
            return Err(refuse(&format!(
                "declares {size} bytes unpacked, more than its {packed} compressed bytes can \
                 hold (a zip bomb or a corrupt archive)"
            )));
        }
        budget.add(archive, &name, size)?;
        plan.push((i, name, rel, Some(size)));
    }
    // Pass 2: write, never more than declared.
    let (mut files, mut bytes) = (0u64, 0u64);
    for (i, name, rel, size) in plan {
        budget.next_member(archive)?;
        let Some(size) = size else {
            let d = into.join(&rel);
            fs::create_dir_all(&d).map_err(|e| io_err(&d, e))?;
            continue;
        };
        let mut f = z.by_index(i).map_err(corrupt)?;
        let n = write_member(archive, &name, into, &rel, &mut f, size)?;
        if n != size {
            return Err(bad_archive(
                archive,
                format!(
                    "member '{name}' holds {} bytes but declares {size} (a zip bomb or a corrupt \
                     archive); re-create the archive",
                    if n > size {
                        format!("more than {size}")
                    } else {
                        n.to_string()
                    }
                ),
            ));
        }
        files += 1;
        bytes += n;
    }
    Ok((files, bytes))
}

fn extract_tar(
    archive: &Path,
    reader: impl Read,
    into: &Path,
    budget: &mut Budget,
) -> Result<(u64, u64), DatasetError> {
    let corrupt = |e: std::io::Error| {
        bad_archive(
            archive,
            format!("is not a readable tar archive ({e}); re-create it"),
        )
    };
    let mut ar = tar::Archive::new(reader);
    let (mut files, mut bytes) = (0u64, 0u64);
    for entry in ar.entries().map_err(corrupt)? {
        budget.next_member(archive)?;
        let mut entry = entry.map_err(corrupt)?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let refuse = |why: &str| {
            bad_archive(
                archive,
                format!("member '{name}' {why}; rebuild the archive from a plain folder of images"),
            )
        };
        use tar::EntryType as T;
        let kind = entry.header().entry_type();
        match kind {
            T::Regular | T::Continuous | T::Directory => {}
            T::Symlink => return Err(refuse("is a symbolic link (links are refused)")),
            T::Link => return Err(refuse("is a hard link (links are refused)")),
            // pax global headers carry no file.
            T::XGlobalHeader => continue,
            _ => return Err(refuse("is not a regular file or folder")),
        }
        let Some(rel) = member_path(&name).map_err(|why| refuse(&why))? else {
            continue;
        };
        if kind == T::Directory {
            let d = into.join(&rel);
            fs::create_dir_all(&d).map_err(|e| io_err(&d, e))?;
            continue;
        }
        let size = entry.size();
        budget.add(archive, &name, size)?;
        let n = write_member(archive, &name, into, &rel, &mut entry, size)?;
        if n != size {
            return Err(refuse(&format!(
                "holds {n} bytes but declares {size}: the archive is truncated"
            )));
        }
        files += 1;
        bytes += n;
    }
    Ok((files, bytes))
}

/// The image folder inside an extraction: the folder itself, or its single top-level folder
/// when that holds only folders (the class folders); checked with [`ImageFolder::scan`], whose
/// refusals then name the archive.
pub(super) fn find_root(archive: &Path, dir: &Path) -> Result<String, DatasetError> {
    let (top_dirs, top_images) = list_dir(dir)?;
    let mut rel = String::new();
    if top_dirs.len() == 1 && top_images.is_empty() {
        let (sub_dirs, sub_images) = list_dir(&top_dirs[0])?;
        if !sub_dirs.is_empty() && sub_images.is_empty() {
            rel = name_of(&top_dirs[0]);
        }
    }
    let inside = |detail: String| {
        format!(
            "{detail} (inside the archive; it must hold <class>/<image>, or one folder holding \
             the class folders)"
        )
    };
    match ImageFolder::scan(&dir.join(&rel)) {
        Ok(_) => Ok(rel),
        Err(DatasetError::NotLabeled { detail, .. }) => Err(DatasetError::NotLabeled {
            path: archive.to_path_buf(),
            detail: inside(detail),
        }),
        Err(DatasetError::Empty { path, detail }) => Err(DatasetError::Empty {
            path: archive.to_path_buf(),
            detail: inside(format!(
                "{}: {detail}",
                path.strip_prefix(dir).unwrap_or(&path).display()
            )),
        }),
        Err(e) => Err(e),
    }
}

pub(super) fn bad_archive(path: &Path, detail: impl Into<String>) -> DatasetError {
    DatasetError::BadArchive {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

pub(super) fn interrupted(archive: &Path, signal: i32) -> DatasetError {
    DatasetError::Interrupted {
        path: archive.to_path_buf(),
        signal,
    }
}

/// The test hook `TCHRUN_TEST_EXTRACT_DELAY_MS`: a pause before each member.
fn test_delay() -> Option<std::time::Duration> {
    std::env::var(tchrun::env::TCHRUN_TEST_EXTRACT_DELAY_MS)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(std::time::Duration::from_millis)
}

/// A reader that fails once a signal was received (`interrupt::received`), so that a large
/// member's copy stops too.
struct Stoppable<'a>(&'a mut dyn Read);

impl Read for Stoppable<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if tchrun::interrupt::received().is_some() {
            return Err(std::io::Error::other("interrupted by a signal"));
        }
        self.0.read(buf)
    }
}
