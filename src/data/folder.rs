//! The image folder scan: torchvision's `ImageFolder` layout (`ROOT/<class>/<image>`), the
//! seed's dataset errors, and the class sets of train and valid compared.
use super::*;

// ---------------------------------------------------------------------------------------------
// ImageFolder
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub path: PathBuf,
    pub label: usize,
}

#[derive(Debug, Clone)]
pub struct ImageFolder {
    pub root: PathBuf,
    pub classes: Vec<String>,
    pub samples: Vec<Sample>,
}

pub(super) fn is_hidden(name: &std::ffi::OsStr) -> bool {
    name.as_encoded_bytes().first() == Some(&b'.')
}

pub(super) fn has_image_ext(name: &std::ffi::OsStr) -> bool {
    Path::new(name)
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| IMAGE_EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
        .unwrap_or(false)
}

/// Non-hidden entries of `dir`, split into (sub-directories, image files), each sorted by
/// the byte order of their names. Symlinks are followed.
pub(super) fn list_dir(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>), DatasetError> {
    let (dirs, images) = list_dir_stat(dir)?;
    Ok((dirs, images.into_iter().map(|(p, _)| p).collect()))
}

/// Size and modification time (ns since the epoch) of a file, as the dataset index keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    pub size: u64,
    pub mtime_ns: i64,
}

impl FileStat {
    pub fn of(meta: &fs::Metadata) -> FileStat {
        use std::os::unix::fs::MetadataExt;
        FileStat {
            size: meta.len(),
            mtime_ns: meta.mtime().saturating_mul(1_000_000_000) + meta.mtime_nsec(),
        }
    }
}

/// `list_dir` with each image's `FileStat` (`None`: it could not be stat'ed, e.g. a dangling
/// link; verification names it).
pub(super) fn list_dir_stat(
    dir: &Path,
) -> Result<(Vec<PathBuf>, Vec<(PathBuf, Option<FileStat>)>), DatasetError> {
    let mut dirs = Vec::new();
    let mut images = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| io_err(dir, e))? {
        let entry = entry.map_err(|e| io_err(dir, e))?;
        let name = entry.file_name();
        if is_hidden(&name) {
            continue;
        }
        let path = entry.path();
        // fs::metadata follows symlinks. An image name that cannot be opened (a dangling link,
        // a vanished file) stays in the list, so that verification names it (or skips and
        // counts it) instead of losing it silently.
        let Ok(meta) = fs::metadata(&path) else {
            if has_image_ext(&name) {
                images.push((path, None));
            }
            continue;
        };
        if meta.is_dir() {
            dirs.push(path);
        } else if meta.is_file() && has_image_ext(&name) {
            images.push((path, Some(FileStat::of(&meta))));
        }
    }
    let key = |p: &PathBuf| p.file_name().map(|n| n.as_encoded_bytes().to_vec());
    dirs.sort_by_key(key);
    images.sort_by(|a, b| key(&a.0).cmp(&key(&b.0)));
    Ok((dirs, images))
}

