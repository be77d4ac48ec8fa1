//! State dicts from a grammar: storages of random types and lengths (some declaring more
//! elements than their entry holds), tensor views with random offsets, sizes, strides and
//! dtypes (some reaching past their storage), every rebuild call torch uses, memo reuse as
//! torch writes it, an `OrderedDict` with `_metadata`; written as `torch.save` would, and the
//! result an independent reference says the reader must give.
use crate::pickle::{global, interesting, s, Op};
use crate::rng::Rng;
use crate::zipw::{self, Entry, Tail};
use std::rc::Rc;

/// (storage class, dtype name, element size, converted).
const TYPES: &[(&str, &str, usize, bool)] = &[
    ("FloatStorage", "float32", 4, true),
    ("DoubleStorage", "float64", 8, true),
    ("HalfStorage", "float16", 2, true),
    ("BFloat16Storage", "bfloat16", 2, true),
    ("LongStorage", "int64", 8, true),
    ("IntStorage", "int32", 4, true),
    ("ShortStorage", "int16", 2, true),
    ("CharStorage", "int8", 1, true),
    ("ByteStorage", "uint8", 1, true),
    ("BoolStorage", "bool", 1, true),
    ("ComplexFloatStorage", "complex64", 8, false),
];

pub struct StorageSpec {
    key: String,
    ty: usize,
    numel: i64,
    /// The archive entry's bytes; `None`: the archive lacks it.
    data: Option<Rc<[u8]>>,
}

pub struct TensorSpec {
    name: String,
    storage: usize,
    offset: i64,
    size: Vec<i64>,
    stride: Vec<i64>,
    /// `_rebuild_tensor_v3`'s dtype (an index into TYPES).
    dtype: Option<usize>,
    parameter: bool,
}

pub struct Spec {
    storages: Vec<StorageSpec>,
    tensors: Vec<TensorSpec>,
    ordered: bool,
    /// Every storage's entry is the first one's data again (central directory entries that
    /// share one local entry): the archive claims more data than it holds.
    aliased: bool,
}

/// What the reader must return: each tensor's name, shape and bytes, or a refusal.
pub type Expected = Option<Vec<(String, Vec<usize>, Vec<u8>)>>;

fn dim(rng: &mut Rng, wild: bool) -> i64 {
    match rng.below(16) {
        0 if wild => interesting(rng),
        1 => 0,
        _ => 1 + rng.below(6) as i64,
    }
}

/// A state dict: half the time a valid one (views within their storages, which are sized to
/// fit them), half the time a wild one (lying lengths, views past their storage, refused
/// types, missing entries).
pub fn generate(rng: &mut Rng) -> Spec {
    if rng.chance(40) {
        return aliased(rng);
    }
    let wild = rng.chance(2);
    let ns = 1 + rng.below(4);
    let types: Vec<usize> = (0..ns)
        .map(|_| match rng.below(10) {
            0 if wild => TYPES.len() - 1,
            _ => rng.below(TYPES.len() - 1),
        })
        .collect();
    let mut need = vec![0u128; ns];
    let tensors = (0..1 + rng.below(6))
        .map(|i| {
            let storage = rng.below(ns);
            let nd = if wild && rng.chance(15) {
                65
            } else {
                rng.below(5)
            };
            let size: Vec<i64> = (0..nd).map(|_| dim(rng, wild)).collect();
            let mut stride = vec![0i64; nd];
            let mut acc = 1i64;
            for d in (0..nd).rev() {
                stride[d] = acc;
                acc = acc.saturating_mul(size[d].max(1));
            }
            match rng.below(3) {
                0 if nd > 1 => stride.swap(0, nd - 1), // a transposed view
                1 => stride
                    .iter_mut()
                    .for_each(|s| *s *= 1 + rng.below(3) as i64),
                _ => {}
            }
            if wild && rng.chance(3) {
                stride.iter_mut().for_each(|s| *s = dim(rng, wild) - 1);
            }
            if wild && rng.chance(20) {
                stride.pop();
            }
            let offset = match rng.below(12) {
                0 if wild => interesting(rng),
                1..=5 => rng.below(16) as i64,
                _ => 0,
            };
            let dtype = match rng.below(6) {
                0 if wild => Some(rng.below(TYPES.len())),
                1 | 2 => Some(types[storage]),
                _ => None,
            };
            if size.iter().all(|&n| n > 0) {
                let last = size
                    .iter()
                    .zip(&stride)
                    .fold(offset as i128, |a, (&n, &s)| {
                        a.saturating_add((n as i128 - 1).saturating_mul(s as i128))
                    });
                need[storage] = need[storage].max(last.max(0) as u128 + 1);
            }
            TensorSpec {
                name: format!("layer{i}.weight"),
                storage,
                offset,
                size,
                stride,
                dtype,
                parameter: rng.chance(4),
            }
        })
        .collect();
    let storages = (0..ns)
        .map(|k| {
            let ty = types[k];
            let fit = need[k].min(1 << 16) as usize + rng.below(8);
            let numel = if wild && rng.chance(4) {
                rng.below(64)
            } else {
                fit
            };
            let mut bytes = rng.bytes(numel * TYPES[ty].2);
            if wild && rng.chance(8) {
                bytes.truncate(rng.below(bytes.len() + 1)); // shorter than declared
            }
            StorageSpec {
                key: match rng.below(30) {
                    0 => format!("../x{k}"),
                    _ => k.to_string(),
                },
                ty,
                numel: match rng.below(16) {
                    0 if wild => interesting(rng),
                    _ => numel as i64,
                },
                data: match rng.below(30) {
                    0 if wild => None,
                    _ => Some(Rc::from(bytes)),
                },
            }
        })
        .collect();
    Spec {
        storages,
        tensors,
        ordered: rng.chance(2),
        aliased: false,
    }
}

