//! The dataset index: an image folder's file list, made once per dataset and reused by every
//! rank of every job, so that no rank lists the class folders and a second job on unchanged
//! data reads no image header before its first step.
//!
//! What it holds: the class folders in label order with their modification times, every
//! image (name, size, mtime) in sample order, the root folder's mtime, the time the listing
//! started, and, once made, the header verification's result (the pixel limit it used and
//! the bad files with their reasons).
//!
//! Where it lives: in the cache, `$TCHRUN_DATA_CACHE/index/` (else `$XDG_CACHE_HOME/tchrun/`,
//! else `~/.cache/tchrun/index/`), under a name made of the folder's name and a hash of its
//! canonical path; never inside the data folder, which may be read-only and which
//! torchvision's `ImageFolder` would misread (it takes every sub-folder, hidden ones too, for a
//! class). The launcher names the file in its log and gives the ranks a copy in the job's log
//! directory (which every node sees).
//!
//! When it is trusted: adding, removing or renaming a file changes its folder's mtime, so the
//! index is valid while the root's and every class folder's mtime equal the recorded ones
//! (`Check::Stamps`: one `stat` per class, what a rank does). The launcher also re-`stat`s a
//! sample of the files and every file recorded as bad (`Check::Thorough`), and re-lists a
//! folder whose mtime is within `RACY_NS` of the listing time (a change in the same clock
//! tick as the listing would not show in the mtime; git's "racy" rule). Anything else
//! rebuilds the index, and the log says why.
use super::*;
use serde::{Deserialize, Serialize};

/// Above this many images whose headers were never verified, a training job does not verify
/// them before its first step: each image gets the same checks when it is first decoded
/// (`verify::check_decoded`), and `tchrun data index` verifies a large set once and for all.
/// Measured (BENCHMARKS.md, "Dataset index"): the up-front check reads ~45,000 headers a
/// second warm on 2 cores, ~17,000 cold: 50,000 images cost ~1 s warm, the most a small
/// set's start may lose to it.
pub const UPFRONT_VERIFY_LIMIT: usize = 50_000;
/// `UPFRONT_VERIFY_LIMIT`, or `$TCHRUN_VERIFY_UPFRONT_MAX` when set to a number.
pub fn upfront_limit() -> usize {
    std::env::var(tchrun::env::TCHRUN_VERIFY_UPFRONT_MAX)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(UPFRONT_VERIFY_LIMIT)
}

/// A folder whose mtime is this close to (or after) the listing's start is re-listed before
/// the index is trusted (coarse file-system clocks: NFS, FAT, some FUSE mounts).
pub const RACY_NS: i64 = 2_000_000_000;
/// Files re-`stat`ed by `Check::Thorough` (besides the bad ones).
const SAMPLED_STATS: usize = 256;
const MAGIC: &[u8; 8] = b"TCHRIDX2";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassEntry {
    pub name: String,
    pub mtime_ns: i64,
    /// File names, in sample order.
    pub files: Vec<String>,
}

/// The header verification's result for every file of the index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Headers {
    pub max_pixels: u64,
    /// `(sample index, reason, its stat then)`, in sample order.
    pub bad: Vec<(u32, String, Option<FileStat>)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetIndex {
    /// Wall-clock time (ns) just before the listing started.
    pub listed_ns: i64,
    pub root_mtime_ns: i64,
    pub classes: Vec<ClassEntry>,
    /// A spread of files with their stat when listed (`None`: could not be `stat`ed), which
    /// `Check::Thorough` compares: a file rewritten in place keeps its folder's mtime.
    pub sampled: Vec<(u32, Option<FileStat>)>,
    pub headers: Option<Headers>,
}

/// How much `DatasetIndex::check` looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The folders' mtimes only (a rank, after the launcher's thorough check).
    Stamps,
    /// Also sampled file stats, the bad files' stats and racy folders re-listed.
    Thorough,
}

/// Why an index cannot be used (the log's words).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stale(pub String);

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

