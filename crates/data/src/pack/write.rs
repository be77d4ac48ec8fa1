//! `tchrun data pack`: an image folder written as tar shards (`KEY.ext` + `KEY.cls`) and the
//! index, built beside the output and renamed.
use super::format::{
    member_name, sample_key, shard_name, shard_order, PackIndex, SampleEntry, ShardEntry, BLOCK,
    FORMAT, PACK_INDEX, VERSION,
};
use crate::dataset::{name_of, sample_bytes, ImageFolder};
use crate::error::{io_err, DatasetError};
use image::ImageReader;
use std::fs;
use std::io::Cursor;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("{0}")]
    Dataset(#[from] DatasetError),
    #[error("--output {}: {detail}", path.display())]
    Output { path: PathBuf, detail: String },
    #[error("--shard-size {0}: {1}")]
    ShardSize(String, String),
}

#[derive(Debug, Clone)]
pub struct PackOptions {
    pub shard_size: u64,
    /// Seeds the order of the samples over the shards (`shard_order`).
    pub seed: i64,
    pub skip_bad: bool,
    pub max_pixels: u64,
}

#[derive(Debug, Clone)]
pub struct PackReport {
    pub samples: usize,
    pub classes: usize,
    pub shards: usize,
    pub bytes: u64,
    /// Images left out under `skip_bad`, with the reason.
    pub skipped: Vec<(PathBuf, String)>,
}

/// `--shard-size`: bytes, or a number with K, M or G (powers of 1024, `MB`/`MiB` alike).
pub fn parse_size(s: &str) -> Result<u64, PackError> {
    let err = |why: &str| PackError::ShardSize(s.to_string(), why.to_string());
    let t = s.trim();
    let digits = t.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = t[digits.len()..].to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => {
            return Err(err(
                "unknown unit; use bytes or a number with K, M or G (e.g. 256M)",
            ))
        }
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| err("not a size; use bytes or a number with K, M or G (e.g. 256M)"))?;
    let v = n.checked_mul(mult).ok_or_else(|| err("too large"))?;
    if v == 0 {
        return Err(err("must be more than 0"));
    }
    Ok(v)
}

