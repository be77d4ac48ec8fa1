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

/// The smallest central directory record: 46 bytes and a name.
const CENTRAL_HEADER_BYTES: u64 = 46;

fn le(bytes: &[u8], at: usize, n: usize) -> Option<u64> {
    let b = bytes.get(at..at.checked_add(n)?)?;
    Some(b.iter().rev().fold(0u64, |a, &x| a << 8 | x as u64))
}

/// The number of entries the zip reader will take from the archive's end records, found as
/// `zip` 0.6 finds them (the last end record in the final 64 KiB, then a zip64 locator just
/// before it and the first zip64 end record from where it points); `None` where the zip reader
/// will refuse the archive before counting. The zip reader reserves a record per entry so
/// counted (about 200 bytes each, capped only by the end record's offset): a count the file
/// cannot hold must be refused before it is trusted.
fn declared_entries(bytes: &[u8]) -> Option<u64> {
    let len = bytes.len();
    let last = len.checked_sub(22)?;
    let end = (last.saturating_sub(u16::MAX as usize)..=last)
        .rev()
        .find(|&at| bytes[at..at + 4] == *b"PK\x05\x06")?;
    let comment = le(bytes, end + 20, 2)? as usize;
    let locator = len.checked_sub(20 + 22 + comment);
    let Some(locator) = locator.filter(|&at| bytes[at..at + 4] == *b"PK\x06\x07") else {
        return le(bytes, end + 8, 2);
    };
    let from = usize::try_from(le(bytes, locator + 8, 8)?).ok()?;
    let upper = end.checked_sub(60)?;
    let end64 = (from..=upper).find(|&at| bytes[at..at + 4] == *b"PK\x06\x06")?;
    le(bytes, end64 + 32, 8)
}

impl<'a> Archive<'a> {
    pub(crate) fn open(bytes: &'a [u8]) -> Result<Archive<'a>, String> {
        if let Some(n) = declared_entries(bytes) {
            if n > bytes.len() as u64 / CENTRAL_HEADER_BYTES {
                return Err(format!(
                    "its directory claims {n} entries, more than its {} bytes can hold",
                    bytes.len()
                ));
            }
        }
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

    /// `ARCHIVE/name`, at most `limit` bytes (never more than the archive: its data is
    /// stored in it); `None` when the archive has no such entry.
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
                return Err(format!(
                    "{full} declares {size} bytes, more than the {limit} the archive can still \
                     hold"
                ));
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