fn mtime_of(path: &Path) -> std::io::Result<i64> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path)?;
    Ok(m.mtime().saturating_mul(1_000_000_000) + m.mtime_nsec())
}

fn utf8(path: &Path) -> Result<String, Stale> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| Stale(format!("{}: the name is not UTF-8", path.display())))
}

impl DatasetIndex {
    /// Lists `root` (the rules of `ImageFolder::scan`) and indexes it; headers unverified.
    /// `Err(Ok(_))` is a dataset error (the folder is not a dataset); `Err(Err(_))` means the
    /// folder cannot be indexed (a name that is not UTF-8) but can be scanned.
    pub fn build(root: &Path) -> Result<(DatasetIndex, ImageFolder), Result<DatasetError, Stale>> {
        let listed_ns = now_ns();
        let root_mtime_ns = mtime_of(root).map_err(|e| Ok(io_err(root, e)))?;
        let folder = ImageFolder::scan(root).map_err(Ok)?;
        let mut classes: Vec<ClassEntry> = Vec::with_capacity(folder.classes.len());
        for name in &folder.classes {
            let dir = root.join(name);
            classes.push(ClassEntry {
                name: name.clone(),
                mtime_ns: mtime_of(&dir).map_err(|e| Ok(io_err(&dir, e)))?,
                files: Vec::new(),
            });
        }
        for s in &folder.samples {
            classes[s.label].files.push(utf8(&s.path).map_err(Err)?);
        }
        let n = folder.samples.len();
        let step = (n / SAMPLED_STATS).max(1);
        let start = (listed_ns as u64 % step as u64) as usize;
        let sampled = (start..n)
            .step_by(step)
            .map(|i| (i as u32, FileStat::read(&folder.samples[i].path)))
            .collect();
        let index = DatasetIndex {
            listed_ns,
            root_mtime_ns,
            classes,
            sampled,
            headers: None,
        };
        Ok((index, folder))
    }

