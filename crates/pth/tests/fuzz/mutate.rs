//! Random mutations of real `torch.save` archives: bit flips, bytes set, inserted and
//! deleted, truncation, splices within a file and across files, interesting integers written
//! over a field; aimed half the time at the archive's structure (local headers, `data.pkl`,
//! the central directory and end records) rather than at tensor data; and the same done to
//! `data.pkl` alone or to the list of entries, with the archive rewritten around it (true
//! CRCs), so a mutation reaches the unpickler instead of the zip reader's checksum.
use crate::pickle::interesting;
use crate::rng::Rng;
use crate::zipw::{self, Entry, Tail};

/// A seed file and where its structure lies.
pub struct Seed {
    pub name: String,
    pub bytes: Vec<u8>,
    pub entries: Vec<Entry>,
    /// Byte ranges of headers, `data.pkl` and the central directory.
    pub structure: Vec<(usize, usize)>,
}

fn u16at(b: &[u8], at: usize) -> usize {
    u16::from_le_bytes([b[at], b[at + 1]]) as usize
}

fn u32at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
}

impl Seed {
    /// Walks the central directory of an archive `torch.save` wrote (stored entries, sizes
    /// in data descriptors and the central directory, no archive comment).
    pub fn new(name: String, bytes: Vec<u8>) -> Seed {
        let (mut entries, mut structure) = (Vec::new(), Vec::new());
        let end = bytes.len().saturating_sub(22);
        assert_eq!(
            bytes.get(end..end + 4),
            Some(&b"PK\x05\x06"[..]),
            "{name}: its end record"
        );
        let (count, mut at) = (u16at(&bytes, end + 10), u32at(&bytes, end + 16));
        structure.push((at, bytes.len()));
        for _ in 0..count {
            assert_eq!(
                &bytes[at..at + 4],
                b"PK\x01\x02",
                "{name}: a central header"
            );
            let size = u32at(&bytes, at + 20);
            let n = u16at(&bytes, at + 28);
            let skip = n + u16at(&bytes, at + 30) + u16at(&bytes, at + 32);
            let local = u32at(&bytes, at + 42);
            let entry = bytes[at + 46..at + 46 + n].to_vec();
            let start = local + 30 + u16at(&bytes, local + 26) + u16at(&bytes, local + 28);
            structure.push((local, start));
            structure.push((start + size, (start + size + 24).min(bytes.len())));
            if entry.ends_with(b"data.pkl") {
                structure.push((start, start + size));
            }
            entries.push(Entry::new(entry, bytes[start..start + size].to_vec()));
            at += 46 + skip;
        }
        Seed {
            name,
            bytes,
            entries,
            structure,
        }
    }

    /// The length of its `data.pkl`.
    pub fn pickle_len(&self) -> usize {
        let pkl = self.entries.iter().find(|e| e.name.ends_with(b"data.pkl"));
        pkl.map(|e| e.data.len()).unwrap_or(0)
    }

    fn position(&self, rng: &mut Rng, len: usize) -> usize {
        if rng.chance(2) || len != self.bytes.len() {
            return rng.below(len + 1);
        }
        let (a, b) = self.structure[rng.below(self.structure.len())];
        a + rng.below(b - a + 1)
    }
}

/// One to eight byte-level mutations of `data`; `at` picks a position.
pub fn bytes(
    rng: &mut Rng,
    data: &mut Vec<u8>,
    other: &[u8],
    mut at: impl FnMut(&mut Rng, usize) -> usize,
) {
    for _ in 0..1 + rng.below(8) {
        let p = at(rng, data.len()).min(data.len());
        match rng.below(9) {
            0 | 1 if p < data.len() => data[p] ^= 1 << rng.below(8),
            2 if p < data.len() => data[p] = rng.next() as u8,
            3 => {
                let width = [1, 2, 4, 8][rng.below(4)];
                let v = interesting(rng).to_le_bytes();
                let end = (p + width).min(data.len());
                data[p..end].copy_from_slice(&v[..end - p]);
            }
            4 => {
                let n = 1 + rng.below(16);
                let ins = rng.bytes(n);
                data.splice(p..p, ins);
            }
            5 => {
                let end = (p + 1 + rng.below(64)).min(data.len());
                data.drain(p..end);
            }
            6 if rng.chance(4) => data.truncate(p),
            7 if !data.is_empty() => {
                let from = rng.below(data.len());
                let n = rng.below(256).min(data.len() - from);
                let chunk = data[from..from + n].to_vec();
                data.splice(p..p, chunk);
            }
            8 if !other.is_empty() => {
                let from = rng.below(other.len());
                let n = rng.below(512).min(other.len() - from);
                let end = (p + n).min(data.len());
                data.splice(p..end, other[from..from + n].iter().copied());
            }
            _ => {}
        }
    }
}

/// A mutant of `seed`: raw bytes, its pickle alone, or its list of entries.
pub fn mutant(rng: &mut Rng, seed: &Seed, other: &Seed) -> Vec<u8> {
    match rng.below(3) {
        0 => {
            let mut data = seed.bytes.clone();
            bytes(rng, &mut data, &other.bytes, |r, len| seed.position(r, len));
            data
        }
        1 => {
            let mut entries = seed.entries.clone();
            if let Some(pkl) = entries.iter_mut().find(|e| e.name.ends_with(b"data.pkl")) {
                let donor = other
                    .entries
                    .iter()
                    .find(|e| e.name.ends_with(b"data.pkl"))
                    .map(|e| e.data.as_slice())
                    .unwrap_or(&[]);
                bytes(rng, &mut pkl.data, donor, |r, len| r.below(len + 1));
            }
            zipw::write(
                &entries,
                Tail {
                    zip64: true,
                    count: None,
                },
            )
        }
        _ => {
            let mut entries = seed.entries.clone();
            let tail = entry_mutations(rng, &mut entries);
            zipw::write(&entries, tail)
        }
    }
}

/// Entries renamed, dropped, duplicated, aliased onto another's data, lying about their size,
/// CRC or compression; an end record lying about the count.
pub fn entry_mutations(rng: &mut Rng, entries: &mut Vec<Entry>) -> Tail {
    let mut tail = Tail {
        zip64: !rng.chance(4),
        count: None,
    };
    for _ in 0..1 + rng.below(4) {
        if entries.is_empty() {
            break;
        }
        let i = rng.below(entries.len());
        match rng.below(9) {
            0 => {
                let p = rng.below(entries[i].name.len() + 1);
                entries[i].name.insert(p, b"/./\0x"[rng.below(5)]);
            }
            1 => {
                entries.remove(i);
            }
            2 => {
                let e = entries[i].clone();
                entries.push(e);
            }
            3 => {
                let mut e = Entry::new(format!("{}", rng.below(4)), Vec::new());
                e.name = [entries[i].name.as_slice(), &e.name].concat();
                e.alias_of = Some(i);
                entries.push(e);
            }
            4 => entries[i].declared = Some(interesting(rng) as u64),
            5 => entries[i].declared = Some(entries[i].data.len() as u64 + 1),
            6 => entries[i].crc = Some(rng.next() as u32),
            7 => entries[i].method = Some([8, 12, 99][rng.below(3)]),
            _ => tail.count = Some(interesting(rng) as u64),
        }
    }
    tail
}