/// One large storage entry and many one-element tensors, each naming its own storage key,
/// every key's central directory entry pointing at that one entry's data.
fn aliased(rng: &mut Rng) -> Spec {
    let shift = 16 + rng.below(4);
    let data: Rc<[u8]> = Rc::from(rng.bytes(1 << shift));
    let n = 50 + rng.below(1500);
    Spec {
        storages: (0..n)
            .map(|k| StorageSpec {
                key: k.to_string(),
                ty: 8,
                numel: data.len() as i64,
                data: Some(data.clone()),
            })
            .collect(),
        tensors: (0..n)
            .map(|k| TensorSpec {
                name: format!("t{k}"),
                storage: k,
                offset: k as i64,
                size: vec![1],
                stride: vec![1],
                dtype: None,
                parameter: false,
            })
            .collect(),
        ordered: false,
        aliased: true,
    }
}

impl Spec {
    /// The pickle, as torch 2.x writes a state_dict (protocol 2, memoized strings and globals).
    pub fn ops(&self) -> Vec<Op> {
        let mut memo = 0u32;
        let mut ops = vec![Op::Proto(2)];
        let put = |ops: &mut Vec<Op>, memo: &mut u32| {
            ops.push(Op::Put(*memo, false));
            *memo += 1;
        };
        if self.ordered {
            ops.extend([
                global("collections", "OrderedDict"),
                Op::EmptyTuple,
                Op::Reduce,
            ]);
        } else {
            ops.push(Op::EmptyDict);
        }
        put(&mut ops, &mut memo);
        ops.push(Op::Mark);
        let mut v2_at = None;
        for t in &self.tensors {
            let st = &self.storages[t.storage];
            ops.push(s(&t.name));
            put(&mut ops, &mut memo);
            if t.parameter {
                ops.push(global("torch._utils", "_rebuild_parameter"));
            }
            match (t.dtype, v2_at) {
                (Some(_), _) => ops.push(global("torch._utils", "_rebuild_tensor_v3")),
                (None, Some(at)) => ops.push(Op::Get(at, false)),
                (None, None) => {
                    ops.push(global("torch._utils", "_rebuild_tensor_v2"));
                    v2_at = Some(memo);
                    put(&mut ops, &mut memo);
                }
            }
            ops.extend([Op::Mark, Op::Mark, s("storage")]);
            ops.push(global("torch", TYPES[st.ty].0));
            ops.extend([
                s(&st.key),
                s("cpu"),
                Op::Int(st.numel),
                Op::Tuple,
                Op::BinPersId,
            ]);
            ops.push(Op::Int(t.offset));
            for dims in [&t.size, &t.stride] {
                ops.push(Op::Mark);
                ops.extend(dims.iter().map(|&d| Op::Int(d)));
                ops.push(Op::Tuple);
            }
            ops.push(Op::Bool(false));
            ops.extend([
                global("collections", "OrderedDict"),
                Op::EmptyTuple,
                Op::Reduce,
            ]);
            if let Some(d) = t.dtype {
                ops.push(global("torch", TYPES[d].1));
                if t.parameter {
                    ops.push(Op::None); // the optional `metadata`
                }
            }
            ops.extend([Op::Tuple, Op::Reduce]);
            if t.parameter {
                ops.extend([Op::Bool(true), global("collections", "OrderedDict")]);
                ops.extend([Op::EmptyTuple, Op::Reduce, Op::TupleN(3), Op::Reduce]);
            }
            put(&mut ops, &mut memo);
        }
        ops.push(Op::SetItems);
        if self.ordered {
            // state_dict()'s `_metadata`, set by BUILD as (None, {'_metadata': ...}).
            ops.extend([Op::None, Op::EmptyDict, s("_metadata"), Op::EmptyDict]);
            ops.extend([s(""), Op::EmptyDict, s("version"), Op::Int(1), Op::SetItem]);
            ops.extend([Op::SetItem, Op::SetItem, Op::TupleN(2), Op::Build]);
        }
        ops.push(Op::Stop);
        ops
    }