    pub fn len(&self) -> usize {
        self.classes.iter().map(|c| c.files.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The image folder the index describes, rooted at `root`.
    pub fn folder(&self, root: &Path) -> ImageFolder {
        let mut samples = Vec::with_capacity(self.len());
        for (label, c) in self.classes.iter().enumerate() {
            let dir = root.join(&c.name);
            samples.extend(c.files.iter().map(|f| Sample {
                path: dir.join(f),
                label,
                member: None,
            }));
        }
        ImageFolder {
            root: root.to_path_buf(),
            classes: self.classes.iter().map(|c| c.name.clone()).collect(),
            samples,
        }
    }

    /// The relative path of sample `i`.
    fn relative(&self, mut i: usize) -> Option<String> {
        for c in &self.classes {
            if i < c.files.len() {
                return Some(format!("{}/{}", c.name, c.files[i]));
            }
            i -= c.files.len();
        }
        None
    }

    /// Whether the index still describes `root` (see the module docs). `Ok(true)`: valid, and
    /// racy folders were re-listed (the caller may rewrite the index with `listed_ns` moved
    /// on, so the next check need not list them again).
    pub fn check(&mut self, root: &Path, how: Check) -> Result<bool, Stale> {
        let changed = |what: String| Stale(format!("{what} changed since it was indexed"));
        let relist_from = now_ns();
        let racy = |mtime: i64| mtime >= self.listed_ns - RACY_NS;
        let root_mtime = mtime_of(root).map_err(|e| Stale(format!("{}: {e}", root.display())))?;
        if root_mtime != self.root_mtime_ns {
            return Err(changed(format!(
                "the folder {} (class folders added, removed or renamed?)",
                root.display()
            )));
        }
        let mut relisted = false;
        if how == Check::Thorough && racy(root_mtime) {
            let (dirs, _) = super::folder::list_dir(root).map_err(|e| Stale(e.to_string()))?;
            let names: Vec<String> = dirs.iter().map(|d| name_of(d)).collect();
            let known: Vec<&String> = self.classes.iter().map(|c| &c.name).collect();
            if names.iter().collect::<Vec<_>>() != known {
                return Err(changed(format!("the class folders of {}", root.display())));
            }
            relisted = true;
        }
        for c in &self.classes {
            let dir = root.join(&c.name);
            let m = mtime_of(&dir).map_err(|e| Stale(format!("{}: {e}", dir.display())))?;
            if m != c.mtime_ns {
                return Err(changed(format!(
                    "class folder '{}' (files added, removed or renamed?)",
                    c.name
                )));
            }
            if how == Check::Thorough && racy(m) {
                let (_, images) =
                    super::folder::list_dir(&dir).map_err(|e| Stale(e.to_string()))?;
                let same = images.len() == c.files.len()
                    && images
                        .iter()
                        .zip(&c.files)
                        .all(|(p, f)| p.file_name().and_then(|n| n.to_str()) == Some(f.as_str()));
                if !same {
                    return Err(changed(format!("class folder '{}'", c.name)));
                }
                relisted = true;
            }
        }
        if how == Check::Thorough {
            let bad = self
                .headers
                .iter()
                .flat_map(|h| h.bad.iter().map(|b| (b.0, b.2)));
            for (i, then) in self.sampled.iter().copied().chain(bad) {
                let Some(rel) = self.relative(i as usize) else {
                    continue;
                };
                if FileStat::read(&root.join(&rel)) != then {
                    return Err(changed(format!("{rel} (size or modification time)")));
                }
            }
        }
        if relisted {
            self.listed_ns = relist_from;
        }
        Ok(relisted)
    }

    /// The header verification, if it was made with this pixel limit.
    pub fn headers_for(&self, max_pixels: u64) -> Option<&Headers> {
        self.headers.as_ref().filter(|h| h.max_pixels == max_pixels)
    }

    /// Verifies every header (`verify::check_headers`) and records the result.
    pub fn verify_headers(&mut self, folder: &ImageFolder, max_pixels: u64) -> &Headers {
        let reasons = super::verify::check_headers(&folder.samples, max_pixels);
        let bad = reasons
            .into_iter()
            .enumerate()
            .filter_map(|(i, r)| r.map(|r| (i as u32, r, FileStat::read(&folder.samples[i].path))))
            .collect();
        self.headers.insert(Headers { max_pixels, bad })
    }

    pub fn read(path: &Path) -> Result<DatasetIndex, Stale> {
        let bytes = tchrun::files::read_bounded(path, tchrun::files::caps::DATASET_INDEX)
            .map_err(|e| Stale(e.to_string()))?;
        let body = bytes
            .strip_prefix(MAGIC.as_slice())
            .ok_or_else(|| Stale(format!("{}: not a tchrun dataset index", path.display())))?;
        postcard::from_bytes(body)
            .map_err(|e| Stale(format!("{}: unreadable: {e}", path.display())))
    }

    /// Writes atomically (`files::write_atomic`).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut bytes = MAGIC.to_vec();
        bytes.extend(postcard::to_stdvec(self).map_err(std::io::Error::other)?);
        tchrun::files::write_atomic(path, &bytes).map_err(|e| e.source)
    }
}

impl Headers {
    /// Applies the verification to `folder` (the index's own): under `skip_bad` the bad
    /// samples are dropped and returned as `(path, reason)`; otherwise the first bad one is
    /// the error.
    pub fn apply(
        &self,
        folder: &mut ImageFolder,
        skip_bad: bool,
    ) -> Result<Vec<(PathBuf, String)>, DatasetError> {
        if self.bad.is_empty() {
            return Ok(Vec::new());
        }
        let mut reasons = vec![None; folder.samples.len()];
        for (i, r, _) in &self.bad {
            if let Some(slot) = reasons.get_mut(*i as usize) {
                *slot = Some(r.clone());
            }
        }
        folder.apply_verdicts(reasons, skip_bad)
    }
}

/// Where `root`'s index is kept (see the module docs).
pub fn location(root: &Path) -> PathBuf {
    let cache = super::archive::data_cache();
    let key = {
        use sha2::Digest;
        let canonical = fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        let d = sha2::Sha256::digest(canonical.as_os_str().as_encoded_bytes());
        d.iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    cache
        .join("index")
        .join(format!("{}-{key}.v1", name_of(root)))
}

/// The outcome of `open`.
pub struct Opened {
    pub folder: ImageFolder,
    pub index: DatasetIndex,
    /// Where the index is (or `None`: it could not be written anywhere, or the folder cannot
    /// be indexed).
    pub path: Option<PathBuf>,
    /// For the log: reused, built, rebuilt and why; where.
    pub note: String,
}

/// The launcher's (and `tchrun data index`'s) way in: the valid index of `root` if there is
/// one (thorough check), else a new listing, written where `locations` says. Headers are
/// not verified here.
pub fn open(root: &Path) -> Result<Opened, DatasetError> {
    let t = std::time::Instant::now();
    let path = location(root);
    let mut why_not = None;
    if path.is_file() {
        let checked = DatasetIndex::read(&path).and_then(|mut index| {
            let relisted = index.check(root, Check::Thorough)?;
            Ok((index, relisted))
        });
        match checked {
            Ok((index, relisted)) => {
                if relisted {
                    // Racy folders were listed again and matched: the next job need not.
                    let _ = index.write(&path);
                }
                let note = format!(
                    "dataset index {} reused ({} images, {} classes; checked in {:.2} s)",
                    path.display(),
                    index.len(),
                    index.classes.len(),
                    t.elapsed().as_secs_f64()
                );
                return Ok(Opened {
                    folder: index.folder(root),
                    index,
                    path: Some(path),
                    note,
                });
            }
            Err(Stale(why)) => why_not = Some(why),
        }
    }
    let (index, folder) = match DatasetIndex::build(root) {
        Ok(x) => x,
        Err(Ok(e)) => return Err(e),
        Err(Err(Stale(why))) => {
            let folder = ImageFolder::scan(root)?;
            let note = format!("not indexed ({why}); the ranks list the folder themselves");
            let index = DatasetIndex {
                listed_ns: 0,
                root_mtime_ns: 0,
                classes: Vec::new(),
                sampled: Vec::new(),
                headers: None,
            };
            return Ok(Opened {
                folder,
                index,
                path: None,
                note,
            });
        }
    };
    let listed = t.elapsed().as_secs_f64();
    let verb = match &why_not {
        Some(why) => format!("rebuilt ({why})"),
        None => "built".to_string(),
    };
    let head = format!(
        "dataset index {verb}: {} images, {} classes listed in {listed:.2} s",
        index.len(),
        index.classes.len()
    );
    let (path, note) = match store(&index, &path) {
        Ok(()) => (Some(path.clone()), format!("{head}; in {}", path.display())),
        Err(e) => (
            None,
            format!(
                "{head}; not kept: {e} (set {} to a writable folder)",
                super::archive::DATA_CACHE_ENV
            ),
        ),
    };
    Ok(Opened {
        folder,
        index,
        path,
        note,
    })
}

/// Writes `index` to `path`, making its folder.
pub fn store(index: &DatasetIndex, path: &Path) -> Result<(), String> {
    path.parent()
        .map(fs::create_dir_all)
        .unwrap_or(Ok(()))
        .and_then(|()| index.write(path))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// A rank's way in: the index at `path` (the launcher's copy) or in the cache, if it passes
/// `Check::Stamps` for this rank's copy of the data. Never lists a folder.
pub fn load_for_rank(root: &Path, path: Option<&Path>) -> Result<(DatasetIndex, PathBuf), String> {
    let path = path
        .map(Path::to_path_buf)
        .unwrap_or_else(|| location(root));
    if !path.is_file() {
        return Err(format!(
            "no index for {} ({})",
            root.display(),
            path.display()
        ));
    }
    let mut ix = DatasetIndex::read(&path).map_err(|Stale(w)| w)?;
    ix.check(root, Check::Stamps).map_err(|Stale(w)| w)?;
    Ok((ix, path))
}
