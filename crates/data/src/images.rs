//! What an image file may be: the extensions and formats accepted, and the largest decoded
//! size.

/// Image extensions accepted by [`ImageFolder::scan`] (compared case-insensitively): the
/// formats of Azure ML's "Convert to Image Directory" (JPEG, PNG, BMP, TIFF, WebP, PPM/PGM;
/// `.pnm`/`.pbm` are the same decoder's other names).
pub const IMAGE_EXTENSIONS: [&str; 12] = [
    "jpg", "jpeg", "png", "bmp", "tif", "tiff", "webp", "ppm", "pgm", "pnm", "pbm", "dib",
];

/// The formats, for messages.
pub const IMAGE_FORMATS: &str = "JPEG, PNG, BMP, TIFF, WebP, PPM/PGM";

/// Largest decoded image (in bytes of 8-bit RGB) the loader accepts: 512 MiB, the
/// `image` crate's default allocation limit.
pub const MAX_DECODED_BYTES: u64 = 512 * 1024 * 1024;
