//! Packed shards (`tchrun data pack`): an image folder as tar shards in the WebDataset layout
//! plus an index, for shared file systems where opening a million small files is the
//! bottleneck.
//!
//! Layout of a pack directory:
//! * `shard-000000.tar`, `shard-000001.tar`, ...: plain ustar archives of about `shard_size`
//!   bytes. Sample `i` of the source folder (scan order, bad images left out under
//!   `--skip-bad-images`) is the two members `KEY.EXT` (the original bytes, the original
//!   extension lower-cased) and `KEY.cls` (the label as ASCII decimal), `KEY` = `i` in 8 digits
//!   (no dot: WebDataset splits a member name at the first dot of its basename). Python's
//!   `webdataset` package reads them as they are (`tests/python/pack_check.py`). The samples
//!   are spread over the shards in a seeded random order (`--seed`, recorded in the index as
//!   `shuffle_seed`; [`shard_order`]), not class by class: a reader that streams the shards in
//!   order, or only some of them, sees every class from the start.
//! * [`PACK_INDEX`] (JSON, written last): the class names, per shard its size, per sample its
//!   shard, the byte offset, length and CRC-32C of its image member's data, label, dimensions
//!   and original relative path.
//!
//! Reading ([`open`], reached through [`ImageFolder::scan`]) gives the same sample list as the
//! folder's scan, each [`Sample`] carrying its [`Member`]: the loader reads exactly those bytes
//! with one positioned read, no tar parsing, and checks their CRC. A shard whose size differs
//! from the index is refused when the pack is opened, a changed member when it is read; both
//! name the shard (and the member) and say to pack again.
//!
//! Here: reading a pack (the index, [`open`]); `format.rs`: the index's shape and the names;
//! `member.rs`: [`Member`]s and the shard files; `write.rs`: packing a folder.
use crate::dataset::{ImageFolder, Sample};
use crate::error::DatasetError;
use std::fs;
use std::path::Path;
use std::sync::Arc;

mod format;
mod member;
mod write;

pub use crate::dataset::sample_bytes;
pub use format::{
    member_name, sample_key, shard_name, shard_order, PackIndex, SampleEntry, ShardEntry,
    DEFAULT_SHARD_SIZE, PACK_INDEX,
};
use format::{FORMAT, VERSION};
pub use member::{Member, ShardFiles};
pub use write::{check_output, pack, parse_size, PackError, PackOptions, PackReport};

// ---------------------------------------------------------------------------------------------
// The index
// ---------------------------------------------------------------------------------------------

impl PackIndex {
    pub fn read(root: &Path) -> Result<PackIndex, DatasetError> {
        let path = root.join(PACK_INDEX);
        let text = tchrun::files::read_bounded(&path, tchrun::files::caps::DATASET_INDEX)
            .map_err(|e| crate::error::bounded_err(&path, e))?;
        let stale = |detail: String| DatasetError::BadArchive {
            path: path.clone(),
            detail,
        };
        let ix: PackIndex = serde_json::from_slice(&text).map_err(|e| {
            stale(format!(
                "not a readable pack index ({e}); run `tchrun data pack` again"
            ))
        })?;
        if ix.format != FORMAT || ix.version != VERSION {
            return Err(stale(format!(
                "format {} version {} (this tchrun reads {FORMAT} version {VERSION}); run \
                 `tchrun data pack` again",
                ix.format, ix.version
            )));
        }
        Ok(ix)
    }