    /// The archive's entries around `pickle`, in torch's order.
    pub fn entries(&self, pickle: Vec<u8>) -> Vec<Entry> {
        let mut entries = vec![Entry::new("archive/data.pkl", pickle)];
        entries.push(Entry::new("archive/byteorder", b"little".to_vec()));
        let first = entries.len();
        for st in &self.storages {
            if let Some(d) = &st.data {
                let name = format!("archive/data/{}", st.key);
                if !entries.iter().any(|e| e.name == name.as_bytes()) {
                    let mut e = Entry::new(name, Vec::new());
                    if self.aliased && entries.len() > first {
                        e.alias_of = Some(first);
                    } else {
                        e.data = d.to_vec();
                    }
                    entries.push(e);
                }
            }
        }
        entries.push(Entry::new("archive/version", b"3\n".to_vec()));
        entries
    }

    pub fn archive(&self, pickle: Vec<u8>) -> Vec<u8> {
        zipw::write(
            &self.entries(pickle),
            Tail {
                zip64: true,
                count: None,
            },
        )
    }

    /// The reference: what the reader must give for the unperturbed archive of `file_len`
    /// bytes, computed element by element with 128-bit arithmetic.
    pub fn expected(&self, file_len: usize) -> Expected {
        let mut out = Vec::new();
        let budget = file_len as u128 * 4 + (1 << 20);
        let mut total = 0u128;
        // Storage entries read, once per key: a valid archive's entries do not overlap, so
        // they hold no more than the file.
        let mut read = Vec::new();
        let mut read_bytes = 0u128;
        for t in &self.tensors {
            let st = &self.storages[t.storage];
            let (_, _, st_es, st_ok) = TYPES[st.ty];
            if !st_ok || st.numel < 0 || t.offset < 0 || t.size.len() > 64 {
                return None;
            }
            let es = match t.dtype {
                Some(d) if !TYPES[d].3 => return None,
                Some(d) => TYPES[d].2,
                None => st_es,
            };
            if t.size.len() != t.stride.len() || t.size.iter().chain(&t.stride).any(|&d| d < 0) {
                return None;
            }
            let storage_bytes = st.numel as u128 * st_es as u128;
            if storage_bytes > isize::MAX as u128 {
                return None;
            }
            let data = st.data.as_ref()?;
            if !read.contains(&st.key) {
                read.push(st.key.clone());
                read_bytes += data.len() as u128;
                if read_bytes > file_len as u128 {
                    return None;
                }
            }
            if (data.len() as u128) < storage_bytes {
                return None;
            }
            let numel = match t.size.contains(&0) {
                true => 0,
                false => t
                    .size
                    .iter()
                    .try_fold(1u128, |a, &d| a.checked_mul(d as u128))?,
            };
            if numel > usize::MAX as u128 {
                return None;
            }
            let mut bytes = Vec::new();
            if numel > 0 {
                if numel * es as u128 > storage_bytes {
                    return None; // more elements than the storage: a broadcast view
                }
                let mut idx = vec![0u128; t.size.len()];
                for _ in 0..numel {
                    let e = t.offset as u128
                        + idx
                            .iter()
                            .zip(&t.stride)
                            .map(|(i, &s)| i * s as u128)
                            .sum::<u128>();
                    let end = (e + 1) * es as u128;
                    if end > storage_bytes {
                        return None;
                    }
                    bytes.extend_from_slice(&data[(e * es as u128) as usize..end as usize]);
                    for d in (0..idx.len()).rev() {
                        idx[d] += 1;
                        if idx[d] < t.size[d] as u128 {
                            break;
                        }
                        idx[d] = 0;
                    }
                }
            }
            total += bytes.len() as u128;
            if total > budget {
                return None;
            }
            out.push((
                t.name.clone(),
                t.size.iter().map(|&d| d as usize).collect(),
                bytes,
            ));
        }
        Some(out)
    }
}