/// Refuses an `--output` that exists and is not an empty directory.
pub fn check_output(output: &Path) -> Result<(), PackError> {
    let out = |detail: &str| PackError::Output {
        path: output.to_path_buf(),
        detail: detail.to_string(),
    };
    match fs::read_dir(output) {
        Ok(mut rd) => {
            if rd.next().is_some() {
                return Err(out(
                    "exists and is not empty; choose a new folder or remove it",
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) if output.exists() && !output.is_dir() => {
            Err(out(&format!("exists and is not a directory ({e})")))
        }
        Err(e) => Err(out(&format!("cannot be read: {e}"))),
    }
}

/// Bytes written, counted.
struct Counting<W> {
    inner: W,
    pos: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

struct ShardWriter {
    path: PathBuf,
    tar: tar::Builder<Counting<BufWriter<fs::File>>>,
    samples: usize,
}

fn tar_header(name: &str, len: u64) -> std::io::Result<tar::Header> {
    let mut h = tar::Header::new_ustar();
    h.set_path(name)?;
    h.set_size(len);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    Ok(h)
}

impl ShardWriter {
    fn create(path: PathBuf) -> std::io::Result<ShardWriter> {
        let f = fs::File::create(&path)?;
        Ok(ShardWriter {
            path,
            tar: tar::Builder::new(Counting {
                inner: BufWriter::with_capacity(1 << 20, f),
                pos: 0,
            }),
            samples: 0,
        })
    }

    fn pos(&self) -> u64 {
        self.tar.get_ref().pos
    }

    /// Appends one member; returns the offset of its data.
    fn append(&mut self, name: &str, data: &[u8]) -> std::io::Result<u64> {
        // A ustar header of a short name is one block: the data follows it.
        debug_assert!(name.len() < 100);
        let offset = self.pos() + BLOCK;
        self.tar
            .append(&tar_header(name, data.len() as u64)?, data)?;
        debug_assert_eq!(
            self.pos(),
            offset + (data.len() as u64).div_ceil(BLOCK) * BLOCK
        );
        Ok(offset)
    }

    /// Ends the archive, syncs it; returns its size.
    fn finish(self) -> std::io::Result<ShardEntry> {
        let counting = self.tar.into_inner()?;
        let bytes = counting.pos;
        let f = counting.inner.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        Ok(ShardEntry {
            name: name_of(&self.path),
            bytes,
            samples: self.samples,
        })
    }
}

/// Packs `folder` into `output` (see module docs): headers verified first (a bad image refuses
/// the pack, or is left out and reported under `skip_bad`), shards and index written in a
/// hidden folder beside `output`, renamed to `output` at the end.
pub fn pack(
    folder: &ImageFolder,
    output: &Path,
    opts: &PackOptions,
) -> Result<PackReport, PackError> {
    check_output(output)?;
    let mut folder = folder.clone();
    let skipped = folder.verify(opts.skip_bad, opts.max_pixels)?;
    let parent = output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = parent.join(format!(
        ".{}.tchrun-pack-{}",
        name_of(output),
        std::process::id()
    ));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let result = write_pack(&folder, &tmp, opts).and_then(|index| {
        let bytes = index.shards.iter().map(|s| s.bytes).sum();
        let report = PackReport {
            samples: index.samples.len(),
            classes: index.classes.len(),
            shards: index.shards.len(),
            bytes,
            skipped: skipped.clone(),
        };
        let text = serde_json::to_vec(&index).map_err(|e| io(&tmp)(std::io::Error::other(e)))?;
        let ix = tmp.join(PACK_INDEX);
        fs::File::create(&ix)
            .and_then(|mut f| f.write_all(&text).and_then(|_| f.sync_all()))
            .map_err(io(&ix))?;
        // An empty --output is replaced (rename cannot replace a directory that has entries).
        if output.is_dir() {
            fs::remove_dir(output).map_err(io(output))?;
        }
        fs::rename(&tmp, output).map_err(io(output))?;
        if let Ok(d) = fs::File::open(parent) {
            let _ = d.sync_all();
        }
        Ok(report)
    });
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    result
}

/// An I/O error at `path`, as a pack error (for `map_err`).
fn io(path: &Path) -> impl Fn(std::io::Error) -> PackError {
    let path = path.to_path_buf();
    move |e| {
        PackError::Dataset(DatasetError::Io {
            path: path.clone(),
            source: e,
        })
    }
}

fn write_pack(
    folder: &ImageFolder,
    dir: &Path,
    opts: &PackOptions,
) -> Result<PackIndex, PackError> {
    let mut shards = Vec::new();
    let mut entries: Vec<Option<SampleEntry>> = vec![None; folder.samples.len()];
    let mut cur: Option<ShardWriter> = None;
    let mut buf = Vec::new();
    // Written in a seeded random order (classes mixed in every shard); indexed in scan order.
    for i in shard_order(folder.samples.len(), opts.seed) {
        let smp = &folder.samples[i];
        sample_bytes(smp, &mut buf)?;
        let orig = smp
            .path
            .strip_prefix(&folder.root)
            .ok()
            .and_then(|p| p.to_str())
            .ok_or_else(|| DatasetError::BadImage {
                path: smp.path.clone(),
                detail: "the path is not UTF-8 (the pack index records it as text); rename the \
                         file"
                    .into(),
            })?
            .to_string();
        let (w, h) = ImageReader::new(Cursor::new(&buf[..]))
            .with_guessed_format()
            .map_err(|e| io_err(&smp.path, e))?
            .into_dimensions()
            .map_err(|e| DatasetError::BadImage {
                path: smp.path.clone(),
                detail: format!("corrupt or unsupported image header: {e}"),
            })?;
        let name = member_name(i, &orig);
        let cls = smp.label.to_string();
        let need = 2 * BLOCK + (buf.len() as u64).div_ceil(BLOCK) * BLOCK + 2 * BLOCK;
        if let Some(w) = cur.take() {
            if w.samples > 0 && w.pos() + need + 2 * BLOCK > opts.shard_size {
                let path = w.path.clone();
                shards.push(w.finish().map_err(io(&path))?);
            } else {
                cur = Some(w);
            }
        }
        let w_ = match cur.as_mut() {
            Some(w) => w,
            None => {
                let path = dir.join(shard_name(shards.len()));
                cur.insert(ShardWriter::create(path.clone()).map_err(io(&path))?)
            }
        };
        let path = w_.path.clone();
        let offset = w_.append(&name, &buf).map_err(io(&path))?;
        w_.append(&format!("{}.cls", sample_key(i)), cls.as_bytes())
            .map_err(io(&path))?;
        w_.samples += 1;
        entries[i] = Some(SampleEntry(
            shards.len(),
            offset,
            buf.len() as u64,
            crc32c::crc32c(&buf),
            smp.label,
            w,
            h,
            orig,
        ));
    }
    if let Some(w) = cur {
        let path = w.path.clone();
        shards.push(w.finish().map_err(io(&path))?);
    }
    Ok(PackIndex {
        format: FORMAT.into(),
        version: VERSION,
        source: folder.root.display().to_string(),
        classes: folder.classes.clone(),
        shards,
        samples: entries.into_iter().flatten().collect(),
        shuffle_seed: Some(opts.seed),
    })
}
