//! The image folder scan: torchvision's `ImageFolder` layout (`ROOT/<class>/<image>`), the
//! seed's dataset errors, and the class sets of train and valid compared.
use crate::dataset::{name_of, ImageFolder, Sample};
use crate::error::{io_err, DatasetError};
use crate::images::IMAGE_EXTENSIONS;
use crate::pack;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// ImageFolder
// ---------------------------------------------------------------------------------------------

const LAYOUT_HINT: &str = "images must be in one sub-folder per class: ROOT/<class>/<image>";

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
/// the byte order of their names. Symlinks are followed. Only the listing's own file types are
/// read (no `stat` per file, like Python's `os.scandir`): a link, or an entry of unknown type,
/// is `stat`ed.
pub(super) fn list_dir(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>), DatasetError> {
    let mut dirs = Vec::new();
    let mut images = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| io_err(dir, e))? {
        let entry = entry.map_err(|e| io_err(dir, e))?;
        let name = entry.file_name();
        if is_hidden(&name) {
            continue;
        }
        let path = entry.path();
        let is_dir = match entry.file_type() {
            Ok(t) if t.is_dir() => true,
            Ok(t) if t.is_file() => false,
            // fs::metadata follows symlinks. An image name that cannot be opened (a dangling
            // link, a vanished file) stays in the list, so that verification names it (or
            // skips and counts it) instead of losing it silently; so does one that is not a
            // regular file (a FIFO, a socket, a device): verification refuses it by what it is
            // (`files::open_regular`, never a blocking open).
            _ => fs::metadata(&path).is_ok_and(|m| m.is_dir()),
        };
        if is_dir {
            dirs.push(path);
        } else if has_image_ext(&name) {
            images.push(path);
        }
    }
    let by_name = |a: &PathBuf, b: &PathBuf| {
        let name = |p: &PathBuf| p.file_name().map(|n| n.as_encoded_bytes().to_vec());
        match (a.file_name(), b.file_name()) {
            (Some(x), Some(y)) => x.as_encoded_bytes().cmp(y.as_encoded_bytes()),
            _ => name(a).cmp(&name(b)),
        }
    };
    dirs.sort_unstable_by(by_name);
    images.sort_unstable_by(by_name);
    Ok((dirs, images))
}

/// Size and modification time (ns since the epoch) of a file, as the dataset index keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

    /// `None`: the file cannot be `stat`ed.
    pub fn read(path: &Path) -> Option<FileStat> {
        fs::metadata(path).ok().map(|m| FileStat::of(&m))
    }
}

impl ImageFolder {
    /// torchvision ImageFolder layout: one sub-folder per class holding images. See module docs.
    ///
    /// Unlike torchvision, class folders are not searched recursively: images must be directly
    /// inside `ROOT/<class>/`. A class folder holding only sub-folders is reported as
    /// `NotLabeled` (nested layout), with a hint to pass the right folder.
    /// The class folders are listed on several threads: on a network file system each
    /// listing is a round trip, and the round trips overlap.
    ///
    /// A packed directory (`tchrun data pack`) gives the samples of the folder it was packed
    /// from, read from its shards (`pack::open`).
    pub fn scan(root: &Path) -> Result<ImageFolder, DatasetError> {
        if pack::is_pack(root) {
            return pack::open(root);
        }
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
        for (label, (dir, listing)) in class_dirs.iter().zip(listings).enumerate() {
            let (sub_dirs, images) = listing?;
            check_class_listing(root, dir, &sub_dirs, images.len())?;
            classes.push(name_of(dir));
            samples.extend(images.into_iter().map(|path| Sample {
                path,
                label,
                member: None,
            }));
        }
        if samples.is_empty() {
            return Err(DatasetError::Empty {
                path: root.to_path_buf(),
                detail: format!("no images found; {LAYOUT_HINT}"),
            });
        }
        Ok(ImageFolder {
            root: root.to_path_buf(),
            classes,
            samples,
        })
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

type Listing = Result<(Vec<PathBuf>, Vec<PathBuf>), DatasetError>;

/// `list_dir` of each folder, in order, on up to 16 threads.
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
                let listing = list_dir(dir);
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