    /// The pack as an image folder whose samples are read from the shards. Refuses a missing
    /// shard or one whose size differs from the index (a truncated or rewritten pack).
    pub fn to_folder(&self, root: &Path) -> Result<ImageFolder, DatasetError> {
        let again = format!(
            "the pack is stale or damaged; run `tchrun data pack {} --output DIR` again",
            self.source
        );
        let mut shards: Vec<Arc<Path>> = Vec::with_capacity(self.shards.len());
        for s in &self.shards {
            let path = root.join(&s.name);
            let size = fs::metadata(&path).map_err(|e| DatasetError::BadArchive {
                path: path.clone(),
                detail: format!("shard listed in {PACK_INDEX} cannot be read ({e}); {again}"),
            })?;
            if size.len() != s.bytes {
                return Err(DatasetError::BadArchive {
                    path,
                    detail: format!(
                        "shard is {} bytes, {PACK_INDEX} says {} (truncated or changed); {again}",
                        size.len(),
                        s.bytes
                    ),
                });
            }
            shards.push(Arc::from(path.as_path()));
        }
        let mut samples = Vec::with_capacity(self.samples.len());
        for (i, SampleEntry(shard, offset, len, crc, label, w, h, orig)) in
            self.samples.iter().enumerate()
        {
            let bad = |what: &str| DatasetError::BadArchive {
                path: root.join(PACK_INDEX),
                detail: format!("sample {i} ({orig}): {what}; {again}"),
            };
            let file = shards
                .get(*shard)
                .ok_or_else(|| bad("shard out of range"))?;
            if *label >= self.classes.len() {
                return Err(bad("label out of range"));
            }
            match offset.checked_add(*len) {
                Some(end) if end <= self.shards[*shard].bytes => {}
                _ => return Err(bad("member beyond the end of its shard")),
            }
            samples.push(Sample {
                path: root.join(orig),
                label: *label,
                member: Some(Member {
                    shard: file.clone(),
                    name: member_name(i, orig).into(),
                    orig: orig.as_str().into(),
                    offset: *offset,
                    len: *len,
                    crc32c: *crc,
                    pixels: *w as u64 * *h as u64,
                }),
            });
        }
        if samples.is_empty() {
            return Err(DatasetError::Empty {
                path: root.to_path_buf(),
                detail: format!("the pack holds no samples; {again}"),
            });
        }
        Ok(ImageFolder {
            root: root.to_path_buf(),
            classes: self.classes.clone(),
            samples,
        })
    }
}

/// Whether `root` is a pack directory (holds [`PACK_INDEX`]).
pub fn is_pack(root: &Path) -> bool {
    root.join(PACK_INDEX).is_file()
}