pub(super) fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl ImageFolder {
    /// torchvision ImageFolder layout: one sub-folder per class holding images. See module docs.
    ///
    /// Unlike torchvision, class folders are not searched recursively: images must be directly
    /// inside `ROOT/<class>/`. A class folder holding only sub-folders is reported as
    /// `NotLabeled` (nested layout), with a hint to pass the right folder.
    pub fn scan(root: &Path) -> Result<ImageFolder, DatasetError> {
        Ok(Self::scan_stat(root)?.0)
    }

    /// `scan`, also giving each sample's `FileStat` (in sample order). The class folders are
    /// listed on several threads: on a network file system each listing and each `stat` is a
    /// round trip, and the round trips overlap.
    pub fn scan_stat(root: &Path) -> Result<(ImageFolder, Vec<Option<FileStat>>), DatasetError> {
        let meta = fs::metadata(root).map_err(|e| io_err(root, e))?;
        if !meta.is_dir() {
            return Err(DatasetError::NotLabeled {
                path: root.to_path_buf(),
                detail: format!("is not a directory; pass the dataset folder, {LAYOUT_HINT}"),
            });
        }
        let (class_dirs, loose_images) = list_dir(root)?;
        if class_dirs.is_empty() {
            if !loose_images.is_empty() {
                return Err(DatasetError::NotLabeled {
                    path: root.to_path_buf(),
                    detail: format!(
                        "holds {} image file(s) (e.g. {}) but no class sub-folders; {LAYOUT_HINT} \
                         (move each image into the folder named after its class)",
                        loose_images.len(),
                        name_of(&loose_images[0])
                    ),
                });
            }
            return Err(DatasetError::Empty {
                path: root.to_path_buf(),
                detail: format!("no class sub-folders and no images found; {LAYOUT_HINT}"),
            });
        }
        let listings = list_dirs_parallel(&class_dirs);
        let mut classes = Vec::with_capacity(class_dirs.len());
        let mut samples = Vec::new();
        let mut stats = Vec::new();
        for (label, (dir, listing)) in class_dirs.iter().zip(listings).enumerate() {
            let (sub_dirs, images) = listing?;
            check_class_listing(root, dir, &sub_dirs, images.len())?;
            classes.push(name_of(dir));
            for (path, stat) in images {
                samples.push(Sample { path, label });
                stats.push(stat);
            }
        }
        if samples.is_empty() {
            return Err(DatasetError::Empty {
                path: root.to_path_buf(),
                detail: format!("no images found; {LAYOUT_HINT}"),
            });
        }
        Ok((
            ImageFolder {
                root: root.to_path_buf(),
                classes,
                samples,
            },
            stats,
        ))
    }

    /// Compare the class sets of train and valid.
    pub fn check_same_classes(
        train: &ImageFolder,
        valid: &ImageFolder,
    ) -> Result<(), DatasetError> {
        if train.classes == valid.classes {
            return Ok(());
        }
        let t: BTreeSet<&str> = train.classes.iter().map(|s| s.as_str()).collect();
        let v: BTreeSet<&str> = valid.classes.iter().map(|s| s.as_str()).collect();
        let only_t: Vec<&str> = t.difference(&v).copied().collect();
        let only_v: Vec<&str> = v.difference(&t).copied().collect();
        Err(DatasetError::InvalidDataset {
            detail: format!(
                "train ({}) and valid ({}) have different classes: only in train: [{}]; only in \
                 valid: [{}]. Make both folders hold the same class sub-folders",
                train.root.display(),
                valid.root.display(),
                only_t.join(", "),
                only_v.join(", ")
            ),
        })
    }
}

type Listing = Result<(Vec<PathBuf>, Vec<(PathBuf, Option<FileStat>)>), DatasetError>;

/// `list_dir_stat` of each folder, in order, on up to 16 threads.
pub(super) fn list_dirs_parallel(dirs: &[PathBuf]) -> Vec<Listing> {
    let threads = dirs.len().clamp(1, 16);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Option<Listing>> = (0..dirs.len()).map(|_| None).collect();
    let slots = std::sync::Mutex::new(&mut out);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(dir) = dirs.get(i) else { break };
                let listing = list_dir_stat(dir);
                if let Ok(mut slots) = slots.lock() {
                    slots[i] = Some(listing);
                }
            });
        }
    });
    out.into_iter()
        .zip(dirs)
        .map(|(l, d)| {
            l.unwrap_or_else(|| {
                Err(DatasetError::InvalidDataset {
                    detail: format!("listing {} did not finish", d.display()),
                })
            })
        })
        .collect()
}

/// The rules for one class folder's listing: images directly inside it.
pub(super) fn check_class_listing(
    root: &Path,
    dir: &Path,
    sub_dirs: &[PathBuf],
    images: usize,
) -> Result<(), DatasetError> {
    if images > 0 {
        return Ok(());
    }
    if !sub_dirs.is_empty() {
        return Err(DatasetError::NotLabeled {
            path: root.to_path_buf(),
            detail: format!(
                "class folder '{}' holds no images, only sub-folders (e.g. '{}'): the \
                 layout looks nested; {LAYOUT_HINT} with images directly inside each \
                 class folder. If '{}' is itself the dataset, pass {} instead",
                name_of(dir),
                name_of(&sub_dirs[0]),
                name_of(dir),
                dir.display()
            ),
        });
    }
    Err(DatasetError::Empty {
        path: dir.to_path_buf(),
        detail: format!(
            "class folder '{}' holds no images ({}); add images to it or remove it",
            name_of(dir),
            IMAGE_EXTENSIONS.join("/")
        ),
    })
}
