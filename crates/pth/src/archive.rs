//! The zip archive `torch.save` writes, read on untrusted bytes (stored entries only, each
//! bounded; a panic in the zip reader is a corrupt file).
use std::io::Read;
/// The zip archive, its entries read through `ARCHIVE/` (the directory of the first entry, as
/// torch reads it). Stored (uncompressed) entries only, as torch writes them: an entry's data
/// is in the file, so its size is bounded by the file's.
pub(crate) struct Archive<'a> {
    zip: zip::ZipArchive<std::io::Cursor<&'a [u8]>>,
    pub(crate) prefix: String,
}

/// The zip reader on untrusted bytes: a panic in it is a corrupt file, not a crash.
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err("the zip reader failed on it".into()))
}

impl<'a> Archive<'a> {
    pub(crate) fn open(bytes: &'a [u8]) -> Result<Archive<'a>, String> {
        guarded(|| {
            let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes))
                .map_err(|e| format!("zip: {e}"))?;
            let first = zip
                .by_index_raw(0)
                .map_err(|e| format!("zip: {e}"))?
                .name()
                .to_string();
            let prefix = match first.split_once('/') {
                Some((p, _)) if !p.is_empty() => p.to_string(),
                _ => return Err(format!("unexpected first entry '{first}'")),
            };
            Ok(Archive { zip, prefix })
        })
    }

    /// `ARCHIVE/name`, at most `limit` bytes; `None` when the archive has no such entry.
    pub(crate) fn entry(&mut self, name: &str, limit: u64) -> Result<Option<Vec<u8>>, String> {
        let full = format!("{}/{name}", self.prefix);
        let zip = &mut self.zip;
        guarded(|| {
            let mut f = match zip.by_name(&full) {
                Ok(f) => f,
                Err(zip::result::ZipError::FileNotFound) => return Ok(None),
                Err(e) => return Err(format!("{full}: {e}")),
            };
            if f.compression() != zip::CompressionMethod::Stored {
                return Err(format!(
                    "{full} is compressed ({:?}); torch.save writes uncompressed archives",
                    f.compression()
                ));
            }
            let size = f.size();
            if size > limit {
                return Err(format!("{full} declares {size} bytes, more than {limit}"));
            }
            let mut data = Vec::with_capacity(size as usize);
            (&mut f)
                .take(size + 1)
                .read_to_end(&mut data)
                .map_err(|e| format!("{full}: {e}"))?;
            if data.len() as u64 != size {
                return Err(format!(
                    "{full} holds {} bytes, its header says {size}",
                    data.len()
                ));
            }
            Ok(Some(data))
        })
    }
}