/// Opens a pack directory as an image folder (see [`PackIndex::to_folder`]).
pub fn open(root: &Path) -> Result<ImageFolder, DatasetError> {
    PackIndex::read(root)?.to_folder(root)
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn image(path: &Path, fill: u8, format: image::ImageFormat) {
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        image::RgbImage::from_fn(9, 7, |x, y| image::Rgb([fill, x as u8 * 20, y as u8 * 30]))
            .save_with_format(path, format)
            .expect("save");
    }

    fn source(root: &Path) -> ImageFolder {
        use image::ImageFormat::{Jpeg, Png};
        image(&root.join("b/x.1.PNG"), 1, Png);
        image(&root.join("b/y.jpeg"), 2, Jpeg);
        image(&root.join("a/z.JPG"), 3, Jpeg);
        for i in 0..5 {
            image(&root.join(format!("a/{i}.png")), 10 + i, Png);
        }
        ImageFolder::scan(root).expect("scan")
    }

    fn opts(shard_size: u64) -> PackOptions {
        PackOptions {
            seed: 1,
            shard_size,
            skip_bad: false,
            max_pixels: 1_000_000,
        }
    }

    #[test]
    fn keys_have_no_dot_and_keep_the_extension_lower_cased() {
        assert_eq!(sample_key(7), "00000007");
        assert_eq!(member_name(7, "cat/img.v2.JPEG"), "00000007.jpeg");
        assert_eq!(member_name(123456789, "a/b.png"), "123456789.png");
        assert_eq!(shard_name(3), "shard-000003.tar");
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("16k").unwrap(), 16 << 10);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("5000").unwrap(), 5000);
        for bad in ["", "0", "12Q", "-1", "M"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn index_round_trip_gives_the_folders_samples_and_bytes() {
        let t = tempfile::tempdir().expect("tempdir");
        let f = source(&t.path().join("src"));
        let out = t.path().join("out");
        // Tiny shards: one sample each (a shard takes at least one).
        let report = pack(&f, &out, &opts(1)).expect("pack");
        assert_eq!((report.samples, report.shards), (8, 8));
        let ix = PackIndex::read(&out).expect("index");
        let text = serde_json::to_string(&ix).expect("json");
        assert_eq!(serde_json::from_str::<PackIndex>(&text).expect("parse"), ix);
        let p = ImageFolder::scan(&out).expect("open");
        assert_eq!(p.classes, f.classes);
        let mut buf = Vec::new();
        // One sample a shard, written in `shard_order`: sample i is in the shard at its position.
        let order = shard_order(8, 1);
        assert_ne!(order, (0..8).collect::<Vec<_>>(), "shuffled");
        for (i, (a, b)) in p.samples.iter().zip(&f.samples).enumerate() {
            assert_eq!(a.label, b.label);
            assert_eq!(a.path, out.join(b.path.strip_prefix(&f.root).unwrap()));
            let m = a.member.as_ref().expect("member");
            let at = order.iter().position(|&j| j == i).expect("in the order");
            assert_eq!(*m.shard, *out.join(shard_name(at)));
            assert_eq!(m.pixels, 63);
            sample_bytes(a, &mut buf).expect("read");
            assert_eq!(buf, fs::read(&b.path).expect("orig"));
        }
        // One shard when they fit; the same sample bytes.
        let out2 = t.path().join("out2");
        assert_eq!(pack(&f, &out2, &opts(1 << 20)).expect("pack").shards, 1);
        // A pack packed again (from its shards) gives the same shard bytes.
        let p2 = ImageFolder::scan(&out2).expect("open");
        let out3 = t.path().join("out3");
        pack(&p2, &out3, &opts(1 << 20)).expect("repack");
        assert_eq!(
            fs::read(out2.join(shard_name(0))).unwrap(),
            fs::read(out3.join(shard_name(0))).unwrap()
        );
    }

    #[test]
    fn a_changed_shard_or_member_is_named() {
        let t = tempfile::tempdir().expect("tempdir");
        let f = source(&t.path().join("src"));
        let out = t.path().join("out");
        pack(&f, &out, &opts(1 << 20)).expect("pack");
        let p = open(&out).expect("open");
        let m = p.samples[2].member.clone().expect("member");
        // One byte of member 2 changed in place: its read fails, naming shard and member.
        {
            let file = fs::OpenOptions::new().write(true).open(&*m.shard).unwrap();
            file.write_all_at(&[0x55], m.offset + 3).unwrap();
        }
        let e = m.read_into(&mut Vec::new()).unwrap_err().to_string();
        assert!(
            e.contains("shard-000000.tar: member 00000002.png (orig a/2.png)")
                && e.contains("CRC-32C"),
            "{e}"
        );
        // A shard one block shorter: refused on open, naming it and the fix.
        let shard = out.join(shard_name(0));
        let len = fs::metadata(&shard).unwrap().len();
        fs::OpenOptions::new()
            .write(true)
            .open(&shard)
            .and_then(|f| f.set_len(len - 512))
            .unwrap();
        let e = open(&out).unwrap_err().to_string();
        assert!(
            e.contains("shard-000000.tar") && e.contains("tchrun data pack"),
            "{e}"
        );
        // A missing shard.
        fs::remove_file(&shard).unwrap();
        let e = open(&out).unwrap_err().to_string();
        assert!(
            e.contains("shard-000000.tar") && e.contains("cannot be read"),
            "{e}"
        );
        // An existing non-empty output is refused; an empty one is used.
        assert!(matches!(
            pack(&f, &out, &opts(1 << 20)),
            Err(PackError::Output { .. })
        ));
        let empty = t.path().join("empty");
        fs::create_dir(&empty).unwrap();
        pack(&f, &empty, &opts(1 << 20)).expect("pack into an empty folder");
        assert!(is_pack(&empty));
    }
}
