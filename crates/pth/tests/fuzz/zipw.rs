//! A zip writer that can lie: stored entries as `torch.save` writes them, each with an
//! optional false size, CRC, compression method or data offset (an alias of another entry's
//! data), so the harness reaches every check of the reader's archive layer on purpose.

/// One entry of an archive to write.
#[derive(Clone, Debug, Default)]
pub struct Entry {
    pub name: Vec<u8>,
    pub data: Vec<u8>,
    /// The size both headers declare (the data's length when `None`).
    pub declared: Option<u64>,
    /// A CRC-32 other than the data's.
    pub crc: Option<u32>,
    /// A compression method other than stored (0).
    pub method: Option<u16>,
    /// The central directory points at this earlier entry's local header instead.
    pub alias_of: Option<usize>,
}

impl Entry {
    pub fn new(name: impl Into<Vec<u8>>, data: Vec<u8>) -> Entry {
        Entry {
            name: name.into(),
            data,
            ..Entry::default()
        }
    }
}

/// How the end of the archive is written.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tail {
    /// Also a zip64 end record and locator (torch.save writes both).
    pub zip64: bool,
    /// The number of entries the end records declare (the true count when `None`).
    pub count: Option<u64>,
}

pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn u16le(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn u32le(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn u64le(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// The archive's bytes.
pub fn write(entries: &[Entry], tail: Tail) -> Vec<u8> {
    let mut out = Vec::new();
    let mut offsets = Vec::with_capacity(entries.len());
    let mut crcs = std::collections::HashMap::new();
    for e in entries {
        let offset = match e.alias_of.and_then(|i| offsets.get(i).copied()) {
            Some(at) => at,
            None => {
                let at = out.len() as u32;
                let crc = e.crc.unwrap_or_else(|| crc32(&e.data));
                crcs.insert(at, crc);
                local_header(&mut out, e, crc);
                out.extend_from_slice(&e.data);
                at
            }
        };
        offsets.push(offset);
    }
    let dir_start = out.len();
    for (e, &offset) in entries.iter().zip(&offsets) {
        // An alias declares the data it points at: that entry's size and CRC.
        let like = e.alias_of.and_then(|i| entries.get(i)).unwrap_or(e);
        central_header(&mut out, e, like, crcs.get(&offset).copied(), offset);
    }
    let dir_size = out.len() - dir_start;
    let count = tail.count.unwrap_or(entries.len() as u64);
    if tail.zip64 {
        let end64 = out.len() as u64;
        u32le(&mut out, 0x0606_4b50);
        u64le(&mut out, 44);
        u16le(&mut out, 0x031e);
        u16le(&mut out, 0x2d);
        u32le(&mut out, 0);
        u32le(&mut out, 0);
        u64le(&mut out, count);
        u64le(&mut out, count);
        u64le(&mut out, dir_size as u64);
        u64le(&mut out, dir_start as u64);
        u32le(&mut out, 0x0706_4b50);
        u32le(&mut out, 0);
        u64le(&mut out, end64);
        u32le(&mut out, 1);
    }
    u32le(&mut out, 0x0605_4b50);
    u16le(&mut out, 0);
    u16le(&mut out, 0);
    let short = count.min(0xffff) as u16;
    u16le(&mut out, short);
    u16le(&mut out, short);
    u32le(&mut out, dir_size as u32);
    u32le(&mut out, dir_start as u32);
    u16le(&mut out, 0);
    out
}

/// The fields local and central headers share: `e`'s method and size, `name`'s length.
fn fields(out: &mut Vec<u8>, e: &Entry, crc: u32, name: &[u8]) {
    u16le(out, 0); // flags
    u16le(out, e.method.unwrap_or(0));
    u16le(out, 0); // time
    u16le(out, 0); // date
    u32le(out, crc);
    let size = e
        .declared
        .unwrap_or(e.data.len() as u64)
        .min(u32::MAX as u64) as u32;
    u32le(out, size);
    u32le(out, size);
    u16le(out, name.len() as u16);
    u16le(out, 0); // extra
}

fn local_header(out: &mut Vec<u8>, e: &Entry, crc: u32) {
    u32le(out, 0x0403_4b50);
    u16le(out, 20);
    fields(out, e, crc, &e.name);
    out.extend_from_slice(&e.name);
}

fn central_header(out: &mut Vec<u8>, e: &Entry, like: &Entry, crc: Option<u32>, offset: u32) {
    u32le(out, 0x0201_4b50);
    u16le(out, 0x031e);
    u16le(out, 20);
    let crc = like.crc.or(crc).unwrap_or_else(|| crc32(&like.data));
    fields(out, like, crc, &e.name);
    u16le(out, 0); // comment
    u16le(out, 0); // disk
    u16le(out, 0); // internal attributes
    u32le(out, 0); // external attributes
    u32le(out, offset);
    out.extend_from_slice(&e.name);
}
