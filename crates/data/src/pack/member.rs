//! [`Member`]: where a packed sample's image bytes lie, read with one positioned read and
//! checked; [`ShardFiles`]: the shard files a loader thread keeps open.
use crate::error::DatasetError;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// Where a packed sample's image bytes lie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The shard file.
    pub shard: Arc<Path>,
    /// The member's name in the shard (`KEY.EXT`).
    pub name: Box<str>,
    /// The original path, relative to the packed folder.
    pub orig: Box<str>,
    /// Byte offset and length of the member's data in the shard.
    pub offset: u64,
    pub len: u64,
    pub crc32c: u32,
    /// Width x height, read from the header at pack time.
    pub pixels: u64,
}

impl Member {
    /// `shard-000003.tar member 00000123.jpg (orig c07/img_9.jpg)`, for messages.
    pub fn describe(&self) -> String {
        format!(
            "{} member {} (orig {})",
            self.shard.display(),
            self.name,
            self.orig
        )
    }

    /// Reads the member's data into `buf` (one positioned read) and checks its CRC.
    pub fn read_into(&self, buf: &mut Vec<u8>) -> Result<(), DatasetError> {
        self.read_with(buf, &mut ShardFiles::default())
    }

    /// [`Member::read_into`] through `files`, the shards a loader thread keeps open.
    pub fn read_with(&self, buf: &mut Vec<u8>, files: &mut ShardFiles) -> Result<(), DatasetError> {
        let len = usize::try_from(self.len).map_err(|_| self.bad("member too large"))?;
        buf.clear();
        buf.resize(len, 0);
        files
            .get(&self.shard)
            .and_then(|f| f.read_exact_at(buf, self.offset))
            .map_err(|e| self.bad(format!("cannot read: {e}")))?;
        if crc32c::crc32c(buf) != self.crc32c {
            return Err(self.bad(
                "its bytes changed since it was packed (CRC-32C mismatch); run `tchrun data pack` \
                 again",
            ));
        }
        Ok(())
    }

    /// Header check from the dimensions recorded at pack time (the full check ran then).
    pub fn check_pixels(&self, max_pixels: u64) -> Result<(), String> {
        if self.pixels > max_pixels {
            return Err(format!(
                "member {} (orig {}): {} pixels exceed the limit of {max_pixels} pixels (possible \
                 decompression bomb); raise the pixel limit or pack without it",
                self.name, self.orig, self.pixels
            ));
        }
        Ok(())
    }

    fn bad(&self, detail: impl std::fmt::Display) -> DatasetError {
        DatasetError::BadImage {
            path: self.shard.to_path_buf(),
            detail: format!("member {} (orig {}): {detail}", self.name, self.orig),
        }
    }

    /// An error of decoding this member's bytes, re-addressed to the shard and the member.
    pub fn locate(&self, e: DatasetError) -> DatasetError {
        match e {
            DatasetError::BadImage { path, detail } if *path == *self.shard => {
                DatasetError::BadImage { path, detail }
            }
            DatasetError::BadImage { detail, .. } => self.bad(detail),
            DatasetError::Io { source, .. } => self.bad(format!("cannot read: {source}")),
            e => e,
        }
    }
}

/// The shard files one loader thread keeps open (the most recently used few), so that
/// reading a member costs one positioned read, not an open (a round trip on NFS) as well.
#[derive(Debug, Default)]
pub struct ShardFiles {
    open: Vec<(Arc<Path>, fs::File)>,
}

impl ShardFiles {
    const KEEP: usize = 16;

    fn get(&mut self, shard: &Arc<Path>) -> std::io::Result<&fs::File> {
        match self.open.iter().position(|(p, _)| p == shard) {
            Some(i) => {
                let hit = self.open.remove(i);
                self.open.push(hit);
            }
            None => {
                if self.open.len() >= Self::KEEP {
                    self.open.remove(0);
                }
                let (f, _) = tchrun::files::open_regular(shard, u64::MAX)
                    .map_err(tchrun::files::BoundedReadError::into_io)?;
                self.open.push((shard.clone(), f));
            }
        }
        match self.open.last() {
            Some((_, f)) => Ok(f),
            None => Err(std::io::Error::other("no open shard")),
        }
    }
}
