//! How much one archive may unpack: the member count, the total size (and the variable that
//! raises it) and deflate's largest expansion.
use crate::DatasetError;

/// Environment variable overriding [`DEFAULT_MAX_UNPACKED_BYTES`] (a byte count).
pub const MAX_UNPACKED_ENV: &str = "TCHRUN_DATA_MAX_UNPACKED_BYTES";
/// Largest total unpacked size of one archive by default: 256 GiB.
pub const DEFAULT_MAX_UNPACKED_BYTES: u64 = 256 << 30;
/// Most members one archive may hold.
pub const MAX_ARCHIVE_MEMBERS: u64 = 10_000_000;
/// Deflate's largest possible expansion (258 bytes from 2 bits).
pub(super) const DEFLATE_MAX_RATIO: u64 = 1032;

/// The unpacked-size limit: `$TCHRUN_DATA_MAX_UNPACKED_BYTES` or the default.
pub fn max_unpacked_bytes() -> Result<u64, DatasetError> {
    match std::env::var(MAX_UNPACKED_ENV) {
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|e| DatasetError::InvalidDataset {
                detail: format!("{MAX_UNPACKED_ENV}={v:?}: not a byte count ({e})"),
            }),
        Err(_) => Ok(DEFAULT_MAX_UNPACKED_BYTES),
    }
}
